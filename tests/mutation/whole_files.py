"""pytest plugin for mutation runs of modules whose tests build what they check in module-scoped fixtures
(tests/mutation/plan.py): a mutant's worker runs every test of the files that hold the tests mutmut chose for it.

mutmut runs, for each mutant, the tests that called the mutated function while it ran them all once. A module-scoped
fixture runs during the first test that asks for it, so mutmut counts its calls for that test only: a construct's
statements built in a ``template`` fixture would be checked by the file's first test alone, and every mutant that only
the policy tests after it can see would survive unseen."""

from __future__ import annotations

import pytest
from mutmut.mutation.trampoline import get_mutant_under_test


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    if "__mutmut_" not in get_mutant_under_test():  # mutmut's own runs (stats, clean, forced fail) stay as asked
        return
    files = dict.fromkeys(arg.split("::")[0] for arg in args if "::" in arg)
    args[:] = [arg for arg in args if "::" not in arg] + list(files)
