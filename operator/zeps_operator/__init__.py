"""zeps_operator: the kopf operator that reconciles Topic, Queue and ZepsStream resources.

Layering (enforced by import-linter: the contracts in pyproject.toml's ``[tool.importlinter]``): kopf
handlers stay thin and call pure planners; ZooKeeper, Kubernetes and broker work goes through
adapters. The only package allowed to import kopf.
"""
