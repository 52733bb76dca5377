"""On Harbor's own transfer path (an SDK without archives, as SkyPilot's), a transfer's commands
touch only its target and its temp archive: a dir known ready elsewhere stays known ready, so
Harbor's preparation there is still answered without a round trip; what a transfer or a command
may have changed is prepared for real.

A real Docker sandbox with archives over commands off (``OSMOSIS_HARBOR_EXEC_ARCHIVES=0``), so every transfer runs Harbor's write +
unpack / pack + read commands; SDK calls are counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from osmosis_harbor.sandbox import SandboxEnvironment
from tests.support.common import started_environment

pytestmark = pytest.mark.slow

READY = "/work/ready"


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SandboxEnvironment]:
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    async with started_environment(tmp_path, "elide") as environment:
        yield environment


def _payload(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "data.txt").write_text("payload\n")
    return root


async def _entries(env: SandboxEnvironment, path: str) -> str:
    result = await env.exec(f"ls -A {path}", user="root")
    assert result.return_code == 0, result.stderr
    return (result.stdout or "").strip()


async def test_transfers_elsewhere_keep_a_ready_dir_ready(
    env: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    await env.empty_dirs([READY], chmod=True)  # a real command: now known ready
    await env.upload_dir(_payload(tmp_path / "up"), "/work/payload")
    await env.download_dir("/work/payload", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "data.txt").read_text() == "payload\n"
    assert sdk_calls["write_bytes"] == 1 and sdk_calls["read_bytes"] == 1  # Harbor's path really ran
    execs = sdk_calls["exec"]
    await env.empty_dirs([READY], chmod=True)
    assert sdk_calls["exec"] == execs  # answered here: nothing that ran could have touched it
    assert await _entries(env, READY) == ""

    await env.exec("true", user="root")  # positive control: a command may change anything
    execs = sdk_calls["exec"]
    await env.empty_dirs([READY], chmod=True)
    assert sdk_calls["exec"] == execs + 1


async def test_an_upload_into_a_ready_dir_is_emptied_for_real(
    env: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    await env.empty_dirs([READY], chmod=True)
    await env.upload_dir(_payload(tmp_path / "up"), f"{READY}/inside")
    assert await _entries(env, READY) == "inside"
    execs = sdk_calls["exec"]
    await env.empty_dirs([READY], chmod=True)
    assert sdk_calls["exec"] == execs + 1  # the upload made it unknown: the command ran
    assert await _entries(env, READY) == ""
