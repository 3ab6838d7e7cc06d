"""What one model costs on the local multi-model server: memory per worker, load / reload / unload time, throughput.

Runs the real TorchServe 0.12 + SageMaker PyTorch toolkit in multi-model mode (``LocalModelServer``) and, for tiny
RoBERTa models of several sizes, measures the Java frontend's RSS, each loaded model's worker process (RSS, PSS,
USS from psutil), the cost of a second worker, first load (unpack + register), reload (register only), unload and
warm latency; then the saturated throughput of K models on K closed-loop clients, and least-squares fits of memory
against weights and of load time against archive size. Finally the DJL adapter's memory and load time in one bare
Python process, as a DJL Python-engine worker loads it (DJL's Java frontend cannot run here and is not measured).

    python -m proving_ground.benchmarks.mme_model_cost            # default sizes (~1 to ~110 MiB of weights), 3 repeats
    python -m proving_ground.benchmarks.mme_model_cost --quick    # two small sizes, 1 repeat, 3 s saturation
    python -m proving_ground.benchmarks.mme_model_cost --record-from \\
        proving_ground/benchmarks/results/mme_model_cost.json

Writes ``<output-dir>/mme_model_cost.json`` and ``mme_model_cost.md``. The sizing model does not read them: a
measurement becomes the sizing's input only when it is recorded (``--record-from``: no measurement, it writes
``mme_sizing/measured_costs.json`` from a results file, with the command, date, machine and file it came from).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from mme_sizing import costs
from proving_ground.benchmarks.mme_request import CONTENT_TYPE, REQUEST_BODY
from proving_ground.torchserve_mme.local_mme import LocalModelServer, ModelServerError

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
WARM_REQUESTS = 20
FRONTEND_SETTLE_S = 2.0  # the Java frontend's RSS is measured this long after it answers its first ping
# A git directory of deepjavalibrary/djl-serving (a clone or a bare mirror) to export the real djl_python from; without
# one the DJL row runs the adapter on the tests' stand-in for djl_python (and says so).
DJL_MIRROR = Path(os.environ.get("DJL_SERVING_GIT_DIR", "/work/.mirror/deepjavalibrary+djl-serving/repo"))
DJL_TAG = "v0.36.0"
DJL_PACKAGE = "engines/python/setup/djl_python"
FAKE_DJL = ROOT / "tests" / "inference_assets" / "multimodel" / "fake_djl_python.py"


@dataclass(frozen=True)
class ModelSize:
    label: str
    hidden_size: int
    layers: int
    heads: int
    intermediate_size: int


DEFAULT_SIZES = (
    ModelSize("xs", 128, 2, 4, 512),  # ~2 MiB of weights
    ModelSize("s", 256, 4, 4, 1024),  # ~12 MiB
    ModelSize("m", 512, 4, 8, 2048),  # ~48 MiB
    ModelSize("l", 768, 4, 12, 3072),  # ~110 MiB
)
QUICK_SIZES = (DEFAULT_SIZES[0], DEFAULT_SIZES[2])


# --- processes ------------------------------------------------------------------------------------------------------


def _launcher(server: LocalModelServer) -> psutil.Process:
    return psutil.Process(server.process_group)  # the launcher leads the server's process group


def _server_processes(server: LocalModelServer) -> list[psutil.Process]:
    launcher = _launcher(server)
    return [launcher, *launcher.children(recursive=True)]


def _frontend(server: LocalModelServer) -> psutil.Process:
    javas = [p for p in _server_processes(server) if _name(p) == "java"]
    if len(javas) != 1:
        raise RuntimeError(f"expected one Java frontend under the launcher, found {len(javas)}")
    return javas[0]


def _workers(server: LocalModelServer) -> dict[int, psutil.Process]:
    return {p.pid: p for p in _server_processes(server) if any("model_service_worker" in a for a in _cmdline(p))}


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def _name(process: psutil.Process) -> str:
    """The process's name, or "" once it has ended: a worker of a model just unloaded may end between the listing of
    the server's processes and this read."""
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""


def _memory(process: psutil.Process) -> dict[str, float]:
    info = process.memory_full_info()
    return {"rss": info.rss / MIB, "pss": getattr(info, "pss", 0.0) / MIB, "uss": info.uss / MIB}


def _new_worker(server: LocalModelServer, before: set[int]) -> psutil.Process:
    new = [p for pid, p in _workers(server).items() if pid not in before]
    if len(new) != 1:
        raise RuntimeError(f"expected one new worker process, found {len(new)}")
    return new[0]


