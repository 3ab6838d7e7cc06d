"""The publishing tool against moto's S3: names, idempotency, SSE-KMS, list and remove."""

from __future__ import annotations

import tarfile
from pathlib import Path

import boto3
import pytest

from inference_assets.container.contract import validate_model_name
from inference_assets.tools import package_model, publish_models
from inference_assets.tools.publish_models import ModelStore, copy_names

BUCKET = "artifacts"
PREFIX = "multi-model/"


@pytest.fixture
def aws(mocked_aws: str):
    s3 = boto3.client("s3", region_name=mocked_aws)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": mocked_aws})
    key = boto3.client("kms", region_name=mocked_aws).create_key()["KeyMetadata"]["Arn"]
    return s3, key


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "model.tar.gz"
    path.write_bytes(b"archive one" * 100)
    return path


@pytest.mark.parametrize("name", ["sentiment-0001.tar.gz", "tenant-a/v2/model_1.tar.gz", "A.b-c_d.tar.gz"])
def test_valid_names(name):
    assert validate_model_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "model.zip",
        "",
        "../escape.tar.gz",
        "a/../b.tar.gz",
        "/abs.tar.gz",
        "with space.tar.gz",
        "-dash.tar.gz",
        "a//b.tar.gz",
        "ümlaut.tar.gz",
        "x" * 1025 + ".tar.gz",
    ],
)
def test_invalid_names_are_refused_with_the_rule(name):
    with pytest.raises(ValueError, match="model name"):
        validate_model_name(name)


def test_copy_names_are_numbered_and_template_must_vary():
    assert copy_names(3) == ["sentiment-0000.tar.gz", "sentiment-0001.tar.gz", "sentiment-0002.tar.gz"]
    with pytest.raises(ValueError, match="index"):
        copy_names(2, "same.tar.gz")
    with pytest.raises(ValueError, match="at least 1"):
        copy_names(0)


def test_prefix_must_end_with_slash(aws):
    s3, _ = aws
    with pytest.raises(ValueError, match="ending in '/'"):
        ModelStore(s3, BUCKET, "multi-model")


def test_publish_copies_encrypts_and_is_idempotent(aws, archive):
    s3, key = aws
    store = ModelStore(s3, BUCKET, PREFIX, kms_key=key)
    names = copy_names(5)

    first = store.publish(archive, names)
    assert (len(first.uploaded), len(first.copied), first.skipped) == (1, 4, [])
    for name in names:
        head = s3.head_object(Bucket=BUCKET, Key=PREFIX + name)
        assert head["ServerSideEncryption"] == "aws:kms"
        assert head["SSEKMSKeyId"] == key
        assert head["Metadata"]["sha256"] == publish_models.file_digest(archive)
        assert s3.get_object(Bucket=BUCKET, Key=PREFIX + name)["Body"].read() == archive.read_bytes()

    again = store.publish(archive, names)
    assert (again.uploaded, again.copied, sorted(again.skipped)) == ([], [], sorted(names))

    archive.write_bytes(b"a new model version")  # changed content is published again
    changed = store.publish(archive, names[:2])
    assert (len(changed.uploaded), len(changed.copied), changed.skipped) == (1, 1, [])


def test_publish_refuses_bad_input_before_touching_s3(aws, archive, tmp_path):
    s3, _ = aws
    store = ModelStore(s3, BUCKET, PREFIX)
    with pytest.raises(ValueError, match="model name"):
        store.publish(archive, ["ok.tar.gz", "bad name.tar.gz"])
    with pytest.raises(ValueError, match="unique"):
        store.publish(archive, ["a.tar.gz", "a.tar.gz"])
    with pytest.raises(FileNotFoundError):
        store.publish(tmp_path / "missing.tar.gz", ["a.tar.gz"])
    assert store.list_models() == []


