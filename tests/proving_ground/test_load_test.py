"""The Locust traffic patterns and the runner's measurements, against an in-process fake endpoint.

Locust monkey-patches the interpreter with gevent on import, so these run in a child Python process, one for the
module: it imports Locust once, then forks one process per job, all at once, so the module takes about as long as its
longest window, not the sum of them (the windows mostly wait on the fake endpoint's sleeps).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Every run of the module in one child process (each process imports Locust and gevent: ~0.5 CPU-s), which forks one
# process per job (the fake endpoint and its counters are module globals: one window per process), all started at
# once: the jobs come as JSON on stdin, each answered with one JSON line: a measured row, or what the runner's command
# line said. A forked job writes its line to a file of its own (a long line written to a shared pipe could interleave
# with another's); the parent prints them once every job has ended.
SCRIPT = textwrap.dedent(
    """
    import collections, contextlib, io, json, os, sys, tempfile, time, traceback
    import gevent
    from proving_ground.benchmarks import mme_load_test, mme_locustfile
    from proving_ground.benchmarks.mme_locustfile import InvokeError

    def measure(pattern, fail, window):
        calls, seen = collections.Counter(), set()
        def fake(model):
            calls[model] += 1
            if fail and calls[model] % 5 == 0:
                raise InvokeError(model + " answered 500")
            cold = model not in seen
            seen.add(model)
            gevent.sleep(0.05 if cold else 0.002)
            return cold, 42

        mme_locustfile.models, mme_locustfile.target = 40, fake
        args = mme_load_test.parse_arguments(["--models", "40", "--users", "4", "--spawn-rate", "4", "--warmup", "0",
                                              *window])
        row = mme_load_test.run_pattern(pattern, args)
        total = sum(calls.values())
        row["share_model_0"] = calls[mme_locustfile.model_name(0)] / total
        row["share_top_10"] = sum(calls[mme_locustfile.model_name(i)] for i in range(10)) / total
        row["calls"] = total
        return row

    def command(argv):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                code = mme_load_test.main(argv)
            except SystemExit as exit_:
                code = exit_.code
        return {"code": code, "stderr": stderr.getvalue()}

    def run(job):
        answer = command(job["argv"]) if "argv" in job else measure(job["pattern"], job["fail"], job["window"])
        return json.dumps({"id": job["id"], **answer})

    jobs, failed = json.load(sys.stdin), []
    with tempfile.TemporaryDirectory() as answers:
        children = {}
        for index, job in enumerate(jobs):
            path = os.path.join(answers, str(index))
            pid = os.fork()  # gevent's fork: the child gets a fresh hub, random reseeds itself
            if pid == 0:
                code = 1
                try:
                    line = run(job)
                    with open(path, "w") as stream:
                        stream.write(line + "\\n")
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stderr.flush()
                    os._exit(code)  # no atexit handlers nor the parent's buffers in a forked child
            children[pid] = job["id"]
        for pid, job_id in children.items():
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                failed.append(job_id)
        for index in range(len(jobs)):
            with contextlib.suppress(FileNotFoundError), open(os.path.join(answers, str(index))) as stream:
                print(stream.read(), end="", flush=True)
    sys.exit(f"jobs failed: {failed}" if failed else 0)
    """
)
WINDOW = ("--duration", "3", "--max-requests", "100000")
PATTERNS = [("uniform", (0.0, 0.08), (0.15, 0.35)), ("hot-model", (0.85, 0.95), (0.85, 0.97)),
            ("top-10", (0.05, 0.15), (0.84, 0.94))]  # fmt: skip
REFUSED = [
    (["--models", "8"], "must exceed 10"),
    (["--models", "12", "--max-resident-models", "12"], "below --models"),
    (["--patterns", "hot-model"], "must include uniform"),
    (["--duration", "15", "--batch-seconds", "10"], "must hold at least two batches"),
]
JOBS = [
    *({"id": pattern, "pattern": pattern, "fail": False, "window": WINDOW} for pattern, _, _ in PATTERNS),
    {"id": "failing", "pattern": "uniform", "fail": True, "window": WINDOW},
    {"id": "precise", "pattern": "hot-model", "fail": False,
     "window": ("--duration", "60", "--batch-seconds", "0.5", "--precision", "0.5", "--max-requests", "100000")},
    {"id": "request-budget", "pattern": "uniform", "fail": False,
     "window": ("--duration", "60", "--batch-seconds", "0.5", "--precision", "0", "--max-requests", "100")},
    *({"id": " ".join(argv), "argv": argv} for argv, _ in REFUSED),
]  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """Every job's answer, by id."""
    # A session of its own: should the run hang, its forked jobs are killed with it.
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=ROOT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = child.communicate(json.dumps(JOBS), timeout=300)
    except BaseException:  # a timeout or an interrupt: the child is not reaped yet, so its group id is still its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    assert child.returncode == 0, stderr[-2000:]
    answers = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"id": ')]
    return {answer.pop("id"): answer for answer in answers}


@pytest.mark.parametrize(("pattern", "share_0", "share_top_10"), PATTERNS)
def test_patterns_split_traffic_like_the_seed(runs, pattern, share_0, share_top_10):
    row = runs[pattern]
    assert row["requests_total"] == row["calls"] > row["requests"] > 200 and row["errors"] == 0
    assert share_0[0] <= row["share_model_0"] <= share_0[1]
    assert share_top_10[0] <= row["share_top_10"] <= share_top_10[1]
    assert row["tps"] > 0 and row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
    # The window counts the requests that completed in it: the first uses of models (cold) included.
    assert row["cold_requests"] > 0 and row["cold_p50_ms"] > row["warm_p50_ms"]
    assert row["model_loads"] == row["cold_requests"] and row["batches"] == 3 and row["window_s"] == 3
    answered = row["requests"] - row["errors"]
    # Hits over answered requests, computed as such: 1 - loads / answered can differ in the last bit (4408 / 4448 is
    # 0.9910071942446043, 1 - 40 / 4448 is 0.9910071942446044, and a run failed on that).
    assert row["hit_ratio"] == (answered - row["model_loads"]) / answered
    assert row["tps_interval"]["low"] < row["tps"] < row["tps_interval"]["high"]
    assert row["hit_ratio_interval"]["low"] < row["hit_ratio"] < row["hit_ratio_interval"]["high"]
    assert row["stopped"] == "time budget spent" and not row["conclusive"]  # three 1 s batches: fewer than five


def test_failed_requests_are_counted_as_errors(runs):
    row = runs["failing"]
    assert row["errors"] > 0 and row["requests_total"] == row["calls"]
    assert "answered 500" in row["error_examples"][0]


def test_a_window_stops_once_its_intervals_are_narrow_enough(runs):
    row = runs["precise"]
    assert row["stopped"] == "precise" and row["conclusive"]
    assert 5 <= row["batches"] < 120  # at least the five batches a window needs, long before its 60 s budget
    for interval in (row["tps_interval"], row["hit_ratio_interval"]):
        assert interval["high"] - interval["low"] <= interval["estimate"]  # half-width at most 50%


def test_a_window_stops_when_its_request_budget_is_spent(runs):
    row = runs["request-budget"]
    assert row["stopped"] == "request budget spent" and not row["conclusive"]
    assert row["requests"] >= 100 and row["window_s"] < 60


def test_runner_refuses_settings_without_cold_loads_or_baseline(runs):
    for argv, message in REFUSED:
        answer = runs[" ".join(argv)]
        assert answer["code"] == 2 and message in answer["stderr"], answer["stderr"]
