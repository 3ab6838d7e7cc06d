"""What a custom resource's handler answers CloudFormation, captured instead of sent (the PUT to the pre-signed
response URL that every handler makes through its module's urllib)."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest


def capture_answers(monkeypatch: pytest.MonkeyPatch, handler: ModuleType) -> list[dict[str, Any]]:
    """Replace ``handler``'s urlopen; the returned list receives every answer document the handler sends."""
    sent: list[dict[str, Any]] = []

    class _Response:
        status = 200

        def __enter__(self):
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def urlopen(request, timeout: float):
        assert request.method == "PUT" and request.full_url.startswith("https://")
        sent.append(json.loads(request.data))
        return _Response()

    monkeypatch.setattr(handler.urllib.request, "urlopen", urlopen)
    return sent
