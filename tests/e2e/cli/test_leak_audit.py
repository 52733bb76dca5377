"""The leak audit: answers lying in the agent's sandbox, read from each task's real image.

The dataset (``tests/fixtures/leaks``) holds one leak per task (the fix on another branch, only
in the reflog, only in an annotated tag, on a branch whose ref is only in ``packed-refs``; an
image holding the tests' expected output, a copy of the whole ``tests/`` directory and a file
containing a line of the solution), a clean repository with ordinary history up to HEAD (the
control, never flagged) and a large clean repository that the audit's bounds cut short, which
it says. The leaks are real: an agent's own commands in the same image read each
fix (the positive control), and the commands the findings name are those commands.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from osmosis_harbor import settings
from osmosis_harbor.audit import AuditSubject
from osmosis_harbor.audit.run import sandbox_environment
from osmosis_harbor.sandbox import environment_config
from osmosis_harbor.sandbox.owner.context import SandboxOwner, owner_scope
from tests.support.common import FIXTURES, CliRun, load_json, run_cli
from tests.support.sdk_paths import DOCKER, DOCKER_PATH_ONLY, SdkPath

pytestmark = pytest.mark.slow

# What differs by SDK in the audit (a sandbox of the task's image started, the probe through the
# SDK's exec, each .git brought back through its file calls) runs on both paths in the
# prebuilt-image test. What the audit makes of what it read (every kind of finding, the bound, the
# control) and how ``--lint=strict`` and prewarm use its findings do not depend on the SDK: those
# run on the Docker path only (prewarm's audit in the training-server test, through the backend
# the ``prewarm`` command drives).

LEAKS = FIXTURES / "leaks"
# the large repository holds about 3,300 entries in its .git: a bound under that is hit
BOUNDED = {"OSMOSIS_HARBOR_AUDIT_MAX_GIT_FILES": "1000"}


def _findings(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for environment in report["environments"]:
        assert environment["error"] is None, environment
        for task_id in environment["task_ids"]:
            by_task.setdefault(task_id, [])
        for finding in environment["findings"]:
            by_task[finding["task_id"]].append(finding)
    return by_task


async def _build_the_shared_layers(work: Path) -> None:
    """Build the control's image alone, through the product's own build: six of the seven images
    start with the same ``apt-get install git`` layer (and the same ordinary history), which the
    engine's builder would otherwise build once per image that ``validate`` starts at the same time
    (four times on a fresh engine, measured), and only one of them is needed. A no-op once built."""
    owner = SandboxOwner.make("leak-audit-layers", config=settings.current())
    try:
        with owner_scope(owner):
            image, _ = await sandbox_environment(LEAKS / "clean", environment_config("docker"), work).prepare_image()
            assert image
    finally:
        await owner.close()


@pytest.fixture(scope="module")
async def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[CliRun, dict[str, Any]]:
    """``validate --audit`` of the whole dataset on docker, once: the run and its JSON report,
    read by the report's test and by the positive control (the commands its findings name). The
    layers the images share are built first (``_build_the_shared_layers``), so that the run's
    concurrent builds (its ``-n``) reuse them instead of each building its own copy."""
    out = tmp_path_factory.mktemp("audit") / "audit.json"
    await _build_the_shared_layers(out.parent)
    env = {**DOCKER.cli_env(), **BOUNDED}
    proc = run_cli("validate", str(LEAKS), "--audit", "--env", DOCKER.name, "--json", str(out), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # audit errors fail the run
    return proc, load_json(out)


def test_audit_reports_every_leak_and_not_the_control(audited: tuple[CliRun, dict[str, Any]]) -> None:
    proc, report = audited
    assert not DOCKER.sandboxes_left()
    found = _findings(report)
    assert set(found) == {p.name for p in LEAKS.iterdir() if p.is_dir()}

    def history(task_id: str) -> dict[str, Any]:
        (only,) = found[task_id]
        assert (only["kind"], only["severity"], only["repository"]) == ("git-history", "error", "/app/.git"), only
        assert "1 commit(s) after HEAD" in only["evidence"] and "'the fix'" in only["evidence"], only
        assert "2024-06-01" in only["evidence"] and "shallow clone" in only["advice"]
        return only

    assert history("branch-leak")["ref"] == "refs/heads/fix"
    assert history("branch-leak")["read_with"].startswith("git log --all")
    assert history("tag-leak")["ref"] == "refs/tags/v2"
    assert history("packed-leak")["ref"] == "refs/heads/fix (packed-refs)"
    reflog = history("reflog-leak")
    assert reflog["ref"] == "reflog logs/HEAD" and reflog["read_with"].startswith("git reflog")

    copies = {f["path"]: f for f in found["expected-copy"]}
    assert {p: (f["kind"], f["severity"]) for p, f in copies.items()} == {
        "/app/data/expected.txt": ("tests-copy", "error"),  # the expected output
        "/opt/copy/expected.txt": ("tests-copy", "error"),
        "/opt/copy/test.sh": ("tests-copy", "warning"),  # the test code: a warning
        "/opt/copy": ("tests-copy", "error"),  # the directory, holding an expected output
        "/app/notes.md": ("contains", "warning"),  # a line of the solution inside another file
    }
    expected = copies["/app/data/expected.txt"]
    assert "tests/expected.txt" in expected["evidence"] and "expected output" in expected["evidence"]
    assert "copy of the task's tests/ directory" in copies["/opt/copy"]["evidence"]
    assert "solution/solve.sh" in copies["/app/notes.md"]["evidence"]

    assert found["clean"] == []  # the control: ordinary history up to HEAD is no leak
    (bound,) = found["large-repo"]
    assert (bound["kind"], bound["severity"]) == ("audit-incomplete", "warning"), bound
    assert "audit_max_git_files (1000)" in bound["evidence"] and bound["path"] == "/app/.git"
    assert "7 error(s), 3 warning(s)" in proc.stdout


@DOCKER_PATH_ONLY
def test_strict_lint_refuses_a_leaking_task_and_runs_the_clean_one(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    out = tmp_path / "report.json"
    proc = run_cli(
        "validate",
        str(LEAKS),
        "--lint=strict",
        "--task",
        "clean",
        "--task",
        "branch-leak",
        "--env",
        sandbox_sdk.name,
        "--json",
        str(out),
        "--junit",
        str(tmp_path / "junit.xml"),
        env=sandbox_sdk.cli_env(),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not sandbox_sdk.sandboxes_left()
    assert "audit error [git-history] /app/.git: 1 commit(s) after HEAD" in (tmp_path / "junit.xml").read_text()
    report = load_json(out)
    rows = {row["id"]: row for row in report["tasks"]}
    assert rows["clean"]["passed"] and rows["clean"]["reward"] == 1.0 and rows["clean"]["audit"] == []
    leak = rows["branch-leak"]
    assert (leak["passed"], leak["failed_phase"]) == (False, "task")
    assert "leak audit error git-history at /app/.git (refs/heads/fix)" in leak["error"], leak["error"]
    assert [f["kind"] for f in leak["audit"]] == ["git-history"]
    assert "Leak audit" in proc.stdout


async def test_a_prebuilt_docker_image_task_is_audited_from_its_image(tmp_path: Path, sandbox_sdk: SdkPath) -> None:
    """A task that names its image (``docker_image``, no Dockerfile) is audited from that image."""
    import shutil

    from osmosis_harbor.audit import audit_tasks

    owner = SandboxOwner.make("leak-audit-image-test", config=settings.current())
    try:
        with owner_scope(owner):
            # an image built elsewhere: here, the one the branch-leak task's Dockerfile makes
            builder = sandbox_environment(LEAKS / "branch-leak", sandbox_sdk.environment(), tmp_path)
            image, _ = await builder.prepare_image()
            assert image
            task = shutil.copytree(LEAKS / "branch-leak", tmp_path / "image-only")
            (task / "environment" / "Dockerfile").unlink()
            toml = (task / "task.toml").read_text()
            (task / "task.toml").write_text(
                toml.replace("[environment]\n", f'[environment]\ndocker_image = "{image}"\n')
            )
            assert f'docker_image = "{image}"' in (task / "task.toml").read_text()
            report = await audit_tasks(
                [AuditSubject(task_id="image-only", path=task)],
                environment=sandbox_sdk.environment(),
                config=settings.current(),
            )
    finally:
        await owner.close()
    (audit,) = report.environments
    assert audit.error is None, audit
    assert [(f.task_id, f.kind, f.ref) for f in audit.findings] == [("image-only", "git-history", "refs/heads/fix")]
    assert not sandbox_sdk.sandboxes_left()


async def test_the_leaks_are_readable_by_an_agent_with_the_commands_the_findings_name(
    tmp_path: Path, audited: tuple[CliRun, dict[str, Any]]
) -> None:
    """Positive control: in a sandbox of each image, the agent's commands the audit names show
    the fix; in the control's, ``git log --all`` shows only the ordinary history. The findings
    are ``validate --audit``'s, of the same images."""
    found = _findings(audited[1])
    tasks = {
        "branch-leak": "git log --all --format=%s",
        "tag-leak": "git log --all --format=%s",
        "packed-leak": "git log --all --format=%s",
        "reflog-leak": "git reflog --format=%s",
        "clean": "git log --all --format=%s",
    }

    async def read(task_id: str, command: str) -> Any:
        env = sandbox_environment(LEAKS / task_id, environment_config("docker"), tmp_path)
        await env.start(force_build=False)
        try:
            return await env.exec(command)
        finally:
            await env.stop(delete=True)

    owner = SandboxOwner.make("leak-audit-test", config=settings.current())
    try:
        with owner_scope(owner):  # the sandboxes side by side: each reads its own image
            seen = await asyncio.gather(*(read(task_id, command) for task_id, command in tasks.items()))
    finally:
        await owner.close()
    for (task_id, command), shown in zip(tasks.items(), seen, strict=True):
        subjects = (shown.stdout or "").split()
        if task_id == "clean":
            assert "fix" not in subjects and found["clean"] == [], (shown.stdout, found["clean"])
        else:
            assert "fix" in subjects, (task_id, shown.stdout)
            assert [f["read_with"].split()[:2] for f in found[task_id]] == [command.split()[:2]], found[task_id]


