"""One environment's settings (dev, staging, prod) from the areas, the rules across areas, and the loading of
cdk.json's ``environments`` object."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from stacks.settings.base import DEFAULT_REGION, AccountId, Region, SettingsError, StrictModel, describe_error
from stacks.settings.network import VpcSettings
from stacks.settings.serving import GravitonEndpointSettings, MultiModelEndpointSettings
from stacks.settings.training import TrainingSettings, gpu_runs_the_image

ENVIRONMENT_NAMES = ("dev", "staging", "prod")

_TAG_VALUE = re.compile(r"^[\w .:/=+\-@]{1,256}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


class LogSettings(StrictModel):
    """CloudWatch Logs of the platform's workloads (training runs, SageMaker jobs and endpoints)."""

    # CloudWatch's retention values; Control Tower (CT.CLOUDWATCH.PR.2) wants 365 or more, shorter ones are
    # acknowledged per log group with this setting's name.
    retention_days: Literal[7, 14, 30, 60, 90, 180, 365, 400, 545, 731, 1096, 1827, 3653] = 365
    # Set retention_days on /aws/sagemaker/TrainingJobs, the ONE log group SageMaker writes every training job of the
    # account and region into (its name cannot be chosen). Only one environment per account and region may do it.
    manage_training_job_log_group: bool = False


class TagSettings(StrictModel):
    project: str = "pytorch-platform"
    cost_centre: str

    @field_validator("project", "cost_centre")
    @classmethod
    def _value(cls, value: str) -> str:
        if not _TAG_VALUE.match(value):
            raise ValueError("must be 1-256 letters, digits, spaces or _.:/=+-@ characters")
        return value


