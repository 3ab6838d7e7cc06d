"""The hardware checks of a training run: what this CPU and GPU can do (native bfloat16), and the device facts that
metrics.json records. Imports torch only; nothing here starts training."""

from __future__ import annotations

import os
import platform
import re
import resource
from pathlib import Path
from typing import Any

import torch

from training_assets.instance.dataset import TrainingInputError


def cpu_flags() -> set[str]:
    """This CPU's feature flags, from /proc/cpuinfo (x86 ``flags``, Arm ``Features``); none where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    flags = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    names = [line.partition(":")[2].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def bf16_native(use_cuda: bool) -> bool:
    if use_cuda:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & cpu_flags())


def check_bf16(use_cuda: bool) -> None:
    """bf16 needs native support: Ampere or newer GPUs, or CPUs with AVX512-BF16/AMX (x86) or BF16 (Arm)."""
    if use_cuda:
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            major, minor = torch.cuda.get_device_capability()
            raise TrainingInputError(
                f"--bf16 needs a GPU with native bfloat16 (compute capability 8.0+, e.g. A100 on p4d); "
                f"{torch.cuda.get_device_name()} has {major}.{minor}. Run without --bf16."
            )
        return
    native = {"avx512_bf16", "amx_bf16", "bf16"} & cpu_flags()
    if not native:
        raise TrainingInputError(
            f"--bf16 needs native bfloat16 on this CPU ({platform.machine()} without avx512_bf16/amx_bf16/bf16 "
            "flags in /proc/cpuinfo) or a GPU with compute capability 8.0+. Run without --bf16."
        )


def device_info(use_cuda: bool, world_size: int) -> dict[str, Any]:
    info: dict[str, Any] = {"type": "cuda" if use_cuda else "cpu", "world_size": world_size, "torch": torch.__version__}
    if use_cuda:
        capability = ".".join(map(str, torch.cuda.get_device_capability()))
        info.update(name=torch.cuda.get_device_name(), capability=capability)
    else:
        info.update(name=cpu_model(), threads=torch.get_num_threads())
    return info


def compile_threads(local_processes: int) -> int:
    """TorchInductor's compile workers for one process: this node's usable CPUs shared by its processes. Each process
    would otherwise start one per CPU (``decide_compile_threads``), eight ranks compiling at once 8x the cores."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // max(1, local_processes))


# NCCL's INFO log names the network each communicator uses (src/init.cc: INFO(NCCL_INIT, "Using network %s")):
# "Socket" (TCP), "IB", or a plugin's name ("AWS Libfabric"/"Libfabric" for aws-ofi-nccl, which carries EFA).
NCCL_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$", re.MULTILINE)


class TransportError(RuntimeError):
    """NCCL fell back to TCP sockets where EFA was expected."""


def nccl_network(log_file: str | None, hostname: str, pid: int) -> str | None:
    """The network NCCL chose, from this process's NCCL debug file (``NCCL_DEBUG_FILE``, in which NCCL puts the host
    name for ``%h`` and the process id for ``%p``); None where there is no such log or line."""
    if not log_file:
        return None
    path = Path(log_file.replace("%h", hostname).replace("%p", str(pid)))
    try:
        found = NCCL_NETWORK.findall(path.read_text(errors="replace"))
    except OSError:
        return None
    return found[-1] if found else None


def check_transport(network: str | None, efa_expected: bool) -> None:
    """Stop a run that expected EFA and got sockets: over TCP, the gradient all-reduce between p4d nodes runs at a
    fraction of EFA's 400 Gbit/s, and the run would go on for hours at that pace without saying why."""
    if efa_expected and network == "Socket":
        raise TransportError(
            "NCCL uses TCP sockets, not EFA (NCCL INFO Using network Socket): the aws-ofi-nccl plugin or the EFA "
            "devices were not found in the container; check launch_training.sh --efa and the instance's EFA "
            "interfaces before training on sockets"
        )


def peak_memory_bytes(use_cuda: bool) -> int:
    """The most memory the run held: on a GPU what PyTorch's allocator held at most (``max_memory_allocated``), on
    a CPU the process's peak resident set (``ru_maxrss``, kibibytes on Linux)."""
    if use_cuda:
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
