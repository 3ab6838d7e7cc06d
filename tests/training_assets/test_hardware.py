"""The hardware checks: which network NCCL chose, and a multi-node run over EFA that fell back to TCP sockets stops."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from training_assets.instance.hardware import TransportError, check_transport, compile_threads, nccl_network
from training_assets.instance.train_sentiment import NcclTransport

# What NCCL 2.2x writes with NCCL_DEBUG=INFO (src/init.cc: INFO(NCCL_INIT, "Using network %s", ...)), shortened.
SOCKETS = """ip-10-0-1-5:4711:4711 [0] NCCL INFO Bootstrap : Using ens32:10.0.1.5<0>
ip-10-0-1-5:4711:4711 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.
ip-10-0-1-5:4711:4711 [0] NCCL INFO NET/Socket : Using [0]ens32:10.0.1.5<0>
ip-10-0-1-5:4711:4711 [0] NCCL INFO Using network Socket
"""
EFA = """ip-10-0-1-5:4711:4711 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)
ip-10-0-1-5:4711:4711 [0] NCCL INFO Using network AWS Libfabric
"""


def _log(folder: Path, text: str) -> str:
    (folder / f"nccl.{socket.gethostname()}.4711.log").write_text(text)
    return str(folder / "nccl.%h.%p.log")  # as NCCL_DEBUG_FILE names it


def test_the_network_comes_from_this_process_nccl_log(tmp_path: Path) -> None:
    assert nccl_network(_log(tmp_path, SOCKETS), socket.gethostname(), 4711) == "Socket"
    assert nccl_network(_log(tmp_path, EFA), socket.gethostname(), 4711) == "AWS Libfabric"
    assert nccl_network(_log(tmp_path, EFA), socket.gethostname(), 1) is None  # another process's log
    assert nccl_network(None, "h", 1) is None


def test_sockets_stop_a_run_that_expected_efa_and_nothing_else() -> None:
    with pytest.raises(TransportError, match="NCCL uses TCP sockets, not EFA"):
        check_transport("Socket", efa_expected=True)
    check_transport("AWS Libfabric", efa_expected=True)
    check_transport("Socket", efa_expected=False)  # a single node, or a run without EFA
    check_transport(None, efa_expected=True)  # no log line (NCCL_DEBUG unset): nothing to judge


def test_the_trainer_callback_reads_the_log_and_stops_on_sockets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr("os.getpid", lambda: 4711)
    state = SimpleNamespace(is_world_process_zero=True)
    monkeypatch.setenv("NCCL_DEBUG_FILE", _log(tmp_path, EFA))
    check = NcclTransport(efa_expected=True)
    check.on_train_begin(None, state, None)
    assert check.network == "AWS Libfabric"
    monkeypatch.setenv("NCCL_DEBUG_FILE", _log(tmp_path, SOCKETS))
    with pytest.raises(TransportError):
        NcclTransport(efa_expected=True).on_train_begin(None, state, None)


def test_compile_threads_share_the_node_cpus_among_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(96)))  # a p4d.24xlarge
    assert (compile_threads(1), compile_threads(8), compile_threads(200)) == (96, 12, 1)
