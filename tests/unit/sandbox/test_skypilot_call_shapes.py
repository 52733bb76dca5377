"""The ``sky.sandbox`` calls our environment makes with ``sdk="skypilot"``, where it keeps
Harbor's ``SkypilotEnvironment`` behaviour: a fake ``sky.sandbox`` module in ``sys.modules``
records every call (as Harbor's own unit tests of that class do), and each test asserts the
calls' arguments. Create keywords, exec argv, env, user, workdir and timeout, file transfers,
stop, a pool claim and the missing-SDK error.

Where we deliberately differ (every exec runs under its exec record, uploads are staged), the
test says so and asserts the part Harbor's shape still holds: the command's own argv is
Harbor's ``_exec_argv`` of it. No engine and no network: these run on both Harbor lines
(``noxfile.py``'s ``HARBOR_026_TESTS``)."""

from __future__ import annotations

import ast
import inspect
import io
import logging
import sys
import tarfile
import textwrap
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.environments.skypilot import _REMOTE_TRANSFER_DIR, SkypilotEnvironment
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths
from harbor.utils.optional_import import MissingExtraError

from osmosis_harbor.errors import SandboxSdkMissingError
from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
from osmosis_harbor.sandbox.environment.exec_records import RECORDS_DIR
from tests.support.common import make_task

PREBUILT = "registry.example/prebuilt:1"
TTL_SEC = 86_400  # Harbor's _SANDBOX_TTL_SEC


@dataclass
class Call:
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class FakeExecution:
    """What ``exec.aio`` returns: ``wait()``, then the streams' ``read()``."""

    code: int
    out: str
    err: str

    def __post_init__(self) -> None:
        self.stdout = types.SimpleNamespace(read=lambda: self.out)
        self.stderr = types.SimpleNamespace(read=lambda: self.err)

    async def wait(self) -> int:
        return self.code


class Recorded:
    """One SDK call: blocking, with its ``.aio`` twin; both recorded in ``log``."""

    def __init__(self, log: list[Call], name: str, answer: Callable[..., Any]) -> None:
        self._log, self._name, self._answer = log, name, answer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._log.append(Call(self._name, args, kwargs))
        return self._answer(*args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)


@dataclass
class FakeSandbox:
    """A sandbox handle: files in memory, exec answered by ``results`` (keyed by the command's
    own argv, after the exec-record wrapper), else exit 0 with no output."""

    name: str
    log: list[Call]
    files: dict[str, bytes] = field(default_factory=dict)
    results: dict[tuple[str, ...], FakeExecution] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.exec = Recorded(self.log, "exec", self._exec)
        self.write_bytes = Recorded(self.log, "write_bytes", self._write)
        self.read_bytes = Recorded(self.log, "read_bytes", lambda path: self.files[path])
        self.terminate = Recorded(
            self.log, "terminate", lambda **_: self.log.append(Call("terminated", (self.name,), {}))
        )

    def _exec(self, *argv: str, **_: Any) -> FakeExecution:
        return self.results.get(tuple(command_of(list(argv))), FakeExecution(0, "", ""))

    def _write(self, data: bytes, path: str) -> None:
        self.files[path] = data


class FakeSkySandbox(types.ModuleType):
    """``sky.sandbox`` as SkyPilot documents it: create, ls and the pool calls."""

    def __init__(self) -> None:
        super().__init__("sky.sandbox")
        self.log: list[Call] = []
        self.made: list[FakeSandbox] = []
        self.create = Recorded(self.log, "create", self._create)
        self.ls = Recorded(self.log, "ls", self._ls)
        self.create_pool = Recorded(self.log, "create_pool", lambda *a, **k: None)
        self.set_pool_size = Recorded(self.log, "set_pool_size", lambda *a, **k: None)
        self.delete_pool = Recorded(self.log, "delete_pool", lambda *a, **k: None)

    def _create(self, **kwargs: Any) -> FakeSandbox:
        sandbox = FakeSandbox(kwargs["name"], self.log)
        self.made.append(sandbox)
        return sandbox

    def _ls(self, **_: Any) -> list[dict[str, str]]:
        ended = {c.args[0] for c in self.log if c.name == "terminated"}
        return [{"name": s.name, "status": "RUNNING"} for s in self.made if s.name not in ended]

    def calls(self, name: str) -> list[Call]:
        return [c for c in self.log if c.name == name]


