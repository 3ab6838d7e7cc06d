"""CLI: review a cloud assembly, or the difference between two."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import date
from pathlib import Path
from typing import Any

from ops_review.diff import diff_reviews, replacements
from ops_review.markdown import (
    diff_markdown,
    environment_markdown,
    gates_markdown,
    index_markdown,
    reach_text,
    review_warnings,
)
from ops_review.reach import reach_assembly
from ops_review.review import PRICES_FILE, load_assembly, load_gates_report, load_prices, review_assembly


def write_review(
    reviews: dict[str, dict[str, dict[str, Any]]],
    out: Path,
    gates: dict[str, Any] | None = None,
    reach: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> list[Path]:
    """One Markdown and one JSON file per environment (a section/key per stack, and what each principal can reach),
    gates.md when the assembly has a gates report, and an index.md."""
    out.mkdir(parents=True, exist_ok=True)
    files = {environment: re.sub(r"[^A-Za-z0-9_.-]+", "-", environment).strip("-") or "app" for environment in reviews}
    written = []
    for environment, stacks in reviews.items():
        json_file, markdown_file = out / f"{files[environment]}.json", out / f"{files[environment]}.md"
        principals = (reach or {}).get(environment, {})
        document = {"environment": environment, "stacks": stacks, "reach": principals}
        json_file.write_text(json.dumps(document, indent=2) + "\n")
        markdown_file.write_text(environment_markdown(environment, stacks, principals))
        written += [json_file, markdown_file]
    if gates is not None:
        (out / "gates.md").write_text(gates_markdown(gates))
        written.append(out / "gates.md")
    (out / "index.md").write_text(index_markdown(reviews, files, gates))
    return [*written, out / "index.md"]


def write_diff(diff: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "diff.json").write_text(json.dumps(diff, indent=2) + "\n")
    (out / "diff.md").write_text(diff_markdown(diff))
    return [out / "diff.json", out / "diff.md"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops_review", description=__doc__)
    parser.add_argument("cdk_out", nargs="?", type=Path, help="cloud assembly to review (e.g. cdk.out)")
    parser.add_argument(
        "--diff",
        nargs=2,
        type=Path,
        metavar=("OLD_CDK_OUT", "NEW_CDK_OUT"),
        help="write the difference between the reviews of two cloud assemblies",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the Markdown and JSON files")
    parser.add_argument("--prices", type=Path, default=PRICES_FILE, help="price table (default: %(default)s)")
    parser.add_argument(
        "--today",
        type=date.fromisoformat,
        default=None,
        help="count the images' days of patching left from this date, YYYY-MM-DD (default: the clock's)",
    )
    parser.add_argument(
        "--reach",
        nargs="?",
        const="",
        metavar="PRINCIPAL",
        help="also print what each principal (or those whose name holds PRINCIPAL) can reach",
    )
    args = parser.parse_args(argv)
    if (args.cdk_out is None) == (args.diff is None):
        parser.error("give either one cloud assembly or --diff OLD NEW")
    prices = load_prices(args.prices)
    try:
        if args.diff:
            diff = diff_reviews(*(review_assembly(path, prices, args.today) for path in args.diff))
            # What CloudFormation replaces, and refuses, read from the templates themselves (ops_review/diff.py).
            diff.update(replacements(*(load_assembly(path) for path in args.diff)))
            written = write_diff(diff, args.out)
            print("\n".join(diff["findings"]) or "no riskier permissions, exposure, encryption, retention or cost")
            for line in [*diff["replaced"], *diff["refused"]]:
                print(line)
            if diff["refused"]:
                print(f"wrote {len(written)} files to {args.out}")
                return 1
        else:
            reviews = review_assembly(args.cdk_out, prices, args.today)
            reach = reach_assembly(load_assembly(args.cdk_out))
            written = write_review(reviews, args.out, load_gates_report(args.cdk_out), reach)
            for warning in review_warnings(reviews):
                print(f"WARNING {warning}")
            if args.reach is not None:
                for environment, principals in reach.items():
                    for line in reach_text(environment, principals, args.reach):
                        print(line)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
