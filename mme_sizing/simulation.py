"""A discrete-event model of a SageMaker multi-model endpoint's fleet.

What it models, per instance: a memory budget that holds loaded models (each worker holds one copy of its model),
least-recently-used unloading of idle models when a load or a new worker needs room, a disk cache (a model
downloaded once is reloaded from disk), and the CPU as processor sharing over the vCPUs: a request in service and a
model being loaded each want one core (one intra-op thread per worker, as the endpoint sets ``OMP_NUM_THREADS=1``),
and when more want one than there are cores, all slow down alike.

Per model, the model server decides how many requests run at once:

* ``torchserve`` (the local harness the model is validated on): a fixed number of workers per loaded model
  (``SAGEMAKER_MODEL_SERVER_WORKERS``).
* ``djl``: one worker at first; each request that finds more than twice the batch size (1) queued starts another, up
  to ``max_workers_per_model`` (DJL's default: vCPUs / OMP threads); a worker idle for ``max_idle_s`` stops
  (``WorkLoadManager.runJob`` in djl-serving v0.36.0; https://docs.djl.ai/docs/serving/serving/docs/configurations_model.html).

Routing, as AWS describes it for multi-model endpoints ("Invoke a multi-model endpoint"; the blog post in
../shared/seeds/002): a request goes to an instance that already holds its model (the one with the fewest of that
model's requests outstanding); a model's requests spill to another instance, which loads it, when every holder
already has more than twice the model's worker limit outstanding; a model nobody holds is loaded on the instance with
the fewest outstanding requests. SageMaker does not publish its exact algorithm: these rules are this model's
assumptions, and only the single-instance part is checked against measurements
(proving_ground/benchmarks/mme_fleet_validation.py).

Traffic is either open (Poisson arrivals at a rate: what an operator plans for) or closed (N clients that send the
next request when the last returns: what a load test does). Everything is deterministic for a given seed.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# The model servers whose worker rules the simulation knows: DJL Serving (the multi-model endpoint's) and TorchServe
# (the proving ground's local harness, against which the model is validated).
ModelServer = Literal["djl", "torchserve"]
PATTERNS = ("uniform", "hot-model", "top-10")
HOT_SHARE = 0.9  # hot-model: one model takes 9 of 10 requests (the blog post's Locust task weights 9:1)
HOT_SET, HOT_SET_SHARE = 10, 8 / 9  # top-10: ten models take 8 of 9 requests (weights 8:1)
DJL_BATCH_SIZE = 1  # serving.properties batch_size (must stay 1: contract.DjlModelSettings)
SAGEMAKER_TIMEOUT_S = 60.0  # InvokeEndpoint gives the container 60 s to answer
PREWARM_UTILIZATION = 0.7  # a steady state's workers are busy this share of the time


@dataclass(frozen=True)
class Fleet:
    """The endpoint's instances and its model server's worker rules."""

    instances: int
    vcpus: int
    memory_mib: float  # per instance, for model workers (the OS and the server's frontend already taken off)
    model_server: ModelServer = "djl"
    workers_per_model: int = 1  # torchserve: every loaded model's workers; djl: its minimum
    max_workers_per_model: int | None = None  # djl: None = vcpus (DJL's default with OMP_NUM_THREADS=1)
    max_idle_s: float = 600.0  # djl: a worker idle this long stops (serving.properties max_idle_time)
    # The CPU the instance's requests and loads share (default: every vCPU). The validation passes what a shared host
    # left to the harness during a run (proving_ground/benchmarks/mme_window.py measures it).
    cores: float | None = None

    def __post_init__(self) -> None:
        if self.instances < 1 or self.vcpus < 1 or self.workers_per_model < 1:
            raise ValueError(f"instances, vcpus and workers_per_model must be at least 1: {self}")
        if self.cores is not None and not self.cores > 0:
            raise ValueError(f"cores must be positive when given, got {self.cores}")
        if self.memory_mib <= 0:
            raise ValueError(f"memory_mib must be positive, got {self.memory_mib}")

    @functools.cached_property  # read on every arrival
    def worker_limit(self) -> int:
        """The most workers one model may have on one instance."""
        if self.model_server == "torchserve":
            return self.workers_per_model
        return max(self.workers_per_model, self.max_workers_per_model or self.vcpus)


@dataclass(frozen=True)
class ModelCost:
    """What one model costs on an instance (see mme_sizing/costs.py for where the numbers come from)."""

    worker_memory_mib: float  # one worker process: the Python runtime, its own for every worker
    download_s: float  # S3 -> the instance's disk, once per instance (then the disk copy is reused)
    load_s: float  # start a worker and load the model into it: one core busy
    service_s: float  # one warm request in a worker, on one core
    unload_s: float = 0.0  # stopping an evicted model's workers, before the load that needed the room
    # The weights, once per instance: its workers map the same safetensors file and share those pages
    # (proving_ground/benchmarks/results/mme_model_cost.md: a second worker adds the runtime only, whatever the
    # model's size).
    model_memory_mib: float = 0.0
    # CPU a request takes outside the model's workers before it queues (the server's front end; on the local harness
    # also the load-test client on the same host). It needs no worker, so it overlaps with a busy worker.
    frontend_s: float = 0.0

    def footprint_mib(self, workers: int) -> float:
        """Memory of one model with ``workers`` workers on one instance."""
        return self.model_memory_mib + workers * self.worker_memory_mib

    def __post_init__(self) -> None:
        may_be_zero = (self.download_s, self.load_s, self.unload_s, self.model_memory_mib, self.frontend_s)
        if self.worker_memory_mib <= 0 or self.service_s <= 0 or min(may_be_zero) < 0:
            raise ValueError(f"model costs must be positive (times may be 0): {self}")


@dataclass(frozen=True)
class Workload:
    """Which models the requests name and how fast they come."""

    pattern: str  # uniform | hot-model | top-10 | zipf
    models: int
    requests_per_second: float | None = None  # open loop (Poisson arrivals)
    clients: int | None = None  # closed loop: each client sends its next request when the last one returns
    zipf_exponent: float = 1.0  # zipf: model i (from 0) is requested in proportion to 1 / (i + 1) ** exponent

    def __post_init__(self) -> None:
        if self.pattern not in (*PATTERNS, "zipf"):
            raise ValueError(f"pattern must be one of {', '.join((*PATTERNS, 'zipf'))}, got {self.pattern!r}")
        if (self.requests_per_second is None) == (self.clients is None):
            raise ValueError("give either requests_per_second (open loop) or clients (closed loop)")
        minimum = HOT_SET + 1 if self.pattern == "top-10" else 2 if self.pattern == "hot-model" else 1
        if self.models < minimum:
            raise ValueError(f"the {self.pattern} pattern needs at least {minimum} models, got {self.models}")

    def weights(self) -> list[float]:
        """Each model's share of the requests (they sum to 1)."""
        n = self.models
        if self.pattern == "uniform":
            return [1 / n] * n
        if self.pattern == "hot-model":
            return [HOT_SHARE] + [(1 - HOT_SHARE) / (n - 1)] * (n - 1)
        if self.pattern == "top-10":
            return [HOT_SET_SHARE / HOT_SET] * HOT_SET + [(1 - HOT_SET_SHARE) / (n - HOT_SET)] * (n - HOT_SET)
        raw = [1 / (i + 1) ** self.zipf_exponent for i in range(n)]
        total = sum(raw)
        return [w / total for w in raw]


