"""The `mpijob` scenario of `make e2e` (e2e/run.py): the Kubeflow MPIJob's workers as workloads/mpijob/nvidia.py
renders them (the worker script: its own host key, sshd with StrictModes off for the operator's key Secret) reached
by Open MPI's `mpirun` over the operator's hostfile, with the one `mpirun` line the stack renders: the Gaudi
install-at-start launcher's setup step (workloads/mpijob/gaudi_launcher.py), as rendered, after the launcher's own
hostfile preamble. Its SETUP (pip installs from the network, as root) is replaced by a probe of what mpirun forwards.

The stack renders no `deepspeed --launcher openmpi`: this scenario ran that, a change to the rendered script, at 25
CPU seconds of make e2e's budget (docs/measurements.md). The launcher script as rendered, with DeepSpeed's pdsh
runner, is the `finetune` scenario's (its kind's MPIJob), and pdsh on every rank and host `recovery`'s.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import hosts as nshosts
from harness import fail_unless, launch, start_mpijob

KUBERNETES_SERVICE_HOST = "10.96.0.1"  # what the kubelet sets in every pod; the preamble adds it to no_proxy
HF_HOME = "/data/hf-home-of-the-launcher"
PROBE = 'echo "setup on $(hostname) HF_HOME=$HF_HOME no_proxy=$no_proxy NO_PROXY=$NO_PROXY"'


def gaudi_launcher_lines() -> tuple[list[str], str]:
    """The example Gaudi stack with `gaudi.installAtStart`, rendered by the stack: its launcher script's hostfile
    preamble (up to the ssh_config edit, root's) and its mpirun line."""
    import yaml

    from checks import load
    from preview.engine import engine_config_from_yaml, stack_file
    from workloads.mpijob import gaudi_launcher
    from workloads.placement import placement

    with open(stack_file("gaudi"), encoding="utf-8") as handle:
        config: dict[str, Any] = copy.deepcopy(yaml.safe_load(handle)["config"])
    workloads = config["deepspeed-stack:workloads"]
    name = next(iter(workloads))
    workloads[name].setdefault("gaudi", {})["installAtStart"] = True
    engine_config, secret_keys = engine_config_from_yaml(config)
    model = load(engine_config, set(secret_keys))
    w = model.workloads[name]
    lines = gaudi_launcher.launcher_script(w, placement(model, w), False).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("HOSTSFILE="))
    end = next(i for i, line in enumerate(lines) if line.startswith("printf '%s\\n' 'SendEnv"))
    mpirun = [line for line in lines if line.startswith("mpirun ")]
    fail_unless(len(mpirun) == 1, f"the Gaudi launcher renders {len(mpirun)} mpirun lines, not one")
    return lines[start:end], mpirun[0]


def scenario_mpijob(cluster: nshosts.Cluster, logs: Path) -> str:
    """mpirun as the stack renders it, from the launcher pod over the operator's hostfile to the worker pods:
    Open MPI's daemons over the workers' sshd and the operator's key, one process per worker, the environment it
    names (-x) forwarded."""
    _w, env, _script = start_mpijob(cluster, logs)
    workers = [host.name for host in cluster.hosts[1:]]
    preamble, mpirun = gaudi_launcher_lines()
    fail_unless('-x HF_HOME' in mpirun and "--npernode 1" in mpirun, f"unexpected mpirun line: {mpirun}")
    script = "\n".join(["set -eo pipefail", *preamble, f"SETUP={shlex.quote(PROBE)}", mpirun])
    env = {**env, "MPI_ROOT": "/usr", "HF_HOME": HF_HOME, "KUBERNETES_SERVICE_HOST": KUBERNETES_SERVICE_HOST}
    status, output = launch(cluster, cluster.hosts[0], script, logs / "mpirun-launcher.log", env=env)
    fail_unless(status == 0, f"mpirun as rendered: exit {status} (log {logs / 'mpirun-launcher.log'})")
    # --tag-output: "[jobid,rank]<stdout>:" before each line of each process.
    found = re.findall(r"^\[\d+,(\d+)\]<stdout>:\s*setup on (\S+) HF_HOME=(\S*) no_proxy=(\S*) NO_PROXY=(\S*)$",
                       output, re.M)
    fail_unless(sorted(host for _rank, host, *_ in found) == sorted(workers),
                f"mpirun --npernode 1 ran SETUP on {[h for _r, h, *_ in found]}, not once on each of {workers}")
    for _rank, host, hf_home, no_proxy, no_proxy_upper in found:
        fail_unless(hf_home == HF_HOME, f"{host}: HF_HOME {hf_home!r}, not the launcher's {HF_HOME!r} (-x)")
        for name, value in (("no_proxy", no_proxy), ("NO_PROXY", no_proxy_upper)):
            fail_unless(value.split(",")[-1] == KUBERNETES_SERVICE_HOST,
                        f"{host}: {name} {value!r} lacks the API server's address the preamble adds")
    return (f"mpirun as the Gaudi install-at-start launcher renders it, over the operator's hostfile and the "
            f"NVIDIA MPIJob's worker sshd: SETUP once on each of {len(workers)} hosts, HF_HOME and no_proxy forwarded")
