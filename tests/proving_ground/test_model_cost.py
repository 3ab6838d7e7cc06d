"""The model-cost benchmark on the real local TorchServe multi-model server (quick sizes, one run per module).

Only memory is asserted on (deterministic enough); timings are checked to be present and positive, never compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from proving_ground.benchmarks import mme_model_cost
from proving_ground.benchmarks.mme_model_cost import QUICK_SIZES, measure, write_results

pytestmark = pytest.mark.slow

SIZE_KEYS = [
    "weights_mib", "archive_mib", "worker_rss_mib", "worker_pss_mib", "worker_uss_mib", "second_worker_uss_mib",
    "add_worker_s", "first_load_s", "reload_s", "unload_s", "warm_latency_ms",
]  # fmt: skip


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One second of saturation: the tests check its numbers are there and positive, never their size (each second
    is both cores' worth of CPU)."""
    return measure(
        tmp_path_factory.mktemp("model-cost"), sizes=QUICK_SIZES, repeats=1, saturation_clients=2, saturation_seconds=1
    )


def test_every_key_is_present_and_positive(result):
    assert result["command"] and result["server"]
    assert result["host"]["cpus"] >= 1 and result["host"]["load_average_before"] >= 0
    assert result["frontend_rss_mib"] > 0
    assert [row["label"] for row in result["sizes"]] == [size.label for size in QUICK_SIZES]
    for row in result["sizes"]:
        assert row["hidden_size"] > 0 and row["layers"] > 0
        for key in SIZE_KEYS:
            assert row[key] > 0, key
        assert isinstance(row["frontend_delta_mib"], float)  # may be ~0 or negative (GC): present, not signed
    for name, slope in (("worker_uss_mib", "per_weights_mib"), ("worker_rss_mib", "per_weights_mib"),
                        ("first_load_s", "per_archive_mib"), ("reload_s", "per_archive_mib")):  # fmt: skip
        assert set(result["fits"][name]) == {"intercept", slope}
    saturated = result["saturated"]
    assert saturated["clients"] == saturated["models"] == 2
    for key in ("seconds", "throughput_rps", "sequential_rps", "parallelism"):
        assert saturated[key] > 0, key
    djl = result["djl_python_worker"]
    assert "adapter" in djl["how"] and "Java frontend is not measured" in djl["how"]
    assert djl["rss_mib"] > 0 and djl["uss_mib"] > 0 and djl["load_s"] > 0
    assert djl["archive_has_torchserve_manifest"] is False  # a DJL archive: DJL 0.36 imports its model.py


def test_a_larger_model_costs_its_worker_at_least_half_its_extra_weights(result):
    small, large = sorted(result["sizes"], key=lambda row: row["weights_mib"])
    extra_weights = large["weights_mib"] - small["weights_mib"]
    assert extra_weights > 10
    assert large["worker_uss_mib"] - small["worker_uss_mib"] >= extra_weights / 2


def test_the_second_worker_is_a_process_of_its_own(result):
    for row in result["sizes"]:
        assert row["second_worker_uss_mib"] > 0


def test_the_server_is_stopped_afterwards(result):
    processes = result["server_processes"]
    assert len(processes) >= 2  # the launcher and the Java frontend at least
    for process in processes:
        try:
            alive = psutil.Process(process["pid"]).create_time() == process["create_time"]
        except psutil.NoSuchProcess:
            alive = False
        assert not alive, f"server process {process['pid']} outlived the run"


def test_write_results_writes_the_json_and_the_table(result, tmp_path: Path):
    write_results(result, tmp_path)
    assert json.loads((tmp_path / "mme_model_cost.json").read_text())["sizes"] == result["sizes"]
    markdown = (tmp_path / "mme_model_cost.md").read_text()
    for row in result["sizes"]:
        assert f"| {row['label']} | {row['hidden_size']} x {row['layers']} |" in markdown
    assert "Java frontend" in markdown and "parallelism" in markdown and "DJL Python worker" in markdown


def test_a_server_process_that_ends_while_the_frontend_is_sought_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker of a model just unloaded can end between the listing of the server's processes and the read of its
    name (a run here failed so, at the first reload): the search goes on without it."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    listed = psutil.Process(ended.pid)
    ended.wait()
    monkeypatch.setattr(mme_model_cost, "_server_processes", lambda server: [listed, psutil.Process()])
    with pytest.raises(RuntimeError, match="found 0"):  # this process is no frontend either
        mme_model_cost._frontend(None)  # type: ignore[arg-type]
