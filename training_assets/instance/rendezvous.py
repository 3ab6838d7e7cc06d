"""Start a multi-node torchrun only when every node has arrived, and stop in bounded time with one line that names
the node that did not.

    python -m training_assets.instance.rendezvous --nodes A,B --node B --endpoint HOST:29500 --run-id RUN \\
        --timeout 600 --max-restarts 2 -- --nproc_per_node=8 --module training_assets.instance.train_sentiment ...

Every node runs this with the same ``--nodes`` (the rendezvous node first: it hosts the barrier and torchrun's
c10d store, at ``HOST``) and its own ``--node``. The nodes first meet at a barrier on ``HOST:--barrier-port``; once
all have arrived, each starts torchrun at once, so torchrun's own rendezvous only has to absorb the seconds between
them. ``--timeout`` is the one bound both are set from:

* the barrier: the rendezvous node waits at most ``--timeout`` seconds for the others, a node waits at most that long
  to reach the rendezvous node, then at most that long again for its verdict. Whoever gives up prints
  ``rendezvous: run RUN: node X did not reach the barrier within S s (...)`` and exits with status 3, and the nodes
  that did arrive are told the same line and exit the same way. The rendezvous node reports how far apart the nodes
  started (the skew) when they all arrive, and ``--record FILE`` keeps it as JSON.
* torchrun's c10d rendezvous (``--rdzv_conf``; torch/distributed/elastic/rendezvous of PyTorch 2.13):
  ``join_timeout`` is how long a rendezvous may take to complete (dynamic_rendezvous.py ``create_handler``, default
  600 s), ``read_timeout`` how long a node waits to reach the c10d store (c10d_rendezvous_backend.py
  ``_create_tcp_store``, default 60 s: a node later than that behind the store's node gave up while the store's node
  waited out its 600 s), and ``is_host`` says which node hosts the store instead of guessing it from the host name.
  Both timeouts take the bound, so a rendezvous after a restart (``--max-restarts``: torchrun restarts every worker
  of every node after a worker fails, and the nodes meet again) ends within the bound too: a node that is gone is
  not waited for longer.

The barrier is plain TCP and standard library only: it runs before any framework is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BARRIER_PORT = 29400
# Exit status of a run whose nodes did not meet (torchrun itself exits 1 for a failed worker).
NODES_MISSING = 3
# Seconds between attempts to reach the rendezvous node while it is not listening yet.
RETRY_SECONDS = 0.5
# Extra seconds a node waits for the verdict beyond the bound: the rendezvous node decides at most the bound after it
# started listening, which was before this node reached it.
VERDICT_MARGIN_SECONDS = 10.0


class NodesMissing(RuntimeError):
    """The nodes did not all meet within the bound; the message is the one line to print."""


def missing_line(run_id: str, missing: Sequence[str], timeout: float, detail: str) -> str:
    """The one line a run whose nodes did not meet stops with, on every node that says it."""
    nodes = f"node {missing[0]}" if len(missing) == 1 else f"nodes {', '.join(missing)}"
    return f"rendezvous: run {run_id}: {nodes} did not reach the barrier within {timeout:g} s ({detail})"


def torchrun_rendezvous_arguments(*, nodes: int, endpoint: str, run_id: str, is_host: bool, timeout: int,
                                  max_restarts: int) -> list[str]:  # fmt: skip
    """torchrun's flags for a c10d rendezvous of ``nodes`` nodes bounded by ``timeout`` seconds (module docstring)."""
    conf = f"join_timeout={timeout},read_timeout={timeout},is_host={str(is_host).lower()}"
    return [f"--nnodes={nodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}",
            f"--rdzv_conf={conf}", f"--max-restarts={max_restarts}"]  # fmt: skip


@dataclass
class Arrival:
    node: str
    connection: socket.socket | None  # None for the rendezvous node itself
    started: float  # when the node started waiting, on the rendezvous node's clock (seconds after its own start)


