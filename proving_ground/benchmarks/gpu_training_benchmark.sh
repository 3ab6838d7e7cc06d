#!/usr/bin/env bash
# The GPU measurement of issue 25 in one command, for a machine with one NVIDIA GPU where torch and transformers are
# installed and nothing else is needed: no `datasets`, no hub, no internet (the device tool's H100/H200 machines).
# Writes $OUT/training_throughput_gpu.json (OUT unset: proving_ground/benchmarks/results/) and prints the table.
#
#   bash proving_ground/benchmarks/gpu_training_benchmark.sh                              # from anywhere in the repository
#   VARIANTS=baseline,all_three,fast_path,fast_path@256 bash proving_ground/benchmarks/gpu_training_benchmark.sh
#
# It runs proving_ground/benchmarks/training_throughput.py with the RoBERTa-base-sized classifier built offline (12 x 768,
# vocabulary 50,265, 514 positions, 124.6M parameters, random weights) on 8,192 tweet-length texts (~25 tokens,
# made offline from the sample data), max_seq_length 128, 2 epochs, one process per variant with a cold compile
# cache: the seed's baseline (eager fp32, plain AdamW, every text padded to 128), train_sentiment.py's defaults at
# batch 32 (the issue's comparison: 1,363 samples/s for the seed's three features on the old code) and at batch 256
# (toward the batch size that gets the most of the GPU's bf16 peak). The fast path runs with
# torch.cuda.set_sync_debug_mode("error") on its steady steps: a hidden host-device sync fails that run, the results
# say so and the variant is measured again without the check. Not timed yet: the old benchmark's five variants took
# about 4 minutes on an H200, and each fast-path variant adds the compilation of one graph per bucket length (cold
# cache); give it 570 s, or fewer variants (VARIANTS=baseline,fast_path).
#
# Wheels: if .whl/ at the repository root holds wheels, they are installed into /tmp/site first. The training code
# is tested with requirements-dev.txt's pins (transformers 5.23.0, tokenizers 0.23.3, accelerate 1.15.0); carry those
# where the machine has other versions (the device README says how to download them for its Python).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
out="${OUT:-proving_ground/benchmarks/results}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$python" - <<'EOF'
import re
from pathlib import Path

import accelerate
import torch
import transformers

if not torch.cuda.is_available():
    raise SystemExit("gpu_training_benchmark.sh: no CUDA device: this script measures a GPU")
print(f"torch {torch.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}, "
      f"{torch.cuda.get_device_name()} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))})")
pins = dict(re.findall(r"^(transformers|accelerate|tokenizers)==(\S+)$", Path("requirements-dev.txt").read_text(), re.M))
for name, module in (("transformers", transformers), ("accelerate", accelerate)):
    if module.__version__ != pins.get(name):
        print(f"note: {name} {module.__version__} here, {pins.get(name)} in requirements-dev.txt (carry the wheel)")
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true

"$python" -m proving_ground.benchmarks.training_throughput --model-size roberta-base --synthetic-rows "${ROWS:-8192}" \
  --max-seq-length 128 --batch-size 32 --epochs "${EPOCHS:-2}" --warmup-steps 3 --rounds 1 \
  --variants "${VARIANTS:-baseline,fast_path,fast_path@256}" --output "$out/training_throughput_gpu.json"
