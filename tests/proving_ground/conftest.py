"""Fixtures of the proving ground's tests, defined beside the tests of the product that share them: the TorchServe
harness's archives (tests/inference_assets) and the synthesized assembly of the ops review's tests."""

from tests.inference_assets.conftest import torchserve_model
from tests.inference_assets.multimodel.conftest import torchserve_archive, unpacked_torchserve_archive
from tests.ops_review.conftest import cdk_context, platform_assembly
from tests.training_assets.conftest import sample_data, training_templates, warm_python

__all__ = ["cdk_context", "platform_assembly", "sample_data", "torchserve_archive", "torchserve_model",
           "training_templates", "unpacked_torchserve_archive", "warm_python"]  # fmt: skip
