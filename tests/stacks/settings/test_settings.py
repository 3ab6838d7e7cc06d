"""Every settings rule stops synth with one sentence naming the key and what is allowed."""

from __future__ import annotations

import copy
import re

import pytest

from stacks.settings import DEFAULT_REGION, SettingsError, load_environments, parse_environment
from tests.conftest import cdk_context

ENVIRONMENTS = cdk_context()["environments"]


def dev_with(**changes: object) -> dict:
    return environment_with("dev", **changes)


def environment_with(name: str, **changes: object) -> dict:
    """cdk.json's environment ``name`` with ``changes`` (``a__b=v`` sets ``a.b``)."""
    raw = copy.deepcopy(ENVIRONMENTS[name])
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = raw
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return raw


def test_cdk_json_environments_load_in_promotion_order() -> None:
    settings = load_environments(ENVIRONMENTS, None)
    assert [s.name for s in settings] == ["dev", "staging", "prod"]
    for loaded in settings:
        raw = ENVIRONMENTS[loaded.name]
        assert loaded.removal_policy == raw["removal_policy"]
        assert (loaded.region, loaded.account) == (raw.get("region", DEFAULT_REGION), raw.get("account"))


def test_selection_picks_environments_and_keeps_promotion_order() -> None:
    assert [s.name for s in load_environments(ENVIRONMENTS, "staging")] == ["staging"]
    assert [s.name for s in load_environments(ENVIRONMENTS, "prod, dev")] == ["dev", "prod"]


def test_unknown_environment_in_selection() -> None:
    with pytest.raises(
        SettingsError, match=r"^env=preprod: unknown environment; allowed values are dev, staging, prod\.$"
    ):
        load_environments(ENVIRONMENTS, "preprod")


