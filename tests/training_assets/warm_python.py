"""Training processes that start with torch and transformers already imported: each is forked from one warm
interpreter instead of importing them again. A tiny two-process torchrun run spends 11 of its 12.5 CPU-seconds on
imports (torchrun's ~1.4, each rank's ~5: torch, transformers' Trainer and what it pulls in), and the training tests
start about twenty such processes (checkpoints, torchrun, rendezvous and CLI runs).

``WarmPython(environment)`` starts the warm interpreter; ``.executable`` stands in for ``python`` in a test's
command (``[executable, "-m", MODULE, ...]``) and, as torchrun's own ``PYTHON_EXEC`` setting, for torchrun's
workers. Every process started through it is still a process of its own, with its argv, environment, working
directory, standard streams, exit status and signals, as ``python`` would give it:

- the stand-in (a small script, started as ``python`` would be) passes its argv, environment, working directory and
  standard streams to the warm interpreter, which forks a supervisor, which forks the runner: the runner runs the
  module or script as ``python -m``/``python script.py`` would, in a session of its own;
- the stand-in forwards the signals it gets to the runner, and ends as the runner ended (its exit code, or killed by
  the same signal);
- if the stand-in dies (SIGKILL), the supervisor kills the runner's process group, so nothing outlives it.

A command it cannot run exactly as ``python`` would runs as ``python`` itself: other interpreter options than ``-u``,
or an environment that differs from the warm interpreter's in anything but torchrun's per-worker variables (a
library may read a variable when it is imported, which the warm interpreter did before the fork).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What torchrun sets for its workers (torch.distributed.elastic: the agent and the launcher), read when a worker
# initializes its process group, never when torch is imported; pytest's name of the test that runs; and what a
# SageMaker job's code reads when it runs (training_assets/remote_train.py: SM_MODEL_DIR in run_training_job); and
# what bash sets for the commands of a script (the command's path in _, its nesting level, its working folders).
# fmt: off
READ_AT_RUN_TIME = {"LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
              "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
              "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
              "NCCL_ASYNC_ERROR_HANDLING", "PYTEST_CURRENT_TEST", "SM_MODEL_DIR",
              "_", "SHLVL", "PWD", "OLDPWD"}
# fmt: on
# What a training process imports before it trains (torch, transformers' Trainer and model classes, what they pull
# in; torchrun's launcher), but not the modules the commands run: ``python -m`` runs its module as __main__ only.
WARM_MODULES = ("numpy", "torch", "torch._dynamo.utils", "torch.distributed.launcher.api", "transformers")
WARM_NAMES = ("Trainer", "TrainerCallback", "TrainingArguments", "AutoModelForSequenceClassification", "AutoTokenizer")
REQUESTS_LOG = "requests.log"  # beside the socket: what the warm interpreter did with each command
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)

# The stand-in: no site, no imports beyond the standard library's smallest, so that it starts in milliseconds.
STAND_IN = """#!{python} -IS
import array, json, os, signal, socket, struct, sys
PYTHON, SOCKET = {python!r}, {socket!r}
def plain():
    os.execv(PYTHON, [PYTHON, *sys.argv[1:]])
args = sys.argv[1:]
try:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(SOCKET)
except OSError:
    plain()
