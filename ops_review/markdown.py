"""Markdown of a review (one page per environment, a section per stack) and of a review diff."""

from __future__ import annotations

from typing import Any

from mme_sizing.plan import NOTHING_TO_CHANGE


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        value = "<br>".join(str(v) for v in value) if value else "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return ["_none_", ""]
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows),
        "",
    ]


def _flags(statement: dict[str, Any]) -> str:
    flags = [
        name
        for name, on in (
            ("WILDCARD ACTION", statement["wildcard_actions"]),
            ("WILDCARD RESOURCE", statement["wildcard_resources"]),
            ("NOTACTION: every other action", statement.get("not_action")),
            ("NOTRESOURCE: every other resource", statement.get("not_resource")),
        )
        if on
    ]
    return ", ".join(flags) or "-"


def _access_flags(row: dict[str, Any]) -> str:
    """The flags of one service's row of a principal's access (an Allow only)."""
    if row["effect"] != "Allow":
        return "-"
    flags = [
        name
        for name, on in (
            ("WILDCARD ACTION", any("*" in a for a in row["actions"] if not a.startswith("NOT "))),
            ("WILDCARD RESOURCE", any("*" in r for r in row["resources"] if not r.startswith("NOT "))),
            ("NOTACTION: every other action", any(a.startswith("NOT ") for a in row["actions"])),
            ("NOTRESOURCE: every other resource", any(r.startswith("NOT ") for r in row["resources"])),
        )
        if on
    ]
    return ", ".join(flags) or "-"


def environment_markdown(
    environment: str, stacks: dict[str, dict[str, Any]], reach: dict[str, dict[str, Any]] | None = None
) -> str:
    lines = [f"# Ops review: {environment}", ""]
    lines += _table(
        [
            "stack",
            "resources",
            "wildcard statements",
            "open ingress",
            "stores without KMS",
            "always-on $/h",
            "training run $/h per node",
        ],
        [
            [
                name,
                sum(review["resources_by_type"].values()),
                sum(
                    s["wildcard_actions"] or s["wildcard_resources"]
                    for p in review["iam"].values()
                    for s in p["statements"]
                ),
                len(review["network"]["open_ingress"]),
                sum(e["encrypted_with"] != "kms" for e in review["encryption"]),
                f"{review['cost']['always_on_hourly_usd']:.4f}",
                f"{review['cost']['per_training_run_hourly_usd_per_node']:.4f}",
            ]
            for name, review in stacks.items()
        ],
    )
    lines += _images_markdown(stacks)
    if reach is not None:
        lines += reach_markdown(reach)
    for name, review in stacks.items():
        lines += stack_markdown(name, review)
    return "\n".join(lines)


def _principal_heading(name: str, entry: dict[str, Any]) -> str:
    trusted = f"; assumed by {', '.join(entry['trusted_by'])}" if entry["trusted_by"] else ""
    return f"{name} ({entry['kind']}{trusted})"


def reach_markdown(reach: dict[str, dict[str, Any]]) -> list[str]:
    """Per principal, what it can reach: resource, scope inside it, the allowed actions and the conditions that must
    hold (ops_review/reach.py evaluates them)."""
    lines = ["## What each principal can reach", ""]
    for name, entry in reach.items():
        lines += [f"### {_principal_heading(name, entry)}", ""]
        lines += [f"Not evaluated: {item}" for item in entry["not_evaluated"]] + (
            [""] if entry["not_evaluated"] else []
        )
        rows = [[r["resource"], r["scope"] or "-", r["actions"], r["conditions"]] for r in entry["reach"]]
        lines += _table(["resource", "scope", "actions", "only when"], rows)
    return lines


def reach_text(environment: str, reach: dict[str, dict[str, Any]], principal: str = "") -> list[str]:
    """The reach of the principals whose name holds ``principal``, as terminal lines."""
    lines = []
    for name, entry in reach.items():
        if principal.lower() not in name.lower():
            continue
        lines.append(f"{environment} {_principal_heading(name, entry)}")
        lines += [f"  not evaluated: {item}" for item in entry["not_evaluated"]]
        for row in entry["reach"] or [{"resource": "(nothing of the platform's)", "scope": "", "actions": [],
                                       "conditions": []}]:  # fmt: skip
            scope = f" {row['scope']}" if row["scope"] else ""
            when = f"  [{'; '.join(row['conditions'])}]" if row["conditions"] else ""
            lines.append(f"  {row['resource']}{scope}: {', '.join(row['actions'])}{when}")
    return lines


