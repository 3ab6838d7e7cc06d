"""One way to run a local model server: its own process group, a readiness check, a log, and a stop that leaves
nothing behind.

The local harnesses (the single-model Ray Serve server, the proving ground's multi-model TorchServe) differ only in
data: the command, its environment, how to tell it is ready, and which signals stop it. The manager knows no server,
so a harness that moves to another server changes its command and readiness check, not its process handling.

Why a process group, and why stopping the group: a model server forks (a Java frontend, one Python worker per
model); the leader can exit while its children keep serving, so "stopped" means no process of the group is left.
Some servers also start processes in groups of their own (Ray's raylet starts each worker with ``setpgrp``): the
server's descendants found when the stop begins are signalled and waited for with the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

from inference_assets.local.shutdown import default_stop_signals


class ServerError(RuntimeError):
    """The server did not come up, or is gone; the message carries the tail of its log."""


@dataclass(frozen=True)
class StopStep:
    """Send ``signal`` to the whole group (``leader_only``: to the leader alone, for a server that shuts its own
    processes down), then wait up to ``grace_s`` for every process of the server to end."""

    signal: signal.Signals
    grace_s: float
    leader_only: bool = False


# The usual stop: ask politely, then insist.
GRACEFUL_STOP = (StopStep(signal.SIGTERM, 10.0), StopStep(signal.SIGKILL, 5.0))


def free_port() -> int:
    """A port free on 127.0.0.1 now (the OS picks it): servers on one host never collide on fixed ports."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def group_alive(group: int) -> bool:
    """Whether any process of the process group ``group`` is left (reaped leaders do not count)."""
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _descendants_outside(group: int, leader: int) -> list[psutil.Process]:
    """The leader's descendants that left its process group (they would outlive a stop of the group alone)."""
    try:
        children = psutil.Process(leader).children(recursive=True)
    except psutil.Error:
        return []
    strays = []
    for child in children:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(child.pid) != group:
                strays.append(child)
    return strays


@dataclass(frozen=True)
class ServerCommand:
    """What a harness runs, as data.

    ``ready`` is called until it returns True (connection errors count as not yet); ``kill_leader_first`` kills the
    leader outright before the group's stop steps, for a leader whose own stop handler must not run (the SageMaker
    toolkit's supervisor, which on SIGTERM kills whichever TorchServe it found on the host). ``preexec`` runs in the
    child before exec (signal dispositions the server must inherit)."""

    argv: Sequence[str]
    ready: Callable[[], bool]
    environment: Mapping[str, str]
    cwd: Path
    log_path: Path
    startup_timeout_s: float = 240.0
    stop_steps: Sequence[StopStep] = GRACEFUL_STOP
    kill_leader_first: bool = False
    preexec: Callable[[], None] = default_stop_signals


class ServerProcess:
    """A started :class:`ServerCommand`: ``with ServerProcess(command) as process: ...`` or start()/stop()."""

    def __init__(self, command: ServerCommand) -> None:
        self.command = command
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def group(self) -> int:
        """The process group id (the leader's pid: the server runs in a session of its own)."""
        if self._process is None:
            raise ServerError("the server is not running")
        return self._process.pid

    def start(self) -> Self:
        if self._process is not None:
            raise ServerError("the server is already running")
        command = self.command
        command.log_path.parent.mkdir(parents=True, exist_ok=True)
        with command.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                list(command.argv),
                cwd=command.cwd,
                env=dict(command.environment),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the server and all it forks stop together
                preexec_fn=command.preexec,
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.command.startup_timeout_s
        pause = 0.05  # a quick server is ready at once; a slow one (seconds) is asked twice a second at most
        while time.monotonic() < deadline:
            try:
                if self.command.ready():
                    return
            except OSError:  # not listening yet (requests' ConnectionError is an OSError too)
                pass
            # A leader may exit while what it started serves on (a daemonising launcher), so only an empty group
            # means the server is not coming; poll() reaps the leader so that a zombie does not count.
            if self._process.poll() is not None and not group_alive(self._process.pid):
                raise ServerError(f"the server exited with {self._process.returncode}; log:\n{self.log_tail()}")
            time.sleep(pause)
            pause = min(0.5, pause * 2)
        raise ServerError(f"not ready after {self.command.startup_timeout_s:.0f} s; log:\n{self.log_tail()}")

    def running(self) -> bool:
        """Whether any process of the server's group is left."""
        if self._process is None:
            return False
        self._process.poll()
        return group_alive(self._process.pid)

    def stop(self) -> None:
        """Stop every process of the group and every descendant of the leader (idempotent)."""
        process, self._process = self._process, None
        if process is None:
            return
        group = process.pid
        strays = _descendants_outside(group, process.pid)
        if self.command.kill_leader_first and process.poll() is None:
            process.kill()
        for step in self.command.stop_steps:
            if step.leader_only:
                if process.poll() is None:
                    process.send_signal(step.signal)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, step.signal)
                for stray in strays:
                    with contextlib.suppress(psutil.Error):
                        stray.send_signal(step.signal)
            deadline = time.monotonic() + step.grace_s
            while time.monotonic() < deadline:
                process.poll()  # reap the leader, or it counts as alive
                if not self._alive(group, strays):
                    break
                time.sleep(0.2)
            if not self._alive(group, strays):
                break
        process.poll()

    @staticmethod
    def _alive(group: int, strays: list[psutil.Process]) -> bool:
        return group_alive(group) or any(_running(stray) for stray in strays)

    def log_tail(self, lines: int = 40) -> str:
        path = self.command.log_path
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
