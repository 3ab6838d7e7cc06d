"""A ``serving.properties`` text read back into a dict, as DJL Serving reads it: what the tests compare."""

from __future__ import annotations


def parse_properties(text: str) -> dict[str, str]:
    """Read a ``serving.properties`` text back into a dict (comments and blank lines skipped)."""
    properties = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"serving.properties line {number} is not key=value: {line!r}")
        properties[key.strip()] = value.strip()
    return properties