def _images_markdown(stacks: dict[str, dict[str, Any]]) -> list[str]:
    """Every image the environment runs, with its days of patching left (negative: ended) and any accepted risk."""
    rows = [
        [
            image["image"],
            name,
            image["setting"],
            image["architecture"],
            image["end_of_patching"] or "none declared",
            "n/a" if image["days_left"] is None else image["days_left"],
            image["accepted_risk"],
        ]
        for name, review in stacks.items()
        for image in review.get("images", [])
    ]
    if not rows:
        return []
    headers = ["image", "stack", "setting", "arch", "end of patching", "days left", "risk accepted because"]
    return ["## Images and their patch windows", "", *_table(headers, rows)]


# Long: the review page of one stack, section by section in the order a reader sees them (warnings, resources,
# principals, policies, network, encryption, retention, cost, sizing)
def stack_markdown(name: str, review: dict[str, Any]) -> list[str]:
    network, cost = review["network"], review["cost"]
    lines = [
        f"## {name} (`{review['stack_name']}`, account {review['account'] or 'from the CLI'}, "
        f"region {review['region'] or 'from the CLI'})",
        "",
    ]
    if review.get("warnings"):
        lines += ["### Warnings", "", *(f"- {warning}" for warning in review["warnings"]), ""]
    lines += ["### Resources by type", ""]
    lines += _table(["type", "count"], [[t, n] for t, n in review["resources_by_type"].items()])
    lines += ["### IAM principals", ""]
    for principal, entry in review["iam"].items():
        trusted = f" trusted by {', '.join(entry['trusted_by'])}" if entry["trusted_by"] else ""
        lines += [f"**{principal}** ({entry['type']}{trusted})", ""]
        conditional = [t for t in entry.get("trust", []) if t["conditions"]]
        if conditional:
            lines += [
                "Trust conditions: "
                + "; ".join(f"{', '.join(t['principals'])} if {t['conditions']}" for t in conditional),
                "",
            ]
        if entry["managed_policies"]:
            lines += [f"AWS managed or shared policies: {', '.join(entry['managed_policies'])}", ""]
        # What the principal can do to which resource, by service, references resolved to resource names.
        lines += _table(
            ["service", "effect", "actions", "resources", "conditions", "flags", "policy"],
            [
                [
                    a["service"],
                    a["effect"],
                    a["actions"],
                    a["resources"],
                    a["conditions"],
                    _access_flags(a),
                    a["source"],
                ]
                for a in entry.get("access", [])
            ],
        )
    lines += ["### Resource policies", ""]
    lines += _table(
        ["resource", "principals", "effect", "actions", "conditions", "flags"],
        [
            [
                p["resource"],
                p["principals"],
                p["effect"],
                p["actions"],
                p["conditions"],
                "PUBLIC" if p["public"] else _flags(p),
            ]
            for p in review["resource_policies"]
        ],
    )
    lines += [
        "### Network exposure",
        "",
        f"Internet gateways: {network['internet_gateways']}; NAT gateways: {network['nat_gateways']}; "
        f"public subnets: {', '.join(network['public_subnets']) or 'none'}; "
        f"ingress from the internet: {', '.join(network['open_ingress']) or 'none'}; "
        f"egress to the internet on all traffic: {', '.join(network['open_egress']) or 'none'}.",
        "",
    ]
    lines += _table(
        ["security group", "rule", "description"],
        [
            [group, rule["summary"], rule["description"]]
            for group, rules in network["security_groups"].items()
            for rule in rules
        ],
    )
    lines += _table(
        ["VPC endpoint", "service", "type", "private DNS", "subnets"],
        [[e["endpoint"], e["service"], e["type"], e["private_dns"], e["subnets"]] for e in network["vpc_endpoints"]],
    )
    if network["sagemaker_models"]:
        lines += _table(
            ["SageMaker model", "in VPC", "network isolation"],
            [[m["model"], m["in_vpc"], m["network_isolation"]] for m in network["sagemaker_models"]],
        )
    lines += ["### Encryption", ""]
    lines += _table(
        ["data store", "type", "encrypted with", "key", "rotation"],
        [[e["resource"], e["type"], e["encrypted_with"], e["key"], e.get("rotation")] for e in review["encryption"]],
    )
    guardrails = review["guardrails"]
    lines += ["### Guardrails", ""]
    lines += _table(
        ["resource", "public access blocked", "TLS only"],
        [
            [name, guardrails["public_access_block"].get(name, {}).get("all_blocked"), guardrails["tls_only"].get(name)]
            for name in sorted(set(guardrails["public_access_block"]) | set(guardrails["tls_only"]))
        ],
    )
    lines += _table(
        ["instance metadata of", "HttpTokens", "hop limit", "endpoint"],
        [
            [name, o["http_tokens"], o["hop_limit"], o["endpoint"]]
            for name, o in guardrails["instance_metadata"].items()
        ],
    )
    lines += ["### Deletion and retention", ""]
    lines += _table(
        ["resource", "type", "DeletionPolicy", "UpdateReplacePolicy", "retention days", "emptied on delete"],
        [
            [
                r["resource"],
                r["type"],
                r["deletion_policy"],
                r["update_replace_policy"],
                r["retention_days"],
                r["emptied_on_delete"],
            ]
            for r in review["retention"]
        ],
    )
    lines += ["### cdk-nag acknowledgements", ""]
    lines += _table(
        ["rule", "reason", "resources"], [[a["rule"], a["reason"], a["resources"]] for a in review["acknowledgements"]]
    )
    lines += _sizing_markdown(review.get("multi_model_sizing", []))
    lines += [f"### On-demand cost (prices as of {cost['prices_as_of']}, region {cost['region']})", ""]
    lines += _table(
        ["runs", "resource", "kind", "instance type", "count", "max count", "$/h each", "$/h", "$/h at max"],
        [
            [
                "always",
                i["resource"],
                i["kind"],
                _instance(i),
                i["count"],
                i.get("max_count"),
                i["unit_hourly_usd"],
                i["hourly_usd"],
                i.get("max_hourly_usd"),
            ]
            for i in cost["always_on"]
        ]
        + [
            [
                "per training run",
                i["resource"],
                i["kind"],
                _instance(i),
                i["count"],
                None,
                i["unit_hourly_usd"],
                i["hourly_usd"],
                None,
            ]
            for i in cost["per_training_run"]
        ],
    )
    lines += [
        f"Always on: **${cost['always_on_hourly_usd']:.4f}/h** "
        f"(~${cost['always_on_hourly_usd'] * 730:.0f}/month), up to ${cost['always_on_max_hourly_usd']:.4f}/h at "
        "maximum autoscaling. Per training run: "
        f"**${cost['per_training_run_hourly_usd_per_node']:.4f}/h per node** while it runs.",
        "",
    ]
    if cost["unpriced"]:
        lines += [f"Not in the price table (not counted): {', '.join(cost['unpriced'])}.", ""]
    return lines