def test_unknown_environment_in_cdk_json_is_not_silently_mapped_to_dev() -> None:
    with pytest.raises(
        SettingsError,
        match=r"^environments\.preprod: unknown environment; allowed environments are dev, staging, prod\.$",
    ):
        load_environments({**ENVIRONMENTS, "preprod": ENVIRONMENTS["dev"]}, None)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"training__remote_callers": ["nlp", "ml-team"]},
            "environments.dev.training.remote_callers: 'ml-team' must be 1-20 lowercase letters and digits, starting "
            "with a letter.",
            id="remote-caller-with-a-hyphen",
        ),
        pytest.param(
            {"training__remote_callers": ["nlp", "nlp"]},
            "environments.dev.training.remote_callers: each caller must be named once.",
            id="remote-caller-twice",
        ),
        pytest.param(
            {"training__instnce_type": "p4d.24xlarge"},
            "environments.dev.training.instnce_type: unknown setting; allowed keys are base_model, "
            "capacity_reservation_id, capacity_reservation_resource_group_arn, checkpoint_steps, "
            "collective_timeout_seconds, dataset, dlami_ssm_parameter, efa, hyperparameters, image_registry_account, "
            "image_tag, instance_type, market_type, max_restarts, max_run_hours, nodes, remote_callers, "
            "remote_image_tag, remote_instance_type, rendezvous_timeout_seconds, root_volume_gib, subnet_index.",
            id="misspelled-key",
        ),
        pytest.param({"vpc__max_azs": "2"}, "environments.dev.vpc.max_azs: must be a valid integer.", id="wrong-type"),
        pytest.param(
            {"logs__retention_days": 45},
            "environments.dev.logs.retention_days: must be 7, 14, 30, 60, 90, 180, 365, 400, 545, 731, 1096, 1827 "
            "or 3653.",
            id="log-retention",
        ),
        pytest.param(
            {"removal_policy": "delete"},
            "environments.dev.removal_policy: must be 'destroy' or 'retain'.",
            id="removal-policy",
        ),
        pytest.param(
            {"graviton_endpoint__autoscaling__min_capacity": 3},
            "environments.dev.graviton_endpoint.autoscaling: min_capacity (3) must not exceed max_capacity (2).",
            id="min-above-max",
        ),
        pytest.param(
            {"training__instance_type": "c5.24xlarge"},
            "environments.dev.training.instance_type: must be an EC2 instance type with an NVIDIA GPU, of the "
            "families g4dn, g5, g6, g6e, g7, g7e, p2, p3, p3dn, p4d, p4de, p5, p5e, p5en, p6-b200, p6-b300.",
            id="training-needs-gpu",
        ),
        pytest.param(
            # Network specifications of https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html: g6e.xlarge has
            # no EFA (from g6e.8xlarge on).
            {"training__efa": True, "training__instance_type": "g6e.xlarge"},
            r"^environments\.dev\.training: efa needs a GPU instance type with EFA \(g4dn\.12xlarge, .*"
            r"p4d\.24xlarge, .*p5\.48xlarge, .*\), not g6e\.xlarge\.$",
            id="efa-needs-efa-type",
        ),
        pytest.param(
            {"training__remote_instance_type": "ml.c5.2xlarge"},
            "environments.dev.training.remote_instance_type: must be a SageMaker training type (ml.) with an NVIDIA "
            "GPU, of the families g4dn, g5, g6, g6e, g7, g7e, p2, p3, p3dn, p4d, p4de, p5, p5e, p5en, p6-b200, "
            "p6-b300.",
            id="remote-needs-gpu",
        ),
        pytest.param(
            {"multi_model_endpoint__instance_type": "ml.c7g.metal"},
            "environments.dev.multi_model_endpoint.instance_type: must be an instance type SageMaker hosts, such as "
            "ml.c7g.4xlarge or ml.c5.2xlarge.",
            id="mme-needs-a-hosting-type",
        ),
        pytest.param(
            {"multi_model_endpoint__instance_type": "ml.t2.xlarge"},
            "environments.dev.multi_model_endpoint.instance_type: burstable ml.t* types cannot be autoscaled; "
            "use a c, m or r type.",
            id="no-burstable-autoscaling",
        ),
        pytest.param(
            {"graviton_endpoint__instance_type": "ml.c5.4xlarge"},
            "environments.dev.graviton_endpoint.instance_type: must be a Graviton (arm64) type SageMaker hosts (ml.), "
            "of the families c6g, c6gd, c6gn, c7g, c8g, m6g, m6gd, m8g, r6g, r6gd, r7gd, r8g.",
            id="graviton-needs-graviton",
        ),
        pytest.param(
            {"account": "12345"},
            "environments.dev.account: must be a 12-digit AWS account id in quotes.",
            id="malformed-account",
        ),
        pytest.param(
            {"account": 123456789012},
            "environments.dev.account: must be a valid string.",
            id="account-as-number",
        ),
        pytest.param(
            {"region": "us-west"}, "environments.dev.region: must be an AWS region code such as us-west-2.", id="region"
        ),
        pytest.param(
            {"vpc__cidr": "10.40.0.0/33"},
            "environments.dev.vpc.cidr: must be an IPv4 CIDR block such as 10.40.0.0/16.",
            id="malformed-cidr",
        ),
        pytest.param(
            {"vpc__cidr": "10.0.0.0/8"},
            "environments.dev.vpc.cidr: must have a prefix length from /16 to /28.",
            id="cidr-too-large",
        ),
        pytest.param(
            {"vpc__vpc_id": "vpc-0123456789abcdef0"},
            "environments.dev.vpc: an imported VPC needs private_subnet_ids and one availability_zones entry per "
            "subnet.",
            id="incomplete-vpc-import",
        ),
        pytest.param(
            {"vpc__availability_zones": ["us-west-2a"]},
            "environments.dev.vpc: private_subnet_ids and availability_zones are only allowed together with vpc_id.",
            id="zones-without-import",
        ),
        pytest.param(
            {"alarm_email": "ops-at-example.com"},
            "environments.dev.alarm_email: must be an e-mail address.",
            id="email",
        ),
        pytest.param(
            {"graviton_endpoint__model_data_key": "s3://bucket/model.tar.gz"},
            "environments.dev.graviton_endpoint.model_data_key: must be a relative S3 key of letters, digits and "
            "!_.*'()/- characters.",
            id="model-key",
        ),
        pytest.param(
            {"graviton_endpoint__fast_math": "fp16"},
            "environments.dev.graviton_endpoint.fast_math: must be 'bf16' or 'off'.",
            id="graviton-fast-math",
        ),
        pytest.param(
            {"graviton_endpoint__max_request_bytes": 100},
            "environments.dev.graviton_endpoint.max_request_bytes: must be greater than or equal to 1024.",
            id="graviton-request-bytes",
        ),
        pytest.param(
            {"graviton_endpoint__workers_per_model": 8},
            "environments.dev.graviton_endpoint: workers_per_model (8) must not exceed the 4 vCPUs of ml.c7g.xlarge.",
            id="graviton-workers",
        ),
        pytest.param(
            {"multi_model_endpoint__models_prefix": "multi-model"},
            "environments.dev.multi_model_endpoint.models_prefix: must end with '/' (it is a prefix).",
            id="mme-prefix",
        ),
        pytest.param(
            {"multi_model_endpoint__sizing__models": 10},
            "environments.dev.multi_model_endpoint.sizing.models: must be greater than or equal to 11.",
            id="mme-sizing-models",
        ),
        pytest.param(
            {"multi_model_endpoint__sizing__requests_per_second": 0},
            "environments.dev.multi_model_endpoint.sizing.requests_per_second: must be greater than 0.",
            id="mme-sizing-rate",
        ),
        pytest.param(
            {"multi_model_endpoint__sizing__rps": 100},
            "environments.dev.multi_model_endpoint.sizing.rps: unknown setting; allowed keys are "
            "download_mib_per_second, max_idle_time_seconds, model_weights_mib, models, p99_objective_ms, "
            "requests_per_second, warm_latency_ms.",
            id="mme-sizing-unknown-key",
        ),
        pytest.param(
            {"tags": {"project": "pytorch-platform"}},
            "environments.dev.tags.cost_centre: is required.",
            id="missing-cost-centre",
        ),
        pytest.param(
            {"training__subnet_index": 2},
            "environments.dev.training.subnet_index: must be below 2, the number of private subnets (vpc.max_azs).",
            id="training-subnet-beyond-the-vpc",
        ),
        pytest.param(
            {"vpc__nat_gateways": 0},
            "environments.dev.vpc.nat_gateways: 0 leaves the private subnets without internet access, but EC2 "
            "training downloads training.base_model and training.dataset from the Hugging Face hub; use s3:// folders "
            "or a NAT gateway.",
            id="isolated-vpc-with-hub-downloads",
        ),
        pytest.param(
            {
                "vpc__nat_gateways": 0,
                "training__base_model": "s3://my-datasets/models/roberta-base/",
                "training__dataset": "s3://my-datasets/tweets/",
            },
            "environments.dev.vpc.nat_gateways: 0 leaves the private subnets without internet access, but EC2 "
            "training builds its image on the instance with pip from PyPI (training_assets/instance/Dockerfile); use "
            "at least 1 NAT gateway or training.image_registry_account.",
            id="isolated-vpc-with-pip-install",
        ),
        pytest.param(
            {"training__nodes": 2, "training__hyperparameters": {"global_batch_size": 100}},
            "environments.dev.training.hyperparameters.global_batch_size: 100 must be a multiple of the 16 GPUs of "
            "the run (2 x p4d.24xlarge), e.g. 96.",
            id="global-batch-not-shared-equally",
        ),
        pytest.param(
            {"training__rendezvous_timeout_seconds": 10},
            "environments.dev.training.rendezvous_timeout_seconds: must be greater than or equal to 30.",
            id="rendezvous-bound-too-short",
        ),
        pytest.param(
            {"training__image_registry_account": "12345"},
            "environments.dev.training.image_registry_account: must be a 12-digit AWS account id in quotes.",
            id="image-registry-not-an-account",
        ),
    ],
)
def test_bad_setting_names_key_and_allowed_values(changes: dict, message: str) -> None:
    with pytest.raises(SettingsError) as error:
        parse_environment("dev", dev_with(**changes))
    if message.startswith("^"):  # a long list, matched by its ends
        assert re.match(message, str(error.value)), str(error.value)
    else:
        assert str(error.value) == message


