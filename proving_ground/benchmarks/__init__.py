"""Benchmarks of the platform's assets: each measures side by side in one run and writes its numbers under
``results/`` (docs/benchmarks.md). Nothing of the product reads them at synth: numbers the synth needs are recorded
as checked-in data with their provenance (e.g. mme_sizing/measured_costs.json)."""
