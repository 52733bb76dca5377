"""Task resolution and materialization, host-side only (no Docker, no network).

Fixture datasets are built in ``tmp_path``. Git refs are fetched by Harbor's real
``TaskClient`` from a bare repository created in the test (``file://`` URL). Package
refs are served from Harbor's on-disk package cache, laid out exactly as
``TaskClient`` writes it (``<cache>/packages/<org>/<name>/<content_hash>/``); the one
network step of a tag ref (the registry RPC and the archive download) is replaced by a
local stand-in so that the rest of Harbor's download path runs for real.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pickle
import socket
import stat
import subprocess
import tarfile
import warnings
from pathlib import Path

import pytest
from harbor.db.client import RegistryDB, TaskVersionNotFoundError
from harbor.publisher.packager import Packager
from harbor.publisher.publisher import Publisher
from harbor.storage.supabase import SupabaseStorage
from harbor.tasks.client import TaskClient, _ResolvedPackage

from osmosis_harbor.tasks import (
    BUNDLE_DIRNAME,
    CONTAINER_REQUIREMENTS,
    GRADING_INPUT_FILENAME,
    INCOMPATIBLE_IMAGE_MARKER,
    PATCH_BEGIN,
    REQUIREMENTS_FILENAME,
    EnvironmentPatch,
    MaterializedTask,
    ResolvedTask,
    TaskMode,
    TaskResolutionError,
    TaskResolver,
    UnpinnedTaskRefWarning,
    baked_bundle,
    materialize_task,
    patch_environment,
    render_prompt,
)

TASK_TOML = 'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n'


def make_task(
    path: Path,
    *,
    instruction: str = "Write hello to /workspace/out.txt.\n",
    tests: bool = True,
    dockerfile: str | None = "FROM debian:trixie-slim\nWORKDIR /workspace\n",
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "task.toml").write_text(TASK_TOML)
    (path / "instruction.md").write_text(instruction)
    if dockerfile is not None:
        (path / "environment").mkdir(exist_ok=True)
        (path / "environment" / "Dockerfile").write_text(dockerfile)
    if tests:
        (path / "tests").mkdir(exist_ok=True)
        script = path / "tests" / "test.sh"
        script.write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
        script.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def _local_network_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any connection from this process that is not to 127.0.0.1 / ::1 / a unix socket."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> object:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0] if isinstance(address, tuple) else address
            if host not in ("127.0.0.1", "::1", "localhost"):
                raise AssertionError(f"test tried to reach the network: {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    make_task(root / "alpha", instruction="alpha instruction\n")
    make_task(root / "grp" / "beta", instruction="beta instruction\n")
    make_task(root / "grp" / "sub" / "gamma", instruction="gamma instruction\n", tests=False)
    return root


@pytest.fixture
def template(tmp_path: Path) -> Path:
    return make_task(tmp_path / "template", instruction="placeholder\n")


# -- template mode ---------------------------------------------------------------------


async def test_template_mode_resolves_template_and_replaces_instruction(template: Path, tmp_path: Path) -> None:
    resolver = TaskResolver(template, "template")
    assert resolver.mode is TaskMode.TEMPLATE
    assert resolver.task_ids() == ["template"]
    task = await resolver.resolve(None)
    assert task == ResolvedTask(task_id="template", path=template.resolve(), source="template")
    # harbor_task_id means nothing in template mode
    assert (await resolver.resolve({"harbor_task_id": "whatever"})).path == template.resolve()

    prompt = [{"role": "user", "content": "Compute 2 + 2 and write it to /workspace/answer.txt"}]
    out = materialize_task(task, tmp_path / "run1" / "task", instruction=render_prompt(prompt))
    assert (out.path / "instruction.md").read_text() == prompt[0]["content"]
    assert out.instruction_replaced
    assert (template / "instruction.md").read_text() == "placeholder\n"  # the source is untouched
    assert (out.path / "environment" / "Dockerfile").read_text() == (
        template / "environment" / "Dockerfile"
    ).read_text()


def test_template_mode_validates_eagerly(tmp_path: Path, dataset: Path) -> None:
    with pytest.raises(TaskResolutionError, match="template mode needs one task"):
        TaskResolver(dataset, "template")
    with pytest.raises(TaskResolutionError, match="not a directory"):
        TaskResolver(tmp_path / "missing", TaskMode.TEMPLATE)
    with pytest.raises(TaskResolutionError, match="task_mode='nope'"):
        TaskResolver(dataset, "nope")
    bad = make_task(tmp_path / "bad")
    (bad / "task.toml").write_text("this is = = not toml")
    with pytest.raises(TaskResolutionError, match="malformed TOML"):
        TaskResolver(bad, "template")


# -- dataset mode ----------------------------------------------------------------------


async def test_dataset_mode_nested_ids(dataset: Path, tmp_path: Path) -> None:
    resolver = TaskResolver(dataset, "dataset")
    assert resolver.task_ids() == ["alpha", "grp/beta", "grp/sub/gamma"]
    for task_id in resolver.task_ids():
        task = await resolver.resolve({"harbor_task_id": task_id})
        assert task.source == "dataset" and task.task_id == task_id
        assert task.path == (dataset / task_id).resolve()
    task = await resolver.resolve({"harbor_task_id": "grp/sub/gamma/"})  # a trailing slash is fine
    assert task.task_id == "grp/sub/gamma"
    out = materialize_task(task, tmp_path / "r" / "task")  # keeps its own instruction
    assert (out.path / "instruction.md").read_text() == "gamma instruction\n"
    assert not out.instruction_replaced


async def test_dataset_mode_needs_a_task_id(dataset: Path) -> None:
    resolver = TaskResolver(dataset, "dataset")
    for metadata in (None, {}, {"other": 1}):
        with pytest.raises(TaskResolutionError, match=r"metadata\['harbor_task_id'\].*'alpha'"):
            await resolver.resolve(metadata)
    with pytest.raises(TaskResolutionError, match=r"no such task.*known ids: 'grp/beta'"):
        await resolver.resolve({"harbor_task_id": "grp/betta"})
    with pytest.raises(TaskResolutionError, match="must be a string"):
        await resolver.resolve({"harbor_task_id": 3})


@pytest.mark.parametrize(
    ("task_id", "message"),
    [
        ("../ds/alpha", "'..' segment"),
        ("grp/../alpha", "'..' segment"),
        ("./alpha", "'.' segment"),
        ("grp//beta", "'empty' segment"),
        ("/etc", "absolute path"),
        ("grp\\beta", "backslash"),
        ("", "is empty"),
        ("/", "is empty"),
    ],
)
async def test_dataset_ids_that_could_escape_are_rejected(dataset: Path, task_id: str, message: str) -> None:
    resolver = TaskResolver(dataset, "dataset")
    with pytest.raises(TaskResolutionError, match=message):
        await resolver.resolve({"harbor_task_id": task_id})


async def test_dataset_symlink_escapes_are_rejected(dataset: Path, tmp_path: Path) -> None:
    outside = make_task(tmp_path / "outside" / "secret-task")
    (dataset / "evil").symlink_to(outside)
    (dataset / "evilgrp").symlink_to(outside.parent)
    (dataset / "alias").symlink_to("alpha")  # a link that stays inside is fine
    resolver = TaskResolver(dataset, "dataset")
    assert "evil" not in resolver.task_ids()
    for task_id in ("evil", "evilgrp/secret-task"):
        with pytest.raises(TaskResolutionError, match="leads outside tasks_dir"):
            await resolver.resolve({"harbor_task_id": task_id})
    assert (await resolver.resolve({"harbor_task_id": "alias"})).path == (dataset / "alpha").resolve()


async def test_dataset_only_accepts_what_discovery_would_find(dataset: Path) -> None:
    make_task(dataset / "alpha" / "environment" / "inner")  # inside a task: not a task of the dataset
    make_task(dataset / "later" / "added")  # added after startup: fine
    resolver = TaskResolver(dataset, "dataset")
    make_task(dataset / "late")
    with pytest.raises(TaskResolutionError, match="no such task"):
        await resolver.resolve({"harbor_task_id": "alpha/environment/inner"})
    assert (await resolver.resolve({"harbor_task_id": "late"})).task_id == "late"
    assert "late" in resolver.task_ids()


def test_dataset_mode_validates_eagerly(tmp_path: Path, template: Path) -> None:
    with pytest.raises(TaskResolutionError, match="is itself a task"):
        TaskResolver(template, "dataset")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskResolutionError, match="no task.toml found"):
        TaskResolver(tmp_path / "empty", "dataset")


async def test_dataset_task_is_checked(dataset: Path) -> None:
    (dataset / "grp" / "beta" / "instruction.md").unlink()
    resolver = TaskResolver(dataset, "dataset")
    with pytest.raises(TaskResolutionError, match="instruction.md is missing"):
        await resolver.resolve({"harbor_task_id": "grp/beta"})


# -- prompt rendering -------------------------------------------------------------------


def test_render_single_user_message() -> None:
    assert render_prompt([{"role": "user", "content": "Fix the failing test."}]) == "Fix the failing test."
    parts = [
        {"type": "text", "text": "Describe this picture."},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
        {"type": "text", "text": "Be brief."},
    ]
    assert render_prompt([{"role": "user", "content": parts}]) == (
        "Describe this picture.\n[image: https://example.invalid/cat.png]\nBe brief."
    )
    with pytest.raises(ValueError, match="empty"):
        render_prompt([{"role": "user", "content": ""}])
    with pytest.raises(ValueError, match="list of chat messages"):
        render_prompt("hello")  # type: ignore[arg-type]


def test_render_multi_message_prompt() -> None:
    prompt = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": [{"type": "text", "text": "What's the weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        {"role": "user", "content": "Now write it to /workspace/weather.txt"},
    ]
    assert render_prompt(prompt) == (
        "You are a careful engineer.\n\n"
        "## user\n\nWhat's the weather in Paris?\n\n"
        '## assistant\n\nTool call [call_1]: get_weather({"city": "Paris"})\n\n'
        "## tool (result of call_1)\n\n18C, sunny\n\n"
        "## user\n\nNow write it to /workspace/weather.txt\n"
    )
    assert '"role"' not in render_prompt(prompt)


# -- materialization --------------------------------------------------------------------


def test_generated_test_sh_only_without_own_tests(tmp_path: Path) -> None:
    bare = make_task(tmp_path / "bare", tests=False)
    cmd = "/opt/osmosis/venv/bin/mybundle-grade"
    out = materialize_task(bare, tmp_path / "a", grade_command=cmd)
    script = out.path / "tests" / "test.sh"
    assert out.generated_tests
    assert script.read_text().splitlines()[0] == "#!/bin/sh"
    assert "set -e\n" in script.read_text() and script.read_text().endswith(f"exec {cmd}\n")
    assert script.stat().st_mode & stat.S_IXUSR
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0

    own = make_task(tmp_path / "own", tests=True)
    out = materialize_task(own, tmp_path / "b", grade_command=cmd)
    assert not out.generated_tests
    assert (out.path / "tests" / "test.sh").read_text() == (own / "tests" / "test.sh").read_text()

    out = materialize_task(bare, tmp_path / "c")  # no grade command: nothing generated
    assert not out.generated_tests and not (out.path / "tests").exists()
    with pytest.raises(ValueError, match="one non-empty shell command line"):
        materialize_task(bare, tmp_path / "d", grade_command="a\nb")


def test_grading_input_written(tmp_path: Path) -> None:
    task = make_task(tmp_path / "t", tests=False)
    grading = {"rollout_id": "r1", "label": "42", "metadata": {"k": "v"}, "prompt": [{"role": "user", "content": "é"}]}
    out = materialize_task(task, tmp_path / "x", grading_input=grading)
    assert out.grading_input_written
    assert json.loads((out.path / "tests" / GRADING_INPUT_FILENAME).read_text(encoding="utf-8")) == grading


def test_materialize_rejects_escaping_symlinks(tmp_path: Path) -> None:
    (tmp_path / "host-secret").write_text("secret")
    task = make_task(tmp_path / "t")
    (task / "environment" / "leak").symlink_to(tmp_path / "host-secret")
    with pytest.raises(TaskResolutionError, match="points outside the task"):
        materialize_task(task, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    (task / "environment" / "leak").unlink()
    (task / "environment" / "leak").symlink_to("../../host-secret")
    with pytest.raises(TaskResolutionError, match="points outside the task"):
        materialize_task(task, tmp_path / "x")


def test_materialize_keeps_inside_symlinks(tmp_path: Path) -> None:
    task = make_task(tmp_path / "t")
    (task / "environment" / "data.txt").write_text("data")
    (task / "environment" / "rel").symlink_to("data.txt")
    (task / "environment" / "abs").symlink_to(task / "environment" / "data.txt")
    out = materialize_task(task, tmp_path / "x")
    assert os.readlink(out.path / "environment" / "rel") == "data.txt"
    assert os.readlink(out.path / "environment" / "abs") == "data.txt"  # absolute: rewritten into the copy
    assert (out.path / "environment" / "abs").read_text() == "data"


def test_materialize_result_and_dest_rules(tmp_path: Path) -> None:
    task = make_task(tmp_path / "t")
    (tmp_path / "empty").mkdir()
    out = materialize_task(task, tmp_path / "empty")  # an empty directory is fine
    # A value (decided once, carried as data), not a Path subclass read back with getattr.
    assert isinstance(out, MaterializedTask) and not isinstance(out, Path)
    assert out.path == tmp_path / "empty" and type(out.path) is not MaterializedTask
    assert type(out.path / "tests") is not MaterializedTask
    assert pickle.loads(pickle.dumps(out)) == out and pickle.loads(pickle.dumps(out)).flags() == out.flags()
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.environment_patched = True  # type: ignore[misc]
    with pytest.raises(FileExistsError):
        materialize_task(task, tmp_path / "empty")
    with pytest.raises(TaskResolutionError, match="no task.toml"):
        materialize_task(tmp_path / "empty" / "environment", tmp_path / "y")
    with pytest.raises(ValueError, match="inside the task"):
        materialize_task(task, task / "copy")


def test_materialize_can_leave_the_solution_out(tmp_path: Path) -> None:
    """A workflow rollout's copy carries no solution/ (only Harbor's oracle agent reads it, and
    Harbor walks and hashes every file of the copy in each trial); a nested solution/ that is not
    the task's own is still copied, and by default (oracle validation) the solution is kept."""
    task = make_task(tmp_path / "t")
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("echo hello > /workspace/out.txt\n")
    (task / "environment" / "solution").mkdir()
    (task / "environment" / "solution" / "data.txt").write_text("data")
    kept = materialize_task(task, tmp_path / "kept")
    assert (kept.path / "solution" / "solve.sh").is_file()  # positive control: the default keeps it
    left = materialize_task(task, tmp_path / "left", keep_solution=False)
    assert not (left.path / "solution").exists()
    assert (left.path / "environment" / "solution" / "data.txt").read_text() == "data"
    assert (left.path / "tests" / "test.sh").is_file() and (left.path / "task.toml").is_file()