# --- server calls ---------------------------------------------------------------------------------------------------


def timed(call: Callable[[], object]) -> float:
    """Seconds ``call`` takes."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _unpack(archive: Path, target: Path) -> Path:
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target


def _scale(server: LocalModelServer, name: str, workers: int) -> None:
    params: dict[str, str | int] = {"min_worker": workers, "max_worker": workers, "synchronous": "true"}
    answer = requests.put(
        f"{server.management_url}/models/{name}",
        params=params,
        timeout=server.startup_timeout_s,
    )
    if answer.status_code != 200:
        raise ModelServerError(f"scaling {name} failed with {answer.status_code}: {answer.text.strip()}")


def _invoke_ok(server: LocalModelServer, name: str) -> None:
    answer = server.invoke(name, REQUEST_BODY, CONTENT_TYPE)
    if answer.status != 200:
        raise ModelServerError(f"{name} answered {answer.status}: {answer.body[:200]!r}")


def _warm_latency_ms(server: LocalModelServer, name: str) -> float:
    _invoke_ok(server, name)  # the first request of a worker is not a warm one
    times = []
    for _ in range(WARM_REQUESTS):
        times.append(timed(lambda: _invoke_ok(server, name)) * 1000)
    return statistics.median(times)


# --- one size -------------------------------------------------------------------------------------------------------


def _build(size: ModelSize, work: Path) -> tuple[Path, float, float]:
    from proving_ground.torchserve_mme.archive import build_archive
    from training_assets.tiny_model import build_tiny_model

    model_dir = build_tiny_model(
        work / f"model-{size.label}",
        hidden_size=size.hidden_size,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=size.intermediate_size,
    )
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    archive = build_archive(model_dir, work / f"{size.label}.tar.gz")  # the local harness's TorchServe archive
    return archive, weights / MIB, archive.stat().st_size / MIB


# Long: one model size measured step after step (load, first worker, second worker, warm latency, unload) on the same
# server
def _measure_size(
    server: LocalModelServer,
    size: ModelSize,
    built: tuple[Path, float, float],
    work: Path,
    repeats: int,
    *,
    keep_loaded: bool = False,
) -> dict[str, Any]:
    """One row, of ``size`` as _build built it; ``keep_loaded``: the model stays loaded afterwards, back to one
    worker, as the first of the saturation's models (each model loaded starts a worker process that imports torch and
    the model)."""
    archive, weights_mib, archive_mib = built
    name = f"cost-{size.label}"
    unpacked = work / "unpacked" / name
    first, reload, unload = [], [], []
    for _ in range(repeats):  # first load: the archive unpacked, then registered
        first.append(timed(lambda: server.load(name, _unpack(archive, unpacked))))
        unload.append(timed(lambda: server.unload(name)))
    frontend = _frontend(server)
    for attempt in range(repeats):  # reload: already unpacked on local disk, registered again
        if attempt:
            unload.append(timed(lambda: server.unload(name)))
        workers_before = set(_workers(server))
        frontend_before = _memory(frontend)["rss"]
        reload.append(timed(lambda: server.load(name, unpacked)))
    # The last reload's worker is the model in service measured below (a load of its own would start one more
    # worker process, importing torch and the model again, for the same numbers).
    worker = _new_worker(server, workers_before)
    latency_ms = _warm_latency_ms(server, name)
    worker_memory = _memory(worker)  # after it served requests, as a model in service
    frontend_delta = _memory(frontend)["rss"] - frontend_before

    workers_one = set(_workers(server))
    add_worker_s = timed(lambda: _scale(server, name, 2))
    second = _new_worker(server, workers_one)
    for _ in range(4):  # give the second worker requests too (TorchServe spreads them over idle workers)
        _invoke_ok(server, name)
    second_memory = _memory(second)
    first_with_two = _memory(worker)
    if keep_loaded:
        _scale(server, name, 1)
    else:
        server.unload(name)
        shutil.rmtree(unpacked, ignore_errors=True)
    row = {
        "label": size.label,
        "hidden_size": size.hidden_size,
        "layers": size.layers,
        "intermediate_size": size.intermediate_size,
        "weights_mib": weights_mib,
        "archive_mib": archive_mib,
        "worker_rss_mib": worker_memory["rss"],
        "worker_pss_mib": worker_memory["pss"],
        "worker_uss_mib": worker_memory["uss"],
        "frontend_delta_mib": frontend_delta,
        "second_worker_uss_mib": second_memory["uss"],
        "second_worker_rss_mib": second_memory["rss"],
        "first_worker_uss_with_two_mib": first_with_two["uss"],
        "add_worker_s": add_worker_s,
        "first_load_s": statistics.median(first),
        "reload_s": statistics.median(reload),
        "unload_s": statistics.median(unload),
        "warm_latency_ms": latency_ms,
    }
    print(
        f"{size.label}: weights {weights_mib:.1f} MiB, worker USS {worker_memory['uss']:.0f} MiB "
        f"(RSS {worker_memory['rss']:.0f}), second worker USS {second_memory['uss']:.0f} MiB, "
        f"first load {row['first_load_s']:.2f} s, reload {row['reload_s']:.2f} s, warm {latency_ms:.1f} ms",
        flush=True,
    )
    return row


# --- saturation -----------------------------------------------------------------------------------------------------


def _saturate(
    server: LocalModelServer, archive: Path, work: Path, clients: int, seconds: float, loaded: str
) -> dict[str, Any]:
    """K models, K closed-loop clients (one model each), ``seconds`` long: completed requests per second. The first
    model is ``loaded`` (the archive's, with one worker), the others are loaded here."""
    names = [loaded, *(f"sat-{index}" for index in range(1, clients))]
    for name in names[1:]:
        server.load(name, _unpack(archive, work / "unpacked" / name))
    for name in names:
        _invoke_ok(server, name)
    counts = [0] * clients
    errors: list[str] = []
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(index: int) -> None:
        url = f"{server.inference_url}/models/{names[index]}/invoke"
        with requests.Session() as session:
            start.wait()
            while time.perf_counter() < deadline[0]:
                answer = session.post(url, data=REQUEST_BODY, headers={"Content-Type": CONTENT_TYPE}, timeout=60)
                if answer.status_code == 200:
                    counts[index] += 1
                else:
                    errors.append(f"{answer.status_code}")

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    started = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started  # the requests in flight at the deadline finished inside it
    for name in names:
        server.unload(name)
    return {
        "clients": clients,
        "models": clients,
        "seconds": elapsed,
        "requests": sum(counts),
        "errors": len(errors),
        "throughput_rps": sum(counts) / elapsed,
    }


# --- DJL Python worker ----------------------------------------------------------------------------------------------

# Run in a fresh interpreter: argv = model_dir, directory holding djl_python (real export or the stand-in's dir).
# The real worker (djl_python/service_loader.py of v0.36.0, the "<entry_point>.py" branch) imports the entry point
# with spec_from_file_location and calls handle(); the first call is the load call with the properties.
_DJL_WORKER = r"""
import json, os, sys, time, importlib.util
started = time.perf_counter()
model_dir, djl_path, how = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, djl_path)
if how == "fake":
    import fake_djl_python
    sys.modules["djl_python"] = fake_djl_python.module()
import djl_python
from djl_python import Input
props = {}
for line in open(os.path.join(model_dir, "serving.properties")):
    line = line.strip()
    if line and not line.startswith("#") and "=" in line:
        key, value = line.split("=", 1)
        props[key.strip().removeprefix("option.")] = value.strip()
props["model_dir"] = model_dir
spec = importlib.util.spec_from_file_location("model_djl_cost", os.path.join(model_dir, "model.py"))
module = importlib.util.module_from_spec(spec)
sys.modules["model_djl_cost"] = module
spec.loader.exec_module(module)
load = Input()
load.properties.update(props)
assert module.handle(load) is None
load_s = time.perf_counter() - started
request = Input()
request.properties.update({"Content-Type": "application/json"})
body = json.dumps({"inputs": ["the delivery was quick and the staff were lovely"]}).encode()
if how == "fake":
    request.content.append(("data", body))
else:
    request.content.add(key="data", value=body)
output = module.handle(request)
assert output.code == 200, output.code
import psutil
info = psutil.Process().memory_full_info()
print(json.dumps({"load_s": load_s, "rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20,
                  "djl_python_file": getattr(djl_python, "__file__", None) or "stand-in"}))
"""


def _export_real_djl_python(target: Path) -> Path | None:
    """``djl_python`` of DJL Serving's tag, exported from the local mirror; None when the mirror is not there."""
    if not DJL_MIRROR.is_dir():
        return None
    archive = subprocess.run(
        ["git", "--git-dir", str(DJL_MIRROR), "archive", DJL_TAG, DJL_PACKAGE], capture_output=True, check=False
    )
    if archive.returncode != 0:
        return None
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / Path(DJL_PACKAGE).parent


def _djl_worker(size: ModelSize, work: Path) -> dict[str, Any]:
    """The DJL row: ``size``'s model (built by _build) packaged as a DJL archive, loaded by its model.py."""
    from inference_assets.tools.publish_models import build_archive

    archive = build_archive(work / f"model-{size.label}", work / f"{size.label}-djl.tar.gz")
    model_dir = _unpack(archive, work / "unpacked" / "djl")
    environment = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    attempts: list[tuple[str, str, str]] = []
    real = _export_real_djl_python(work / "djl-serving")
    if real is not None:
        how = f"adapter (archive model.py) in a bare Python process with the real djl_python of DJL Serving {DJL_TAG}"
        attempts.append(("real", str(real), how))
    how = "adapter in a bare Python process with the test stand-in for djl_python"
    attempts.append(("fake", str(FAKE_DJL.parent), how))
    failures: list[str] = []
    for kind, path, how in attempts:
        run = subprocess.run(
            [sys.executable, "-c", _DJL_WORKER, str(model_dir), path, kind],
            capture_output=True, text=True, env=environment, timeout=300, check=False,
        )  # fmt: skip
        if run.returncode == 0:
            result = json.loads(run.stdout.strip().splitlines()[-1])
            manifest = (model_dir / "MAR-INF" / "MANIFEST.json").is_file()
            return {
                "how": how + "; DJL Serving's Java frontend is not measured (it cannot run here)",
                "rss_mib": result["rss_mib"],
                "uss_mib": result["uss_mib"],
                "load_s": result["load_s"],
                "djl_python": result["djl_python_file"],
                "archive_has_torchserve_manifest": manifest,
                "note": (
                    "djl_python/service_loader.py of v0.36.0 only imports the entry point (model.py) when the model "
                    "dir has no MAR-INF/MANIFEST.json; with one it loads the TorchServe handler through ts.model_loader"
                    " instead. This archive has one"
                    if manifest
                    else "the archive has no MAR-INF/MANIFEST.json: DJL 0.36 imports model.py"
                ),
                "failed_attempts": failures,
            }
        failures.append(f"{kind}: {run.stderr.strip().splitlines()[-1:] if run.stderr else run.returncode}")
    raise RuntimeError(f"the DJL worker could not load the adapter: {failures}")


# --- fits and the whole run -----------------------------------------------------------------------------------------


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares y = intercept + slope * x; (intercept, slope)."""
    import numpy as np

    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


def _fits(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    fits: dict[str, dict[str, float]] = {}
    for key, against, slope_name in (
        ("worker_uss_mib", "weights_mib", "per_weights_mib"),
        ("worker_rss_mib", "weights_mib", "per_weights_mib"),
        ("first_load_s", "archive_mib", "per_archive_mib"),
        ("reload_s", "archive_mib", "per_archive_mib"),
    ):
        intercept, slope = _fit([r[against] for r in rows], [r[key] for r in rows])
        fits[key] = {"intercept": intercept, slope_name: slope}
    return fits


# Long: the benchmark's run: the server started once, every size measured on it, then the machine's facts and the
# results file
def measure(
    work_dir: Path,
    *,
    sizes: Sequence[ModelSize] = DEFAULT_SIZES,
    repeats: int = 3,
    saturation_clients: int = 4,
    saturation_seconds: float = 10,
    command: str = "measure()",
) -> dict[str, Any]:
    """Measure every size on one fresh local server (stopped at the end); the result dict of mme_model_cost.json."""
    if len(sizes) < 2:
        raise ValueError("the fits need at least two sizes")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    server = LocalModelServer(work_dir / "server", startup_timeout_s=300)
    server.start()
    processes: list[dict[str, float]] = []
    try:
        settled = time.monotonic() + FRONTEND_SETTLE_S
        # Every size's model and archive are built while the frontend settles (nothing of it is measured).
        built = {size.label: _build(size, work_dir) for size in sizes}
        time.sleep(max(0.0, settled - time.monotonic()))
        frontend_rss = _memory(_frontend(server))["rss"]
        smallest = min(sizes, key=lambda s: s.hidden_size * s.layers)
        # The smallest last: it stays loaded as the saturation's first model (rows keep the order of ``sizes``).
        measured = {
            size.label: _measure_size(server, size, built[size.label], work_dir, repeats, keep_loaded=size is smallest)
            for size in sorted(sizes, key=lambda s: s is smallest)
        }
        rows = [measured[size.label] for size in sizes]
        saturated = _saturate(server, work_dir / f"{smallest.label}.tar.gz", work_dir, saturation_clients,
                              saturation_seconds, loaded=f"cost-{smallest.label}")  # fmt: skip
        server.check_alive()
        processes = [{"pid": p.pid, "create_time": p.create_time()} for p in _server_processes(server)]
    finally:
        server.stop()
    smallest_row = next(r for r in rows if r["label"] == smallest.label)
    saturated["sequential_rps"] = 1000 / smallest_row["warm_latency_ms"]
    saturated["parallelism"] = saturated["throughput_rps"] / saturated["sequential_rps"]
    saturated["size"] = smallest.label
    print(f"saturated: {saturated['throughput_rps']:.1f} rps with {saturation_clients} clients, "
          f"{saturated['parallelism']:.2f}x the sequential rate", flush=True)  # fmt: skip
    djl = _djl_worker(smallest, work_dir)
    import torch
    import ts  # type: ignore[import-untyped]

    return {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "machine": machine(),
        "host": {"cpus": os.cpu_count() or 0, "load_average_before": load_before},
        "server": (
            f"TorchServe {getattr(ts, '__version__', '?')} + SageMaker PyTorch toolkit, multi-model mode, local; "
            f"torch {torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')} per worker"
        ),
        "frontend_rss_mib": frontend_rss,
        "sizes": rows,
        "fits": _fits(rows),
        "saturated": saturated,
        "djl_python_worker": djl,
        "repeats": repeats,
        "server_processes": processes,
    }


# --- output ---------------------------------------------------------------------------------------------------------

_TABLE = [
    ("size", "label", "{}"), ("hidden x layers", None, ""), ("weights MiB", "weights_mib", "{:.1f}"),
    ("archive MiB", "archive_mib", "{:.1f}"), ("worker RSS", "worker_rss_mib", "{:.0f}"),
    ("worker PSS", "worker_pss_mib", "{:.0f}"), ("worker USS", "worker_uss_mib", "{:.0f}"),
    ("frontend +RSS", "frontend_delta_mib", "{:.1f}"), ("2nd worker USS", "second_worker_uss_mib", "{:.0f}"),
    ("add worker s", "add_worker_s", "{:.2f}"), ("first load s", "first_load_s", "{:.2f}"),
    ("reload s", "reload_s", "{:.2f}"), ("unload s", "unload_s", "{:.2f}"), ("warm ms", "warm_latency_ms", "{:.1f}"),
]  # fmt: skip


def _markdown(result: dict[str, Any]) -> str:
    host, fits, sat, djl = result["host"], result["fits"], result["saturated"], result["djl_python_worker"]
    lines = [
        "# What a model costs on the local multi-model server",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Host: {host['cpus']} CPUs, load average {host['load_average_before']:.2f} before the run. "
        f"Server: {result['server']}. Memory in MiB (worker measured after {WARM_REQUESTS + 1} requests); "
        f"times are medians of {result.get('repeats', '?')} repeats.",
        "",
        f"Java frontend with no model loaded: RSS {result['frontend_rss_mib']:.0f} MiB.",
        "",
        "| " + " | ".join(title for title, _, _ in _TABLE) + " |",
        "|" + "---|" * len(_TABLE),
    ]
    for row in result["sizes"]:
        cells = [
            f"{row['hidden_size']} x {row['layers']}" if key is None else fmt.format(row[key]) for _, key, fmt in _TABLE
        ]
        lines.append("| " + " | ".join(cells) + " |")
    uss, rss = fits["worker_uss_mib"], fits["worker_rss_mib"]
    first, reload = fits["first_load_s"], fits["reload_s"]
    lines += [
        "",
        "Fits (least squares):",
        "",
        f"- worker USS = {uss['intercept']:.0f} MiB + {uss['per_weights_mib']:.2f} x weights MiB",
        f"- worker RSS = {rss['intercept']:.0f} MiB + {rss['per_weights_mib']:.2f} x weights MiB",
        f"- first load = {first['intercept']:.2f} s + {first['per_archive_mib'] * 1000:.1f} ms x archive MiB",
        f"- reload = {reload['intercept']:.2f} s + {reload['per_archive_mib'] * 1000:.1f} ms x archive MiB",
        "",
        f"Saturated warm throughput ({sat.get('size', '?')} size): {sat['models']} models, {sat['clients']} "
        f"closed-loop clients (one model each), {sat['seconds']:.1f} s: {sat['throughput_rps']:.1f} rps, "
        f"{sat.get('errors', 0)} errors; sequential rate 1 / warm latency = {sat['sequential_rps']:.1f} rps; "
        f"parallelism {sat['parallelism']:.2f}.",
        "",
        f"DJL Python worker ({djl['how']}): RSS {djl['rss_mib']:.0f} MiB, USS {djl['uss_mib']:.0f} MiB, "
        f"load {djl['load_s']:.2f} s (interpreter start excluded; imports, model.py and the load call included). "
        f"Note: {djl.get('note', '')}.",
        "",
        _meaning(result),
        "",
    ]
    return "\n".join(lines)


def _meaning(result: dict[str, Any]) -> str:
    uss, sat, rows = result["fits"]["worker_uss_mib"], result["saturated"], result["sizes"]
    second = statistics.median(row["second_worker_uss_mib"] for row in rows)
    return (
        f"Each loaded model costs a Python worker of about {uss['intercept']:.0f} MiB of its own memory (USS) plus "
        f"{uss['per_weights_mib']:.2f} MiB per MiB of weights, so the per-worker runtime, not the weights, bounds how "
        f"many small models stay resident; a second worker of the same model adds ~{second:.0f} MiB whatever the "
        "model's size, because the safetensors weights are memory-mapped and then shared between the two workers. "
        f"With {sat['clients']} clients on {result['host']['cpus']} CPUs the host served {sat['parallelism']:.1f}x "
        "the sequential rate: throughput is bounded by the cores, not by the number of loaded models."
    )


def write_results(result: dict[str, Any], output_dir: Path) -> None:
    """Write ``mme_model_cost.json`` and ``mme_model_cost.md`` into ``output_dir``."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "mme_model_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    (output_dir / "mme_model_cost.md").write_text(_markdown(result))


def machine() -> str:
    """The host in one line: CPU model, CPUs, memory, architecture (no host name)."""
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")  # fmt: skip
    memory_gib = psutil.virtual_memory().total / 1024**3
    cpu = model or platform.processor() or "CPU"
    return f"{cpu}, {os.cpu_count()} CPUs, {memory_gib:.0f} GiB, {platform.machine()}"


def _results_date(path: Path) -> str:
    """The day a results file was committed (or last written): the date of a result that does not carry one."""
    try:
        day = subprocess.run(["git", "log", "-1", "--format=%cs", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        day = ""
    return day or datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC).date().isoformat()


def record(results_file: Path, data_file: Path = costs.MEASURED_COSTS_FILE) -> dict[str, Any]:
    """Write the sizing model's data (``mme_sizing/measured_costs.json``) from a results file of this benchmark."""
    results_file = results_file.resolve()
    try:
        source = results_file.relative_to(ROOT).as_posix()
    except ValueError:
        source = str(results_file)
    data = costs.sizing_data(json.loads(results_file.read_text()), source=source, date=_results_date(results_file))
    data_file.write_text(json.dumps(data, indent=2) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-from", type=Path, metavar="RESULTS",
                        help="measure nothing: record this results file as the sizing model's data")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="two small sizes, 1 repeat, 3 s saturation")
    parser.add_argument("--repeats", type=int, help="loads / reloads / unloads per size (default 3)")
    parser.add_argument("--clients", type=int, default=4, help="saturation: models and closed-loop clients")
    parser.add_argument("--seconds", type=float, help="saturation: seconds of traffic (default 10)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "proving_ground" / "benchmarks" / "results")
    parser.add_argument("--work-dir", type=Path, help="models and server logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.record_from is not None:
        if not args.record_from.is_file():
            parser.error(f"--record-from: no results file at {args.record_from}")
        record(args.record_from)
        print(f"recorded {args.record_from} in {costs.MEASURED_COSTS_FILE}")
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    if repeats < 1 or seconds <= 0 or args.clients < 1:
        parser.error("--repeats, --seconds and --clients must be positive")
    command = "python -m proving_ground.benchmarks.mme_model_cost " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="mme-cost-") as scratch:
        result = measure(
            args.work_dir or Path(scratch),
            sizes=QUICK_SIZES if args.quick else DEFAULT_SIZES,
            repeats=repeats,
            saturation_clients=args.clients,
            saturation_seconds=seconds,
            command=command.strip(),
        )
    write_results(result, args.output_dir)
    results_file = args.output_dir / "mme_model_cost.json"
    print(f"wrote {results_file} and {args.output_dir / 'mme_model_cost.md'}; to size with this measurement: "
          f"python -m proving_ground.benchmarks.mme_model_cost --record-from {results_file}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
