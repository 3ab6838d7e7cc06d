"""train_sentiment's training with every rank recording the shape of each training batch it runs: the real script,
the real Trainer and sampler. test_many_ranks.py runs it under torchrun and alone.

    python tests/training_assets/rank_recorder.py --record-dir DIR <train_sentiment.py arguments>

Each process writes ``DIR/rank-<RANK>.json``: the (batch, padded length) of every optimizer step, in order; with
``--padding packed`` also ``DIR/rank-<RANK>.rows.json``: the rows each training batch's texts pack into by themselves
(before the collator adds the rows the other ranks' batches of the step need).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from training_assets.instance.batching import TokenCounter
from training_assets.instance.packing import PackingCollator, pack_rows
from training_assets.instance.train_config import parse_args
from training_assets.instance.train_sentiment import end_distributed, train

SHAPES: list[list[int]] = []
OWN_ROWS: list[int] = []


def _recording(add: Any) -> Any:
    def recorded(self: TokenCounter, *args: Any, **kwargs: Any) -> None:
        add(self, *args, **kwargs)
        SHAPES.append(list(self.shapes[-1]))  # the counter sees every training batch, once, on its own rank

    return recorded


def _counting_rows(collate: Any) -> Any:
    def counted(self: PackingCollator, rows: list[dict[str, Any]]) -> dict[str, Any]:
        OWN_ROWS.append(len(pack_rows([len(row["input_ids"]) for row in rows], self.width)))
        return collate(self, rows)

    return counted


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record-dir", type=Path, required=True)
    options, rest = parser.parse_known_args(argv)  # the rest: train_sentiment.py's own arguments
    TokenCounter.add = _recording(TokenCounter.add)  # type: ignore[method-assign]
    PackingCollator.__call__ = _counting_rows(PackingCollator.__call__)  # type: ignore[method-assign]
    train(parse_args(rest))
    options.record_dir.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    (options.record_dir / f"rank-{rank}.json").write_text(json.dumps(SHAPES))
    if OWN_ROWS:  # the loader collates training batches only with the packing collator, in order (no workers)
        (options.record_dir / f"rank-{rank}.rows.json").write_text(json.dumps(OWN_ROWS))
    end_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
