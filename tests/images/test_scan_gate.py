"""The promotion's vulnerability gate (inference_assets/image/scan_gate.py) against ECR's API as botocore models it
(a Stubber checks every request and answer against the service model): it waits for the scan, passes a clean image,
and stops on a CRITICAL or HIGH finding with one line naming the package and the finding."""

from __future__ import annotations

from datetime import datetime

import boto3
import pytest
from botocore.stub import Stubber

from inference_assets.image.scan_gate import POLLS, gate, main

DIGEST = "sha256:" + "ab" * 32
URI = f"111111111111.dkr.ecr.us-west-2.amazonaws.com/platform/graviton-serving@{DIGEST}"
IDS = {"registryId": "111111111111", "repositoryName": "platform/graviton-serving", "imageId": {"imageDigest": DIGEST}}


def _finding(severity: str, cve: str, package: str, version: str, fixed: str, status: str = "ACTIVE") -> dict:
    return {
        "awsAccountId": "111111111111",
        "findingArn": f"arn:aws:inspector2:us-west-2:111111111111:finding/{cve}",
        "firstObservedAt": datetime(2026, 12, 1),
        "severity": severity,
        "status": status,
        "type": "PACKAGE_VULNERABILITY",
        "title": f"{cve} - {package}",
        "packageVulnerabilityDetails": {
            "vulnerabilityId": cve,
            "source": "NVD",
            "vulnerablePackages": [
                {"name": package, "version": version, "packageManager": "PYTHONPKG", "fixedInVersion": fixed}
            ],
        },
    }


def _answer(status: str, findings: list[dict] | None = None, token: str | None = None) -> dict:
    answer: dict = {**IDS, "imageScanStatus": {"status": status, "description": status.lower()}}
    if findings is not None:
        answer["imageScanFindings"] = {"enhancedFindings": findings}
    if token:
        answer["nextToken"] = token
    return answer


def _ecr(*answers: dict) -> tuple[object, Stubber]:
    ecr = boto3.client("ecr", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="y")
    stubber = Stubber(ecr)
    for answer, expected in answers:
        stubber.add_response("describe_image_scan_findings", answer, expected)
    stubber.activate()
    return ecr, stubber


def test_a_clean_image_passes_after_its_scan_completes() -> None:
    waits: list[float] = []
    ecr, stubber = _ecr((_answer("PENDING"), IDS), (_answer("ACTIVE", []), IDS), (_answer("ACTIVE", []), IDS))
    clean = f"platform/graviton-serving@{DIGEST}: no CRITICAL or HIGH finding; promoted"
    assert gate(ecr, URI, sleep=waits.append) == (0, [clean])
    assert len(waits) == 1
    stubber.assert_no_pending_responses()


def test_a_critical_or_high_finding_stops_the_promotion_with_one_line_each() -> None:
    findings = [
        _finding("CRITICAL", "CVE-2026-1111", "urllib3", "2.8.0", "2.8.1"),
        _finding("MEDIUM", "CVE-2026-2222", "idna", "3.21", "3.22"),
        _finding("HIGH", "CVE-2026-3333", "glibc", "2.34-100", "NotAvailable"),
        _finding("CRITICAL", "CVE-2026-4444", "ray", "2.57.0", "2.57.1", status="CLOSED"),
    ]
    ecr, stubber = _ecr(
        (_answer("ACTIVE", findings[:2]), IDS),
        (_answer("ACTIVE", findings[:2], token="page-2"), IDS),
        (_answer("ACTIVE", findings[2:]), {**IDS, "nextToken": "page-2"}),
    )
    status, lines = gate(ecr, URI, sleep=lambda _: None)
    image = f"platform/graviton-serving@{DIGEST}"
    assert (status, lines) == (
        1,
        [
            f"{image}: CRITICAL CVE-2026-1111 in urllib3 2.8.0 (PYTHONPKG, fixed in 2.8.1)",
            f"{image}: HIGH CVE-2026-3333 in glibc 2.34-100 (PYTHONPKG, no fixed version yet)",
        ],
    )
    stubber.assert_no_pending_responses()


def test_an_image_whose_scan_fails_or_never_ends_is_not_promoted() -> None:
    ecr, _ = _ecr((_answer("UNSUPPORTED_IMAGE"), IDS))
    status, (line,) = gate(ecr, URI, sleep=lambda _: None)
    assert status == 1 and "did not complete (UNSUPPORTED_IMAGE" in line
    ecr, _ = _ecr(*[(_answer("IN_PROGRESS"), IDS)] * POLLS)
    status, (line,) = gate(ecr, URI, sleep=lambda _: None)
    assert status == 1 and "still scanning" in line


def test_the_command_refuses_an_image_by_tag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="not an ECR image by digest"):
        main(["--image-uri", "111111111111.dkr.ecr.us-west-2.amazonaws.com/platform/graviton-serving:latest"])
