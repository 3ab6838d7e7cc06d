"""Which checkpoints are complete, and their copy in S3: standard library and the AWS CLI only, so the instance's host
runs it (``python3 training_assets/instance/checkpoint_sync.py ...``) while training runs in the container.

A checkpoint is the Hugging Face Trainer's ``checkpoint-<step>/`` folder. The run writes a marker into it last
(``checkpoint-complete.json``: the step and every file with its size, see ``checkpoints.py``), after every process
finished writing; a checkpoint counts only when the marker is there and every file it lists is there with its size.
A process killed while saving leaves no marker, so a restart never starts from half a checkpoint.

In S3 each run keeps two slots, ``<prefix>slot-0/`` and ``<prefix>slot-1/``, written in turn: a new checkpoint goes
into the slot that does not hold the newest complete one, as (1) a marker saying the slot is being written,
(2) the files, (3) the complete marker. The newest complete checkpoint is never overwritten, the run's storage stays
at two checkpoints, and nothing needs ``s3:DeleteObject``. Uploads are SSE-KMS with the platform key, as
ec2_run.sh uploads the model.

Each instance uploads into its own folder of the run (``<run>/nodes/<writer>/checkpoints/``, run_lineage.py); a run
launched again restores the newest complete checkpoint among its earlier writers' folders (``--from``, read only).

    checkpoint_sync.py upload  --local DIR --s3 s3://bucket/prefix/ --kms-key-id ARN [--watch SECONDS]
    checkpoint_sync.py restore --local DIR --s3 s3://bucket/prefix/ [--from s3://bucket/other-prefix/ ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MARKER = "checkpoint-complete.json"
# The Trainer's checkpoint folder prefix (transformers.trainer_utils.PREFIX_CHECKPOINT_DIR).
CHECKPOINT_PREFIX = "checkpoint-"
SLOTS = ("slot-0", "slot-1")
_STEP = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")
_GLOB = re.compile(r"[*?[]")


# ------------------------------------------------------------------------------------------------- local folders


def step_of(folder: Path) -> int | None:
    match = _STEP.match(folder.name)
    return int(match[1]) if match else None


def manifest(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` but the marker, relative path -> size in bytes."""
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MARKER and not path.name.startswith(".")
    }


def write_marker(folder: Path, step: int) -> Path:
    """Mark ``folder`` complete: call it after every file of the checkpoint is written (the rename is atomic)."""
    marker = folder / MARKER
    content = {"state": "complete", "step": step, "files": manifest(folder)}
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".marker-")
    with os.fdopen(handle, "w") as file:
        json.dump(content, file, indent=1)
    os.replace(temporary, marker)
    return marker


def read_marker(text: str | bytes) -> dict[str, Any] | None:
    try:
        marker = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(marker, dict) or marker.get("state") != "complete" or not isinstance(marker.get("files"), dict):
        return None
    return marker


def is_complete(folder: Path) -> bool:
    """The marker is there and every file it lists is there with its size."""
    path = folder / MARKER
    marker = read_marker(path.read_bytes()) if path.is_file() else None
    if marker is None or marker.get("step") != step_of(folder):
        return False
    return all((folder / name).is_file() and (folder / name).stat().st_size == size
               for name, size in marker["files"].items())  # fmt: skip


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(step_of(folder), folder) for folder in root.iterdir() if folder.is_dir()]
    return sorted((step, folder) for step, folder in found if step is not None and is_complete(folder))


def newest_complete(root: Path) -> Path | None:
    complete = complete_checkpoints(root)
    return complete[-1][1] if complete else None


# ---------------------------------------------------------------------------------------------------------- S3


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri} is not an s3:// URI")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix if not prefix or prefix.endswith("/") else prefix + "/"


Runner = Callable[[Sequence[str]], str]


def aws_cli(arguments: Sequence[str]) -> str:
    """Run ``aws ARGUMENTS`` (the host's CLI and credentials: the instance role) and return its output."""
    result = subprocess.run(["aws", *arguments], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"aws {' '.join(arguments[:3])} failed: {result.stderr.strip()}")
    return result.stdout


