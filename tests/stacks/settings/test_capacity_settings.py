"""Capacity bought ahead for EC2 training runs: a reservation id, a reservation group or a Capacity Block, refused by
name where EC2 could not launch into it."""

from __future__ import annotations

from typing import Any

import pytest

from stacks.settings import SettingsError, parse_environment
from tests.conftest import cdk_context

RESERVATION = "cr-0123456789abcdef0"
GROUP = "arn:aws:resource-groups:us-west-2:123456789012:group/p4d-reservations"
RAW = cdk_context()["environments"]


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"capacity_reservation_id": "cr-123"},
         "environments.dev.training.capacity_reservation_id: must be a Capacity Reservation id: cr- and 17 "
         "hexadecimal digits."),
        ({"capacity_reservation_resource_group_arn": "p4d-reservations"},
         "environments.dev.training.capacity_reservation_resource_group_arn: must be a resource group ARN"),
        ({"capacity_reservation_id": RESERVATION, "capacity_reservation_resource_group_arn": GROUP},
         "set one of them, not both"),
        ({"market_type": "capacity-block"}, "capacity_reservation_id must name it"),
        ({"market_type": "spot"}, "environments.dev.training.market_type: must be 'on-demand' or 'capacity-block'."),
    ],
    ids=["id", "group", "both", "block-without-id", "market"],
)  # fmt: skip
def test_settings_refuse_a_target_ec2_cannot_launch_into(training: dict[str, Any], message: str) -> None:
    raw = {**RAW["dev"], "training": {**RAW["dev"].get("training", {}), **training}}
    with pytest.raises(SettingsError) as error:
        parse_environment("dev", raw)
    assert message in str(error.value)
