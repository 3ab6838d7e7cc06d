"""pytest plugin for mutation runs of modules whose tests compute with torch (tests/mutation/plan.py): torch keeps
one thread, whatever the code under test asks for.

mutmut forks each mutant's worker from the process that ran every test once. Once torch has computed on more than one
thread there (SentimentPredictor without options takes every core), OpenMP keeps a pool of threads that a forked
worker does not have: its first parallel region waits for them forever, and every mutant reads as a timeout, killed
or not. The predictor still computes the thread count it asks for (test_predictor_threads records it)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    import torch

    asks = torch.set_num_threads
    asks(1)
    torch.set_num_threads = lambda threads: asks(1)  # type: ignore[assignment]