@dataclass(frozen=True)
class Prediction:
    """What the fleet does with a workload over the measured window."""

    pattern: str
    requests: int  # requests that arrived in the window (closed loop: all of them)
    throughput_rps: float  # answered within the timeout, per second of the window
    hit_ratio: float  # found their model loaded on the instance they were routed to (SageMaker's ModelCacheHit)
    p50_ms: float  # over every request of the window; inf when more than half timed out
    p99_ms: float  # inf when more than 1% timed out
    cold_loads_per_minute: float  # loads started in the window (first loads and reloads)
    loads: int
    timeouts: int  # not answered within the timeout (SageMaker fails them), or never answered
    rejected: int  # found no instance with room for their model (every loaded model busy): answered an error
    elapsed_s: float  # the window (closed loop: until the last request returned)
    completed: int = 0  # answers that came back inside the window (what a load test's window counts)


class _Request:
    __slots__ = ("arrival", "client", "counted")

    def __init__(self, arrival: float, client: int | None, counted: bool) -> None:
        self.arrival, self.client, self.counted = arrival, client, counted


class _Model:
    __slots__ = ("busy", "id", "idle_since", "in_front", "loading", "queue", "starting", "workers")

    def __init__(self, model_id: int) -> None:
        self.id = model_id
        self.workers = 0
        self.starting = 0
        self.busy = 0
        self.loading = True
        self.queue: deque[_Request] = deque()
        self.in_front = 0  # requests still in the server's front end, on their way to the queue
        self.idle_since = 0.0

    @property
    def outstanding(self) -> int:
        return self.busy + len(self.queue) + self.in_front

    @property
    def idle(self) -> bool:
        return not self.loading and self.outstanding == 0 and self.starting == 0