def test_training_subnet_index_within_the_vpc_is_accepted() -> None:
    assert parse_environment("dev", dev_with(vpc__max_azs=3, training__subnet_index=2)).training.subnet_index == 2


def test_an_imported_vpc_counts_its_private_subnets() -> None:
    imported = dev_with(
        vpc={
            "vpc_id": "vpc-0123456789abcdef0",
            "private_subnet_ids": ["subnet-0123456789abcdef0"],
            "availability_zones": ["us-west-2a"],
            "nat_gateways": 0,  # ignored for an imported VPC: it brings its own egress
        },
        training__subnet_index=1,
    )
    with pytest.raises(
        SettingsError, match=r"^environments\.dev\.training\.subnet_index: must be below 1, .*private_subnet_ids"
    ):
        parse_environment("dev", imported)


def test_complete_vpc_import_is_accepted() -> None:
    settings = parse_environment(
        "dev",
        dev_with(
            vpc={
                "vpc_id": "vpc-0123456789abcdef0",
                "availability_zones": ["us-west-2a", "us-west-2b"],
                "private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
            }
        ),
    )
    assert settings.vpc.imported


def test_only_one_environment_per_account_manages_the_training_job_log_group() -> None:
    environments = copy.deepcopy(ENVIRONMENTS)
    environments["staging"].setdefault("logs", {})["manage_training_job_log_group"] = True
    assert environments["prod"]["logs"]["manage_training_job_log_group"] is True
    with pytest.raises(
        SettingsError,
        match=r"^environments\.prod\.logs\.manage_training_job_log_group: only one environment per account and "
        r"region may manage /aws/sagemaker/TrainingJobs, and staging already does \(give the environments different "
        r"accounts, or set it in one of them\)\.$",
    ):
        load_environments(environments, "dev")  # every environment counts, whichever are synthesized
    environments["staging"]["account"] = "222222222222"
    environments["prod"]["account"] = "333333333333"
    assert [e.name for e in load_environments(environments, None)] == ["dev", "staging", "prod"]


