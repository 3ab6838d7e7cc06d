"""The checkpoints' copy in S3 (checkpoint_sync.py) with the real AWS CLI (v1, the one aws-cdk-lib ships) against a
moto server: two slots written in turn, SSE-KMS with the platform key, the newest complete one restored, and a slot
whose upload stopped halfway never restored; a resumed run restores from its own earlier instances' folders only."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from proving_ground.rehearsal.training_steps import launcher_handler
from tests.training_assets.moto_host import REGION, host_client, host_tools
from training_assets.instance.checkpoint_sync import MARKER, S3Checkpoints, is_complete, restore_newest, write_marker
from training_assets.instance.run_lineage import Lineage, NotInRun

BUCKET = "checkpoint-sync"
PREFIX = "training-output/r-0123/checkpoints/"
AwsCli = Callable[[Sequence[str]], str]


@pytest.fixture(scope="module")
def aws(aws_cli: Path, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsCli]:
    """``aws ARGS`` as the host runs it (moto_host.host_tools: the real CLI, each call forked from one call server)."""
    with host_tools(aws_cli, moto_endpoint, tmp_path_factory.mktemp("host")) as (bin_dir, environment, gate):

        def run(arguments: Sequence[str]) -> str:
            result = subprocess.run([bin_dir / "aws", *arguments], env=environment, capture_output=True, text=True,
                                    check=False)  # fmt: skip
            if result.returncode:
                raise RuntimeError(result.stderr)
            return result.stdout

        yield run
        assert {record.operation for record in gate.records()} >= {"PutObject", "ListObjectsV2"}  # they went there


def _checkpoint(root: Path, step: int) -> Path:
    folder = root / f"checkpoint-{step}"
    (folder / "nested").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes([step]) * 1000)
    (folder / "nested" / "rng_state_0.pth").write_bytes(b"r" * step)
    write_marker(folder, step)
    return folder


@pytest.mark.slow
def test_checkpoints_take_turns_in_two_encrypted_slots_and_the_newest_complete_one_comes_back(
    aws: AwsCli, moto_endpoint: str, tmp_path: Path
) -> None:
    s3 = host_client("s3", moto_endpoint)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    key = host_client("kms", moto_endpoint).create_key()["KeyMetadata"]["Arn"]
    remote = S3Checkpoints(f"s3://{BUCKET}/{PREFIX}", kms_key_id=key, aws=aws)
    local = tmp_path / "node-a"

    assert remote.newest() is None and remote.restore(tmp_path / "empty") is None
    for step in (5, 10, 15):
        assert remote.upload(_checkpoint(local, step))
    assert not remote.upload(local / "checkpoint-15")  # already there
    slots = remote.slots()
    # 5 went to slot-0, 10 to slot-1, 15 over the older of the two (slot-0): the newest complete one is never hit.
    assert {slot: marker and marker["step"] for slot, marker in slots.items()} == {"slot-0": 15, "slot-1": 10}
    for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]:
        head = s3.head_object(Bucket=BUCKET, Key=item["Key"])
        assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", key), item["Key"]

    restored = remote.restore(tmp_path / "node-b")
    assert restored == tmp_path / "node-b" / "checkpoint-15" and is_complete(restored)
    assert (restored / "nested" / "rng_state_0.pth").read_bytes() == b"r" * 15

    # An upload of 20 stopped after marking slot-1 as being written: slot-0 (15) stays the newest complete one.
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}slot-1/{MARKER}", Body=b'{"state": "writing", "step": 20}')
    newest = remote.newest()
    assert newest is not None and newest[1]["step"] == 15
    # A slot missing one of its marker's files is not complete either: nothing is left to resume from.
    s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}slot-0/nested/rng_state_0.pth")
    assert remote.newest() is None and remote.restore(tmp_path / "node-c") is None


def test_a_checkpoint_copies_in_one_call_unless_a_folder_name_holds_a_glob_character(tmp_path: Path) -> None:
    """The CLI prefixes --include patterns with the source folder unescaped: a name's glob characters are bracketed,
    and a folder with one in its name is copied file by file."""
    calls: list[list[str]] = []
    remote = S3Checkpoints(f"s3://{BUCKET}/{PREFIX}", kms_key_id="key", aws=lambda args: calls.append([*args]) or "")
    for root in (tmp_path / "plain", tmp_path / "odd[1]"):
        folder = _checkpoint(root, 5)
        (folder / "a*b?.bin").write_bytes(b"x")
        write_marker(folder, 5)
        calls.clear()
        assert remote.upload(folder)
        copies = [call for call in calls if call[:2] == ["s3", "cp"]][1:-1]  # between the two markers
        if root.name == "plain":
            (files,) = copies
            assert files[-8:] == ["--exclude", "*", "--include", "a[*]b[?].bin", "--include", "model.safetensors",
                                  "--include", "nested/rng_state_0.pth"]  # fmt: skip
        else:
            assert sorted(call[-1].removeprefix(remote.uri) for call in copies) == [
                "slot-0/a*b?.bin", "slot-0/model.safetensors", "slot-0/nested/rng_state_0.pth"]  # fmt: skip


@pytest.mark.slow
def test_a_resumed_run_restores_from_its_own_earlier_writers_only(
    aws: AwsCli, moto_endpoint: str, tmp_path: Path
) -> None:
    """Run B was launched twice: its first instance uploaded checkpoints up to 7, its second (a resume) up to 5 before
    it failed, and B is launched a third time. An instance of run A planted checkpoint 9 in a folder of its own
    inside B's prefix (the one place under B its role may write). The new instance restores B's 7, the newest among
    the writers the launcher's records (written by its own code) name; A's folder is not among them."""
    s3 = host_client("s3", moto_endpoint)
    bucket = "lineage"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    key = host_client("kms", moto_endpoint).create_key()["KeyMetadata"]["Arn"]
    handler = launcher_handler()
    settings = handler.Settings("lt-0", "1", ("p4d.24xlarge",), 1, bucket, "training-output/", key, "AROAINSTANCES")
    run = f"s3://{bucket}/training-output/run-b/"
    handler.record(s3, "run-b", "r-0b000001", ["i-0b000001"], settings)
    S3Checkpoints(f"{run}nodes/AROAINSTANCES:i-0b000001/checkpoints/", kms_key_id=key, aws=aws).upload(
        _checkpoint(tmp_path / "b-first", 7)
    )
    handler.record(s3, "run-b", "r-0b000002", ["i-0b000002"], settings)
    S3Checkpoints(f"{run}nodes/AROAINSTANCES:i-0b000002/checkpoints/", kms_key_id=key, aws=aws).upload(
        _checkpoint(tmp_path / "b-second", 5)
    )
    S3Checkpoints(f"{run}nodes/AROAINSTANCES:i-0a000001/checkpoints/", kms_key_id=key, aws=aws).upload(
        _checkpoint(tmp_path / "a-attacker", 9)
    )
    handler.record(s3, "run-b", "r-0b000003", ["i-0b000003"], settings)  # the second resume

    lineage = Lineage(run, aws=aws)
    writers = lineage.join("r-0b000003", "AROAINSTANCES:i-0b000003", timeout=0)
    assert writers == [f"AROAINSTANCES:i-0b00000{n}" for n in (1, 2, 3)]
    sources = [S3Checkpoints(f"{run}nodes/{writer}/checkpoints/", aws=aws) for writer in reversed(writers)]
    restored = restore_newest(tmp_path / "b-third", sources)
    assert restored == tmp_path / "b-third" / "checkpoint-7" and is_complete(restored)
    # Not a member of B: A's instance finds no record naming it, and trains nothing under B.
    with pytest.raises(NotInRun, match="does not name AROAINSTANCES:i-0a000001"):
        lineage.join("r-0b000003", "AROAINSTANCES:i-0a000001", timeout=0)