def test_list_and_remove(aws, archive):
    s3, _ = aws
    store = ModelStore(s3, BUCKET, PREFIX)
    store.publish(archive, ["tenant-a.tar.gz", "tenant-b.tar.gz", "team/tenant-c.tar.gz"])
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "README.txt", Body=b"not a model")
    s3.put_object(Bucket=BUCKET, Key="elsewhere/tenant-z.tar.gz", Body=b"outside the prefix")

    listed = store.list_models()
    assert sorted(m["name"] for m in listed) == ["team/tenant-c.tar.gz", "tenant-a.tar.gz", "tenant-b.tar.gz"]
    assert all(m["size"] == archive.stat().st_size for m in listed)

    assert store.remove(["tenant-a.tar.gz"]) == ["tenant-a.tar.gz"]
    assert sorted(m["name"] for m in store.list_models()) == ["team/tenant-c.tar.gz", "tenant-b.tar.gz"]


def test_cli_publish_list_remove_all(aws, archive, capsys):
    s3, key = aws
    common = ["--bucket", BUCKET, "--prefix", PREFIX]
    assert publish_models.main(["publish", *common, "--archive", str(archive), "--copies", "3", "--kms-key", key]) == 0
    assert "uploaded 1, copied 2, already published 0" in capsys.readouterr().out
    publish_models.main(["publish", *common, "--archive", str(archive), "--copies", "3", "--kms-key", key])
    assert "uploaded 0, copied 0, already published 3" in capsys.readouterr().out

    publish_models.main(["list", *common])
    listing = capsys.readouterr()
    assert listing.out.splitlines()[0].startswith("sentiment-0000.tar.gz\t")
    assert "3 models under" in listing.err

    publish_models.main(["remove", *common, "--all"])
    assert "removed 3 models" in capsys.readouterr().out
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["KeyCount"] == 0


def _package(tiny_model_dir: Path, output: Path, *options: str) -> int:
    return publish_models.main(["package", "--model-dir", str(tiny_model_dir), "--output", str(output), *options])


def _names(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return set(tar.getnames())


def test_cli_package_builds_a_djl_archive_by_default(tiny_model_dir, tmp_path, capsys):
    output = tmp_path / "sentiment.tar.gz"
    assert _package(tiny_model_dir, output, "--max-workers", "3") == 0
    assert capsys.readouterr().out.strip() == str(output)
    with tarfile.open(output) as tar:
        names = set(tar.getnames())
        properties = tar.extractfile("serving.properties").read().decode()
    expected = {"model.py", "serving.properties", "code/sentiment_serving/predictor.py", "config.json"}
    assert expected <= names
    # DJL Serving 0.36 (djl_python/service_loader.py load_model_service, tag v0.36.0) imports model.py only when the
    # model directory has no MAR-INF/MANIFEST.json; with one it loads TorchServe's handler instead.
    assert not [name for name in names if name.startswith("MAR-INF/")]
    assert "maxWorkers=3" in properties.splitlines()


def test_the_package_command_builds_for_djl_only(tiny_model_dir, tmp_path, capsys):
    """The endpoint runs DJL Serving only: the command has no --model-server to choose another server with."""
    with pytest.raises(SystemExit) as exit_info:
        _package(tiny_model_dir, tmp_path / "x.tar.gz", "--model-server", "torchserve")
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --model-server torchserve" in capsys.readouterr().err
    assert not (tmp_path / "x.tar.gz").exists()


def test_cli_package_vendors_for_the_djl_image(tiny_model_dir, tmp_path, monkeypatch):
    calls = []

    def fake_vendor(target, *, platforms, python_version):
        calls.append((platforms[0], python_version))
        target.mkdir(parents=True)
        (target / "vendored_marker.py").write_text("")
        return target

    monkeypatch.setattr(package_model, "vendor_dependencies", fake_vendor)
    output = tmp_path / "vendored.tar.gz"
    assert _package(tiny_model_dir, output, "--vendor") == 0
    assert calls == [("manylinux_2_35_x86_64", "3.11")]  # DJL 0.36.0 CPU: x86_64 Ubuntu 22.04, Python 3.11
    assert {"code/lib/vendored_marker.py", "model.py"} <= _names(output)


def test_cli_package_refuses_bad_worker_bounds(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="min_workers"):
        publish_models.main(["package", "--model-dir", str(tiny_model_dir), "--output", str(tmp_path / "x.tar.gz"),
                             "--min-workers", "5", "--max-workers", "2"])  # fmt: skip
