"""Resume fixtures that can tell right from wrong (training_assets/instance/checkpoints.py, checkpoint_sync.py):
several complete checkpoints (the newest wins, not the oldest), and ranks whose folders disagree (each node keeps its
own copy: the run resumes from the newest step EVERY rank has complete, never from one a rank lacks).

The ranks run as threads over a process group of threads: ``all_gather_object`` hands every rank each rank's object
and ``barrier`` waits for all of them, as gloo does between processes (the slow tests in test_checkpoints.py run the
real torchrun). Each rank calls the real ``resume_point`` on its own folder."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from training_assets.instance import checkpoints
from training_assets.instance.checkpoint_sync import (
    MARKER,
    SLOTS,
    S3Checkpoints,
    newest_complete,
    upload_newest,
    write_marker,
)
from training_assets.instance.dataset import TrainingInputError
from training_assets.instance.train_config import TrainConfig, parse_args


def _checkpoint(root: Path, step: int, *, complete: bool = True) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * step)
    (folder / "optimizer.pt").write_bytes(b"o" * 3)
    if complete:
        write_marker(folder, step)
    return folder


class ThreadGroup:
    """A process group whose ranks are threads: what resume_point needs of torch.distributed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rank = threading.local()
        self._barrier = threading.Barrier(size, timeout=30)
        self._slots: list[Any] = [None] * size

    def all_gather_object(self, output: list[Any], obj: Any) -> None:
        self._slots[self.rank.value] = obj
        self._barrier.wait()  # every rank has put its object
        output[:] = list(self._slots)
        self._barrier.wait()  # every rank has read them all before the next gather reuses the slots

    def barrier(self) -> None:
        self._barrier.wait()

    def run(self, work: Callable[[int], Any]) -> list[Any]:
        def as_rank(rank: int) -> Any:
            self.rank.value = rank
            return work(rank)

        with ThreadPoolExecutor(self.size) as pool:
            return list(pool.map(as_rank, range(self.size)))


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], ThreadGroup]:
    def make(size: int) -> ThreadGroup:
        made = ThreadGroup(size)
        monkeypatch.setattr(checkpoints, "_distributed", lambda: True)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda: size)
        monkeypatch.setattr(torch.distributed, "all_gather_object", made.all_gather_object)
        monkeypatch.setattr(torch.distributed, "barrier", made.barrier)
        return made

    return make


def _resume(group: ThreadGroup, roots: Sequence[Path]) -> list[str | None]:
    """Every rank's resume point, each on its own checkpoint folder (one rank per node: each is local rank 0)."""
    return group.run(lambda rank: checkpoints.resume_point(_config(roots[rank]), local_process_zero=True))


def _config(root: Path) -> TrainConfig:
    return TrainConfig(output_dir=str(root.parent), checkpoint_dir=str(root), checkpoint_steps=5)