def test_probe_output_is_parsed_as_hostile() -> None:
    """Lines without a marker, relative paths and malformed hashes are ignored; a hit's path
    may hold ':' (the line is matched as a known suffix); bounds are reported."""
    from osmosis_harbor.audit.probe import Probe, parse_probe

    probe = Probe(
        sizes=[45],
        lines=["the fix prints: forty-two"],
        max_repos=1,
        max_hashed=1,
        max_hits=5,
        max_grep_files=10,
        max_grep_file_kib=10,
        timeout_sec=5,
        max_output_bytes=10_000,
    )
    output = "\n".join(
        [
            "@pwd /app",
            "@pwd /elsewhere",
            "@missing sha256sum",
            "@missing rm -rf /",
            "@repo 12 40 /app/.git",
            "@repo 1 1 /b/.git",
            "@repo x 1 /c/.git",
            "@hash " + "a" * 64 + "  /app/x",
            "@hash " + "b" * 64 + "  /app/y",
            "@hash zz  /app/z",
            "@hit /odd:name.txt:the fix prints: forty-two",
            "@hit relative:the fix prints: forty-two",
            "\x1b[2J@hash " + "c" * 64 + "  /app/w",
        ]
    )
    seen = parse_probe(output, probe)
    assert seen.workdir == "/app" and seen.missing == ["sha256sum"]
    assert seen.repos == [(12, 40, "/app/.git")] and seen.hashes == [("a" * 64, "/app/x")]
    assert seen.hits == [("/odd:name.txt", "the fix prints: forty-two")]
    assert len(seen.truncated) == 2 and "audit_max_repos" in seen.truncated[0]
    json.dumps(seen.model_dump())


