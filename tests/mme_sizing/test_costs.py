"""Where the fleet model's numbers come from: EC2's instance facts (as moto ships them) and the measured costs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import moto
import pytest

from mme_sizing import costs

MEASURED = {
    "frontend_rss_mib": 100.0,
    "sizes": [{"unload_s": 0.01}, {"unload_s": 0.03}],
    "fits": {
        "worker_uss_mib": {"intercept": 300.0, "per_weights_mib": 1.0},
        "first_load_s": {"intercept": 3.5, "per_archive_mib": 0.002},
        "reload_s": {"intercept": 3.0, "per_archive_mib": 0.001},
    },
}


def test_every_instance_type_matches_ec2s_describe_instance_types_data() -> None:
    with gzip.open(Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz") as stream:
        shipped = json.load(stream)
    ours = json.loads(costs.INSTANCE_TYPES_FILE.read_text())["types"]
    assert {"ml.c5d.18xlarge", "ml.c5.2xlarge", "ml.c5.9xlarge", "ml.c7g.4xlarge"} <= ours.keys()
    for name, facts in ours.items():
        ec2 = shipped[name.removeprefix("ml.")]
        assert facts == {"vcpus": ec2["VCpuInfo"]["DefaultVCpus"], "memory_mib": ec2["MemoryInfo"]["SizeInMiB"]}, name


def test_an_unknown_instance_type_is_refused_with_the_file_to_extend() -> None:
    with pytest.raises(ValueError, match=r"no vCPU and memory facts for 'ml\.x9\.large' in instance_types\.json"):
        costs.instance_type("ml.x9.large")


def test_model_cost_holds_the_weights_once_and_the_runtime_per_worker() -> None:
    cost = costs.model_cost(weights_mib=500, warm_latency_ms=80, download_mib_per_second=100, measured=MEASURED)
    assert cost.model_memory_mib == 500 and cost.worker_memory_mib == 300
    assert cost.footprint_mib(3) == 500 + 3 * 300
    assert cost.load_s == pytest.approx(3.0 + 0.5)  # the reload fit at 500 MiB
    assert cost.download_s == pytest.approx(5.0 + (4.5 - 3.5))  # 500 MiB at 100 MiB/s, plus unpacking
    assert cost.service_s == pytest.approx(0.08) and cost.unload_s == pytest.approx(0.02)


def test_a_fleet_plans_with_the_memory_below_the_alarm_less_the_frontend() -> None:
    fleet = costs.fleet("ml.c5d.18xlarge", 4, "djl", measured=MEASURED)
    assert (fleet.instances, fleet.vcpus) == (4, 72)
    assert fleet.memory_mib == pytest.approx(147456 * costs.MEMORY_PLANNING_SHARE - 100)


def test_the_committed_measurement_has_what_the_model_reads() -> None:
    measured = costs.measured_costs()
    cost = costs.model_cost(weights_mib=476, warm_latency_ms=100, download_mib_per_second=100, measured=measured)
    assert cost.worker_memory_mib > 0 and cost.model_memory_mib > 0 and cost.load_s > 0
