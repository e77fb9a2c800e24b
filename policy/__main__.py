"""deepspeed-stack policy pack: `pulumi preview --policy-pack policy` (after creating its venv, see README).

Pulumi runs this file with the pack's folder on sys.path: there `import policy` finds policy/policy.py, which makes
itself the package (its `__path__` is this folder), so `policy.rules` is rules.py here as in the project.
"""

from pulumi_policy import EnforcementLevel, PolicyPack

from policy.rules import POLICIES

PolicyPack(
    name="deepspeed-stack",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=POLICIES,
)
