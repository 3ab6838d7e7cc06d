"""``mutmut run`` that first runs the unmutated code's tests in a forked worker, as every mutant's run is, and refuses
the run if they fail there (tests/mutation/plan.py runs mutmut through this file).

mutmut runs its clean tests in its own process, never in a forked worker; a worker that cannot run the tests at all
(a jsii object its kernel does not know, say) fails every mutant's tests, which mutmut reads as every mutant killed:
a perfect score. Here the baseline goes through mutmut's own runner (``ForkRunner.submit``: the fork, the plugins'
fork hooks, the CPU limit) under the name of a mutant of no module, for which every function runs unmutated."""

from __future__ import annotations

import signal
import sys
from math import ceil
from typing import Any

from mutmut import __main__ as mutmut_main
from mutmut.configuration import config
from mutmut.state import state

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


_original_tests_for_mutant_names = mutmut_main.tests_for_mutant_names
_original_run_forced_fail_test = mutmut_main.run_forced_fail_test
mutmut_main.tests_for_mutant_names = _tests_for_mutant_names
mutmut_main.run_forced_fail_test = _run_forced_fail_test

if __name__ == "__main__":
    sys.exit(mutmut_main.cli())
