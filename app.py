#!/usr/bin/env python3
"""The CDK app: one PlatformStage per environment chosen with ``-c env=dev[,staging,...]`` (default: all of them)."""

import aws_cdk as cdk

from stacks.compliance import add_compliance_gates
from stacks.platform_stage import PlatformStage
from stacks.settings import load_environments

app = cdk.App()
for settings in load_environments(app.node.try_get_context("environments"), app.node.try_get_context("env")):
    PlatformStage(app, settings)
add_compliance_gates(app)
app.synth()
