"""Render docs/settings.md, the settings reference, from the settings model and cdk.json: `make docs`.

The reference is generated so it cannot drift from the code (tests/docs/test_settings_reference.py fails when the
checked-in file differs from what this renders). It works from the models' JSON schema and fields only, never from a
list of keys: every key of every nested model gets a row with its type, default (as the parent's default sets it, so
``multi_model_endpoint.autoscaling.max_capacity`` shows 4 where the shared autoscaling model says 2), allowed values
(enum, bounds, pattern) and description. The description is the field's own (``Field(description=...)`` or an
attribute docstring); without one, the comment lines written directly above the field (or after it on its line).
Rules that the schema cannot express (validators) are named, so the reader knows where to look.

    python -m scripts.settings_reference                 # write docs/settings.md
    python -m scripts.settings_reference --check         # exit 1 if docs/settings.md is stale
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "settings.md"
CDK_JSON = ROOT / "cdk.json"
REGENERATE = "make docs"

# The cdk.json context keys the app reads (app.py's try_get_context calls; a test keeps this list equal to them).
# ``environments`` and ``pipeline`` are documented from their models below.
CONTEXT_KEYS: dict[str, str] = {
    "environments": "an object with one entry per environment (`dev`, `staging`, `prod`); each entry is validated "
    "as `EnvironmentSettings` (below)",
    "pipeline": "optional: the promotion pipeline, validated as `PipelineSettings` (below); when present every synth "
    "also builds the `PromotionPipeline` stack",
    "env": "given on the command line, `-c env=dev,staging`: the environments to synthesize (default: all); every "
    "environment is validated whatever it selects",
    "today": "given on the command line, `-c today=YYYY-MM-DD`: check the images' patch windows as of that date",
    "placeholder_pipeline": "given on the command line, `-c placeholder_pipeline=true` (`make synth` passes it): "
    "without `pipeline`, also build the `PromotionPipeline` stack with placeholder settings, so the gates see it",
}
# Fields the loader sets itself rather than reading them from an environment's object in cdk.json.
INJECTED = {"name": "set by the loader from the environment's key under `environments`; not written in cdk.json"}
# Comments that are tool pragmas, not documentation.
_PRAGMAS = ("fmt:", "noqa", "type:", "pragma")


@dataclass
class Row:
    key: str
    type: str
    default: str
    allowed: str
    description: str


@dataclass
class Section:
    key: str
    model: type[BaseModel]
    description: str
    rows: list[Row] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)


def _models_by_name(
    model: type[BaseModel], found: dict[str, type[BaseModel]] | None = None
) -> dict[str, type[BaseModel]]:
    """Every model class reachable from ``model`` through its fields, by the name its JSON schema gives it."""
    found = {} if found is None else found
    found[model.__name__] = model
    for info in model.model_fields.values():
        for candidate in _annotation_types(info.annotation):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel) and candidate.__name__ not in found:
                _models_by_name(candidate, found)
    return found


def _annotation_types(annotation: Any) -> list[Any]:
    args = get_args(annotation)
    return [annotation] if not args else [t for arg in args for t in _annotation_types(arg)]


def _field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The comment lines directly above each field of ``model``'s class body (or on the field's own line)."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            # One token holds "# text  # fmt: skip": keep the text, drop the pragmas.
            first, *rest = re.split(r"\s+(?=#)", token.string)
            parts = [first.lstrip("#").strip(), *(p for p in rest if not p.lstrip("#").strip().startswith(_PRAGMAS))]
            if text := " ".join(p for p in parts if p):
                comments[token.start[0]] = text
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(token.start[0])
    (class_node,) = ast.parse(source).body
    assert isinstance(class_node, ast.ClassDef)
    found: dict[str, str] = {}
    for node in class_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        trailing = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
        if text := " ".join(above + trailing):
            found[node.target.id] = text
    return found


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _json(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else schema


def _branches(schema: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The non-null alternatives of a property, and whether null is allowed."""
    options = schema.get("anyOf", [schema])
    return [o for o in options if o.get("type") != "null"], any(o.get("type") == "null" for o in options)


