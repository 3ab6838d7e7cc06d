"""``model.py`` of model.tar.gz: DJL Serving's Python-engine entry point (``option.entryPoint=model.py``).

The archive's own loader: DJL puts only the model directory on sys.path, so this adds ``code/`` (the
``sentiment_serving`` package) and ``code/lib`` (dependencies vendored by package_model; no pip install, no egress).
"""

import sys
from pathlib import Path

_CODE = Path(__file__).resolve().parent / "code"
for _path in (_CODE, _CODE / "lib"):
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from sentiment_serving.djl_adapter import handle  # noqa: E402

__all__ = ["handle"]