request = json.dumps({{"argv": args, "env": dict(os.environ), "cwd": os.getcwd()}}).encode()
connection.sendmsg([struct.pack("!I", len(request)), request],
                   [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
if connection.recv(1) != b"+":
    plain()
for number in {forwarded}:
    signal.signal(number, lambda number, frame: connection.sendall(b"S" + struct.pack("!i", number)))
answer = b""
while len(answer) < 5:
    chunk = connection.recv(5 - len(answer))
    if not chunk:
        sys.exit(255)
    answer += chunk
kind, value = answer[:1], struct.unpack("!i", answer[1:])[0]
if kind == b"K":
    if value != signal.SIGKILL:
        signal.signal(value, signal.SIG_DFL)
    os.kill(os.getpid(), value)
sys.exit(value)
"""


class WarmPython:
    """The warm interpreter and its ``python`` stand-in, for commands run with ``environment``."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="warm-python-"))
        self.executable = str(self.folder / "python")
        self.environment = {**environment, "PYTHON_EXEC": self.executable}
        address = str(self.folder / "socket")
        Path(self.executable).write_text(
            STAND_IN.format(python=sys.executable, socket=address, forwarded=[int(s) for s in FORWARDED])
        )
        os.chmod(self.executable, 0o755)
        self.server = subprocess.Popen([sys.executable, __file__, address], env=self.environment,
                                       stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        # It listens before it imports (a fraction of a second): commands from then on wait for the imports.
        deadline = time.monotonic() + 60
        while not Path(address).exists():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the warm interpreter did not start (exit status {self.server.poll()})")
            time.sleep(0.01)

    def requests(self) -> list[str]:
        """One line per command the stand-in passed on: ``warm <argv>`` or ``plain <argv> (why)``."""
        log = self.folder / REQUESTS_LOG
        return log.read_text().splitlines() if log.exists() else []

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for a command run through the stand-in: the warm interpreter's, which is this process's when
        it started (libraries imported since may have added variables, such as OpenMP's KMP_* settings), and ``extra``
        (a value the warm interpreter does not have makes the command run as a plain ``python``)."""
        return {**self.environment, **extra}

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


# --------------------------------------------------------------------------------------------- the warm interpreter


def _serve(address: str) -> tuple[list[str], str]:
    """Accept requests until one is the runner's own: returns (argv, cwd) in the runner process only."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)  # before the imports: the first commands wait in the backlog instead of running plain
    baseline = dict(os.environ)
    for module in WARM_MODULES:
        __import__(module)
    transformers = sys.modules["transformers"]
    for name in WARM_NAMES:  # transformers' names are lazy: each imports its module on first use
        getattr(transformers, name)

    # What the imports put into the environment (TorchInductor's cache folder), as they would in a fresh process.
    imported = {key: value for key, value in os.environ.items() if key not in baseline}
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return _supervise(connection, baseline, imported, Path(address).with_name(REQUESTS_LOG))
        connection.close()


def _reap(number: int, frame: object) -> None:
    """Wait for every supervisor that ended (their CPU time counts as the warm interpreter's children's)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = connection.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    (length,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < length:
        body += connection.recv(length - len(body))
    return json.loads(body), list(fds)


def _refusal(request: dict, baseline: dict[str, str], imported: dict[str, str]) -> str | None:
    """Why ``python`` might run the request differently from the runner, or None: the runner needs the environment
    the warm interpreter started with (plus what its imports set, such as TorchInductor's cache folder) and no other
    option than -u."""
    argv = request["argv"][1:] if request["argv"][:1] == ["-u"] else request["argv"]
    if not argv or (argv[0].startswith("-") and argv[0] != "-m") or (argv[0] == "-m" and len(argv) < 2):
        return "options"
    env = request["env"]
    differ = sorted(
        key for key in (set(env) | set(baseline)) - READ_AT_RUN_TIME
        if env.get(key) != baseline.get(key) and not (key in imported and env.get(key) == imported[key])
    )  # fmt: skip
    return f"environment: {', '.join(differ)}" if differ else None


def _supervise(
    connection: socket.socket, baseline: dict[str, str], imported: dict[str, str], requests_log: Path
) -> tuple[list[str], str]:
    request, fds = _receive(connection)
    refusal = _refusal(request, baseline, imported)
    with requests_log.open("a") as log:
        print(f"{'plain' if refusal else 'warm'} {' '.join(request['argv'][:4])}{f' ({refusal})' if refusal else ''}",
              file=log)  # fmt: skip
    if refusal:
        connection.sendall(b"-")
        os._exit(0)
    connection.sendall(b"+")
    runner = os.fork()
    if runner == 0:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        connection.close()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**imported, **request["env"]})
        return request["argv"], request["cwd"]
    for fd in fds:
        os.close(fd)
    while True:
        readable, _, _ = select.select([connection], [], [], 0.05)
        if readable:
            message = connection.recv(5)
            if len(message) < 5:  # the stand-in is gone: so is everything it started
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(runner, signal.SIGKILL)
                os._exit(0)
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner, struct.unpack("!i", message[1:])[0])
        pid, status = os.waitpid(runner, os.WNOHANG)
        if pid:
            if os.WIFSIGNALED(status):
                answer = b"K" + struct.pack("!i", os.WTERMSIG(status))
            else:
                answer = b"X" + struct.pack("!i", os.waitstatus_to_exitcode(status))
            with contextlib.suppress(OSError):
                connection.sendall(answer)
            os._exit(0)


def _run(argv: list[str], cwd: str) -> None:
    """In the runner: what ``python [-u] (-m module | script) args`` does after start-up."""
    unbuffered = argv[:1] == ["-u"]
    argv = argv[1:] if unbuffered else argv
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    if unbuffered:
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    for number in (*FORWARDED, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = cwd
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    _run(*_serve(sys.argv[1]))