class _Instance:
    """One instance: models in LRU order, a memory budget, and processor sharing over its cores."""

    def __init__(self, sim: _Simulation) -> None:
        self.sim = sim
        self.cores = sim.fleet.cores or sim.fleet.vcpus
        self.memory_free = sim.fleet.memory_mib
        self.models: OrderedDict[int, _Model] = OrderedDict()  # least recently used first
        self.on_disk: set[int] = set()
        self.outstanding = 0
        # Processor sharing with a virtual clock: every job advances at min(1, cores / jobs) core-seconds per second.
        self.virtual = 0.0
        self.updated_at = 0.0
        self.jobs: list[tuple[float, int, Callable[[], None]]] = []
        self.version = 0

    # --- processor sharing --------------------------------------------------------------------------------------

    def _rate(self) -> float:
        jobs = len(self.jobs)  # min(1, cores / jobs), without min(): this runs on every event
        return self.cores / jobs if jobs > self.cores else 1.0

    def _advance(self) -> None:
        now = self.sim.now
        self.virtual += (now - self.updated_at) * self._rate()
        self.updated_at = now

    def run(self, work_s: float, done: Callable[[], None]) -> None:
        """Give ``work_s`` seconds of one core to a job; ``done`` runs when it has had them."""
        self._advance()
        heapq.heappush(self.jobs, (self.virtual + work_s, next(self.sim.sequence), done))
        self._reschedule()

    def _reschedule(self) -> None:
        self.version += 1
        if self.jobs:
            due = self.sim.now + max(0.0, self.jobs[0][0] - self.virtual) / self._rate()
            self.sim.at(due, self._complete, self.version)

    def _complete(self, version: int) -> None:
        if version != self.version:
            return  # a later arrival or completion rescheduled this instance
        self._advance()
        finished = []
        while self.jobs and self.jobs[0][0] <= self.virtual + 1e-12:
            finished.append(heapq.heappop(self.jobs)[2])
        for done in finished:
            done()
        self._reschedule()

    # --- memory -------------------------------------------------------------------------------------------------

    def make_room(self, need_mib: float, keep: int) -> int | None:
        """Unload idle models, least recently used first, until ``need_mib`` fits; return how many were unloaded,
        or None (and unload nothing) when even unloading every idle model would not be enough."""
        if self.memory_free >= need_mib:
            return 0
        # The idle models from the least recently used on, only as far as they make room: an instance can hold
        # hundreds of models, and this runs on every load and every new worker of a full instance.
        footprint = self.sim.cost.footprint_mib
        victims, free = [], self.memory_free
        for model in self.models.values():
            # model.idle, spelled out: this loop ran 20 million times in a plan of three environments.
            idle = not (model.loading or model.busy or model.queue or model.in_front or model.starting)
            if idle and model.id != keep:
                victims.append(model)
                free += footprint(model.workers)
                if free >= need_mib:
                    break
        else:
            return None
        for victim in victims:
            self.unload(victim)
        return len(victims)

    def unload(self, model: _Model) -> None:
        del self.models[model.id]
        self.memory_free += self.sim.cost.footprint_mib(model.workers + model.starting)
        self.sim.holders[model.id].remove(self)


