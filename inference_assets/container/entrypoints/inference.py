"""``code/inference.py`` of model.tar.gz: the entry the model server imports; the code is ``code/sentiment_serving``.

The archive's own loader: dependencies vendored for the endpoint's platform by package_model (``code/lib``, no pip
install and no egress at start-up) go first on sys.path, so the pinned versions win over anything the image ships;
numpy is left to the image (torch's ABI). ``code/`` itself is already on the path (the toolkit's PYTHONPATH in
single-model mode; TorchServe adds the handler's folder for every model).
"""

import sys
from pathlib import Path

_VENDORED = Path(__file__).resolve().parent / "lib"
if _VENDORED.is_dir() and str(_VENDORED) not in sys.path:
    sys.path.insert(0, str(_VENDORED))

from sentiment_serving.toolkit_handler import MAX_REQUEST_BATCH_ENV, input_fn, model_fn, output_fn, predict_fn  # noqa: E402

__all__ = ["MAX_REQUEST_BATCH_ENV", "input_fn", "model_fn", "output_fn", "predict_fn"]
