"""The conformance suite's machinery: the run context, the check registry, assertions."""

from __future__ import annotations

import asyncio
import inspect
import logging
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NoReturn

from pydantic import BaseModel, computed_field

from osmosis_harbor.sandbox.conformance.capabilities import Capabilities, probe
from osmosis_harbor.sandbox.owner.context import SandboxOwner
from osmosis_harbor.sandbox.sdk.errors import is_missing
from osmosis_harbor.sandbox.sdk.registry import name_of
from osmosis_harbor.settings import Settings

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SEC = 180.0
NON_ROOT_USER = "sbcheck"
LARGE_FILE_BYTES = 20 * 1024 * 1024


class CheckStatus(StrEnum):
    """How a check ended. Only ``passed`` is a pass: the others are reported apart.

    ``skipped``: the check applies to this SDK but did not run (deselected, or a setting it
    needs is missing); ``--strict`` fails on it. ``not_applicable``: the SDK does not offer the
    capability the check is about (its capability set says so), so there is nothing to prove.
    """

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOT_APPLICABLE = "not_applicable"


class CheckResult(BaseModel):
    """Outcome of one check: what a CLI prints and a test asserts on. An assumption check (one
    of what our code assumes of an SDK whose docs are silent) also says whether it ``held``; it
    passes when our code survives what was seen either way, and fails when it would not."""

    name: str
    status: CheckStatus
    detail: str
    seconds: float
    assumption: str | None = None
    held: bool | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """True only for a check that ran and passed (never for a skipped one)."""
        return self.status is CheckStatus.PASSED


class CheckSkipped(Exception):
    """Raised by a check that applies to this SDK but cannot run here (see `skip`)."""


def skip(reason: str) -> NoReturn:
    """End the running check as skipped, saying what it would need to run."""
    raise CheckSkipped(reason)


@dataclass(frozen=True)
class Observation:
    """What an assumption check saw: whether the assumption ``held``, and what happened."""

    held: bool
    detail: str


@dataclass
class ExecOutcome:
    """A finished command, read the way Harbor reads it."""

    code: int | None
    stdout: str
    stderr: str
    seconds: float


async def read_output(stream: Any) -> str:
    """Harbor accepts ``read()`` returning str or bytes, sync or awaitable: so do we."""
    data = stream.read()
    if inspect.isawaitable(data):
        data = await data
    if isinstance(data, (bytes, bytearray)):
        return bytes(data).decode("utf-8", errors="replace")
    return data or ""


def field_of(obj: Any, name: str) -> Any:
    """Records may be objects or mappings depending on the implementation."""
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


