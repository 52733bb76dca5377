"""What ``rollout`` prints for a result (no server, no sandbox): ``--json`` the whole result as
the osmosis API carries it, the default a panel with the verdict, the metrics and each message.
The real rollout behind it is the README's block (``e2e/cli/test_readme.py``)."""

from __future__ import annotations

import json

import pytest
from osmosis_ai.rollout.types import RolloutResultResponse, RolloutStatus
from osmosis_ai.rollout.types.sample import RolloutSample

from osmosis_harbor import settings
from osmosis_harbor.cli.rollout import _print_result

MESSAGES = [
    {"role": "system", "content": "You work in a Linux sandbox."},
    {"role": "user", "content": "What is (17 + 4) * 2?"},
    {"role": "assistant", "content": "(17 + 4) * 2"},
    {"role": "user", "content": "$ python -c 'print((17 + 4) * 2)'\n42\n[exit code 0]"},
]
RESULT = RolloutResultResponse(
    rollout_id="r-1",
    status=RolloutStatus.SUCCESS,
    sample=RolloutSample(messages=MESSAGES, reward=1.0, metrics={"llm_calls": 1.0}),
)


def test_json_prints_the_whole_result(capsys: pytest.CaptureFixture[str]) -> None:
    _print_result(RESULT, as_json=True, config=settings.current())
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "success" and printed["sample"]["reward"] == 1.0
    assert printed["sample"]["messages"] == MESSAGES and printed["sample"]["metrics"]["llm_calls"] == 1.0


def test_the_default_is_a_panel_with_the_verdict_and_each_message(capsys: pytest.CaptureFixture[str]) -> None:
    _print_result(RESULT, as_json=False, config=settings.current())
    out = capsys.readouterr().out
    assert "status: success" in out and "reward: 1.0" in out and "'llm_calls': 1.0" in out
    assert "[assistant] (17 + 4) * 2" in out and "[exit code 0]" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