def test_materialize_copies_are_complete_and_independent(tmp_path: Path) -> None:
    """Many copies of one task: each holds the whole task plus its own staged files, and none
    shares a file with the source or another copy (a rollout may change its copy freely)."""
    task = make_task(tmp_path / "t", tests=False)
    for i in range(20):
        (task / "environment" / f"file{i}.txt").write_text("x" * 1000)
    patch = EnvironmentPatch(requirements=["osmosis-ai>=0.3.8", "pydantic>=2"])
    copies = [
        materialize_task(
            task,
            tmp_path / "runs" / str(i),
            instruction=f"hi {i}",
            grading_input={"rollout_id": f"r{i}", "label": str(i)},
            grade_command="/opt/osmosis/venv/bin/g-grade",
            environment_patch=patch,
        )
        for i in range(5)
    ]
    source_files = {p.relative_to(task) for p in task.rglob("*") if p.is_file()}
    for i, copy in enumerate(copies):
        files = {p.relative_to(copy.path) for p in copy.path.rglob("*") if p.is_file()}
        assert source_files <= files
        assert copy.generated_tests and copy.environment_patched and copy.instruction_replaced
        assert (copy.path / "instruction.md").read_text().strip() == f"hi {i}"
        written = json.loads((copy.path / "tests" / GRADING_INPUT_FILENAME).read_text())
        assert (written["rollout_id"], written["label"]) == (f"r{i}", str(i))
        assert "osmosis-harbor: bundle dependencies" in (copy.path / "environment" / "Dockerfile").read_text()
        assert "osmosis-ai>=0.3.8" in (copy.path / "environment" / "osmosis-requirements.txt").read_text()
    (copies[0].path / "environment" / "file0.txt").write_text("changed")
    assert (task / "environment" / "file0.txt").read_text() == "x" * 1000
    assert (copies[1].path / "environment" / "file0.txt").read_text() == "x" * 1000
    assert "osmosis-harbor" not in (task / "environment" / "Dockerfile").read_text()


