"""pytest plugin for mutation runs of modules whose tests call their functions millions of times
(tests/mutation/plan.py): a mutant's worker calls each function of the mutated module directly, the mutant where it is
the one under test and the original everywhere else, instead of through mutmut's trampoline.

mutmut replaces every function of the mutated module with a trampoline that, on each call, reads which mutant is on
(``os.environ``), splits its name and looks the function up: the same answer for the whole life of a mutant's worker,
which runs one mutant. In the sizing simulation's event loop that costs more than the work itself (its fast tests:
~3 CPU-s plain, ~15 CPU-s through the trampolines). Here the worker binds, once before its tests, every method of the
module's classes (and every module-level function, for calls from inside the module) to what the trampoline would
have called; a test file's own reference to a module-level function still goes through the trampoline, to the same
function."""

from __future__ import annotations

import importlib
import types

import pytest
from mutmut.mutation.trampoline import get_mutant_under_test

SEPARATOR = "ǁ"  # mutmut's mangled names: x<sep>Class<sep>method for a method, x_function for a module function


def _bind(module: types.ModuleType, mutant: str) -> None:
    for name, table in list(vars(module).items()):
        if not (name.startswith("mutants_") and name.endswith("__mutmut") and isinstance(table, dict)):
            continue
        mangled = name.removeprefix("mutants_").removesuffix("__mutmut")
        chosen = table.get(mutant, table.get("_mutmut_orig"))
        if not isinstance(chosen, types.FunctionType):
            continue
        if mangled.startswith("x" + SEPARATOR):
            class_name, method = mangled.split(SEPARATOR)[1:3]
            owner = getattr(module, class_name, None)
            current = vars(owner).get(method) if isinstance(owner, type) else None
            # only a plain trampoline (a classmethod's or staticmethod's wrapper stays as it is)
            if isinstance(current, types.FunctionType) and hasattr(current, "__wrapped__"):
                setattr(owner, method, chosen)
        elif mangled.startswith("x_"):
            function = mangled.removeprefix("x_")
            current = vars(module).get(function)
            if isinstance(current, types.FunctionType) and hasattr(current, "__wrapped__"):
                setattr(module, function, chosen)


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    under_test = get_mutant_under_test()
    if "__mutmut_" not in under_test:  # mutmut's own runs (stats, clean, forced fail) keep the trampolines
        return
    module_name, _, mutant = under_test.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:  # forked_baseline.py's mutant of no module: every trampoline runs the original anyway
        return
    _bind(module, mutant)
