"""Post-synth gates over a cloud assembly: cdk-nag + Control Tower report, cfn-lint, checkov; a summary per stack.

    python -m scripts.template_gates cdk.out

cdk-nag already failed `cdk synth` on any unacknowledged finding; this re-reads its report so the gates also hold for
an assembly made elsewhere. Exit status 1 when any gate fails.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from stacks.settings import ENVIRONMENT_NAMES

ROOT = Path(__file__).resolve().parents[1]
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
CHECKOV_CONFIG = ROOT / ".checkov.yaml"


def stacks(assembly: Path) -> list[tuple[str, Path]]:
    """(name as `cdk ls` prints it, template) of every stack: the environments' stages in promotion order (dev,
    staging, prod), each stage's stacks in the assembly's deployment order, then the top-level stacks (the pipeline).
    """
    manifest = json.loads((assembly / "manifest.json").read_text())
    found: list[tuple[str, Path]] = []
    nested: list[tuple[str, Path]] = []
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        properties = artifact.get("properties", {})
        if artifact["type"] == "aws:cloudformation:stack":
            found.append((artifact.get("displayName", artifact_id), assembly / properties["templateFile"]))
        elif artifact["type"] == "cdk:cloud-assembly":
            nested.append((artifact_id.removeprefix("assembly-"), assembly / properties["directoryName"]))

    def promotion_rank(stage: tuple[str, Path]) -> int:
        name = stage[0]
        return ENVIRONMENT_NAMES.index(name) if name in ENVIRONMENT_NAMES else len(ENVIRONMENT_NAMES)

    staged = [stack for _, directory in sorted(nested, key=promotion_rank) for stack in stacks(directory)]
    return staged + found


def templates(assembly: Path) -> list[Path]:
    return [path for _, path in stacks(assembly)]


def checkov_skips(config: Path = CHECKOV_CONFIG) -> list[tuple[list[str], str]]:
    """The checks .checkov.yaml skips, grouped with the reason written in the comment above them."""
    groups: list[tuple[list[str], str]] = []
    comment: list[str] = []
    in_skips = False
    for line in config.read_text().splitlines():
        stripped = line.strip()
        if not line.startswith((" ", "-", "#")) and stripped:
            in_skips = stripped.startswith("skip-check:")
            comment = []
            continue
        if not in_skips:
            continue
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
        elif match := re.match(r"^-\s*(\S+)", stripped):
            if comment or not groups:
                groups.append(([], " ".join(comment)))
                comment = []
            groups[-1][0].append(match[1])
    return groups


def nag_violations(assembly: Path) -> list[str]:
    report = assembly / "validation-report.json"
    if not report.exists():
        return []
    plugins = json.loads(report.read_text())["pluginReports"]
    return [
        f"{violation['ruleName']} at {resource['constructPath']}"
        for plugin in plugins
        for violation in plugin["violations"]
        for resource in violation.get("violatingConstructs", violation.get("violatingResources", []))
    ]


CONTROL_TOWER = "cdk-validator-cfnguard::"


def control_tower_acknowledgements(paths: list[Path]) -> list[str]:
    """Every acknowledged Control Tower proactive control, as '<stage>/<stack> <resource>: <rule>: <reason>'; read
    from the template metadata the compliance gates write (synth already failed on any unacknowledged one)."""
    lines = []
    for path in paths:
        stage = path.parent.name.removeprefix("assembly-") if path.parent.name.startswith("assembly-") else "-"
        for logical_id, resource in json.loads(path.read_text()).get("Resources", {}).items():
            for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
                if rule["id"].startswith(CONTROL_TOWER):
                    name = rule["id"].removeprefix(CONTROL_TOWER)
                    where = f"{stage}/{path.name.removesuffix('.template.json')} {logical_id}"
                    lines.append(f"{where}: {name}: {rule['reason']}")
    return lines


def cfn_lint(paths: list[Path]) -> subprocess.CompletedProcess:
    executable = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or "cfn-lint"
    return subprocess.run([executable, *map(str, paths)], capture_output=True, text=True)


def checkov(assembly: Path) -> subprocess.CompletedProcess:
    if not CHECKOV.exists():
        raise SystemExit(f"checkov is missing at {CHECKOV}; run `make install` (it lives in its own virtualenv).")
    return subprocess.run(
        [str(CHECKOV), "-d", str(assembly), "--config-file", str(ROOT / ".checkov.yaml")],
        capture_output=True,
        text=True,
    )


def summary(named_templates: list[tuple[str, Path]]) -> str:
    lines = []
    for name, path in named_templates:
        template = json.loads(path.read_text())
        counts = collections.Counter(r["Type"] for r in template.get("Resources", {}).values())
        retained = sum(r.get("DeletionPolicy") == "Retain" for r in template.get("Resources", {}).values())
        lines.append(
            f"{name}: {sum(counts.values())} resources, {retained} retained, {len(template.get('Outputs', {}))} outputs"
        )
        top = ", ".join(f"{n} {t.removeprefix('AWS::')}" for t, n in counts.most_common(6))
        lines.append(f"    {top}")
    return "\n".join(lines)


def skips_summary(groups: list[tuple[list[str], str]]) -> str:
    lines = [f"checkov skips {sum(len(ids) for ids, _ in groups)} checks (.checkov.yaml):"]
    for ids, reason in groups:
        lines.append(f"  {', '.join(ids)}: {reason or 'NO REASON GIVEN'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("assembly", type=Path, nargs="?", default=ROOT / "cdk.out")
    args = parser.parse_args(argv)
    named_templates = stacks(args.assembly) if (args.assembly / "manifest.json").exists() else []
    paths = [path for _, path in named_templates]
    if not paths:
        raise SystemExit(f"no templates under {args.assembly}; run `cdk synth` first.")
    failed = False
    if violations := nag_violations(args.assembly):
        failed = True
        print("cdk-nag: unacknowledged findings:\n  " + "\n  ".join(violations))
    else:
        print(f"cdk-nag (AwsSolutions, NIST 800-53 R5): no unacknowledged findings in {len(paths)} templates")
        acknowledged = control_tower_acknowledgements(paths)
        print(
            "Control Tower proactive controls (cdk-validator-cfnguard): no unacknowledged findings; "
            f"{len(acknowledged)} acknowledged:" + "".join(f"\n  {line}" for line in acknowledged)
        )
    # cfn-lint and checkov are independent processes of ~10-20 s each: run them side by side.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        linting = pool.submit(cfn_lint, paths)
        scanning = pool.submit(checkov, args.assembly)
        lint, scan = linting.result(), scanning.result()
    failed |= lint.returncode != 0
    print(f"cfn-lint: {'clean' if lint.returncode == 0 else 'FAILED'}\n{lint.stdout}".rstrip())
    failed |= scan.returncode != 0
    result = next((line for line in scan.stdout.splitlines() if line.startswith("Passed checks")), scan.stdout[-2000:])
    print(f"checkov: {result}" + ("" if scan.returncode == 0 else f"\n{scan.stdout[-6000:]}"))
    print(skips_summary(checkov_skips()))
    print("\n" + summary(named_templates))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
