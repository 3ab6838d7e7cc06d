"""``code/inference.py`` of model.tar.gz: TorchServe's handler entry (``MAR-INF/MANIFEST.json`` names
``code/inference.py:handle``); the code is the ``code/sentiment_serving`` package.

The archive's own loader: dependencies vendored for the endpoint's platform by package_model (``code/lib``, no pip
install and no egress at start-up) go first on sys.path, so the pinned versions win over anything the image ships;
numpy is left to the image (torch's ABI). ``code/`` itself is already on the path (TorchServe adds the handler's
folder to every worker's PYTHONPATH; the toolkit adds it too in single-model mode).
"""

import sys
from pathlib import Path

_VENDORED = Path(__file__).resolve().parent / "lib"
if _VENDORED.is_dir() and str(_VENDORED) not in sys.path:
    sys.path.insert(0, str(_VENDORED))

from sentiment_serving.torchserve_handler import handle  # noqa: E402

__all__ = ["handle"]
