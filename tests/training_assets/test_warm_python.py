"""The warm ``python`` of the training tests (warm_python.py) runs a command as ``python`` would: argv, working
directory, environment, standard streams, exit status, signals both ways, and nothing left behind."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.training_assets.warm_python import WarmPython

PROBE = textwrap.dedent(
    """
    import json, os, signal, sys, time
    mode = sys.argv[1]
    if mode == "rank":
        print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}, torch loaded: {'torch' in sys.modules}")
        sys.exit(0)
    if mode == "report":
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "stdin": sys.stdin.read(),
                          "torch_loaded": "torch" in sys.modules, "variable": os.environ.get("WARM_PROBE")}))
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    open(sys.argv[2], "w").write(str(os.getpid()))
    if mode == "kill-myself":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "on-sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    time.sleep(120)
    """
)


@pytest.fixture()
def probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def _started(process: subprocess.Popen, pid_file: Path) -> int:
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, "the probe did not start"
        time.sleep(0.05)
    return int(pid_file.read_text())


def test_a_command_gets_its_argv_cwd_streams_and_exit_status_forked_warm(
    warm_python: WarmPython, probe: Path, tmp_path: Path
) -> None:
    result = subprocess.run([warm_python.executable, str(probe), "report"], cwd=tmp_path, env=warm_python.env(),
                            input="from stdin", capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)
    assert report == {"argv": [str(probe), "report"], "cwd": str(tmp_path), "stdin": "from stdin",
                      "torch_loaded": True, "variable": None}  # fmt: skip
    assert result.stderr == "to stderr\n"
    assert f"warm {probe} report" in warm_python.requests()


def test_a_different_environment_runs_as_plain_python(warm_python: WarmPython, probe: Path, tmp_path: Path) -> None:
    """A library may read a variable when it is imported: with one the warm interpreter did not have, the command
    runs as a process of its own, which then imports torch itself (the probe does not)."""
    result = subprocess.run([warm_python.executable, str(probe), "report"], cwd=tmp_path,
                            env=warm_python.env(WARM_PROBE="set"), input="", capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)
    assert (report["variable"], report["torch_loaded"]) == ("set", False)
    assert f"plain {probe} report (environment: WARM_PROBE)" in warm_python.requests()


def test_a_command_killed_by_a_signal_ends_its_caller_by_the_same_signal(
    warm_python: WarmPython, probe: Path, tmp_path: Path
) -> None:
    result = subprocess.run([warm_python.executable, str(probe), "kill-myself", str(tmp_path / "pid")],
                            env=warm_python.env(), capture_output=True, timeout=120)  # fmt: skip
    assert result.returncode == -signal.SIGKILL


def test_a_signal_to_the_caller_reaches_the_command(warm_python: WarmPython, probe: Path, tmp_path: Path) -> None:
    process = subprocess.Popen([warm_python.executable, str(probe), "on-sigterm", str(tmp_path / "pid")],
                               env=warm_python.env())  # fmt: skip
    try:
        _started(process, tmp_path / "pid")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 7  # the command's own handler ran and chose the exit status
    finally:
        process.kill()


def test_a_caller_killed_outright_takes_its_command_with_it(
    warm_python: WarmPython, probe: Path, tmp_path: Path
) -> None:
    process = subprocess.Popen([warm_python.executable, str(probe), "sleep", str(tmp_path / "pid")],
                               env=warm_python.env())  # fmt: skip
    command = psutil.Process(_started(process, tmp_path / "pid"))
    assert command.pid != process.pid
    process.kill()  # SIGKILL: the caller cannot pass it on
    process.wait(timeout=10)
    command.wait(timeout=30)  # gone, not merely signalled
    assert not psutil.pid_exists(command.pid) or command.status() == psutil.STATUS_ZOMBIE


def test_torchruns_workers_start_warm_too(warm_python: WarmPython, probe: Path, tmp_path: Path) -> None:
    """torchrun starts its workers with its PYTHON_EXEC setting, which the stand-in's environment names."""
    result = subprocess.run([warm_python.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                             "--standalone", str(probe), "rank"], cwd=tmp_path, env=warm_python.env(),
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(result.stdout.splitlines()) == [f"rank {r} of 2, torch loaded: True" for r in (0, 1)]
    assert warm_python.requests().count(f"warm -u {probe} rank") == 2
