"""A local wheelhouse for vendoring tests: one small wheel per distribution of requirements-vendor.lock, built here
in milliseconds, so that vendor_dependencies (pip install --target --platform ... --only-binary) runs exactly as it
does for a real archive, with ``--no-index --find-links`` instead of PyPI (no test reaches the network).

Each distribution has the lock's version for linux/aarch64 CPython 3.12; the compiled ones (tokenizers, safetensors)
carry a stub extension whose ELF header names aarch64. Decoys make a wrong resolution visible: the same versions
built for x86_64 and for CPython 3.11 (pip must pick the aarch64 cp312 one), a newer version of each that the
constraints must keep out, and numpy (which vendoring removes again: the image provides it)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

AARCH64_TAG = "cp312-cp312-manylinux_2_17_aarch64"
DECOY_TAGS = ("cp312-cp312-manylinux_2_17_x86_64", "cp311-cp311-manylinux_2_17_aarch64")
ELF_MACHINE = {"aarch64": 183, "x86_64": 62}
COMPILED = {"tokenizers": "tokenizers.abi3.so", "safetensors": "_safetensors_rust.abi3.so"}
# What depends on what, enough for pip to have a closure to resolve (the real graph is wider; the lock pins it all).
TOP = "transformers"


def _elf(machine: int) -> bytes:
    # e_ident (ELF64, little endian), e_type ET_DYN, e_machine: the 20 bytes the tests read, then padding.
    return (
        b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + (3).to_bytes(2, "little") + machine.to_bytes(2, "little") + b"\x00" * 44
    )


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(folder: Path, name: str, version: str, tag: str, *, requires: list[str] = (),  # type: ignore[assignment]
                files: dict[str, bytes] | None = None) -> Path:  # fmt: skip
    """A wheel of ``name`` ``version`` for ``tag`` holding ``files`` (path -> bytes) and its metadata."""
    dist_info = f"{name}-{version}.dist-info"
    contents = dict(files or {f"{name}/__init__.py": b""})
    contents[f"{dist_info}/METADATA"] = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", *(f"Requires-Dist: {r}\n" for r in requires)]
    ).encode()
    contents[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    )
    record = [_record_line(path, data) for path, data in contents.items()] + [f"{dist_info}/RECORD,,"]
    contents[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in contents.items():
            archive.writestr(path, data)
    return wheel


def _files(name: str, version: str, tag: str) -> dict[str, bytes]:
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n".encode()}
    if name in COMPILED:
        arch = "x86_64" if "x86_64" in tag else "aarch64"
        files[f"{name}/{COMPILED[name]}"] = _elf(ELF_MACHINE[arch])
        python = tag.split("-")[0].removeprefix("cp")  # 312
        files[f"{name}/_native.cpython-{python}-{arch}-linux-gnu.so"] = _elf(ELF_MACHINE[arch])
    if name == TOP:  # a console script: pip --target puts it into bin/, which vendoring removes
        files[f"{name}-{version}.data/scripts/{name}-cli"] = b"#!python\nprint('cli')\n"
    return files


def build_wheelhouse(folder: Path, lock: list[str]) -> Path:
    """Wheels for every ``name==version`` of ``lock`` (plus numpy and the decoys) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    pins = dict(line.split("==") for line in lock)
    for name, version in {**pins, "numpy": "2.4.6"}.items():
        requires = [other for other in [*pins, "numpy"] if other != name] if name == TOP else []
        for tag in (AARCH64_TAG, *DECOY_TAGS):
            build_wheel(folder, name, version, tag, requires=requires, files=_files(name, version, tag))
        newer = version + ".post1"  # what an unconstrained resolution would take
        build_wheel(folder, name, newer, AARCH64_TAG, requires=requires, files=_files(name, newer, AARCH64_TAG))
    return folder
