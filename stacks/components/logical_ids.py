"""Keep a deployed resource's logical id when its construct moves in the construct tree.

CloudFormation knows a resource only by its logical id, which CDK derives from the construct path under the stack
(``Stack.allocateLogicalId``: the path's ids joined, plus a hash of the path; ids named ``Default`` are left out of
both). A construct that moves under a new parent gets a new path, so a new logical id: CloudFormation would create a
new resource and delete the old one (a retained key or bucket would be orphaned beside an empty twin). Two ways keep
the id, and the stacks use both:

- give the construct's main child the id ``Default`` (CDK's own convention for a construct's default child), so the
  parent's id takes its place in the path;
- ``keep_logical_ids(construct, old_id)`` for the others: every CloudFormation element under ``construct`` gets the
  logical id it would have if ``construct`` were still the stack's child ``old_id``.

tests/stacks/foundation/test_logical_ids.py fails when a deployed resource's logical id changes anyway.
"""

from __future__ import annotations

from typing import cast

import aws_cdk as cdk
from constructs import Construct, IConstruct, RootConstruct


def stack_level_logical_id(*path: str) -> str:
    """The logical id CDK gives an element at ``path`` (construct ids below the stack).

    Computed by CDK itself: ``Names.uniqueId`` applies the same function as ``Stack.allocateLogicalId``
    (core/lib/private/uniqueid.ts, makeUniqueId) to a construct's ids below the root, so a scratch tree with
    ``path`` under its root gives the id, without copying CDK's hashing here.
    """
    node: Construct = RootConstruct()
    for construct_id in path:
        node = Construct(node, construct_id)
    return cdk.Names.unique_id(node)


def keep_logical_ids(construct: IConstruct, old_id: str) -> None:
    """Every CloudFormation element under ``construct`` keeps the logical id it had when ``construct`` was the
    stack's direct child ``old_id``. Call it once the construct's resources exist; elements added later get ids from
    their new path (new resources, so no id to keep)."""
    depth = len(construct.node.scopes)
    for child in construct.node.find_all():
        if cdk.CfnElement.is_cfn_element(child):
            below = [scope.node.id for scope in child.node.scopes[depth:]]
            cast(cdk.CfnElement, child).override_logical_id(stack_level_logical_id(old_id, *below))
