"""Every deployed resource keeps its logical id and type: CloudFormation replaces a resource whose logical id changes
(a new one is created and the old one deleted; a retained bucket or key is orphaned beside an empty twin), and a
resource whose type changes.

For every environment of cdk.json (and any stack outside the environments, such as the promotion pipeline when
cdk.json configures one), the synthesized templates are compared with the checked-in record
``tests/stacks/foundation/logical_ids/<environment>.json``: per stack, each resource's logical id and type, and each
output's logical id and export name (an export another stack imports cannot be renamed or removed while it is in
use). Any resource or output added, removed, renamed or retyped fails the test with the list of differences.

Logical ids that carry an asset hash (64 hex digits) are recorded with the hash masked as ``<asset-hash>``, so the
record does not change with the content of an asset.

After an intended change (a new resource, or a replacement that is the point), rewrite the records and review their
diff: ``UPDATE_LOGICAL_IDS=1 pytest tests/stacks/foundation/test_logical_ids.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

RECORDS = Path(__file__).parent / "logical_ids"
# The record of stacks synthesized outside any environment stage (the promotion pipeline, when configured).
APP_LEVEL = "app"
UPDATE = os.environ.get("UPDATE_LOGICAL_IDS") == "1"
_ASSET_HASH = re.compile(r"[0-9a-f]{64}")


def _masked(logical_id: str) -> str:
    return _ASSET_HASH.sub("<asset-hash>", logical_id)


def _export_name(name: object) -> str | None:
    """An export name as text: a plain name as it is, an intrinsic function (a token) as its JSON."""
    return None if name is None else name if isinstance(name, str) else json.dumps(name, sort_keys=True)


def identities(template: dict) -> dict[str, dict[str, str | None]]:
    """What CloudFormation identifies a template's resources and outputs by: {"Resources": {logical id: type},
    "Outputs": {logical id: export name or None}}."""
    outputs = template.get("Outputs", {})
    return {
        "Resources": {_masked(name): resource["Type"] for name, resource in sorted(template["Resources"].items())},
        "Outputs": {
            _masked(name): _export_name(output.get("Export", {}).get("Name"))
            for name, output in sorted(outputs.items())
        },
    }


def differences(recorded: dict[str, dict], synthesized: dict[str, dict]) -> list[str]:
    """One line per stack, resource or output that was added, removed or changed."""
    lines = []
    for stack in sorted(recorded.keys() | synthesized.keys()):
        if stack not in synthesized:
            lines.append(f"{stack}: stack no longer synthesized")
            continue
        if stack not in recorded:
            lines.append(f"{stack}: new stack")
            continue
        for section in ("Resources", "Outputs"):
            old, new = recorded[stack][section], synthesized[stack][section]
            lines += [f"{stack} {section}: removed {name} ({old[name]})" for name in sorted(old.keys() - new.keys())]
            lines += [f"{stack} {section}: added {name} ({new[name]})" for name in sorted(new.keys() - old.keys())]
            lines += [
                f"{stack} {section}: {name} changed from {old[name]} to {new[name]}"
                for name in sorted(old.keys() & new.keys())
                if old[name] != new[name]
            ]
    return lines


def _synthesized(cloud_assembly) -> dict[str, dict[str, dict]]:
    """{environment or APP_LEVEL: {stack id: identities}} of the synthesized app."""
    result: dict[str, dict[str, dict]] = {
        APP_LEVEL: {stack.hierarchical_id: identities(stack.template) for stack in cloud_assembly.stacks}
    }
    for stage in cloud_assembly.nested_assemblies:
        result[stage.directory_name.removeprefix("assembly-")] = {
            stack.hierarchical_id.split("/")[-1]: identities(stack.template) for stack in stage.nested_assembly.stacks
        }
    return result


@pytest.fixture(scope="module")
def synthesized(cloud_assembly) -> dict[str, dict[str, dict]]:
    return _synthesized(cloud_assembly)


def _record_names() -> list[str]:
    return sorted(path.stem for path in RECORDS.glob("*.json"))


def test_every_synthesized_environment_has_a_record(synthesized) -> None:
    if UPDATE:
        for path in RECORDS.glob("*.json"):
            if path.stem not in synthesized:
                path.unlink()
        for name, stacks in synthesized.items():
            RECORDS.mkdir(exist_ok=True)
            (RECORDS / f"{name}.json").write_text(json.dumps(stacks, indent=1, sort_keys=True) + "\n")
    assert sorted(synthesized) == _record_names(), "run with UPDATE_LOGICAL_IDS=1 to record new environments"


@pytest.mark.parametrize("name", _record_names())
def test_logical_ids_and_types_are_unchanged(synthesized, name: str) -> None:
    recorded = json.loads((RECORDS / f"{name}.json").read_text())
    changes = differences(recorded, synthesized.get(name, {}))
    assert not changes, (
        f"{name}: deployed resources would be replaced, or exports broken:\n  "
        + "\n  ".join(changes)
        + "\nIf intended, rerun with UPDATE_LOGICAL_IDS=1 and commit the records."
    )


def test_differences_name_each_added_removed_and_retyped_resource() -> None:
    """The comparison itself: each kind of change is reported."""
    before = {"S": identities({"Resources": {"A": {"Type": "T1"}, "B": {"Type": "T2"}}})}
    after = {"S": identities({"Resources": {"A": {"Type": "T9"}, "C": {"Type": "T2"}}})}
    assert differences(before, after) == [
        "S Resources: removed B (T2)",
        "S Resources: added C (T2)",
        "S Resources: A changed from T1 to T9",
    ]
    assert differences(before, {}) == ["S: stack no longer synthesized"]
    assert differences(before, before) == []
    hashed = identities({"Resources": {f"Zip{'ab' * 32}": {"Type": "T"}}})
    assert hashed["Resources"] == {"Zip<asset-hash>": "T"}
