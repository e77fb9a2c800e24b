"""deepspeed-stack policy pack: `pulumi preview --policy-pack policy` (after creating its venv, see README).

Pulumi runs this file with the pack's folder on sys.path, so `rules` is policy/rules.py, and the rules_*.py it
imports are top-level modules too (why each imports the others by both names, under `if __package__:`).
"""

from pulumi_policy import EnforcementLevel, PolicyPack
from rules import POLICIES

PolicyPack(
    name="deepspeed-stack",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=POLICIES,
)
