"""``mutmut run`` that first runs the unmutated code's tests in a forked worker, as every mutant's run is, and refuses
the run if they fail there (tests/mutation/plan.py runs mutmut through this file); and whose wall-clock limit on a
mutant's worker counts only the time the worker could have run.

mutmut runs its clean tests in its own process, never in a forked worker; a worker that cannot run the tests at all
(a jsii object its kernel does not know, say) fails every mutant's tests, which mutmut reads as every mutant killed:
a perfect score. Here the baseline goes through mutmut's own runner (``ForkRunner.submit``: the fork, the plugins'
fork hooks, the CPU limit) under the name of a mutant of no module, for which every function runs unmutated.

mutmut ends a worker past a wall-clock limit too, (estimated time + timeout_constant) x timeout_multiplier, and
reads it as a timeout, which the score counts as killed. At nice 19 beside other work a worker waits for a core most
of the time: the first full run of simulation.py (multiplier 1) read 7 of its first 60 mutants as timeouts, at load
9, mutants that its tests, run alone, pass or fail in seconds. Here the limit leaves out the time the worker waited
for a core (its ``run_delay``, /proc/<pid>/schedstat: https://docs.kernel.org/scheduler/sched-stats.html) and the
time this whole run was stopped (a SIGSTOP while the machine measures something else: seen as a gap in a watcher's
one-second ticks). A worker that spins is still ended by its CPU limit, and one that waits for ever (a future never
set) by the wall-clock limit, as before."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from math import ceil
from pathlib import Path
from typing import Any

from mutmut import __main__ as mutmut_main
from mutmut.configuration import config
from mutmut.state import state
from mutmut.workers import isolation

# module "unmutated_baseline" is no module's name: the trampolines run the originals; "__mutmut_" in it makes the
# whole_files.py plugin treat it as a mutant's worker
BASELINE = "unmutated_baseline.x__mutmut_0"
_SELECTED: list[set[str]] = []


def _tests_for_mutant_names(mutant_names: tuple[str, ...] | list[str]) -> set[str]:
    tests = _original_tests_for_mutant_names(mutant_names)
    _SELECTED.append(tests)
    return tests


def _run_forced_fail_test(runner: Any) -> None:
    _original_run_forced_fail_test(runner)
    # the tests of the mutants asked for (mutmut's clean run takes the same), or every test that covers a mutant
    covering = state().tests_by_mangled_function_name.values()
    tests = _SELECTED[-1] if _SELECTED and _SELECTED[-1] else set().union(*covering)
    estimate = sum(state().duration_by_test[test] for test in tests)
    cpu_limit = ceil((estimate + config().timeout_constant) * config().timeout_multiplier * 2)
    runner.submit(BASELINE, sorted(tests), cpu_limit, estimate)
    result = runner.wait_for_result()
    if result.exit_code == -signal.SIGXCPU:  # mutmut's CPU or wall-clock limit (mutmut/workers/timeout.py)
        print(f"Refused: the unmutated code's tests ran past mutmut's time limit in a forked worker "
              f"({result.duration:.0f} s), so every mutant would read as a timeout, counted as killed; rerun when the "
              "cores are less busy.")  # fmt: skip
        raise SystemExit(1)
    if result.exit_code != 0:
        print(f"Refused: the unmutated code's tests fail in a forked worker (exit code {result.exit_code}), so every "
              "mutant would read as killed; run them in a fork with mutmut's debug = true to see why.")  # fmt: skip
        raise SystemExit(1)
    print(f"    the unmutated code's tests pass in a forked worker ({result.duration:.0f} s)")


TICK_S = 1.0
STOPPED_GAP_S = 5.0  # a tick this much late: the run was stopped (or starved: the limits then only grow)


class _Watcher:
    """Each worker's wall-clock limit, less the time it waited for a core and the time the run was stopped."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.workers: dict[int, tuple[float, float]] = {}  # pid -> (started, allowed seconds)
        self.stopped_s = 0.0  # the run's stopped time so far
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, name="wall-clock-limit", daemon=True).start()

    def add(self, pid: int, timeout_s: float) -> None:
        with self.lock:
            self.workers[pid] = (time.monotonic() - self.stopped_s, timeout_s)

    def _watch(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            if now - last > TICK_S + STOPPED_GAP_S:
                self.stopped_s += now - last - TICK_S
            last = now
            with self.lock:
                for pid, (started, allowed) in list(self.workers.items()):
                    waited = _waited_for_a_core(pid, self.owner)
                    if waited is None:  # ended (and reaped, or not this run's worker any more)
                        del self.workers[pid]
                    elif now - self.stopped_s - started - waited > allowed:
                        del self.workers[pid]
                        os.kill(pid, signal.SIGXCPU)  # what mutmut sends (mutmut/workers/timeout.py)


def _waited_for_a_core(pid: int, parent: int) -> float | None:
    """Seconds the worker waited on a run queue, or None when ``pid`` is no longer a worker of ``parent``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
            return None
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


_WATCHERS: dict[int, _Watcher] = {}  # a watcher per process that forks workers (its thread does not survive a fork)


def _register_timeout(pid: int, timeout_s: float) -> None:
    watcher = _WATCHERS.get(os.getpid())
    if watcher is None:
        watcher = _WATCHERS[os.getpid()] = _Watcher()
    watcher.add(pid, timeout_s)


isolation.register_timeout = _register_timeout
_original_tests_for_mutant_names = mutmut_main.tests_for_mutant_names
_original_run_forced_fail_test = mutmut_main.run_forced_fail_test
mutmut_main.tests_for_mutant_names = _tests_for_mutant_names
mutmut_main.run_forced_fail_test = _run_forced_fail_test

if __name__ == "__main__":
    sys.exit(mutmut_main.cli())
