"""Who hears the alarms: alarm_email and alarm_subscriptions merge into one list, and an entry SNS cannot deliver to
stops synth by name."""

from __future__ import annotations

import pytest

from stacks.settings import SettingsError, parse_environment
from tests.conftest import cdk_context

RAW = cdk_context()["environments"]
HOOK = "https://hooks.example.com/services/T000/B000/XXXX"


def test_settings_merge_alarm_email_and_subscriptions() -> None:
    settings = parse_environment("dev", {**RAW["dev"], "alarm_email": "a@example.com", "alarm_subscriptions": [HOOK]})
    assert settings.alarm_endpoints == ["a@example.com", HOOK]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["pager"], "environments.dev.alarm_subscriptions: 'pager' must be an e-mail address or an https:// URL."),
        (["http://hooks.example.com/x"], "'http://hooks.example.com/x' must be an e-mail address or an https:// URL"),
        (["a@example.com", "a@example.com"], "environments.dev.alarm_subscriptions: lists an entry twice."),
    ],
)
def test_settings_refuse_what_sns_cannot_deliver_to(entries: list[str], message: str) -> None:
    with pytest.raises(SettingsError) as error:
        parse_environment("dev", {**RAW["dev"], "alarm_subscriptions": entries})
    assert message in str(error.value)
