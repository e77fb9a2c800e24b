"""The Gaudi MPIJob's `training.args`: the flags of optimum-habana's run_lora_clm.py that the launcher derives from
other keys (workloads/mpijob/gaudi_launcher.py gaudi_train_command), and those it passes itself or that it would
override."""

from __future__ import annotations

# Flags the stack derives from other keys of the workload (their key paths); `training.args` must not
# repeat them (a rule says so: workloads/kinds/mpijob.py).
RESERVED_TRAINING_FLAGS: dict[str, tuple[str, ...]] = {
    "--model_name_or_path": ("training", "model"),
    "--dataset_name": ("training", "dataset"),
    "--num_train_epochs": ("training", "epochs"),
    "--deepspeed": ("deepspeed",),
    "--per_device_train_batch_size": ("deepspeed", "microBatchPerGpu"),
    "--gradient_accumulation_steps": ("deepspeed", "gradientAccumulation"),
    "--max_grad_norm": ("deepspeed", "gradientClipping"),
    "--learning_rate": ("deepspeed", "learningRate"),
    "--lora_rank": ("training", "lora", "rank"),
    "--lora_alpha": ("training", "lora", "alpha"),
    "--lora_dropout": ("training", "lora", "dropout"),
    "--lora_target_modules": ("training", "lora", "targetModules"),
    "--bf16": ("deepspeed", "precision"),
    "--fp16": ("deepspeed", "precision"),
}


# Flags of optimum-habana's run_lora_clm.py that `training.args` cannot usefully give: the launcher passes them
# itself (gaudi_train_command), or passes one that wins over them. Each -> what to use instead ({w}: the workload's
# key). Your own data: run_lora_clm.py's data arguments load --dataset_name when it is given and only otherwise
# --train_file/--validation_file (optimum-habana examples/language-modeling/run_lora_clm.py, `main`: "if
# data_args.dataset_name is not None: ... load_dataset(data_args.dataset_name ...) else: data_files ..."), and the
# launcher always passes --dataset_name (training.dataset): a file would be silently ignored.
_OWN_DATA = ("is overridden: the launcher always passes --dataset_name (training.dataset), which run_lora_clm.py "
             "loads instead, so the job would train on that dataset without a word. To train on your own data, use "
             "the recipe: {w}.finetune.datasetPath (a .jsonl/.json, .parquet or .txt file or folder on the claim, "
             "relative to storage.mountPath; finetune.py on HPU), with {w}.finetune.model and the other finetune keys "
             "in place of training")
LAUNCHER_FLAGS: dict[str, str] = {
    "--train_file": _OWN_DATA,
    "--validation_file": _OWN_DATA,
    "--dataset_config_name": ("names a configuration of --dataset_name, which the stack passes from "
                              "training.dataset; a dataset with configurations is not supported there: use "
                              "{w}.finetune.dataset or {w}.finetune.datasetPath"),
    "--output_dir": ("is passed by the launcher (output/<workload> in the ranks' folder of the claim); remove it. "
                     "For the recipe's layout (checkpoints/<workload>, models/<workload>, .complete last) use "
                     "{w}.finetune"),
    "--do_train": "is passed by the launcher already; remove it",
    "--use_habana": "is passed by the launcher already; remove it",
    "--use_lazy_mode": "is passed by the launcher already; remove it",
    "--throughput_warmup_steps": "is passed by the launcher already (3); remove it",
    "--use_deepspeed": "is gaudi_spawn.py's, which the launcher runs with it already; remove it",
    "--world_size": "is gaudi_spawn.py's, computed from workers x accelerator.count; remove it",
}


def reserved_flag(arg: str) -> tuple[str, ...] | None:
    """The workload keys that set this training argument, when the stack sets it already."""
    return RESERVED_TRAINING_FLAGS.get(arg.split("=", 1)[0])
