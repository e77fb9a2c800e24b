"""Where an NVIDIA MPIJob's `launch.script` comes from, and the path every rank runs it at.

- `NAME.py`: the project's program in recipes/, shipped in the job's ConfigMap (mounted at CONFIG_DIR) with the
  package's __init__ as recipes.py, its own modules and the modules every program imports (recipes/contract.py
  `program_sources`: OWN_MODULES, COMMON).
- `user/NAME.py`: your own script in recipes/user/, shipped the same way under the key `user-NAME.py`.
  The folder is yours: ruff and the project's tests leave it alone (pyproject.toml `extend-exclude`), so a script
  of yours never breaks `make test` or `make lint`.
- `gs://BUCKET/PATH.py`: a file of the stack's bucket, run from the workload's GCS FUSE mount
  (`gcsFuse.mountPath/PATH.py`): no fork, no ConfigMap.
- `/ABSOLUTE/PATH.py`: a file of the image, of the claim, or of the bucket's mount: run where it is.

`source` renders, `problems` is the rule: both read the same table of forms, so what previews is what runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from model.problems import Problem
from model.types import MpiJobBaseConfig, StackConfig
from model.validators import at, is_file
from recipes import contract
from workloads.mpijob.shape import CONFIG_DIR

SCRIPTS_DIR = contract.HERE  # recipes/
USER_FOLDER = "user"  # recipes/user/: the users' scripts
USER_KEY_PREFIX = "user-"  # their ConfigMap key (a key has no "/")
GS_PREFIX = "gs://"
# What a ConfigMap key allows (Kubernetes: [-._a-zA-Z0-9]+), for the shipped file's name.
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


class ScriptSource(msgspec.Struct, frozen=True):
    path: str  # what every rank runs
    files: dict[str, str]  # what the job's ConfigMap ships for it (key -> text)


def _in_bucket(script: str) -> tuple[str, str]:
    bucket, _, path = script[len(GS_PREFIX):].partition("/")
    return bucket, path


def source(w: MpiJobBaseConfig) -> ScriptSource:
    """The path the ranks run `launch.script` at, and the files to ship (with `launch.command`: none)."""
    script = w.launch.script
    if script.startswith(GS_PREFIX):
        return ScriptSource(f"{w.gcs_fuse.mount_path.rstrip('/')}/{_in_bucket(script)[1]}", {})
    if script.startswith("/"):
        return ScriptSource(script, {})
    if script.startswith(f"{USER_FOLDER}/"):
        key = USER_KEY_PREFIX + script.split("/", 1)[1]
        text = "" if w.launch.command else (SCRIPTS_DIR / script).read_text(encoding="utf-8")
        return ScriptSource(f"{CONFIG_DIR}/{key}", {} if w.launch.command else {key: text})
    # A program of the recipes package ships with the package's __init__ (recipes.py) and the modules it imports.
    shipped = {} if w.launch.command else contract.program_sources(script)
    return ScriptSource(f"{CONFIG_DIR}/{script}", shipped)


def local_file(script: str) -> Path | None:
    """The project's file a `launch.script` of the shipped forms (`NAME.py`, `user/NAME.py`) is read from; None for
    a file of the bucket or the image, which nothing here can read."""
    if script.startswith(("/", GS_PREFIX)) or script.count("/") > 1:
        return None
    if "/" in script and not script.startswith(f"{USER_FOLDER}/"):
        return None
    return SCRIPTS_DIR / script


def _known(folder: Path) -> str:
    return ", ".join(sorted(p.name for p in folder.glob("*.py") if not p.name.startswith("_"))) or "nothing"


def _bucket_problems(m: StackConfig, w: MpiJobBaseConfig, key: str) -> list[Problem]:
    bucket, path = _in_bucket(w.launch.script)
    named = m.storage.existing_bucket or m.storage.bucket_name
    mount = w.gcs_fuse.mount_path.rstrip("/")
    problems = []
    if not path or path.endswith("/"):
        problems.append(Problem(key, f"{w.launch.script!r} names no file (gs://BUCKET/PATH.py)"))
    if not m.storage.enabled:
        problems.append(Problem(key, f"{w.launch.script!r} is in a bucket, but the stack has none; set storage.enabled "
                        "(with storage.existingBucket for a bucket of yours)"))
    elif named is None:
        problems.append(Problem(key,
                                f"the stack's bucket is auto-named, so {bucket!r} cannot be told to be it; write the "
                                f"path under the bucket's mount instead ({mount}/{path or 'PATH.py'})"))
    elif bucket != named:
        problems.append(Problem(key, f"{bucket!r} is not the stack's bucket ({named!r}); the pods mount only that one "
                        f"(storage.existingBucket names a bucket of yours)"))
    if not w.gcs_fuse.enabled:
        problems.append(Problem(key, f"a script in the bucket is read through the pods' GCS FUSE mount; set "
                        f"{at('workloads', w.name, 'gcsFuse', 'enabled')}: true"))
    return problems


def problems(m: StackConfig, w: MpiJobBaseConfig) -> list[Problem]:
    """`launch.script` names a file the ranks can run (see the module's forms)."""
    script, key = w.launch.script, at("workloads", w.name, "launch", "script")
    if script.startswith(GS_PREFIX):
        return _bucket_problems(m, w, key)
    if script.startswith("/"):
        mount = w.gcs_fuse.mount_path.rstrip("/")
        if script.startswith(f"{mount}/") and not w.gcs_fuse.enabled:
            return [Problem(key, f"{script} is under the bucket's mount path {mount}, but the pods do not mount the "
                    f"bucket; set {at('workloads', w.name, 'gcsFuse', 'enabled')}: true")]
        return []  # in the image or on the claim: nothing here can see it
    if w.launch.command:
        return []  # the command runs what it names
    if script.startswith(f"{USER_FOLDER}/") and script.count("/") == 1:
        name = script.split("/", 1)[1]
        if CONFIG_KEY.match(name) and is_file(SCRIPTS_DIR / script):
            return []
        return [Problem(key, f"no file {name!r} in recipes/{USER_FOLDER} (there: "
                f"{_known(SCRIPTS_DIR / USER_FOLDER)}); a name of letters, digits, '-', '_' and '.'")]
    if "/" not in script and is_file(SCRIPTS_DIR / script):
        return []
    return [Problem(key, f"no file {script!r} in recipes (there: {_known(SCRIPTS_DIR)}); put your own script in "
            f"recipes/{USER_FOLDER}/ (`{USER_FOLDER}/NAME.py`), in the stack's bucket "
            "(`gs://BUCKET/PATH.py`), or name an absolute path in the image, or set launch.command")]
