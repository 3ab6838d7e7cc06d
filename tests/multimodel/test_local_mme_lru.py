"""The harness's unloading rule, on a stand-in model server (fast): least recently used first, never a model a request
is using, and a model that is still loading counts against the limit (the rule mme_sizing/simulation.py models)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from inference_assets.local.local_mme import Answer, LocalMultiModelEndpoint, ModelServerError


class StandInServer:
    """LocalModelServer's load, unload and invoke; invokes of a model in ``hold`` wait for ``release``."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.loaded: list[str] = []
        self.calls: list[str] = []
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.entered = threading.Event()

    def load(self, name: str, model_dir: Path, *, workers: int = 1) -> None:
        assert model_dir.is_dir()
        self.loaded.append(name)
        self.calls.append(f"load {name}")

    def unload(self, name: str) -> None:
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
    assert server.calls == ["load a", "load b", "unload b", "load c"]


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
    assert server.calls == ["load a", "unload a", "load b"]
