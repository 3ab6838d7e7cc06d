"""Who hears the endpoints' alarms: alarm_email and alarm_subscriptions subscribe to the alarm topic (e-mail, https),
and `pytorch-platform review` warns about an alarm topic no one subscribes to."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from ops_review import __main__ as review_cli
from ops_review.review import StackTemplate, load_prices, review_stack
from stacks.settings import parse_environment
from tests.conftest import cdk_context
from tests.stacks.components.bare_endpoint import endpoint_on_bare_stack, server_errors_alarm

RAW = cdk_context()["environments"]
HOOK = "https://hooks.example.com/services/T000/B000/XXXX"


def _template(**overrides) -> dict:
    stack, endpoint = endpoint_on_bare_stack(**overrides)
    endpoint.add_alarms([server_errors_alarm(endpoint, threshold=5)])
    return Template.from_stack(stack).to_json()


def _stack(template: dict) -> StackTemplate:
    return StackTemplate(environment="dev", stack="GravitonEndpoint", stack_name="dev-GravitonEndpoint",
                         region="us-west-2", account=None, template=template, tags={})  # fmt: skip


def _subscriptions(template: dict) -> list[tuple[str, str]]:
    return sorted(
        (r["Properties"]["Protocol"], r["Properties"]["Endpoint"])
        for r in template["Resources"].values()
        if r["Type"] == "AWS::SNS::Subscription"
    )


def test_every_subscriber_gets_a_subscription_once() -> None:
    template = _template(alarm_email="oncall@example.com", alarm_subscriptions=["oncall@example.com", HOOK])
    assert _subscriptions(template) == [("email", "oncall@example.com"), ("https", HOOK)]
    assert review_stack(_stack(template), load_prices())["warnings"] == []


def test_review_warns_about_an_alarm_topic_without_subscribers() -> None:
    (warning,) = review_stack(_stack(_template()), load_prices())["warnings"]
    assert re.match(r"alarm topic Sentiment\S*AlarmTopic\S* has no subscription: its alarms reach no one", warning)
    assert "environments.dev.alarm_subscriptions" in warning


def test_review_cli_prints_the_warnings(cloud_assembly, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cdk.json subscribes no one in dev: every alarm topic of the platform is named, per environment and stack."""
    assert review_cli.main([str(cloud_assembly.directory), "--out", str(tmp_path)]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING ")]
    expected = r"WARNING dev/MultiModelEndpoint: alarm topic \S*AlarmTopic\S* has no subscription"
    assert any(re.match(expected, line) for line in printed)
    index = (tmp_path / "index.md").read_text()
    assert "## Warnings" in index and "dev/MultiModelEndpoint: alarm topic AlarmTopic" in index
    reviewed = json.loads((tmp_path / "dev.json").read_text())
    assert reviewed["stacks"]["MultiModelEndpoint"]["warnings"]


def test_platform_subscribes_what_the_settings_name() -> None:
    from stacks.platform_stage import PlatformStage

    raw = {**RAW["dev"], "alarm_subscriptions": [HOOK]}
    stage = PlatformStage(cdk.App(context=cdk_context()), parse_environment("dev", raw), construct_id="subscribed")
    template = Template.from_stack(stage.multi_model_endpoint).to_json()
    assert _subscriptions(template) == [("https", HOOK)]