class _Simulation:
    def __init__(self, fleet: Fleet, cost: ModelCost, workload: Workload, seed: int) -> None:
        self.fleet, self.cost, self.workload = fleet, cost, workload
        self.random = random.Random(seed)
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.sequence = itertools.count()
        self.instances = [_Instance(self) for _ in range(fleet.instances)]
        self.holders: dict[int, list[_Instance]] = {m: [] for m in range(workload.models)}
        weights = workload.weights()
        self.cumulative = list(itertools.accumulate(weights))
        self.weights = weights
        # statistics of the measured window
        self.window = (0.0, math.inf)
        self.latencies: list[float] = []
        self.requests = self.hits = self.loads = self.rejected = self.completed = 0
        self.last_done = 0.0

    def at(self, time: float, action: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self.events, (time, next(self.sequence), action, args))

    def pick_model(self) -> int:
        index = bisect.bisect_left(self.cumulative, self.random.random() * self.cumulative[-1])
        return min(index, self.workload.models - 1)

    def in_window(self, time: float) -> bool:
        return self.window[0] <= time < self.window[1]

    # --- requests -----------------------------------------------------------------------------------------------

    def arrive(self, model_id: int, client: int | None) -> None:
        request = _Request(self.now, client, self.in_window(self.now))
        self.requests += request.counted
        instance = self.route(model_id)
        model = instance.models.get(model_id)
        if model is None:
            placed = self.load(instance, model_id)
            if placed is None:
                # No instance can make room (every loaded model is busy): SageMaker answers an error at once.
                self.rejected += request.counted
                if client is not None:
                    self.at(self.now, self.next_request, client)
                return
            instance, model = placed
        elif request.counted and not model.loading:
            self.hits += 1
        instance.outstanding += 1
        instance.models.move_to_end(model_id)
        if self.cost.frontend_s > 0:
            model.in_front += 1
            instance.run(self.cost.frontend_s, functools.partial(self.enqueue, instance, model, request, True))
        else:
            self.enqueue(instance, model, request, False)

    def enqueue(self, instance: _Instance, model: _Model, request: _Request, from_front: bool) -> None:
        model.in_front -= from_front
        model.queue.append(request)
        self.dispatch(instance, model)
        if self.fleet.model_server == "djl" and not model.loading:
            self.maybe_add_worker(instance, model)

    def route(self, model_id: int) -> _Instance:
        holders = self.holders[model_id]
        limit = 2 * self.fleet.worker_limit
        if holders:
            best = min(holders, key=lambda i: (i.models[model_id].outstanding, i.outstanding))
            if best.models[model_id].outstanding <= limit or len(holders) == len(self.instances):
                return best
            others = [i for i in self.instances if model_id not in i.models]
            return min(others, key=lambda i: (i.outstanding, -i.memory_free))
        return min(self.instances, key=lambda i: (i.outstanding, -i.memory_free))

    def load(self, chosen: _Instance, model_id: int) -> tuple[_Instance, _Model] | None:
        """Load the model on ``chosen``, or on the least busy instance that can make room for it."""
        model = _Model(model_id)
        workers = self.fleet.workers_per_model
        need = self.cost.footprint_mib(workers)
        others = (i for i in self.instances if i is not chosen and model_id not in i.models)
        candidates = [chosen, *sorted(others, key=lambda i: (i.outstanding, -i.memory_free))]
        for instance in candidates:
            unloaded = instance.make_room(need, keep=model_id)
            if unloaded is not None:
                break
        else:
            return None
        instance.memory_free -= need
        instance.models[model_id] = model
        self.holders[model_id].append(instance)
        if self.in_window(self.now):
            self.loads += 1
        delay = unloaded * self.cost.unload_s
        if model_id not in instance.on_disk:
            delay += self.cost.download_s

        def start_workers() -> None:
            remaining = [workers]

            def worker_ready() -> None:
                remaining[0] -= 1
                if remaining[0] == 0 and instance.models.get(model_id) is model:
                    instance.on_disk.add(model_id)
                    model.loading = False
                    model.workers = workers
                    self.dispatch(instance, model)

            for _ in range(workers):
                instance.run(self.cost.load_s, worker_ready)

        if delay > 0:
            self.at(self.now + delay, start_workers)
        else:
            start_workers()
        return instance, model

    def maybe_add_worker(self, instance: _Instance, model: _Model) -> None:
        """DJL: on each arrival, one more worker while the queue holds more than twice the batch size and the workers
        (those still starting included) are below the limit (WorkLoadManager.runJob, djl-serving v0.36.0)."""
        if len(model.queue) <= 2 * DJL_BATCH_SIZE:
            return
        if model.workers + model.starting >= self.fleet.worker_limit:
            return
        if instance.make_room(self.cost.worker_memory_mib, keep=model.id) is None:
            return  # no room without evicting a busy model: DJL would fail to start the worker
        instance.memory_free -= self.cost.worker_memory_mib
        model.starting += 1

        def worker_ready() -> None:
            model.starting -= 1
            if instance.models.get(model.id) is model:
                model.workers += 1
                self.dispatch(instance, model)
                if model.busy < model.workers and not model.queue:
                    # a worker that comes up to no work: DJL's idle time starts when the worker does
                    # (TemporaryBatchAggregator's idleSince, djl-serving v0.36.0)
                    self.start_idle_time(instance, model)

        instance.run(self.cost.load_s, worker_ready)

    def dispatch(self, instance: _Instance, model: _Model) -> None:
        while not model.loading and model.queue and model.busy < model.workers:
            request = model.queue.popleft()
            model.busy += 1
            instance.run(self.cost.service_s, functools.partial(self.finish, instance, model, request))

    def finish(self, instance: _Instance, model: _Model, request: _Request) -> None:
        model.busy -= 1
        instance.outstanding -= 1
        latency = self.now - request.arrival
        self.completed += self.in_window(self.now)
        if request.counted:
            self.latencies.append(latency)
            self.last_done = max(self.last_done, self.now)
        self.dispatch(instance, model)
        if model.idle or (model.busy < model.workers and not model.queue):
            self.start_idle_time(instance, model)
        if request.client is not None:
            self.next_request(request.client)

    def start_idle_time(self, instance: _Instance, model: _Model) -> None:
        """A worker of the model has nothing to do from now on: DJL stops one past workers_per_model once it has
        waited max_idle_s."""
        model.idle_since = self.now
        if self.fleet.model_server == "djl" and model.workers > self.fleet.workers_per_model:
            self.at(self.now + self.fleet.max_idle_s, self.retire_worker, instance, model)

    def retire_worker(self, instance: _Instance, model: _Model) -> None:
        """DJL: a worker that has had nothing to do for max_idle_s stops and frees its memory."""
        if instance.models.get(model.id) is not model or model.workers <= self.fleet.workers_per_model:
            return
        if model.busy < model.workers and not model.queue and self.now - model.idle_since >= self.fleet.max_idle_s:
            model.workers -= 1
            instance.memory_free += self.cost.worker_memory_mib

    # --- traffic ------------------------------------------------------------------------------------------------

    def next_request(self, client: int) -> None:
        if self.now < self.window[1]:
            self.arrive(self.pick_model(), client)

    def open_arrivals(self, rate: float, until: float) -> None:
        def arrival() -> None:
            self.arrive(self.pick_model(), None)
            following = self.now + self.random.expovariate(rate)
            if following < until:
                self.at(following, arrival)

        self.at(self.random.expovariate(rate), arrival)

    def prewarm(self) -> None:
        """Start from a steady state: the most requested models already loaded, each with the workers (and, past one
        instance's worth, the instances) its share of an open-loop rate keeps below PREWARM_UTILIZATION."""
        order = sorted(range(self.workload.models), key=lambda m: -self.weights[m])
        rate = self.workload.requests_per_second or 0.0
        per_instance = self.fleet.worker_limit
        for model_id in order:
            busy = rate * self.weights[model_id] * self.cost.service_s / PREWARM_UTILIZATION
            needed = max(self.fleet.workers_per_model, math.ceil(busy))
            replicas = min(len(self.instances), math.ceil(needed / per_instance))
            workers = min(per_instance, max(self.fleet.workers_per_model, math.ceil(needed / replicas)))
            need = self.cost.footprint_mib(workers)
            roomy = sorted((i for i in self.instances if i.memory_free >= need), key=lambda i: -i.memory_free)
            if not roomy:
                return
            for instance in roomy[:replicas]:
                model = _Model(model_id)
                model.loading, model.workers = False, workers
                instance.memory_free -= need
                instance.models[model_id] = model
                instance.models.move_to_end(model_id, last=False)  # popular models were used last: end of the LRU
                instance.on_disk.add(model_id)
                self.holders[model_id].append(instance)

    def run(self, until: float) -> None:
        events = self.events
        while events and events[0][0] <= until:
            time, _, action, args = heapq.heappop(events)
            self.now = time
            action(*args)


