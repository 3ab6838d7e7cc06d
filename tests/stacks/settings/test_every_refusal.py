"""Every refusal of the settings that no other test reached (found with coverage of stacks/settings/): each stops
synth with its one sentence, next to the nearest value that passes, so a rule that stops refusing, or starts
refusing good values, fails here."""

from __future__ import annotations

import pytest

from stacks.settings import SettingsError, load_environments, parse_environment
from tests.stacks.settings.test_settings import ENVIRONMENTS, environment_with


def _staging(**changes: object) -> dict:
    return environment_with("staging", **changes)


def _refusal(**changes: object) -> str | None:
    try:
        parse_environment("staging", _staging(**changes))
    except SettingsError as error:
        return str(error)
    return None


# (changes that pass, the same key's changes that are refused, the refusal's sentence start)
CASES = [
    pytest.param({"graviton_endpoint__model_data_key": "endpoints/sentiment/model-v2.tar.gz"},
                 [{"graviton_endpoint__model_data_key": key} for key in
                  ("endpoints/sentiment/model-v2.tar", "endpoints/sentiment/model-v2.gz",
                   "endpoints/sentiment/model-v2.zip", "endpoints/sentiment/model.tar.gz.bak",
                   "endpoints/sentiment/tar.gz")],
                 "environments.staging.graviton_endpoint.model_data_key: must name a model.tar.gz archive",
                 id="model-key-archive"),
    pytest.param({"graviton_endpoint__model_data_key": "endpoints/a.tar.gz"},
                 [{"graviton_endpoint__model_data_key": "training-output/r-1/model.tar.gz"},
                  {"graviton_endpoint__model_data_key": "endpoints.tar.gz"}],
                 "environments.staging.graviton_endpoint.model_data_key: must start with 'endpoints/'",
                 id="model-key-prefix"),
    pytest.param({"vpc__vpc_id": "vpc-0123456789abcdef0", "vpc__availability_zones": ["us-west-2a"],
                  "vpc__private_subnet_ids": ["subnet-0123456789abcdef0"]},
                 [{"vpc__vpc_id": "vpc-XYZ", "vpc__availability_zones": ["us-west-2a"],
                   "vpc__private_subnet_ids": ["subnet-0123456789abcdef0"]}],
                 "environments.staging.vpc.vpc_id: must look like vpc-0123456789abcdef0", id="vpc-id"),
    pytest.param({"vpc__vpc_id": "vpc-0123456789abcdef0", "vpc__availability_zones": ["us-west-2a", "us-west-2b"],
                  "vpc__private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]},
                 [{"vpc__vpc_id": "vpc-0123456789abcdef0", "vpc__availability_zones": ["us-west-2a", "us-west-2b"],
                   "vpc__private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-nope"]}],
                 "environments.staging.vpc: private_subnet_ids entry 'subnet-nope' must look like", id="subnet-id"),
    pytest.param({"training__base_model": "s3://models-bucket/roberta/"},
                 [{"training__base_model": "s3://Bad_Bucket/roberta/"}, {"training__base_model": "s3://b/x"}],
                 "environments.staging.training.base_model: must be an s3://bucket/prefix/ folder URI",
                 id="s3-source"),
    pytest.param({"training__dataset": "tweet_eval:sentiment"},
                 [{"training__dataset": "tweet eval"}, {"training__dataset": "/data/set"}],
                 "environments.staging.training.dataset: must be an s3:// folder URI or a Hugging Face hub id such "
                 "as tweet_eval:sentiment", id="hub-dataset"),
    pytest.param({"training__base_model": "cardiffnlp/twitter-roberta-base"},
                 [{"training__base_model": "roberta:base"}],
                 "environments.staging.training.base_model: must be an s3:// folder URI or a Hugging Face hub id such "
                 "as cardiffnlp/twitter-roberta-base", id="hub-model"),
    pytest.param({"training__dlami_ssm_parameter": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia/latest"},
                 [{"training__dlami_ssm_parameter": "/aws/service/ami-amazon-linux-latest/al2023"}],
                 "environments.staging.training.dlami_ssm_parameter: must be a public DLAMI SSM parameter",
                 id="dlami"),
    pytest.param({"multi_model_endpoint__models_prefix": "mme/models/"},
                 [{"multi_model_endpoint__models_prefix": "mme/models"}],
                 "environments.staging.multi_model_endpoint.models_prefix: must end with '/'", id="models-prefix"),
    # A SageMaker name where an EC2 type is asked for, and the reverse: the same hardware, another service.
    pytest.param({"training__instance_type": "p4d.24xlarge"}, [{"training__instance_type": "ml.p4d.24xlarge"}],
                 "environments.staging.training.instance_type: must be an EC2 instance type", id="ec2-not-ml"),
    pytest.param({"training__remote_instance_type": "ml.g5.xlarge"}, [{"training__remote_instance_type": "g5.xlarge"}],
                 "environments.staging.training.remote_instance_type: must be a SageMaker training type (ml.)",
                 id="ml-not-ec2"),
    pytest.param({"tags__cost_centre": "ml-platform/team:a=b+c@d"},
                 [{"tags__cost_centre": ""}, {"tags__cost_centre": "semi;colon"}, {"tags__cost_centre": "x" * 257}],
                 "environments.staging.tags.cost_centre: must be 1-256 letters, digits, spaces", id="tag-value"),
]  # fmt: skip


@pytest.mark.parametrize(("good", "bad", "sentence"), CASES)
def test_each_rule_refuses_its_bad_values_in_one_sentence_and_passes_the_nearest_good_one(
    good: dict, bad: list[dict], sentence: str
) -> None:
    assert _refusal(**good) is None
    for changes in bad:
        refusal = _refusal(**changes)
        assert refusal is not None and refusal.startswith(sentence), (changes, refusal)
        assert refusal.endswith(".") and "\n" not in refusal


def test_an_environment_that_is_no_object_or_unknown_is_refused_by_name() -> None:
    with pytest.raises(SettingsError, match=r"^environments\.dev: must be an object of settings\.$"):
        parse_environment("dev", ["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=r"^environments\.qa: unknown environment; allowed environments are dev"):
        parse_environment("qa", ENVIRONMENTS["dev"])
    for context in (None, [], {}):
        with pytest.raises(SettingsError, match=r"^cdk\.json context must hold an 'environments' object"):
            load_environments(context, None)
