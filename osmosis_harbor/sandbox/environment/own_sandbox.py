"""The environment's sandbox: created or claimed, and terminated, through the owner's ledger.

What ours do in place of Harbor's lifecycle methods:

* Harbor's ``_create_sandbox`` calls its module-global ``sky_sandbox``; ours calls the chosen
  SDK (a copy of Harbor's two create calls, plus host networking), inside the submitter's
  start bound (``starts.py``), with the sandbox in the owner's registry and ledger
  (``sandboxes.OwnedSandboxes``) *before* the create call;
* a create that fails or is cancelled never leaves a sandbox behind: ``ls`` decides whether it
  was made, and the ledger keeps it until then;
* a pool claim goes through ``pools.claim`` (batched when the submitter batches claims): one the
  pool cannot serve is tried again, then becomes a cold create of the pool's image, this
  environment's own (``health()`` counts these fallbacks);
* a terminate is retried on API faults and never forgotten (``owner/sandboxes.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from osmosis_harbor.harbor_compat.skypilot_names import SANDBOX_TTL_SEC, sanitize_dns_name
from osmosis_harbor.sandbox.environment.routes import takes_exec_archives
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import Role, TrialContext
from osmosis_harbor.sandbox.owner.head_start import VERIFIER_SESSION_MARK
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, create_checked
from osmosis_harbor.settings import Settings
from osmosis_harbor.shim import contract

__all__ = ["CreateSpec", "SandboxCreator", "SandboxPlan", "WorkdirReset"]


@dataclass(frozen=True)
class SandboxPlan:
    """What this environment's sandbox is made from and by whom, decided at init."""

    session_id: str
    sdk_name: str
    pool_base: str | None  # the user's pool name: a task claims its environment group's pool
    baked_layout: bool  # the image holds Harbor's log dirs empty and 0777 (``contract.LAYOUT_DIRS``)
    environment_upload: bool  # Harbor's ``_enable_environment_dir_upload``: a generic pool needs it


@dataclass(frozen=True)
class CreateSpec:
    """Harbor's create keywords but name, image and pool, as they stand when a sandbox is made."""

    context_name: str | None
    namespace: str | None
    env: tuple[tuple[str, str], ...]  # the trial's persistent env
    secrets: tuple[str, ...] | None
    cpus: float | None
    memory_mb: int | None
    registry: str | None
    block_network: bool
    host_network: bool


@dataclass(frozen=True)
class WorkdirReset:
    """How Harbor empties the agent's workdir, for a verifier's head-started sandbox: its
    empty-dirs command of that dir as an exec argv, with Harbor's exec env (None: no workdir
    to empty)."""

    workdir: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