def _instance(item: dict[str, Any]) -> str:
    return f"{item['instance_type']} ({item['hardware']})" if item.get("hardware") else item["instance_type"]


def _sizing_markdown(entries: list[dict[str, Any]]) -> list[str]:
    """The multi-model endpoint's predicted patterns (`pytorch-platform mme-plan` prints the same)."""
    if not entries:
        return []
    lines = ["### Multi-model endpoint sizing", ""]
    for entry in entries:
        if "error" in entry:
            lines += [f"**{entry['endpoint']}**: {entry['error']}", ""]
            continue
        lines += [f"**{entry['endpoint']}**: {entry['summary']}", ""]
        lines += _table(entry["headers"], entry["rows"])
        lines += [entry["parity"], ""]
        lines += [f"- {line}" for line in entry["advice"]] or [f"- {NOTHING_TO_CHANGE}"]
        lines.append("")
    return lines


def gates_markdown(report: dict[str, Any]) -> str:
    """The gates report `make synth` writes into the assembly: each gate, then every acknowledged finding."""
    lines = ["# Gates", "", "From `gates-report.json`, written by `make synth` (scripts/template_gates.py).", ""]
    lines += _table(
        ["gate", "result", "summary"],
        [[name, "passed" if gate["passed"] else "FAILED", gate["summary"]] for name, gate in report["gates"].items()],
    )
    lines += ["## Unacknowledged findings", ""] + [f"- {v}" for v in report["unacknowledged"]] + [""]
    lines += ["## Acknowledged findings", ""]
    lines += _table(
        ["gate", "stack", "resource", "rule", "reason"],
        [[f["gate"], f["stack"], f["resource"], f["rule"], f["reason"]] for f in report["acknowledged"]],
    )
    lines += ["## checkov skips (.checkov.yaml)", ""]
    lines += _table(["checks", "reason"], [[skip["checks"], skip["reason"]] for skip in report["checkov_skips"]])
    return "\n".join(lines)


