"""`pytorch-platform mme-plan` (``make mme-plan``): each environment's validated ``multi_model_endpoint`` settings from
cdk.json, handed to the sizing plan (mme_sizing/plan.py). The sizing package never reads settings itself: this entry
point is the one place where the two meet."""

from __future__ import annotations

import json
import sys

from mme_sizing import plan
from stacks.settings import SettingsError, load_environments


def main(argv: list[str] | None = None) -> int:
    args = plan.parse_command(argv)
    try:
        environments = json.loads(args.cdk_json.read_text())["context"].get("environments")
        if args.env is not None and isinstance(environments, dict) and args.env not in environments:
            known = ", ".join(environments)
            print(f"mme-plan: --env {args.env}: unknown environment; allowed values are {known}.", file=sys.stderr)
            return 2
        selected = load_environments(environments, args.env)
    except (OSError, ValueError, KeyError) as error:  # SettingsError is a ValueError
        reason = error if isinstance(error, SettingsError) else f"cannot read context.environments ({error})"
        print(f"mme-plan: {args.cdk_json.name}: {reason}", file=sys.stderr)
        return 1
    return plan.print_plans(args, {settings.name: settings.multi_model_endpoint for settings in selected})


if __name__ == "__main__":
    sys.exit(main())