# -- Dockerfile patching ----------------------------------------------------------------

MULTISTAGE = """\
# syntax=docker/dockerfile:1
FROM python:3.12-slim AS build
USER builder
RUN echo build

FROM python:3.12-slim
RUN useradd -m app && \\
    mkdir -p /workspace
# USER commented-out
USER app
RUN <<EOF
echo "USER not-an-instruction"
EOF
WORKDIR /workspace
"""


def test_patch_environment_block(tmp_path: Path) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "Dockerfile").write_text(MULTISTAGE)
    assert patch_environment(env, EnvironmentPatch(requirements=["pydantic>=2", "Osmosis-AI==0.3.8", "pydantic>=2"]))
    text = (env / "Dockerfile").read_text()
    assert text == MULTISTAGE + (
        "\n"
        f"{PATCH_BEGIN}\n"
        "USER root\n"
        f"COPY {REQUIREMENTS_FILENAME} {CONTAINER_REQUIREMENTS}\n"
        "RUN { command -v python3 >/dev/null && python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))'; } "
        f"|| {{ echo '{INCOMPATIBLE_IMAGE_MARKER}: the task image has no python3 >= 3.12, which the workflow "
        "bundle needs' >&2; exit 90; }; "
        "python3 -m venv /opt/osmosis/venv && /opt/osmosis/venv/bin/pip install --no-cache-dir "
        f"-r {CONTAINER_REQUIREMENTS}\n"
        "USER app\n"
        "# <<< osmosis-harbor: bundle dependencies <<<\n"
    )
    assert (env / REQUIREMENTS_FILENAME).read_text() == "Osmosis-AI==0.3.8\npydantic>=2\n"

    before = (env / "Dockerfile").read_bytes()
    assert patch_environment(env, EnvironmentPatch(requirements=["Osmosis-AI==0.3.8", "pydantic>=2"]))
    assert (env / "Dockerfile").read_bytes() == before  # idempotent
    assert patch_environment(env, EnvironmentPatch(requirements=["httpx"]))  # new deps replace the block
    text = (env / "Dockerfile").read_text()
    assert text.count(PATCH_BEGIN) == 1 and text.count("USER root") == 1
    assert (env / REQUIREMENTS_FILENAME).read_text() == "httpx\n"


