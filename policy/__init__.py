"""The CrossGuard policy pack (`pulumi preview --policy-pack policy`); the rules live in `policy.rules`."""
