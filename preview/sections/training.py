"""The "Training" section: each `finetune` workload, and each Gaudi job running the recipe (the `workloads`
output) with its run's time and cost (the `costs` output's `runs`; on Gaudi its hours and card-hours), how long its
data step takes (tokenized once, before the ranks), and the next steps, in order, as the "Serving" section gives a
server's: `pulumi up`, the data uploaded where the run reads it, the run's log followed, TensorBoard where the stack
deploys one, and where the model lands (on Gaudi: how it is copied off the claim)."""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Any

from planner import past_runs
from planner.run_estimate import format_hours
from preview.engine import RunResult
from preview.sections import Section

KIND = "finetune"
TENSORBOARD = "tensorboard"  # a workload summary of this kind: a TensorBoard server (workloads/tensorboard.py)
SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")  # a datasetPath with one is a file, else a folder


def _bucket(stack: str) -> str:
    return f"gs://$(pulumi stack output bucket -s {shlex.quote(stack)})"


def _upload(stack: str, path: str) -> str:
    """`gcloud storage cp` of the local file (or folder) to the bucket path the run reads."""
    p = PurePosixPath(path)
    if p.suffix.lower() in SUFFIXES:
        return f"gcloud storage cp {shlex.quote(p.name)} {_bucket(stack)}/{path}"
    parent = f"{p.parent}/" if str(p.parent) != "." else ""
    return f"gcloud storage cp --recursive {shlex.quote(p.name)} {_bucket(stack)}/{parent}"


def _run(costs: Any, name: str) -> str:
    """`about 1.8–3.9 h, $6.56–$14.37 (spot)`, from the `costs` output; what is missing otherwise."""
    r = ((costs or {}).get("runs") or {}).get(name) if isinstance(costs, dict) else None
    if not isinstance(r, dict):
        return "—"
    if "missing" in r:
        return "unknown: see Estimated cost"
    pays = r["pays"]
    fast, slow = r["perRun"][pays]["fast"], r["perRun"][pays]["slow"]
    return (f"about {format_hours(r['hours']['fast'])}–{format_hours(r['hours']['slow'])} h, ${fast:,.2f}–${slow:,.2f} "
            f"({'spot' if pays == 'spot' else 'on-demand'})")


def _tensorboards(workloads: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in workloads.values() if isinstance(s, dict) and s.get("kind") == TENSORBOARD]


def _steps(stack: str, name: str, s: dict[str, Any], tensorboards: list[dict[str, Any]]) -> list[str]:
    """The run's next steps, each a command with what it is for."""
    lines = [f"# {name}"]
    if s.get("datasetInBucket"):
        lines += [f"# the launcher waits for {s['datasetInBucket']} in the bucket: upload it once pulumi up has "
                  "created the bucket", _upload(stack, s["datasetInBucket"])]
    elif s.get("datasetHub"):
        lines.append(f"# the data: the ranks download {s['datasetHub']} from Hugging Face (its train split)")
    lines += ["# the run's output (DeepSpeed's launcher, every rank's lines): the loading, the loss at each logging "
              "step, the saves",
              f"kubectl logs -n {s['namespace']} -f job/{s['launcherJob']}"]
    what = "percent, step of steps, ETA, last loss, tokens/s, MFU (Kubeflow Trainer's trainerStatus fields)"
    if s.get("progressInBucket"):
        lines += [f"# progress, written by rank 0 at each logging step: {what}",
                  f"gcloud storage cat {_bucket(stack)}/{s['progressInBucket']}"]
    elif s.get("progressFile"):
        lines.append(f"# progress: {s['progressFile']} on the claim, written by rank 0 at each logging step: {what}")
    # The stack's TensorBoard servers that show this run (each lists the finetune workloads it reads).
    tensorboards = [tb for tb in tensorboards if name in (tb.get("workloads") or [])]
    for tb in tensorboards:
        lines += [f"# TensorBoard ({tb.get('deployment') or 'server'}): the run's loss, learning rate, tokens/s and "
                  "MFU, under the name " + name,
                  *([f"{tb['portForward']} &"] if tb.get("portForward") else []),
                  *([f"# then open {tb['url']}"] if tb.get("url") else [])]
    if not tensorboards and s.get("logsInBucket"):
        folder = s["logsInBucket"]
        lines += [f"# TensorBoard: no server of this stack shows it (a workload of kind tensorboard would); the run's "
                  f"event files (loss, tokens/s, MFU) are in {folder}/ of the bucket: view them on your machine",
                  f"gcloud storage cp --recursive {_bucket(stack)}/{folder} . && tensorboard --logdir "
                  f"{shlex.quote(PurePosixPath(folder).name)}"]
    elif not tensorboards:
        lines.append(f"# TensorBoard: no server of this stack shows it (kind tensorboard reads the bucket only); the "
                     f"run's event files are in {s.get('logsDir', 'logs/<workload>')} on the claim")
    if s.get("modelInBucket"):
        folder = s["modelInBucket"]
        lines += [f"# the result: {folder}/ in the bucket, complete once its marker .complete is there",
                  f"gcloud storage ls {_bucket(stack)}/{folder}/"]
        if s.get("runRecordInBucket"):
            record = PurePosixPath(s["runRecordInBucket"])
            lines += ["# what the run took and cost: its training hours x the pool's $/h, written when it finishes",
                      f"gcloud storage cat {_bucket(stack)}/{record}",
                      "# the stack's run records, for `make gpus MODEL=.. MODE=.. RUNS=runs`: earlier runs of the same "
                      "shape and how far their estimates were off",
                      past_runs.copy_command(f"{_bucket(stack)}/{record.parent.parent}/*/{record.name}")]
    elif s.get("modelOnClaim"):
        lines.append(f"# the result: {s['modelOnClaim']} on the claim {s.get('claim', '')}, complete once its marker "
                     ".complete is there")
    return lines