def test_patch_environment_user_handling(tmp_path: Path) -> None:
    cases = {
        "no-user": ("FROM debian:trixie-slim\n", None),
        "earlier-stage-user": ("FROM a AS x\nUSER nobody\nFROM debian:trixie-slim\n", None),
        "last-user-wins": ("FROM debian\nUSER a\nRUN true\nuser 1000:1000\n", "user 1000:1000"),
    }
    for name, (dockerfile, restored) in cases.items():
        env = tmp_path / name
        env.mkdir()
        (env / "Dockerfile").write_text(dockerfile)
        patch_environment(env, EnvironmentPatch(requirements=["x"]))
        block = (env / "Dockerfile").read_text().split(PATCH_BEGIN)[1].strip().splitlines()
        assert block[0] == "USER root" and block[2].startswith("RUN ")
        assert block[3:-1] == ([restored] if restored else []), name


def test_patch_environment_is_deterministic(tmp_path: Path) -> None:
    outputs = []
    for i, reqs in enumerate((["b", "a", "c", "a"], ["c", "b", "a"], [" a", "b ", "c", "", "# comment"])):
        env = tmp_path / f"e{i}"
        env.mkdir()
        (env / "Dockerfile").write_text("FROM debian:trixie-slim\n")
        patch_environment(env, EnvironmentPatch(requirements=reqs))
        outputs.append(((env / "Dockerfile").read_bytes(), (env / REQUIREMENTS_FILENAME).read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]


def test_patch_environment_without_dockerfile_and_dockerignore(tmp_path: Path) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    assert patch_environment(env, EnvironmentPatch(requirements=["x"])) is False
    assert list(env.iterdir()) == []
    (env / "Dockerfile").write_text("FROM debian\n")
    (env / ".dockerignore").write_text("*\n!Dockerfile\n")
    patch_environment(env, EnvironmentPatch(requirements=["x"], venv="/opt/v", python="python3.12"))
    patch_environment(env, EnvironmentPatch(requirements=["x"], venv="/opt/v", python="python3.12"))
    assert (env / ".dockerignore").read_text() == f"*\n!Dockerfile\n!{REQUIREMENTS_FILENAME}\n"
    assert "python3.12 -m venv /opt/v && /opt/v/bin/pip install" in (env / "Dockerfile").read_text()
    for bad in ({"venv": "relative/venv"}, {"venv": "/opt/x; rm -rf /"}, {"python": "python3 && evil"}):
        with pytest.raises(ValueError):
            EnvironmentPatch(requirements=["x"], **bad)
    with pytest.raises(ValueError, match="spans lines"):
        EnvironmentPatch(requirements=["x\nRUN evil"])


def test_materialize_with_environment_patch(tmp_path: Path) -> None:
    task = make_task(tmp_path / "t")
    source_dockerfile = (task / "environment" / "Dockerfile").read_text()
    out = materialize_task(task, tmp_path / "x", environment_patch=EnvironmentPatch(requirements=["x"]))
    assert out.environment_patched and PATCH_BEGIN in (out.path / "environment" / "Dockerfile").read_text()
    assert (task / "environment" / "Dockerfile").read_text() == source_dockerfile
    image_only = make_task(tmp_path / "image-only", dockerfile=None)
    out = materialize_task(image_only, tmp_path / "y", environment_patch=EnvironmentPatch(requirements=["x"]))
    assert not out.environment_patched


def _wheel(root: Path, name: str = "calc_agent-0.1.0-py3-none-any.whl", data: bytes = b"wheel-1") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(data)
    return root / name


def test_patch_environment_bakes_the_bundle_after_the_dependencies(tmp_path: Path) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "Dockerfile").write_text(MULTISTAGE)
    wheel = _wheel(tmp_path / "bundles")
    patch = EnvironmentPatch(requirements=["osmosis-ai==0.3.8"], wheel=wheel, bundle_key="k1")
    assert patch_environment(env, patch)
    block = (env / "Dockerfile").read_text().split(PATCH_BEGIN)[1].strip().splitlines()
    # the dependencies' RUN first (its layer stays cached when only the bundle changes), then one bundle layer
    assert block[1] == f"COPY {REQUIREMENTS_FILENAME} {CONTAINER_REQUIREMENTS}" and "-r " in block[2]
    assert block[3] == f"COPY {BUNDLE_DIRNAME}/{wheel.name} /opt/osmosis/wheels/{wheel.name}"
    assert block[4] == (
        "RUN /opt/osmosis/venv/bin/python -m pip install --disable-pip-version-check -q --no-deps --no-index "
        f"--no-cache-dir /opt/osmosis/wheels/{wheel.name} && echo k1 > /opt/osmosis/bundle.id && "
        "rm -rf /logs/agent /logs/verifier /logs/artifacts && mkdir -p /logs/agent /logs/verifier /logs/artifacts /osmosis && "
        "chmod 777 /logs/agent /logs/verifier /logs/artifacts && chmod 755 /osmosis"
    )
    assert block[6:] == ["USER app", "# <<< osmosis-harbor: bundle dependencies <<<"]
    assert (env / BUNDLE_DIRNAME / wheel.name).read_bytes() == b"wheel-1"
    assert baked_bundle(env) == "k1"

    before = {p.relative_to(env): p.read_bytes() for p in env.rglob("*") if p.is_file()}
    assert patch_environment(env, patch)  # idempotent
    assert {p.relative_to(env): p.read_bytes() for p in env.rglob("*") if p.is_file()} == before
    # a new bundle replaces the old wheel (a stale one would change the environment hash)
    other = _wheel(tmp_path / "bundles2", "calc_agent-0.2.0-py3-none-any.whl", b"wheel-2")
    patch_environment(env, EnvironmentPatch(requirements=["osmosis-ai==0.3.8"], wheel=other, bundle_key="k2"))
    assert [p.name for p in (env / BUNDLE_DIRNAME).iterdir()] == [other.name] and baked_bundle(env) == "k2"
    text = (env / "Dockerfile").read_text()
    assert text.count(PATCH_BEGIN) == 1 and text.count("bundle.id") == 1
    # without a wheel: dependencies only, nothing staged, nothing baked
    patch_environment(env, EnvironmentPatch(requirements=["osmosis-ai==0.3.8"]))
    assert not (env / BUNDLE_DIRNAME).exists() and baked_bundle(env) is None
    assert "bundle.id" not in (env / "Dockerfile").read_text()


