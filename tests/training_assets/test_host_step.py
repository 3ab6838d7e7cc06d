"""Host work off the step (issue 39, item 4): without the Trainer's per-step ``model.train()`` and ``model.zero_grad()``
module walks, a run trains exactly as with them: the same loss at every step with dropout on (a model left in eval
mode after an evaluation would train without dropout and log other losses; gradients not cleared would accumulate).
The model is compiled (TorchDynamo with the aot_eager backend: no code generation), so the train loop steps the
compiled wrapper while the Trainer's evaluation switches the model inside it to eval mode, as DDP's would."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedModel

from training_assets.instance.train_config import TrainConfig
from training_assets.instance.train_sentiment import train

EPOCHS = 2
BATCH = 80
STEPS = EPOCHS * (240 // BATCH)  # the sample data's 240 train rows


def _run(model: Path, data: Path, output: Path, lean: bool, walks: Counter[bool]) -> dict[str, Any]:
    walks.clear()
    return train(TrainConfig(model=str(model), dataset=str(data), output_dir=str(output), use_cpu=True, epochs=EPOCHS,
                             per_device_batch_size=BATCH, learning_rate=5e-3, max_seq_length=32, logging_steps=1,
                             torch_compile=True, lean_host_step=lean))  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("compile_without_codegen")
def test_the_lean_step_trains_as_the_trainers_and_sets_the_mode_only_when_it_changes(
    tiny_model_dir: Path, sample_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: Counter[bool] = Counter()  # train(mode) calls on the classifier: each walks every submodule
    original = PreTrainedModel.train

    def counted(self: PreTrainedModel, mode: bool = True) -> Any:
        if self.base_model is not self:  # the classifier, not the encoder inside it that its walk reaches
            walks[mode] += 1
        return original(self, mode)

    monkeypatch.setattr(PreTrainedModel, "train", counted)
    trainers = _run(tiny_model_dir, sample_data, tmp_path / "trainer", lean=False, walks=walks)
    trainer_walks = Counter(walks)
    lean = _run(tiny_model_dir, sample_data, tmp_path / "lean", lean=True, walks=walks)
    assert len(lean["train_loss_log"]) == len(trainers["train_loss_log"]) == STEPS
    assert lean["train_loss_log"] == trainers["train_loss_log"]  # loss and grad norm, bit for bit
    assert lean["epochs"] == trainers["epochs"]
    # The Trainer sets train mode at every step; the lean step at the first and after each evaluation only.
    assert trainer_walks[True] >= STEPS
    assert walks[True] == EPOCHS  # the Trainer's: one per step
    assert walks[False] == trainer_walks[False]  # eval mode as often (loading the model, each evaluation)
