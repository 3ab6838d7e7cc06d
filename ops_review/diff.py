"""The difference of two reviews: what a change does to permissions, exposure, encryption, retention and cost."""

from __future__ import annotations

from typing import Any

from ops_review.review import ENCRYPTION_RANK, is_wildcard

Reviews = dict[str, dict[str, dict[str, Any]]]


def diff_reviews(old: Reviews, new: Reviews) -> dict[str, Any]:
    """What ``new`` changes against ``old``: {'findings': [one line per risky change], 'stacks': {'env/stack': ...}}."""
    stacks: dict[str, dict[str, Any]] = {}
    findings: list[str] = []
    keys = sorted({(e, s) for reviews in (old, new) for e, by_stack in reviews.items() for s in by_stack})
    for environment, stack in keys:
        before = old.get(environment, {}).get(stack)
        after = new.get(environment, {}).get(stack)
        label = f"{environment}/{stack}"
        if before is None or after is None:
            stacks[label] = {"status": "added" if before is None else "removed"}
            findings.append(f"{label}: stack {stacks[label]['status']}")
            if before is None:
                findings += _stack_findings(label, _empty_review(), after)
            continue
        changes = _stack_changes(before, after)
        if changes:
            stacks[label] = {"status": "changed", **changes}
            findings += _stack_findings(label, before, after)
    return {"findings": findings, "stacks": stacks}


def _empty_review() -> dict[str, Any]:
    return {
        "iam": {},
        "resource_policies": [],
        "network": {"security_groups": {}, "open_ingress": [], "public_subnets": [], "vpc_endpoints": []},
        "encryption": [],
        "retention": [],
        "acknowledgements": [],
        "cost": {
            "always_on_hourly_usd": 0.0,
            "always_on_max_hourly_usd": 0.0,
            "per_training_run_hourly_usd_per_node": 0.0,
            "always_on": [],
        },
        "resources_by_type": {},
    }


def permission_grants(review: dict[str, Any]) -> set[tuple[str, str, str, str, str]]:
    """One (principal, effect, action, resource, conditions) per action x resource of every identity policy."""
    return {
        (principal, s["effect"], action, resource, s["conditions"] or "")
        for principal, entry in review["iam"].items()
        for s in entry["statements"]
        for action in s["actions"]
        for resource in s["resources"]
    } | {
        (f"{p['resource']} <- {', '.join(p['principals'])}", p["effect"], action, resource, p["conditions"] or "")
        for p in review["resource_policies"]
        for action in p["actions"]
        for resource in p["resources"]
    }


def _exposure(review: dict[str, Any]) -> set[str]:
    network = review["network"]
    return (
        {f"{group}: {rule['summary']}" for group, rules in network["security_groups"].items() for rule in rules}
        | {f"public subnet {subnet}" for subnet in network["public_subnets"]}
        | {f"VPC endpoint {e['service']} ({e['type']})" for e in network["vpc_endpoints"]}
        | {f"public resource policy on {p['resource']}" for p in review["resource_policies"] if p["public"]}
    )


def _by_resource(entries: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {e["resource"]: {f: e.get(f) for f in fields} for e in entries}


def _changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        key: {"old": before.get(key), "new": after.get(key)}
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }


def _stack_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    grants_before, grants_after = permission_grants(before), permission_grants(after)
    exposure_before, exposure_after = _exposure(before), _exposure(after)
    acks_before = {(a["rule"], a["reason"]) for a in before["acknowledgements"]}
    acks_after = {(a["rule"], a["reason"]) for a in after["acknowledgements"]}
    changes = {
        "permissions_added": sorted(grants_after - grants_before),
        "permissions_removed": sorted(grants_before - grants_after),
        "exposure_added": sorted(exposure_after - exposure_before),
        "exposure_removed": sorted(exposure_before - exposure_after),
        "encryption": _changed(
            _by_resource(before["encryption"], ("encrypted_with", "key", "rotation")),
            _by_resource(after["encryption"], ("encrypted_with", "key", "rotation")),
        ),
        "retention": _changed(
            _by_resource(before["retention"], ("deletion_policy", "update_replace_policy", "retention_days")),
            _by_resource(after["retention"], ("deletion_policy", "update_replace_policy", "retention_days")),
        ),
        "acknowledgements_added": sorted(acks_after - acks_before),
        "acknowledgements_removed": sorted(acks_before - acks_after),
        "resources_by_type": _changed(before["resources_by_type"], after["resources_by_type"]),
        "cost": _changed(_cost_summary(before), _cost_summary(after)),
    }
    return {key: value for key, value in changes.items() if value}