class EnvironmentSettings(StrictModel):
    """Everything one environment (dev, staging, prod) of the platform is built from."""

    name: Literal["dev", "staging", "prod"]
    account: AccountId | None = None
    region: Region = DEFAULT_REGION
    removal_policy: Literal["destroy", "retain"]
    alarm_email: str | None = None
    # Who hears the endpoints' alarms, besides alarm_email: e-mail addresses and https:// endpoints (a ChatOps or
    # paging webhook); SNS asks each to confirm. Without any, alarms fire into a topic no one reads (review warns).
    alarm_subscriptions: list[str] = Field(default=[])
    tags: TagSettings
    vpc: VpcSettings = VpcSettings()
    logs: LogSettings = LogSettings()
    training: TrainingSettings = TrainingSettings()
    graviton_endpoint: GravitonEndpointSettings = GravitonEndpointSettings()
    multi_model_endpoint: MultiModelEndpointSettings = MultiModelEndpointSettings()
    # repository:tag -> why this environment runs the image although its publisher no longer patches it
    # (platform_facts/images.json). Synth refuses such an image without an entry; the reason goes into the template
    # metadata and `pytorch-platform review`.
    accept_unpatched_images: dict[str, str] = Field(default={})

    @field_validator("accept_unpatched_images")
    @classmethod
    def _reasons(cls, value: dict[str, str]) -> dict[str, str]:
        for image, reason in value.items():
            if not re.match(r"^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_.-]+$", image):
                raise ValueError(f"key {image!r} must be an image as repository:tag")
            if len(reason.strip()) < 20:
                raise ValueError(f"{image} needs a reason of at least 20 characters: why the risk is acceptable")
        return value

    @field_validator("alarm_email")
    @classmethod
    def _email(cls, value: str | None) -> str | None:
        if value is not None and not _EMAIL.match(value):
            raise ValueError("must be an e-mail address")
        return value

    @field_validator("alarm_subscriptions")
    @classmethod
    def _subscribers(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not (_EMAIL.match(entry) or re.match(r"^https://[A-Za-z0-9.-]+(:\d+)?(/\S*)?$", entry)):
                raise ValueError(f"{entry!r} must be an e-mail address or an https:// URL")
        if len(set(value)) != len(value):
            raise ValueError("lists an entry twice")
        return value

    @model_validator(mode="after")
    def _training_gpus_run_the_images(self) -> EnvironmentSettings:
        training = self.training
        bf16 = training.hyperparameters.bf16
        gpu_runs_the_image("training.instance_type", training.instance_type, "training.image_tag",
                            training.image, bf16)  # fmt: skip
        gpu_runs_the_image("training.remote_instance_type", training.remote_instance_type,
                            "training.remote_image_tag", training.remote_image, bf16)  # fmt: skip
        return self

    @model_validator(mode="after")
    def _subnets_fit_the_vpc(self) -> EnvironmentSettings:
        vpc = self.vpc
        if vpc.imported:
            return self
        prefix, needed = ipaddress.IPv4Network(vpc.cidr).prefixlen, vpc.largest_prefix_for_subnets()
        if prefix > needed:
            private, public = vpc.PRIVATE_SUBNET_MASK, vpc.PUBLIC_SUBNET_MASK
            subnets = f"a private /{private}" + (f" and a public /{public}" if vpc.nat_gateways else "")
            raise ValueError(
                f"vpc.cidr: {vpc.cidr} is too small for the subnets the stacks make ({subnets} per zone, "
                f"vpc.max_azs: {vpc.max_azs}); use a prefix length from /{vpc.LARGEST_PREFIX} to /{needed}"
            )
        return self

    @model_validator(mode="after")
    def _training_fits_the_network(self) -> EnvironmentSettings:
        vpc, training = self.vpc, self.training
        subnets, source = (
            (len(vpc.private_subnet_ids), "vpc.private_subnet_ids") if vpc.imported else (vpc.max_azs, "vpc.max_azs")
        )
        if training.subnet_index >= subnets:
            raise ValueError(
                f"training.subnet_index: must be below {subnets}, the number of private subnets ({source})"
            )
        if not vpc.imported and vpc.nat_gateways == 0:
            # Isolated subnets reach AWS services through the VPC endpoints only: no hub, no PyPI.
            isolated = "vpc.nat_gateways: 0 leaves the private subnets without internet access, but EC2 training"
            from_hub = [name for name in ("base_model", "dataset") if not getattr(training, name).startswith("s3://")]
            if from_hub:
                sources = " and ".join(f"training.{name}" for name in from_hub)
                raise ValueError(
                    f"{isolated} downloads {sources} from the Hugging Face hub; use s3:// folders or a NAT gateway"
                )
            if training.image_registry_account is None:  # a pipeline-built image comes through the ECR endpoints
                raise ValueError(
                    f"{isolated} builds its image on the instance with pip from PyPI "
                    "(training_assets/instance/Dockerfile); use at least 1 NAT gateway or "
                    "training.image_registry_account"
                )
        return self

    @property
    def destroy_on_delete(self) -> bool:
        return self.removal_policy == "destroy"

    @property
    def alarm_endpoints(self) -> list[str]:
        """Everyone the alarm topics notify: alarm_email, then alarm_subscriptions (each once)."""
        return list(dict.fromkeys([*([self.alarm_email] if self.alarm_email else []), *self.alarm_subscriptions]))

    @property
    def resource_tags(self) -> dict[str, str]:
        return {"project": self.tags.project, "environment": self.name, "cost-centre": self.tags.cost_centre}


def parse_environment(name: str, raw: dict[str, Any]) -> EnvironmentSettings:
    """Validate one environment's cdk.json settings; raise SettingsError with one sentence on the first problem."""
    root = f"environments.{name}"
    if name not in ENVIRONMENT_NAMES:
        raise SettingsError(f"{root}: unknown environment; allowed environments are {', '.join(ENVIRONMENT_NAMES)}.")
    if not isinstance(raw, dict):
        raise SettingsError(f"{root}: must be an object of settings.")
    try:
        return EnvironmentSettings.model_validate({**raw, "name": name})
    except ValidationError as error:
        raise SettingsError(describe_error(error.errors()[0], root, EnvironmentSettings)) from None


def load_environments(environments: Any, selection: str | None) -> list[EnvironmentSettings]:
    """Settings of the environments in ``selection`` (comma-separated names; all when None), in promotion order."""
    if not isinstance(environments, dict) or not environments:
        raise SettingsError("cdk.json context must hold an 'environments' object with dev, staging and prod settings.")
    for name in environments:
        if name not in ENVIRONMENT_NAMES:
            raise SettingsError(
                f"environments.{name}: unknown environment; allowed environments are {', '.join(ENVIRONMENT_NAMES)}."
            )
    names = list(environments) if selection is None else [n.strip() for n in selection.split(",") if n.strip()]
    for name in names:
        if name not in environments:
            raise SettingsError(f"env={name}: unknown environment; allowed values are {', '.join(environments)}.")
    # Every environment is validated whatever the selection: a typo in prod must not pass `cdk synth -c env=dev`.
    parsed = {
        name: parse_environment(name, environments[name]) for name in sorted(environments, key=ENVIRONMENT_NAMES.index)
    }
    _one_training_job_log_group_owner(list(parsed.values()))
    return [settings for name, settings in parsed.items() if name in names]


def _one_training_job_log_group_owner(environments: list[EnvironmentSettings]) -> None:
    """/aws/sagemaker/TrainingJobs is one log group per account and region: two environments setting its retention
    would overwrite each other on every deploy. Environments without an account deploy wherever the CLI points, so
    they count as one account."""
    owners: dict[tuple[str | None, str], str] = {}
    for environment in sorted(environments, key=lambda e: ENVIRONMENT_NAMES.index(e.name)):
        if not environment.logs.manage_training_job_log_group:
            continue
        where = (environment.account, environment.region)
        if where in owners:
            raise SettingsError(
                f"environments.{environment.name}.logs.manage_training_job_log_group: only one environment per "
                f"account and region may manage /aws/sagemaker/TrainingJobs, and {owners[where]} already does "
                "(give the environments different accounts, or set it in one of them)."
            )
        owners[where] = environment.name
