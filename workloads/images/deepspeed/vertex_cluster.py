#!/usr/bin/env python3
"""Vertex AI cluster helpers for multi-node DeepSpeed (standard library only).

Vertex AI describes a distributed CustomJob to every replica through the
``CLUSTER_SPEC`` environment variable, for example::

    {"cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
                 "workerpool1": ["cmle-training-workerpool1-ab-0:2222",
                                 "cmle-training-workerpool1-ab-1:2222"]},
     "task": {"type": "workerpool1", "index": 0, "trial": ""},
     "environment": "cloud"}

and passes output locations as ``gs://`` URIs (``AIP_MODEL_DIR``,
``AIP_CHECKPOINT_DIR``, ``AIP_TENSORBOARD_LOG_DIR``) that Cloud Storage FUSE
exposes under ``/gcs/``.

DeepSpeed runs on worker pool 0 (the primary, one replica) and worker pool 1
(the workers). Pools 2 (parameter/reduction servers) and 3 (evaluators) are not
part of the DeepSpeed cluster.

Command line (used by ``vertex_start.sh``; ``CLUSTER_SPEC`` is read from the
environment unless ``--cluster-spec`` is given)::

    vertex_cluster.py paths                      # export lines, AIP_* mapped to /gcs/
    vertex_cluster.py env                        # paths + VERTEX_* cluster variables
    vertex_cluster.py role                       # primary | worker | other
    vertex_cluster.py hosts                      # one host per line, primary first
    vertex_cluster.py hostfile --slots 8 [--host-slots HOST=N ...] [--output FILE]

Errors in the environment exit with status 2 and a one-line message on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PRIMARY_POOL = "workerpool0"
WORKER_POOL = "workerpool1"
DEEPSPEED_POOLS = (PRIMARY_POOL, WORKER_POOL)
AIP_PATH_VARS = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")
GCS_PREFIX = "gs://"
GCS_FUSE_ROOT = "/gcs"
EXCHANGE_DIR_VAR = "VERTEX_SSH_EXCHANGE_DIR"
EXCHANGE_SUBDIR = ".ssh-exchange"

_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


class VertexEnvError(ValueError):
    """The Vertex AI environment (CLUSTER_SPEC, AIP_* variables) cannot be used."""


class ClusterSpecError(VertexEnvError):
    """CLUSTER_SPEC is malformed; the message says what is wrong."""


@dataclass(frozen=True)
class Cluster:
    """The DeepSpeed view of a Vertex AI cluster and of this replica's place in it."""

    primary_pool: tuple[str, ...]
    worker_pool: tuple[str, ...]
    task_type: str
    task_index: int
    trial: str = ""

    @property
    def hosts(self) -> tuple[str, ...]:
        """DeepSpeed hosts: worker pool 0 first, then worker pool 1, in order."""
        return self.primary_pool + self.worker_pool

    @property
    def primary_host(self) -> str:
        return self.primary_pool[0]

    @property
    def is_primary(self) -> bool:
        return self.task_type == PRIMARY_POOL and self.task_index == 0

    @property
    def role(self) -> str:
        """``primary``, ``worker`` (another DeepSpeed host) or ``other`` (pools 2 and 3)."""
        if self.is_primary:
            return "primary"
        if self.task_type in DEEPSPEED_POOLS:
            return "worker"
        return "other"

    @property
    def is_multi_node(self) -> bool:
        return len(self.hosts) > 1

    @property
    def this_host(self) -> str | None:
        """This replica's host name, or None when it is not a DeepSpeed host."""
        if self.task_type == PRIMARY_POOL:
            return self.primary_pool[self.task_index]
        if self.task_type == WORKER_POOL:
            return self.worker_pool[self.task_index]
        return None


def host_of(address: str) -> str:
    """``host:port`` → ``host``; ``[v6addr]:port`` → ``v6addr``; a bare host is returned as is."""
    address = address.strip()
    if address.startswith("["):
        end = address.find("]")
        return address[1:end] if end > 0 else address
    if address.count(":") == 1:
        return address.split(":", 1)[0]
    return address


