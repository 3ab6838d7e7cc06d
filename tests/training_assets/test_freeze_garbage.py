"""The training script's ``gc.freeze()`` after the warm-up (``FreezeGarbage``): the heap is frozen from that step on,
and at the end of training the process has it as it was before: unfrozen in a process of its own (a training job), still
frozen in a host that had frozen its own heap (a long-lived process that trains in-process, as the suite's workers do:
tests/conftest.py freezes them once their modules are collected)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from training_assets.instance.train_sentiment import FreezeGarbage

AFTER_STEP = 2


def _train(callback: FreezeGarbage) -> list[int]:
    """The callback's hooks as the Trainer calls them over three steps: the frozen count after each, then at the end."""
    counts = []
    for step in (1, 2, 3):
        callback.on_step_end(None, SimpleNamespace(global_step=step), None)
        counts.append(gc.get_freeze_count())
    callback.on_train_end(None, None, None)
    return [*counts, gc.get_freeze_count()]


@pytest.fixture
def nothing_frozen() -> Iterator[None]:
    """A process with nothing frozen; the worker's own freeze is restored afterwards."""
    gc.unfreeze()
    yield
    gc.collect()
    gc.freeze()


@pytest.mark.usefixtures("nothing_frozen")
def test_a_process_of_its_own_is_frozen_from_the_warm_up_on_and_unfrozen_at_the_end() -> None:
    after_first, after_warm_up, after_third, at_the_end = _train(FreezeGarbage(AFTER_STEP))
    assert after_first == 0
    assert after_warm_up > 0 and after_third >= after_warm_up
    assert at_the_end == 0


def test_a_host_that_froze_its_heap_keeps_it_frozen() -> None:
    gc.freeze()
    host = gc.get_freeze_count()
    assert host > 0
    after_first, after_warm_up, _, at_the_end = _train(FreezeGarbage(AFTER_STEP))
    assert after_first >= host - 10  # a few of the host's frozen objects may die meanwhile
    assert after_warm_up > 0 and at_the_end >= after_warm_up - 10
