"""Package models for the multi-model endpoint and publish, list and remove them under its S3 prefix.

An archive is built for the endpoint's model server, DJL Serving: ``model.py`` + ``serving.properties`` at the root,
the serving package's shared modules and its DJL adapter in ``code/``.

    # one archive from a model directory (model files at the root of the directory)
    python -m inference_assets.tools.publish_models package --model-dir out/model --output sentiment.tar.gz
    # 1,000 copies for a load test (as in AWS's multi-model load-test set-up), or one archive per tenant
    python -m inference_assets.tools.publish_models publish --archive sentiment.tar.gz --copies 1000 \\
        --bucket BUCKET --prefix multi-model/ --kms-key KEY_ARN
    python -m inference_assets.tools.publish_models publish --archive tenant-a.tar.gz --name tenant-a.tar.gz \\
        --bucket BUCKET --prefix multi-model/ --kms-key KEY_ARN
    python -m inference_assets.tools.publish_models list --bucket BUCKET --prefix multi-model/
    python -m inference_assets.tools.publish_models remove --bucket BUCKET --prefix multi-model/ --all

Publishing is idempotent: each object carries the archive's SHA-256 in its metadata, and an object that already
holds the same digest is skipped. Copies are made inside S3 (CopyObject) after one upload.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference_assets.container.contract import (
    ARCHIVE_SUFFIX,
    DjlModelSettings,
    validate_model_name,
    validate_prefix,
)
from inference_assets.tools import package_model

DIGEST_KEY = "sha256"  # user metadata; an ETag is no content hash under SSE-KMS
DEFAULT_NAME_TEMPLATE = "sentiment-{index:04d}.tar.gz"
# The Python of the endpoint's image (settings multi_model_endpoint.djl_image): DJL 0.36.0 CPU runs 3.11 on x86_64
# Ubuntu 22.04 (glibc 2.35). Vendored wheels must match.
VENDOR_PYTHON = "3.11"
VENDOR_PLATFORMS_X86 = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1))


def copy_names(copies: int, template: str = DEFAULT_NAME_TEMPLATE) -> list[str]:
    """Names of ``copies`` load-test copies, e.g. sentiment-0000.tar.gz .. sentiment-0999.tar.gz."""
    if copies < 1:
        raise ValueError(f"copies must be at least 1, got {copies}")
    names = [template.format(index=index) for index in range(copies)]
    if len(set(names)) != copies:
        raise ValueError(f"name template {template!r} must contain {{index}} so that every copy gets its own name")
    return [validate_model_name(name) for name in names]


def build_archive(
    model_dir: Path,
    output: Path,
    *,
    settings: DjlModelSettings | None = None,
    vendor_dir: Path | None = None,
) -> Path:
    """One model.tar.gz for DJL Serving: the serving package (shared modules + DJL adapter), ``model.py`` and
    ``serving.properties`` (from ``settings``), and no manifest."""
    properties = (settings or DjlModelSettings()).render().encode()
    extra_files: dict[str, Path | bytes] = {"model.py": package_model.DJL_ENTRY_POINT, "serving.properties": properties}
    # No MAR-INF/MANIFEST.json: DJL Serving 0.36's Python engine imports model.py only when the model directory has no
    # manifest; with one it loads the manifest's handler through TorchServe's ts.model_loader instead
    # (djl_python/service_loader.py load_model_service, tag v0.36.0).
    return package_model.build_model_archive(
        model_dir, output, extra_files=extra_files, vendor_dir=vendor_dir, server="djl"
    )


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class PublishReport:
    uploaded: list[str]
    copied: list[str]
    skipped: list[str]


class ModelStore:
    """The models under one S3 prefix (the endpoint's ``model_data_url``), encrypted with one KMS key."""

    def __init__(self, s3: Any, bucket: str, prefix: str, kms_key: str | None = None) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.prefix = validate_prefix(prefix)
        self.kms_key = kms_key

    def _encryption(self) -> dict[str, str]:
        if self.kms_key is None:  # the bucket's default encryption applies
            return {}
        return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.kms_key}

    def _digest_of(self, name: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=self.prefix + name)
        except ClientError as error:
            if error.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return head.get("Metadata", {}).get(DIGEST_KEY)

    def publish(
        self,
        archive: Path,
        names: Sequence[str],
        *,
        workers: int = 16,
        progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
    ) -> PublishReport:
        """Put ``archive`` under every name (upload once, copy inside S3); skip names that already hold it."""
        names = [validate_model_name(name, self.prefix) for name in names]
        if len(set(names)) != len(names):
            raise ValueError("model names must be unique")
        if not archive.is_file():
            raise FileNotFoundError(f"archive {archive} does not exist")
        digest = file_digest(archive)
        track = progress or (lambda items, total: items)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            current = dict(zip(names, pool.map(self._digest_of, names), strict=True))
            missing = [name for name in names if current[name] != digest]
            skipped = [name for name in names if current[name] == digest]
            uploaded, copied = [], []
            if missing:
                source, *rest = missing
                self.s3.upload_file(
                    str(archive),
                    self.bucket,
                    self.prefix + source,
                    ExtraArgs={"Metadata": {DIGEST_KEY: digest}, **self._encryption()},
                )
                uploaded.append(source)
                copy_source = {"Bucket": self.bucket, "Key": self.prefix + source}

                def copy(name: str) -> str:
                    self.s3.copy_object(
                        Bucket=self.bucket,
                        Key=self.prefix + name,
                        CopySource=copy_source,
                        MetadataDirective="COPY",
                        **self._encryption(),
                    )
                    return name

                copied = list(track(pool.map(copy, rest), len(rest)))
        return PublishReport(uploaded=uploaded, copied=copied, skipped=skipped)

    def list_models(self) -> list[dict[str, Any]]:
        """Every model archive under the prefix: name, size in bytes, last modified."""
        models = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            for item in page.get("Contents", []):
                name = item["Key"][len(self.prefix) :]
                if name.endswith(ARCHIVE_SUFFIX):
                    models.append({"name": name, "size": item["Size"], "last_modified": item["LastModified"]})
        return models

    def remove(self, names: Sequence[str]) -> list[str]:
        """Delete the named models (1,000 per request); return the names S3 deleted."""
        names = [validate_model_name(name, self.prefix) for name in names]
        deleted = []
        for start in range(0, len(names), 1000):
            chunk = names[start : start + 1000]
            answer = self.s3.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self.prefix + name} for name in chunk], "Quiet": False},
            )
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise RuntimeError(f"S3 refused to delete {first['Key']}: {first['Code']} {first.get('Message', '')}")
            deleted += [item["Key"][len(self.prefix) :] for item in answer.get("Deleted", [])]
        return deleted


