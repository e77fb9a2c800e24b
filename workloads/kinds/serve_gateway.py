"""kind serve's rules on `serving.gateway` (GKE Inference Gateway; workloads/kinds/serve.py lists them): vLLM (the
endpoint picker reads vLLM's metrics), the stack's own GKE cluster at a version that has the InferencePool v1 CRD
(data/serving_gateway.yaml), and one way in (the Service stays in-cluster).
"""

from __future__ import annotations

from model import capacity, serving_gateway
from model.problems import Problem
from model.serving_engines import VLLM
from model.types import ServeWorkloadConfig, StackConfig
from model.validators import at, or_list
from workloads.serving_source import adapter_names


def _version_problem(m: StackConfig, w: ServeWorkloadConfig) -> Problem | None:
    """GKE installs the InferencePool v1 CRD itself from minGkeVersion on; the stack installs no cluster-wide CRD."""
    assert m.cluster is not None
    least = serving_gateway.load().min_gke_version
    version = m.cluster.min_master_version
    why = (f"{at('workloads', w.name, 'serving', 'gateway', 'enabled')} needs GKE {least} or later, where GKE "
           "installs the InferencePool v1 and Gateway API CRDs itself (data/serving_gateway.yaml)")
    if version is None:
        return (Problem("cluster.minMasterVersion",
                        f"unset, so GKE may run an older control plane than {least}; {why}; set "
                        f"cluster.minMasterVersion to {least} or newer"))
    parsed = capacity.gke_version(version)
    if parsed is not None and parsed < capacity.gke_version(least):  # type: ignore[operator]
        return Problem("cluster.minMasterVersion", f"{version} is below {least}; {why}; set it to {least} or newer")
    return None


def check_serve_gateway(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The Inference Gateway routes to vLLM replicas of the stack's own GKE cluster at a version that has its CRDs;
    the Service then stays ClusterIP (the gateway is the way in)."""
    s = w.serving
    if not s.gateway.enabled:
        return []
    key = at("workloads", w.name, "serving", "gateway", "enabled")
    problems = []
    if s.engine != VLLM:
        problems.append(Problem(at('workloads', w.name, 'serving', 'engine'), f"{s.engine} with {key}: the endpoint "
                        "picker scores replicas by vLLM's own metrics (queue, KV cache, adapters); set engine: vllm, "
                        "or leave the gateway off"))
    if m.cluster is None:
        problems.append(Problem(key, "the gateway needs the stack's own GKE cluster (its Gateway API, its proxy-only "
                        "subnet); on an existing cluster serve through the Service (serving.service), or leave the "
                        "gateway off"))
    elif (problem := _version_problem(m, w)) is not None:
        problems.append(problem)
    if s.service != "ClusterIP":
        problems.append(Problem(at('workloads', w.name, 'serving', 'service'),
                                f"{s.service} with {key}: the gateway is "
                        "the way in from the VPC; a second load balancer would bypass its routing; set ClusterIP"))
    return problems


def warn_serve_gateway_external(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """An external gateway is on the internet: the NetworkPolicy admits its proxies, not the callers behind them."""
    g = w.serving.gateway
    if not g.enabled or g.access != serving_gateway.EXTERNAL:
        return []
    return [Problem(at('workloads', w.name, 'serving', 'gateway', 'access'),
                    "external: a regional external Application "
            "Load Balancer answers anyone on the internet, and the pods see only its proxies (allowFrom cannot tell "
            "callers apart); put authentication in front (e.g. Identity-Aware Proxy or Cloud Armor) or use internal")]


def check_serve_gateway_canary(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """A canary share goes to another serve workload's InferencePool (in its own namespace, which a ReferenceGrant
    there opens to this server's route), one with its own gateway (its pool and endpoint picker), serving every
    adapter this server serves (the requests for them would otherwise fail on the canary's share)."""
    canary = w.serving.gateway.canary
    if canary is None:
        return []
    key = at("workloads", w.name, "serving", "gateway", "canary")
    if not w.serving.gateway.enabled:
        return [Problem(key, "a canary share is a weight of the gateway's route; set "
                        f"{at('workloads', w.name, 'serving', 'gateway', 'enabled')}: true, or remove the canary")]
    others = [n for n, o in m.workloads.items() if isinstance(o, ServeWorkloadConfig) and n != w.name]
    valid = f"the stack's other serve workloads: {or_list(others)}" if others else (
        "another serve workload (the stack has none)")
    target = m.workloads.get(canary.workload)
    if canary.workload == w.name or not isinstance(target, ServeWorkloadConfig):
        what = "is this server itself" if canary.workload == w.name else (
            "names no workload of this stack" if target is None else f"is kind {target.kind}")
        return [Problem(f"{key}.workload", f"{canary.workload} {what}; valid: {valid}")]
    problems = []
    if not target.serving.gateway.enabled:
        problems.append(Problem(f"{key}.workload", f"{canary.workload} has no InferencePool of its own; set "
                                f"{at('workloads', canary.workload, 'serving', 'gateway', 'enabled')}: true"))
    missing = sorted(set(adapter_names(m, w)) - set(adapter_names(m, target)))
    if missing:
        problems.append(Problem(f"{key}.workload", f"{canary.workload} does not serve {', '.join(missing)}, which "
                                "this server serves: their requests would fail on its share; add them to "
                                f"{at('workloads', canary.workload, 'serving', 'adapters')}"))
    return problems
