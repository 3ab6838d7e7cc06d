"""proving_ground/rehearsal/aws_calls.parse_json_data_once: botocore's data folders walked and files parsed once per
process, with the answers botocore gives without it. In a process of its own: the suite's processes run with it
applied (tests/conftest.py), and a loader's answers without it are the reference here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os
import botocore.loaders, botocore.session
from proving_ground.rehearsal.aws_calls import parse_json_data_once

def answers():
    session = botocore.session.Session()
    loader = session.get_component("data_loader")
    return {
        "services": session.get_available_services(),  # botocore passes type_name by keyword
        "positional": loader.list_available_services("paginators-1"),
        "versions": loader.list_api_versions("ec2", "service-2"),
        "latest": loader.determine_latest_version("sagemaker", "service-2"),
        "operations": sorted(session.get_service_model("s3").operation_names),
    }

walks, parses = [], []
listdir, load_file = os.listdir, botocore.loaders.JSONFileLoader.load_file
os.listdir = lambda path: walks.append(path) or listdir(path)
botocore.loaders.JSONFileLoader.load_file = lambda self, path: parses.append(path) or load_file(self, path)
plain = answers()
undo = parse_json_data_once()
first = answers()
walks.clear(); parses.clear()
second = answers()
second["positional"].append("changed by a caller")  # a caller's copy: the next answer is unchanged
third = answers()
undo()
print(json.dumps({"plain": plain, "first": first, "third": third, "walks": len(walks), "parses": len(parses),
                  "undone": botocore.loaders.JSONFileLoader.load_file.__name__ == "<lambda>"
                            and botocore.loaders.Loader.list_available_services.__name__ == "_wrapper"}))
"""


def test_a_new_sessions_loader_answers_as_botocores_without_walking_or_parsing_again() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert found["first"] == found["third"] == found["plain"]
    assert "ec2" in found["plain"]["services"] and found["plain"]["operations"]
    assert found["walks"] == 0 and found["parses"] == 0  # the second session's loader read no folder and no file
    assert found["undone"]
