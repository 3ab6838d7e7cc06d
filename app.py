#!/usr/bin/env python3
"""The CDK app: one PlatformStage per environment chosen with ``-c env=dev[,staging,...]`` (default: all of them),
plus the PromotionPipeline stack (all environments) whenever cdk.json has ``pipeline`` settings, or, with
``-c placeholder_pipeline=true`` (what `make synth` passes), with placeholder settings, so that every gate sees the
pipeline's templates before a tooling account and repository are chosen."""

from __future__ import annotations

import sys
from datetime import date
from typing import Any

import aws_cdk as cdk

from ops_review import PLACEHOLDER_METADATA
from stacks.compliance import add_compliance_gates
from stacks.components.image_builds import ImageRegistry
from stacks.pipeline import PromotionPipelineStack
from stacks.platform_stage import PlatformStage
from stacks.settings import SettingsError, load_environments, load_pipeline

# What the pipeline is synthesized with while cdk.json has no `pipeline` block: an account, connection and
# repository of the right shape that name nothing real (the stack says so in its template metadata, which
# `make synth`'s summary prints). Deploying it would fail at the source action, never at a gate.
PLACEHOLDER_PIPELINE = {
    "account": "000000000000",
    "region": "us-west-2",
    "connection_arn": "arn:aws:codeconnections:us-west-2:000000000000:connection/00000000-0000-0000-0000-000000000000",
    "repository": "placeholder-org/pytorch-platform",
    "branch": "main",
}


def _today(value: Any) -> date | None:
    """``-c today=YYYY-MM-DD`` checks the images' patch windows as of that date (rehearse a later synth)."""
    if value is None:
        return None
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise SettingsError(f"today: {value!r} must be a date as YYYY-MM-DD.") from None


def _flag(value: Any, key: str) -> bool:
    """A boolean context value: -c key=true passes the string "true"."""
    if value is None or value is False or str(value).lower() == "false":
        return False
    if value is True or str(value).lower() == "true":
        return True
    raise SettingsError(f"{key}: {value!r} must be true or false.")


def build_app(**app_props: Any) -> cdk.App:
    """Build (not synthesize) the app; tests pass ``context`` and ``outdir`` here instead of going through the CLI."""
    app = cdk.App(**app_props)
    environments = app.node.try_get_context("environments")
    today = _today(app.node.try_get_context("today"))
    pipeline = load_pipeline(app.node.try_get_context("pipeline"))
    # The platform's images live in the pipeline's account and region; without a pipeline, in each environment's own.
    registry = None if pipeline is None else ImageRegistry(pipeline.account, pipeline.region)
    for settings in load_environments(environments, app.node.try_get_context("env")):
        PlatformStage(app, settings, today=today, image_registry=registry)
    placeholder = pipeline is None and _flag(app.node.try_get_context("placeholder_pipeline"), "placeholder_pipeline")
    if placeholder:
        pipeline = load_pipeline(PLACEHOLDER_PIPELINE)
    if pipeline is not None:
        # Always all environments: the pipeline promotes through every one, whatever -c env selects.
        stack = PromotionPipelineStack(
            app, "PromotionPipeline", settings=pipeline, environments=load_environments(environments, None), today=today
        )
        if placeholder:
            stack.add_metadata(
                PLACEHOLDER_METADATA,
                "placeholder pipeline settings, account 000000000000: set `pipeline` in cdk.json to deploy it",
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
