#!/usr/bin/env python3
"""The CDK app: one PlatformStage per environment chosen with ``-c env=dev[,staging,...]`` (default: all of them),
plus the PromotionPipeline stack (all environments) whenever cdk.json has ``pipeline`` settings."""

from __future__ import annotations

import sys
from datetime import date
from typing import Any

import aws_cdk as cdk

from stacks.compliance import add_compliance_gates
from stacks.pipeline import PromotionPipelineStack
from stacks.platform_stage import PlatformStage
from stacks.settings import SettingsError, load_environments, load_pipeline


def _today(value: Any) -> date | None:
    """``-c today=YYYY-MM-DD`` checks the images' patch windows as of that date (rehearse a later synth)."""
    if value is None:
        return None
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise SettingsError(f"today: {value!r} must be a date as YYYY-MM-DD.") from None


def build_app(**app_props: Any) -> cdk.App:
    """Build (not synthesize) the app; tests pass ``context`` and ``outdir`` here instead of going through the CLI."""
    app = cdk.App(**app_props)
    environments = app.node.try_get_context("environments")
    today = _today(app.node.try_get_context("today"))
    for settings in load_environments(environments, app.node.try_get_context("env")):
        PlatformStage(app, settings, today=today)
    pipeline = load_pipeline(app.node.try_get_context("pipeline"))
    if pipeline is not None:
        # Always all environments: the pipeline promotes through every one, whatever -c env selects.
        PromotionPipelineStack(
            app, "PromotionPipeline", settings=pipeline, environments=load_environments(environments, None), today=today
        )
    add_compliance_gates(app)
    return app


def main() -> int:
    """What `cdk synth` runs: a settings error is one sentence on stderr and exit status 1, not a traceback."""
    try:
        build_app().synth()
    except SettingsError as error:
        print(f"cdk.json: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