def command_of(argv: list[str]) -> list[str]:
    """The command's own argv inside the exec-record wrapper (``sh -c WRAPPER sh record done
    bound mode argv...``); an unwrapped argv as it is."""
    if argv[:2] == ["sh", "-c"] and len(argv) > 8 and argv[4].startswith(f"{RECORDS_DIR}/"):
        return argv[8:]
    return argv


@pytest.fixture
def sky() -> Iterator[FakeSkySandbox]:
    """The fake ``sky.sandbox``, importable as SkyPilot's is (``import sky.sandbox``)."""
    fake = FakeSkySandbox()
    package = types.ModuleType("sky")
    package.__path__ = []
    package.sandbox = fake  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "sky", package)
        patch.setitem(sys.modules, "sky.sandbox", fake)
        yield fake


def _environment(task_dir: Path, tmp_path: Path, **kwargs: Any) -> SandboxEnvironment:
    """Made as Harbor makes a trial's environment (its factory), with ``sdk="skypilot"``."""
    task = Task(task_dir)
    trial_paths = TrialPaths(tmp_path / f"trial-{uuid.uuid4().hex[:6]}")
    trial_paths.mkdir()
    persistent_env = kwargs.pop("persistent_env", None)
    env = EnvironmentFactory.create_environment_from_config(
        environment_config("skypilot", **kwargs),
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"shapes-{uuid.uuid4().hex[:8]}",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
        persistent_env=persistent_env,
    )
    assert isinstance(env, SandboxEnvironment)
    return env


def _prebuilt_task(root: Path) -> Path:
    """A task on a prebuilt image (nothing to build): 2 CPUs, 4 GiB."""
    task = make_task(root, "prebuilt", toml_extra=f'docker_image = "{PREBUILT}"\ncpus = 2\nmemory_mb = 4096\n')
    (task / "environment" / "Dockerfile").unlink()
    return task


