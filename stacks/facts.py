"""Regional facts CDK's own table lacks: the Deep Learning Containers registry account of regions it does not list.

Without them ``regional_fact(DLC_REPOSITORY_ACCOUNT)`` fails synth there (RegionFactNotFound). Values from the DLC
documentation's list of registry accounts per region (see ../shared/FACTS.md); CDK's own entries take precedence.
"""

from __future__ import annotations

import jsii
from aws_cdk import region_info

_DLC_ACCOUNTS = {
    "af-south-1": "626614931356",
    "ap-northeast-3": "364406365360",
    "ca-west-1": "204538143572",
    "il-central-1": "780543022126",
}


@jsii.implements(region_info.IFact)
class _Fact:
    def __init__(self, region: str, name: str, value: str) -> None:
        self._region, self._name, self._value = region, name, value

    @property
    def region(self) -> str:
        return self._region

    @property
    def name(self) -> str:
        return self._name

    @property
    def value(self) -> str:
        return self._value


def register_missing_facts() -> None:
    """Idempotent: registers only what CDK's table (or an earlier call) does not already hold."""
    for region, account in _DLC_ACCOUNTS.items():
        if region_info.Fact.find(region, region_info.FactName.DLC_REPOSITORY_ACCOUNT) is None:
            region_info.Fact.register(_Fact(region, region_info.FactName.DLC_REPOSITORY_ACCOUNT, account))
