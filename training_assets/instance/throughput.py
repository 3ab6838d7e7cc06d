"""The throughput measurement of a training run: step times (CUDA events on a GPU, the host clock on CPU) with the
compile warm-up kept apart, the steady steps' samples and non-padding tokens per second, the model's training FLOPs
(``ModelFlops``), and the GPU check that no steady step synchronises with the host (``SyncCheck``). Nothing here
waits for the device while training runs; the clocks and counters are read once, after training."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback

from training_assets.instance.batching import Counts, TokenCounter, total


def graphs_compiled() -> int:
    """Graphs TorchDynamo has compiled in this process so far: a host-side counter, free to read."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class ThroughputMeter(TrainerCallback):
    """Times optimizer steps as a ``TrainerCallback``; the first ``warmup_steps`` (compilation) are kept apart.

    A step lasts from the previous step's end (or its epoch's start, so evaluation is never counted) to its own end,
    and so includes data loading. Nothing here waits for the device while training runs: on CUDA each step end
    records a CUDA event in the stream (timed by the GPU, read once after training), on CPU it reads the host clock
    (the work is done when the step returns). Tokens come from the ``TokenCounter`` the trainer fills on the device.

    Steady steps are the steps after the warm-up that compiled nothing and whose batch shape had run
    ``shape_warmups`` times before (with CUDA graphs 2: a shape's first run compiles it, its second records the
    graph). With bucketed padding a bucket can turn up for the first time late in an epoch and compile there, so
    "the steps after the warm-up" alone would count compilation as training time.
    """

    def __init__(
        self, warmup_steps: int, samples_per_step: int, counter: TokenCounter, use_cuda: bool, shape_warmups: int = 0
    ) -> None:
        self.warmup_steps = warmup_steps
        self.samples_per_step = samples_per_step
        self.counter = counter
        self.use_cuda = use_cuda
        self.shape_warmups = shape_warmups
        self.steps: list[tuple[Any, Any]] = []  # (start mark, end mark) per optimizer step
        self.compiled: list[bool] = []  # per optimizer step: did TorchDynamo compile a graph during it
        # Host clock per step: from on_step_begin to on_step_end (the host's own work: launching, the Python of the
        # Trainer), and the wait before it since the previous step ended (the next batch from the data loader).
        self.host_seconds: list[float] = []
        # The train loop thread's CPU time per step (time.thread_time): the host's own work without the time it
        # waited for a core, which on a busy machine the wall clock counts too.
        self.host_cpu_seconds: list[float] = []
        self._cpu_start = 0.0
        self.excluded: set[int] = set()  # steps (0-based) left out of the steady steps: profiled ones
        self.loader_wait_seconds: list[float | None] = []
        self._start: Any = None
        self._host_start = 0.0
        self._host_end: float | None = None
        self._graphs = 0

    def _mark(self) -> Any:
        if self.use_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start = self._mark()
        self._host_end = None  # the epoch's first batch waits for the loader's start-up: not a step's wait

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._graphs = graphs_compiled()
        self._host_start = time.perf_counter()
        self._cpu_start = time.thread_time()
        self.loader_wait_seconds.append(None if self._host_end is None else self._host_start - self._host_end)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        end = self._mark()
        self._host_end = time.perf_counter()
        self.host_seconds.append(self._host_end - self._host_start)
        self.host_cpu_seconds.append(time.thread_time() - self._cpu_start)
        self.steps.append((self._start, end))
        self._start = end
        self.compiled.append(graphs_compiled() > self._graphs)

    def steady_shape(self, step: int) -> bool:
        """Step ``step`` (0-based) is past the warm-up and its shape has run often enough to need no compilation."""
        return step >= self.warmup_steps and self.counter.earlier[step] >= self.shape_warmups

    def step_seconds(self) -> list[float]:
        if self.use_cuda:
            torch.cuda.synchronize()  # once, after training: every event has been reached
            return [start.elapsed_time(end) / 1000 for start, end in self.steps]
        return [end - start for start, end in self.steps]

    def summary(self, flops: ModelFlops | None = None) -> dict[str, Any]:
        """Read the clocks and counters once (summed over the ranks of a torchrun: every rank must call this)."""
        seconds, counts = self.step_seconds(), self.counter.read()
        warm, whole = total(counts[: self.warmup_steps]), total(counts)
        summary = throughput_summary(
            seconds,
            warmup_steps=self.warmup_steps,
            samples_per_step=self.samples_per_step,
            tokens=(warm.tokens, whole.tokens),
            positions=(warm.positions, whole.positions),
            squared_lengths=(warm.squared_lengths, whole.squared_lengths),
            flops=flops,
        )
        steady = [
            i for i in range(len(seconds)) if self.steady_shape(i) and not self.compiled[i] and i not in self.excluded
        ]
        return {**summary, **steady_summary(seconds, counts, steady, self.samples_per_step, flops),
                **self.host_summary(seconds, steady)}  # fmt: skip

    def host_summary(self, seconds: list[float], steady: list[int]) -> dict[str, Any]:
        """Per steady step: the host's time (wall clock, and the train loop thread's CPU time), the device's (CUDA
        events; on CPU the host's wall clock, whole step), and the wait for the next batch; the median, and the
        host's slowest step (a pause shows there)."""
        if not steady:
            return {}
        host = [self.host_seconds[i] for i in steady]
        waits = [wait for i in steady if (wait := self.loader_wait_seconds[i]) is not None]
        return {
            "steady_host_seconds_per_step": round(statistics.median(host), 6),
            "steady_host_seconds_per_step_max": round(max(host), 6),
            "steady_host_cpu_seconds_per_step": round(statistics.median(self.host_cpu_seconds[i] for i in steady), 6),
            "steady_device_seconds_per_step": round(statistics.median(seconds[i] for i in steady), 6),
            "steady_data_loader_wait_seconds": round(statistics.median(waits), 6) if waits else None,
        }


