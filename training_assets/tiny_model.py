"""Build a tiny, randomly initialised RoBERTa sentiment classifier for offline runs.

The real base model (cardiffnlp/twitter-roberta-base-sentiment-latest) comes from the Hugging Face hub; this
machine and CI cannot reach it. The tiny model has the same architecture, label set and file layout, so the
training script, the packaging and every model server run on it unchanged, in seconds, on a CPU.

    python -m training_assets.tiny_model --output /tmp/tiny-roberta
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SAMPLE_DATA = Path(__file__).resolve().parent / "sample_data"
LABELS = ("negative", "neutral", "positive")


def _corpus(data_dir: Path) -> list[str]:
    texts = []
    for path in sorted(data_dir.glob("*.jsonl")):
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return texts


def build_tiny_model(
    output: Path,
    *,
    data_dir: Path = SAMPLE_DATA,
    seed: int = 0,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    intermediate_size: int = 64,
) -> Path:
    """Write a tokenizer (byte-level BPE trained on ``data_dir``) and a 2-layer RoBERTa classifier to ``output``.

    The size arguments build a larger model of the same kind (the training benchmark uses one on CPU).
    """
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForSequenceClassification, RobertaTokenizerFast

    output.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _corpus(data_dir),
        vocab_size=512,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    )
    bpe.save_model(str(output))  # vocab.json + merges.txt
    # transformers 5 takes the trained vocabulary as ``vocab``/``merges``; it silently ignores the old
    # ``vocab_file``/``merges_file`` names and would build an empty tokenizer that maps every text to [2, 3].
    tokenizer = RobertaTokenizerFast(
        vocab=str(output / "vocab.json"), merges=str(output / "merges.txt"), model_max_length=64
    )
    if tokenizer.vocab_size != len(json.loads((output / "vocab.json").read_text())):
        raise RuntimeError(f"the tokenizer did not load the trained vocabulary from {output}")
    tokenizer.save_pretrained(output)

    torch.manual_seed(seed)
    config = RobertaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=64 + 2,  # RoBERTa offsets positions by padding_idx + 1
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        id2label=dict(enumerate(LABELS)),  # also sets num_labels (a property over id2label)
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    RobertaForSequenceClassification(config).save_pretrained(output, safe_serialization=True)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="directory to write the model and tokenizer to")
    parser.add_argument(
        "--data-dir", type=Path, default=SAMPLE_DATA, help="JSONL files whose texts train the tokenizer"
    )
    args = parser.parse_args(argv)
    print(build_tiny_model(args.output, data_dir=args.data_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