def test_baked_bundle_copies_are_deterministic_and_pass_dockerignore(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "bundles")
    outputs = []
    for i in range(2):
        env = tmp_path / f"e{i}" / "environment"
        env.mkdir(parents=True)
        (env / "Dockerfile").write_text("FROM debian:trixie-slim\n")
        (env / ".dockerignore").write_text("*\n!Dockerfile\n")
        for _ in range(2):
            patch_environment(env, EnvironmentPatch(requirements=["a"], wheel=wheel, bundle_key="k"))
        outputs.append({p.relative_to(env): p.read_bytes() for p in env.rglob("*") if p.is_file()})
    assert outputs[0] == outputs[1]
    assert (env / ".dockerignore").read_text() == f"*\n!Dockerfile\n!{REQUIREMENTS_FILENAME}\n!{BUNDLE_DIRNAME}\n"
    for bad, message in (
        ({"wheel": wheel}, "go together"),
        ({"bundle_key": "k"}, "go together"),
        ({"wheel": wheel, "bundle_key": "k; rm -rf /"}, "bundle_key"),
        ({"wheel": tmp_path / "x.tar.gz", "bundle_key": "k"}, ".whl"),
    ):
        with pytest.raises(ValueError, match=message):
            EnvironmentPatch(requirements=["a"], **bad)
    assert baked_bundle(tmp_path / "nowhere") is None


