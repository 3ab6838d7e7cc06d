"""The fleet model's placement rules on a hand-built fleet, each with its known answer (the module docstring of
mme_sizing/simulation.py states them): which models a load or a new worker may evict and how many, where a model's
requests go and when they spill to another instance, where a load goes when its instance is full, and DJL's
worker count while workers start. Mutation testing (docs/testing.md) found these rules unchecked by the end-to-end
fixtures, whose traffic never builds these states."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from mme_sizing.simulation import Fleet, ModelCost, Workload, _Instance, _Model, _Request, _Simulation, simulate

COST = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.5)


def _simulation(*, instances: int = 1, memory_mib: float = 300, vcpus: int = 2, max_workers: int | None = None,
                workers_per_model: int = 1) -> _Simulation:  # fmt: skip
    fleet = Fleet(instances=instances, vcpus=vcpus, memory_mib=memory_mib, max_workers_per_model=max_workers,
                  workers_per_model=workers_per_model)  # fmt: skip
    return _Simulation(fleet, COST, Workload("uniform", models=20, requests_per_second=1.0), seed=0)


def _place(sim: _Simulation, instance: _Instance, model_id: int, *, workers: int = 1, **state: Any) -> _Model:
    """A loaded model on ``instance`` (most recently used so far), with ``state`` set (busy, queue, ...)."""
    model = _Model(model_id)
    model.loading, model.workers = False, workers
    for name, value in state.items():
        setattr(model, name, value)
    instance.memory_free -= COST.footprint_mib(workers)
    instance.models[model_id] = model
    sim.holders[model_id].append(instance)
    return model


def _requests(count: int) -> deque[_Request]:
    return deque(_Request(0.0, None, False) for _ in range(count))


# --- make_room: idle models only, least recently used first, only as many as the room needs -----------------------

WORK = {"loading": True, "busy": 1, "queue": "one request", "in front": 1, "starting a worker": 1}


@pytest.mark.parametrize("work", list(WORK))
def test_a_model_with_work_of_any_kind_is_never_evicted(work: str) -> None:
    sim = _simulation()
    (instance,) = sim.instances
    value = _requests(1) if work == "queue" else WORK[work]
    busy = _place(sim, instance, 0, **{work.split()[0] if work != "in front" else "in_front": value})
    _place(sim, instance, 1)
    _place(sim, instance, 2)
    assert instance.make_room(100, keep=99) == 1
    assert list(instance.models) == [0, 2] and instance.models[0] is busy  # model 1, the oldest idle one, went
    assert instance.memory_free == 100


def test_a_load_evicts_as_many_idle_models_as_its_room_needs_and_no_more() -> None:
    sim = _simulation(memory_mib=450)  # 50 MiB free once the four models are in
    (instance,) = sim.instances
    for model_id in range(4):
        _place(sim, instance, model_id)
    assert instance.make_room(250, keep=99) == 2  # 50 + 100 + 100
    assert list(instance.models) == [2, 3] and instance.memory_free == 250
    assert instance.make_room(200, keep=99) == 0  # it fits now


def test_the_model_being_kept_is_not_evicted_and_nothing_is_when_the_idle_ones_are_not_enough() -> None:
    sim = _simulation()
    (instance,) = sim.instances
    _place(sim, instance, 0)
    _place(sim, instance, 1, busy=1)
    _place(sim, instance, 2)
    assert instance.make_room(100, keep=0) == 1 and list(instance.models) == [0, 1]
    assert instance.make_room(300, keep=0) is None and list(instance.models) == [0, 1]  # model 0 alone: 200 free


# --- route: the holder with the fewest of the model's requests, spilling past twice the worker limit --------------


def _held_by(sim: _Simulation, holders: list[int], outstanding: list[int], model_id: int = 0) -> None:
    """``model_id`` on the instances ``holders``, each with ``outstanding`` requests of it."""
    for index, count in zip(holders, outstanding, strict=True):
        instance = sim.instances[index]
        _place(sim, instance, model_id, queue=_requests(count))
        instance.outstanding += count


def test_requests_go_to_the_holder_with_the_fewest_of_the_models_requests() -> None:
    sim = _simulation(instances=3)
    _held_by(sim, [0, 1], [3, 2])
    sim.instances[1].outstanding += 8  # busier with other models' requests: the model's own count decides
    assert sim.route(0) is sim.instances[1]
    sim.instances[1].models[0].queue.append(_Request(0.0, None, False))  # 3 each: the less busy instance
    assert sim.route(0) is sim.instances[0]


@pytest.mark.parametrize(("outstanding", "spills"), [(3, False), (4, False), (5, True), (6, True)])
def test_a_models_requests_spill_once_its_holder_has_more_than_twice_the_worker_limit(
    outstanding: int, spills: bool
) -> None:
    sim = _simulation(instances=2)  # worker limit: 2 (DJL's default, the vCPUs)
    assert sim.fleet.worker_limit == 2
    _held_by(sim, [0], [outstanding])
    assert sim.route(0) is sim.instances[1 if spills else 0]


def test_a_spill_goes_to_the_least_busy_instance_without_the_model_then_the_one_with_most_memory_free() -> None:
    sim = _simulation(instances=5, memory_mib=1000)
    _held_by(sim, [0, 1], [5, 6])
    sim.instances[1].outstanding -= 5  # a holder that is the least busy instance of all: not a spill target
    sim.instances[2].outstanding, sim.instances[3].outstanding, sim.instances[4].outstanding = 2, 1, 1
    sim.instances[3].memory_free -= 200
    assert sim.route(0) is sim.instances[4]
    sim.instances[4].outstanding = 3
    assert sim.route(0) is sim.instances[3]


def test_when_every_instance_holds_the_model_its_requests_stay_with_the_least_loaded_holder() -> None:
    sim = _simulation(instances=2)
    _held_by(sim, [0, 1], [9, 7])
    assert sim.route(0) is sim.instances[1]


def test_a_model_nobody_holds_goes_to_the_least_busy_instance_then_the_one_with_most_memory_free() -> None:
    sim = _simulation(instances=3, memory_mib=1000)
    sim.instances[0].outstanding, sim.instances[1].outstanding, sim.instances[2].outstanding = 1, 0, 0
    sim.instances[1].memory_free = 500
    assert sim.route(7) is sim.instances[2]


# --- load: on the chosen instance, else on the least busy one that can make room ----------------------------------


def test_a_load_that_finds_its_instance_full_of_busy_models_goes_to_the_least_busy_instance_with_room() -> None:
    sim = _simulation(instances=4, memory_mib=200)  # room for two models each
    full, far, near, roomy = sim.instances
    for model_id in (10, 11):
        _place(sim, full, model_id, busy=1)
    for model_id in (12, 14):
        _place(sim, far, model_id)  # full, of idle models: room can be made
    _place(sim, near, 13)
    far.outstanding, near.outstanding, roomy.outstanding = 2, 1, 1
    placed = sim.load(full, 7)  # near and roomy are as busy: roomy has more memory free
    assert placed is not None and placed[0] is roomy and placed[1] is roomy.models[7]
    assert list(full.models) == [10, 11] and sim.holders[7] == [roomy] and roomy.memory_free == 100
    roomy.outstanding = 2
    placed = sim.load(full, 8)  # now near is the least busy
    assert placed is not None and placed[0] is near and list(far.models) == [12, 14]
    _place(sim, roomy, 15)
    for instance in sim.instances:
        for model in instance.models.values():
            model.busy = 1
    assert sim.load(full, 9) is None  # nowhere to make room: refused, nothing evicted
    assert [len(instance.models) for instance in sim.instances] == [2, 2, 2, 2]


# --- DJL's workers while they start ------------------------------------------------------------------------------


def test_a_started_worker_counts_until_it_is_ready_and_then_as_a_worker() -> None:
    sim = _simulation(memory_mib=1000, max_workers=3)
    (instance,) = sim.instances
    model = _place(sim, instance, 0, queue=_requests(4))
    instance.outstanding = 4
    sim.maybe_add_worker(instance, model)
    assert (model.workers, model.starting, instance.memory_free) == (1, 1, 800)
    sim.run(COST.load_s)  # ready: it takes a request at once
    assert (model.workers, model.starting, model.busy) == (2, 0, 2)
    model.queue.extend(_requests(3))
    sim.maybe_add_worker(instance, model)
    assert (model.workers, model.starting) == (2, 1)  # 2 + 1 starting: the limit
    sim.maybe_add_worker(instance, model)
    assert model.starting == 1 and instance.memory_free == 700


def test_an_extra_worker_idle_for_max_idle_s_stops_once_and_frees_its_memory_once() -> None:
    """DJL retires a worker idle for max_idle_s, one per idle spell, never below workers_per_model (1 here); not one
    that got work again or was used since, and nothing of a model evicted meanwhile (its memory went with it)."""
    sim = _simulation(memory_mib=5000, max_workers=3)
    (instance,) = sim.instances
    idle = sim.fleet.max_idle_s
    evicted = _place(sim, instance, 0, workers=2, busy=1)  # the least recently used: evicted first
    twice = _place(sim, instance, 1, workers=2, busy=2)  # two idle spells begin, one worker to spare
    three = _place(sim, instance, 2, workers=3, busy=1)
    busy_again = _place(sim, instance, 3, workers=2, busy=1)
    used_since = _place(sim, instance, 4, workers=2, busy=2)
    instance.outstanding = 7
    for model in (evicted, twice, twice, three, busy_again, used_since):
        sim.finish(instance, model, _Request(0.0, None, False))  # each schedules a retirement at max_idle_s
    sim.at(idle / 2, sim.finish, instance, used_since, _Request(0.0, None, False))  # idle from then on
    assert instance.make_room(instance.memory_free + COST.footprint_mib(2), keep=99) == 1
    busy_again.busy = 2  # both its workers took requests again before the retirement
    before = instance.memory_free
    sim.run(idle - 1)
    assert [m.workers for m in (twice, three, busy_again, used_since)] == [2, 3, 2, 2]
    sim.run(idle)
    assert [m.workers for m in (twice, three, busy_again, used_since)] == [1, 2, 2, 2]
    assert instance.memory_free == before + 2 * COST.worker_memory_mib and list(instance.models) == [1, 2, 3, 4]
    sim.run(idle * 1.5)
    assert used_since.workers == 1 and instance.memory_free == before + 3 * COST.worker_memory_mib


# --- a request's way in: the front end, then the model's queue; the instance counts what it holds ----------------


def test_a_request_spends_the_front_ends_time_before_it_queues_and_the_instance_counts_it_until_answered() -> None:
    cost = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.5, frontend_s=0.25)
    fleet = Fleet(instances=1, vcpus=2, memory_mib=300, workers_per_model=1)
    sim = _Simulation(fleet, cost, Workload("uniform", models=20, requests_per_second=1.0), seed=0)
    (instance,) = sim.instances
    model = _place(sim, instance, 0)
    for _ in range(2):
        sim.arrive(0, None)
    assert (model.in_front, len(model.queue), instance.outstanding) == (2, 0, 2)
    sim.run(0.25)  # both front ends done at once (two cores): one request in the worker, one queued
    assert (model.in_front, model.busy, len(model.queue), instance.outstanding) == (0, 1, 1, 2)
    sim.run(10.0)
    assert (model.in_front, model.busy, instance.outstanding) == (0, 0, 0)
    assert sim.latencies == [0.75, 1.25]  # the front end's 0.25 s, then 0.5 s each in the one worker


@pytest.mark.parametrize(
    ("server", "loading", "starting"), [("djl", False, 1), ("djl", True, 0), ("torchserve", False, 0)]
)
def test_only_djl_starts_a_worker_for_a_long_queue_and_only_once_the_model_is_loaded(
    server: str, loading: bool, starting: int
) -> None:
    fleet = Fleet(instances=1, vcpus=2, memory_mib=1000, model_server=server, workers_per_model=1)  # type: ignore[arg-type]
    sim = _Simulation(fleet, COST, Workload("uniform", models=20, requests_per_second=1.0), seed=0)
    (instance,) = sim.instances
    model = _place(sim, instance, 0, queue=_requests(3), busy=1, loading=loading)
    instance.outstanding = 4
    sim.enqueue(instance, model, _Request(0.0, None, False), from_front=False)  # four waiting: more than twice one
    assert (model.workers, model.starting) == (1, starting)


def test_requests_of_the_warm_up_are_not_counted_as_hits() -> None:
    """Every model loaded from the start: each request of the window hits, and the ratio is exactly one."""
    fleet = Fleet(instances=1, vcpus=4, memory_mib=10 * COST.footprint_mib(1), model_server="djl")
    prediction = simulate(fleet, COST, Workload("uniform", 5, requests_per_second=4.0), duration_s=5, warmup_s=5)
    assert prediction.requests > 0 and prediction.hit_ratio == 1.0


def test_a_worker_idle_for_max_idle_s_stops_while_the_models_other_worker_is_still_busy() -> None:
    """DJL's idle time is a worker's own: one worker free since its last request stops after max_idle_s even though
    the model's other worker is busy all along (a long request here), not only once the whole model is idle."""
    sim = _simulation(memory_mib=1000, max_workers=3)
    (instance,) = sim.instances
    model = _place(sim, instance, 0, workers=2, busy=2)
    instance.outstanding = 2
    sim.at(10.0, sim.finish, instance, model, _Request(0.0, None, False))  # one worker free from 10 s on
    before = instance.memory_free
    sim.run(10.0 + sim.fleet.max_idle_s - 1)
    assert (model.workers, model.busy) == (2, 1)
    sim.run(10.0 + sim.fleet.max_idle_s)
    assert (model.workers, model.busy) == (1, 1) and instance.memory_free == before + COST.worker_memory_mib


