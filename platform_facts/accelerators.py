"""Dense bf16 peaks of the GPUs the platform trains on (``accelerators.json``, each with its source), so a benchmark can
say how far a measured throughput is from what the chip can do.

The peak is NVIDIA's published tensor-core figure without structured sparsity: a model's own FLOPs divided by it is
its "model FLOPs utilisation" (MFU, as in the PaLM paper and torchtitan). A GPU without bf16 tensor cores, or one
without a published figure, has no peak: ``fraction_of_peak`` then says so instead of guessing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ACCELERATORS_FILE = Path(__file__).with_name("accelerators.json")


@dataclass(frozen=True)
class Accelerator:
    name: str
    gpu: str  # the short name platform_facts/instances.json uses for the instance family's GPU
    device_name: str  # regular expression over torch.cuda.get_device_name()
    dense_bf16_tflops: float | None
    published_bf16_tflops_with_sparsity: float | None
    source: str | None
    checked: str

    def matches(self, device_name: str) -> bool:
        return re.search(self.device_name, device_name, flags=re.IGNORECASE) is not None


@cache
def accelerators(path: Path = ACCELERATORS_FILE) -> tuple[Accelerator, ...]:
    raw = json.loads(path.read_text())
    return tuple(Accelerator(**entry) for entry in raw["accelerators"])


def for_device(device_name: str) -> Accelerator | None:
    """The table's entry for a ``torch.cuda.get_device_name()``, e.g. ``NVIDIA H100 80GB HBM3`` -> H100 SXM."""
    return next((entry for entry in accelerators() if entry.matches(device_name)), None)


def fraction_of_peak(device_name: str, model_tflops_per_second: float) -> dict[str, object]:
    """``model_tflops_per_second`` as a fraction of the device's dense bf16 peak, with the peak and its source; or
    why there is no fraction (unknown device, no bf16 tensor cores, no published figure)."""
    entry = for_device(device_name)
    if entry is None:
        return {"fraction_of_dense_bf16_peak": None,
                "why_no_fraction": f"{device_name!r} is not in platform_facts/accelerators.json"}  # fmt: skip
    if entry.dense_bf16_tflops is None:
        return {"fraction_of_dense_bf16_peak": None, "accelerator": entry.name, "why_no_fraction": entry.checked}
    return {
        "fraction_of_dense_bf16_peak": round(model_tflops_per_second / entry.dense_bf16_tflops, 4),
        "accelerator": entry.name,
        "dense_bf16_peak_tflops": entry.dense_bf16_tflops,
        "peak_source": entry.source,
    }