def test_materialize_says_which_bundle_is_baked(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "bundles")
    patch = EnvironmentPatch(requirements=["x"], wheel=wheel, bundle_key="k1")
    out = materialize_task(make_task(tmp_path / "t"), tmp_path / "x", environment_patch=patch)
    assert out.environment_patched and out.bundle_baked == "k1" and out.flags()["bundle_baked"]
    image_only = materialize_task(make_task(tmp_path / "i", dockerfile=None), tmp_path / "y", environment_patch=patch)
    assert not image_only.environment_patched and image_only.bundle_baked is None


# -- harbor_task: local paths -----------------------------------------------------------


async def test_local_refs(dataset: Path, template: Path, tmp_path: Path) -> None:
    other = make_task(tmp_path / "other", instruction="other\n")
    resolver = TaskResolver(template, "template", task_roots=[tmp_path])
    by_abs = await resolver.resolve({"harbor_task": str(other)})
    assert by_abs.source == "local" and by_abs.path == other.resolve() and by_abs.task_id == "other"
    assert (await resolver.resolve({"harbor_task": "../other"})).path == other.resolve()  # relative to tasks_dir

    resolver = TaskResolver(dataset, "dataset", task_roots=[tmp_path])
    # harbor_task wins over harbor_task_id
    task = await resolver.resolve({"harbor_task": "./grp/beta", "harbor_task_id": "alpha"})
    assert task.path == (dataset / "grp" / "beta").resolve() and task.source == "local"
    with pytest.raises(TaskResolutionError, match="not a directory"):
        await resolver.resolve({"harbor_task": str(tmp_path / "nope")})
    with pytest.raises(TaskResolutionError, match="no task.toml"):
        await resolver.resolve({"harbor_task": "./grp"})
    with pytest.raises(TaskResolutionError, match="neither a local path"):
        await resolver.resolve({"harbor_task": "just-a-name"})
    with pytest.raises(TaskResolutionError, match="non-empty string"):
        await resolver.resolve({"harbor_task": ""})