def compiler_counts() -> dict[str, Any]:
    """TorchDynamo's and TorchInductor's counters and compile clock so far in this process (``observed_compilation``
    subtracts the values from before training)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    compile_seconds = sum(compilation_time_metrics.get("_compile.compile_inner", []))
    # The backward graph compiles at the first backward pass, outside the frame's compile.
    compile_seconds += sum(sum(times) for key, times in compilation_time_metrics.items() if "bw_compiler" in key)
    return {
        "frames_compiled": counters["frames"]["ok"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "graph_break_reasons": dict(counters["graph_break"]),
        "cuda_graph_skips": counters["inductor"]["cudagraph_skips"],
        "fx_graph_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
        "fx_graph_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
        "compile_seconds": compile_seconds,
        "cuda_graph_rerecords": cuda_graph_rerecords(),
    }


def cuda_graph_rerecords() -> int:
    """CUDA graphs recorded again (cudagraph trees' ``num_rerecord``: a static input moved, so the graph was captured
    anew), over the devices of this process; 0 where no CUDA graph tree exists."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    from torch._inductor import cudagraph_trees

    total_ = 0
    for device in range(torch.cuda.device_count()):
        manager = cudagraph_trees.get_manager(device, create_if_none_exists=False)
        if manager is not None:
            total_ += sum(sum(per_function.values()) for per_function in manager.num_rerecord.values())
    return total_


def observed_compilation(before: dict[str, Any], steps_that_compiled: list[int]) -> dict[str, Any]:
    """What compilation did during the run, as observed (not as configured): graph breaks (and why), recompiles
    (frames compiled after the first step, which compiles each function once), CUDA graph skips (TorchInductor ran
    a graph without CUDA graphs, and said why in a warning) and re-records, FX graph cache hits, compile seconds."""
    after = compiler_counts()
    reasons = {reason: count - before["graph_break_reasons"].get(reason, 0)
               for reason, count in after["graph_break_reasons"].items()}  # fmt: skip
    return {
        "graph_breaks": after["graph_breaks"] - before["graph_breaks"],
        "graph_break_reasons": {reason: count for reason, count in reasons.items() if count},
        "frames_compiled": after["frames_compiled"] - before["frames_compiled"],
        "steps_that_compiled": steps_that_compiled,
        "cuda_graph_skips": after["cuda_graph_skips"] - before["cuda_graph_skips"],
        "cuda_graph_rerecords": after["cuda_graph_rerecords"] - before["cuda_graph_rerecords"],
        "fx_graph_cache_hits": after["fx_graph_cache_hits"] - before["fx_graph_cache_hits"],
        "fx_graph_cache_misses": after["fx_graph_cache_misses"] - before["fx_graph_cache_misses"],
        "compile_seconds": round(after["compile_seconds"] - before["compile_seconds"], 3),
    }


# What the host calls to start work on a GPU: a kernel, or a whole CUDA graph (one launch for all its kernels).
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