def review_warnings(reviews: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Every stack's warnings, each prefixed with its environment and stack."""
    return [
        f"{environment}/{name}: {warning}"
        for environment, stacks in reviews.items()
        for name, review in stacks.items()
        for warning in review.get("warnings", [])
    ]


def index_markdown(
    reviews: dict[str, dict[str, dict[str, Any]]], files: dict[str, str], gates: dict[str, Any] | None = None
) -> str:
    lines = ["# Ops review", "", "Generated by `python -m ops_review` from the synthesized cloud assembly.", ""]
    if gates is None:
        lines += ["Gates: no gates-report.json in the assembly (run `make synth`).", ""]
    else:
        lines += [f"[Gates](gates.md): {len(gates['acknowledged'])} acknowledged findings, each with its reason.", ""]
        lines += [f"- {name}: {gate['summary']}" for name, gate in gates["gates"].items()] + [""]
    if warnings := review_warnings(reviews):
        lines += ["## Warnings", "", *(f"- {warning}" for warning in warnings), ""]
    lines += _table(
        ["environment", "stacks", "always-on $/h", "training run $/h per node"],
        [
            [
                f"[{environment}]({files[environment]}.md)",
                len(stacks),
                f"{sum(r['cost']['always_on_hourly_usd'] for r in stacks.values()):.4f}",
                f"{sum(r['cost']['per_training_run_hourly_usd_per_node'] for r in stacks.values()):.4f}",
            ]
            for environment, stacks in reviews.items()
        ],
    )
    return "\n".join(lines)


def diff_markdown(diff: dict[str, Any]) -> str:
    lines = ["# Ops review diff", "", "## Findings", ""]
    lines += [f"- {finding}" for finding in diff["findings"]] or [
        "_none: no riskier permissions, exposure, encryption, retention or cost_"
    ]
    lines.append("")
    if diff.get("replaced") or diff.get("refused"):
        lines += ["## Replacements", ""]
        lines += [f"- {line}" for line in [*diff.get("refused", []), *diff.get("replaced", [])]]
        lines.append("")
    for label, change in diff["stacks"].items():
        lines += [f"## {label} ({change['status']})", ""]
        for key, value in change.items():
            if key == "status":
                continue
            lines += [f"### {key.replace('_', ' ')}", ""]
            if isinstance(value, dict):
                lines += _table(["item", "old", "new"], [[k, v["old"], v["new"]] for k, v in value.items()])
            elif key.startswith("permissions"):
                lines += _table(["principal", "effect", "action", "resource", "conditions"], [list(v) for v in value])
            elif key.startswith("trust"):
                lines += _table(["role", "effect", "trusted principal", "conditions"], [list(v) for v in value])
            elif key.startswith("acknowledgements"):
                lines += _table(["rule", "reason"], [list(v) for v in value])
            else:
                lines += [f"- {v}" for v in value] + [""]
    return "\n".join(lines)
