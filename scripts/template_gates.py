"""Post-synth gates over a cloud assembly: cdk-nag + Control Tower report, cfn-lint, checkov; a summary per stack.

    python scripts/template_gates.py cdk.out

cdk-nag already failed `cdk synth` on any unacknowledged finding; this re-reads its report so the gates also hold for
an assembly made elsewhere. Exit status 1 when any gate fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


def templates(assembly: Path) -> list[Path]:
    return sorted(assembly.glob("assembly-*/*.template.json")) + sorted(assembly.glob("*.template.json"))


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


def summary(paths: list[Path]) -> str:
    lines = []
    for path in paths:
        template = json.loads(path.read_text())
        counts = collections.Counter(r["Type"] for r in template.get("Resources", {}).values())
        retained = sum(r.get("DeletionPolicy") == "Retain" for r in template.get("Resources", {}).values())
        stage = path.parent.name.removeprefix("assembly-") if path.parent.name.startswith("assembly-") else "-"
        lines.append(
            f"{stage}/{path.name.removesuffix('.template.json')}: {sum(counts.values())} resources, "
            f"{retained} retained, {len(template.get('Outputs', {}))} outputs"
        )
        top = ", ".join(f"{n} {t.removeprefix('AWS::')}" for t, n in counts.most_common(6))
        lines.append(f"    {top}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assembly", type=Path, nargs="?", default=ROOT / "cdk.out")
    args = parser.parse_args()
    paths = templates(args.assembly)
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
    lint = cfn_lint(paths)
    failed |= lint.returncode != 0
    print(f"cfn-lint: {'clean' if lint.returncode == 0 else 'FAILED'}\n{lint.stdout}".rstrip())
    scan = checkov(args.assembly)
    failed |= scan.returncode != 0
    result = next((line for line in scan.stdout.splitlines() if line.startswith("Passed checks")), scan.stdout[-2000:])
    print(f"checkov: {result}" + ("" if scan.returncode == 0 else f"\n{scan.stdout[-6000:]}"))
    print("\n" + summary(paths))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
