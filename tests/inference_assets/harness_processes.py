"""A local harness run as its command (``python -m inference_assets.local.<name>``), the way a shell script's
background job (``pytorch-platform serve ... &``) or a supervisor starts it, and stopped by one signal on its own pid.

It runs in its own session with SIGINT ignored, which is what POSIX shells without job control do to asynchronous
commands. :func:`stop_and_check` sends the signal to the harness's own pid (not to its group, as a terminal's Ctrl-C
would) and checks that the process exits with 0, that no process of its tree is left and that its port is closed;
whatever fails, nothing is left serving.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_harness(args: list[str], ready: re.Pattern[str], log: Path) -> tuple[subprocess.Popen, re.Match[str]]:
    """``python -m <args>`` as a background job, once its output matches ``ready`` (its "serving" line)."""
    stream = log.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        stdout=stream,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_as_background_job,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if match := ready.search(log.read_text()):
            return process, match
        if process.poll() is not None:
            break
        time.sleep(0.5)
    kill_tree(process, 0)
    pytest.fail(f"harness did not come up:\n{log.read_text()[-3000:]}")


def _as_background_job() -> None:
    """What ``sh -c 'command &'`` does before exec: the command inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def harness_tree(pid: int, port: int) -> list[psutil.Process]:
    """The harness, its children, the process serving its port, and every process in their process groups
    (``torchserve --start`` daemonises its Java frontend, which leaves the child tree but stays in the harness's
    TorchServe process group; and the toolkit's supervisor exits after 10 s when another TorchServe runs on the host,
    leaving its TorchServe serving, so the port finds the group even then)."""
    try:
        parent = psutil.Process(pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        family = []
    family += [
        psutil.Process(connection.pid)
        for connection in psutil.net_connections(kind="tcp")
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid
    ]
    groups = set()
    for process in family:
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            groups.add(os.getpgid(process.pid))
    members = []
    for candidate in psutil.process_iter():
        try:
            if os.getpgid(candidate.pid) in groups:
                members.append(candidate)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone or a zombie (the toolkit leaves its torchserve launcher unreaped)
        return []


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def kill_tree(process: subprocess.Popen, port: int) -> None:
    """SIGKILL the harness and every process of its tree (a test that failed leaves nothing serving)."""
    for leftover in [process.pid, *(p.pid for p in harness_tree(process.pid, port))]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(leftover, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def stop_and_check(process: subprocess.Popen, port: int, sig: signal.Signals, server: str) -> None:
    """``sig`` on the harness's pid stops it and its whole tree. ``server``: a word of the model server's command
    line that must be in the tree before the stop."""
    tree = harness_tree(process.pid, port)
    try:
        assert any(server in " ".join(cmdline(p)) for p in tree), [cmdline(p) for p in tree]
        os.kill(process.pid, sig)
        assert process.wait(timeout=90) == 0
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, [cmdline(p) for p in alive]
        assert not port_open(port)
    finally:  # whatever failed above, leave nothing serving on the shared machine
        for leftover in [process.pid, *(p.pid for p in tree)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(leftover, signal.SIGKILL)
