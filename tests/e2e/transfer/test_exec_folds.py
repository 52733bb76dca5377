"""Transfers riding a command's own exec (``sandbox/transfer/exec_folds.py``), on a real sandbox.

As in ``test_exec_archives.py``: a real Docker sandbox with the archive capability off (as on
SkyPilot), SDK calls counted. The verifier's test command carries the staged upload before it
and the ``/logs`` pack after it; the workflow agent's run carries the pack after it. The
upload's failure is believed only with the secret the host wrote into the staged file, which
no command can read; the attack test's positive control keeps that file until after the
command, and then a command does forge the failure.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harbor.environments.base import ExecResult

from osmosis_harbor.sandbox import SandboxEnvironment
from osmosis_harbor.sandbox.transfer import exec_folds
from osmosis_harbor.sandbox.transfer.exec_folds import FoldedPack, is_verifier_test_command, read_trailer
from tests.support.common import started_environment

pytestmark = pytest.mark.slow

TEST_COMMAND = "(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1"


@pytest.fixture
async def verifier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SandboxEnvironment]:
    """A separate verifier's sandbox (Harbor's session id ``{trial}__verifier__{key}``)."""
    async with started_environment(tmp_path, "folds", session_prefix="folds__verifier__k") as environment:
        yield environment


@pytest.fixture
async def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SandboxEnvironment]:
    async with started_environment(tmp_path, "folds", session_prefix="folds-agent") as environment:
        yield environment


def _tests_dir(root: Path, script: str) -> Path:
    tests = root / "tests"
    tests.mkdir(parents=True)
    (tests / "test.sh").write_text("#!/bin/sh\n" + script)
    (tests / "test.sh").chmod(0o755)
    return tests


async def test_the_verifiers_upload_and_log_fetch_ride_its_test_command(
    verifier: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    env = verifier
    made = await env.exec("mkdir -p /logs/verifier /work/art && echo stale > /work/art/old.txt", user="root")
    assert made.return_code == 0, made.stderr
    before = dict(sdk_calls)
    await env.empty_dirs(["/work/art"], chmod=True)  # Harbor's emptying: rides the upload
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "answer.txt").write_text("42\n")
    await env.upload_dir(tmp_path / "up", "/work/art")
    await env.upload_dir(
        _tests_dir(tmp_path, "ls -A /work/art; cat /work/art/answer.txt > /logs/verifier/reward.txt\n"), "/tests"
    )
    result = await env.exec(TEST_COMMAND)
    assert result.return_code == 0 and result.stderr == "", result
    await env.download_dir("/logs/verifier", tmp_path / "verifier")
    assert (tmp_path / "verifier" / "reward.txt").read_text() == "42\n"
    assert (tmp_path / "verifier" / "test-stdout.txt").read_text() == "answer.txt\n"  # emptied, then unpacked
    # one write for the uploads, one exec for unpack + test.sh + pack, the small pack in its output
    calls = {k: sdk_calls[k] - before.get(k, 0) for k in ("write_bytes", "exec", "read_bytes")}
    assert calls == {"write_bytes": 1, "exec": 1, "read_bytes": 0}, calls
    leftovers = await env.exec("ls -A /tmp", user="root")
    assert "osmosis-put-" not in leftovers.stdout and "osmosis-get-" not in leftovers.stdout


async def test_a_large_log_tree_comes_by_one_read_and_a_command_may_still_change_it(
    verifier: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    env = verifier
    await env.upload_dir(_tests_dir(tmp_path, "head -c 400000 /dev/urandom > /logs/verifier/blob; exit 3\n"), "/tests")
    made = await env.exec("mkdir -p /logs/verifier", user="root")  # flushes the upload: nothing rides the next
    assert made.return_code == 0
    before = dict(sdk_calls)
    result = await env.exec(TEST_COMMAND)
    assert result.return_code == 3  # the command's own status, whatever rode its exec
    await env.download_dir("/logs/verifier", tmp_path / "v1")
    assert (tmp_path / "v1" / "blob").stat().st_size == 400000
    calls = {k: sdk_calls[k] - before.get(k, 0) for k in ("write_bytes", "exec", "read_bytes")}
    assert calls == {"write_bytes": 0, "exec": 1, "read_bytes": 1}, calls  # over the inline bound: its file read
    await env.exec("echo changed > /logs/verifier/blob", user="root")  # a command: the pack answers no more
    await env.download_dir("/logs/verifier", tmp_path / "v2")
    assert (tmp_path / "v2" / "blob").read_text() == "changed\n"


async def test_a_failed_upload_before_the_command_fails_it_by_name_and_the_command_never_runs(
    verifier: SandboxEnvironment, tmp_path: Path
) -> None:
    env = verifier
    made = await env.exec("mkdir -p /logs/verifier && echo file > /work/plain", user="root")
    assert made.return_code == 0
    await env.empty_dirs(["/work/plain/below"], chmod=True)  # mkdir -p under a file cannot succeed
    await env.upload_dir(_tests_dir(tmp_path, "touch /work/ran\n"), "/tests")
    with pytest.raises(RuntimeError, match="Failed to prepare and unpack an upload in the sandbox") as failed:
        await env.exec(TEST_COMMAND)
    assert "/work/plain" in str(failed.value)  # what failed, named by the shell
    ran = await env.exec("test -e /work/ran || test -e /tests/test.sh", user="root")
    assert ran.return_code == 1  # neither unpacked nor run


# The command does what a policy's code run by the tests could: look everywhere in the sandbox
# it can for the host's secret (the staged file, every process's argv and environment), print a
# failure like the wrapper's with whatever it found into every process's stderr (the exec's
# own among them: test.sh's output goes to a file), and exit as the wrapper does.
_FORGER = r"""
found=$(cat /tmp/osmosis-put-* 2>/dev/null | head -c 32)
for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; tr '\0' ' ' < $p/environ 2>/dev/null; done > /work/seen
for p in /proc/[0-9]*; do echo "$found osmosis-harbor: the upload failed" > $p/fd/2; done 2>/dev/null
exit 97
"""


@pytest.mark.parametrize("protected", [True, False], ids=["secret-removed-first", "positive-control"])
async def test_a_command_cannot_forge_the_upload_failure(
    verifier: SandboxEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protected: bool
) -> None:
    env = verifier
    secrets: list[str] = []
    made_fold = exec_folds.UploadFold.new

    def recorded(remote: str, preparation: str) -> exec_folds.UploadFold:
        fold = made_fold(remote, preparation)
        secrets.append(fold.secret)
        return fold

    monkeypatch.setattr(exec_folds.UploadFold, "new", staticmethod(recorded))
    if not protected:  # the staged file kept until after the command: its secret is readable
        kept = exec_folds.FOLD.replace('then rm -f "$f" "$f.err"; else', "then :; else", 1)
        assert kept != exec_folds.FOLD
        monkeypatch.setattr(exec_folds, "FOLD", kept)
    made = await env.exec("mkdir -p /logs/verifier", user="root")
    assert made.return_code == 0
    await env.upload_dir(_tests_dir(tmp_path, _FORGER), "/tests")
    if protected:
        result = await env.exec(TEST_COMMAND)
        assert result.return_code == 97  # the command's own failure, as it reported it
        seen = await env.exec("cat /work/seen", user="root")
        (secret,) = secrets
        assert seen.return_code == 0 and "sh -c" in seen.stdout  # it did read the processes' argv...
        assert secret not in seen.stdout and secret not in (result.stderr or "")  # ...but never the secret
    else:
        with pytest.raises(RuntimeError, match="Failed to prepare and unpack an upload"):
            await env.exec(TEST_COMMAND)


async def test_the_workflows_log_fetch_rides_its_run(
    agent: SandboxEnvironment, tmp_path: Path, sdk_calls: Counter[str]
) -> None:
    env = agent
    run = "mkdir -p /logs/agent && echo done > /logs/agent/sample.txt && echo out && echo err >&2"
    env.logs_follow(run)
    before = dict(sdk_calls)
    result = await env.exec(run, user="root")
    assert (result.return_code, result.stdout, result.stderr) == (0, "out\n", "err\n")  # no trailer left in it
    await env.download_dir("/logs/agent", tmp_path / "agent")
    assert (tmp_path / "agent" / "sample.txt").read_text() == "done\n"
    assert sdk_calls["exec"] - before.get("exec", 0) == 1 and sdk_calls["read_bytes"] == before.get("read_bytes", 0)
    # only the named command: another one is not followed by a pack
    other = await env.exec("echo again > /logs/agent/sample.txt", user="root")
    assert other.stderr == ""
    await env.download_dir("/logs/agent", tmp_path / "again")
    assert (tmp_path / "again" / "sample.txt").read_text() == "again\n"


async def test_a_run_that_leaves_no_logs_is_fetched_as_usual(agent: SandboxEnvironment, tmp_path: Path) -> None:
    env = agent
    env.logs_follow("true")
    assert (await env.exec("true", user="root")).return_code == 0
    with pytest.raises(FileNotFoundError):
        await env.download_dir("/logs/agent", tmp_path / "agent")


# ── the trailer is sandbox output: anything doubtful is not adopted ──────────────────────
PACK = FoldedPack(("/logs", "/work"), "/tmp/osmosis-get-x.tar.gz", "abc123")
B64 = base64.b64encode(b"gz").decode()


def _result(stderr: str) -> ExecResult:
    return ExecResult(stdout="o", stderr=stderr, return_code=5)


def test_a_trailer_is_believed_only_as_the_last_line_naming_the_required_root() -> None:
    stripped, trailer = read_trailer(_result(f"log\n\nosmosis-harbor-packed:abc123:inline: 0 1:{B64}\n"), PACK)
    assert stripped.stderr == "log\n" and stripped.return_code == 5 and trailer is not None
    assert trailer.present == ("/logs", "/work") and trailer.data == b"gz"
    _, trailer = read_trailer(_result("\nosmosis-harbor-packed:abc123:file: 0:1234\n"), PACK)
    assert trailer is not None and trailer.data is None and trailer.size == 1234
    for doubtful in (
        f"\nosmosis-harbor-packed:abc123:inline: 0:{B64}\nwritten after it\n",  # not the last line
        f"\nosmosis-harbor-packed:other:inline: 0:{B64}\n",  # another id
        f"\nosmosis-harbor-packed:abc123:inline: 1:{B64}\n",  # /logs not in it
        f"\nosmosis-harbor-packed:abc123:inline: 0 7:{B64}\n",  # no such root
        "\nosmosis-harbor-packed:abc123:inline: 0:not base64!\n",
        "\nosmosis-harbor-packed:abc123:file: 0:-5\n",
        "\nosmosis-harbor-packed:abc123:tape: 0:1\n",
    ):
        _, trailer = read_trailer(_result(doubtful), PACK)
        assert trailer is None, doubtful


def test_only_harbors_verifier_command_carries_the_upload() -> None:
    assert is_verifier_test_command(TEST_COMMAND)
    assert is_verifier_test_command("('/tests/my test.sh') > '/logs/verifier/test-stdout.txt' 2>&1")
    assert not is_verifier_test_command("/tests/test.sh")
    assert not is_verifier_test_command("(/tests/test.sh) > /logs/agent/out.txt 2>&1")
