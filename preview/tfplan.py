"""A stack's GCP registrations as a Terraform-plan-like JSON, so checkov's GCP checks can read them.

pulumi-gcp bridges terraform-provider-google, so its inputs are Terraform's attributes in camelCase: this turns
them back (snake_case, nested objects as one-element block lists, Pulumi's plural block names singular) and
records which resource's id each input took as a configuration reference (checkov's graph checks, e.g.
CKV2_GCP_18, follow those). Good enough for checkov, not a real plan:

    python -m preview.tfplan --stack prod      # writes build/prod/tfplan.json
    checkov -f build/prod/tfplan.json --framework terraform_plan
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from preview.engine import PROJECT_DIR, RunResult, run_stack

TYPES = {
    "gcp:container/cluster:Cluster": "google_container_cluster",
    "gcp:container/nodePool:NodePool": "google_container_node_pool",
    "gcp:compute/network:Network": "google_compute_network",
    "gcp:compute/subnetwork:Subnetwork": "google_compute_subnetwork",
    "gcp:compute/firewall:Firewall": "google_compute_firewall",
    "gcp:compute/router:Router": "google_compute_router",
    "gcp:compute/routerNat:RouterNat": "google_compute_router_nat",
    "gcp:artifactregistry/repository:Repository": "google_artifact_registry_repository",
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": "google_artifact_registry_repository_iam_member",
    "gcp:serviceaccount/account:Account": "google_service_account",
    "gcp:serviceaccount/iAMMember:IAMMember": "google_service_account_iam_member",
    "gcp:projects/iAMMember:IAMMember": "google_project_iam_member",
    "gcp:storage/bucket:Bucket": "google_storage_bucket",
    "gcp:storage/bucketIAMMember:BucketIAMMember": "google_storage_bucket_iam_member",
}
# Repeated Terraform blocks that Pulumi names in the plural.
SINGULAR = {"allows": "allow", "denies": "deny", "secondary_ip_ranges": "secondary_ip_range",
            "guest_accelerators": "guest_accelerator", "lifecycle_rules": "lifecycle_rule", "taints": "taint"}
# Maps, not blocks: kept as objects.
MAPS = {"labels", "resource_labels", "metadata", "resource_manager_tags"}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def attributes(value: Any) -> Any:
    """Pulumi inputs -> Terraform attributes."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = SINGULAR.get(_snake(key), _snake(key))
            out[name] = item if name in MAPS else [attributes(item)] if isinstance(item, dict) else attributes(item)
        return out
    if isinstance(value, list):
        return [attributes(v) for v in value]
    return value


def plan(run: RunResult) -> dict[str, Any]:
    address = {r.urn: f"{TYPES[r.type]}.{r.name.replace('-', '_')}" for r in run.resources if r.type in TYPES}
    changes, config = [], []
    for r in run.resources:
        if r.urn not in address:
            continue
        tf_type, name = address[r.urn].split(".", 1)
        values = attributes(r.inputs)
        changes.append({"address": address[r.urn], "mode": "managed", "type": tf_type, "name": name,
                        "provider_name": "registry.terraform.io/hashicorp/google",
                        "change": {"actions": ["create"], "before": None, "after": values, "after_unknown": {}}})
        refs = {_snake(k): {"references": [f"{address[u]}.id" for u in urns if u in address]}
                for k, urns in r.property_dependencies.items() if any(u in address for u in urns)}
        config.append({"address": address[r.urn], "mode": "managed", "type": tf_type, "name": name,
                       "provider_config_key": "google", "expressions": refs})
    return {"format_version": "1.2", "terraform_version": "1.9.0",
            "planned_values": {"root_module": {"resources": [
                {k: c[k] for k in ("address", "mode", "type", "name", "provider_name")} | {
                    "schema_version": 0, "values": c["change"]["after"]} for c in changes]}},
            "resource_changes": changes, "configuration": {"root_module": {"resources": config}}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--stack", default="dev")
    parser.add_argument("--out", type=Path, default=None, help="default: build/<stack>/tfplan.json")
    args = parser.parse_args(argv)
    out = args.out or PROJECT_DIR / "build" / args.stack / "tfplan.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(plan(run_stack(args.stack)), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
