"""The result tables' width off a terminal (a CI log, a pipe), no process started: ``$COLUMNS``
when set, else 120, not Rich's 80. On a terminal the table takes the terminal's own width: a
real pseudo-terminal in ``e2e/cli/test_reports.py::test_the_table_takes_the_terminals_width``."""

from __future__ import annotations

import pytest

from osmosis_harbor import settings
from osmosis_harbor.cli.common import DEFAULT_COLUMNS, result_console


def test_off_a_terminal_columns_when_set_else_120(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = result_console(settings.current())
    assert not console.is_terminal and console.width == DEFAULT_COLUMNS == 120
    monkeypatch.setenv("COLUMNS", "100")
    assert result_console(settings.current()).width == 100
