"""train_sentiment's training with one process killed (SIGKILL, as the kernel's OOM killer or a lost instance would)
right after a given optimizer step: the real script, the real Trainer, a real kill. test_checkpoints.py runs it
under torchrun and alone.

    python tests/training_assets/rank_killer.py --kill-rank 1 --kill-at-step 12 <train_sentiment.py arguments>

Only the first attempt is killed: workers that torchrun restarts (TORCHELASTIC_RESTART_COUNT > 0) run on.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from transformers import TrainerCallback

from training_assets.instance.train_config import parse_args
from training_assets.instance.train_sentiment import end_distributed, train


class KillAt(TrainerCallback):
    def __init__(self, step: int, rank: int) -> None:
        self.step, self.rank = step, rank

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
        if state.global_step == self.step and int(os.environ.get("RANK", "0")) == self.rank and first_attempt:
            print(f"rank_killer: killing rank {self.rank} after step {self.step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, default=0)
    parser.add_argument("--kill-at-step", type=int, default=0, help="0: kill nobody")
    options, rest = parser.parse_known_args(argv)  # the rest: train_sentiment.py's own arguments
    callbacks = [KillAt(options.kill_at_step, options.kill_rank)] if options.kill_at_step else []
    train(parse_args(rest), callbacks=callbacks)
    end_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