def _type_name(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    branches, nullable = _branches(schema)
    names = []
    for branch in branches:
        if "$ref" in branch:
            names.append(_resolve(branch, defs).get("title", "object"))
        elif branch.get("type") == "array":
            names.append(f"list of {_type_name(branch.get('items', {}), defs)}")
        elif branch.get("type") == "object":
            values = branch.get("additionalProperties")
            names.append(f"map of string to {_type_name(values, defs)}" if isinstance(values, dict) else "object")
        else:
            names.append(branch.get("type", "any"))
    return " or ".join(names + (["null"] if nullable else []))


def _allowed(schema: dict[str, Any]) -> str:
    branches, _ = _branches(schema)
    parts: list[str] = []
    for branch in branches:
        if "enum" in branch:
            parts.append(", ".join(_json(v) for v in branch["enum"]))
        if "const" in branch:
            parts.append(_json(branch["const"]))
        low = (">=", branch.get("minimum")) if "minimum" in branch else (">", branch.get("exclusiveMinimum"))
        high = ("<=", branch.get("maximum")) if "maximum" in branch else ("<", branch.get("exclusiveMaximum"))
        if low[1] is not None and high[1] is not None and low[0] == ">=" and high[0] == "<=":
            parts.append(f"{low[1]} to {high[1]}")
        else:
            parts.extend(f"{sign} {bound}" for sign, bound in (low, high) if bound is not None)
        for word, key in (("at least", "minLength"), ("at most", "maxLength")):
            if key in branch:
                parts.append(f"{word} {branch[key]} characters")
        for word, key in (("at least", "minItems"), ("at most", "maxItems")):
            if key in branch:
                parts.append(f"{word} {branch[key]} items")
        if "pattern" in branch:
            parts.append(f"matches `{branch['pattern']}`")
        if branch.get("type") == "array" and (items := _allowed(branch.get("items", {}))):
            parts.append(f"each {items}")
    return "; ".join(parts)


def _dump(value: Any) -> Any:
    """A default as JSON data (a model default as its fields' values)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _validators(model: type[BaseModel]) -> tuple[dict[str, list[str]], list[str]]:
    """Field validators by field name, and the model validators' one-line descriptions."""
    decorators = model.__pydantic_decorators__
    by_field: dict[str, list[str]] = {}
    for name, field_validator in decorators.field_validators.items():
        for field_name in field_validator.info.fields:
            by_field.setdefault(field_name, []).append(f"`{model.__name__}.{name}`")
    rules = []
    for name, model_validator in decorators.model_validators.items():
        doc = _one_line(inspect.getdoc(model_validator.func))
        rules.append(f"`{model.__name__}.{name}`" + (f": {doc.rstrip('.')}" if doc else ""))
    return by_field, rules


def _sections(
    model: type[BaseModel],
    prefix: str,
    default: dict[str, Any] | None,
    models: dict[str, type[BaseModel]],
    optional: bool,
) -> list[Section]:
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    comments = _field_comments(model)
    by_field, rules = _validators(model)
    description = _one_line(schema.get("description"))
    if optional:
        description = f"Optional (absent by default). {description}".strip()
    section = Section(prefix.rstrip("."), model, description, rules=rules)
    nested: list[Section] = []
    required = set(schema.get("required", ()))
    for name, prop in schema["properties"].items():
        key = prefix + name
        branches, nullable = _branches(prop)
        sub = next((models[b["$ref"].rsplit("/", 1)[1]] for b in branches if "$ref" in b), None)
        if default is not None and name in default:
            value: Any = default[name]
        elif "default" in prop:
            value = prop["default"]
        elif name in required:
            value = ...
        else:  # a default_factory, which the JSON schema leaves out
            value = _dump(model.model_fields[name].get_default(call_default_factory=True))
        if sub is not None:
            nested += _sections(sub, key + ".", value if isinstance(value, dict) else None, models, nullable)
            continue
        text = _one_line(model.model_fields[name].description) or comments.get(name, "")
        if name in INJECTED and not prefix:
            text, shown = INJECTED[name], "(the environment's key)"
        else:
            shown = "**required**" if value is ... else _json(value)
        allowed = _allowed(prop)
        if name in by_field:
            allowed = "; ".join(filter(None, [allowed, "further rules in " + ", ".join(by_field[name])]))
        section.rows.append(Row(key, _type_name(prop, defs), shown, allowed, text))
    return [section, *nested]


def _context_table(cdk_json: dict[str, Any]) -> list[str]:
    flags = sorted(k for k in cdk_json.get("context", {}) if k.startswith("@"))
    lines = ["| context key | what it holds |", "|---|---|"]
    lines += [f"| `{key}` | {text} |" for key, text in CONTEXT_KEYS.items()]
    lines.append(
        f"| `@aws-cdk/...` | CDK feature flags ({len(flags)} in cdk.json): {', '.join(f'`{f}`' for f in flags)} |"
    )
    return lines


def _flatten(
    raw: dict[str, Any], model: type[BaseModel], models: dict[str, type[BaseModel]], prefix: str = ""
) -> dict[str, str]:
    """An environment's cdk.json object as key -> shown value, descending only into nested settings models."""
    props = model.model_json_schema()["properties"]
    flat: dict[str, str] = {}
    for name, value in raw.items():
        branches, _ = _branches(props.get(name, {}))
        sub = next((models[b["$ref"].rsplit("/", 1)[1]] for b in branches if "$ref" in b), None)
        if sub is not None and isinstance(value, dict):
            flat.update(_flatten(value, sub, models, f"{prefix}{name}."))
        elif isinstance(value, dict):  # a map such as accept_unpatched_images: its keys (the values are prose)
            flat[prefix + name] = ", ".join(f"`{k}`" for k in value) or "`{}`"
        else:
            flat[prefix + name] = _json(value)
    return flat


def _environments_table(
    environments: dict[str, Any], model: type[BaseModel], models: dict[str, type[BaseModel]]
) -> list[str]:
    flat = {env: _flatten(raw, model, models) for env, raw in environments.items()}
    keys: list[str] = []
    for values in flat.values():
        keys += [k for k in values if k not in keys]
    lines = ["| key | " + " | ".join(flat) + " |", "|---|" + "---|" * len(flat)]
    lines += [f"| `{key}` | " + " | ".join(flat[env].get(key, "") for env in flat) + " |" for key in keys]
    return lines


def _render_section(section: Section, root: str) -> list[str]:
    key = f"{root}.{section.key}" if section.key else root
    lines = [
        f"### `{key}`",
        "",
        f"Model: `{section.model.__name__}`." + (f" {section.description}" if section.description else ""),
        "",
    ]
    if section.rows:
        lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        lines += [f"| `{r.key}` | {r.type} | {r.default} | {r.allowed} | {r.description} |" for r in section.rows]
        lines.append("")
    if section.rules:
        lines += ["Rules across keys (validators): " + "; ".join(section.rules) + ".", ""]
    return lines


def _strictness(model: type[BaseModel]) -> str:
    """What the model's configuration refuses besides bad values (unknown keys, values of the wrong JSON type)."""
    sentences = []
    if model.model_config.get("extra") == "forbid":
        sentences.append(" A key the model does not know (a misspelling) is refused too.")
    if model.model_config.get("strict"):
        sentences.append(' Types are strict: `"2"` is not the number 2, `1` is not `true`.')
    return "".join(sentences)


def render(
    environment_model: type[BaseModel] | None = None,
    pipeline_model: type[BaseModel] | None = None,
    cdk_json: dict[str, Any] | None = None,
) -> str:
    """The whole reference as Markdown (the models and cdk.json default to the project's own)."""
    if environment_model is None or pipeline_model is None:
        from stacks.settings import EnvironmentSettings, PipelineSettings

        environment_model, pipeline_model = environment_model or EnvironmentSettings, pipeline_model or PipelineSettings
    if cdk_json is None:
        cdk_json = json.loads(CDK_JSON.read_text(encoding="utf-8"))
    module = environment_model.__module__.replace(".", "/").removesuffix("/environment") + "/"
    models = _models_by_name(environment_model)
    environments = cdk_json.get("context", {}).get("environments", {})
    lines = [
        f"<!-- Generated by `{REGENERATE}` (scripts/settings_reference.py) from {module} and cdk.json; do not edit -->",
        "# Settings reference",
        "",
        f"Every setting the platform reads, rendered from the settings model (`{module}`) and `cdk.json`. Settings are "
        "validated once, before any stack is built: a setting that cannot work stops `cdk synth` with one sentence "
        f"naming the key and what is allowed.{_strictness(environment_model)} Regenerate this page after changing "
        f"either file: `{REGENERATE}`.",
        "",
        "## cdk.json",
        "",
        "`cdk.json` holds the app command (`app`), the files `cdk watch` ignores, and the `context` the app reads:",
        "",
        *_context_table(cdk_json),
        "",
        "## What cdk.json sets per environment",
        "",
        "Keys not listed here take their default (next section).",
        "",
        *_environments_table(environments, environment_model, models),
        "",
        f"## Environment settings: `context.environments.<{'|'.join(environments) or 'name'}>`",
        "",
    ]
    for section in _sections(environment_model, "", None, models, False):
        lines += _render_section(section, "environments.<env>")
    lines += ["## Pipeline settings: `context.pipeline`", ""]
    for section in _sections(pipeline_model, "", None, _models_by_name(pipeline_model), False):
        lines += _render_section(section, "pipeline")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="settings_reference", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the file to write (default: docs/settings.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `{REGENERATE}` and commit the result.", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