@dataclass
class ConformanceContext:
    """Shared state for a run: the SDK, the image, and everything created (for cleanup)."""

    sdk: Any
    image: str
    settings: Settings  # the run's, read once by its command (``sandbox check``) or test
    prefix: str = field(default_factory=lambda: f"sbchk-{uuid.uuid4().hex[:6]}")
    # The run's owner: the environments its checks make are its, and so are its pools, in the
    # ledger before they exist (a run killed mid-way leaves nothing ``cleanup`` cannot find).
    owner: SandboxOwner = field(init=False)
    _sandboxes: list[Any] = field(default_factory=list)
    _pools: list[str] = field(default_factory=list)
    _shared: Any | None = None
    _shared_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _capabilities: Capabilities | None = None

    def __post_init__(self) -> None:
        self.owner = SandboxOwner.make("sandbox-check", config=self.settings)

    def on_close(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        """Run ``cleanup`` when the run ends (environment-level checks stop what they start)."""
        self._cleanups.append(cleanup)

    def unique(self, stem: str) -> str:
        """A DNS-1123 name unique to this run (prefix 12 + stem + 6 hex stays under 53)."""
        return f"{self.prefix}-{stem[:28]}-{uuid.uuid4().hex[:6]}"

    async def new_sandbox(self, stem: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", 900)
        if "pool" not in kwargs:
            kwargs.setdefault("image", self.image)
        sandbox = await self.sdk.create.aio(name=self.unique(stem), **kwargs)
        self._sandboxes.append(sandbox)
        return sandbox

    async def shared(self) -> Any:
        """One long-lived sandbox for checks that do not care about isolation (fast), with the
        directories the file checks write into made first (a write makes no parent directory
        on SkyPilot; its own examples ``mkdir -p`` before writing)."""
        async with self._shared_lock:
            if self._shared is None:
                sandbox = await self.new_sandbox("shared")
                made = await self.run(sandbox, "mkdir", "-p", "/tmp/sbchk/perm")
                expect(made.code == 0, f"mkdir -p /tmp/sbchk/perm in the sandbox exited {made.code}: {made.stderr}")
                self._shared = sandbox
            return self._shared

    async def capabilities(self) -> Capabilities:
        """The SDK's capability set, probed once per run on the shared sandbox."""
        if self._capabilities is None:
            try:
                handle, error = await self.shared(), None
            except Exception as exc:  # noqa: BLE001 - reported as "unknown", and by the checks
                handle, error = None, f"{type(exc).__name__}: {exc}"
            self._capabilities = probe(self.sdk, handle, handle_error=error)
        return self._capabilities

    async def track_pool(self, name: str) -> None:
        """Before ``create_pool``: the pool goes into the ledger (for a registered SDK) and is
        deleted when the run ends."""
        self._pools.append(name)
        sdk_name = name_of(self.sdk)
        if sdk_name is not None:
            await self.owner.sandboxes.pool_pending(name, sdk_name)

    async def run(
        self,
        sandbox: Any,
        *argv: str,
        workdir: str | None = None,
        timeout: int | None = 60,
        env: dict[str, str] | None = None,
    ) -> ExecOutcome:
        started = time.monotonic()
        handle = await sandbox.exec.aio(*argv, workdir=workdir, timeout_seconds=timeout, env=env)
        code = await handle.wait()
        return ExecOutcome(
            code=code,
            stdout=await read_output(handle.stdout),
            stderr=await read_output(handle.stderr),
            seconds=time.monotonic() - started,
        )

    async def sh(self, sandbox: Any, script: str, **kwargs: Any) -> ExecOutcome:
        return await self.run(sandbox, "sh", "-c", script, **kwargs)

    async def close(self) -> None:
        """Best effort: a failing cleanup must not hide the check results."""
        for cleanup in reversed(self._cleanups):
            try:
                await cleanup()
            except Exception as exc:  # noqa: BLE001 - cleanup is best effort
                log.warning("conformance cleanup failed: %s", exc)
        self._cleanups.clear()
        for sandbox in self._sandboxes:
            try:
                await sandbox.terminate.aio(wait=True)
            except Exception as exc:  # noqa: BLE001 - cleanup is best effort
                log.warning("conformance cleanup: terminate %s failed: %s", getattr(sandbox, "name", "?"), exc)
        sdk_name = name_of(self.sdk)
        for pool in dict.fromkeys(self._pools):
            try:
                await self.sdk.delete_pool.aio(pool)
            except Exception as exc:  # noqa: BLE001 - a check may already have deleted it
                if not is_missing(exc):
                    log.warning("conformance cleanup: delete_pool %s: %s (it stays in the ledger)", pool, exc)
                    continue
            if sdk_name is not None:
                await self.owner.sandboxes.pool_gone(pool, sdk_name)
        await self.owner.close()
        self._sandboxes.clear()
        self._pools.clear()
        self._shared = None


CheckFn = Callable[[ConformanceContext], Awaitable[Any]]  # a detail str, or an Observation


@dataclass(frozen=True)
class Check:
    """A registered check. ``needs``: the capabilities (`Capabilities`) it is about; on an SDK
    that definitely lacks one, the check is not applicable and does not run. ``assumption``:
    what our code assumes of the SDK, which the check observes (it returns an `Observation`)."""

    name: str
    fn: CheckFn
    pools: bool = False
    needs: tuple[str, ...] = ()
    assumption: str | None = None

    @property
    def description(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


CHECKS: list[Check] = []


def check(
    *, pools: bool = False, needs: tuple[str, ...] = (), assumption: str | None = None
) -> Callable[[CheckFn], CheckFn]:
    """Register a check; its function name (minus ``check_``) is the check's name. A pool
    check needs the ``pools`` capability."""

    def register(fn: CheckFn) -> CheckFn:
        required = ("pools", *needs) if pools else needs
        name = fn.__name__.removeprefix("check_")
        CHECKS.append(Check(name=name, fn=fn, pools=pools, needs=required, assumption=assumption))
        return fn

    return register


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


async def expect_raises(awaitable: Awaitable[Any], what: str) -> BaseException:
    try:
        await awaitable
    except Exception as exc:  # noqa: BLE001 - the class is what we report
        return exc
    raise AssertionError(f"{what}: expected an exception, none raised")


async def poll(predicate: Callable[[], Awaitable[bool]], *, timeout: float, what: str) -> float:
    """Wait for *predicate* with a deadline; returns the seconds it took."""
    started = time.monotonic()
    delay = 0.05
    while not await predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not true after {timeout:.0f}s")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    return time.monotonic() - started


async def ensure_user(ctx: ConformanceContext, sandbox: Any) -> None:
    script = (
        f"id -u {NON_ROOT_USER} >/dev/null 2>&1 || useradd -m {NON_ROOT_USER} 2>/dev/null || "
        f"(echo '{NON_ROOT_USER}:x:4321:4321::/tmp:/bin/sh' >> /etc/passwd && "
        f"echo '{NON_ROOT_USER}:x:4321:' >> /etc/group)"
    )
    out = await ctx.sh(sandbox, script)
    expect(out.code == 0, f"could not create user {NON_ROOT_USER}: {out.stderr[:200]}")


def as_user(user: str, command: str) -> list[str]:
    """Exactly Harbor's argv for a non-default user (SkypilotEnvironment._exec_argv)."""
    return ["su", "-s", "/bin/bash", user, "-c", f"bash -c {shlex.quote(command)}"]
