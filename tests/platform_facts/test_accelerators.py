"""GPU peaks against NVIDIA's published figures, written here from the pages (not from accelerators.json): BF16 tensor
core TFLOPS with sparsity, halved. The device names are what torch.cuda.get_device_name() reports on those GPUs."""

from __future__ import annotations

import pytest

from platform_facts.accelerators import accelerators, for_device, fraction_of_peak
from platform_facts.instances import gpu_families

# torch.cuda.get_device_name() -> dense bf16 TFLOP/s (None: no bf16 tensor cores or no published figure).
PEAKS = {
    "NVIDIA H200": 989,  # the device tool's H200 (141 GB, SXM); NVIDIA: 1,979 with sparsity
    "NVIDIA H200 NVL": None,
    "NVIDIA H100 80GB HBM3": 989,  # H100 SXM: 1,979*
    "NVIDIA H100 PCIe": 756,  # 1,513*
    "NVIDIA H100 NVL": 835,  # 1,671*
    "NVIDIA A100-SXM4-40GB": 312,  # p4d: 624*
    "NVIDIA A100-SXM4-80GB": 312,
    "NVIDIA A100 80GB PCIe": 312,
    "NVIDIA B200": 2250,  # HGX B200: 4.5 PFLOPS*
    "NVIDIA L40S": 362,  # 733*
    "NVIDIA L4": 121,  # 242*
    "NVIDIA A10G": None,
    "Tesla T4": None,
    "Tesla V100-SXM2-16GB": None,
}


@pytest.mark.parametrize(("device", "peak"), PEAKS.items())
def test_device_names_find_their_peak(device: str, peak: int | None) -> None:
    entry = for_device(device)
    assert entry is not None and entry.dense_bf16_tflops == peak


def test_every_peak_is_half_the_sparse_figure_with_an_nvidia_source() -> None:
    for entry in accelerators():
        if entry.dense_bf16_tflops is None:
            assert entry.published_bf16_tflops_with_sparsity is None and entry.checked.startswith("no peak")
            continue
        assert entry.published_bf16_tflops_with_sparsity is not None
        # Half, within NVIDIA's rounding (the L40S sheet prints 362.05 dense beside 733 sparse).
        assert entry.dense_bf16_tflops == pytest.approx(entry.published_bf16_tflops_with_sparsity / 2, rel=0.02)
        assert entry.source and entry.source.startswith("https://www.nvidia.com/"), entry.name


def test_every_gpu_the_platform_trains_on_is_in_the_table() -> None:
    """A GPU family added to instances.json needs its peak (or the reason it has none) here."""
    listed = {entry.gpu for entry in accelerators()}
    assert {fact.name for fact in gpu_families().values()} <= listed


def test_fraction_of_peak() -> None:
    assert fraction_of_peak("NVIDIA H200", 346.15) == {
        "fraction_of_dense_bf16_peak": 0.35,
        "accelerator": "NVIDIA H200 SXM",
        "dense_bf16_peak_tflops": 989,
        "peak_source": "https://www.nvidia.com/en-us/data-center/h200/",
    }
    assert fraction_of_peak("Tesla T4", 10)["fraction_of_dense_bf16_peak"] is None
    unknown = fraction_of_peak("cpu", 1)
    assert unknown["fraction_of_dense_bf16_peak"] is None and "not in platform_facts" in str(unknown["why_no_fraction"])
