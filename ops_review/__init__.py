"""Ops review of a synthesized CDK app: ``python -m ops_review cdk.out --out review/`` and
``python -m ops_review --diff old_cdk.out new_cdk.out --out review-diff/``."""

# The gates' report in a cloud assembly: written by scripts/template_gates.py (`make synth`), read by the review.
GATES_REPORT = "gates-report.json"
# The template metadata key of a pipeline stack synthesized with placeholder settings (app.py): the gates' summary
# and the review say so next to the stack.
PLACEHOLDER_METADATA = "PytorchPlatformPlaceholderConfiguration"