# -- harbor_task: git -------------------------------------------------------------------


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A bare repository holding tasks/hello (a task) and docs/ (not a task): (file URL, commit)."""
    empty = tmp_path / "gitconfig"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{var}_NAME", "test")
        monkeypatch.setenv(f"GIT_{var}_EMAIL", "test@example.invalid")
    work = tmp_path / "gitwork"
    make_task(work / "tasks" / "hello", instruction="hello from git\n")
    (work / "docs").mkdir()
    (work / "docs" / "README.md").write_text("docs\n")
    _git("init", "-q", "-b", "main", cwd=work)
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "tasks", cwd=work)
    commit = _git("rev-parse", "HEAD", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(tmp_path / "repo.git"), cwd=tmp_path)
    return (tmp_path / "repo.git").as_uri(), commit


@pytest.fixture
def download_spy(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    calls: list[object] = []
    real = TaskClient.download_tasks

    async def spy(self: TaskClient, task_ids: list[object], *args: object, **kwargs: object) -> object:
        calls.append(task_ids[0])
        await asyncio.sleep(0.01)  # widen the race window
        return await real(self, task_ids, *args, **kwargs)

    monkeypatch.setattr(TaskClient, "download_tasks", spy)
    return calls


async def test_pinned_git_ref_is_fetched_once(
    git_repo: tuple[str, str], template: Path, tmp_path: Path, download_spy: list[object]
) -> None:
    url, commit = git_repo
    cache = tmp_path / "cache"
    resolver = TaskResolver(template, "template", cache_dir=cache, allow_local_git=True)
    metadata = {"harbor_task": "tasks/hello", "git_url": url, "git_commit_id": commit}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnpinnedTaskRefWarning)
        results = await asyncio.gather(*(resolver.resolve(dict(metadata)) for _ in range(5)))
    assert len(download_spy) == 1 and resolver.fetch_count == 1
    assert len({r.path for r in results}) == 1
    task = results[0]
    assert task.source == "git" and task.pinned and task.git_commit_id == commit and task.task_id == "tasks/hello"
    assert task.path.is_relative_to(cache.resolve()) and (task.path / "task.toml").is_file()
    out = materialize_task(task, tmp_path / "run" / "task")
    assert (out.path / "instruction.md").read_text() == "hello from git\n"

    # A new process (resolver) finds Harbor's on-disk cache: TaskClient is called, git is not.
    other = TaskResolver(template, "template", cache_dir=cache, allow_local_git=True)
    real = TaskClient._download_tasks_from_git_url

    async def no_git(*args: object, **kwargs: object) -> object:
        raise AssertionError("pinned git task was fetched again")

    TaskClient._download_tasks_from_git_url = no_git  # type: ignore[method-assign]
    try:
        assert (await other.resolve(metadata)).path == task.path
    finally:
        TaskClient._download_tasks_from_git_url = real  # type: ignore[method-assign]


async def test_unpinned_git_ref_warns_once(
    git_repo: tuple[str, str], dataset: Path, tmp_path: Path, download_spy: list[object]
) -> None:
    url, commit = git_repo
    resolver = TaskResolver(dataset, "dataset", cache_dir=tmp_path / "cache", allow_local_git=True)
    metadata = {"harbor_task": "tasks/hello", "git_url": url}
    with pytest.warns(UnpinnedTaskRefWarning) as record:
        results = await asyncio.gather(*(resolver.resolve(metadata) for _ in range(3)))
        results.append(await resolver.resolve(metadata))
        await TaskResolver(dataset, "dataset", cache_dir=tmp_path / "cache2", allow_local_git=True).resolve(metadata)
    unpinned = [w for w in record if issubclass(w.category, UnpinnedTaskRefWarning)]
    assert len(unpinned) == 1, [str(w.message) for w in unpinned]
    assert commit in str(unpinned[0].message) and "git_commit_id" in str(unpinned[0].message)
    assert resolver.fetch_count == 1 and all(r == results[0] for r in results)
    task = results[0]
    assert not task.pinned and task.git_commit_id == commit
    # Served from an immutable per-commit snapshot, not from the directory Harbor
    # rewrites on every fetch of an unpinned ref.
    assert "osmosis-snapshots" in task.path.parts and (task.path / "task.toml").is_file()
    await TaskResolver(dataset, "dataset", cache_dir=tmp_path / "cache", allow_local_git=True).resolve(
        metadata
    )  # Harbor re-fetches
    assert len(download_spy) == 3 and (task.path / "instruction.md").read_text() == "hello from git\n"


async def test_git_ref_errors(git_repo: tuple[str, str], template: Path, tmp_path: Path) -> None:
    url, commit = git_repo
    resolver = TaskResolver(template, "template", cache_dir=tmp_path / "cache", allow_local_git=True)
    missing = "0" * 40
    with pytest.raises(TaskResolutionError, match=rf"git task 'tasks/hello' in {url} @ {missing}: could not fetch"):
        await resolver.resolve({"harbor_task": "tasks/hello", "git_url": url, "git_commit_id": missing})
    with pytest.raises(TaskResolutionError, match="has no task.toml"):
        await resolver.resolve({"harbor_task": "docs", "git_url": url, "git_commit_id": commit})
    bad = [
        ({"harbor_task": "tasks/hello", "git_url": "--upload-pack=touch /tmp/pwned"}, "not a git URL"),
        ({"harbor_task": "tasks/hello", "git_url": url, "git_commit_id": "--force"}, "not a commit"),
        ({"harbor_task": "../tasks/hello", "git_url": url, "git_commit_id": commit}, "'..' segment"),
        ({"harbor_task": "/tasks/hello", "git_url": url, "git_commit_id": commit}, "absolute path"),
        ({"git_url": url, "git_commit_id": commit}, r"without metadata\['harbor_task'\]"),
        ({"harbor_task": "acme/hello", "git_commit_id": commit}, r"without metadata\['git_url'\]"),
    ]
    for metadata, message in bad:
        with pytest.raises(TaskResolutionError, match=message):
            await resolver.resolve(metadata)
    assert resolver.fetch_count == 2


async def test_git_credentials_are_not_echoed(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")
    resolver = TaskResolver(template, "template", cache_dir=tmp_path / "cache")
    url = "https://oauth2:s3cret-token@127.0.0.1:9/org/repo.git"  # nothing listens on port 9
    with pytest.raises(TaskResolutionError) as info:
        await resolver.resolve({"harbor_task": "tasks/hello", "git_url": url, "git_commit_id": "a" * 40})
    assert "s3cret" not in str(info.value) and "https://***@127.0.0.1:9/org/repo.git" in str(info.value)
    assert info.value.__cause__ is None


async def test_downloads_are_serialized_across_processes(tmp_path: Path) -> None:
    """Two holders of the per-ref file lock (as two processes would be) never overlap."""
    from osmosis_harbor.tasks.remote import file_lock

    lock = tmp_path / "locks" / "ref.lock"
    events: list[str] = []

    async def hold(name: str) -> None:
        async with file_lock(lock):
            events.append(f"{name}+")
            await asyncio.sleep(0.1)
            events.append(f"{name}-")

    await asyncio.gather(hold("a"), hold("b"))
    assert events in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


# -- harbor_task: registry packages -----------------------------------------------------


def _package_archive(task: Path, dest: Path) -> str:
    """Build the archive Harbor's publisher uploads; return its content hash."""
    content_hash, files = Packager.compute_content_hash(task)
    Publisher._create_archive(task.resolve(), files, dest)
    return content_hash


