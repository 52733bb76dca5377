"""``validate``'s bad input, through ``main`` in this process: each is one ``error:`` line on
stderr and exit 2, found before any sandbox SDK is asked for anything. The same as a whole
process (nothing else on its stderr) is ``e2e/cli/test_validate.py::test_bad_input_is_a_one_line_error``."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import osmosis_harbor.cli as cli
from tests.support.common import REPO

VARIABLE = "LITELLM_LOCAL_MODEL_COST_MAP"  # main() sets it for the process: restored after each test


@pytest.fixture(autouse=True)
def in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Paths as a user in the checkout types them; what main() sets for its process put back."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv(VARIABLE, raising=False)
    harbor_logger = logging.getLogger("harbor.utils.logger")
    level = harbor_logger.level
    yield
    harbor_logger.setLevel(level)


def one_error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("does/not/exist", "no such file or directory"),
        ("tests/fixtures/invalid/no-instruction", "instruction.md is missing"),
        ("tests/fixtures/invalid/symlink-escape", "points outside the task"),
        ("tests/fixtures/invalid/symlink-escape-env", "points outside the task"),
        ("tests/fixtures/broken/bad-toml", "malformed TOML"),
        ("osmosis_harbor", "not a Harbor task or dataset"),
    ],
)
def test_bad_input_is_a_one_line_error(path: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert expected in one_error_line(capsys, "validate", path)


def test_an_unknown_task_id_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unknown task id(s): no-such-task" in one_error_line(capsys, "validate", "tasks", "--task", "no-such-task")


def test_skypilot_without_its_sdk_says_what_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "tasks", "--env", "skypilot"]) == 2
    err = capsys.readouterr().err
    assert "SkyPilot Platform installer" in err and "sky api login" in err
