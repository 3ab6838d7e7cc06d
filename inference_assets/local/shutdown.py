"""Stop signals handled as Ctrl-C by the local harnesses, so ``kill -INT <pid>`` and ``kill <pid>`` stop their
TorchServe as Ctrl-C in a terminal does.

Two ways a harness could ignore a stop signal without this:

- SIGTERM ends a Python process without unwinding: ``with`` blocks do not exit, so the TorchServe a harness started
  (its own process group, on purpose) would keep serving.
- SIGINT is ignored altogether when the harness was started with SIGINT ignored: a POSIX shell without job control
  starts background commands that way (``pytorch-platform serve ... &`` in a script, CI runners, nohup-like
  supervisors), and Python then leaves SIGINT ignored instead of installing its KeyboardInterrupt handler
  (https://docs.python.org/3/library/signal.html#execution-of-python-signal-handlers).

Within :func:`stop_signals_as_interrupt` both raise KeyboardInterrupt in the main thread, which unwinds through the
harness's ``stop()``; :func:`default_stop_signals` gives a child process (TorchServe) the default dispositions back.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt in the main thread, whatever their inherited
    disposition; the previous handlers come back after."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def default_stop_signals() -> None:
    """``preexec_fn`` for a server process: SIGINT back to its default action, in case the harness inherited it
    ignored (the exec'd program would inherit SIG_IGN, and a JVM started with -Xrs keeps it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
