"""`pytorch-platform`: the one operator command. Each subcommand hands its arguments to the ``main(argv)`` of the module
that does the work, imported only when chosen (so `pytorch-platform review` does not import torch)."""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple


class Subcommand(NamedTuple):
    module: str
    summary: str
    # Arguments put before the user's: subcommands that are one mode of a multi-mode tool.
    leading_args: tuple[str, ...] = ()


SUBCOMMANDS: dict[str, Subcommand] = {
    "tiny-model": Subcommand("training_assets.tiny_model", "build the tiny offline RoBERTa used by the demo and tests"),
    "train": Subcommand("training_assets.instance.train_sentiment", "fine-tune the sentiment model (CPU or GPUs)"),
    "remote-train": Subcommand("training_assets.remote_train", "run the training as SageMaker jobs through @remote"),
    "package": Subcommand("inference_assets.tools.package_model", "package a saved model as model.tar.gz"),
    "publish": Subcommand("inference_assets.tools.publish_models", "package, publish, list, remove MME models"),
    "check-model": Subcommand("inference_assets.tools.model_check", "before a deploy: is the endpoint's model in S3?"),
    "check-images": Subcommand("ops_review.image_check", "before a deploy: are the stacks' images there and pullable?"),
    "serve": Subcommand("inference_assets.local.local_server", "serve model.tar.gz locally with Ray Serve"),
    "invoke": Subcommand("inference_assets.tools.endpoint_client", "invoke a deployed endpoint", ("invoke",)),
    "smoke-test": Subcommand(
        "inference_assets.tools.endpoint_client", "smoke-test a deployed endpoint", ("smoke-test",)
    ),
    "mme-plan": Subcommand("stacks.mme_plan", "predict each environment's multi-model endpoint for the three patterns"),
    "review": Subcommand("ops_review.__main__", "ops review of cdk.out (or --diff of two)"),
    "cleanup": Subcommand("ops_review.cleanup", "what SageMaker and EC2 leave outside CloudFormation"),
    "preflight": Subcommand("ops_review.preflight", "before a first deploy: quotas, zone, model, key, buckets"),
    "change-endpoint-instance": Subcommand(
        "ops_review.change_instance", "change an autoscaled endpoint's instance type (deregister, deploy, re-register)"
    ),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {command.summary}" for name, command in SUBCOMMANDS.items()]
    return "usage: pytorch-platform <subcommand> [arguments]   (<subcommand> --help for its arguments)\n\n" + "\n".join(
        lines
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command = SUBCOMMANDS.get(args[0])
    if command is None:
        print(f"pytorch-platform: unknown subcommand {args[0]!r}; one of: {', '.join(SUBCOMMANDS)}.", file=sys.stderr)
        return 2
    module = importlib.import_module(command.module)
    sys.argv[0] = f"pytorch-platform {args[0]}"  # argparse's prog in the subcommand's help and errors
    result = module.main([*command.leading_args, *args[1:]])
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
