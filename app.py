#!/usr/bin/env python3
"""The CDK app: one PlatformStage per environment chosen with ``-c env=dev[,staging,...]`` (default: all of them)."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk

from stacks.compliance import add_compliance_gates
from stacks.platform_stage import PlatformStage
from stacks.settings import load_environments


def build_app(**app_props: Any) -> cdk.App:
    """Build (not synthesize) the app; tests pass ``context`` and ``outdir`` here instead of going through the CLI."""
    app = cdk.App(**app_props)
    for settings in load_environments(app.node.try_get_context("environments"), app.node.try_get_context("env")):
        PlatformStage(app, settings)
    add_compliance_gates(app)
    return app


if __name__ == "__main__":
    build_app().synth()
