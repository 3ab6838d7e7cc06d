"""``kill -INT <pid>`` and ``kill <pid>`` on a local harness stop its model server (Ray Serve for the single-model
harness, TorchServe for the multi-model one): nothing keeps serving.

Each harness runs as its command (``python -m inference_assets.local.<name>``) in its own session, started the way
a shell script's background job (``pytorch-platform serve ... &``) or a supervisor starts it: with SIGINT ignored,
which is what POSIX shells without job control do to asynchronous commands. The test waits for its "serving" line,
sends the signal to the harness's own pid (not to its group, as a terminal's Ctrl-C would) and checks that the
process exits, the port stops answering and no process of the harness's process tree is left
(tests/inference_assets/harness_processes.py). The Ray Serve harness's cases are test_ray_server.py's: both of its
servers are this harness's command, and each is stopped that way, one with SIGTERM, one with SIGINT (a Ray Serve
start costs ~12 CPU-seconds, so the servers that test the serving are the ones stopped).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.inference_assets.harness_processes import start_harness, stop_and_check

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_local_mme_stops_its_torchserve(tmp_path: Path, sig: signal.Signals) -> None:
    process, match = start_harness(
        ["proving_ground.torchserve_mme.local_mme", "--work-dir", str(tmp_path / "mme")],
        re.compile(r"inference http://127\.0\.0\.1:(\d+) .*\n.*\n.*invoke"),
        tmp_path / "harness.out",
    )
    stop_and_check(process, int(match[1]), sig, "org.pytorch.serve.ModelServer")
