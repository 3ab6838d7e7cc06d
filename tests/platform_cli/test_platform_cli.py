"""The one operator command: every subcommand reaches its module's ``main`` with the user's arguments."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import platform_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(platform_cli.SUBCOMMANDS))
def test_every_subcommand_answers_help(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process, where the modules are imported already (a process each cost ~0.5 CPU-s, and 5 for train and
    # remote-train, which import torch and transformers before they parse).
    monkeypatch.setattr(sys, "argv", ["pytorch-platform"])  # main() names the subcommand in argv[0]
    with pytest.raises(SystemExit) as exited:
        platform_cli.main([name, "--help"])
    assert exited.value.code in (0, None)
    assert capsys.readouterr().out.startswith("usage:")


def test_modes_of_one_tool_are_subcommands_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from inference_assets.tools import endpoint_client

    seen: list[list[str]] = []
    monkeypatch.setattr(endpoint_client, "main", lambda argv: seen.append(argv) or 0)
    assert platform_cli.main(["smoke-test", "--endpoint-name", "e"]) == 0
    assert seen == [["smoke-test", "--endpoint-name", "e"]]


def test_no_or_unknown_subcommand_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert platform_cli.main([]) == 2
    assert "check-model" in capsys.readouterr().out
    assert platform_cli.main(["deploy"]) == 2
    assert "unknown subcommand 'deploy'" in capsys.readouterr().err


def test_the_console_script_is_installed() -> None:
    """`make test` installs the project (editable): the command is on the virtualenv's PATH."""
    script = shutil.which("pytorch-platform", path=str(Path(sys.executable).parent))
    assert script, "pytorch-platform is not installed in this virtualenv (pip install --no-deps -e .)"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, cwd="/", check=False)
    assert result.returncode == 0, result.stderr
    assert "review" in result.stdout
