"""The offline preview's "GPU fabric" section: per fabric pool what the stack declares for its bandwidth
(extra NICs, their VPCs and MTU, the installers at their pinned commit, the Kubernetes Networks), read from
the recorded registrations, so a reviewer sees the whole fabric in the PR comment."""

from __future__ import annotations

from preview.engine import RunResult
from preview.sections import Section

NODE_POOL = "gcp:container/nodePool:NodePool"
NETWORK = "gcp:compute/network:Network"
FABRIC_NETWORK = "deepspeed-stack:gcp:FabricNetwork"
GPU_FABRIC = "deepspeed-stack:workloads:GpuFabric"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
K8S_NETWORK = "kubernetes:networking.gke.io/v1:Network"
JOB = "kubernetes:batch/v1:Job"
PASS_LINE = "deepspeed-stack/pass-line"  # workloads/nccl_test.py: the Job's pass line, as the test judges it


def _children(run: RunResult, parent_type: str, child_type: str) -> dict[str, list]:
    """Children of each component of `parent_type`, by the component's name."""
    out: dict[str, list] = {}
    for parent in run.by_type(parent_type):
        out[parent.name] = [r for r in run.by_type(child_type) if r.parent == parent.urn]
    return out


def _manifest(url: str) -> str:
    """`https://raw.githubusercontent.com/ORG/REPO/COMMIT/PATH` -> `REPO@COMMIT[:7]:PATH`."""
    parts = url.split("/", 6)
    return f"`{parts[4]}@{parts[5][:7]}:{parts[6]}`" if len(parts) == 7 else f"`{url}`"


def section(run: RunResult) -> list[Section]:
    pools = [p for p in run.by_type(NODE_POOL)
             if (p.inputs.get("networkConfig") or {}).get("additionalNodeNetworkConfigs")]
    if not pools:
        return []
    rows = ["| pool | machine | extra NICs | gVNIC | local SSDs | placement |", "| --- | --- | --- | --- | --- | --- |"]
    for p in pools:
        node = p.inputs.get("nodeConfig") or {}
        rows.append(f"| {p.name} | {node.get('machineType')} | "
                    f"{len(p.inputs['networkConfig']['additionalNodeNetworkConfigs'])} | "
                    f"{'on' if (node.get('gvnic') or {}).get('enabled') else 'off'} | "
                    f"{(node.get('ephemeralStorageLocalSsdConfig') or {}).get('localSsdCount', 0)} | "
                    f"{(p.inputs.get('placementPolicy') or {}).get('type', '-')} |")
    lines = ["\n".join(rows), ""]
    for name, nets in _children(run, FABRIC_NETWORK, NETWORK).items():
        mtus = sorted({n.inputs.get("mtu") for n in nets if n.inputs.get("mtu")})
        profiles = sorted({n.inputs["networkProfile"].rsplit("/", 1)[-1] for n in nets
                           if n.inputs.get("networkProfile")})
        lines.append(f"- `{name}`: {len(nets)} VPC(s) at MTU {', '.join(map(str, mtus))}"
                     + (f", network profile {', '.join(profiles)}" if profiles else ""))
    cluster = next(iter(run.by_type("gcp:container/cluster:Cluster")), None)
    if cluster is not None:
        monitoring = (cluster.inputs.get("monitoringConfig") or {}).get("enableComponents", [])
        multi = "on" if cluster.inputs.get("enableMultiNetworking") else "OFF"
        lines.append(f"- cluster: multi-networking {multi}, datapath {cluster.inputs.get('datapathProvider')}, "
                     f"DCGM {'on' if 'DCGM' in monitoring else 'off'}")
    for name, files in _children(run, GPU_FABRIC, CONFIG_FILE).items():
        networks = _children(run, GPU_FABRIC, K8S_NETWORK).get(name, [])
        lines.append(f"- `{name}`: {len(networks)} Network(s) "
                     f"({', '.join(n.inputs['metadata']['name'] for n in networks)}); applies "
                     + ", ".join(_manifest(f.inputs["file"]) for f in files))
    lines += _nccl_tests(run)
    return [("GPU fabric", "\n".join(lines))]


def _nccl_tests(run: RunResult) -> list[str]:
    """Each NCCL test's pass line, and what `pulumi up` creates only once the test passed (what depends on its Job)."""
    out = []
    for job in run.by_type(JOB):
        line = ((job.inputs.get("metadata") or {}).get("annotations") or {}).get(PASS_LINE)
        if line is None:
            continue
        after = sorted(r.name for r in run.resources if job.urn in r.dependencies)
        out.append(f"- NCCL test `{job.inputs['metadata']['name']}`: must reach {line}, else it fails; "
                   + (f"created only after it passed: {', '.join(f'`{a}`' for a in after)}" if after
                      else "nothing waits for it (read its log)"))
    return out