def test_mme_sizing_defaults_describe_the_sentiment_model_and_djl() -> None:
    from inference_assets.container.contract import DjlModelSettings

    sizing = parse_environment("dev", dev_with(multi_model_endpoint__sizing={})).multi_model_endpoint.sizing
    # RoBERTa-base with the three-label head, fp32: 124,647,939 parameters
    # (tests/proving_ground/test_training_benchmark.py counts them on the model itself) of 4 bytes.
    assert sizing.model_weights_mib == pytest.approx(124_647_939 * 4 / 2**20, abs=1)
    assert sizing.max_idle_time_seconds == DjlModelSettings().max_idle_time_seconds  # what models are published with


# CUDA 13 (every training image of platform_facts/images.json) supports Turing (7.5) and newer, not Volta (V100, 7.0):
# https://docs.nvidia.com/cuda/cuda-features-archive/index.html. bf16 needs compute capability 8.0 (Ampere) or newer;
# capabilities from https://developer.nvidia.com/cuda-gpus. Families: AWS's accelerated-computing instance types.
_FOR_BF16 = "g5, g6, g6e, g7, g7e, p4d, p4de, p5, p5e, p5en, p6-b200, p6-b300"
_FOR_CUDA13 = "g4dn, g5, g6, g6e, g7, g7e, p4d, p4de, p5, p5e, p5en, p6-b200, p6-b300"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"training__instance_type": "p3.16xlarge"},
            "environments.dev.training.instance_type: p3.16xlarge has an NVIDIA V100 (compute capability 7.0), which "
            f"the CUDA 13 image of training.image_tag and training.hyperparameters.bf16 cannot use; use a type of the "
            f"families {_FOR_BF16}.",
            id="p3-ec2",
        ),
        pytest.param(
            {"training__instance_type": "p3dn.24xlarge", "training__hyperparameters__bf16": False},
            "environments.dev.training.instance_type: p3dn.24xlarge has an NVIDIA V100 (compute capability 7.0), "
            f"which the CUDA 13 image of training.image_tag cannot use; use a type of the families {_FOR_CUDA13}.",
            id="p3dn-ec2-fp32",
        ),
        pytest.param(
            {"training__remote_instance_type": "ml.p3.2xlarge", "training__hyperparameters__bf16": False},
            "environments.dev.training.remote_instance_type: ml.p3.2xlarge has an NVIDIA V100 (compute capability "
            "7.0), which the CUDA 13 image of training.remote_image_tag cannot use; use a type of the families "
            f"{_FOR_CUDA13}.",
            id="p3-remote-fp32",
        ),
        pytest.param(
            {"training__instance_type": "g4dn.12xlarge"},
            "environments.dev.training.instance_type: g4dn.12xlarge has an NVIDIA T4 (compute capability 7.5), which "
            f"training.hyperparameters.bf16 cannot use; use a type of the families {_FOR_BF16} or set "
            "training.hyperparameters.bf16 to false.",
            id="g4dn-ec2-bf16",
        ),
        pytest.param(
            {"training__remote_instance_type": "ml.g4dn.xlarge"},
            "environments.dev.training.remote_instance_type: ml.g4dn.xlarge has an NVIDIA T4 (compute capability "
            f"7.5), which training.hyperparameters.bf16 cannot use; use a type of the families {_FOR_BF16} or set "
            "training.hyperparameters.bf16 to false.",
            id="g4dn-remote-bf16",
        ),
    ],
)
def test_gpus_the_training_images_cannot_use_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(SettingsError) as error:
        parse_environment("dev", dev_with(**changes))
    assert str(error.value) == message


