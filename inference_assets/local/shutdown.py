"""SIGTERM handled as Ctrl-C by the local harnesses, so ``kill <pid>`` stops their TorchServe as Ctrl-C does.

A plain SIGTERM ends a Python process without unwinding: ``with`` blocks do not exit, so the TorchServe a harness
started (its own process group, on purpose) would keep serving. Raising KeyboardInterrupt instead unwinds through
the harness's ``stop()``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt in the main thread; the old handler comes back after."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
