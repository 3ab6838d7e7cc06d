"""pytest plugin for mutation runs of modules whose tests synthesize through jsii (tests/mutation/plan.py): every
process forked from the one that loaded it talks to a jsii kernel of its own.

aws_cdk is a Python face on a Node.js process, the jsii kernel, which its module starts at import and talks to over
pipes. mutmut forks each mutant's worker from the process that ran every test once, so every worker would write to,
and read from, the same kernel as its parent and as the workers beside it: answers go to whoever reads first. After a
fork, the child here starts a kernel of its own, loads into it the assemblies the parent had loaded (in the same order:
an assembly's dependencies are loaded before it), and forgets the parent's object references (the new kernel numbers
its objects from the start again). The parent's kernel is left alone: the child never writes to it (its process
object is kept, so that neither the garbage collector nor the exit hooks tell that kernel to stop). ~0.3 CPU-s a
worker (Node started, the five assemblies loaded: measured on the 2-core machine, 0.7-1.2 s of wall time at load 11)."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

import pytest

_REGISTERED: list[bool] = []
_PARENTS_KERNELS: list[Any] = []  # never released: its finalizer would stop the parent's kernel


def _assemblies() -> list[Any]:
    """The assemblies loaded in this process, in the order they were loaded (the order their modules were imported)."""
    return [
        module.__jsii_assembly__
        for name, module in list(sys.modules.items())
        if name.endswith("._jsii") and hasattr(module, "__jsii_assembly__")
    ]


def _fresh_kernel() -> None:
    from jsii import _reference_map, _runtime
    from jsii._kernel.providers.process import ProcessProvider

    # jsii memoizes the kernel's process in a list in the closure of ProcessProvider._process, one for every
    # provider (jsii/_utils.py, memoized_property): emptied, the next call starts a process.
    (started,) = (cell.cell_contents for cell in ProcessProvider._process.fget.__closure__
                  if isinstance(cell.cell_contents, list))  # fmt: skip
    for process in started:
        atexit.unregister(process.stop)
    _PARENTS_KERNELS.extend(started)
    started.clear()
    _reference_map._refs._refs.clear()
    for assembly in _assemblies():
        _runtime.JSIIAssembly.load(assembly.name, assembly.version, assembly.module, assembly.filename)


def pytest_configure(config: pytest.Config) -> None:
    if not _REGISTERED:  # mutmut calls pytest.main several times in one process: one kernel per fork is enough
        _REGISTERED.append(True)
        os.register_at_fork(after_in_child=_fresh_kernel)