def _pool_hosts(cluster: Mapping[str, object], pool: str) -> tuple[str, ...]:
    entries = cluster.get(pool, [])
    if not isinstance(entries, list):
        raise ClusterSpecError(
            f"CLUSTER_SPEC 'cluster.{pool}' must be a list of \"host:port\" strings, got {type(entries).__name__}"
        )
    hosts = []
    for position, entry in enumerate(entries):
        host = host_of(entry) if isinstance(entry, str) else ""
        if not host:
            raise ClusterSpecError(f"CLUSTER_SPEC 'cluster.{pool}[{position}]' must be a \"host:port\" string, "
                                   f"got {entry!r}")
        hosts.append(host)
    return tuple(hosts)


def _cluster_pools(spec: Mapping[str, object]) -> tuple[dict[str, list[object]], tuple[str, ...], tuple[str, ...]]:
    """The 'cluster' object (every pool a list), its primary pool's hosts and its worker pool's, no host twice."""
    cluster = spec.get("cluster")
    if cluster is None:
        raise ClusterSpecError("CLUSTER_SPEC has no 'cluster' object")
    if not isinstance(cluster, dict):
        raise ClusterSpecError(f"CLUSTER_SPEC 'cluster' must be an object of worker pools, "
                               f"got {type(cluster).__name__}")
    if PRIMARY_POOL not in cluster:
        raise ClusterSpecError(f"CLUSTER_SPEC 'cluster' has no '{PRIMARY_POOL}' (the primary replica)")
    for pool_name, entries in cluster.items():
        if not isinstance(entries, list):
            raise ClusterSpecError(
                f"CLUSTER_SPEC 'cluster.{pool_name}' must be a list of \"host:port\" strings, "
                f"got {type(entries).__name__}"
            )
    primary_pool = _pool_hosts(cluster, PRIMARY_POOL)
    if not primary_pool:
        raise ClusterSpecError(f"CLUSTER_SPEC 'cluster.{PRIMARY_POOL}' is empty; it must list the primary")
    worker_pool = _pool_hosts(cluster, WORKER_POOL)
    seen: set[str] = set()
    for host in primary_pool + worker_pool:
        if host in seen:
            raise ClusterSpecError(f"CLUSTER_SPEC lists host {host!r} more than once")
        seen.add(host)
    return cluster, primary_pool, worker_pool


def _task(spec: Mapping[str, object], cluster: Mapping[str, list[object]]) -> tuple[str, int, str]:
    """This replica's 'task': its pool (one of 'cluster'), its index in that pool and its trial."""
    task = spec.get("task")
    if task is None:
        raise ClusterSpecError("CLUSTER_SPEC has no 'task' object")
    if not isinstance(task, dict):
        raise ClusterSpecError(f"CLUSTER_SPEC 'task' must be an object, got {type(task).__name__}")
    task_type = task.get("type")
    if not isinstance(task_type, str) or not task_type:
        raise ClusterSpecError(f"CLUSTER_SPEC 'task.type' must be a worker pool name, got {task_type!r}")
    if task_type not in cluster:
        raise ClusterSpecError(f"CLUSTER_SPEC 'task.type' {task_type!r} is not a pool in 'cluster'")
    task_index = task.get("index")
    if isinstance(task_index, bool) or not isinstance(task_index, int) or task_index < 0:
        raise ClusterSpecError(f"CLUSTER_SPEC 'task.index' must be a non-negative integer, got {task_index!r}")
    pool_size = len(cluster[task_type])
    if task_index >= pool_size:
        raise ClusterSpecError(f"CLUSTER_SPEC 'task.index' {task_index} is out of range for '{task_type}' "
                               f"({pool_size} replica{'s' if pool_size != 1 else ''})")
    return task_type, task_index, str(task.get("trial") or "")


