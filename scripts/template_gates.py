"""Post-synth gates over a cloud assembly: cdk-nag + Control Tower report, cfn-lint, checkov, and the IAM analysers
parliament and cloudsplaining over every identity policy (scripts/iam_analysers.py); one line per gate and
per stack, and the full report (every acknowledged finding with its reason) in ``cdk.out/gates-report.json``, which
``pytorch-platform review`` shows.

    python -m scripts.template_gates cdk.out [--verbose]

cdk-nag already failed `cdk synth` on any unacknowledged finding; this re-reads its report so the gates also hold for
an assembly made elsewhere. A failing gate prints in full; exit status 1 when any gate fails.
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
from typing import Any

from ops_review import GATES_REPORT, PLACEHOLDER_METADATA
from ops_review.image_check import image_needs
from ops_review.review import load_assembly
from scripts import iam_analysers
from stacks import deploy_rules
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
    # A plugin that failed without a violation crashed (seen: the Control Tower validator on a key policy it could
    # not read); its error is a finding, or the gate would pass on templates no one checked.
    crashed = [
        f"{plugin['pluginName']} failed: {plugin.get('metadata', {}).get('error', 'no error given').splitlines()[0]}"
        for plugin in plugins
        if plugin.get("conclusion") == "failure" and not plugin["violations"]
    ]
    return crashed + [
        f"{violation['ruleName']} at {resource['constructPath']}"
        for plugin in plugins
        for violation in plugin["violations"]
        for resource in violation.get("violatingConstructs", violation.get("violatingResources", []))
    ]


CONTROL_TOWER = "cdk-validator-cfnguard::"


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


def stack_lines(named_templates: list[tuple[str, Path]]) -> list[str]:
    """One line per stack: resources (the most common types), retained resources, outputs."""
    lines = []
    for name, path in named_templates:
        template = json.loads(path.read_text())
        resources = template.get("Resources", {}).values()
        counts = collections.Counter(r["Type"] for r in resources)
        retained = sum(r.get("DeletionPolicy") == "Retain" for r in resources)
        top = ", ".join(f"{n} {t.removeprefix('AWS::')}" for t, n in counts.most_common(4))
        placeholder = template.get("Metadata", {}).get(PLACEHOLDER_METADATA)
        lines.append(
            f"{name}{f' ({placeholder})' if placeholder else ''}: {sum(counts.values())} resources ({top}, ...), "
            f"{retained} retained, {len(template.get('Outputs', {}))} outputs"
        )
    return lines


def acknowledged_findings(named_templates: list[tuple[str, Path]]) -> list[dict[str, str]]:
    """Every acknowledged cdk-nag and Control Tower finding, read from the template metadata the compliance gates
    write (synth already failed on any unacknowledged one)."""
    findings = []
    for name, path in named_templates:
        for logical_id, resource in json.loads(path.read_text()).get("Resources", {}).items():
            for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
                control_tower = rule["id"].startswith(CONTROL_TOWER)
                findings.append(
                    {
                        "gate": "control-tower" if control_tower else "cdk-nag",
                        "stack": name,
                        "resource": logical_id,
                        "rule": rule["id"].removeprefix(CONTROL_TOWER),
                        "reason": rule.get("reason", ""),
                    }
                )
    return findings


def synth_warnings(assembly: Path) -> dict[str, list[str]]:
    """{warning: [stack paths]} of every CDK warning annotation (image patch windows among them), read from the
    metadata of each stack: the CDK CLI does not print them for the stacks of nested stages."""
    found: dict[str, list[str]] = {}
    manifest = json.loads((assembly / "manifest.json").read_text())
    for artifact in manifest.get("artifacts", {}).values():
        properties = artifact.get("properties", {})
        if artifact["type"] == "cdk:cloud-assembly":
            for message, paths in synth_warnings(assembly / properties["directoryName"]).items():
                found.setdefault(message, []).extend(paths)
            continue
        metadata = dict(artifact.get("metadata", {}))
        if extra := artifact.get("additionalMetadataFile"):
            metadata.update(json.loads((assembly / extra).read_text()))
        for path, entries in metadata.items():
            for entry in entries:
                if entry.get("type") == "aws:cdk:warning":
                    message = re.sub(r" \[ack: [^\]]*\]$", "", str(entry["data"]))
                    found.setdefault(message, []).append(path.strip("/"))
    return found


def image_warnings(assembly: Path) -> dict[str, list[str]]:
    """One warning per image a stack resolves from SSM when it deploys (ops_review/image_check.py): synth cannot see
    whether the parameter exists, names the right architecture or a repository the account can pull, and each of
    those fails the deploy; the line names the command that checks it."""
    found: dict[str, list[str]] = {}
    stacks = [stack for stack in load_assembly(assembly) if stack.environment in ENVIRONMENT_NAMES]
    for need in image_needs(stacks):
        environment = need.stack.split("/")[0]
        message = (
            f"{need.stack} resolves the image in SSM parameter {need.parameter} when it deploys "
            f"({need.architecture or 'architecture unknown'} for {need.runs_on}): absent, of another architecture or "
            f"in a repository this account cannot pull, it fails the deploy; check it with "
            f"`pytorch-platform check-images --env {environment}`"
        )
        found.setdefault(message, []).append(need.stack)
    return found


def checkov_counts(stdout: str) -> dict[str, int]:
    match = re.search(r"Passed checks: (\d+), Failed checks: (\d+), Skipped checks: (\d+)", stdout)
    passed, failed, skipped = (int(n) for n in match.groups()) if match else (0, 0, 0)
    return {"passed": passed, "failed": failed, "skipped": skipped}


def analyser_gate(analysed: dict[str, Any], analyser: str, what: str) -> tuple[bool, str]:
    """(passed, summary) of one IAM analyser: no open finding and no stale exception of its own."""
    open_findings = [f for f in analysed["open"] if f["analyser"] == analyser]
    excused = [f for f in analysed["excused"] if f["analyser"] == analyser]
    stale = [e for e in analysed["stale_exceptions"] if e["analyser"] == analyser]
    summary = (
        f"{len(open_findings)} open, {len(excused)} excused in {iam_analysers.EXCEPTIONS_FILE.name}, "
        f"{len(stale)} stale exceptions ({analysed['policies']} identity policies{what})"
    )
    return not open_findings and not stale, summary


# Long: every gate runs and is summarized here, in the order `make synth` prints them; split, the report's shape
# would be spread over several functions.
def run_gates(assembly: Path) -> dict[str, Any]:
    """Run every gate over the assembly and return the report (also written to ``<assembly>/gates-report.json``)."""
    named_templates = stacks(assembly) if (assembly / "manifest.json").exists() else []
    paths = [path for _, path in named_templates]
    if not paths:
        raise SystemExit(f"no templates under {assembly}; run `cdk synth` first.")
    # cfn-lint and checkov are independent processes of ~10-20 s each: run them side by side.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        linting = pool.submit(cfn_lint, paths)
        scanning = pool.submit(checkov, assembly)
        lint, scan = linting.result(), scanning.result()
    analysed = iam_analysers.run(assembly)
    broken = [f"{name}/{finding}" for name, path in named_templates
              for finding in deploy_rules.findings(json.loads(path.read_text()))]  # fmt: skip
    violations = nag_violations(assembly)
    acknowledged = acknowledged_findings(named_templates)
    skips = checkov_skips()
    counts = checkov_counts(scan.stdout)
    by_gate = collections.Counter(finding["gate"] for finding in acknowledged)
    gates = {
        "cdk-nag (AwsSolutions, NIST 800-53 R5)": (
            not violations,
            f"{len(violations)} unacknowledged, {by_gate['cdk-nag']} acknowledged",
        ),
        "Control Tower proactive controls": (
            not violations,
            f"{len(violations)} unacknowledged, {by_gate['control-tower']} acknowledged",
        ),
        "deploy-time rules (SageMaker, EC2, Application Auto Scaling API references)": (
            not broken,
            f"{len(broken)} broken, {len(deploy_rules.RULES)} rules ({len(paths)} templates)",
        ),
        "cfn-lint": (lint.returncode == 0, f"{'clean' if lint.returncode == 0 else 'FAILED'} ({len(paths)} templates)"),
        "checkov": (
            scan.returncode == 0,
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
            f"({sum(len(ids) for ids, _ in skips)} checks skipped in .checkov.yaml, each with its reason)",
        ),
        **{
            name: analyser_gate(analysed, analyser, what)
            for name, analyser, what in (
                ("parliament (unknown actions and condition keys, resource mismatches)", "parliament", ""),
                (
                    "cloudsplaining (privilege escalation, exfiltration, exposure)",
                    "cloudsplaining",
                    f", {analysed['principals']} principals",
                ),
            )
        },
    }
    report = {
        "gates": {name: {"passed": passed, "summary": text} for name, (passed, text) in gates.items()},
        "iam_analysers": analysed,
        "warnings": {**synth_warnings(assembly), **image_warnings(assembly)},
        "unacknowledged": violations,
        "deploy_rules": broken,
        "acknowledged": acknowledged,
        "checkov_skips": [{"checks": ids, "reason": reason} for ids, reason in skips],
        "cfn_lint_output": lint.stdout,
        "checkov_output": "" if scan.returncode == 0 else scan.stdout[-6000:],
        "stacks": stack_lines(named_templates),
    }
    (assembly / GATES_REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report


def render(report: dict[str, Any], *, verbose: bool = False, report_file: Path | None = None) -> str:
    """What fails in full; what passes as one line per gate and per stack; every acknowledgement only if verbose."""
    lines: list[str] = []
    if report["unacknowledged"]:
        lines += ["cdk-nag / Control Tower: unacknowledged findings:", *(f"  {v}" for v in report["unacknowledged"])]
    lines += [f"deploy-time rule broken: {line}" for line in report.get("deploy_rules", [])]
    if report["cfn_lint_output"].strip():
        lines.append(report["cfn_lint_output"].rstrip())
    if report["checkov_output"]:
        lines.append(report["checkov_output"].rstrip())
    analysed = report.get("iam_analysers", {})
    for finding in analysed.get("open", []):
        lines.append(
            f"{finding['analyser']} {finding['issue']} at {finding['stack']}/{finding['principal']} "
            f"({finding['source']}): {finding['detail']}"
        )
    for entry in analysed.get("stale_exceptions", []):
        lines.append(f"stale exception ({entry['analyser']} {entry['issue']} {entry['principal']}): excuses nothing")
    for name, gate in report["gates"].items():
        lines.append(f"{'ok  ' if gate['passed'] else 'FAIL'} {name}: {gate['summary']}")
    lines += [f"     {line}" for line in report["stacks"]]
    # Warnings are few and each asks for an action (an image near its end of patching): always in full.
    for message, paths in report["warnings"].items():
        lines.append(f"warn {message} ({', '.join(sorted(set(paths)))})")
    if verbose:
        lines.append("acknowledged findings:")
        lines += [f"  {f['stack']} {f['resource']}: {f['rule']}: {f['reason']}" for f in report["acknowledged"]]
        lines.append(skips_summary([(skip["checks"], skip["reason"]) for skip in report["checkov_skips"]]))
        lines += [
            f"  {f['stack']} {f['principal']}: {f['analyser']} {f['issue']} {f['detail']}: {f['reason']}"
            for f in analysed.get("excused", [])
        ]
    elif report_file is not None:
        lines.append(f"every acknowledgement with its reason: {report_file} (`pytorch-platform review`; VERBOSE=1)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("assembly", type=Path, nargs="?", default=ROOT / "cdk.out")
    parser.add_argument("--verbose", action="store_true", help="also print every acknowledged finding and skip")
    args = parser.parse_args(argv)
    report = run_gates(args.assembly)
    print(render(report, verbose=args.verbose, report_file=args.assembly / GATES_REPORT))
    return 0 if all(gate["passed"] for gate in report["gates"].values()) else 1


def skips_summary(groups: list[tuple[list[str], str]]) -> str:
    lines = [f"checkov skips {sum(len(ids) for ids, _ in groups)} checks (.checkov.yaml):"]
    for ids, reason in groups:
        lines.append(f"  {', '.join(ids)}: {reason or 'NO REASON GIVEN'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
