"""Ops review of a synthesized CDK app: ``python -m ops_review cdk.out --out review/`` and
``python -m ops_review --diff old_cdk.out new_cdk.out --out review-diff/`` read templates only; the review shows what
each principal can reach (``reach``, decided by the platform's IAM policy evaluator, ``iam_policy``, which the security
tests and the rehearsal's call gate use too). Beside them, the
operator commands that call AWS: ``preflight`` (quotas, zones, the model object, key and buckets), ``cleanup`` (what
SageMaker and EC2 leave outside CloudFormation) and ``change_instance`` (an autoscaled endpoint's instance type).
It imports the sizing model and platform_facts, never the stacks or the proving ground."""

# The gates' report in a cloud assembly: written by scripts/template_gates.py (`make synth`), read by the review.
GATES_REPORT = "gates-report.json"
# The template metadata key of a pipeline stack synthesized with placeholder settings (app.py): the gates' summary
# and the review say so next to the stack.
PLACEHOLDER_METADATA = "PytorchPlatformPlaceholderConfiguration"
