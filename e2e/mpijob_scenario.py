"""The `mpijob` scenario of `make e2e` (e2e/run.py): the Kubeflow MPIJob for NVIDIA as workloads/mpijob/nvidia.py
renders it: the worker script (its own host key, sshd with StrictModes off for the operator's key Secret) and the
launcher script over the operator's hostfile, /etc/deepspeed holding the job's ConfigMap; then the same worker pods
launched with OpenMPI (`deepspeed --launcher openmpi`).
"""

from __future__ import annotations

from pathlib import Path

import hosts as nshosts
from harness import IMAGE_ENV, check_run, fail_unless, launch, start_mpijob


def scenario_mpijob(cluster: nshosts.Cluster, logs: Path) -> str:
    """The launcher script as rendered (pdsh), then the same launcher with DeepSpeed's OpenMPI runner on the same
    worker pods (the `mpirun` path): mpirun starts orted over the same ssh, the ranks find each other through
    mpi4py (rank 0's address), gloo on eth0."""
    w, env, script = start_mpijob(cluster, logs)
    workers = cluster.hosts[1:]
    status, output = launch(cluster, cluster.hosts[0], script, logs / "mpijob-launcher.log", env=env)
    problems = check_run(output, len(workers), [h.name for h in workers])
    fail_unless(status == 0 and not problems, f"pdsh: exit {status}; {'; '.join(problems)}")
    # The second launch is another job's: its claim holds no checkpoint of the first (it would resume at the end).
    cluster.run(cluster.hosts[0], ["rm", "-rf", w.checkpoint_dir], env=IMAGE_ENV, timeout=30, check=True)
    fail_unless("run_ranks deepspeed --force_multi " in script, "the MPIJob launcher script no longer runs deepspeed")
    script = script.replace("deepspeed --force_multi ", "deepspeed --launcher openmpi --force_multi ", 1)
    status, output = launch(cluster, cluster.hosts[0], script, logs / "mpirun-launcher.log", env=env)
    problems = check_run(output, len(workers), [h.name for h in workers])
    fail_unless("mpirun -n" in output, "DeepSpeed did not run mpirun")
    fail_unless(status == 0 and not problems, f"openmpi: exit {status}; {'; '.join(problems)}")
    return (f"launcher script as rendered (deepspeed --force_multi, pdsh): {len(workers)} ranks; deepspeed "
            f"--launcher openmpi over the operator's hostfile: {len(workers)} ranks")