def _harbor_create_keywords() -> dict[bool, set[str]]:
    """The keywords of Harbor's two ``sky_sandbox.create.aio`` calls, keyed by "from a pool"."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(SkypilotEnvironment._create_sandbox)))
    calls: dict[bool, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "aio":
            keywords = {k.arg for k in node.keywords if k.arg is not None}
            calls["pool" in keywords] = keywords
    return calls


def test_sdk_skypilot_is_the_sky_sandbox_module(sky: FakeSkySandbox, tmp_path: Path) -> None:
    env = _environment(_prebuilt_task(tmp_path), tmp_path)
    assert env.state.sdk is sky


def test_sdk_skypilot_without_sky_sandbox_raises_harbors_missing_extra_error(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "sky", None)  # `import sky` raises ImportError
        with pytest.raises(MissingExtraError) as raised:
            _environment(_prebuilt_task(tmp_path), tmp_path)
    assert isinstance(raised.value, SandboxSdkMissingError)
    assert "sky.sandbox" in str(raised.value) and "sky api login" in str(raised.value)


async def test_create_makes_harbors_call_with_harbors_values(sky: FakeSkySandbox, tmp_path: Path) -> None:
    env = _environment(
        _prebuilt_task(tmp_path),
        tmp_path,
        registry="registry.example",
        context_name="ctx",
        namespace="team",
        secrets=["HF_TOKEN"],
        persistent_env={"PERSISTENT": "1"},
    )
    await env.start(force_build=False)
    try:
        (create,) = sky.calls("create")
        assert create.args == ()
        assert set(create.kwargs) == _harbor_create_keywords()[False]
        assert create.kwargs == {
            "name": env.sandbox_name,
            "image": PREBUILT,
            "cpus": 2,
            "memory_gb": 4.0,
            "registry": "registry.example",
            "context_name": "ctx",
            "namespace": "team",
            "env": {"PERSISTENT": "1"},
            "secrets": ["HF_TOKEN"],
            "block_network": False,
            "timeout": TTL_SEC,
        }
        assert env.sandbox_name.startswith("hb-shapes-")
    finally:
        await env.stop(delete=True)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (None, ["bash", "-c", "echo hi"]),
        ("agent", ["su", "-s", "/bin/bash", "agent", "-c", "bash -c 'echo hi'"]),
        (
            1000,
            ["bash", "-c", """su -s /bin/bash "$(getent passwd 1000 | cut -d: -f1)" -c 'bash -c '"'"'echo hi'"'"''"""],
        ),
    ],
)
async def test_exec_passes_harbors_argv_env_workdir_and_timeout(
    sky: FakeSkySandbox, tmp_path: Path, user: str | int | None, expected: list[str]
) -> None:
    """Every exec runs under its exec record (a deviation: ``exec_records.py``); inside it, the
    argv is Harbor's, and env, workdir and the capped timeout are passed as Harbor passes them."""
    env = _environment(_prebuilt_task(tmp_path), tmp_path, persistent_env={"PERSISTENT": "1"})
    await env.start(force_build=False)
    try:
        (sandbox,) = sky.made
        sandbox.results[tuple(expected)] = FakeExecution(3, "out\n", "err\n")
        before = len(sky.calls("exec"))
        result = await env.exec("echo hi", cwd="/work", env={"ONE": "1"}, timeout_sec=7200, user=user)
        (call,) = sky.calls("exec")[before:]
        argv = list(call.args)
        assert argv[:4] == ["sh", "-c", argv[2], "sh"] and argv[4].startswith(f"{RECORDS_DIR}/") and argv[7] == "launch"
        assert command_of(argv) == expected == SkypilotEnvironment._exec_argv(env, "echo hi", user)
        assert call.kwargs == {"workdir": "/work", "timeout_seconds": 3600, "env": {"PERSISTENT": "1", "ONE": "1"}}
        assert (result.return_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    finally:
        await env.stop(delete=True)


async def test_a_raw_shell_command_is_sh_c_with_no_workdir(sky: FakeSkySandbox, tmp_path: Path) -> None:
    env = _environment(_prebuilt_task(tmp_path), tmp_path)
    await env.start(force_build=False)
    try:
        before = len(sky.calls("exec"))
        await env.run_shell("ls /", timeout_seconds=30)
        (call,) = sky.calls("exec")[before:]
        assert command_of(list(call.args)) == ["sh", "-c", "ls /"]
        assert call.kwargs == {"workdir": None, "timeout_seconds": 30, "env": None}
    finally:
        await env.stop(delete=True)


async def test_transfers_take_harbors_calls_with_exec_archives_off(
    sky: FakeSkySandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``exec_archives`` off, a file is one write or read, a directory one gzipped tar
    written under Harbor's transfer dir and unpacked by one command, as Harbor does."""
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    env = _environment(_prebuilt_task(tmp_path), tmp_path)
    await env.start(force_build=False)
    try:
        (sandbox,) = sky.made
        local = tmp_path / "in.txt"
        local.write_bytes(b"payload")
        await env.upload_file(local, "/work/in.txt")
        assert sky.log[-1] == Call("write_bytes", (b"payload", "/work/in.txt"), {})

        sandbox.files["/logs/out.txt"] = b"result"
        await env.download_file("/logs/out.txt", tmp_path / "got" / "out.txt")
        assert sky.log[-1] == Call("read_bytes", ("/logs/out.txt",), {})
        assert (tmp_path / "got" / "out.txt").read_bytes() == b"result"

        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "a.txt").write_text("a")
        before = len(sky.log)
        await env.upload_dir(tree, "/work/tree")
        write, unpack = sky.log[before], sky.log[before + 1]
        (path,) = [p for p in sandbox.files if p.startswith(f"{_REMOTE_TRANSFER_DIR}/hb-upload-")]
        assert write == Call("write_bytes", (sandbox.files[path], path), {}) and path.endswith(".tar.gz")
        with tarfile.open(fileobj=io.BytesIO(sandbox.files[path]), mode="r:gz") as archive:
            assert archive.extractfile("./sub/a.txt").read() == b"a"  # type: ignore[union-attr]
        assert unpack.name == "exec" and path in " ".join(command_of(list(unpack.args)))
        assert "/work/tree" in " ".join(command_of(list(unpack.args)))
    finally:
        await env.stop(delete=True)


async def test_stop_terminates_with_wait_once(sky: FakeSkySandbox, tmp_path: Path) -> None:
    env = _environment(_prebuilt_task(tmp_path), tmp_path)
    await env.start(force_build=False)
    await env.stop(delete=False)  # SkyPilot sandboxes are ephemeral: terminated whatever delete says
    assert sky.calls("terminate") == [Call("terminate", (), {"wait": True})]
    assert env.sandbox is None
    await env.stop(delete=True)
    assert len(sky.calls("terminate")) == 1


async def test_stop_terminates_a_handle_it_did_not_create(sky: FakeSkySandbox, tmp_path: Path) -> None:
    """Harbor's stop terminates whatever ``_sandbox`` holds; so does ours, and says so (read
    from a logger of the test's own: the suite's other tests reconfigure Harbor's loggers)."""
    env = _environment(_prebuilt_task(tmp_path), tmp_path)
    env.sandbox = FakeSandbox(env.sandbox_name, sky.log)
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(f"test-call-shapes-{uuid.uuid4().hex[:6]}")
    logger.propagate, logger.disabled = False, False
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    env._creator._logger = logger
    await env.stop(delete=True)
    assert sky.calls("terminate") == [Call("terminate", (), {"wait": True})]
    assert any("was not created through this owner" in line for line in said), said


async def test_a_generic_pool_claim_is_harbors_pool_create_then_environment_upload(
    sky: FakeSkySandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task with no environment definition claims from the named pool with Harbor's pool
    keywords (no image, sizing or network: the pool has them), then ``environment/`` goes to
    the directory ``pwd`` names, as Harbor's pool path does."""
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    task = make_task(tmp_path, "generic")
    (task / "environment" / "Dockerfile").unlink()
    (task / "environment" / "data.txt").write_text("for the pool's sandbox\n")
    env = _environment(task, tmp_path, pool="default", context_name="ctx", secrets=["HF_TOKEN"])
    original = sky._create

    def create(**kwargs: Any) -> FakeSandbox:
        sandbox = original(**kwargs)
        sandbox.results[("bash", "-c", "pwd")] = FakeExecution(0, "/srv/app\n", "")
        return sandbox

    sky.create = Recorded(sky.log, "create", create)
    await env.start(force_build=False)
    try:
        (claim,) = sky.calls("create")
        assert set(claim.kwargs) == _harbor_create_keywords()[True]
        assert claim.kwargs == {
            "name": env.sandbox_name,
            "pool": "default",
            "context_name": "ctx",
            "namespace": None,
            "env": None,
            "secrets": ["HF_TOKEN"],
            "timeout": TTL_SEC,
        }
        (sandbox,) = sky.made
        (archive,) = [p for p in sandbox.files if p.startswith(f"{_REMOTE_TRANSFER_DIR}/hb-upload-")]
        with tarfile.open(fileobj=io.BytesIO(sandbox.files[archive]), mode="r:gz") as tar:
            assert tar.extractfile("./data.txt").read() == b"for the pool's sandbox\n"  # type: ignore[union-attr]
        unpacks = [c for c in sky.calls("exec") if archive in " ".join(command_of(list(c.args)))]
        assert unpacks and "/srv/app" in " ".join(command_of(list(unpacks[0].args)))
    finally:
        await env.stop(delete=True)


def test_sandbox_names_are_harbors_dns_names(sky: FakeSkySandbox, tmp_path: Path) -> None:
    """Harbor's DNS-1123 name of ``hb-{session_id}``: lower case, 53 characters at most, a hash
    suffix when cut (``_sanitize_dns_name``, compared on an awkward session id)."""
    from harbor.environments.skypilot import _sanitize_dns_name

    env = _environment(_prebuilt_task(tmp_path), tmp_path)
    assert env.sandbox_name == _sanitize_dns_name(f"hb-{env.session_id}")
    long_id = "Trial__" + "X" * 80 + "__verifier__key"
    made = EnvironmentFactory.create_environment_from_config(
        environment_config("skypilot"),
        environment_dir=env.environment_dir,
        environment_name="long",
        session_id=long_id,
        trial_paths=env.trial_paths,
        task_env_config=env.task_env_config,
    )
    assert isinstance(made, SandboxEnvironment)
    assert made.sandbox_name == _sanitize_dns_name(f"hb-{long_id}") and len(made.sandbox_name) <= 53
    assert made.sandbox_name.islower() and made.sandbox_name != f"hb-{long_id}".lower()[:53]  # control: hashed


async def test_exec_defaults_are_harbors_the_cap_and_the_dockerfile_workdir(
    sky: FakeSkySandbox, tmp_path: Path
) -> None:
    """No timeout: SkyPilot's 3600 s cap; a shorter one as given. No cwd: the task's workdir,
    else the Dockerfile's WORKDIR (Harbor's ``effective_exec_cwd``); no env: ``env=None``."""
    task = make_task(tmp_path, "workdir", dockerfile="FROM debian:trixie-slim\nWORKDIR /srv/task\n")
    env = _environment(task, tmp_path, registry="registry.example")
    sky_image = {"ref": ""}

    async def prepared(force_build: bool = False) -> tuple[str, bool]:  # nothing to build here
        sky_image["ref"] = env.image_ref
        return env.image_ref, False

    env.prepare_image = prepared  # type: ignore[method-assign]
    await env.start(force_build=False)
    try:
        assert sky.calls("create")[0].kwargs["image"] == sky_image["ref"]
        before = len(sky.calls("exec"))
        await env.exec("true")
        await env.exec("true", timeout_sec=30)
        first, second = sky.calls("exec")[before:]
        assert first.kwargs == {"workdir": "/srv/task", "timeout_seconds": 3600, "env": None}
        assert second.kwargs["timeout_seconds"] == 30
    finally:
        await env.stop(delete=True)


def test_type_and_capabilities_are_harbors_skypilot_ones(tmp_path: Path, sky: FakeSkySandbox) -> None:
    env = _environment(_prebuilt_task(tmp_path), tmp_path)
    assert SandboxEnvironment.type() == SkypilotEnvironment.type()
    assert SandboxEnvironment.resource_capabilities() == SkypilotEnvironment.resource_capabilities()
    assert env.capabilities == SkypilotEnvironment.capabilities.fget(env)  # type: ignore[attr-defined]


def _runtime_error_words(function: Any) -> str:
    """The message of the RuntimeError ``function``'s source raises (Harbor's own words)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "RuntimeError":
            return str(ast.literal_eval(node.args[0]))
    raise AssertionError("no RuntimeError raised there")


def test_a_build_without_a_registry_fails_with_harbors_words(sky: FakeSkySandbox, tmp_path: Path) -> None:
    env = _environment(make_task(tmp_path, "no-registry"), tmp_path)
    with pytest.raises(RuntimeError) as raised:
        _ = env.image_ref
    assert str(raised.value) == _runtime_error_words(SkypilotEnvironment._image_ref.fget)  # type: ignore[attr-defined]


async def test_a_registry_build_runs_harbors_two_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our build and push is Harbor's: the same ``docker build --platform -t -f`` and ``docker
    push`` argv (both recorded, nothing run), the same words when one fails."""
    from tenacity import stop_after_attempt

    from osmosis_harbor.sandbox.environment.images import ImageSource, build_and_push

    ran: list[tuple[str, ...]] = []
    failing = {"push"}

    class Process:
        def __init__(self, argv: tuple[str, ...]) -> None:
            self.returncode = 1 if argv[1] in failing else 0

        async def communicate(self) -> tuple[bytes, None]:
            return b"denied\n", None

    async def create_subprocess_exec(*argv: str, **_: Any) -> Process:
        ran.append(argv)
        return Process(argv)

    monkeypatch.setattr("asyncio.create_subprocess_exec", create_subprocess_exec)
    task = make_task(tmp_path, "build")
    ref, logger = "registry.example/osmosis-harbor-env:abc", logging.getLogger("test-build")
    source = ImageSource(
        task / "environment", task / "environment" / "Dockerfile", None, "registry.example", "linux/amd64", False
    )
    with pytest.raises(RuntimeError) as ours:
        await build_and_push(source, ref, logger)
    harbor_self = types.SimpleNamespace(
        _image_ref=ref,
        _platform="linux/amd64",
        _dockerfile_path=source.dockerfile,
        environment_dir=source.environment_dir,
        logger=logger,
    )
    once = SkypilotEnvironment._build_and_push_image.retry_with(stop=stop_after_attempt(1))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError) as harbors:
        await once(harbor_self)
    assert (
        len(ran) == 4 and ran[:2] == ran[2:] and ran[0][:2] == ("docker", "build") and ran[1] == ("docker", "push", ref)
    )
    assert str(ours.value) == str(harbors.value) == f"docker push failed for {ref}: denied\n"
