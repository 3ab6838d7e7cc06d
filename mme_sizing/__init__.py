"""Sizing of the multi-model endpoint: what a model costs (costs.py), a model of the fleet (simulation.py) and the
predictions for an environment's settings (plan.py)."""