class LaunchCounter(TrainerCallback):
    """Counts, with torch.profiler, what the host launches during ``steps`` optimizer steps at the end of training
    (shapes compiled and CUDA graphs recorded by then): kernel and CUDA graph launches on a GPU, aten operators on a
    CPU (which has no launches; the count still shows the work per step). The profiler slows the steps it watches:
    the meter leaves them out of the throughput (``ThroughputMeter.excluded``)."""

    def __init__(self, steps: int, use_cuda: bool) -> None:
        self.steps = steps
        self.use_cuda = use_cuda
        self.first = -1
        self.result: dict[str, Any] = {}
        self._profiler: Any = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.first = max(0, state.max_steps - self.steps) if self.first < 0 else self.first
        if state.global_step == self.first and self._profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.use_cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._profiler is None or state.global_step < self.first + self.steps:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        steps = state.global_step - self.first
        names = [event.name for event in profiler.events()]
        launches = sum(name in LAUNCH_CALLS for name in names)
        self.result = {
            "profiled_steps": list(range(self.first + 1, state.global_step + 1)),
            "kernel_launches_per_step": round(launches / steps, 1) if self.use_cuda else None,
            "cuda_graph_launches_per_step": round(names.count("cudaGraphLaunch") / steps, 1) if self.use_cuda else None,
            "aten_ops_per_step": round(sum(name.startswith("aten::") for name in names) / steps, 1),
        }


def steady_summary(
    seconds: list[float], counts: list[Counts], steady: list[int], samples_per_step: int, flops: ModelFlops | None
) -> dict[str, Any]:
    """The throughput of the steady steps (see ThroughputMeter): what training runs at once nothing compiles."""
    if not steady:
        return {"steady_steps": 0}
    time_ = sum(seconds[i] for i in steady)
    done = total([counts[i] for i in steady])
    result = {
        "steady_steps": len(steady),
        "steady_seconds": round(time_, 4),
        "steady_samples_per_second": round(len(steady) * samples_per_step / time_, 3),
        "steady_non_padding_tokens_per_second": round(done.tokens / time_, 3),
        "steady_padding_fraction": round(1 - done.tokens / done.positions, 4) if done.positions else None,
    }
    if flops is not None:
        useful = flops.training_flops(done.tokens, done.squared_lengths)
        result["steady_model_tflops_per_second"] = round(useful / time_ / 1e12, 6)
    return result


@dataclass(frozen=True)
class ModelFlops:
    """Training FLOPs of a transformer encoder, from its config (multiply and add counted as 2 FLOPs).

    A text of l tokens costs 6 * N * l + 12 * L * d * l**2 FLOPs to train on: N is the number of weights in the
    layers' matrix multiplications (L * (4 * d**2 + 2 * d * d_ff) for BERT/RoBERTa: query, key, value and output
    projections, and the two feed-forward matrices), 6 = 2 (multiply-add) x 3 (forward, and a backward twice as
    costly); the attention scores and their weighted sum are 2 matmuls of l x l x d per layer, 12 * L * d * l per
    token with the same factors. This is the model-FLOPs count of PaLM (Chowdhery et al. 2022, "PaLM: Scaling
    Language Modeling with Pathways", Appendix B: 6N + 12LHQT per token) and of torchtitan's
    get_num_flop_per_token (pytorch/torchtitan torchtitan/tools/utils.py). Counted on the non-padding tokens only,
    so the work spent on padding is not counted as useful. Left out: embeddings (lookups, no matmul), layer norms,
    softmax and the classifier head (once per text: 2 * (d**2 + d * labels) forward, under 0.1% of a tweet's FLOPs
    for RoBERTa-base), and activation recomputation (not model FLOPs).
    """

    layers: int
    hidden: int
    intermediate: int

    @classmethod
    def from_config(cls, config: Any) -> ModelFlops | None:
        names = ("num_hidden_layers", "hidden_size", "intermediate_size")
        if not all(isinstance(getattr(config, name, None), int) for name in names):
            return None  # not a BERT-like encoder config: the formula does not apply
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size)

    @property
    def matmul_weights(self) -> int:
        return self.layers * (4 * self.hidden**2 + 2 * self.hidden * self.intermediate)

    def training_flops(self, tokens: int, squared_lengths: int) -> int:
        """FLOPs to train on texts with ``tokens`` non-padding tokens in all and ``squared_lengths`` = sum of l**2."""
        return 6 * self.matmul_weights * tokens + 12 * self.layers * self.hidden * squared_lengths

    def per_token(self, attention_context: float) -> float:
        """FLOPs per non-padding token when tokens attend, on average, to ``attention_context`` tokens."""
        return 6 * self.matmul_weights + 12 * self.layers * self.hidden * attention_context


