"""Which instances a training run is made of, and so which folders of its S3 prefix to trust: standard library and the
AWS CLI only, so the instance's host runs it (``python3 training_assets/instance/run_lineage.py ...``).

Every instance writes only under its own folder of the run, ``<run prefix>nodes/<role id>:<instance id>/`` (its
checkpoints, compile cache, rendezvous record and, on the node of rank 0, the candidate and its digest): the training
instance role may write nowhere else (``${aws:userid}`` in its policy, which for an instance-profile session is
``<role id>:<instance id>``: IAM User Guide, "IAM policy elements: Variables and tags", "Request information that you
can use for policy variables"). EC2 names that session after the instance, and nothing on an instance can choose it,
so code on one run's instance cannot write another instance's folder, whatever run it names.

Any instance may still create its own folder under another run's prefix. What makes a folder part of a run is the
launcher's record, ``<run prefix>launches/<reservation id>.json``, which only the platform's launcher writes (once per
launch; no instance may write under ``launches/``): ``{"run_id", "reservation_id", "writers": [...]}``. A run launched
again (resume) is a new reservation with new instances and a record of its own; its instances read the checkpoints and
compile cache of every writer the run's records name, write their own folders, and ignore any other folder.

    run_lineage.py --run s3://bucket/<run prefix>/ join --reservation r-... --writer ROLEID:i-...
    run_lineage.py --run s3://bucket/<run prefix>/ candidate    # the run's model.tar.gz, if one of its writers wrote it

``join`` (ec2_run.sh, before training) waits until the launcher's record of this launch names this instance (an
instance nobody recorded trains nothing), refuses a finished run (one of its writers wrote the candidate), and prints
the run's writers, one per line, whose folders it restores from.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

NODES = "nodes/"
LAUNCHES = "launches/"
CANDIDATE = "model.tar.gz"
DIGEST = "model.tar.gz.sha256"
# A writer is an instance-profile session's aws:userid: the role's unique id (AROA...) and the instance id.
WRITER = re.compile(r"^AROA[A-Z0-9]+:i-[0-9a-f]+$")
RECORD = re.compile(r"^r-[0-9a-f]+\.json$")

Runner = Callable[[Sequence[str]], str]


class NotInRun(Exception):
    """The lineage says no; the message is the one sentence to print."""


def aws_cli(arguments: Sequence[str]) -> str:
    """Run ``aws ARGUMENTS`` with the host's CLI and credentials (the instance role); its output."""
    result = subprocess.run(["aws", *arguments], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"aws {' '.join(arguments[:3])} failed: {result.stderr.strip()}")
    return result.stdout


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri} is not an s3:// URI")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix if prefix.endswith("/") else prefix + "/"


def record_key(run_prefix: str, reservation_id: str) -> str:
    """Where the launcher records one launch of the run whose prefix is ``run_prefix`` (ending in ``/``)."""
    return f"{run_prefix}{LAUNCHES}{reservation_id}.json"


class Lineage:
    """The launch records and writer folders of one run, ``s3://bucket/<run prefix>/``."""

    def __init__(self, uri: str, *, aws: Runner = aws_cli) -> None:
        self.bucket, self.prefix = _split(uri)
        self.aws = aws

    def _keys(self, under: str) -> list[str]:
        output = self.aws(["s3api", "list-objects-v2", "--bucket", self.bucket, "--prefix", self.prefix + under,
                           "--query", "Contents[].[Key,Size]", "--output", "json"])  # fmt: skip
        return [key[len(self.prefix) :] for key, _ in json.loads(output or "null") or []]

    def _record(self, name: str) -> list[str]:
        """The writers of one launch record; a record of another run or with a malformed writer names none."""
        text = self.aws(["s3", "cp", "--only-show-errors", f"s3://{self.bucket}/{self.prefix}{LAUNCHES}{name}", "-"])
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            return []
        run_id = self.prefix.rstrip("/").rsplit("/", 1)[-1]
        if not isinstance(record, dict) or record.get("run_id") != run_id:
            return []
        if f"{record.get('reservation_id')}.json" != name:
            return []
        writers = record.get("writers")
        return [w for w in writers if isinstance(w, str) and WRITER.fullmatch(w)] if isinstance(writers, list) else []

    def writers(self) -> list[str]:
        """Every writer the run's launch records name, oldest record first (the keys' order: reservation ids are not
        ordered, so the records are read in the order their keys sort, which is stable)."""
        names = [key[len(LAUNCHES) :] for key in self._keys(LAUNCHES)]
        found: list[str] = []
        for name in sorted(n for n in names if RECORD.fullmatch(n)):
            found += [writer for writer in self._record(name) if writer not in found]
        return found

    def wait_for(self, reservation_id: str, writer: str, *, timeout: float, every: float = 5.0) -> None:
        """Return once the launcher's record of ``reservation_id`` names ``writer``; NotInRun after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            names = {key[len(LAUNCHES) :] for key in self._keys(LAUNCHES)}
            if f"{reservation_id}.json" in names and writer in self._record(f"{reservation_id}.json"):
                return
            if time.monotonic() >= deadline:
                raise NotInRun(
                    f"s3://{self.bucket}/{record_key(self.prefix, reservation_id)} does not name {writer} after "
                    f"{timeout:g} s: only instances the platform's launcher started and recorded run a training run."
                )
            time.sleep(every)

    def join(self, reservation_id: str, writer: str, *, timeout: float) -> list[str]:
        """The run's writers once its record names ``writer``; NotInRun when the run is finished."""
        self.wait_for(reservation_id, writer, timeout=timeout)
        writers = self.writers()
        found = self.candidate(writers)
        if found is not None:
            run_id = self.prefix.rstrip("/").rsplit("/", 1)[-1]
            raise NotInRun(f"run {run_id} is finished: its model is {found}; launch a new run (another run_name)")
        return writers

    def candidate(self, writers: Sequence[str] | None = None) -> str | None:
        """``s3://.../nodes/<writer>/model.tar.gz`` of the run's writer that wrote its candidate and the digest beside
        it (at most one: a finished run is never launched again); None when none did. Folders of instances that the
        run's records do not name are not the run's, whatever they hold."""
        keys = set(self._keys(NODES))
        writers = self.writers() if writers is None else writers
        done = [w for w in writers if {f"{NODES}{w}/{CANDIDATE}", f"{NODES}{w}/{DIGEST}"} <= keys]
        if len(done) > 1:
            raise NotInRun(f"s3://{self.bucket}/{self.prefix}: writers {', '.join(done)} each wrote a candidate.")
        return f"s3://{self.bucket}/{self.prefix}{NODES}{done[0]}/{CANDIDATE}" if done else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="s3://bucket/<run prefix>/")
    commands = parser.add_subparsers(dest="command", required=True)
    join = commands.add_parser("join", help="wait for this launch's record; the run's writers, one per line")
    join.add_argument("--reservation", required=True)
    join.add_argument("--writer", required=True)
    join.add_argument("--timeout", type=float, default=300.0)
    commands.add_parser("candidate", help="the run's model.tar.gz (exit status 1: none yet)")
    args = parser.parse_args(argv)
    try:
        lineage = Lineage(args.run)
        if args.command == "join":
            for writer in lineage.join(args.reservation, args.writer, timeout=args.timeout):
                print(writer)
        else:
            found = lineage.candidate()
            if found is None:
                print(f"run_lineage: {args.run} has no candidate", file=sys.stderr)
                return 1
            print(found)
    except (NotInRun, RuntimeError, ValueError) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
