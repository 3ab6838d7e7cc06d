"""Nodes that start together, or stop in bounded time with one line naming the node that did not come
(training_assets/instance/rendezvous.py): the barrier on its own, then two real torchrun agents (CPU, gloo) started
apart by less and by more than the bound."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.training_assets.warm_python import WarmPython
from training_assets.instance import rendezvous
from training_assets.instance.rendezvous import NodesMissing, barrier, torchrun_rendezvous_arguments

ROOT = Path(__file__).resolve().parents[2]
MODULE = "training_assets.instance.train_sentiment"
TRAIN = ["--epochs", "1", "--per-device-batch-size", "8", "--learning-rate", "5e-3", "--max-seq-length", "32",
         "--use-cpu"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    """Whether a socket of this machine listens on TCP ``port`` (read from /proc/net/tcp*, without connecting to it)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()  # sl, local_address, rem_address, st, ...
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: TCP_LISTEN
                return True
    return False


def _meet(nodes: list[str], starts: dict[str, float], timeout: float, port: int) -> dict[str, object]:
    """Run the barrier for each node in ``starts`` in a thread, each after its delay; node -> result or error."""
    outcome: dict[str, object] = {}

    def node(name: str) -> None:
        time.sleep(starts[name])
        try:
            outcome[name] = barrier(run_id="r-1", nodes=nodes, node=name, host="127.0.0.1", port=port,
                                    timeout=timeout, log=lambda line: None)  # fmt: skip
        except NodesMissing as error:
            outcome[name] = error

    threads = [threading.Thread(target=node, args=(name,)) for name in starts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * timeout + 30)
    return outcome


def test_nodes_that_start_apart_within_the_bound_meet_and_the_skew_is_measured() -> None:
    outcome = _meet(["a", "b", "c"], {"a": 0.0, "b": 0.5, "c": 1.5}, timeout=20, port=_free_port())
    results = [outcome[name] for name in "abc"]
    assert all(isinstance(result, rendezvous.BarrierResult) for result in results), results
    # Every node learns when each started (on the rendezvous node's clock): c about 1.5 s after a.
    for result in results:
        assert isinstance(result, rendezvous.BarrierResult)
        assert result.started["a"] == 0.0 and 1.0 < result.started["c"] <= 2.5
        assert result.skew_seconds == result.started["c"]


def test_a_node_missing_stops_every_node_with_one_line_naming_it() -> None:
    outcome = _meet(["a", "b", "c"], {"a": 0.0, "b": 0.2}, timeout=1, port=_free_port())
    line = "rendezvous: run r-1: node c did not reach the barrier within 1 s (arrived: a, b)"
    assert [str(outcome[name]) for name in "ab"] == [line, line]


def test_a_missing_rendezvous_node_is_named_by_the_node_that_waited_for_it() -> None:
    port = _free_port()
    outcome = _meet(["a", "b"], {"b": 0.0}, timeout=1, port=port)
    assert str(outcome["b"]) == (
        f"rendezvous: run r-1: node a did not reach the barrier within 1 s (the rendezvous node, 127.0.0.1:{port}, "
        "did not answer b)"
    )


def test_a_node_of_another_run_is_refused_and_not_counted() -> None:
    port = _free_port()
    stranger: list[str] = []

    def other_run() -> None:
        time.sleep(0.3)
        try:
            barrier(run_id="r-2", nodes=["a", "b"], node="b", host="127.0.0.1", port=port, timeout=1,
                    log=lambda line: None)  # fmt: skip
        except NodesMissing as error:
            stranger.append(str(error))

    thread = threading.Thread(target=other_run)
    thread.start()
    with pytest.raises(NodesMissing, match=r"^rendezvous: run r-1: node b did not reach the barrier within 2 s"):
        barrier(run_id="r-1", nodes=["a", "b"], node="a", host="127.0.0.1", port=port, timeout=2,
                log=lambda line: None)  # fmt: skip
    thread.join()
    assert stranger and "not a node of this run" in stranger[0]


