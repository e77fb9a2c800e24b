"""The Gaudi MPIJob's environment: what the launcher and workers get, what the launcher's ssh sends on to the ranks,
`env` as the file DeepSpeed's runner exports on every rank, the names `env` may not set, and the recipe's roots and
launch on Gaudi (its folders' variables are part of the environment).
"""

from __future__ import annotations

from model.types import MpiJobWorkloadConfig
from recipes.contract import STACK_KEYS_ENV
from workloads import recipe
from workloads.mpijob.shape import CONFIG_DIR, base_env, base_forwarded, fabric_env, token_names
from workloads.placement import Placement

# `env` reaches the ranks through DeepSpeed's runner, not ssh: the image's sshd sets its own variables (SetEnv, which
# wins over what a client sends) and accepts only the names the stack forwards, so an HCCL_* of the pod would never
# reach a rank. DeepSpeed's runner reads NAME=VALUE lines from DS_ENV_FILE (deepspeed/launcher/runner.py,
# DEEPSPEED_ENVIRONMENT_NAME; an absolute path is used as it is) and prefixes every rank's command with
# `export NAME=VALUE;` (PDSHRunner), after the ssh session's environment is set.
ENV_FILE_KEY = "deepspeed_env"
DS_ENV_FILE = "DS_ENV_FILE"
RECIPE_KEYS_ENV = STACK_KEYS_ENV

# Names `env` may not set, and the key (or the part of the stack) that sets each.
STACK_ENV: dict[str, str] = {
    "HF_HOME": "hfHome", "LLM_MODEL": "training.model", "NUM_HPU": "accelerator.count",
    "NUM_EPOCHS": "training.epochs", "http_proxy": "proxy.http", "HTTP_PROXY": "proxy.http",
    "https_proxy": "proxy.https", "HTTPS_PROXY": "proxy.https", "no_proxy": "proxy.noProxy",
    "NO_PROXY": "proxy.noProxy", "HF_TOKEN": "hfToken", "HUGGING_FACE_HUB_TOKEN": "hfToken",
    DS_ENV_FILE: "env itself (the file of these variables)", "MASTER_ADDR": "the launcher (the first worker)",
    "HOSTSFILE": "the launcher (the operator's hostfile)", "PATH": "the image", "LD_LIBRARY_PATH": "the image",
    "HOME": "the image", "USER": "the image", "K_MPI_JOB_ROLE": "the MPI operator",
    "CHECKPOINT_DIR": "the stack (finetune: <claim>/deepspeed-stack/checkpoints/<workload>)",
    "MODEL_DIR": "the stack (finetune: <claim>/deepspeed-stack/models/<workload>)",
    RECIPE_KEYS_ENV: "the stack (finetune)",
}
# The MPI operator sets Open MPI's variables on the launcher (the hostfile, the ssh agent).
STACK_ENV_PREFIXES: dict[str, str] = {"OMPI_": "the MPI operator"}


def stack_env_owner(name: str) -> str | None:
    """Who sets an environment variable of the Gaudi job already (None: `env` may set it)."""
    if name in STACK_ENV:
        return STACK_ENV[name]
    return next((owner for prefix, owner in STACK_ENV_PREFIXES.items() if name.startswith(prefix)), None)


def env_file(w: MpiJobWorkloadConfig) -> str:
    """`env` as DeepSpeed's runner reads it: NAME=VALUE lines (it quotes each value itself)."""
    return "".join(f"{name}={value}\n" for name, value in w.env.items())


def recipe_roots(w: MpiJobWorkloadConfig) -> recipe.RecipeRoots:
    """The recipe's roots on Gaudi: your data and the outputs on the shared claim, ds_config.json and the script in
    the job's ConfigMap."""
    return recipe.RecipeRoots(data=w.storage.mount_path.rstrip("/") or "/", output=w.output_root, config=CONFIG_DIR,
                              name=w.name)


def recipe_env(w: MpiJobWorkloadConfig) -> dict[str, str]:
    """With `finetune`: the contract's folders (as finetune.py's arguments say too) and the stack's key for each
    flag (the script's errors name workloads.<name>.finetune.*)."""
    if w.finetune is None:
        return {}
    where = recipe_roots(w)
    return {"CHECKPOINT_DIR": where.checkpoint_dir, "MODEL_DIR": where.model_dir, **recipe_launch(w).env}


def recipe_launch(w: MpiJobWorkloadConfig) -> recipe.RecipeLaunch:
    """The recipe's launch on Gaudi (workloads/recipe.py `launch`, as on GKE and Vertex AI)."""
    assert w.finetune is not None
    return recipe.launch(w.finetune, w.deepspeed.learning_rate, recipe_roots(w), ("workloads", w.name),
                         w.launch.args)


def plain_env(w: MpiJobWorkloadConfig, where: Placement) -> dict[str, str]:
    """Non-secret variables of the launcher and workers; LLM_MODEL, NUM_HPU and NUM_EPOCHS are the names the Omnia
    launcher uses, so its command reads the same (`training`'s run only). `env` too, and where DeepSpeed's runner
    finds it for the ranks."""
    ranks = {**w.env, DS_ENV_FILE: f"{CONFIG_DIR}/{ENV_FILE_KEY}"} if w.env else {}
    omnia = {} if w.finetune is not None else {"LLM_MODEL": w.training.model, "NUM_EPOCHS": str(w.training.epochs)}
    return {**base_env(w), **omnia, "NUM_HPU": str(where.per_worker), **recipe_env(w), **fabric_env(where), **ranks}


def forwarded_env(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> list[str]:
    """Variables the launcher's ssh sends to the training processes on the workers."""
    return [*base_forwarded(w), *recipe_env(w), *token_names(has_token)]