def parse_cluster_spec(raw: str | None) -> Cluster:
    """Parse the CLUSTER_SPEC JSON text; raises ClusterSpecError with a precise message."""
    if raw is None or not raw.strip():
        raise ClusterSpecError("CLUSTER_SPEC is unset or empty")
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ClusterSpecError(f"CLUSTER_SPEC is not valid JSON: {exc.msg} at line {exc.lineno} "
                               f"column {exc.colno}") from None
    if not isinstance(spec, dict):
        raise ClusterSpecError(f"CLUSTER_SPEC must be a JSON object, got {type(spec).__name__}")
    cluster, primary_pool, worker_pool = _cluster_pools(spec)
    task_type, task_index, trial = _task(spec, cluster)
    return Cluster(primary_pool=primary_pool, worker_pool=worker_pool, task_type=task_type, task_index=task_index,
                   trial=trial)


def _check_slots(host: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"slots for host {host!r} must be a positive integer, got {value!r}")
    return value


def render_hostfile(hosts: Sequence[str], slots: int | Mapping[str, int]) -> str:
    """DeepSpeed hostfile text: one ``HOST slots=N`` line per host, in the given order.

    ``slots`` is either one count for every host or a mapping host → count that
    must cover every host.
    """
    if not hosts:
        raise ValueError("cannot write a hostfile without hosts")
    lines = []
    for host in hosts:
        if isinstance(slots, Mapping):
            if host not in slots:
                raise ValueError(f"no slot count for host {host!r}")
            count = _check_slots(host, slots[host])
        else:
            count = _check_slots(host, slots)
        lines.append(f"{host} slots={count}")
    return "\n".join(lines) + "\n"


def gcs_to_local(value: str) -> str:
    """``gs://bucket/path`` → ``/gcs/bucket/path`` (Cloud Storage FUSE); other values unchanged."""
    if not value.startswith(GCS_PREFIX):
        return value
    rest = value[len(GCS_PREFIX) :]
    if not rest.split("/", 1)[0]:
        raise VertexEnvError(f"{value!r} has no bucket name")
    return f"{GCS_FUSE_ROOT}/{rest}"


def mapped_paths(env: Mapping[str, str]) -> dict[str, str]:
    """The AIP_* output variables that are set, with gs:// URIs mapped to /gcs/ paths."""
    result = {}
    for name in AIP_PATH_VARS:
        value = env.get(name)
        if value is None:
            continue
        try:
            result[name] = gcs_to_local(value)
        except VertexEnvError as exc:
            raise VertexEnvError(f"{name}: {exc}") from None
    return result