def test_torchrun_takes_its_timeouts_from_the_one_bound() -> None:
    arguments = torchrun_rendezvous_arguments(nodes=2, endpoint="10.0.1.7:29500", run_id="r-0123", is_host=False,
                                              timeout=600, max_restarts=2)  # fmt: skip
    assert arguments == ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.1.7:29500", "--rdzv_id=r-0123",
                         "--rdzv_conf=join_timeout=600,read_timeout=600,is_host=false", "--max-restarts=2"]  # fmt: skip
    # The keys are the ones torch's c10d rendezvous reads (a misspelt key would be ignored silently).
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.run import _parse_rendezvous_config  # torchrun's own --rdzv_conf parser (private)

    port = _free_port()
    conf = _parse_rendezvous_config("join_timeout=7,read_timeout=9,is_host=true")
    params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "r-1", 1, 1, **conf)
    backend, store = create_backend(params)
    handler = create_handler(store, backend, params)
    assert handler.settings.timeout.join.total_seconds() == 7
    assert store.timeout.total_seconds() == 9  # the TCPStore's read timeout


# --------------------------------------------------------------------------------------- two real torchrun agents


def _agent(python: WarmPython, name: str, *, tmp: Path, model: Path, data: Path, ports: tuple[int, int], timeout: int,
           max_restarts: int = 0) -> subprocess.Popen[str]:  # fmt: skip
    """One node: the rendezvous module in front of torchrun (one CPU process), as launch_training.sh starts it."""
    store, barrier_port = ports
    command = [
        python.executable, "-m", "training_assets.instance.rendezvous", "--nodes", "a,b", "--node", name,
        "--endpoint", f"127.0.0.1:{store}", "--run-id", "r-skew", "--timeout", str(timeout),
        "--max-restarts", str(max_restarts), "--barrier-port", str(barrier_port),
        "--record", str(tmp / "rendezvous.json"),
        "--", "--nproc_per_node=1", "--module", MODULE,
        "--model", str(model), "--dataset", str(data), "--output-dir", str(tmp / f"out-{name}"),
        "--tokenized-dir", str(tmp / f"tokens-{name}"), *TRAIN,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=tmp, env=python.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_two_torchrun_agents_started_apart_within_the_bound_train_together(
    tiny_model_dir: Path, sample_data: Path, tmp_path: Path, warm_python: WarmPython
) -> None:
    ports = (_free_port(), _free_port())
    first = _agent(warm_python, "a", tmp=tmp_path, model=tiny_model_dir, data=sample_data, ports=ports, timeout=60)
    # The second node starts 2 s after the first is at its barrier (its own start, slower under load, not counted):
    # well past nothing, within the 60 s bound.
    while not _listening(ports[1]) and first.poll() is None:
        time.sleep(0.05)
    time.sleep(2)
    second = _agent(warm_python, "b", tmp=tmp_path, model=tiny_model_dir, data=sample_data, ports=ports, timeout=60)
    results = [process.communicate(timeout=600) for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], [err[-3000:] for _, err in results]
    metrics = json.loads((tmp_path / "out-a" / "metrics.json").read_text())
    assert metrics["device"]["world_size"] == 2  # one DDP run over both nodes
    record = json.loads((tmp_path / "rendezvous.json").read_text())
    assert record["nodes"] == ["a", "b"] and record["bound_seconds"] == 60
    assert 1.5 <= record["started_seconds"]["b"] <= 30 and record["skew_seconds"] == record["started_seconds"]["b"]
    assert "rendezvous: run r-skew: all 2 nodes at the barrier" in results[0][1]


@pytest.mark.slow
def test_two_torchrun_agents_started_apart_beyond_the_bound_stop_with_the_line(
    tiny_model_dir: Path, sample_data: Path, tmp_path: Path, warm_python: WarmPython
) -> None:
    ports = (_free_port(), _free_port())
    first = _agent(warm_python, "a", tmp=tmp_path, model=tiny_model_dir, data=sample_data, ports=ports, timeout=1)
    _, first_err = first.communicate(timeout=120)  # the rendezvous node gives up after its bound...
    second = _agent(warm_python, "b", tmp=tmp_path, model=tiny_model_dir, data=sample_data, ports=ports, timeout=1)
    _, second_err = second.communicate(timeout=120)  # ...and the late node after its own
    assert (first.returncode, second.returncode) == (rendezvous.NODES_MISSING, rendezvous.NODES_MISSING)
    assert first_err.strip().splitlines()[-1] == (
        "rendezvous: run r-skew: node b did not reach the barrier within 1 s (arrived: a)"
    )
    assert second_err.strip().splitlines()[-1] == (
        f"rendezvous: run r-skew: node a did not reach the barrier within 1 s (the rendezvous node, "
        f"127.0.0.1:{ports[1]}, did not answer b)"
    )
    assert not (tmp_path / "out-a").exists() and not (tmp_path / "out-b").exists()  # no training started