def _tqdm_progress(items: Iterable[Any], total: int) -> Iterable[Any]:
    from tqdm import tqdm

    return tqdm(items, total=total, unit="model", desc="copying")


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    package = commands.add_parser("package", help="build one model.tar.gz for the endpoint's model server (DJL)")
    package.add_argument("--model-dir", type=Path, required=True, help="directory with the model and tokenizer files")
    package.add_argument("--output", type=Path, required=True, help="archive to write (.tar.gz)")
    package.add_argument(
        "--vendor",
        action="store_true",
        help="ship transformers & co. in code/lib, built for the DJL image's platform and Python (the endpoint's "
        "containers have no network: without it the image must already hold them)",
    )
    djl = package.add_argument_group("DJL Serving (serving.properties)")
    djl.add_argument("--min-workers", type=int, help="DJL minWorkers (default: DJL's, 1)")
    djl.add_argument("--max-workers", type=int, help="DJL maxWorkers (default: DJL's, #CPU / OMP_NUM_THREADS)")
    defaults = DjlModelSettings()
    djl.add_argument(
        "--max-idle-time",
        type=int,
        help=f"seconds before an idle worker stops (default: {defaults.max_idle_time_seconds})",
    )
    djl.add_argument(
        "--batch-size", type=int, help=f"DJL dynamic batch size (default and only value: {defaults.batch_size})"
    )
    djl.add_argument(
        "--max-batch-delay", type=int, help=f"ms DJL waits to fill a batch (default: {defaults.max_batch_delay_ms})"
    )

    for name, text in (("publish", "put an archive under the prefix"), ("list", "list models"), ("remove", "delete")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--bucket", required=True, help="the artifacts bucket (stack output ModelsBucket)")
        command.add_argument("--prefix", required=True, help="the models prefix (stack output ModelsPrefix)")
        command.add_argument("--region", help="AWS region (default: the SDK's)")
    publish, remove = commands.choices["publish"], commands.choices["remove"]
    publish.add_argument("--archive", type=Path, required=True)
    publish.add_argument("--kms-key", help="KMS key ARN for SSE-KMS (stack output ModelsKmsKey)")
    names = publish.add_mutually_exclusive_group(required=True)
    names.add_argument("--name", action="append", help="model name (TargetModel), e.g. tenant-a.tar.gz; repeatable")
    names.add_argument("--copies", type=int, help="publish this many copies (load tests)")
    publish.add_argument("--name-template", default=DEFAULT_NAME_TEMPLATE, help="names of the copies")
    targets = remove.add_mutually_exclusive_group(required=True)
    targets.add_argument("--name", action="append", help="model name to delete; repeatable")
    targets.add_argument("--all", action="store_true", help="delete every model archive under the prefix")
    return parser


# --option of the package command -> DjlModelSettings field
_DJL_OPTIONS = {
    "min_workers": "min_workers",
    "max_workers": "max_workers",
    "max_idle_time": "max_idle_time_seconds",
    "batch_size": "batch_size",
    "max_batch_delay": "max_batch_delay_ms",
}


def _package(args: argparse.Namespace) -> int:
    given = {option: getattr(args, option) for option in _DJL_OPTIONS if getattr(args, option) is not None}
    settings = DjlModelSettings(**{_DJL_OPTIONS[option]: value for option, value in given.items()})
    with tempfile.TemporaryDirectory() as scratch:
        vendor_dir = None
        if args.vendor:
            vendor_dir = package_model.vendor_dependencies(
                Path(scratch) / "lib", platforms=VENDOR_PLATFORMS_X86, python_version=VENDOR_PYTHON
            )
        print(build_archive(args.model_dir, args.output, settings=settings, vendor_dir=vendor_dir))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    if args.command == "package":
        return _package(args)

    import boto3

    s3 = boto3.client("s3", region_name=args.region)
    store = ModelStore(s3, args.bucket, args.prefix, getattr(args, "kms_key", None))
    if args.command == "publish":
        names = args.name or copy_names(args.copies, args.name_template)
        report = store.publish(args.archive, names, progress=_tqdm_progress)
        print(
            f"uploaded {len(report.uploaded)}, copied {len(report.copied)}, "
            f"already published {len(report.skipped)} under s3://{args.bucket}/{args.prefix}"
        )
    elif args.command == "list":
        models = store.list_models()
        for model in models:
            print(f"{model['name']}\t{model['size']}\t{model['last_modified']:%Y-%m-%dT%H:%M:%SZ}")
        print(f"{len(models)} models under s3://{args.bucket}/{args.prefix}", file=sys.stderr)
    else:
        names = [model["name"] for model in store.list_models()] if args.all else args.name
        print(f"removed {len(store.remove(names))} models from s3://{args.bucket}/{args.prefix}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError) as error:  # PackagingError is a ValueError
        sys.exit(f"error: {error}")
