"""The CrossGuard policy pack (`pulumi preview --policy-pack policy`); its table of policies is
`policy.rules`, the rules beside it by area (`policy.rules_gke`, `rules_workloads`, `rules_vpc`, `rules_support`)."""