def simulate(
    fleet: Fleet,
    cost: ModelCost,
    workload: Workload,
    *,
    duration_s: float,
    warmup_s: float = 0.0,
    prewarm: bool = True,
    seed: int = 0,
) -> Prediction:
    """Run the workload on the fleet and measure ``duration_s`` seconds after ``warmup_s``.

    Open loop: arrivals at ``requests_per_second``; requests that arrive in the window are counted, and the
    simulation runs on until they are answered (or a timeout past the window). ``prewarm`` starts from the most
    requested models already loaded (steady state); without it every instance starts empty.
    Closed loop: ``clients`` send requests from time 0 until ``warmup_s + duration_s``, then finish what they have
    in flight; throughput is over the whole run until the last answer (as a load test measures it).
    """
    if duration_s <= 0 or warmup_s < 0:
        raise ValueError("duration_s must be positive and warmup_s not negative")
    sim = _Simulation(fleet, cost, workload, seed)
    end = warmup_s + duration_s
    sim.window = (warmup_s, end)
    if prewarm:
        sim.prewarm()
    if workload.requests_per_second is not None:
        sim.open_arrivals(workload.requests_per_second, end)
        sim.run(end + SAGEMAKER_TIMEOUT_S)
        elapsed = duration_s
    else:
        for client in range(workload.clients or 0):
            sim.at(0.0, sim.next_request, client)
        sim.run(math.inf)
        elapsed = max(sim.last_done, end) - warmup_s
    answered = [latency for latency in sim.latencies if latency <= SAGEMAKER_TIMEOUT_S]
    served = sim.requests - sim.rejected  # a refused request has no latency: it is an error at once
    latencies = sorted(answered) + [math.inf] * (served - len(answered))
    return Prediction(
        pattern=workload.pattern,
        requests=sim.requests,
        throughput_rps=len(answered) / elapsed,
        hit_ratio=sim.hits / sim.requests if sim.requests else 0.0,
        p50_ms=_percentile(latencies, 0.50) * 1000,
        p99_ms=_percentile(latencies, 0.99) * 1000,
        cold_loads_per_minute=sim.loads / (elapsed / 60),
        loads=sim.loads,
        timeouts=served - len(answered),
        rejected=sim.rejected,
        elapsed_s=elapsed,
        completed=sim.completed,
    )


def _percentile(ordered: Sequence[float], share: float) -> float:
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]
