"""The planner: memory per accelerator for a model (sizing), the cheapest GPUs that hold it (recommend), and
what a stack's pools cost per hour (cost). GPU facts come from data/gpu_catalog.yaml, models from data/models.yaml."""