# Long: one flat dict per outcome (measured or not), each key a number metrics.json reports.
def throughput_summary(
    step_seconds: list[float],
    *,
    warmup_steps: int,
    samples_per_step: int,
    tokens: tuple[int, int],
    positions: tuple[int, int],
    squared_lengths: tuple[int, int] = (0, 0),
    flops: ModelFlops | None = None,
) -> dict[str, Any]:
    """The throughput of the steps after the warm-up; when there are none, why it was not measured.

    ``tokens``, ``positions`` and ``squared_lengths`` are (at the end of the warm-up, at the end) counts of
    non-padding tokens, of positions computed (padding included) and the sum over texts of their squared length in
    tokens. A measurement never stops a run: a short run trains, saves its model and reports ``"measured": false``.
    """
    warm, steady = step_seconds[:warmup_steps], step_seconds[warmup_steps:]
    padding = {
        # Padded positions / positions computed, over every training step (warm-up included).
        "padding_fraction": round(1 - tokens[1] / positions[1], 4) if positions[1] else None,
        "non_padding_tokens": tokens[1],
        "positions_computed": positions[1],
    }
    model: dict[str, Any] = {}
    if flops is not None and tokens[1]:
        # Each token attends to the other tokens of its own text: sum(l * l) / sum(l) on average.
        context = squared_lengths[1] / tokens[1]
        model = {
            "model_flops_per_token": round(flops.per_token(context)),
            "model_flops_formula": "6 * N + 12 * L * d * l per non-padding token (ModelFlops)",
            "model_matmul_weights": flops.matmul_weights,
            "mean_attention_context": round(context, 3),
        }
    if not steady:
        return {
            "measured": False,
            "reason": f"the run had {len(step_seconds)} optimizer step(s), all within the "
            f"{warmup_steps} warm-up step(s) kept apart for compilation; more data or epochs, or "
            "--warmup-steps 0, leave steps to measure",
            "optimizer_steps": len(step_seconds),
            "warmup_steps": len(warm),
            "warmup_seconds": round(sum(warm), 4),
            "samples_per_step": samples_per_step,
            **padding,
            **model,
        }
    seconds = sum(steady)
    median = statistics.median(steady)
    if model and flops is not None:
        useful = flops.training_flops(tokens[1] - tokens[0], squared_lengths[1] - squared_lengths[0])
        model["model_tflops_per_second"] = round(useful / seconds / 1e12, 6)
    return {
        "measured": True,
        "train_samples_per_second": round(len(steady) * samples_per_step / seconds, 3),
        "non_padding_tokens_per_second": round((tokens[1] - tokens[0]) / seconds, 3),
        "positions_per_second": round((positions[1] - positions[0]) / seconds, 3),
        "measured_steps": len(steady),
        "measured_seconds": round(seconds, 4),
        "median_step_seconds": round(median, 6),
        "warmup_steps": len(warm),
        "warmup_seconds": round(sum(warm), 4),
        # What the warm-up steps cost beyond ordinary steps: compilation (and, on CUDA, context set-up).
        "compile_warmup_seconds": round(max(0.0, sum(warm) - len(warm) * median), 4),
        "samples_per_step": samples_per_step,
        **padding,
        **model,
        "tokens": "non-padding input tokens and positions computed, summed over all ranks",
    }


class SyncCheck(TrainerCallback):
    """On a GPU, ``torch.cuda.set_sync_debug_mode(mode)`` ("error": a synchronising CUDA call raises) while steady
    steps run: from a steady step's forward pass to the next step's, through backward, clipping, the optimizer and
    scheduler steps, and the next batch's load and copy to the device. Off for steps that compile or record a CUDA
    graph (``ThroughputMeter.steady_shape``: compiling legitimately waits for the device), and whenever the Trainer is
    about to log, evaluate or save (what a user asked for may read the device). torch's own caveat: not every
    synchronising call is covered (torch.distributed is not)."""

    def __init__(self, mode: str, meter: ThroughputMeter) -> None:
        self.mode = mode
        self.meter = meter
        self.steps_checked = 0
        self._on = False

    def step_starts(self, step: int) -> None:
        steady = self.meter.steady_shape(step)
        self.steps_checked += steady
        self.switch(steady)

    def switch(self, on: bool) -> None:
        if on != self._on:
            torch.cuda.set_sync_debug_mode(self.mode if on else "default")
            self._on = on

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_log or control.should_evaluate or control.should_save or control.should_training_stop:
            self.switch(False)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.switch(False)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.switch(False)