@pytest.mark.parametrize(
    "instance_type",
    ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge",
     "g5.48xlarge", "g6.48xlarge", "g6e.48xlarge"],
)  # fmt: skip
def test_gpus_with_bf16_and_cuda13_are_accepted(instance_type: str) -> None:
    remote = {"training__remote_instance_type": f"ml.{instance_type}"}
    settings = parse_environment("dev", dev_with(training__instance_type=instance_type, **remote))
    assert settings.training.instance_type == instance_type


def test_efa_is_a_fact_of_the_size_not_the_family() -> None:
    # ac.html, network specifications: g5.12xlarge supports EFA, g6e.xlarge does not.
    settings = parse_environment("dev", dev_with(training__efa=True, training__instance_type="g5.12xlarge"))
    assert settings.training.efa


def test_turing_trains_without_bf16() -> None:
    changes = {"training__hyperparameters__bf16": False, "training__remote_instance_type": "ml.g4dn.xlarge"}
    settings = parse_environment("dev", dev_with(training__instance_type="g4dn.12xlarge", **changes))
    assert settings.training.remote_instance_type == "ml.g4dn.xlarge"


def test_an_isolated_vpc_trains_with_the_pipeline_built_image_and_s3_inputs() -> None:
    """No NAT gateway: the nodes pull the pipeline-built image through the ECR endpoints, not pip from PyPI."""
    settings = parse_environment("dev", dev_with(vpc__nat_gateways=0, training__image_registry_account="999999999999",
                                                 training__base_model="s3://my-datasets/models/roberta-base/",
                                                 training__dataset="s3://my-datasets/tweets/"))  # fmt: skip
    assert settings.training.image_registry_account == "999999999999"


def test_multi_node_settings_are_described_and_bounded() -> None:
    from stacks.settings import HyperParameters, TrainingSettings

    training = TrainingSettings()
    # The defaults keep their own bounds (pydantic does not check defaults), and the collective timeout stops the
    # survivors of a lost node before the Trainer's default of 30 minutes would.
    assert TrainingSettings.model_validate(training.model_dump()) == training
    assert training.collective_timeout_seconds < 30 * 60
    assert HyperParameters().global_batch_size is None
    names = ("rendezvous_timeout_seconds", "max_restarts", "checkpoint_steps", "collective_timeout_seconds",
             "image_registry_account")  # fmt: skip
    for name in names:
        assert TrainingSettings.model_fields[name].description, name
    assert HyperParameters.model_fields["global_batch_size"].description
    # 256 over 2 p4d nodes: 16 per GPU.
    assert parse_environment("dev", dev_with(training__nodes=2, training__hyperparameters={"global_batch_size": 256}))
