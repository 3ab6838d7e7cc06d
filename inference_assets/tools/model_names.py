"""What a model name on the multi-model endpoint may be: an S3 key under the models prefix and a ``TargetModel``.

One rule for the publishing tool, the settings (``invoke_allowed_models``) and the stack's invoke grant.
"""

from __future__ import annotations

import re

ARCHIVE_SUFFIX = ".tar.gz"
MAX_KEY_BYTES = 1024  # S3 keys and InvokeEndpoint's TargetModel both stop at 1,024
# Path segments of letters, digits, '.', '_' and '-' that start with a letter or digit; no spaces, no '..'.
_NAME = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)*[A-Za-z0-9][A-Za-z0-9._-]*\.tar\.gz$")
_PREFIX = re.compile(r"^[A-Za-z0-9._/-]+/$")


def validate_model_name(name: str, prefix: str = "") -> str:
    """Return ``name`` if it is a valid ``TargetModel`` (a ``.tar.gz`` key under ``prefix``); else raise ValueError."""
    if not isinstance(name, str) or not _NAME.match(name) or "/../" in f"/{name}" or "/./" in f"/{name}":
        raise ValueError(
            f"model name {name!r} is not valid: use letters, digits, '.', '_', '-' (and '/' between parts), "
            f"start each part with a letter or digit, and end with {ARCHIVE_SUFFIX}, e.g. sentiment-0001.tar.gz"
        )
    if len((prefix + name).encode()) > MAX_KEY_BYTES:
        raise ValueError(f"model name {name!r} makes the S3 key longer than {MAX_KEY_BYTES} bytes")
    return name


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is empty or a relative S3 prefix ending in '/'; else raise ValueError."""
    if prefix and (prefix.startswith("/") or not _PREFIX.match(prefix)):
        raise ValueError(f"prefix {prefix!r} must be a relative S3 prefix of letters, digits and ._/- ending in '/'")
    return prefix
