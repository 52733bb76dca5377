"""The command line's words as ``main`` reads them, with the command itself stood in for (no
sandbox, no trial): what reaches ``validate`` when ``--lint`` comes before the path."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import osmosis_harbor.cli as cli


@pytest.fixture
def validate_args(monkeypatch: pytest.MonkeyPatch) -> list[argparse.Namespace]:
    """What ``validate`` would have been called with; the parser looks the command up when built."""
    seen: list[argparse.Namespace] = []

    def record(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(cli, "cmd_validate", record)
    return seen


@pytest.mark.parametrize(("flag", "mode"), [("--lint=strict", "strict"), ("--lint", "report")])
def test_the_lint_flag_before_the_path_does_not_swallow_it(
    flag: str, mode: str, validate_args: list[argparse.Namespace], tmp_path: Path
) -> None:
    """``--lint`` is a flag, so it cannot swallow the dataset path; ``--lint=strict`` is its strict form."""
    report = tmp_path / "r.json"
    assert cli.main(["validate", flag, "--json", str(report), "tests/fixtures/lint/clean"]) == 0
    (args,) = validate_args
    assert args.path == "tests/fixtures/lint/clean" and args.json == str(report)
    assert args.lint == mode
