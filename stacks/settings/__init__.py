"""Per-environment settings: cdk.json context -> one validated, typed object per environment, by area: ``network``,
``training``, ``serving``, ``environment`` (one environment from the areas, and loading), ``pipeline``; ``base``
holds what they share.

Pydantic (not plain dataclasses) because it gives, from the type hints alone, exact type checks, unknown-key
rejection (``extra="forbid"``) and error locations (the path to the bad key); the few domain rules (GPU types,
Graviton types, min <= max) are validators next to the field they guard. ``SettingsError`` turns the first error
into one sentence that names the key and what is allowed, so a bad cdk.json stops ``cdk synth`` at the door.

This package is data and its validation only: instance rules read the platform's instance facts
(platform_facts/instances.py), training image tags the image table (platform_facts/images.py), serving limits and
names the serving contract (inference_assets/container/contract.py); what the settings turn into (container
environment, resources) is the stacks' business.
"""

from stacks.settings.base import DEFAULT_REGION, SettingsError
from stacks.settings.environment import (
    ENVIRONMENT_NAMES,
    EnvironmentSettings,
    LogSettings,
    TagSettings,
    load_environments,
    parse_environment,
)
from stacks.settings.network import VpcSettings
from stacks.settings.pipeline import PipelineSettings, load_pipeline
from stacks.settings.serving import (
    ENDPOINT_MODELS_PREFIX,
    AutoscalingSettings,
    DataCaptureSettings,
    GravitonEndpointSettings,
    MultiModelEndpointSettings,
    MultiModelSizingSettings,
)
from stacks.settings.training import HyperParameters, TrainingSettings, sagemaker_gpu_training_types

__all__ = [
    "DEFAULT_REGION",
    "ENDPOINT_MODELS_PREFIX",
    "ENVIRONMENT_NAMES",
    "AutoscalingSettings",
    "DataCaptureSettings",
    "EnvironmentSettings",
    "GravitonEndpointSettings",
    "HyperParameters",
    "LogSettings",
    "MultiModelEndpointSettings",
    "MultiModelSizingSettings",
    "PipelineSettings",
    "SettingsError",
    "TagSettings",
    "TrainingSettings",
    "VpcSettings",
    "load_environments",
    "load_pipeline",
    "parse_environment",
    "sagemaker_gpu_training_types",
]