def export_lines(variables: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines, values quoted for the shell with shlex.quote."""
    return [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]


def job_id(env: Mapping[str, str], cluster: Cluster) -> str:
    """An identifier shared by all replicas of one job (and trial), safe as a path component."""
    base = env.get("CLOUD_ML_JOB_ID") or cluster.primary_host
    if cluster.trial:
        base = f"{base}-trial-{cluster.trial}"
    return _UNSAFE_ID_CHARS.sub("_", base).strip("._") or "job"


def exchange_dir(env: Mapping[str, str], cluster: Cluster) -> str:
    """Directory (on the bucket mount) where the primary publishes its SSH public key.

    ``VERTEX_SSH_EXCHANGE_DIR`` wins; otherwise ``<parent of AIP_MODEL_DIR>/.ssh-exchange/<job id>``
    with AIP_MODEL_DIR mapped to its /gcs/ path.
    """
    override = env.get(EXCHANGE_DIR_VAR, "").strip()
    if override:
        return override.rstrip("/") or override
    model_dir = gcs_to_local(env.get("AIP_MODEL_DIR", "").strip()).rstrip("/")
    parent = posixpath.dirname(model_dir)
    # The parent must lie inside a bucket: /gcs/<bucket>[/...].
    if not parent.startswith(f"{GCS_FUSE_ROOT}/") or parent == GCS_FUSE_ROOT:
        raise VertexEnvError(
            "a multi-node job needs a shared directory for the SSH key exchange: set the job's "
            "base output directory (AIP_MODEL_DIR=gs://BUCKET/PATH/model) or "
            f"{EXCHANGE_DIR_VAR}; got AIP_MODEL_DIR={env.get('AIP_MODEL_DIR', '')!r}"
        )
    return f"{parent}/{EXCHANGE_SUBDIR}/{job_id(env, cluster)}"


def cluster_variables(env: Mapping[str, str]) -> dict[str, str]:
    """Everything ``vertex_start.sh`` needs, as shell variables (mapped paths first)."""
    variables = mapped_paths(env)
    cluster = parse_cluster_spec(env.get("CLUSTER_SPEC"))
    variables.update(
        {
            "VERTEX_ROLE": cluster.role,
            "VERTEX_IS_PRIMARY": "1" if cluster.is_primary else "0",
            "VERTEX_PRIMARY_HOST": cluster.primary_host,
            "VERTEX_THIS_HOST": cluster.this_host or "",
            "VERTEX_HOSTS": " ".join(cluster.hosts),
            "VERTEX_NUM_HOSTS": str(len(cluster.hosts)),
            "VERTEX_JOB_ID": job_id(env, cluster),
        }
    )
    if cluster.is_multi_node and cluster.role != "other":
        exchange_env = dict(env)
        exchange_env.update(variables)
        variables[EXCHANGE_DIR_VAR] = exchange_dir(exchange_env, cluster)
    return variables


def _parse_host_slots(item: str) -> tuple[str, int]:
    host, sep, count = item.rpartition("=")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST=N, got {item!r}")
    try:
        value = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HOST=N with an integer N, got {item!r}") from None
    return host, value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vertex_cluster.py",
                                     description="Vertex AI CLUSTER_SPEC and AIP_* helpers for multi-node DeepSpeed.")
    parser.add_argument("--cluster-spec",
                        help="CLUSTER_SPEC JSON text (default: the CLUSTER_SPEC environment variable)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("paths", help="print export lines mapping AIP_* gs:// URIs to /gcs/ paths")
    commands.add_parser("env", help="print export lines for the mapped paths and the VERTEX_* variables")
    commands.add_parser("role", help="print primary, worker or other")
    commands.add_parser("hosts", help="print the DeepSpeed hosts, one per line, primary first")
    hostfile = commands.add_parser("hostfile", help="write a DeepSpeed hostfile")
    hostfile.add_argument("--slots", type=_positive_int, help="slots (GPUs) per host")
    hostfile.add_argument("--host-slots", type=_parse_host_slots, action="append", default=[], metavar="HOST=N",
                          help="slots for one host (overrides --slots for it; repeatable)")
    hostfile.add_argument("--output", "-o", help="write here instead of stdout")
    return parser


def run(argv: Sequence[str] | None, env: Mapping[str, str]) -> str:
    """Execute the command line and return what to print; raises VertexEnvError/ValueError."""
    args = build_parser().parse_args(argv)
    if args.cluster_spec is not None:
        env = {**env, "CLUSTER_SPEC": args.cluster_spec}
    if args.command == "paths":
        return "".join(line + "\n" for line in export_lines(mapped_paths(env)))
    if args.command == "env":
        return "".join(line + "\n" for line in export_lines(cluster_variables(env)))
    cluster = parse_cluster_spec(env.get("CLUSTER_SPEC"))
    if args.command == "role":
        return cluster.role + "\n"
    if args.command == "hosts":
        return "".join(host + "\n" for host in cluster.hosts)
    # hostfile
    overrides = dict(args.host_slots)
    unknown = sorted(set(overrides) - set(cluster.hosts))
    if unknown:
        raise ValueError(f"--host-slots names hosts that are not in CLUSTER_SPEC: {', '.join(unknown)}")
    missing = [host for host in cluster.hosts if host not in overrides]
    if args.slots is None and missing:
        raise ValueError(f"no slot count for host {missing[0]!r}: pass --slots N or --host-slots HOST=N")
    slots = {host: overrides.get(host, args.slots) for host in cluster.hosts}
    text = render_hostfile(cluster.hosts, slots)
    if args.output:
        tmp = f"{args.output}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, args.output)
        return ""
    return text


def main(argv: Sequence[str] | None = None) -> int:
    try:
        output = run(argv, os.environ)
    except ValueError as exc:  # VertexEnvError/ClusterSpecError are ValueErrors too
        print(f"vertex_cluster.py: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vertex_cluster.py: error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
