"""No dead code: vulture (pinned in requirements-dev.txt) finds nothing that nothing calls, in the product and the
proving ground, counting the tests' calls; and nothing of the product that only the tests call. What a framework
calls by name or decorator (pydantic validators, jsii's aspects, Locust's tasks and hooks, transformers' callbacks),
and what only data readers see (dataclass fields written out whole), is named below with its reason."""

from __future__ import annotations

from pathlib import Path

import vulture

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["app.py", "platform_cli.py", "stacks", "scripts", "inference_assets", "training_assets", "ops_review",
           "mme_sizing", "platform_facts"]  # fmt: skip
PROVING_GROUND = ["proving_ground"]
# Called by a framework through a decorator: pydantic's validators, Locust's tasks and event hooks.
IGNORE_DECORATORS = ["@field_validator", "@model_validator", "@task", "@events.*"]
IGNORE_NAMES = [
    "visit",  # jsii calls an aspect's visit (IAspect)
    "produce_action",  # CDK Pipelines calls a custom step's produce_action (ICodePipelineActionFactory)
    "on_*",  # transformers' TrainerCallback and Locust's User call their on_* hooks
    "abstract", "wait_time",  # Locust reads a User class's attributes
    "_server_entry",  # moto's ThreadedMotoServer calls it (the rehearsal's override)
    "frame", "trace",  # the signature signal handlers and sys.excepthook-style callbacks must have
    "retention_in_days", "deployment_config",  # jsii properties set on CloudFormation resources (read at synth)
    "check_health",  # Ray Serve calls a deployment's check_health as its periodic replica health check
    "mtime", "uid", "gid", "uname", "gname",  # TarInfo fields set for reproducible archives (tarfile reads them)
    "validate_sagemaker_config",  # the SDK's function, replaced while jobs are played (remote_job_player)
    "timeouts", "elapsed_s",  # fields of the simulation's Prediction, written out whole (dataclasses.asdict)
    "published_bf16_tflops_with_sparsity",  # a field of the accelerators table, checked against its source
    "base_learning_rate", "steps_per_epoch",  # fields of the training plan, written to the run's metrics
    "forward",  # torch calls a Module's forward from __call__
    "grad",  # autograd accumulates into a parameter's grad and the optimizer reads it (set to None between steps)
    "model_accepts_loss_kwargs", "floating_point_ops",  # transformers' Trainer reads the one, calls the other
    "expected_requests",  # the Ray Serve replica's batch target, read by its tests (what the replica observes)
]  # fmt: skip


def unused(paths: list[str]) -> list[str]:
    finder = vulture.Vulture(ignore_names=IGNORE_NAMES, ignore_decorators=IGNORE_DECORATORS)
    finder.scavenge([str(ROOT / path) for path in paths])
    return [
        f"{Path(item.filename).relative_to(ROOT)}:{item.first_lineno}: {item.typ} {item.name}"
        for item in finder.get_unused_code(min_confidence=60)
    ]


def test_nothing_is_left_that_nothing_calls() -> None:
    """The tests' calls count; what pytest calls by name in the tests (hooks, fixtures, marks) is not checked."""
    assert [line for line in unused([*PRODUCT, *PROVING_GROUND, "tests"]) if not line.startswith("tests/")] == []


def test_nothing_of_the_product_is_there_only_for_the_tests() -> None:
    """Counting only the product's and the proving ground's own calls, the product has nothing unused: what only
    tests call lives in the tests."""
    found = unused([*PRODUCT, *PROVING_GROUND])
    assert [line for line in found if not line.startswith("proving_ground/")] == []