def test_a_refused_client_of_a_closed_loop_sends_its_next_request_at_once_and_keeps_sending() -> None:
    """Closed loop: each client has one request in flight at every moment of the window, a refused one included
    (it is answered an error at once and sends the next). One instance with room for one model: a client whose
    model is not the one loaded is refused while the loaded one has work."""
    fleet = Fleet(instances=1, vcpus=2, memory_mib=150)
    sim = _Simulation(fleet, COST, Workload("uniform", models=3, clients=4), seed=0)
    sim.window = (0.0, 100.0)
    for client in range(4):
        sim.at(0.0, sim.next_request, client)
    for until in (25.0, 50.0, 99.0):
        sim.run(until)
        (instance,) = sim.instances
        assert instance.outstanding == 4
    assert sim.rejected > 10


def test_a_worker_that_comes_up_after_its_burst_is_answered_stops_max_idle_s_after_it_is_ready() -> None:
    """DJL starts a worker for a queue longer than two; when the model's first worker has answered the queue before
    the new one is ready, no request comes to restart an idle time: the new worker's own starts when it is ready."""
    cost = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.1)
    fleet = Fleet(instances=1, vcpus=2, memory_mib=1000, max_workers_per_model=3)
    sim = _Simulation(fleet, cost, Workload("uniform", models=20, requests_per_second=1.0), seed=0)
    (instance,) = sim.instances
    model = _place(sim, instance, 0)
    instance.outstanding = 4
    for _ in range(4):
        sim.enqueue(instance, model, _Request(0.0, None, False), from_front=False)
    assert (model.workers, model.starting, instance.memory_free) == (1, 1, 800)
    sim.run(1.0)  # the one worker answered all four (0.4 s); the new one is ready at 2 s
    assert (model.busy, len(model.queue), instance.outstanding, model.workers) == (0, 0, 0, 1)
    sim.run(2.0 + fleet.max_idle_s - 1)
    assert model.workers == 2
    sim.run(2.0 + fleet.max_idle_s + 1)
    assert (model.workers, instance.memory_free) == (1, 900)


# --- a load in progress ------------------------------------------------------------------------------------------


def test_a_model_is_loading_from_the_moment_its_load_starts_until_its_worker_is_ready() -> None:
    """While its model downloads and loads, a request is no hit and waits; the model is not evicted for another."""
    sim = _simulation(memory_mib=COST.footprint_mib(1))  # room for one model
    (instance,) = sim.instances
    for _ in range(2):
        sim.arrive(0, None)  # cold: the first starts the load, the second arrives during it
    assert sim.hits == 0 and sim.load(instance, 1) is None  # the loading model keeps its room
    sim.run(10.0)
    assert sim.hits == 0 and sim.latencies == [3.5, 4.0]  # 1 s download, 2 s load, then 0.5 s each in one worker
    assert sim.load(instance, 1) is not None and list(instance.models) == [1]  # idle now: evicted