class SandboxCreator:
    """Harbor's create, claim and terminate over the chosen SDK (see the module docstring): the
    provisioner of one environment's sandbox, through its trial context's owner and ledger."""

    def __init__(
        self,
        state: EnvironmentState,
        context: TrialContext,
        plan: SandboxPlan,
        prepare_image: Callable[[], Awaitable[tuple[str | None, bool]]],
        logger: logging.Logger,
        current: Settings,
    ) -> None:
        self._settings = current
        self._retry = ApiRetry.of(current)
        self._state = state
        self._context = context
        self._owner = context.owner
        self._plan = plan
        self._prepare_image = prepare_image
        self._logger = logger
        self._spec: CreateSpec | None = None  # frozen at the start (`create`)

    @property
    def owns_itself(self) -> bool:
        """Made outside every owner: its owner is its own, closed at stop."""
        return self._context.owns_itself

    async def create(
        self, image: str | None, spec: CreateSpec, reset: WorkdirReset | None
    ) -> tuple[Any, frozenset[str]]:
        """Harbor's calls its module-global ``sky_sandbox``: ours is the chosen SDK's create
        (a copy of Harbor's two calls, `_create_fresh` and the pool claim), registered as live,
        and never leaves a sandbox behind when cancelled mid-create. A separate verifier takes
        its trial's head-started sandbox when there is one (``head_start.py``); an agent's
        sandbox, once up, gives its trial's verifier that head start (``reset``: how it empties
        the agent's workdir there). Returns the handle and the dirs known ready in it."""
        state, agent = self._state, self._context.role is Role.AGENT
        self._spec = spec
        head = self._context.head_start
        created = await head.take(self._create_shape(image)) if head is not None and not agent else None
        if created is None:
            name, sandbox = await self._create_named(state.name, image)
            ready: frozenset[str] = frozenset()
        else:
            name, sandbox, ready = created
        state.name = name
        if self._plan.baked_layout:
            ready |= frozenset(contract.LAYOUT_DIRS)
        if head is not None and not head.begun and agent and not state.pool:
            # A pool claim is sub-second already; a head start would hold a warm member idle.
            session_id, shape = self._plan.session_id, self._create_shape(image)
            head.begin(session_id, shape, lambda: self._head_start(image, reset), self._owner.sandboxes.end)
        return sandbox, ready

    async def _head_start(self, image: str | None, reset: WorkdirReset | None) -> tuple[str, Any, frozenset[str]]:
        """The verifier's sandbox for this trial (``head_start.py``), its agent workdir emptied."""
        name, sandbox = await self._create_named(
            sanitize_dns_name(f"hb-{self._plan.session_id}{VERIFIER_SESSION_MARK}head"), image
        )
        if reset is None:
            return name, sandbox, frozenset()
        if takes_exec_archives(sandbox, self._settings):  # the verifier's own emptying rides its first upload there
            return name, sandbox, frozenset()
        dirs = [reset.workdir]
        try:
            handle = await sandbox.exec.aio(*reset.argv, timeout_seconds=120, env=dict(reset.env) or None)
            emptied = await handle.wait() == 0
        except Exception as exc:  # the verifier empties it itself, as without a head start
            self._logger.debug(f"head start: emptying {dirs} failed early ({exc}); the verifier will")
            emptied = False
        return name, sandbox, frozenset(dirs) if emptied else frozenset()

    async def _create_named(self, name: str, image: str | None) -> tuple[str, Any]:
        """Create (or claim) sandbox ``name`` through the owner's registry and ledger; returns
        the name it goes by (a batch claim's member name) and its handle."""
        sandboxes = self._owner.sandboxes
        await sandboxes.pending(name, self._state.sdk, self._plan.sdk_name)  # ledger first
        creating = asyncio.ensure_future(self._bounded_create(image, name))
        try:
            sandbox = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # Cancelled mid-create (a cancelled rollout, Ctrl-C, shutdown): let the create
            # finish and terminate what it made, so no sandbox outlives the cancellation.
            with contextlib.suppress(Exception):
                await sandboxes.attach(name, await creating)
            await asyncio.shield(sandboxes.settle_failed_create(name))
            raise
        except Exception:  # it may have been made all the same: ls decides, the ledger keeps it until then
            await sandboxes.settle_failed_create(name)
            raise
        name = await self._adopt_name(name, sandbox)
        await sandboxes.attach(name, sandbox)
        return name, sandbox

    def _create_shape(self, image: str | None) -> Hashable:
        """Everything a create is made with but its name: a head start serves only a verifier
        that would have created exactly this."""
        state = self._state
        return (image, state.pool, self._plan.pool_base, state.generic_pool, self._spec)

    async def _bounded_create(self, image: str | None, name: str) -> Any:
        """The SDK's create, or a pool claim, inside the start bound of whoever submitted this
        trial; each call retried after an API fault only as ``create_checked`` allows."""
        state, starts = self._state, self._owner.starts
        if not state.pool:
            return await create_checked(
                state.sdk, name, lambda: _in_slot(starts, lambda: self._create_fresh(image, name)), self._retry
            )
        try:
            sandbox, fell_back = await pools.claim(self._claim_request(starts, name))
        except pools.MissingPoolError as missing:
            if missing.generic or not self._plan.pool_base:
                raise
            sandbox, fell_back = await self._claim_named_pool(starts, name, missing)
        if starts is not None:
            starts.note_claim(state.pool, fell_back=fell_back)
        return sandbox

    async def _claim_named_pool(
        self, starts: SandboxStarts | None, name: str, missing: pools.MissingPoolError
    ) -> tuple[Any, bool]:
        """No group pool was prewarmed: claim from the pool the user named, as Harbor does (its
        image is the pool's own, generic, and ``environment/`` is uploaded after the start); if
        that pool does not exist either, the group pool's error, which names both, stands."""
        if not self._plan.environment_upload:  # Harbor's rule: a generic pool needs the upload
            raise missing
        state = self._state
        group, base = state.pool, self._plan.pool_base
        state.pool, state.generic_pool = base, True
        try:
            claimed = await pools.claim(self._claim_request(starts, name))
        except pools.MissingPoolError:
            state.pool, state.generic_pool = group, False
            raise missing from None
        self._logger.warning(
            "warm pool %s (this task's environment group) does not exist: claimed from pool %s, as "
            "Harbor does; the sandbox runs that pool's image with environment/ uploaded, not the "
            "task's own image (prewarm with --pool %s to claim the task's image instead)",
            group,
            base,
            base,
        )
        return claimed

    def _claim_request(self, starts: SandboxStarts | None, name: str) -> pools.ClaimRequest:
        """A claim from this environment's pool: batched when the submitter batches claims (the
        batch call takes the start slot), and falling back to a cold create of the pool's image,
        this environment's own, unless the pool is a generic one."""
        state = self._state
        assert state.pool is not None
        pool, common, sdk = state.pool, self._create_keywords(name), state.sdk
        batches = starts.batches if starts is not None else None

        async def attempt() -> Any:
            if batches is not None:
                return await batches.claim(
                    sdk, pool, name, {k: v for k, v in common.items() if k != "name"}, self._retry
                )
            # A pool launch inherits image/cpu/memory/network from the pool.
            return await _in_slot(starts, lambda: sdk.create.aio(pool=pool, **common))

        async def cold_create() -> Any:
            image, _ = await self._prepare_image()
            return await _in_slot(starts, lambda: self._create_fresh(image, name))

        return pools.ClaimRequest(
            sdk=sdk,
            pool=pool,
            name=name,
            attempt=attempt,
            fallback=None if state.generic_pool else cold_create,
            base=self._plan.pool_base,
            generic=state.generic_pool,
            wait_sec=self._settings.pool_claim_wait_sec,
            retry=self._retry,
        )

    async def _adopt_name(self, name: str, sandbox: Any) -> str:
        """A batch claim names its members from a prefix of its own (``batching``): from here
        on this sandbox goes by its member's name (in the registry and the ledger too)."""
        actual = getattr(sandbox, "name", None)  # a fake SDK's handle may have none: keep ours
        if isinstance(actual, str) and actual != name:
            await self._owner.sandboxes.rename(name, actual)
            return actual
        return name

    def _create_keywords(self, name: str) -> dict[str, Any]:
        """What Harbor's two create calls share (a copy of its keywords, the SDK swapped in)."""
        spec = self._spec
        assert spec is not None
        common: dict[str, Any] = {
            "name": name,
            "context_name": spec.context_name,
            "namespace": spec.namespace,
            "env": dict(spec.env) or None,
            "secrets": list(spec.secrets) if spec.secrets else None,
            "timeout": SANDBOX_TTL_SEC,
        }
        if spec.host_network:
            common["host_network"] = True
        return common

    async def _create_fresh(self, image: str | None, name: str) -> Any:
        """Harbor's create of a sandbox from ``image`` (not from a pool)."""
        spec = self._spec
        assert spec is not None
        return await self._state.sdk.create.aio(
            image=image,
            cpus=spec.cpus,
            memory_gb=spec.memory_mb / 1024 if spec.memory_mb is not None else None,
            registry=spec.registry,
            block_network=spec.block_network,
            **self._create_keywords(name),
        )

    async def after_stop(self) -> None:
        """An environment that owns itself has no backend sweeping after it: a failed
        terminate gets its last try here."""
        if self._context.owns_itself:
            for failure in await self._owner.close():
                self._logger.warning(f"could not terminate sandbox {failure} (it stays in the ledger)")

    async def terminate(self) -> None:
        """Through the owner's registry (``OwnedSandboxes.end``): retried on API faults, and a
        failure is never forgotten (retried in the background, by the shutdown sweep, and kept
        in the ledger). In the background inside a trial's scope (``context.trial_scope``: its
        owner holds it past the rollout's result, ``SandboxOwner.settle_later``), inline otherwise."""
        sandboxes, name = self._owner.sandboxes, self._state.name
        if not sandboxes.registered(name):
            await self._adopt_held_handle(name)
        if not self._context.defer_termination(lambda: sandboxes.end(name)):
            await sandboxes.end(name)

    async def _adopt_held_handle(self, name: str) -> None:
        """A handle that reached ``_sandbox`` without our create (set by a caller, as Harbor's own
        tests and tools may): Harbor's stop terminates what it holds, so it joins the owner's
        ledger and registry and is ended like ours, a failure kept and retried, never dropped."""
        self._logger.warning(f"sandbox {name} was not created through this owner: recording it, then terminating it")
        await self._owner.sandboxes.pending(name, self._state.sdk, self._plan.sdk_name)
        await self._owner.sandboxes.attach(name, self._state.sandbox)


async def _in_slot(starts: SandboxStarts | None, call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()`` holding one of the submitter's start slots (unbounded without a submitter)."""
    if starts is None:
        return await call()
    async with starts.slot():
        return await call()
