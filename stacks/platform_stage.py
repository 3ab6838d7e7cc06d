"""One environment of the platform: the same Stage class for dev, staging and prod, built from its settings."""

from __future__ import annotations

from datetime import date

import aws_cdk as cdk
from constructs import Construct

from stacks.components.image_builds import ImageRegistry
from stacks.foundation import FoundationStack
from stacks.graviton_endpoint import GravitonEndpointStack
from stacks.image_patching import check_images, record_images
from stacks.multi_model_endpoint import MultiModelEndpointStack
from stacks.settings import EnvironmentSettings
from stacks.training import TrainingStack


def no_model_yet(environment: str) -> str:
    """What synth says while an environment names no model version for its Graviton endpoint."""
    return (
        f"{environment}/GravitonEndpoint is not built: environments.{environment}.graviton_endpoint.model_data_key "
        "names no model version yet. Deploy Foundation, upload a model archive (`pytorch-platform package --upload`) "
        "under endpoints/ in the bucket of the Foundation output ArtifactsBucketName, set its key in cdk.json, check "
        f"it with `make check-model ENV={environment}`, then deploy {environment}/GravitonEndpoint."
    )


class PlatformStage(cdk.Stage):
    def __init__(
        self,
        scope: Construct,
        settings: EnvironmentSettings,
        *,
        construct_id: str | None = None,
        today: date | None = None,
        image_registry: ImageRegistry | None = None,
    ) -> None:
        """``today``: the date the images' patch windows are checked against (the clock's date when None);
        ``image_registry``: where the platform's built images are (the promotion pipeline's account and region, from
        cdk.json's ``pipeline``); None: in the environment's own account and region."""
        today = today or date.today()
        # Before any resource: an image past its end of patching stops synth with one sentence.
        images = check_images(settings, today)
        super().__init__(
            scope, construct_id or settings.name, env=cdk.Environment(account=settings.account, region=settings.region)
        )
        self.settings = settings
        self.foundation = FoundationStack(self, "Foundation", settings=settings, image_registry=image_registry)
        self.training = TrainingStack(self, "Training", settings=settings, foundation=self.foundation)
        if settings.graviton_endpoint.enabled and settings.graviton_endpoint.model_data_key is None:
            # First deploy: no model version yet. An endpoint over a missing archive fails only after many minutes of
            # CreateEndpoint and a rollback, so the stack is left out until settings name an uploaded model.
            cdk.Annotations.of(self.foundation).add_info(no_model_yet(settings.name))
        elif settings.graviton_endpoint.enabled:
            self.graviton_endpoint = GravitonEndpointStack(
                self, "GravitonEndpoint", settings=settings, foundation=self.foundation, image_registry=image_registry
            )
        if settings.multi_model_endpoint.enabled:
            self.multi_model_endpoint = MultiModelEndpointStack(
                self, "MultiModelEndpoint", settings=settings, foundation=self.foundation
            )
        # Both endpoints' models join the workload security group: each stack's ENI wait must know the other.
        stacks = [getattr(self, name, None) for name in ("graviton_endpoint", "multi_model_endpoint")]
        endpoints = [stack.sagemaker_endpoint for stack in stacks if stack is not None]
        for endpoint in endpoints:
            others = [other for other in endpoints if other is not endpoint]
            if others:
                endpoint.shares_network_with(*others)
        for stack_id in {image.use.stack for image in images}:
            stack = self.node.try_find_child(stack_id)
            if isinstance(stack, cdk.Stack):  # an endpoint without a model version is not built: nothing runs
                record_images(stack, [image for image in images if image.use.stack == stack_id], today)
        for key, value in settings.resource_tags.items():
            cdk.Tags.of(self).add(key, value)
