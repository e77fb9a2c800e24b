"""The `mpijob` scenario of `make e2e` (e2e/run.py): the Kubeflow MPIJob for NVIDIA as workloads/mpijob/nvidia.py
renders it: the worker script (its own host key, sshd with StrictModes off for the operator's key Secret) and the
launcher script over the operator's hostfile, /etc/deepspeed holding the job's ConfigMap, launched with OpenMPI
(`deepspeed --launcher openmpi`). The same launcher script with DeepSpeed's default pdsh runner, as rendered, is the
`finetune` scenario's (its kind's MPIJob), and pdsh's launch of this smoke program on every rank and host the
`recovery` scenario's (the chart's): a third pdsh launch here cost 25 CPU seconds of make e2e's budget
(docs/measurements.md) and checked nothing they do not.
"""

from __future__ import annotations

from pathlib import Path

import hosts as nshosts
from harness import check_run, fail_unless, launch, start_mpijob


def scenario_mpijob(cluster: nshosts.Cluster, logs: Path) -> str:
    """The launcher script with DeepSpeed's OpenMPI runner on the worker pods (the `mpirun` path): mpirun starts
    orted over the same ssh, the ranks find each other through mpi4py (rank 0's address), gloo on eth0."""
    _w, env, script = start_mpijob(cluster, logs)
    workers = cluster.hosts[1:]
    fail_unless("run_ranks deepspeed --force_multi " in script, "the MPIJob launcher script no longer runs deepspeed")
    script = script.replace("deepspeed --force_multi ", "deepspeed --launcher openmpi --force_multi ", 1)
    status, output = launch(cluster, cluster.hosts[0], script, logs / "mpirun-launcher.log", env=env)
    problems = check_run(output, len(workers), [h.name for h in workers])
    fail_unless("mpirun -n" in output, "DeepSpeed did not run mpirun")
    fail_unless(status == 0 and not problems, f"openmpi: exit {status}; {'; '.join(problems)}")
    return (f"the MPIJob's launcher script with deepspeed --launcher openmpi over the operator's hostfile: "
            f"{len(workers)} ranks on {len(workers)} hosts")
