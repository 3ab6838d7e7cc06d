"""SecureBuckets with ``control_tower``: a stage of the pair passes AWS Control Tower's proactive controls (AWS's
CfnGuard validator, as every environment stage runs it), and without the answers it does not."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest

from stacks.compliance import add_compliance_gates
from stacks.components.platform_key import PlatformKey
from stacks.components.secure_buckets import KEEP_LOGICAL_IDS, SecureBuckets


def _synth(tmp_path: Path, **props: object) -> dict:
    app = cdk.App(outdir=str(tmp_path))
    stage = cdk.Stage(app, "Env")
    stack = cdk.Stack(stage, "Bare")
    buckets = SecureBuckets(
        stack,
        KEEP_LOGICAL_IDS,
        key=PlatformKey(
            stack,
            "Key",
            alias="alias/test",
            description="test",
            removal_policy=cdk.RemovalPolicy.RETAIN,
            pending_window_days=30,
        ),
        removal_policy=cdk.RemovalPolicy.RETAIN,
        access_log_expiration_days=365,
        noncurrent_version_days=90,
        no_replication_reason="Test pair: single region.",
        **props,  # type: ignore[arg-type]
    )
    buckets.add_data_bucket("Datasets")
    add_compliance_gates(app)
    return app.synth().get_stack_artifact(stack.artifact_id).template


def test_the_pair_passes_control_tower_once_its_answers_are_given(tmp_path: Path) -> None:
    template = _synth(tmp_path, control_tower=True, no_object_lock_reason="Test pair: lifecycle rules expire data.")
    buckets = {name: r for name, r in template["Resources"].items() if r["Type"] == "AWS::S3::Bucket"}
    events = {name: r["Properties"].get("NotificationConfiguration") for name, r in buckets.items()}
    assert events == {
        next(n for n in buckets if n.startswith("Datasets")): {
            "EventBridgeConfiguration": {"EventBridgeEnabled": True}
        },
        next(n for n in buckets if n.startswith("AccessLogs")): None,
    }


def test_without_the_answers_control_tower_fails_the_stage(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        _synth(tmp_path)
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for plugin in report["pluginReports"] for v in plugin["violations"]}
    assert {"s3_bucket_object_lock_enabled_check", "s3_event_notifications_enabled_check"} <= rules