class S3Checkpoints:
    """The two checkpoint slots of one run under ``uri`` (``s3://bucket/<run prefix>/checkpoints/``)."""

    def __init__(self, uri: str, *, kms_key_id: str | None = None, aws: Runner = aws_cli) -> None:
        self.bucket, self.prefix = _split(uri)
        self.kms_key_id = kms_key_id
        self.aws = aws

    @property
    def uri(self) -> str:
        return self._uri()

    def _uri(self, *parts: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{'/'.join(parts)}"

    def _encryption(self) -> list[str]:
        if not self.kms_key_id:
            raise ValueError("uploading checkpoints needs the KMS key (--kms-key-id)")
        return ["--sse", "aws:kms", "--sse-kms-key-id", self.kms_key_id]

    def objects(self) -> dict[str, int]:
        """Key (relative to the prefix) -> size of every object under the prefix."""
        output = self.aws(["s3api", "list-objects-v2", "--bucket", self.bucket, "--prefix", self.prefix,
                           "--query", "Contents[].[Key,Size]", "--output", "json"])  # fmt: skip
        rows = json.loads(output or "null") or []
        return {key[len(self.prefix) :]: int(size) for key, size in rows}

    def slots(self) -> dict[str, dict[str, Any] | None]:
        """Each slot's complete marker (None: empty, being written, or a listed file missing or of another size)."""
        objects = self.objects()
        texts = self._markers([slot for slot in SLOTS if f"{slot}/{MARKER}" in objects])
        found: dict[str, dict[str, Any] | None] = {}
        for slot in SLOTS:
            marker = read_marker(texts[slot]) if slot in texts else None
            if marker and any(objects.get(f"{slot}/{name}") != size for name, size in marker["files"].items()):
                marker = None
            found[slot] = marker
        return found

    def _markers(self, slots: Sequence[str]) -> dict[str, bytes]:
        """The marker files of ``slots`` as they are in S3 (one download for all of them)."""
        if not slots:
            return {}
        with tempfile.TemporaryDirectory() as folder:
            self._copy(self._uri(), folder, [f"{slot}/{MARKER}" for slot in slots])
            paths = {slot: Path(folder, slot, MARKER) for slot in slots}
            return {slot: path.read_bytes() for slot, path in paths.items() if path.is_file()}

    def _copy(self, source: str, target: str, names: Sequence[str], options: Sequence[str] = ()) -> None:
        """Copy the files ``names`` (relative paths) from the folder ``source`` to ``target`` (local or s3://) in one
        CLI call: each call starts the CLI (about half a CPU-second), and a checkpoint has several files per rank.
        The CLI puts the source folder in front of each --include pattern as it is, so with a glob character in
        either folder the files are copied one by one instead."""
        source, target = source.rstrip("/"), target.rstrip("/")
        if _GLOB.search(source) or _GLOB.search(target):
            for name in names:
                self.aws(["s3", "cp", "--only-show-errors", *options, f"{source}/{name}", f"{target}/{name}"])
            return
        # fnmatch: a glob character in a name matches only itself in brackets.
        includes = [argument for name in names for argument in ("--include", _GLOB.sub(r"[\g<0>]", name))]
        self.aws(["s3", "cp", "--recursive", "--only-show-errors", *options, f"{source}/", f"{target}/",
                  "--exclude", "*", *includes])  # fmt: skip

    def newest(self) -> tuple[str, dict[str, Any]] | None:
        complete = [(slot, marker) for slot, marker in self.slots().items() if marker is not None]
        return max(complete, key=lambda item: int(item[1]["step"])) if complete else None

    def upload(self, folder: Path) -> bool:
        """Upload one complete local checkpoint unless S3 already holds it (or a newer one); True when uploaded."""
        local = json.loads((folder / MARKER).read_text())
        newest = self.newest()
        if newest is not None and int(newest[1]["step"]) >= int(local["step"]):
            return False
        slot = SLOTS[0] if newest is None or newest[0] == SLOTS[1] else SLOTS[1]
        with tempfile.NamedTemporaryFile("w", suffix=".json") as writing:
            json.dump({"state": "writing", "step": local["step"]}, writing)
            writing.flush()
            self.aws(["s3", "cp", "--only-show-errors", *self._encryption(), writing.name, self._uri(slot, MARKER)])
        self._copy(str(folder), self._uri(slot), list(local["files"]), self._encryption())
        self.aws(["s3", "cp", "--only-show-errors", *self._encryption(), str(folder / MARKER), self._uri(slot, MARKER)])
        return True

    def restore(self, root: Path) -> Path | None:
        """Download the newest complete checkpoint into ``root/checkpoint-<step>/`` unless ``root`` holds it or a
        newer one; return the newest complete local checkpoint afterwards (None: none anywhere)."""
        newest = self.newest()
        local = newest_complete(root)
        local_step = step_of(local) if local else None
        if newest is None or (local_step is not None and local_step >= int(newest[1]["step"])):
            return local
        slot, marker = newest
        target = root / f"{CHECKPOINT_PREFIX}{int(marker['step'])}"
        for name in marker["files"]:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
        self._copy(self._uri(slot), str(target), list(marker["files"]))
        self.aws(["s3", "cp", "--only-show-errors", self._uri(slot, MARKER), str(target / MARKER)])
        if not is_complete(target):
            raise RuntimeError(f"{target}: the download from {self._uri(slot)} is not a complete checkpoint")
        return target


def restore_newest(root: Path, sources: Sequence[S3Checkpoints]) -> Path | None:
    """Restore the newest complete checkpoint of any of ``sources`` (the run's writers' folders) into ``root``."""
    found = [(int(newest[1]["step"]), index) for index, source in enumerate(sources) if (newest := source.newest())]
    if not found:
        return newest_complete(root)
    return sources[max(found)[1]].restore(root)


def upload_newest(root: Path, remote: S3Checkpoints, log: Callable[[str], None] = print) -> int | None:
    """Upload the newest complete local checkpoint if S3 lacks it; return its step when uploaded."""
    folder = newest_complete(root)
    if folder is None or not remote.upload(folder):
        return None
    log(f"checkpoint_sync: uploaded {folder.name} to {remote.uri}")
    return step_of(folder)


def watch(root: Path, remote: S3Checkpoints, every: float, log: Callable[[str], None] = print) -> None:
    """Upload each new complete checkpoint every ``every`` seconds until SIGTERM (or SIGINT), then once more."""
    stop = False

    def request_stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    while not stop:
        try:
            upload_newest(root, remote, log)
        except (RuntimeError, OSError) as error:  # a failed upload is retried on the next round
            log(f"checkpoint_sync: upload failed, retrying in {every:g} s: {error}")
        deadline = time.monotonic() + every
        while not stop and time.monotonic() < deadline:
            time.sleep(min(1.0, every))
    upload_newest(root, remote, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("upload", "restore"))
    parser.add_argument("--local", type=Path, required=True, help="the run's checkpoint folder on this host")
    parser.add_argument("--s3", required=True, help="s3://bucket/<run prefix>/checkpoints/")
    parser.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        help="restore: also an earlier writer's s3://.../checkpoints/ of the run (repeatable)",
    )
    parser.add_argument("--kms-key-id", help="KMS key for SSE-KMS uploads (upload)")
    parser.add_argument("--watch", type=float, default=0, help="upload: repeat every N seconds until SIGTERM")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        remote = S3Checkpoints(args.s3, kms_key_id=args.kms_key_id)
        if args.command == "restore":
            sources = [remote, *(S3Checkpoints(uri) for uri in args.sources if uri.rstrip("/") != args.s3.rstrip("/"))]
            found = restore_newest(args.local, sources)
            found_text = f"resuming from {found}" if found else "no checkpoint: the run starts at step 0"
            log(f"checkpoint_sync: {found_text}")
        elif args.watch > 0:
            watch(args.local, remote, args.watch, log)
        else:
            upload_newest(args.local, remote, log)
    except (RuntimeError, ValueError) as error:
        log(f"checkpoint_sync: error: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
