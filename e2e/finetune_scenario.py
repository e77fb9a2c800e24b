"""The `finetune` scenario of `make e2e` (e2e/run.py): the `finetune` kind's MPIJob (recipes/finetune.py, ZeRO-3, LoRA)
on a tiny Llama in a folder standing for the bucket at /gcs: after its first checkpoint the whole job is stopped as
Kubernetes stops it (the operator deletes every pod at once: SIGTERM to the launcher, each worker's preStop hook
then SIGTERM to sshd, SIGKILL after each pod's grace); the launcher asks the workers to stop their ranks instead of
letting DeepSpeed's runner pkill them; saved on SIGTERM, relaunched, resumed from that step. Saves are tiered
(localCheckpoints): each worker saves to its own folder (its local SSD's emptyDir) and copies to the bucket in the
background, a marker last; the stop comes after a first complete copy, while a later one is under way: that copy is
dropped for the stop's own save, whose complete copy the relaunch resumes from; LoRA merged and exported to MODEL_DIR
with its marker, the run record and the estimate against the measured run. A merged export served by vLLM's CPU build
(its chat reply equal to transformers') is the adapters scenario's base, vertex's export of the same code: a vLLM
server here too cost make e2e's budget 45 CPU seconds (docs/measurements.md).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import hosts as nshosts
from finetune_common import (
    E2E_PRICE_PER_HOUR,
    EVENT_TAGS,
    EVENT_TAGS_SCRIPT,
    FINETUNE_STEPS,
    RENDERED,
    TOKENIZED_MADE,
    Phases,
    ProgressWatch,
    _finetune_script,
    _venv_python,
    copied,
    copying,
    eval_losses,
    event_problems,
    finetune_assets,
    finetune_records,
    finetune_workload,
    outside,
    progress_problems,
    resumed_from,
    run_record_problems,
    sample_problems,
    tokenized_problems,
    trainer_losses,
)
from harness import IMAGE_ENV, LAUNCH_TIMEOUT, RANK_ENV, _chown_dirs, fail_unless, launch, start_mpijob
from recovery_scenario import (
    EXIT_PREEMPTED,
    GRACE_SECONDS,
    mpijob_pre_stop,
    pre_stop_problems,
    pre_stop_summary,
    tiered_problems,
    wait_process,
    whole_job_stop_problems,
)


@dataclass
class Job:
    """What the scenario's steps share: the hosts, the workload as the stack renders it, the bucket and claim, and
    what each step found that later steps and the summary read."""

    cluster: nshosts.Cluster
    logs: Path
    w: Any
    where: Any
    job_launch: Any
    bucket: Path
    claim: Path
    ft: Any = field(default_factory=_finetune_script)
    phases: Phases = field(default_factory=lambda: Phases("finetune"))
    found: dict[str, Any] = field(default_factory=dict)

    @property
    def workers(self) -> list[nshosts.Host]:
        return self.cluster.hosts[1:]

    def outside(self, path: str) -> Path:
        return outside(path, self.w.gcs_fuse.mount_path, self.bucket)


def scenario_finetune(cluster: nshosts.Cluster, logs: Path) -> str:
    job = _inputs(cluster, logs)
    _stop_whole_job(job)
    _resume(job)
    _progress_and_record(job)
    f = job.found
    # What finetune.py trained record 1 on (rendered-sample.json) against transformers' rendering of it
    # (finetune_common.tiny_base computed it as the run's tiny Llama was made: the export's tokenizer is the base's).
    sample = json.loads((job.outside(job.w.checkpoint_dir) / "rendered-sample.json").read_text())
    problems = sample_problems(sample, json.loads((harness.RUN_CACHE / "tiny-llm" / RENDERED).read_text()))
    fail_unless(not problems, "; ".join(problems))
    learned = sum(1 for label in sample["labels"] if label != -100)
    (records, seconds), = TOKENIZED_MADE.findall(f["first"])
    losses, held_out = f["losses"], f["held_out"]
    return (f"kind finetune: chat data (messages, {len(finetune_records())} records, 1/8 held out), tokenized once "
            f"by the launcher ({records} records in {seconds} s; the resume reused it), LoRA under "
            f"ZeRO-3 on {len(job.workers)} hosts, the whole job stopped at step {f['stopped']} (launcher: SIGTERM, "
            f"asked the workers, exited {EXIT_PREEMPTED} with the ranks; a preStop: {pre_stop_summary(f['stops'][0])}; "
            f"saved {f['saved'].name}), resumed to step {FINETUNE_STEPS} (loss {losses[0]:.2f} -> {losses[-1]:.2f}, "
            f"eval loss {held_out[0]:.2f} -> {held_out[-1]:.2f}), merged and exported; record 1 trained on "
            f"apply_chat_template's {len(sample['input_ids'])} ids with only its {learned} assistant tokens learned "
            f"(vLLM's chat completion of a merged export: the adapters scenario's base). Phases: "
            f"{job.phases.summary()}")


def _inputs(cluster: nshosts.Cluster, logs: Path) -> Job:
    """The tiny Llama, its tokenizer and the chat data in the bucket every pod mounts (start_mpijob mounts the
    claim: the job's, both runs)."""
    phases = Phases("finetune")
    w, where, job_launch = finetune_workload()
    job = Job(cluster, logs, w, where, job_launch, cluster.work / "bucket", cluster.work / "finetune-claim",
              phases=phases)
    finetune_assets(job.bucket, harness.RUN_CACHE / "tiny-llm")
    for host in cluster.hosts:
        cluster.bind(host, job.bucket, w.gcs_fuse.mount_path)
    job.phases.end("tiny Llama, tokenizer and data")
    return job


def _stop_whole_job(job: Job) -> None:
    """1. Trained under ZeRO-3 on both workers; once a checkpoint is saved the whole job is stopped as Kubernetes
    stops it (`kubectl delete mpijob`, Kueue's preemption or eviction): at the same moment SIGTERM to the
    launcher's main process and, on each worker, its preStop hook then SIGTERM to sshd; SIGKILL after each pod's
    grace period. The launcher must leave DeepSpeed's runner alone (its handler would pkill the per-node
    launchers, which SIGKILL the ranks 30 s later) and ask the workers to stop their ranks, which save."""
    from workloads.finetune import LOCAL_CHECKPOINTS_DIR

    cluster, logs, ft, f = job.cluster, job.logs, job.ft, job.found
    launcher, workers = cluster.hosts[0], job.workers
    rank_env = {"HF_HUB_OFFLINE": "1"}  # nothing is downloaded: a hub lookup would only wait for a timeout
    _w, f["env"], f["script"] = start_mpijob(cluster, logs, (job.w, job.where), rank_env, job.job_launch, job.claim)
    fail_unless("/etc/deepspeed/finetune.py --deepspeed" in f["script"],
                "the MPIJob's launcher does not run finetune.py")
    local = {host.name: cluster.work / f"local-ssd-{host.name}" for host in workers}  # each worker's emptyDir
    for host in workers:
        local[host.name].mkdir(exist_ok=True)
        _chown_dirs(local[host.name])
        cluster.bind(host, local[host.name], LOCAL_CHECKPOINTS_DIR)
    log1 = logs / "finetune-1-preempted.log"
    process = cluster.spawn_main(launcher, ["/bin/bash", "-c", f["script"]], log=log1,
                                 env={**IMAGE_ENV, **RANK_ENV, **f["env"]})
    checkpoints = job.outside(job.w.checkpoint_dir)
    first_copy, in_flight = _copy_under_way(job, process, log1)
    hook = mpijob_pre_stop(job.w, job.where, job.job_launch)
    launcher_stop, *stops = cluster.stop_job([(launcher, GRACE_SECONDS, None),
                                              *((host, GRACE_SECONDS, hook) for host in workers)], env=IMAGE_ENV)
    status, first = wait_process(cluster, process, log1, "stopped run")
    cluster.stop_services()
    saved = copied(ft, checkpoints)
    saved_step = ft.checkpoint_step(saved.name)
    on_term = re.search(r"stopped at step (\d+) on SIGTERM", first)
    fail_unless(on_term is not None, f"the ranks did not save on SIGTERM (log {log1})")
    problems = [problem for stop in stops for problem in pre_stop_problems(stop)]
    problems += whole_job_stop_problems(launcher_stop, status, first)
    problems += tiered_problems(ft, local, checkpoints, saved_step, in_flight, first)
    fail_unless(not problems, f"{'; '.join(problems)} (log {log1})")
    fail_unless(0 < saved_step < FINETUNE_STEPS and saved_step == int(on_term.group(1)),
                f"newest complete copy {saved.name}, saved on SIGTERM at step {on_term.group(1)}: expected that "
                f"step, between the first and step {FINETUNE_STEPS}")
    f.update(first=first, stops=stops, saved=saved, saved_step=saved_step, stopped=on_term.group(1), log1=log1)
    job.phases.end(f"train, {first_copy.name} copied, whole job stopped while checkpoint-{in_flight} was copied, "
                   f"saved at step {saved_step}")


def _copy_under_way(job: Job, process: Any, log: Path) -> tuple[Path, int]:
    """Tiered saves: waits for the first save copied whole to the bucket (its marker), then for a later copy under
    way, when the stop comes. Returns (the first copy, the step being copied)."""
    checkpoints = job.outside(job.w.checkpoint_dir)
    deadline, first_copy, in_flight = time.monotonic() + LAUNCH_TIMEOUT, None, None
    while in_flight is None:
        fail_unless(process.poll() is None, f"the run ended before a copy to the bucket was under way (log {log})")
        fail_unless(time.monotonic() < deadline, f"no copy under way within {LAUNCH_TIMEOUT:.0f} s (log {log})")
        first_copy = first_copy or copied(job.ft, checkpoints)
        in_flight = copying(job.ft, checkpoints, job.ft.checkpoint_step(first_copy.name)) if first_copy else None
        time.sleep(0.05)
    assert first_copy is not None
    return first_copy, in_flight


def _resume(job: Job) -> None:
    """2. The job's pods come back: the same launch resumes from the newest checkpoint and exports the model."""
    cluster, logs, f, w = job.cluster, job.logs, job.found, job.w
    saved, saved_step = f["saved"], f["saved_step"]
    start_mpijob(cluster, logs, (w, job.where), {"HF_HUB_OFFLINE": "1"}, job.job_launch, job.claim)
    f["watch"] = watch = ProgressWatch(job.outside(w.checkpoint_dir) / "progress.json")
    watch.start()
    log2 = logs / "finetune-2-resumed.log"
    status, second = launch(cluster, cluster.hosts[0], f["script"], log2, env=f["env"])
    watch.done.set()
    cluster.stop_services()
    fail_unless(status == 0, f"resumed run: exit {status} (log {log2})")
    fail_unless(resumed_from(second) == f"{w.checkpoint_dir}/{saved.name}",
                f"the relaunch resumed from {resumed_from(second)}, expected {saved.name}")
    first_step = min((int(n) for n in re.findall(r"rank \d+: step (\d+)/", second)), default=None)
    fail_unless(first_step is None or first_step > saved_step, f"the relaunch logged step {first_step}, at or "
                f"before the saved step {saved_step}")
    model_dir = job.outside(w.model_dir)
    marker = json.loads((model_dir / ".complete").read_text())
    fail_unless(marker.get("step") == FINETUNE_STEPS and marker.get("world_size") == len(job.workers)
                and marker.get("lora") is True, f"marker {marker}: expected step {FINETUNE_STEPS} on "
                f"{len(job.workers)} ranks, LoRA merged")
    missing = [n for n in ("model.safetensors", "config.json", "tokenizer.json") if not (model_dir / n).is_file()]
    fail_unless(not missing, f"MODEL_DIR lacks {missing}")
    first = f["first"]
    f["losses"] = losses = trainer_losses(first) + trainer_losses(second)
    # A LoRA adapter on a random model learns slowly: measured 5.52-5.61 at step 5 and 4.94-5.13 at step 40 (four
    # runs, the last step at 0.88-0.93 of the first); 4.99 at step 30 (two runs, 0.90 of the first).
    fail_unless(len(losses) >= 2 and losses[-1] < 0.97 * losses[0], f"losses {losses}: the model did not learn")
    f["held_out"] = held_out = eval_losses(first) + eval_losses(second)
    fail_unless(len(held_out) >= 2, f"eval losses {held_out}: expected one at every save (evalSplit)")
    checked = [line for line in first.splitlines() if line.startswith("[finetune] data check, ")]
    fail_unless(bool(checked) and "messages" in checked[0], "the launcher's data check did not run before the ranks "
                f"(log {f['log1']})")
    problems = tokenized_problems(first, second)
    fail_unless(not problems, f"{'; '.join(problems)} (logs {f['log1']}, {log2})")
    f["second"] = second
    job.phases.end(f"resume from step {saved_step}, train to {FINETUNE_STEPS}, export")


def _progress_and_record(job: Job) -> None:
    """Progress and metrics: progress.json beside the checkpoints, the event files under logs/<workload>, run.json,
    the estimate against the measured run, every rank's tokens/s and MFU."""
    from workloads import finetune_progress

    f, w = job.found, job.w
    watch = f["watch"]
    final = json.loads((job.outside(w.checkpoint_dir) / "progress.json").read_text())
    problems = progress_problems(watch.half, final)
    logs_dir = job.outside(finetune_progress.logs_dir(w))
    tags = set(json.loads(_venv_python("-c", EVENT_TAGS_SCRIPT, str(logs_dir)).strip().splitlines()[-1]))
    problems += event_problems(tags)
    run = json.loads((job.outside(w.model_dir) / "run.json").read_text())
    problems += run_record_problems(run, FINETUNE_STEPS, E2E_PRICE_PER_HOUR)
    compared = [line.split("] ", 1)[-1] for line in f["second"].splitlines() if "estimate vs measured: " in line]
    if not compared:
        problems.append("the run's end did not print its estimate against the measured run")
    rates = re.findall(r"rank (\d+): step \d+/\d+ .*tokens/s .*MFU", f["first"] + f["second"])
    if {int(r) for r in rates} != set(range(len(job.workers))):
        problems.append(f"ranks logging tokens/s and MFU: {sorted({int(r) for r in rates})}, expected every rank")
    fail_unless(not problems, "; ".join(problems))
    job.phases.end(f"progress at step {watch.half['step']}: ETA {watch.half['estimatedRemainingSeconds']} s, real "
                   f"{final['elapsedSeconds'] - watch.half['elapsedSeconds']:.0f} s; events {', '.join(EVENT_TAGS)}; "
                   f"cost {run['trainingHours']:.4f} h = ${run['cost']}; {compared[-1] if compared else ''}")