@pytest.mark.filterwarnings("ignore::osmosis_harbor.agents.native.NotTrainableWarning")
async def test_a_training_server_refuses_a_leaking_task_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, osmosis_home: Path, fake_chat: Any
) -> None:
    """Prewarm audits the fresh sandbox of each environment's setup proof once: its report holds
    the findings (the leaking task's, none for the control) and the prewarm itself succeeds. A
    dataset task with an audit error is refused at admission (validation_error naming the finding
    and the setting), ``/health`` lists the findings, and the setting admits it (positive control:
    the leaking task then runs). What the ``prewarm`` command prints for such a report:
    tests/unit/cli/test_prewarm_output.py."""
    from harbor.trial.queue import TrialQueue
    from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

    from osmosis_harbor.backend import HarborBackend
    from tests.support.rollout_server import client_for, http_to, serve

    def make_backend(trials: str) -> HarborBackend:
        return HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=LEAKS,
            task_mode="dataset",
            agent="oracle",
            environment_config=environment_config("docker"),
            trials_dir=tmp_path / trials,
        )

    backend = make_backend("trials")
    report = await backend.prewarm(["clean", "branch-leak"])
    assert report.failed == 0 and all(g.setup_ok for g in report.groups_detail)  # findings fail no prewarm
    audits = {tuple(g.task_ids): g.audit for g in report.groups_detail}
    clean, leaking = audits[("clean",)], audits[("branch-leak",)]
    assert clean is not None and clean.findings == []
    assert leaking is not None and (leaking.repositories, leaking.workdir) == (["/app/.git"], "/app")
    (leak,) = leaking.findings
    assert (leak.kind, leak.ref, leak.severity) == ("git-history", "refs/heads/fix", "error")

    async def rollout(client: Any, task: str, rollout_id: str) -> Any:
        return await client.run_rollout(
            initial_messages=[{"role": "user", "content": "go"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=rollout_id,
            llm_api_key="sk-leak-audit-test",
            metadata={"harbor_task_id": task},
        )

    async with serve(backend) as url, client_for(url) as client, http_to(url) as http:
        refused = await rollout(client, "branch-leak", "leak-1")
        assert refused.status is RolloutStatus.FAILURE
        assert refused.err_category is RolloutErrorCategory.VALIDATION_ERROR, refused.err_message
        assert "git-history at /app/.git (refs/heads/fix)" in refused.err_message
        assert "OSMOSIS_HARBOR_ALLOW_LEAKING_TASKS=1" in refused.err_message
        assert not (tmp_path / "trials").exists() or not list((tmp_path / "trials").iterdir())  # no trial ran
        health = (await http.get("/health")).json()
        assert list(health["leak_audit"]) == ["branch-leak"]
        assert health["leak_audit"]["branch-leak"][0]["kind"] == "git-history"
    # A backend reads its settings once, when it is made: the setting admits the task there.
    monkeypatch.setenv("OSMOSIS_HARBOR_ALLOW_LEAKING_TASKS", "1")
    async with serve(make_backend("allowed")) as url, client_for(url) as client:
        admitted = await rollout(client, "branch-leak", "leak-2")
        assert admitted.status is RolloutStatus.SUCCESS, admitted.err_message


@pytest.mark.filterwarnings("ignore::osmosis_harbor.agents.native.NotTrainableWarning")
async def test_without_prewarm_the_first_rollout_audits_its_environment_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, osmosis_home: Path, fake_chat: Any
) -> None:
    """No prewarm: the first rollout of a task audits every dataset task of its environment in
    one sandbox; later rollouts of any of them reuse the result; a clean task runs."""
    import shutil

    from harbor.trial.queue import TrialQueue
    from osmosis_ai.rollout.types import RolloutErrorCategory, RolloutStatus

    from osmosis_harbor.backend import HarborBackend, leak_audits
    from tests.support.rollout_server import client_for, serve

    dataset = tmp_path / "dataset"
    for name, source in (("leak-a", "branch-leak"), ("leak-b", "branch-leak"), ("clean", "clean")):
        shutil.copytree(LEAKS / source, dataset / name)
    audited: list[list[str]] = []
    real = leak_audits.audit_sandbox

    async def counted(env: Any, subjects: Any, **kwargs: Any) -> Any:
        audited.append(sorted(s.task_id for s in subjects))
        return await real(env, subjects, **kwargs)

    monkeypatch.setattr(leak_audits, "audit_sandbox", counted)
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1),
        tasks_dir=dataset,
        task_mode="dataset",
        agent="oracle",
        environment_config=environment_config("docker"),
        trials_dir=tmp_path / "trials",
    )

    async def rollout(client: Any, task: str, rollout_id: str) -> Any:
        return await client.run_rollout(
            initial_messages=[{"role": "user", "content": "go"}],
            chat_completions_url=fake_chat.base_url,
            rollout_id=rollout_id,
            llm_api_key="sk-leak-audit-test",
            metadata={"harbor_task_id": task},
        )

    async with serve(backend) as url, client_for(url) as client:
        first, second = await asyncio.gather(rollout(client, "leak-a", "a-1"), rollout(client, "leak-a", "a-2"))
        third = await rollout(client, "leak-b", "b-1")
        for result in (first, second, third):
            assert result.status is RolloutStatus.FAILURE
            assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR, result.err_message
            assert "git-history at /app/.git (refs/heads/fix)" in result.err_message
        assert audited == [["leak-a", "leak-b"]]  # one audit for the environment, not per rollout
        clean = await rollout(client, "clean", "c-1")
        assert clean.status is RolloutStatus.SUCCESS, clean.err_message
        assert audited == [["leak-a", "leak-b"], ["clean"]]
