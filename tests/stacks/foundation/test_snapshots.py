"""Snapshots of the dev environment's templates, asset hashes masked: a reviewer sees each template change in the diff.

One environment only: staging and prod are built by the same code from other settings, which the template tests
check per environment (a snapshot of each would triple the diff a reviewer reads without showing anything new).

Update after an intended change with ``pytest tests/stacks/foundation/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

import json
import re

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

_ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


def _masked(template: dict) -> dict:
    return json.loads(_ASSET_HASH.sub("<asset-hash>", json.dumps(template)))


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


# Parametrized on the one environment so the snapshot files keep their names (...[dev][dev-<stack>].json).
@pytest.mark.parametrize("env", ["dev"])
def test_templates_match_snapshots(templates, env: str, snapshot_json) -> None:
    for stack_id, template in sorted(templates[env].items()):
        assert _masked(template) == snapshot_json(name=f"{env}-{stack_id}")
