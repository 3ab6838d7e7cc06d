"""``kill -INT <pid>`` and ``kill <pid>`` on a local harness stop its model server (Ray Serve for the single-model
harness, TorchServe for the multi-model one): nothing keeps serving.

Each harness runs as its command (``python -m inference_assets.local.<name>``) in its own session, started the way
a shell script's background job (``pytorch-platform serve ... &``) or a supervisor starts it: with SIGINT ignored,
which is what POSIX shells without job control do to asynchronous commands. The test waits for its "serving" line,
sends the signal to the harness's own pid (not to its group, as a terminal's Ctrl-C would) and checks that the
process exits, the port stops answering and no process of the harness's process tree is left.
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

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _start(args: list[str], ready: re.Pattern[str], tmp_path: Path) -> tuple[subprocess.Popen, re.Match[str]]:
    log = tmp_path / "harness.out"
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
    process.kill()
    pytest.fail(f"harness did not come up:\n{log.read_text()[-3000:]}")


def _as_background_job() -> None:
    """What ``sh -c 'command &'`` does before exec: the command inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _tree(pid: int, port: int) -> list[psutil.Process]:
    """The harness, its children, the process serving its port, and every process in their process groups
    (``torchserve --start`` daemonises its Java frontend, which leaves the child tree but stays in the harness's
    TorchServe process group; and the toolkit's supervisor exits after 10 s when another TorchServe runs on the host,
    leaving its TorchServe serving, so the port finds the group even then)."""
    parent = psutil.Process(pid)
    family = [parent, *parent.children(recursive=True)]
    family += [
        psutil.Process(connection.pid)
        for connection in psutil.net_connections(kind="tcp")
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid
    ]
    groups = {os.getpgid(p.pid) for p in family if p.is_running()}
    members = []
    for candidate in psutil.process_iter():
        try:
            if os.getpgid(candidate.pid) in groups:
                members.append(candidate)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone or a zombie (the toolkit leaves its torchserve launcher unreaped)
        return []


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _stop_and_check(process: subprocess.Popen, port: int, sig: signal.Signals, server: str) -> None:
    """``server``: a word of the model server's command line that must be in the tree before the stop."""
    tree = _tree(process.pid, port)
    try:
        assert any(server in " ".join(_cmdline(p)) for p in tree), [_cmdline(p) for p in tree]
        os.kill(process.pid, sig)
        assert process.wait(timeout=90) == 0
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, [_cmdline(p) for p in alive]
        assert not _port_open(port)
    finally:  # whatever failed above, leave nothing serving on the shared machine
        for leftover in [process.pid, *(p.pid for p in tree)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(leftover, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_local_server_stops_its_ray_serve(model_archive: Path, tmp_path: Path, sig: signal.Signals) -> None:
    process, match = _start(
        ["inference_assets.local.local_server", "--model", str(model_archive), "--workers", "1"],
        re.compile(r"at http://127\.0\.0\.1:(\d+) "),
        tmp_path,
    )
    _stop_and_check(process, int(match[1]), sig, "ray::ServeReplica")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_local_mme_stops_its_torchserve(tmp_path: Path, sig: signal.Signals) -> None:
    process, match = _start(
        ["inference_assets.local.local_mme", "--work-dir", str(tmp_path / "mme")],
        re.compile(r"inference http://127\.0\.0\.1:(\d+) .*\n.*\n.*invoke"),
        tmp_path,
    )
    _stop_and_check(process, int(match[1]), sig, "org.pytorch.serve.ModelServer")
