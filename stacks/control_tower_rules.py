"""Which of Control Tower's proactive controls can apply to a template.

AWS's CfnGuard validator bundles each control as a cfn-guard rule file, and cfn-guard (3.1.1) evaluates every file
against every template, also the files whose resource types a template does not have: for a 70-resource template
each file costs about 13 ms, and of the 237 files about 30 select a type a stage of the platform deploys (dev's stage
4.6 -> 1.0 CPU-s, the same findings). A control selects the resources it checks by type: a file whose every
rule is gated on such a selection (``when is_cfn_template(...) %selection not empty``, or on a Control Tower hook's
input, which a template never is) can only be skipped on templates without those types. The gate disables those
files for that template only. A file that is not written that way (a rule without the gate, a type matched by pattern)
is never disabled.
"""

from __future__ import annotations

import functools
import json
import re
import tarfile
from collections.abc import Iterable
from importlib import resources
from pathlib import Path, PurePosixPath

# The validator's jsii bundle: the same archive its Node.js side runs from, rules included.
_BUNDLE_PACKAGE = "cdklabs.cdk_validator_cfnguard._jsii"
_RULES = "package/rules/control-tower/cfn-guard/"

_MESSAGE = re.compile(r"<<.*?>>", re.S)  # a rule's message (free text)
_COMMENT = re.compile(r"#[^\n]*")
# A definition runs until the next top-level `let` or `rule` (a list may span lines).
_DEFINITION = re.compile(r"^(let|rule)\b(.*?)(?=^(?:let|rule)\b|\Z)", re.M | re.S)
_LET = re.compile(r"\s+(\w+)\s*=\s*(.*)", re.S)
_STRING = re.compile(r""""([^"]*)"|'([^']*)'""")
# A rule without parameters: it runs on the document (one with parameters is called by others).
_TOP_RULE = re.compile(r"\s+\w+\s+(?:when\s+(.*?))?\{", re.S)
_HOOK_GATE = re.compile(r"is_cfn_hook\(%INPUT_DOCUMENT,\s*%\w+\)")
_TEMPLATE_GATE = re.compile(r"is_cfn_template\((?:%INPUT_DOCUMENT|this)\)\s+%(\w+)\s+(?:not\s+empty|!empty)")
_TYPE_SELECTION = re.compile(r"Resources(?:\.\*)?\s*\[(.*)\]", re.S)
_TYPE_TEST = re.compile(r"\bType\b\s*(\S+)\s*(\S+)")


def selected_types(rule_file: str) -> frozenset[str] | None:
    """The resource types a rule file's rules select, when every rule of the file is gated on a selection of those
    types (or on a hook's input); None when any rule is not, or a type is not named by a literal (always run it)."""
    text = _COMMENT.sub("", _MESSAGE.sub("", rule_file))
    constants: dict[str, str] = {}
    selections: dict[str, str] = {}
    gates: list[str | None] = []
    for keyword, body in _DEFINITION.findall(text):
        if keyword == "let":
            let = _LET.match(body)
            if let is None:
                return None
            name, value = let.group(1), let.group(2).strip()
            if (string := _literal(value)) is not None:
                constants[name] = string
            elif (selection := _TYPE_SELECTION.fullmatch(value)) is not None:
                selections[name] = selection.group(1)
        elif (rule := _TOP_RULE.match(body)) is not None:
            gates.append(" ".join(rule.group(1).split()) if rule.group(1) else None)
    if not gates:
        return None
    types: set[str] = set()
    for gate in gates:
        if gate is not None and _HOOK_GATE.fullmatch(gate):
            continue
        template = _TEMPLATE_GATE.fullmatch(gate) if gate is not None else None
        if template is None or template.group(1) not in selections:
            return None
        tested = _types_of(selections[template.group(1)], constants)
        if not tested:
            return None
        types |= tested
    return frozenset(types)


def _literal(text: str) -> str | None:
    """The string a cfn-guard string literal ("..." or '...') stands for, or None when ``text`` is not one."""
    string = _STRING.fullmatch(text)
    return None if string is None else next(group for group in string.groups() if group is not None)


def _types_of(selection: str, constants: dict[str, str]) -> set[str] | None:
    """The types a selection's filter compares Type with (``Type == %CONSTANT`` or ``Type == "AWS::..."``), or None
    when it tests Type any other way."""
    types = set()
    for operator, operand in _TYPE_TEST.findall(selection):
        if operator != "==":
            return None
        if operand.startswith("%") and operand[1:] in constants:
            types.add(constants[operand[1:]])
        elif (string := _literal(operand)) is not None:
            types.add(string)
        else:
            return None
    return types or None


@functools.cache
def control_tower_rule_types() -> dict[str, frozenset[str] | None]:
    """{rule file's name, as the validator's ``disabled_rules`` takes it (e.g. "ct-s3-pr-8"): its selected_types}."""
    (bundle,) = [entry for entry in resources.files(_BUNDLE_PACKAGE).iterdir() if entry.name.endswith(".jsii.tgz")]
    rules: dict[str, frozenset[str] | None] = {}
    with bundle.open("rb") as raw, tarfile.open(fileobj=raw, mode="r:gz") as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.startswith(_RULES) and member.name.endswith(".guard"):
                name = PurePosixPath(member.name).stem
                if name in rules:  # the validator disables by name: two files of one name would go together
                    raise ValueError(f"two Control Tower rule files are named {name}")
                source = archive.extractfile(member)
                assert source is not None
                rules[name] = selected_types(source.read().decode())
    return rules


def rules_without_resources(template_paths: Iterable[str]) -> list[str]:
    """The rule files none of whose resource types is in any of these templates: on them, every rule would skip."""
    present = {
        str(resource.get("Type"))
        for path in template_paths
        for resource in json.loads(Path(path).read_text()).get("Resources", {}).values()
    }
    rules = control_tower_rule_types().items()
    return sorted(name for name, types in rules if types is not None and not types & present)
