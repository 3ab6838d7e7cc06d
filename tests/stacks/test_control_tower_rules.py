"""Control Tower's controls that cannot apply to a stage are not run (stacks/control_tower_rules.py): which rule files
count as gated on their resource types, and the joint: on a synthesized stage, the validator with the idle controls
disabled finds exactly what the whole rule set finds."""

from __future__ import annotations

import aws_cdk as cdk
import jsii
import pytest
from cdklabs.cdk_validator_cfnguard import CfnGuardValidator

from stacks.control_tower_rules import control_tower_rule_types, rules_without_resources, selected_types

# A control written as AWS writes them: a type selection, a rule on templates gated on it, the same rule on a hook's
# input, and a helper rule with a parameter.
GATED = """
let BUCKET_TYPE = "AWS::S3::Bucket"
let POLICY_TYPE = 'AWS::S3::BucketPolicy'
let INPUT_DOCUMENT = this
let buckets = Resources.*[ Type == %BUCKET_TYPE ]
let policies = Resources.*[
    Type == %POLICY_TYPE
    Properties.PolicyDocument exists
]
rule bucket_check when is_cfn_template(%INPUT_DOCUMENT)
                       %buckets not empty {
    check(%buckets.Properties)
        <<
        [CT.S3.PR.0]: a message may say Type in # anything
        >>
}
rule bucket_check when is_cfn_template(this) %policies !empty {
    %policies.Properties.PolicyDocument exists
}
rule bucket_check when is_cfn_hook(%INPUT_DOCUMENT, %BUCKET_TYPE) {
    check(%INPUT_DOCUMENT.%BUCKET_TYPE.resourceProperties)
}
rule check(bucket) {
    %bucket {
        BucketEncryption exists # a comment
    }
}
"""


def test_a_control_gated_on_its_type_selections_names_their_types() -> None:
    assert selected_types(GATED) == {"AWS::S3::Bucket", "AWS::S3::BucketPolicy"}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("rule check(bucket) {", "rule always_check {\n    Resources exists\n}\nrule check(bucket) {"),
        ("%buckets not empty {", "%buckets not empty or Parameters exists {"),
        ("Type == %BUCKET_TYPE ]", "Type == /AWS::S3::.*/ ]"),
        ("Type == %BUCKET_TYPE ]", "Type in [%BUCKET_TYPE] ]"),
        ("Type == %POLICY_TYPE", "Type != %POLICY_TYPE"),
        ("let buckets = Resources.*[ Type == %BUCKET_TYPE ]", "let buckets = Resources.*[ Properties exists ]"),
        ("let buckets = Resources.*[ Type == %BUCKET_TYPE ]", "let buckets = Resources.*[ Type == %UNKNOWN ]"),
    ],
    ids=[
        "a rule without gate",
        "another condition",
        "a type pattern",
        "a type list",
        "another operator",
        "a selection not by type",
        "an unknown constant",
    ],
)
def test_a_control_not_gated_on_named_types_always_runs(old: str, new: str) -> None:
    assert old in GATED
    assert selected_types(GATED.replace(old, new)) is None


def test_every_bundled_control_is_gated_on_the_types_it_checks() -> None:
    rules = control_tower_rule_types()
    assert len(rules) > 200
    assert [name for name, types in rules.items() if not types] == [], "these always run: is the parser out of date?"
    assert rules["ct-s3-pr-8"] == {"AWS::S3::BucketPolicy"}  # bucket policies deny requests without TLS
    assert rules["ct-ec2-pr-3"] == {"AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress"}


@jsii.implements(cdk.IPolicyValidationContextBeta1)
class _Templates:
    def __init__(self, paths: list[str]) -> None:
        self._paths = paths

    @property
    def template_paths(self) -> list[str]:
        return self._paths


def _findings(report: cdk.PolicyValidationPluginReportBeta1) -> list[tuple[str, str, str]]:
    return sorted(
        (violation.rule_name, resource.template_path, resource.resource_logical_id)
        for violation in report.violations
        for resource in violation.violating_resources
    )


def test_without_the_idle_controls_the_validator_finds_what_all_of_them_find(cloud_assembly) -> None:
    (prod,) = [stage for stage in cloud_assembly.nested_assemblies if stage.directory_name == "assembly-prod"]
    paths = [stack.template_full_path for stack in prod.nested_assembly.stacks]
    idle = rules_without_resources(paths)
    assert 0 < len(idle) < len(control_tower_rule_types())
    everything = CfnGuardValidator(control_tower_rules_enabled=True).validate(_Templates(paths))
    fewer = CfnGuardValidator(control_tower_rules_enabled=True, disabled_rules=idle).validate(_Templates(paths))
    assert _findings(fewer) == _findings(everything) != []  # prod has acknowledged findings: they are still found