def _cost_summary(review: dict[str, Any]) -> dict[str, Any]:
    cost = review["cost"]
    return {
        "always_on_hourly_usd": cost["always_on_hourly_usd"],
        "always_on_max_hourly_usd": cost["always_on_max_hourly_usd"],
        "per_training_run_hourly_usd_per_node": cost["per_training_run_hourly_usd_per_node"],
        **{f"{i['resource']} ({i['instance_type']} x {i['count']})": i["hourly_usd"] for i in cost["always_on"]},
    }


def _stack_findings(label: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    findings = []
    wildcards: dict[tuple[str, str, str], list[str]] = {}
    for principal, effect, action, resource, conditions in sorted(permission_grants(after) - permission_grants(before)):
        if effect == "Allow" and (is_wildcard(action) or is_wildcard(resource)):
            wildcards.setdefault((principal, resource, conditions), []).append(action)
    for (principal, resource, conditions), actions in wildcards.items():
        where = f" if {conditions}" if conditions else ""
        findings.append(
            f"{label}: wildcard permission added: {principal} may {', '.join(actions)} on {resource}{where}"
        )
    for rule in sorted(set(after["network"]["open_ingress"]) - set(before["network"]["open_ingress"])):
        findings.append(f"{label}: ingress from the internet added: {rule}")
    public_before = {p["resource"] for p in before["resource_policies"] if p["public"]}
    for resource in sorted({p["resource"] for p in after["resource_policies"] if p["public"]} - public_before):
        findings.append(f"{label}: resource policy of {resource} allows everyone")
    old_encryption = _by_resource(before["encryption"], ("encrypted_with", "rotation"))
    for store in after["encryption"]:
        was = old_encryption.get(store["resource"])
        if was and ENCRYPTION_RANK[store["encrypted_with"]] < ENCRYPTION_RANK[was["encrypted_with"]]:
            findings.append(
                f"{label}: encryption weakened on {store['resource']}: {was['encrypted_with']} -> "
                f"{store['encrypted_with']}"
            )
        elif was and was.get("rotation") and not store.get("rotation"):
            findings.append(f"{label}: key rotation turned off on {store['resource']}")
        elif was is None and ENCRYPTION_RANK[store["encrypted_with"]] < ENCRYPTION_RANK["kms"]:
            findings.append(
                f"{label}: new data store {store['resource']} without a KMS key ({store['encrypted_with']})"
            )
    old_retention = _by_resource(before["retention"], ("deletion_policy", "retention_days"))
    for resource in after["retention"]:
        was = old_retention.get(resource["resource"])
        if was and was["deletion_policy"] != "Delete" and resource["deletion_policy"] == "Delete":
            findings.append(
                f"{label}: {resource['resource']} is now deleted with the stack (was {was['deletion_policy']})"
            )
        no_retention = resource["type"] == "AWS::Logs::LogGroup" and resource["retention_days"] is None
        if no_retention and (was is None or was["retention_days"] is not None):
            findings.append(f"{label}: log group {resource['resource']} keeps logs forever (no retention)")
    for key, title in (
        ("always_on_hourly_usd", "always-on cost"),
        ("always_on_max_hourly_usd", "always-on cost at maximum autoscaling"),
        ("per_training_run_hourly_usd_per_node", "training-run cost per node"),
    ):
        old_cost, new_cost = before["cost"][key], after["cost"][key]
        if new_cost > old_cost:
            findings.append(f"{label}: {title} up ${new_cost - old_cost:.4f}/h (${old_cost:.4f} -> ${new_cost:.4f})")
    return findings
