"""The publishing tool against moto's S3: names, idempotency, SSE-KMS, list and remove."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import boto3
import pytest

from inference_assets.container.contract import DjlModelSettings, validate_model_name
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


def test_the_cli_default_is_the_settings_default():
    from stacks.settings import MultiModelEndpointSettings

    args = publish_models.argument_parser().parse_args(["package", "--model-dir", "m", "--output", "o.tar.gz"])
    assert args.model_server == MultiModelEndpointSettings().model_server


def test_cli_package_model_server_torchserve_builds_the_torchserve_archive(tiny_model_dir, tmp_path):
    output = tmp_path / "sentiment.tar.gz"
    assert _package(tiny_model_dir, output, "--model-server", "torchserve") == 0
    with tarfile.open(output) as tar:
        names = set(tar.getnames())
        manifest = json.loads(tar.extractfile("MAR-INF/MANIFEST.json").read())
    assert manifest["model"]["handler"] == "code/inference.py:handle"
    assert {"code/inference.py", "code/sentiment_serving/predictor.py", "config.json"} <= names
    assert not names & {"model.py", "serving.properties"}  # DJL's files: not needed by TorchServe


def test_cli_package_refuses_an_unknown_model_server_with_the_allowed_ones(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _package(tiny_model_dir, tmp_path / "x.tar.gz", "--model-server", "tgi")
    assert exit_info.value.code == 2
    assert "argument --model-server: invalid choice: 'tgi' (choose from 'djl', 'torchserve')" in capsys.readouterr().err
    assert not (tmp_path / "x.tar.gz").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--model-server", "torchserve", "--max-workers", "2"], "--max-workers sets DJL's serving.properties"),
        (["--model-server", "torchserve", "--max-idle-time", "60"], "--max-idle-time sets DJL's serving.properties"),
        (["--model-server", "torchserve", "--vendor", "djl"], "--vendor djl ships wheels for the djl image"),
        (["--vendor", "torchserve"], "but --model-server is djl"),
    ],
)
def test_cli_package_refuses_options_of_the_other_server(tiny_model_dir, tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as exit_info:
        _package(tiny_model_dir, tmp_path / "x.tar.gz", *options)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: ") and " package " in error.splitlines()[0]  # the package command's usage
    assert message in error
    assert not (tmp_path / "x.tar.gz").exists()


def test_build_archive_refuses_djl_settings_for_torchserve(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="do not apply to a TorchServe archive"):
        publish_models.build_archive(
            tiny_model_dir, tmp_path / "x.tar.gz", model_server="torchserve", settings=DjlModelSettings()
        )


@pytest.mark.parametrize(
    ("options", "python_version", "entry"),
    [
        (["--vendor", "djl"], "3.11", "model.py"),
        (["--vendor"], "3.11", "model.py"),
        (["--model-server", "torchserve", "--vendor"], "3.12", "MAR-INF/MANIFEST.json"),
        (["--model-server", "torchserve", "--vendor", "torchserve"], "3.12", "MAR-INF/MANIFEST.json"),
    ],
)
def test_cli_package_vendors_for_the_chosen_server(tiny_model_dir, tmp_path, monkeypatch, options, python_version,
                                                   entry):  # fmt: skip
    calls = []

    def fake_vendor(target, *, platforms, python_version):
        calls.append((platforms[0], python_version))
        target.mkdir(parents=True)
        (target / "vendored_marker.py").write_text("")
        return target

    monkeypatch.setattr(package_model, "vendor_dependencies", fake_vendor)
    output = tmp_path / "vendored.tar.gz"
    assert _package(tiny_model_dir, output, *options) == 0
    assert calls == [("manylinux_2_35_x86_64", python_version)]
    assert {"code/lib/vendored_marker.py", entry} <= _names(output)


def test_cli_package_refuses_bad_worker_bounds(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="min_workers"):
        publish_models.main(["package", "--model-dir", str(tiny_model_dir), "--output", str(tmp_path / "x.tar.gz"),
                             "--min-workers", "5", "--max-workers", "2"])  # fmt: skip