def test_of_several_complete_checkpoints_a_run_resumes_from_the_newest(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (5, 10, 15):
        _checkpoint(root, step)
    _checkpoint(root, 20, complete=False)  # being written when the run stopped
    assert newest_complete(root) == root / "checkpoint-15"
    assert checkpoints.resume_point(_config(root), local_process_zero=True) == str(root / "checkpoint-15")


def test_ranks_that_agree_resume_from_the_newest_checkpoint_they_share(tmp_path: Path, group) -> None:
    roots = [tmp_path / f"node-{rank}" for rank in range(2)]
    for root in roots:
        for step in (5, 10):
            _checkpoint(root, step)
    assert _resume(group(2), roots) == [str(root / "checkpoint-10") for root in roots]


def test_ranks_that_disagree_resume_from_the_newest_step_every_rank_has(tmp_path: Path, group) -> None:
    # Node 0 finished step 15; node 1 died while writing it (no marker); node 2's copy of it was cut short. All three
    # have 5 and 10 complete: they resume from 10 (not 15, which two ranks lack; not 5, the oldest).
    roots = [tmp_path / f"node-{rank}" for rank in range(3)]
    for root in roots:
        _checkpoint(root, 5), _checkpoint(root, 10)
    _checkpoint(roots[0], 15)
    _checkpoint(roots[1], 15, complete=False)
    (_checkpoint(roots[2], 15) / "optimizer.pt").write_bytes(b"o")
    assert _resume(group(3), roots) == [str(root / "checkpoint-10") for root in roots]


def test_a_rank_behind_the_others_holds_every_rank_back(tmp_path: Path, group) -> None:
    # The lagging rank is not rank 0: rank 0 alone must not decide.
    roots = [tmp_path / f"node-{rank}" for rank in range(2)]
    for step in (5, 10, 15):
        _checkpoint(roots[0], step)
    _checkpoint(roots[1], 5), _checkpoint(roots[1], 10)
    assert _resume(group(2), roots) == [str(root / "checkpoint-10") for root in roots]


def test_ranks_without_a_common_step_start_afresh_and_clear_their_folders(tmp_path: Path, group) -> None:
    roots = [tmp_path / "node-0", tmp_path / "node-1"]
    _checkpoint(roots[0], 10)
    _checkpoint(roots[1], 5)
    assert _resume(group(2), roots) == [None, None]
    assert [list(root.iterdir()) for root in roots] == [[], []]


def test_a_finished_run_on_one_node_makes_every_rank_start_afresh(tmp_path: Path, group) -> None:
    roots = [tmp_path / "node-0", tmp_path / "node-1"]
    for root in roots:
        _checkpoint(root, 5)
    checkpoints.finish(_config(roots[0]), local_process_zero=True)
    assert _resume(group(2), roots) == [None, None]


# ------------------------------------------------------------------------------------------------- S3 slots


class FakeS3:
    """A bucket as the AWS CLI shows it to S3Checkpoints: list-objects-v2, ``s3 cp`` of one file and ``s3 cp
    --recursive --exclude * --include ...`` either way. ``calls`` keeps every command (the encryption options too)."""

    def __init__(self, markers: dict[str, dict[str, Any]] | None = None, prefix: str = "run/checkpoints/") -> None:
        self.objects: dict[str, bytes] = {}  # key -> body
        self.calls: list[list[str]] = []
        self.writes: list[str] = []  # every object or file written, in order
        for slot, marker in (markers or {}).items():
            for name, size in marker["files"].items():
                self.objects[f"{prefix}{slot}/{name}"] = b"x" * size
            self.objects[f"{prefix}{slot}/{MARKER}"] = json.dumps(marker).encode()

    @staticmethod
    def _key(uri: str) -> str:
        return uri.removeprefix("s3://").partition("/")[2]

    def _copy(self, source: str, target: str) -> None:
        if target.startswith("s3://"):
            self.objects[self._key(target)] = Path(source).read_bytes()
        else:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            Path(target).write_bytes(self.objects[self._key(source)])

    def __call__(self, arguments: Sequence[str]) -> str:
        arguments = list(arguments)
        self.calls.append(arguments)
        if arguments[:2] == ["s3api", "list-objects-v2"]:
            # The options as the CLI spells them (aws s3api list-objects-v2 help), the JSON rows the query selects.
            assert arguments[2::2] == ["--bucket", "--prefix", "--query", "--output"], arguments
            assert arguments[7:] == ["Contents[].[Key,Size]", "--output", "json"], arguments
            prefix = arguments[arguments.index("--prefix") + 1]
            rows = [[key, len(body)] for key, body in self.objects.items() if key.startswith(prefix)]
            return json.dumps(rows or None)  # the CLI prints null for an empty listing
        assert arguments[:2] == ["s3", "cp"], arguments
        options = [a for a in arguments if a.startswith("--")]
        assert set(options) <= CLI_OPTIONS and "--only-show-errors" in options, arguments
        if "--sse" in arguments:
            assert arguments[arguments.index("--sse") + 1] == "aws:kms", arguments
        if "--recursive" not in arguments:
            self._copy(arguments[-2], arguments[-1])
            self.writes.append(arguments[-1])
            return ""
        exclude = arguments.index("--exclude")  # ... SOURCE/ TARGET/ --exclude * --include NAME ...
        assert arguments[exclude + 1] == "*", arguments
        source, target = arguments[exclude - 2].rstrip("/"), arguments[exclude - 1].rstrip("/")
        for name in (arguments[i + 1] for i, a in enumerate(arguments) if a == "--include"):
            self._copy(f"{source}/{name}", f"{target}/{name}")
            self.writes.append(f"{target}/{name}")
        return ""


# The `aws s3 cp` options S3Checkpoints may use (aws s3 cp help).
CLI_OPTIONS = {"--recursive", "--only-show-errors", "--sse", "--sse-kms-key-id", "--exclude", "--include"}


def _marker(step: int) -> dict[str, Any]:
    return {"state": "complete", "step": step, "files": {"model.safetensors": step}}


@pytest.mark.parametrize("newer_slot", SLOTS)
def test_the_newest_of_two_complete_slots_is_the_one_restored(newer_slot: str) -> None:
    older_slot = SLOTS[1 - SLOTS.index(newer_slot)]
    remote = S3Checkpoints(
        "s3://bucket/run/checkpoints/", aws=FakeS3({newer_slot: _marker(20), older_slot: _marker(10)})
    )
    newest = remote.newest()
    assert newest is not None and newest[0] == newer_slot and newest[1]["step"] == 20


# ------------------------------------------------------------------ what mutation testing found untested (fast)


def test_a_resumed_run_keeps_its_checkpoints_and_says_where_it_resumes(tmp_path: Path, capsys) -> None:
    root = tmp_path / "checkpoints"
    for step in (5, 10):
        _checkpoint(root, step)
    assert checkpoints.resume_point(_config(root), local_process_zero=True) == str(root / "checkpoint-10")
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-10", "checkpoint-5"]  # nothing cleared
    assert capsys.readouterr().err == f"train_sentiment: resuming from {root / 'checkpoint-10'} (step 10)\n"
    checkpoints.resume_point(_config(root), local_process_zero=False)
    assert capsys.readouterr().err == ""  # one line per node, from its local process zero


def test_only_a_nodes_local_process_zero_clears_a_stale_folder(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _checkpoint(root, 5, complete=False)
    (root / checkpoints.FINISHED).write_text("{}")
    assert checkpoints.resume_point(_config(root), local_process_zero=False) is None
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-5", checkpoints.FINISHED]
    assert checkpoints.resume_point(_config(root), local_process_zero=True) is None
    assert list(root.iterdir()) == []


def test_only_a_checkpointing_runs_local_process_zero_marks_the_folder_finished(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    root.mkdir()
    checkpoints.finish(_config(root), local_process_zero=False)
    checkpoints.finish(TrainConfig(output_dir=str(tmp_path), checkpoint_dir=str(root)), local_process_zero=True)
    assert list(root.iterdir()) == []
    checkpoints.finish(_config(root), local_process_zero=True)
    assert [p.name for p in root.iterdir()] == [checkpoints.FINISHED]


@pytest.mark.parametrize(("seconds", "refused"), [(29, True), (30, False), (31, False)])
def test_the_collective_timeout_is_at_least_30_seconds(tmp_path: Path, seconds: int, refused: bool) -> None:
    # TrainConfig checks itself (checkpoints.check) when it is made, as the command line makes it.
    if refused:
        with pytest.raises(
            TrainingInputError, match=f"^collective_timeout_seconds must be at least 30, got {seconds}$"
        ):
            TrainConfig(output_dir=str(tmp_path), collective_timeout_seconds=seconds)
    else:
        checkpoints.check(TrainConfig(output_dir=str(tmp_path), collective_timeout_seconds=seconds))


@pytest.mark.parametrize(("steps", "refused"), [(-1, True), (0, False), (1, False)])
def test_checkpoint_steps_are_zero_or_more(tmp_path: Path, steps: int, refused: bool) -> None:
    # TrainConfig checks itself (checkpoints.check) when it is made, as the command line makes it.
    if refused:
        with pytest.raises(TrainingInputError, match=r"^checkpoint_steps must be 0 \(off\) or more, got -1$"):
            TrainConfig(output_dir=str(tmp_path), checkpoint_steps=steps)
    else:
        checkpoints.check(TrainConfig(output_dir=str(tmp_path), checkpoint_steps=steps))


def test_the_command_line_reaches_the_checkpoint_settings_and_the_report(tmp_path: Path) -> None:
    config = parse_args(["--output-dir", str(tmp_path), "--checkpoint-steps", "7", "--checkpoint-dir",
                         str(tmp_path / "ck"), "--collective-timeout", "90"])  # fmt: skip
    assert (config.checkpoint_steps, config.checkpoint_dir, config.collective_timeout_seconds) == (
        7,
        str(tmp_path / "ck"),
        90,
    )
    defaults = parse_args(["--output-dir", str(tmp_path)])
    assert (defaults.checkpoint_steps, defaults.checkpoint_dir, defaults.collective_timeout_seconds) == (0, None, 300)
    assert checkpoints.report(config, "x/checkpoint-7") == {"checkpoints": {
        "every_steps": 7, "folder": str(tmp_path / "ck"), "resumed_from": "x/checkpoint-7",
        "marker": "checkpoint-complete.json", "collective_timeout_seconds": 90,
        "compile_collective_timeout_seconds": None}}  # fmt: skip
    assert checkpoints.report(defaults, None)["checkpoints"]["every_steps"] is None
    assert [type(c) for c in checkpoints.callbacks(config)] == [checkpoints.CompleteMarker]
    assert checkpoints.callbacks(defaults) == []


def test_a_saved_checkpoint_is_marked_complete_by_each_nodes_local_process_zero(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-12"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w" * 12)
    args = type("Args", (), {"output_dir": str(tmp_path)})()

    def save(local_zero: bool) -> None:
        state = type("State", (), {"global_step": 12, "is_local_process_zero": local_zero})()
        checkpoints.CompleteMarker().on_save(args, state, None)

    save(False)
    assert not (folder / MARKER).exists()
    save(True)
    assert json.loads((folder / MARKER).read_text()) == {"state": "complete", "step": 12,
                                                         "files": {"model.safetensors": 12}}  # fmt: skip


KMS = "arn:aws:kms:us-west-2:111122223333:key/platform"


def _remote(fake: FakeS3) -> S3Checkpoints:
    return S3Checkpoints("s3://bucket/run/checkpoints/", kms_key_id=KMS, aws=fake)


def _slots(fake: FakeS3) -> dict[str, int | None]:
    return {slot: (marker or {}).get("step") for slot, marker in _remote(fake).slots().items()}


def test_uploads_take_turns_and_never_overwrite_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    fake, root = FakeS3(), tmp_path / "checkpoints"
    for step, expected in ((5, {"slot-0": 5, "slot-1": None}), (10, {"slot-0": 5, "slot-1": 10}),
                           (15, {"slot-0": 15, "slot-1": 10}), (20, {"slot-0": 15, "slot-1": 20})):  # fmt: skip
        _checkpoint(root, step)
        assert upload_newest(root, _remote(fake), log=lambda _: None) == step
        assert _slots(fake) == expected
    assert upload_newest(root, _remote(fake), log=lambda _: None) is None  # S3 holds it already
    # Every upload is SSE-KMS with the platform key; a slot is marked as being written first and complete last.
    writes = [call for call in fake.calls if _writes_to_s3(call)]
    assert writes and all("--sse-kms-key-id" in call and call[call.index("--sse-kms-key-id") + 1] == KMS
                          for call in writes)  # fmt: skip
    uploaded = [write for write in fake.writes if write.startswith("s3://")]
    last = [write.removeprefix("s3://bucket/run/checkpoints/slot-1/") for write in uploaded][-4:]
    assert last == ["checkpoint-complete.json", "model.safetensors", "optimizer.pt", "checkpoint-complete.json"]


def _writes_to_s3(call: list[str]) -> bool:
    if call[:2] != ["s3", "cp"]:
        return False
    target = call[call.index("--exclude") - 1] if "--recursive" in call else call[-1]
    return target.startswith("s3://")


def test_a_slot_being_written_or_with_a_file_of_another_size_is_not_complete() -> None:
    fake = FakeS3({"slot-0": _marker(10), "slot-1": _marker(20)})
    fake.objects["run/checkpoints/slot-1/model.safetensors"] = b"x" * 19  # cut short
    assert _slots(fake) == {"slot-0": 10, "slot-1": None}
    fake.objects["run/checkpoints/slot-0/checkpoint-complete.json"] = b'{"state": "writing", "step": 30}'
    assert _slots(fake) == {"slot-0": None, "slot-1": None} and _remote(fake).newest() is None


def test_restore_brings_back_the_newest_complete_checkpoint_unless_the_folder_holds_it_or_a_newer(
    tmp_path: Path,
) -> None:
    fake = FakeS3({"slot-0": _marker(10), "slot-1": _marker(20)})
    root = tmp_path / "checkpoints"
    restored = _remote(fake).restore(root)
    assert restored == root / "checkpoint-20" and newest_complete(root) == restored
    assert (restored / "model.safetensors").read_bytes() == b"x" * 20
    calls = len(fake.calls)
    assert _remote(fake).restore(root) == restored
    assert not [call for call in fake.calls[calls:] if str(root) in " ".join(call)]  # nothing downloaded again
    _checkpoint(root, 25)
    assert _remote(fake).restore(root) == root / "checkpoint-25"
    assert _remote(FakeS3()).restore(tmp_path / "empty") is None


def test_uploading_needs_the_key(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 5)
    with pytest.raises(ValueError, match="needs the KMS key"):
        S3Checkpoints("s3://bucket/run/checkpoints/", aws=FakeS3()).upload(tmp_path / "checkpoint-5")


def test_the_local_bookkeeping_of_checkpoints(tmp_path: Path) -> None:
    """Folders that are no checkpoint are skipped; the manifest lists every file but the marker and hidden temporaries
    (a marker being written), nested files included; a marker that is not a complete one, or lists no files, is none."""
    from training_assets.instance.checkpoint_sync import complete_checkpoints, manifest, read_marker, step_of

    (tmp_path / "runs").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    folder = _checkpoint(tmp_path, 5, complete=False)
    (folder / "nested").mkdir()
    (folder / "nested" / "rng.pth").write_bytes(b"r" * 4)
    (folder / ".marker-abc").write_text("{")
    write_marker(folder, 5)
    assert manifest(folder) == {"model.safetensors": 5, "nested/rng.pth": 4, "optimizer.pt": 3}
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [5]
    assert step_of(tmp_path / "runs") is None and step_of(folder) == 5
    assert [p.name for p in folder.iterdir() if p.name.startswith(".marker-")] == [".marker-abc"]  # its own is gone
    for text in ('{"state": "writing", "files": {}}', '{"state": "complete", "files": []}', "[]", "{", b"\xff"):
        assert read_marker(text) is None, text
    assert read_marker('{"state": "complete", "files": {}}') == {"state": "complete", "files": {}}


def test_a_run_prefix_without_a_slash_is_a_folder_and_only_s3_uris_are_taken() -> None:
    fake = FakeS3({"slot-0": _marker(10)})
    assert S3Checkpoints("s3://bucket/run/checkpoints", aws=fake).newest() is not None
    assert S3Checkpoints("s3://bucket/run/checkpoints", aws=fake).uri == "s3://bucket/run/checkpoints/"
    with pytest.raises(ValueError, match=r"^/data/checkpoints is not an s3:// URI$"):
        S3Checkpoints("/data/checkpoints")


def test_a_restored_checkpoint_with_several_files_in_one_folder_is_complete(tmp_path: Path) -> None:
    marker = {"state": "complete", "step": 7, "files": {"nested/a.pth": 2, "nested/b.pth": 3, "model.safetensors": 7}}
    fake = FakeS3({"slot-1": marker})
    restored = _remote(fake).restore(tmp_path)
    assert restored == tmp_path / "checkpoint-7" and (restored / "nested" / "b.pth").read_bytes() == b"xxx"


@pytest.mark.parametrize("newest_writer", [0, 1, 2])
def test_a_run_launched_again_restores_the_newest_checkpoint_of_any_earlier_writer(
    tmp_path: Path, newest_writer: int
) -> None:
    """Three earlier writers of the run hold steps 10 and 20 in their own folders; the one holding step 30 comes first,
    in the middle or last: step 30 is restored, from that writer's folder."""
    from training_assets.instance.checkpoint_sync import restore_newest

    steps = [10, 20]
    steps.insert(newest_writer, 30)
    writers = []
    for n, step in enumerate(steps):
        prefix = f"run/nodes/writer{n}/checkpoints/"
        writers.append(S3Checkpoints(f"s3://bucket/{prefix}", aws=FakeS3({"slot-1": _marker(step)}, prefix=prefix)))
    restored = restore_newest(tmp_path / "checkpoints", writers)
    assert restored == tmp_path / "checkpoints" / "checkpoint-30"
    assert (restored / "model.safetensors").read_bytes() == b"x" * 30


def test_a_marker_of_another_step_does_not_make_a_folder_complete(tmp_path: Path) -> None:
    """checkpoint-20 holding checkpoint-10's marker (a folder copied or renamed by hand) is no checkpoint of step 20:
    resuming from it would train on step 10's weights as if they were step 20's."""
    folder = _checkpoint(tmp_path, 10)
    folder.rename(tmp_path / "checkpoint-20")
    assert newest_complete(tmp_path) is None


def test_the_uploader_looks_for_a_new_checkpoint_once_every_period_and_once_more_when_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``watch --watch 60``: one round (one S3 listing, one CLI start) per 60 s of the clock, not a busy loop, a
    failed round retried on the next, and a last round after SIGTERM. The clock and the signal are the test's."""
    import signal
    from types import SimpleNamespace

    from training_assets.instance import checkpoint_sync

    now = [0.0]
    rounds: list[float] = []
    handlers: dict[int, Any] = {}
    # The module's clock and signals only (the process's own stay as they are).
    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=lambda seconds: now.__setitem__(0, now[0] + seconds))
    signals = SimpleNamespace(SIGTERM=signal.SIGTERM, SIGINT=signal.SIGINT, signal=handlers.__setitem__)
    monkeypatch.setattr(checkpoint_sync, "time", clock)
    monkeypatch.setattr(checkpoint_sync, "signal", signals)

    def upload_round(root: Path, remote: Any, log: Any) -> None:
        rounds.append(now[0])
        if len(rounds) == 2:
            raise RuntimeError("S3 was unreachable")
        if len(rounds) == 4:
            handlers[signal.SIGTERM](signal.SIGTERM, None)

    monkeypatch.setattr(checkpoint_sync, "upload_newest", upload_round)
    logged: list[str] = []
    checkpoint_sync.watch(tmp_path, _remote(FakeS3()), 60, logged.append)
    assert rounds == [0.0, 60.0, 120.0, 180.0, 180.0]  # the fifth: the last round after the stop
    assert [line for line in logged if "retrying in 60 s" in line] == [
        "checkpoint_sync: upload failed, retrying in 60 s: S3 was unreachable"
    ]
