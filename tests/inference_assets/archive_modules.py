"""Modules imported from an unpacked model archive, dropped again so that the next test imports its own copies."""

from __future__ import annotations

import sys


def forget_modules(*roots: str) -> None:
    """Drop every imported module that is one of ``roots`` or inside one of them."""
    for name in list(sys.modules):
        if name.split(".")[0] in roots:
            del sys.modules[name]