def _gaudi_steps(name: str, s: dict[str, Any]) -> list[str]:
    """A Gaudi recipe run's next steps: the data onto the claim, the log, the model copied off the claim."""
    lines = [f"# {name} (Gaudi)"]
    if s.get("datasetOnClaim"):
        lines.append(f"# the launcher waits for {s['datasetOnClaim']} on the claim {s.get('claim', '')}: copy it there "
                     "(on the NFS server, or from a pod mounting the claim), then it checks and tokenizes it once")
    elif s.get("datasetHub"):
        lines.append(f"# the data: {s['datasetHub']} from Hugging Face (its train split)")
    lines += ["# the run's output (the data step, then gaudi_spawn.py's ranks): the loss at each logging step, the "
              "saves; a bad record stops it here, once",
              f"kubectl logs -n {s['namespace']} -f job/{s['launcherJob']}",
              f"# the result: {s.get('modelDir', '')} on the claim, complete once its marker .complete is there; the "
              "workers are gone when the job ends, so copy it off the claim with a pod of your own:",
              *s.get("fetchModel", [])]
    return lines


def _gaudi(s: Any) -> bool:
    return isinstance(s, dict) and s.get("kind") == "mpijob" and bool(s.get("recipeOnGaudi"))


def section(run: RunResult) -> list[Section]:
    """Each finetune workload: its model, GPUs, the run's estimate and where the model lands, then the next steps:
    `pulumi up`, the data uploaded, the log followed, TensorBoard, the result."""
    workloads = run.outputs.get("workloads") or {}
    trainers = {name: s for name, s in workloads.items()
                if isinstance(s, dict) and (s.get("kind") == KIND or _gaudi(s))}
    if not trainers:
        return []
    rows = ["| workload | model | GPUs | data | run (estimate) | model lands in |",
            "| --- | --- | --- | --- | --- | --- |"]
    on_gaudi = all(_gaudi(s) for s in trainers.values())
    steps = [f"pulumi up -s {shlex.quote(run.stack)}   # " + (
        "the Gaudi image and the job on your cluster" if on_gaudi else
        "the cluster, the bucket and the job; the GPU nodes come up when the job's pods ask for them")]
    estimates = [f"- `{name}`: {s['runEstimate']}" for name, s in trainers.items()
                 if _gaudi(s) and s.get("runEstimate")]
    tensorboards = _tensorboards(workloads)
    data_steps = [f"- `{name}`: {s['dataStep']}" for name, s in trainers.items() if s.get("dataStep")]
    for name, s in trainers.items():
        if _gaudi(s):
            data = f"`{s['datasetOnClaim']}` (claim)" if s.get("datasetOnClaim") else f"`{s.get('datasetHub', '')}`"
            rows.append(f"| {name} | {s.get('model', '')} | {s.get('workers')} worker(s) x "
                        f"{s.get('acceleratorsPerWorker')} Gaudi cards | {data} | {s.get('runHours') or '—'} | "
                        f"`{s.get('modelDir', '')}` (claim) |")
            steps += ["", *_gaudi_steps(name, s)]
            continue
        gpus = f"{s.get('workers')} worker(s) x {s.get('acceleratorsPerWorker')} (pool {s.get('pool')})"
        data = f"`{s['datasetInBucket']}` (bucket)" if s.get("datasetInBucket") else f"`{s.get('datasetHub', '')}`"
        lands = f"`{s['modelInBucket']}/` (bucket)" if s.get("modelInBucket") else f"`{s.get('modelOnClaim', '')}`"
        rows.append(f"| {name} | {s.get('model', '')} | {gpus} | {data} | {_run(run.outputs.get('costs'), name)} | "
                    f"{lands} |")
        steps += ["", *_steps(run.stack, name, s, tensorboards)]
    tokenized = ("\n\nThe data step (every record tokenized and packed once, docs/finetune.md):\n\n"
                 + "\n".join(data_steps)) if data_steps else ""
    if estimates:  # Gaudi: no price the stack knows; the run's hours and how they were reached
        tokenized = "\n\nThe run on Gaudi (planner/gaudi_run.py):\n\n" + "\n".join(estimates) + tokenized
    body = "\n".join(rows) + tokenized + ("\n\nNext steps (README, \"Fine-tune and serve your own model\"):\n\n```sh\n"
                              + "\n".join(steps) + "\n```")
    return [("Training", body)]
