"""The promotion gate on an image's vulnerabilities: a stage deploys an image only when its scan has no CRITICAL or
HIGH finding.

    python -m inference_assets.image.scan_gate --image-uri <account>.dkr.ecr.<region>.amazonaws.com/<repo>@sha256:...

The platform's repositories are scanned by Amazon ECR's enhanced scanning (Amazon Inspector: the operating system's
packages and the programming-language packages of the image, the Python wheels included; ImageBuilds turns it on for
the project's repositories). The gate waits for the scan of the pushed digest to complete, then prints one line per
CRITICAL or HIGH finding, naming the package, its version, the finding and the fixed version, and exits 1; with
none it prints one line and exits 0. A scan that did not complete (failed, unsupported image, no scan) stops the
promotion too: an image nobody scanned is not promoted.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

BLOCKING = ("CRITICAL", "HIGH")
# ECR's scan statuses (API ImageScanStatus): enhanced scanning reports ACTIVE once findings are available (and keeps
# rescanning), basic scanning COMPLETE; these two are done, these are still running, anything else is a failure.
DONE = ("COMPLETE", "ACTIVE")
RUNNING = ("IN_PROGRESS", "PENDING")
# How long the gate waits for the scan of a freshly pushed image: Inspector scans within minutes of the push.
POLL_SECONDS, POLLS = 15, 80
_URI = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9._/-]+)@(?P<digest>sha256:[0-9a-f]{64})$"
)


def parse_uri(uri: str) -> dict[str, str]:
    if (match := _URI.match(uri)) is None:
        raise SystemExit(
            f"{uri!r} is not an ECR image by digest (<account>.dkr.ecr.<region>.amazonaws.com/<repository>@sha256:...)"
        )
    return match.groupdict()


def findings(ecr: Any, repository: str, digest: str, registry: str) -> Iterator[dict[str, Any]]:
    """Every enhanced finding of the image (all pages)."""
    token = None
    while True:
        page = ecr.describe_image_scan_findings(
            registryId=registry, repositoryName=repository, imageId={"imageDigest": digest},
            **({"nextToken": token} if token else {}),
        )  # fmt: skip
        yield from page.get("imageScanFindings", {}).get("enhancedFindings", [])
        if not (token := page.get("nextToken")):
            return


def blocking_lines(image: str, found: Iterable[dict[str, Any]]) -> list[str]:
    """One line per CRITICAL or HIGH finding and vulnerable package: what the operator reads in the pipeline."""
    lines = []
    for finding in found:
        if finding.get("severity") not in BLOCKING or finding.get("status", "ACTIVE") != "ACTIVE":
            continue
        details = finding.get("packageVulnerabilityDetails", {})
        vulnerability = details.get("vulnerabilityId") or finding.get("title", "an unnamed finding")
        for package in details.get("vulnerablePackages") or [{"name": "(no package named)"}]:
            fixed = package.get("fixedInVersion")
            fix = f", fixed in {fixed}" if fixed and fixed != "NotAvailable" else ", no fixed version yet"
            lines.append(
                f"{image}: {finding['severity']} {vulnerability} in {package.get('name')} {package.get('version', '')}"
                f"".rstrip()
                + f" ({package.get('packageManager', 'package')}{fix})"
            )
    return lines


def scan_status(ecr: Any, ids: dict[str, Any], sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """The image's scan status once the scan is no longer running (or after POLLS polls)."""
    for _ in range(POLLS):
        try:
            status = ecr.describe_image_scan_findings(**ids)["imageScanStatus"]
        except ecr.exceptions.ScanNotFoundException:  # the push's scan has not started yet
            status = {"status": "PENDING"}
        if status["status"] not in RUNNING:
            return status
        sleep(POLL_SECONDS)
    return {"status": "IN_PROGRESS", "description": f"still scanning after {POLLS * POLL_SECONDS} s"}


def gate(ecr: Any, uri: str, sleep: Callable[[float], None] = time.sleep) -> tuple[int, list[str]]:
    """(exit status, lines) of the gate for the image ``uri``."""
    parts = parse_uri(uri)
    image = f"{parts['repository']}@{parts['digest']}"
    ids = {"registryId": parts["account"], "repositoryName": parts["repository"],
           "imageId": {"imageDigest": parts["digest"]}}  # fmt: skip
    status = scan_status(ecr, ids, sleep)
    if status["status"] not in DONE:
        why = f"{status['status']}: {status.get('description', '')}".rstrip(": ")
        return 1, [f"{image}: the vulnerability scan did not complete ({why}); the image is not promoted"]
    lines = blocking_lines(image, findings(ecr, parts["repository"], parts["digest"], parts["account"]))
    if lines:
        return 1, lines
    return 0, [f"{image}: no CRITICAL or HIGH finding; promoted"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-uri", action="append", required=True, help="an image by digest; repeat for several")
    args = parser.parse_args(argv)
    import boto3

    worst = 0
    for uri in args.image_uri:
        status, lines = gate(boto3.client("ecr", region_name=parse_uri(uri)["region"]), uri)
        print("\n".join(lines), flush=True)
        worst = max(worst, status)
    return worst


if __name__ == "__main__":
    sys.exit(main())