@pytest.fixture
def no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    async def offline(*args: object, **kwargs: object) -> object:
        raise AssertionError("the Harbor registry was contacted")

    monkeypatch.setattr(RegistryDB, "resolve_task_version", offline)
    monkeypatch.setattr(RegistryDB, "record_task_download", offline)
    monkeypatch.setattr(SupabaseStorage, "download_file", offline)


async def test_package_digest_from_harbor_cache(
    template: Path, tmp_path: Path, no_registry: None, download_spy: list[object]
) -> None:
    archive = tmp_path / "dist.tar.gz"
    content_hash = _package_archive(make_task(tmp_path / "pkg-src", instruction="from the registry\n"), archive)
    cache = tmp_path / "cache"
    target = cache / "packages" / "acme" / "hello" / content_hash  # TaskClient's cache layout
    target.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(path=target, filter="data")  # exactly how TaskClient unpacks a download

    resolver = TaskResolver(template, "template", cache_dir=cache)
    ref = f"acme/hello@sha256:{content_hash}"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnpinnedTaskRefWarning)
        results = await asyncio.gather(*(resolver.resolve({"harbor_task": ref}) for _ in range(5)))
    assert len(download_spy) == 1
    task = results[0]
    assert task.source == "package" and task.pinned and task.path == target.resolve()
    assert task.task_id == ref and task.content_hash == content_hash
    assert (materialize_task(task, tmp_path / "x").path / "instruction.md").read_text() == "from the registry\n"


async def test_package_tag_resolved_once_through_taskclient(
    template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_registry: None, download_spy: list[object]
) -> None:
    archive = tmp_path / "dist.tar.gz"
    content_hash = _package_archive(make_task(tmp_path / "pkg-src", instruction="v1\n"), archive)
    rpcs: list[str] = []
    downloads: list[str] = []

    async def resolve_version(self: TaskClient, task_id: object) -> _ResolvedPackage:  # the registry RPC
        rpcs.append(str(task_id))
        return _ResolvedPackage(
            id="tv-1", archive_path=f"acme/hello/{content_hash}/dist.tar.gz", content_hash=content_hash
        )

    async def download(self: SupabaseStorage, remote_path: str, file_path: Path) -> None:  # the storage GET
        downloads.append(remote_path)
        file_path.write_bytes(archive.read_bytes())

    async def record(self: RegistryDB, task_version_id: str) -> None:
        return None

    monkeypatch.setattr(TaskClient, "_resolve_package_version", resolve_version)
    monkeypatch.setattr(SupabaseStorage, "download_file", download)
    monkeypatch.setattr(RegistryDB, "record_task_download", record)

    cache = tmp_path / "cache"
    resolver = TaskResolver(template, "template", cache_dir=cache)
    with pytest.warns(UnpinnedTaskRefWarning, match=f"acme/hello@sha256:{content_hash}") as record_:
        results = await asyncio.gather(*(resolver.resolve({"harbor_task": "acme/hello"}) for _ in range(5)))
        await resolver.resolve({"harbor_task": "acme/hello@latest"})  # the same ref
    assert len([w for w in record_ if issubclass(w.category, UnpinnedTaskRefWarning)]) == 1
    assert len(download_spy) == 1 and len(rpcs) == 1 and len(downloads) == 1
    task = results[0]
    assert task.path == (cache / "packages" / "acme" / "hello" / content_hash).resolve()
    assert not task.pinned and task.task_id == "acme/hello@latest"
    assert (task.path / "instruction.md").read_text() == "v1\n"

    # Another process: the tag is re-resolved (one RPC) but the archive is already cached.
    await TaskResolver(template, "template", cache_dir=cache).resolve({"harbor_task": "acme/hello@latest"})
    assert len(rpcs) == 2 and len(downloads) == 1


async def test_package_ref_errors(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def not_found(self: TaskClient, task_id: object) -> object:
        raise TaskVersionNotFoundError("Task version not found: acme/ghost@3")

    monkeypatch.setattr(TaskClient, "_resolve_package_version", not_found)
    resolver = TaskResolver(template, "template", cache_dir=tmp_path / "cache")
    with pytest.raises(TaskResolutionError, match=r"package acme/ghost@3: could not fetch.*not found"):
        await resolver.resolve({"harbor_task": "acme/ghost@3"})
    with pytest.raises(TaskResolutionError, match="is not a package ref"):
        await resolver.resolve({"harbor_task": "acme/ghost@Not A Tag"})
    with pytest.raises(TaskResolutionError, match="neither a local path"):
        await resolver.resolve({"harbor_task": "acme/../ghost"})
