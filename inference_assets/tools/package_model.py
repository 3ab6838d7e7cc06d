"""Turn a saved model directory into the model.tar.gz the Graviton endpoint's Ray Serve image serves, and upload it.

Layout (SageMaker unpacks it to /opt/ml/model; the image runs ``sentiment_serving.ray_server`` from ``code/``, which
runs ``config.yaml``: the serving contract of AWS's Ray Serve DLC, see container/ray_deployment.py):

    config.json, model.safetensors, tokenizer files ...  the model directory, at the archive root
    config.yaml, deployment.py                           Ray Serve's entry (config.yaml names deployment:app)
    code/sentiment_serving/*.py                          what Ray Serve runs of the ``inference_assets.container``
                                                         package: the shared modules and the ray_* ones

Nothing to install: the image holds every dependency (inference_assets/image/Dockerfile), and the endpoint reaches
no package index. The multi-model endpoint's archives (publish_models) use the same builder with DJL Serving's
modules (``server="djl"``: the shared modules and djl_adapter, no Ray Serve code) and their dependencies as
``code/requirements.txt`` or vendored in ``code/lib`` (``vendor_dependencies``).

The archive is byte-for-byte reproducible: sorted entries, fixed mtime/owner/mode, gzip without name or timestamp.

    python -m inference_assets.tools.package_model --model-dir saved_model --output model.tar.gz \\
        --upload s3://<artifacts-bucket>/endpoints/sentiment/model-v2.tar.gz --kms-key-id <key-arn>
"""

from __future__ import annotations

import argparse
import gzip
import io
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Literal

CONTAINER = Path(__file__).resolve().parents[1] / "container"
DJL_ENTRY_POINT = CONTAINER / "entrypoints" / "model.py"
# Ray Serve's entry at the archive root: `serve run /opt/ml/model/config.yaml` imports deployment:app.
RAY_ENTRY_FILES = {name: CONTAINER / "entrypoints" / name for name in ("config.yaml", "deployment.py")}
# The package's name inside the archive (code/ is on the model server's sys.path).
ARCHIVE_PACKAGE = "sentiment_serving"
REQUIREMENTS = CONTAINER / "requirements.txt"
VENDOR_CONSTRAINTS = CONTAINER / "requirements-vendor.lock"

# Vendoring's default target: Python 3.12 on linux/aarch64 with glibc 2.35 (publish_models passes the x86 images'
# platforms). pip does not widen a manylinux_2_x platform to older glibc tags by itself, so list them all.
VENDOR_ARCH = "aarch64"
VENDOR_GLIBC_MINOR = 35
VENDOR_PLATFORMS = tuple(f"manylinux_2_{minor}_{VENDOR_ARCH}" for minor in range(VENDOR_GLIBC_MINOR, 16, -1))
VENDOR_PYTHON = "3.12"
# Left to the image: torch was built against its numpy, and a second numpy on sys.path would shadow it.
IMAGE_PROVIDED = ("numpy",)
VENDORED_LOCK = "requirements.lock"

_MTIME = 0
_FILE_MODE = 0o644
# Which server's archive: Ray Serve (the Graviton image) or DJL Serving (the multi-model endpoint).
ArchiveServer = Literal["ray", "djl"]
# The modules of ``inference_assets.container`` every archive carries: the request protocol, the predictor and the
# serving contract they read. Each server's archive adds its own modules, and only those: a Ray Serve archive
# carries no DJL adapter, a DJL archive no Ray Serve code (a test lists each archive; another that every module of
# the package is in one of these lists).
SHARED_MODULES = ("__init__.py", "contract.py", "predictor.py", "protocol.py")
SERVER_MODULES: dict[ArchiveServer, tuple[str, ...]] = {
    "ray": ("ray_deployment.py", "ray_server.py", "ray_settings.py"),
    "djl": ("djl_adapter.py",),
}


class PackagingError(ValueError):
    """The model directory or the extra files cannot be packaged as asked; the message says why."""