@dataclass
class BarrierResult:
    run_id: str
    nodes: list[str]
    started: dict[str, float] = field(default_factory=dict)  # node -> start, seconds after the earliest

    @property
    def skew_seconds(self) -> float:
        return max(self.started.values()) - min(self.started.values()) if self.started else 0.0

    def record(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "nodes": self.nodes, "started_seconds": self.started,
                "skew_seconds": round(self.skew_seconds, 3)}  # fmt: skip


def _send(connection: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a node that went away learns nothing; it stops on its own bound
        connection.sendall((json.dumps(message) + "\n").encode())


def _read_line(connection: socket.socket, deadline: float) -> dict[str, Any] | None:
    """One JSON line from ``connection`` before ``deadline`` (monotonic); None when it closed or said nothing."""
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        connection.settimeout(remaining)
        try:
            chunk = connection.recv(4096)
        except (TimeoutError, OSError):
            return None
        if not chunk:
            return None
        data += chunk
    try:
        message = json.loads(data)
    except json.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None


def host_barrier(*, run_id: str, nodes: Sequence[str], timeout: float, port: int,
                 log: Callable[[str], None]) -> BarrierResult:  # fmt: skip
    """On the rendezvous node (``nodes[0]``): wait for every other node, at most ``timeout`` seconds."""
    start = time.monotonic()
    deadline = start + timeout
    me, others = nodes[0], set(nodes[1:])
    arrivals: dict[str, Arrival] = {me: Arrival(me, None, 0.0)}
    with socket.create_server(("", port), backlog=len(nodes) + 8) as server:
        while others - arrivals.keys():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            server.settimeout(remaining)
            try:
                connection, _ = server.accept()
            except TimeoutError:
                break
            hello = _read_line(connection, min(deadline, time.monotonic() + 10))
            node = hello.get("node") if hello else None
            if not hello or hello.get("run_id") != run_id or node not in others:
                _send(connection, {"go": False, "line": f"rendezvous: run {run_id}: refused {hello!r}: "
                                   f"not a node of this run ({', '.join(nodes)})"})  # fmt: skip
                connection.close()
                continue
            if node in arrivals and arrivals[node].connection is not None:  # the node came back: keep the new one
                arrivals[node].connection.close()  # type: ignore[union-attr]
            waited = float(hello.get("waited_seconds", 0.0))
            arrivals[node] = Arrival(node, connection, time.monotonic() - start - waited)
        missing = [node for node in nodes if node not in arrivals]
        arrived = [node for node in nodes if node in arrivals]
        if missing:
            line = missing_line(run_id, missing, timeout, f"arrived: {', '.join(arrived)}")
            for arrival in arrivals.values():
                if arrival.connection is not None:
                    _send(arrival.connection, {"go": False, "line": line})
                    arrival.connection.close()
            raise NodesMissing(line)
        earliest = min(arrival.started for arrival in arrivals.values())
        result = BarrierResult(run_id, list(nodes),
                               {node: round(arrivals[node].started - earliest, 3) for node in nodes})  # fmt: skip
        for arrival in arrivals.values():
            if arrival.connection is not None:
                _send(arrival.connection, {"go": True, **result.record()})
                arrival.connection.close()
    last = max(result.started, key=result.started.__getitem__)
    log(f"rendezvous: run {run_id}: all {len(nodes)} nodes at the barrier; they started {result.skew_seconds:.1f} s "
        f"apart ({last} last), within the bound of {timeout:g} s")  # fmt: skip
    return result


def join_barrier(*, run_id: str, nodes: Sequence[str], node: str, host: str, port: int, timeout: float,
                 log: Callable[[str], None]) -> BarrierResult:  # fmt: skip
    """On every other node: reach the rendezvous node within ``timeout`` seconds, then wait for its verdict."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NodesMissing(missing_line(run_id, [nodes[0]], timeout,
                                            f"the rendezvous node, {host}:{port}, did not answer {node}"))  # fmt: skip
        try:
            connection = socket.create_connection((host, port), timeout=min(remaining, 5.0))
        except OSError:  # not listening yet (or gone): try again until the bound
            time.sleep(min(RETRY_SECONDS, max(0.0, deadline - time.monotonic())))
            continue
        with connection:
            _send(connection, {"run_id": run_id, "node": node, "waited_seconds": time.monotonic() - start})
            verdict = _read_line(connection, time.monotonic() + timeout + VERDICT_MARGIN_SECONDS)
        if verdict is None:  # the rendezvous node went away before deciding: try to reach it again
            continue
        if not verdict.get("go"):
            raise NodesMissing(str(verdict.get("line")))
        result = BarrierResult(run_id, list(nodes), dict(verdict.get("started_seconds", {})))
        log(f"rendezvous: run {run_id}: all {len(nodes)} nodes at the barrier (skew {result.skew_seconds:.1f} s)")
        return result


def barrier(*, run_id: str, nodes: Sequence[str], node: str, host: str, port: int = BARRIER_PORT, timeout: float,
            log: Callable[[str], None] = print) -> BarrierResult:  # fmt: skip
    """Meet the other nodes of ``run_id``; :class:`NodesMissing` when they do not all arrive within the bound."""
    if node not in nodes:
        raise ValueError(f"--node {node} is not one of --nodes {', '.join(nodes)}")
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"--nodes names a node twice: {', '.join(nodes)}")
    if node == nodes[0]:
        return host_barrier(run_id=run_id, nodes=nodes, timeout=timeout, port=port, log=log)
    return join_barrier(run_id=run_id, nodes=nodes, node=node, host=host, port=port, timeout=timeout, log=log)


# ------------------------------------------------------------------------------------------------------------ CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", required=True, help="every node of the run, comma-separated, the rendezvous node "
                        "first (on EC2: instance-id@private-ip, in private-IP order)")  # fmt: skip
    parser.add_argument("--node", required=True, help="this node, as --nodes names it")
    parser.add_argument("--endpoint", required=True, help="HOST:PORT of torchrun's c10d store (the rendezvous node)")
    parser.add_argument("--run-id", required=True, help="the run's id, shared by its nodes")
    parser.add_argument("--timeout", type=int, required=True, help="seconds: the bound of the barrier and of "
                        "torchrun's rendezvous")  # fmt: skip
    parser.add_argument("--max-restarts", type=int, default=0, help="torchrun --max-restarts (worker restarts)")
    parser.add_argument("--barrier-port", type=int, default=BARRIER_PORT)
    parser.add_argument("--record", type=Path, help="write the barrier's arrivals and skew here as JSON")
    parser.add_argument("--torchrun", default="torchrun", help="the torchrun command line (default: torchrun)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Barrier, then exec torchrun with the rendezvous flags and the arguments after ``--``."""
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = _parser().parse_args(argv[:split])
    nodes = [name.strip() for name in args.nodes.split(",") if name.strip()]
    host = args.endpoint.rpartition(":")[0]
    if args.timeout < 1 or args.max_restarts < 0:
        print("rendezvous: error: --timeout must be at least 1 and --max-restarts at least 0", file=sys.stderr)
        return 2
    try:
        result = barrier(run_id=args.run_id, nodes=nodes, node=args.node, host=host, port=args.barrier_port,
                         timeout=args.timeout, log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    except NodesMissing as error:
        print(error, file=sys.stderr, flush=True)
        return NODES_MISSING
    except ValueError as error:
        print(f"rendezvous: error: {error}", file=sys.stderr)
        return 2
    if args.record and args.node == nodes[0]:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps({**result.record(), "bound_seconds": args.timeout}, indent=2) + "\n")
    command = [*shlex.split(args.torchrun), *torchrun_rendezvous_arguments(
        nodes=len(nodes), endpoint=args.endpoint, run_id=args.run_id, is_host=args.node == nodes[0],
        timeout=args.timeout, max_restarts=args.max_restarts), *argv[split + 1 :]]  # fmt: skip
    sys.stdout.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
