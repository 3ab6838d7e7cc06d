"""pytest plugin for mutation runs of modules whose tests read some environments of the session's synthesized app
(``cloud_assembly``/``templates`` in tests/conftest.py): the app synthesizes only those, named comma-separated in
``MUTATE_ENVIRONMENTS`` (tests/mutation/plan.py sets it from the plan), as ``cdk synth -c env=<names>`` does.

Every mutant's worker runs its tests in a pytest session of its own, whose session fixture synthesizes the whole app
again: every environment, through the compliance gates. The ``env`` context key is the app's own selection (app.py:
every environment's settings are still validated; the stages synthesized, each through the same gates, are the ones
named), so a mutant that breaks a named environment's synth or its gates still fails its tests. A test that reads
another environment fails (a missing key of ``templates``), and tests/mutation/forked_baseline.py then refuses the run
before any mutant is read."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

SELECTION = "MUTATE_ENVIRONMENTS"
# aws-cdk-lib's own CloudFormation schema check, whose findings are warnings that never fail synth (tests/conftest.py,
# WITHOUT_BUILTIN_VALIDATION): no test of a mutation run reads its report, so it can kill no mutant (~3 CPU-s a worker).
WITHOUT_BUILTIN_VALIDATION = {"builtin_cloud_formation_validation": False}


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    selection = os.environ.get(SELECTION)
    if fixturedef.argname != "cloud_assembly" or not selection:
        return (yield)
    import app  # the fixture imports build_app from it when it runs

    build_app = app.build_app

    def build_selected(**props: Any) -> Any:
        context = {**props.get("context", {}), "env": selection}
        return build_app(**{**props, "context": context, **WITHOUT_BUILTIN_VALIDATION})

    app.build_app = build_selected
    try:
        return (yield)
    finally:
        app.build_app = build_app
