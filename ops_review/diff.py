"""The difference of two reviews: what a change does to permissions, exposure, encryption, retention and cost."""

from __future__ import annotations

from typing import Any

from ops_review.review import ENCRYPTION_RANK, NOT_PREFIX, is_public_principal, is_wildcard

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
            if after is not None:  # an added stack: all its findings are new
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
        "network": {
            "security_groups": {},
            "open_ingress": [],
            "open_egress": [],
            "public_subnets": [],
            "vpc_endpoints": [],
        },
        "encryption": [],
        "guardrails": {"public_access_block": {}, "tls_only": {}, "instance_metadata": {}},
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


def trust_grants(review: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """One (role, effect, principal, conditions) per principal of every trust-policy statement."""
    return {
        (role, t["effect"], principal, t["conditions"] or "")
        for role, entry in review["iam"].items()
        for t in entry.get("trust", [])
        for principal in t["principals"]
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
    trust_before, trust_after = trust_grants(before), trust_grants(after)
    changes = {
        "permissions_added": sorted(grants_after - grants_before),
        "permissions_removed": sorted(grants_before - grants_after),
        "trust_added": sorted(trust_after - trust_before),
        "trust_removed": sorted(trust_before - trust_after),
        "exposure_added": sorted(exposure_after - exposure_before),
        "exposure_removed": sorted(exposure_before - exposure_after),
        "encryption": _changed(
            _by_resource(before["encryption"], ("encrypted_with", "key", "rotation")),
            _by_resource(after["encryption"], ("encrypted_with", "key", "rotation")),
        ),
        **{
            guardrail: _changed(before["guardrails"][guardrail], after["guardrails"][guardrail])
            for guardrail in ("public_access_block", "tls_only", "instance_metadata")
        },
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


# Long: one finding rule after another (new wildcard grants, internet ingress and egress, endpoint policies dropped,
# public resource policies, encryption, deletion and retention weakened, cost up), each a few lines, in the order the
# diff reports them
def _stack_findings(label: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    findings = []
    wildcards: dict[tuple[str, str, str], list[str]] = {}
    # A VPC endpoint policy narrows what passes the endpoint (none allows everything): its "*"s are no new grant.
    endpoint_policies = {
        f"{p['resource']} <- {', '.join(p['principals'])}"
        for p in after["resource_policies"]
        if p.get("policy_type") == "AWS::EC2::VPCEndpoint"
    }
    for principal, effect, action, resource, conditions in sorted(permission_grants(after) - permission_grants(before)):
        if principal in endpoint_policies:
            continue
        if effect == "Allow" and (is_wildcard(action) or is_wildcard(resource)):
            wildcards.setdefault((principal, resource, conditions), []).append(action)
    for (principal, resource, conditions), actions in wildcards.items():
        where = f" if {conditions}" if conditions else ""
        findings.append(
            f"{label}: wildcard permission added: {principal} may {', '.join(map(_grant_text, actions))} "
            f"on {_grant_text(resource)}{where}"
        )
    findings += _trust_findings(label, before, after)
    for rule in sorted(set(after["network"]["open_ingress"]) - set(before["network"]["open_ingress"])):
        findings.append(f"{label}: ingress from the internet added: {rule}")
    for rule in sorted(set(after["network"]["open_egress"]) - set(before["network"]["open_egress"])):
        findings.append(f"{label}: egress to the internet on all traffic added: {rule}")
    findings += _guardrail_findings(label, before["guardrails"], after["guardrails"])
    had_policy = {e["endpoint"] for e in before["network"]["vpc_endpoints"] if e.get("policy")}
    for endpoint in after["network"]["vpc_endpoints"]:
        if endpoint["endpoint"] in had_policy and not endpoint.get("policy"):
            findings.append(
                f"{label}: VPC endpoint {endpoint['endpoint']} lost its endpoint policy (it now passes any principal "
                "to any resource)"
            )
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


def _grant_text(value: str) -> str:
    """'NOT iam:*' (from NotAction/NotResource) reads as what it grants: everything except iam:*."""
    return f"everything except {value.removeprefix(NOT_PREFIX)}" if value.startswith(NOT_PREFIX) else value


def _trust_findings(label: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """New ways to assume a role: anyone ('*'), or an account, role or user (service principals are not flagged:
    a new role for a service is ordinary; its permissions are diffed separately)."""
    findings = []
    for role, effect, principal, conditions in sorted(trust_grants(after) - trust_grants(before)):
        if effect != "Allow" or principal.endswith(".amazonaws.com") or principal.endswith(".amazonaws.com.cn"):
            continue
        where = f" if {conditions}" if conditions else ""
        if is_public_principal(principal):
            findings.append(f"{label}: trust policy of {role} lets anyone (*) assume it{where}")
        else:
            findings.append(f"{label}: trust policy of {role} now trusts {principal}{where}")
    return findings


def _guardrail_findings(label: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """A guardrail that an existing resource had and lost, or that a new resource lacks."""
    findings = []
    for bucket, block in after["public_access_block"].items():
        was = before["public_access_block"].get(bucket)
        if not block["all_blocked"] and (was is None or was["all_blocked"]):
            off = ", ".join(k for k, on in block.items() if k != "all_blocked" and not on)
            state = "removed" if was is not None else "missing on new bucket"
            findings.append(f"{label}: S3 public-access block {state} on {bucket} (off: {off})")
    for resource, tls_only in after["tls_only"].items():
        was = before["tls_only"].get(resource)
        if not tls_only and was:
            findings.append(f"{label}: TLS-only statement removed from the policy of {resource}")
        elif not tls_only and was is None and resource in after["public_access_block"]:
            findings.append(f"{label}: new bucket {resource} accepts requests without TLS")
    for resource, options in after["instance_metadata"].items():
        was = before["instance_metadata"].get(resource)
        if not options["imdsv2_required"] and (was is None or was["imdsv2_required"]):
            findings.append(
                f"{label}: IMDSv2 not required on {resource} (HttpTokens {options['http_tokens']}): "
                "IMDSv1 requests can read the instance role's credentials"
            )
    return findings


# --- changes that replace a resource -------------------------------------------------------------------------------
# CloudFormation replaces a resource when a create-only property changes (the resource type schemas' createOnly-
# Properties: "Update requires: Replacement" in the user guide; cfn-lint ships the schemas), or its type changes.
# Two replacements fail the update instead: a resource whose name the template fixes ("CloudFormation cannot update
# a stack when a custom-named resource requires replacing"), and a change to an export another stack imports
# ("Cannot update export ... as it is in use by ...": Fn::ImportValue, CloudFormation user guide).


def _create_only(resource_type: str, region: str) -> list[list[str]]:
    """The create-only property paths of a type (["EndpointName"], ["VpcConfig", "SubnetIds"]) from cfn-lint's copy
    of the CloudFormation resource type schemas; none for a type it does not know (Custom::...)."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER  # type: ignore[import-untyped]

    try:
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type).schema
    except Exception:  # an unknown or custom type: CloudFormation passes its changes to the provider
        return []
    return [path.removeprefix("/properties/").split("/") for path in schema.get("createOnlyProperties", [])]


def _names_resource(resource_type: str, prop: str) -> bool:
    """Whether a property is the resource's own name (AWS::Logs::LogGroup LogGroupName, AWS::KMS::Alias AliasName,
    AWS::ApplicationAutoScaling::ScalingPolicy PolicyName, AWS::SSM::Parameter Name), not another resource's
    (AWS::EC2::VPCEndpoint ServiceName)."""
    kind = resource_type.rsplit("::", 1)[-1]
    return prop == "Name" or (prop.endswith("Name") and prop.removesuffix("Name") in kind)


def _at(properties: dict[str, Any], path: list[str]) -> Any:
    value: Any = properties
    for part in path:
        if part == "*" or not isinstance(value, dict):
            return value  # a list element path: compare the whole list
        value = value.get(part)
    return value


def _referenced(value: Any) -> set[str]:
    if isinstance(value, dict):
        found = {value["Ref"]} if isinstance(value.get("Ref"), str) else set()
        attribute = value.get("Fn::GetAtt")
        if isinstance(attribute, list) and attribute and isinstance(attribute[0], str):
            found.add(attribute[0])
        return found.union(*(_referenced(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_referenced(v) for v in value))
    return set()


def _imports(stacks: list[Any]) -> dict[str, list[str]]:
    """{export name: [stack names importing it]} of an assembly (literal Fn::ImportValue names only)."""
    found: dict[str, list[str]] = {}

    def walk(value: Any, stack: str) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("Fn::ImportValue"), str):
                found.setdefault(value["Fn::ImportValue"], []).append(stack)
            for item in value.values():
                walk(item, stack)
        elif isinstance(value, list):
            for item in value:
                walk(item, stack)

    for stack in stacks:
        walk(stack.template.get("Resources", {}), stack.stack_name)
        walk(stack.template.get("Outputs", {}), stack.stack_name)
    return found


def replacements(old_stacks: list[Any], new_stacks: list[Any]) -> dict[str, list[str]]:
    """{'replaced': one line per resource the change replaces, 'refused': one line per change CloudFormation would
    fail} between two assemblies' templates (ops_review.review.StackTemplate lists)."""
    replaced: list[str] = []
    refused: list[str] = []
    imported = _imports(old_stacks)
    old_by_key = {(s.environment, s.stack): s for s in old_stacks}
    for new in new_stacks:
        old = old_by_key.get((new.environment, new.stack))
        if old is None:
            continue
        label = f"{new.environment}/{new.stack}"
        before, after = old.template.get("Resources", {}), new.template.get("Resources", {})
        swapped: set[str] = set()
        for logical_id, resource in after.items():
            previous = before.get(logical_id)
            if previous is None:
                continue
            if previous["Type"] != resource["Type"]:
                swapped.add(logical_id)
                replaced.append(f"{label} {logical_id}: REPLACED ({previous['Type']} -> {resource['Type']})")
                continue
            was, now = previous.get("Properties", {}), resource.get("Properties", {})
            create_only = _create_only(resource["Type"], new.region or "us-west-2")
            changed = [path for path in create_only if _at(was, path) != _at(now, path)]
            if not changed:
                continue
            swapped.add(logical_id)
            names = ", ".join("/".join(p) for p in changed)
            replaced.append(f"{label} {logical_id} ({resource['Type']}): REPLACED, create-only {names} changed")
            fixed = [
                p[0] for p in create_only
                if len(p) == 1 and _names_resource(resource["Type"], p[0]) and isinstance(now.get(p[0]), str)
                and was.get(p[0]) == now[p[0]]
            ]  # fmt: skip
            if fixed:
                refused.append(f"REFUSED {label} {logical_id}: replacing it fails, its {fixed[0]} {now[fixed[0]]!r} "
                               "is fixed by the template (CloudFormation cannot replace a custom-named resource): "
                               "change the name in the same change, or do not replace it.")  # fmt: skip
        for name, output in old.template.get("Outputs", {}).items():
            export = output.get("Export", {}).get("Name")
            if not isinstance(export, str) or export not in imported:
                continue
            now_output = new.template.get("Outputs", {}).get(name)
            users = ", ".join(sorted(set(imported[export])))
            if now_output is None or now_output.get("Export", {}).get("Name") != export:
                refused.append(f"REFUSED {label}: export {export} is removed while {users} import it: CloudFormation "
                               "refuses the update; deploy the importers without it first.")  # fmt: skip
            elif now_output.get("Value") != output.get("Value") or _referenced(now_output.get("Value")) & swapped:
                refused.append(f"REFUSED {label}: export {export} changes value (its resource is replaced or its "
                               f"value changed) while {users} import it: CloudFormation refuses the update; move the "
                               "importers off it first.")  # fmt: skip
    return {"replaced": replaced, "refused": refused}
