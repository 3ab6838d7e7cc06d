"""The base of every stack of an environment: its settings, and the retention rules that follow from them."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from stacks.facts import register_missing_facts
from stacks.settings import EnvironmentSettings


class EnvironmentStack(cdk.Stack):
    """A stack built from one environment's settings. Environments that retain their data (staging, prod) also get
    termination protection, so a stray ``cdk destroy`` cannot start deleting them."""

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: EnvironmentSettings, description: str, **kwargs: Any
    ) -> None:
        register_missing_facts()
        super().__init__(
            scope,
            construct_id,
            description=description,
            termination_protection=not settings.destroy_on_delete,
            **kwargs,
        )
        self.settings = settings
        self.removal_policy = cdk.RemovalPolicy.DESTROY if settings.destroy_on_delete else cdk.RemovalPolicy.RETAIN
