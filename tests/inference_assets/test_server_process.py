"""The local process manager, driven with small stand-in servers (plain Python processes that fork, serve a port,
ignore signals): what it guarantees for any model server, whatever the server is."""

from __future__ import annotations

import http.client
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from inference_assets.local.server_process import (
    ServerCommand,
    ServerError,
    ServerProcess,
    StopStep,
    free_port,
    group_alive,
)

# A leader that forks a child which serves /ping on PORT and ignores SIGTERM (as a JVM started with -Xrs that inherited
# it ignored); the leader writes LEADER_STOPPED when it gets SIGTERM, then exits, or exits at once when EXIT_EARLY.
_SERVER = textwrap.dedent(
    """
    import http.server, os, signal, sys, time
    port, marker, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if mode == "exit-early":
        print("cannot start: bad configuration", flush=True)
        sys.exit(3)
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if mode == "own-group":
            os.setpgrp()  # as Ray's raylet starts its workers: out of the server's process group
        class Ping(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
            def log_message(self, *args):
                pass
        http.server.HTTPServer(("127.0.0.1", port), Ping).serve_forever()
    def leader_stopped(*_):
        open(marker, "w").write("stopped")
        sys.exit(0)
    signal.signal(signal.SIGTERM, leader_stopped)
    if mode == "daemonize":
        sys.exit(0)  # the leader leaves; its child serves on in the group
    while True:
        time.sleep(1)
    """
)


def _pings(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/ping")
        return connection.getresponse().status == 200
    finally:
        connection.close()


def _command(tmp_path: Path, mode: str, **options) -> tuple[ServerCommand, int]:
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(_SERVER)
    command = ServerCommand(
        argv=[sys.executable, str(script), str(port), str(tmp_path / "leader-stopped"), mode],
        ready=lambda: _pings(port),
        environment={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        log_path=tmp_path / "logs" / "server.log",
        startup_timeout_s=30,
        # The child ignores SIGTERM: a short grace before SIGKILL keeps the tests quick.
        **{"stop_steps": (StopStep(signal.SIGTERM, 1.0), StopStep(signal.SIGKILL, 5.0)), **options},
    )
    return command, port


def test_stop_ends_every_process_of_the_group_even_one_that_ignores_sigterm(tmp_path: Path) -> None:
    command, port = _command(tmp_path, "serve")
    with ServerProcess(command) as server:
        assert _pings(port)
        group = server.group
        members = [p for p in psutil.process_iter() if _in_group(p, group)]
        assert len(members) == 2  # the leader and its serving child
    assert not group_alive(group)
    with pytest.raises(OSError):
        _pings(port)


def test_a_leader_that_leaves_its_server_running_is_still_running_and_still_stopped(tmp_path: Path) -> None:
    command, port = _command(tmp_path, "daemonize")
    server = ServerProcess(command).start()
    try:
        time.sleep(0.5)
        assert server.running(), "the group still serves after its leader exited"
        assert _pings(port)
    finally:
        server.stop()
    assert not server.running()
    with pytest.raises(OSError):
        _pings(port)


def test_kill_leader_first_keeps_the_leaders_stop_handler_from_running(tmp_path: Path) -> None:
    graceful, _ = _command(tmp_path, "serve")
    with ServerProcess(graceful):
        pass
    assert (tmp_path / "leader-stopped").exists(), "control: SIGTERM runs the leader's handler"
    (tmp_path / "leader-stopped").unlink()

    killed, port = _command(tmp_path, "serve", kill_leader_first=True)
    with ServerProcess(killed):
        assert _pings(port)
    assert not (tmp_path / "leader-stopped").exists()


def test_a_server_that_exits_at_start_fails_at_once_with_its_log(tmp_path: Path) -> None:
    command, _ = _command(tmp_path, "exit-early")
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"exited with 3(.|\n)*bad configuration"):
        ServerProcess(command).start()
    assert time.monotonic() - started < command.startup_timeout_s  # not by waiting out the start-up limit


def _in_group(process: psutil.Process, group: int) -> bool:
    try:
        return os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ProcessLookupError):
        return False


def test_a_descendant_that_left_the_group_is_stopped_with_it(tmp_path: Path) -> None:
    command, port = _command(tmp_path, "own-group")
    server = ServerProcess(command).start()
    group = server.group
    (child,) = psutil.Process(group).children()
    assert os.getpgid(child.pid) != group
    server.stop()
    assert not group_alive(group)
    child.wait(timeout=10)  # gone, not merely signalled
    with pytest.raises(OSError):
        _pings(port)


def test_a_leader_only_step_lets_the_leader_shut_down_before_the_group_is_signalled(tmp_path: Path) -> None:
    # The child ignores SIGTERM and never gets it: the grace runs out whole, so a short one keeps the test quick.
    steps = (StopStep(signal.SIGTERM, 2.0, leader_only=True), StopStep(signal.SIGKILL, 5.0))
    command, port = _command(tmp_path, "serve", stop_steps=steps)
    with ServerProcess(command) as server:
        assert _pings(port)
        group = server.group
    assert (tmp_path / "leader-stopped").exists(), "the leader got SIGTERM and ran its handler"
    assert not group_alive(group)  # its child ignored SIGTERM: the group's SIGKILL ended it
