"""The exports of a synthesized template, for tests that resolve another stack's Fn::ImportValue."""

from __future__ import annotations

import contextlib
from typing import Any

from ops_review.iam_policy import resolve


def template_exports(template: dict[str, Any], refs: dict[str, Any]) -> dict[str, Any]:
    """The template's exports whose values ``refs`` can resolve (importing any other one raises KeyError)."""
    exports = {}
    for output in template.get("Outputs", {}).values():
        if "Export" in output:
            with contextlib.suppress(KeyError):
                exports[resolve(output["Export"]["Name"], refs=refs)] = resolve(output["Value"], refs=refs)
    return exports
