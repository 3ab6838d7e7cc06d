"""The archives the local TorchServe harness serves: the serving package's shared modules (``package_model`` with
``server=None``), TorchServe's manifest and the handler (``inference.py`` beside this file) as ``code/inference.py``.

    python -m proving_ground.torchserve_mme.archive --model-dir saved_model --output sentiment.tar.gz
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inference_assets.tools import package_model

HANDLER = Path(__file__).resolve().parent / "inference.py"
# TorchServe uses a model directory's manifest handler instead of the toolkit's default service handler
# (ModelManager.java createModelArchive, TorchServe 0.12); "1.0" is the version the toolkit's per-model batch
# settings are written under. createdOn is fixed so that the archive stays reproducible.
MANIFEST = {
    "createdOn": "01/01/2026 00:00:00",
    "runtime": "python",
    "model": {"modelName": "model", "handler": "code/inference.py:handle", "modelVersion": "1.0"},
    "archiverVersion": "0.12.0",
}


def build_archive(model_dir: Path, output: Path) -> Path:
    """Write ``output``: ``model_dir``'s files, ``MAR-INF/MANIFEST.json``, ``code/inference.py`` and the shared
    modules of the serving package in ``code/sentiment_serving`` (no Ray Serve code, no DJL adapter)."""
    entries: dict[str, Path | bytes] = {
        "MAR-INF/MANIFEST.json": (json.dumps(MANIFEST, indent=2) + "\n").encode(),
        "code/inference.py": HANDLER,
    }
    return package_model.build_model_archive(model_dir, output, extra_files=entries, server=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="saved model + tokenizer (save_pretrained)")
    parser.add_argument("--output", type=Path, required=True, help="archive to write, e.g. sentiment.tar.gz")
    args = parser.parse_args(argv)
    try:
        print(build_archive(args.model_dir, args.output))
    except package_model.PackagingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
