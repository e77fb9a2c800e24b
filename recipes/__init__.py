"""The programs that run in containers: the fine-tuning recipe (finetune.py and its modules), the evaluator, the
servers' entry scripts, the smoke training program, the NCCL check, the preStop hook and the launchers' watches.

They import the standard library and each other (`from recipes.finetune_data import ...`), never the stack: the
stack imports them (`recipes.contract` above all: each program's options, environment names, files and exit codes),
and pyproject.toml's import contract `recipes-below-the-stack` holds the other direction.

Shipped as a folder of flat files: a ConfigMap's keys cannot hold "/", so the stack ships this file under the name
`recipes.py` beside the programs (`recipes.contract.sources`). A module with `__path__` is a package (the import
system's rule), so there, as here, `recipes.NAME` is the file NAME.py beside this one.
"""

import os

__path__ = [os.path.dirname(os.path.abspath(__file__))]
