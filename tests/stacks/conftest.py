"""Fixtures of the stack tests that other folders define too: the synthesized assembly of the ops review's tests and
the Training stack's templates of the training tests."""

from tests.ops_review.conftest import cdk_context, platform_assembly
from tests.training_assets.conftest import training_templates

__all__ = ["cdk_context", "platform_assembly", "training_templates"]
