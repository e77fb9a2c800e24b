"""finetune.py's training: the Trainer's arguments matched to ds_config.json, the model (LoRA on it), the callbacks
(progress, TensorBoard, the stop on SIGTERM, tiered copies) and the run from the newest checkpoint to the export.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from recipes import finetune_tiered as tiered
from recipes.contract import EXIT_PREEMPTED, EXIT_USAGE
from recipes.finetune_args import LOGS_ENV, Run, tensorboard_dir
from recipes.finetune_checkpoints import newest_checkpoint
from recipes.finetune_config import (
    StackKeys,
    UsageError,
    combination_problems,
    cpu_run,
    load_ds_config,
    offloads_params,
    prepared_ds_config,
    resolve_precision,
    say,
    trainer_ds_args,
    zero_stage,
)
from recipes.finetune_export import export
from recipes.finetune_fabric import fabric_refusal
from recipes.finetune_hpu import (
    dtype_keyword,
    logging_dir_arguments,
    tokenizer_keyword,
    tokens_seen,
)
from recipes.finetune_prepare import Head, collator, tokenized_datasets, write_sample
from recipes.finetune_tokenized import (
    PADDING_FREE,
)
from recipes.shutdown import StopRequest

DEFAULT_EVAL_BATCH = 8  # the Trainer's per_device_eval_batch_size, where ds_config.json gives no micro batch


def configure_cpu_deepspeed() -> None:
    """DeepSpeed on CPUs: accelerate's state set up for DeepSpeed over gloo before the Trainer's arguments. Left
    to the Trainer, accelerate finds no GPU backend, inits DeepSpeed's comm without one and counts one process
    (DeepSpeed's train_batch_size assertion follows); TrainingArguments then takes this state as it is
    (accelerator_config use_configured_state)."""
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        PartialState(backend="gloo")
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]


def stop_callback(stop: StopRequest) -> Any:
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):  # type: ignore[misc]
        """After each step the ranks agree (one all-reduce) whether any got SIGTERM; then all save and stop."""

        stopped_at: int | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            flag = torch.tensor([1.0 if stop.signal is not None else 0.0], device=args.device)
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                control.should_save = True
                control.should_training_stop = True
                self.stopped_at = state.global_step
            return control

    return StopOnSignal()


class AtLastStep(Exception):  # noqa: N818 (an outcome, not an error)
    """The run resumed at (or past) its last step: nothing is left to train."""


def last_step_callback() -> Any:
    from transformers import TrainerCallback

    class StopAtLastStep(TrainerCallback):  # type: ignore[misc]
        """Ends train() before its first step when the checkpoint it resumed is at max_steps: the Trainer checks
        max_steps only after a step (transformers 5.19, DefaultFlowCallback.on_step_end), so it would train one
        more (step 21 of 20). on_train_begin comes once the checkpoint is loaded (the weights, DeepSpeed's engine),
        so what it holds is exported as it is."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            if state.max_steps > 0 and state.global_step >= state.max_steps:
                raise AtLastStep(state.global_step)
            return control

    return StopAtLastStep()


def progress_callbacks(args: argparse.Namespace) -> list[Any]:
    """Progress and metrics (finetune_progress.py, shipped beside this file), then TensorBoard's writer where
    TENSORBOARD_LOGGING_DIR (or Vertex AI's AIP_TENSORBOARD_LOG_DIR) names its folder, then what closes its file at
    each logging step: in that order, so the tokens/s and MFU the first adds to the logs are written with the loss,
    and the file is in the bucket (GCS FUSE uploads it on close) while the run lasts."""
    from recipes import finetune_progress as progress

    out = [progress.progress_callback(progress.RunFacts.from_env(os.environ), args.checkpoint_dir, args.model_dir,
                                      say)]
    logs = tensorboard_dir(os.environ)
    if logs is not None:
        from transformers.integrations import TensorBoardCallback

        os.environ[LOGS_ENV] = logs  # the writer reads its folder from there
        try:
            writer = TensorBoardCallback()
        except RuntimeError as error:  # an image without tensorboard: the run goes on, the log says why
            say(f"no TensorBoard event files: {error}")
        else:  # each logging step's points in a file of their own, closed: in the bucket while the run lasts
            out += [writer, progress.event_file_closer(writer)]
    return out


def training_model(name: str, token: str | None, version: str, dtype: Any) -> tuple[Any, bool]:
    """The model to train, its KV cache off. Training never reads the cache, and with it on (config.use_cache, a
    causal LM's default) transformers builds the attention mask without looking for packed rows: masking_utils
    finds the records of a padding-free batch from the restarting position ids only when past_key_values is None,
    so each record would attend to the ones before it in the row (measured on make e2e's tiny Llama: flattened
    logits off by 0.26 in fp32 with the cache, 1.5e-7 without; gradient checkpointing turned it off, so only runs
    without it were hit). Returned with the model's own setting, which the export puts back."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name, token=token, **{dtype_keyword(version): dtype})
    use_cache = bool(model.config.use_cache)
    model.config.use_cache = False
    return model, use_cache


def with_lora(model: Any, args: argparse.Namespace) -> Any:
    from peft import LoraConfig, get_peft_model

    targets: Any = args.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                        target_modules=targets, task_type="CAUSAL_LM")
    if args.gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, config)


def eval_args(args: argparse.Namespace, ds_args: Mapping[str, Any]) -> dict[str, Any]:
    """With held-out records: the eval loss at every save (the same steps), the loss only (no logits gathered)."""
    if args.eval_split is None:
        return {}
    return {"eval_strategy": "steps", "eval_steps": args.save_steps, "prediction_loss_only": True,
            "per_device_eval_batch_size": ds_args.get("per_device_train_batch_size", DEFAULT_EVAL_BATCH)}


def finish_copies(copier: tiered.Copier | None) -> None:
    """Tiered: the last save's copy finishes before the rank exits (on SIGTERM, within the pods' grace period)."""
    if copier is not None:
        say("waiting for the last save's copy to the bucket")
        copier.drain()


class Setup(NamedTuple):
    """What ds_config.json and the host settle before anything loads: the config as the Trainer gets it, the
    precision, and whether the run is on CPUs (make e2e)."""

    ds: dict[str, Any] | None
    precision: str
    cpu: bool


def setup(args: argparse.Namespace, environ: Mapping[str, str]) -> Setup:
    """ds_config.json read (tiered saves: the Trainer's local folder), the precision settled, and the combinations
    finetune.py cannot run refused (UsageError), before anything loads."""
    ds = prepared_ds_config(load_ds_config(args.deepspeed))
    if args.local_checkpoint_dir:
        ds = tiered.local_ds_config(ds)
    precision = resolve_precision(args.precision, ds)
    cpu = cpu_run(environ)
    problems = combination_problems(args.lora, zero_stage(ds), precision, cpu, offloads_params(ds))
    if problems:
        raise UsageError("; ".join(problems))
    return Setup(ds, precision, cpu)


def training_arguments(args: argparse.Namespace, run_setup: Setup, head: Head, version: str,
                       training_arguments_class: Any) -> Any:
    """The Trainer's arguments, matched to ds_config.json (trainer_ds_args). Made before the model: under ZeRO-3
    they make from_pretrained load the model partitioned (zero.Init)."""
    ds, precision, cpu = run_setup
    cpu_deepspeed = cpu and ds is not None
    ds_args = trainer_ds_args(ds, precision)
    return training_arguments_class(
        # Tiered: the Trainer saves to the node's local disk, every node its own files (finetune_tiered.py).
        output_dir=args.local_checkpoint_dir or args.checkpoint_dir,
        save_on_each_node=bool(args.local_checkpoint_dir),
        deepspeed=ds,
        learning_rate=args.learning_rate,
        **({"lr_scheduler_type": args.lr_scheduler} if args.lr_scheduler else {}),  # else the Trainer's, linear
        num_train_epochs=args.epochs if args.epochs is not None else 1.0,
        max_steps=args.max_steps if args.max_steps is not None else -1,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        logging_steps=args.logging_steps,
        seed=args.seed,
        report_to="none",  # TensorBoard's writer is among the callbacks below, after the progress callback
        disable_tqdm=True,  # one line per logging step (the log dicts), not progress bars in a pod log
        # Every rank's tokens, summed: tokens/s and MFU. Padding-free batches have no padding and no attention mask
        # (the Trainer would count the tokens that are not the pad id, and EOS is the pad id here).
        include_num_input_tokens_seen=tokens_seen(version, padding_free=head.packing == PADDING_FREE),
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=cpu and not cpu_deepspeed,
        accelerator_config={"use_configured_state": cpu_deepspeed},
        **logging_dir_arguments(version, tensorboard_dir(os.environ)),
        **eval_args(args, ds_args),
        **ds_args,
    )


class Ranks(NamedTuple):
    """What the ranks train with, once the process group is up and the data is there."""

    training: Any  # the Trainer's arguments
    data: Any
    held_out: Any


def start_ranks(run: Run, run_setup: Setup, head: Head, tokenizer: Any, token: str | None, keys: StackKeys,
                network: tuple[Any, Any], classes: tuple[Any, Any]) -> Ranks | int:
    """The Trainer's arguments (the process group starts with them), the fabric's check, then the tokenized data
    (rank 0 first: it makes the folder where the launcher's --prepare-data has not, then every rank memory-maps
    it); an exit status where the run stops there (final: EXIT_USAGE)."""
    import torch
    import transformers

    args = run.args
    training = training_arguments(args, run_setup, head, transformers.__version__, classes[1])
    _ = training.process_index  # the process group starts here (DeepSpeed's init_distributed, through accelerate)
    refused = fabric_refusal(*network, os.environ, torch, torch.distributed, say)
    if refused:  # NCCL is not on the GPU fabric's network: final (finetune_fabric.py)
        say(f"FAILED: {refused}")
        torch.distributed.destroy_process_group()
        return EXIT_USAGE
    try:
        with training.main_process_first(local=False, desc="the tokenized data"):
            data, held_out = tokenized_datasets(run, tokenizer, token, keys, head, talk=training.process_index == 0)
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE
    if training.process_index == 0 and head.first is not None:
        write_sample(args.checkpoint_dir, head.first, tokenizer)
    return Ranks(training, data, held_out)


def trainer_of(run: Run, run_setup: Setup, ranks: Ranks, head: Head, tokenizer: Any, token: str | None,
               stop: StopRequest, trainer_class: Any) -> tuple[Any, Any, tiered.Copier | None, bool]:
    """(the Trainer, its stop callback, the tiered copier or None, the model's own use_cache): the model loaded
    (LoRA on it), the callbacks in their order (the progress callback first, then TensorBoard's writer)."""
    import torch
    import transformers

    args, training, version = run.args, ranks.training, transformers.__version__
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[run_setup.precision]
    model, use_cache = training_model(args.model, token, version, dtype)
    if args.lora:
        model = with_lora(model, args)
    callback = stop_callback(stop)
    copier, copies = None, []
    if args.local_checkpoint_dir:
        copier = tiered.start(args.local_checkpoint_dir, args.checkpoint_dir, training.process_index,
                              training.local_process_index, training.world_size, args.save_total_limit,
                              lambda: stop.signal is not None, args.copy_rate_mb, say)
        copies = [tiered.copy_callback(copier)]
    trainer = trainer_class(model=model, args=training, train_dataset=ranks.data, eval_dataset=ranks.held_out,
                            data_collator=collator(tokenizer.pad_token_id, head.packing),
                            **{tokenizer_keyword(version): tokenizer},
                            callbacks=[last_step_callback(), *progress_callbacks(args), callback, *copies])
    return trainer, callback, copier, use_cache


def train(run: Run, run_setup: Setup, ranks: Ranks, head: Head, tokenizer: Any, token: str | None,
          stop: StopRequest, classes: tuple[Any, Any]) -> int:
    """From the newest checkpoint (tiered: the newest every node copied) to the export: 0, or EXIT_PREEMPTED
    where SIGTERM stopped it after a save. The process group is destroyed at the end, whatever happened."""
    import torch

    args, training = run.args, ranks.training
    trainer, callback, copier, use_cache = trainer_of(run, run_setup, ranks, head, tokenizer, token, stop,
                                                   classes[0])
    resume = newest_checkpoint(args.checkpoint_dir, tiered.COPIED_MARKER if args.local_checkpoint_dir else None)
    held = f", {len(ranks.held_out)} held out" if ranks.held_out is not None else ""
    say(f"rank {training.process_index}/{training.world_size}: {len(ranks.data)} samples{held}, "
        f"ZeRO-{zero_stage(run_setup.ds)}, {run_setup.precision}{', LoRA' if args.lora else ''}; "
        + (f"resuming from {resume}" if resume else "from the start"))
    try:
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except AtLastStep:
            say(f"rank {training.process_index}: {resume} is the last step ({trainer.state.max_steps}): "
                "nothing to train, exporting it")
        step = trainer.state.global_step
        if callback.stopped_at is not None:
            finish_copies(copier)
            say(f"rank {training.process_index}: stopped at step {step} on SIGTERM, checkpoint saved")
            return EXIT_PREEMPTED
        if ranks.held_out is not None and step % args.save_steps:
            trainer.evaluate()  # the last step's eval loss too (the saves' steps had theirs)
        trainer.model.config.use_cache = use_cache  # the model's own setting again, in what the export saves
        export(trainer, args, tokenizer, token, run_setup.precision, step, head.plan)
        finish_copies(copier)
        say(f"rank {training.process_index}: done at step {step}")
        return 0
    finally:
        # PyTorch's shutdown rule: destroy the process group before exit. It unregisters the groups but cannot stop
        # their threads (shutdown.exit_without_teardown).
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
