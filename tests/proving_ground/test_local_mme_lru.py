"""The harness's unloading rule, on a stand-in model server (fast): least recently used first, never a model a request
is using, and a model that is still loading counts against the limit (the rule mme_sizing/simulation.py models)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from proving_ground.torchserve_mme.local_mme import Answer, LocalMultiModelEndpoint, ModelServerError


class StandInServer:
    """LocalModelServer's load, unload and invoke; invokes of a model in ``hold`` wait for ``release``."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.loaded: list[str] = []
        self.calls: list[str] = []
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.entered = threading.Event()
        self.slow_unload: threading.Event | None = None  # when set: unloads wait for it

    def load(self, name: str, model_dir: Path, *, workers: int = 1) -> None:
        assert model_dir.is_dir()
        if name in self.loaded:  # TorchServe answers 409 ConflictStatusException
            raise AssertionError(f"{name} registered twice")
        self.loaded.append(name)
        self.calls.append(f"load {name}")

    def unload(self, name: str) -> None:
        self.calls.append(f"unloading {name}")
        if self.slow_unload is not None:
            assert self.slow_unload.wait(10)
        self.loaded.remove(name)
        self.calls.append(f"unload {name}")

    def invoke(self, name: str, body: bytes, content_type: str = "application/json") -> Answer:
        assert name in self.loaded, f"{name} invoked while not loaded"
        if name in self.hold:
            self.entered.set()
            self.release.wait(10)
        return Answer(200, b"{}", "application/json")


@pytest.fixture
def models_dir(tmp_path: Path, torchserve_archive: Path) -> Path:
    directory = tmp_path / "prefix"
    directory.mkdir()
    for name in ("a", "b", "c"):
        (directory / f"{name}.tar.gz").write_bytes(torchserve_archive.read_bytes())
    return directory


def test_the_least_recently_used_idle_model_is_unloaded(tmp_path: Path, models_dir: Path) -> None:
    server = StandInServer(tmp_path)
    endpoint = LocalMultiModelEndpoint(server, models_dir, max_resident_models=2)
    for name in ("a.tar.gz", "b.tar.gz", "a.tar.gz", "c.tar.gz"):
        endpoint.invoke(name, b"{}")
    assert endpoint.resident() == ["a.tar.gz", "c.tar.gz"]
    assert server.calls == ["load a", "load b", "unloading b", "unload b", "load c"]


def test_a_model_in_use_is_not_unloaded_and_a_full_busy_endpoint_refuses(tmp_path: Path, models_dir: Path) -> None:
    server = StandInServer(tmp_path)
    endpoint = LocalMultiModelEndpoint(server, models_dir, max_resident_models=1)
    endpoint.invoke("a.tar.gz", b"{}")
    server.hold.add("a")
    worker = threading.Thread(target=endpoint.invoke, args=("a.tar.gz", b"{}"))
    worker.start()
    assert server.entered.wait(10)
    try:
        with pytest.raises(ModelServerError, match="resident models are in use"):
            endpoint.invoke("b.tar.gz", b"{}")
        assert endpoint.resident() == ["a.tar.gz"]  # nothing was unloaded
    finally:
        server.release.set()
        worker.join(10)
    endpoint.invoke("b.tar.gz", b"{}")  # a is idle now
    assert server.calls == ["load a", "unloading a", "unload a", "load b"]


def test_a_model_requested_while_it_is_being_unloaded_waits_for_the_unload_before_loading_again(
    tmp_path: Path, models_dir: Path
) -> None:
    server = StandInServer(tmp_path)
    endpoint = LocalMultiModelEndpoint(server, models_dir, max_resident_models=2)
    endpoint.invoke("a.tar.gz", b"{}")
    endpoint.invoke("c.tar.gz", b"{}")
    server.slow_unload = threading.Event()
    loading_b = threading.Thread(target=endpoint.invoke, args=("b.tar.gz", b"{}"))
    loading_b.start()  # unloads a (least recently used), slowly
    while "unloading a" not in server.calls:
        threading.Event().wait(0.01)
    asking_a = threading.Thread(target=endpoint.invoke, args=("a.tar.gz", b"{}"))
    asking_a.start()  # a is no longer resident: it evicts c, then must wait for a's unload (TorchServe: 409)
    threading.Event().wait(0.2)
    server.slow_unload.set()
    loading_b.join(10)
    asking_a.join(10)
    reloaded_a = len(server.calls) - 1 - server.calls[::-1].index("load a")
    assert server.calls.index("unload a") < reloaded_a
    assert sorted(endpoint.resident()) == ["a.tar.gz", "b.tar.gz"]
