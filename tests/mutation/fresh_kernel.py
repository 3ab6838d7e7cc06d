"""pytest plugin for mutation runs of modules whose tests synthesize through jsii (tests/mutation/plan.py): every
process forked from the one that loaded it talks to a jsii kernel of its own.

aws_cdk is a Python face on a Node.js process, the jsii kernel, which its module starts at import and talks to over
pipes. mutmut forks each mutant's worker from the process that ran every test once, so every worker would write to,
and read from, the same kernel as its parent and as the workers beside it: answers go to whoever reads first. After a
fork, the child here starts a kernel of its own, loads into it the assemblies the parent had loaded (in the same order:
an assembly's dependencies are loaded before it), and forgets the parent's object references (the new kernel numbers
its objects from the start again). Objects the parent's kernel made while modules of the tree were imported
(``ec2.InterfaceVpcEndpointAwsService.ECR`` in a module-level table, say) would name objects the new kernel never
made, or, as it numbers its own, other ones: every module of the work tree whose globals hold such an object is run
again (``importlib.reload``, in the new kernel), until none does. The parent's kernel is left alone: the child never
writes to it (its process object is kept, so that neither the garbage collector nor the exit hooks tell that kernel to
stop). ~0.3 CPU-s a worker (Node started, the five assemblies loaded, before any module is run again: measured on
the 2-core machine, 0.7-1.2 s of wall time at load 11)."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_REGISTERED: list[bool] = []
# never released: a kernel's finalizer would stop the parent's kernel; the parent's objects keep their ids taken
_PARENTS_KERNELS: list[Any] = []


def _assemblies() -> list[Any]:
    """The assemblies loaded in this process, in the order they were loaded (the order their modules were imported)."""
    return [
        module.__jsii_assembly__
        for name, module in list(sys.modules.items())
        if name.endswith("._jsii") and hasattr(module, "__jsii_assembly__")
    ]


def _jsii_objects(value: Any, depth: int = 0) -> Iterator[Any]:
    """The jsii objects in ``value``: itself, or inside its containers and jsii structs (``_values``)."""
    if "__jsii_ref__" in getattr(value, "__dict__", ()):
        yield value
    elif depth < 4 and isinstance(value, dict | list | tuple | set | frozenset):
        for item in value.items() if isinstance(value, dict) else value:
            yield from _jsii_objects(item, depth + 1)
    elif depth < 4 and isinstance(getattr(value, "_values", None), dict):
        yield from _jsii_objects(value._values, depth + 1)


def _tree_modules() -> list[ModuleType]:
    """The modules imported from the work tree (mutmut's mutants/ copy lies under the working directory)."""
    tree = Path.cwd().resolve()
    files = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())}
    return [sys.modules[name] for name, file in files.items() if isinstance(file, str) and tree in Path(file).parents]


def _holding(modules: list[ModuleType], stale: set[int]) -> list[ModuleType]:
    return [
        module
        for module in modules
        if any(id(found) in stale for value in list(vars(module).values()) for found in _jsii_objects(value))
    ]


def _remake_module_objects(parents_objects: list[Any]) -> None:
    """Run again, in the new kernel, every tree module that holds one of the parent kernel's objects (a module that
    imported such an object from another holds it too: passes go on until no module holds one)."""
    stale = {id(found) for found in parents_objects}  # the objects stay referenced, so no new one takes their id
    modules = _tree_modules()
    for _ in range(len(modules) + 1):
        holding = _holding(modules, stale)
        if not holding:
            return
        for module in holding:
            importlib.reload(module)
    raise RuntimeError(f"modules still hold the parent kernel's jsii objects: {_holding(modules, stale)}")


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
    parents_objects = [
        found for module in _tree_modules() for value in list(vars(module).values()) for found in _jsii_objects(value)
    ]
    _PARENTS_KERNELS.append(parents_objects)
    _reference_map._refs._refs.clear()
    for assembly in _assemblies():
        _runtime.JSIIAssembly.load(assembly.name, assembly.version, assembly.module, assembly.filename)
    _remake_module_objects(parents_objects)


def pytest_configure(config: pytest.Config) -> None:
    if not _REGISTERED:  # mutmut calls pytest.main several times in one process: one kernel per fork is enough
        _REGISTERED.append(True)
        os.register_at_fork(after_in_child=_fresh_kernel)