def _archive_path(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or name.endswith("/"):
        raise PackagingError(f"archive path {name!r} must be a relative file path without '..'")
    return path.as_posix()


def _files_under(root: Path, prefix: str = "") -> dict[str, Path]:
    return {
        prefix + path.relative_to(root).as_posix(): path
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def container_files(server: ArchiveServer | None) -> dict[str, Path]:
    """The archive paths and sources of the modules of ``inference_assets.container`` that ``server`` runs (the
    shared ones alone for ``None``)."""
    names = SHARED_MODULES + (SERVER_MODULES[server] if server is not None else ())
    return {f"code/{ARCHIVE_PACKAGE}/{name}": CONTAINER / name for name in sorted(names)}


def _entries(
    model_dir: Path, extra_files: Mapping[str, Path | bytes], vendor_dir: Path | None, server: ArchiveServer | None
) -> dict[str, Path | bytes]:
    if not (model_dir / "config.json").is_file():
        raise PackagingError(
            f"{model_dir} is not a saved model directory (no config.json); pass --model-dir saved_model"
        )
    entries: dict[str, Path | bytes] = dict(_files_under(model_dir))
    # code/ is the serving package's; a MAR-INF/ manifest would make DJL Serving load a TorchServe handler instead of
    # model.py (publish_models.build_archive).
    if clash := sorted(name for name in entries if name.startswith(("code/", "MAR-INF/"))):
        raise PackagingError(
            f"{model_dir} already holds {clash[0]}; the archive's code/ is the serving package's and it has no MAR-INF/"
        )
    if server == "ray":
        if clash := sorted(set(RAY_ENTRY_FILES) & set(entries)):
            raise PackagingError(f"{model_dir} already holds {clash[0]}; the archive's {clash[0]} is Ray Serve's entry")
        if vendor_dir is not None:
            raise PackagingError("the Ray Serve image holds every dependency: an archive for it vendors nothing")
        entries.update(RAY_ENTRY_FILES)
    elif server not in ("djl", None):
        raise PackagingError(f"server must be ray or djl, got {server!r}")
    entries.update(container_files(server))
    if server != "ray":
        if vendor_dir is None:
            entries["code/requirements.txt"] = REQUIREMENTS
        else:
            if not any(vendor_dir.iterdir()):
                raise PackagingError(f"vendor directory {vendor_dir} is empty")
            entries.update(_files_under(vendor_dir, "code/lib/"))
    for name, source in extra_files.items():
        name = _archive_path(name)
        if name in entries:
            raise PackagingError(f"extra file {name!r} would replace a file the archive already holds")
        if not isinstance(source, bytes) and not Path(source).is_file():
            raise PackagingError(f"extra file {name!r}: {source} is not a file")
        entries[name] = source if isinstance(source, bytes) else Path(source)
    return entries


def build_model_archive(
    model_dir: Path,
    output: Path,
    *,
    extra_files: Mapping[str, Path | bytes] | None = None,
    vendor_dir: Path | None = None,
    server: ArchiveServer | None = "ray",
) -> Path:
    """Write ``output`` (model.tar.gz) from ``model_dir`` plus what ``server`` runs; return ``output``.

    ``extra_files`` maps archive paths to files or contents (e.g. ``{"serving.properties": b"..."}``).
    ``server="ray"`` (the Graviton image): Ray Serve's ``config.yaml`` + ``deployment.py`` and the ray_* modules,
    nothing to install. ``server="djl"``: the DJL adapter, and no entry of its own (publish_models adds DJL's
    ``model.py`` and ``serving.properties``). ``server=None``: the shared modules alone, the caller brings its
    server's entry in ``extra_files`` (the proving ground's TorchServe harness does). For these two, ``vendor_dir``
    holds installed packages (see :func:`vendor_dependencies`) to ship as ``code/lib``; without it the archive
    carries ``code/requirements.txt``.
    """
    model_dir, output = Path(model_dir), Path(output)
    vendor = None if vendor_dir is None else Path(vendor_dir)
    entries = _entries(model_dir, extra_files or {}, vendor, server)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    # filename="" and mtime=0 keep the gzip header free of the output name and the build time.
    with (
        open(partial, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=_MTIME, compresslevel=6) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in sorted(entries):
            source = entries[name]
            data = source if isinstance(source, bytes) else source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), _MTIME, _FILE_MODE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    partial.replace(output)
    return output


def vendor_dependencies(
    target: Path,
    *,
    requirements: Path = REQUIREMENTS,
    constraints: Path | None = VENDOR_CONSTRAINTS,
    platforms: tuple[str, ...] = VENDOR_PLATFORMS,
    python_version: str = VENDOR_PYTHON,
) -> Path:
    """Install ``requirements`` and their dependencies as binary wheels for the endpoint's platform into ``target``.

    Only wheels (``--only-binary=:all:``), resolved for ``platforms``/``python_version`` rather than this machine, so a
    linux/aarch64 Python 3.12 archive can be built on any host; ``constraints`` pins the whole closure so the same
    bytes come out next month. Packages the image owns (numpy) are removed again.
    Writes ``requirements.lock`` (name==version of every vendored distribution) next to the packages.
    """
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
        "--target", str(target), "--python-version", python_version, "--implementation", "cp",
        "--only-binary=:all:", "--requirement", str(requirements),
        *(option for platform in platforms for option in ("--platform", platform)),
        *(("--constraint", str(constraints)) if constraints else ()),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PackagingError(f"vendoring for {platforms[0]} Python {python_version} failed:\n{result.stderr.strip()}")
    for dist_info in target.glob("*.dist-info"):
        name = dist_info.name.split("-")[0].lower()
        if name in IMAGE_PROVIDED:
            for path in (dist_info, target / name, target / f"{name}.libs"):
                shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts: the server never runs them
    lock = sorted(
        "==".join(dist_info.name.removesuffix(".dist-info").rsplit("-", 1)) for dist_info in target.glob("*.dist-info")
    )
    (target / VENDORED_LOCK).write_text("".join(line + "\n" for line in lock))
    return target


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or "/" not in uri[5:] or uri.endswith("/"):
        raise PackagingError(f"{uri!r} is not an S3 object URI such as s3://bucket/endpoints/sentiment/model.tar.gz")
    bucket, key = uri[5:].split("/", 1)
    return bucket, key


# The recorded digest's key: the archive's key and this suffix, holding sha256sum's line ("<hex>  <name>"); what the
# training run writes beside its model.tar.gz (training_assets/instance/ec2_run.sh) and promotion checks.
DIGEST_SUFFIX = ".sha256"


def upload(archive: Path, uri: str, *, kms_key_id: str, s3_client=None) -> str:
    """Upload ``archive`` to ``uri`` with SSE-KMS under ``kms_key_id``, showing progress, then its SHA-256 beside it
    (``<key>.sha256``, sha256sum's line: the digest the endpoint's model archive check compares before a deploy,
    stacks/components/model_archive_check); return the S3 URI."""
    import hashlib

    import boto3
    from tqdm import tqdm

    bucket, key = parse_s3_uri(uri)
    client = s3_client or boto3.client("s3")
    size = archive.stat().st_size
    with tqdm(
        total=size,
        unit="B",
        unit_scale=True,
        desc=f"upload {archive.name}",
        file=sys.stderr,
    ) as progress:
        client.upload_file(
            str(archive),
            bucket,
            key,
            ExtraArgs={"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key_id},
            Callback=progress.update,
        )
    digest = hashlib.sha256()
    with archive.open("rb") as data:
        for chunk in iter(lambda: data.read(8 * 1024 * 1024), b""):
            digest.update(chunk)
    line = f"{digest.hexdigest()}  {archive.name}\n".encode()
    client.put_object(Bucket=bucket, Key=f"{key}{DIGEST_SUFFIX}", Body=line, ServerSideEncryption="aws:kms",
                      SSEKMSKeyId=kms_key_id)  # fmt: skip
    return f"s3://{bucket}/{key}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model-dir",
        type=Path,
        required=True,
        help="saved model + tokenizer (save_pretrained)",
    )
    parser.add_argument("--output", type=Path, required=True, help="archive to write, e.g. model.tar.gz")
    parser.add_argument(
        "--upload",
        metavar="S3_URI",
        help="s3://<artifacts-bucket>/<key>.tar.gz to upload to",
    )
    parser.add_argument("--kms-key-id", help="KMS key ARN or id for SSE-KMS (required with --upload)")
    args = parser.parse_args(argv)
    if args.upload and not args.kms_key_id:
        parser.error("--upload needs --kms-key-id (the platform key; the artifacts bucket only takes SSE-KMS)")
    try:
        if args.upload:
            parse_s3_uri(args.upload)
        archive = build_model_archive(args.model_dir, args.output)
    except PackagingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    if args.upload:
        uri = upload(archive, args.upload, kms_key_id=args.kms_key_id)
        print(f"uploaded {uri}")
        print(f'set graviton_endpoint.model_data_key = "{parse_s3_uri(uri)[1]}" in cdk.json and deploy')
    return 0


if __name__ == "__main__":
    sys.exit(main())
