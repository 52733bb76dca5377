"""The environment's sandbox: created or claimed, and terminated, through the owner's ledger.

A mixin of ``SandboxEnvironment`` (``sandbox_environment.py``), overriding Harbor's lifecycle methods:

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
from collections.abc import Awaitable, Callable, Hashable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, override

from harbor.environments.base import BaseEnvironment
from harbor.environments.skypilot import _SANDBOX_TTL_SEC, SkypilotEnvironment, _sanitize_dns_name

from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.owner.context import SandboxOwner, current_trial, defer_termination
from osmosis_harbor.sandbox.owner.head_start import VERIFIER_SESSION_MARK
from osmosis_harbor.sandbox.owner.sandboxes import OwnedSandboxes
from osmosis_harbor.sandbox.owner.starts import SandboxStarts
from osmosis_harbor.sandbox.sdk.faults import create_checked
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk
from osmosis_harbor.sandbox.sdk.registry import SandboxImplementation
from osmosis_harbor.sandbox.transfer.archives import ArchiveTransfers
from osmosis_harbor.shim import contract

__all__ = ["SandboxLifecycle"]


class SandboxLifecycle(SkypilotEnvironment):
    """Harbor's create, claim, stop and terminate over the chosen SDK (see the module docstring)."""

    _sdk: SandboxSdk
    _sdk_name: str
    _owner: SandboxOwner
    _owns_itself: bool
    _sandboxes: OwnedSandboxes
    _pool: str | None
    _pool_base: str | None
    _generic_pool: bool
    _stopping: bool
    _baked_layout: bool
    _archive_transfers: ArchiveTransfers | None
    _known_ready: set[str]

    _impl: SandboxImplementation
    _host_network: bool

    if TYPE_CHECKING:  # ImageResolution's, later in the environment's MRO (a stub here would shadow it)

        async def prepare_image(self, force_build: bool = False) -> tuple[str | None, bool]: ...

    @property
    def uses_host_network(self) -> bool:
        """Host networking lets a local sandbox reach a server on this machine; a task that
        declares no network gets none, host networking included."""
        return self._impl.reaches_host and self._host_network and not self._network_disabled

    @override
    async def _create_sandbox(self, image: str | None) -> Any:
        """Harbor's calls its module-global ``sky_sandbox``: ours is the chosen SDK's create
        (a copy of Harbor's two calls, `_create_sandbox_via_sdk`), registered as live, and
        never leaves a sandbox behind when cancelled mid-create. A separate verifier takes its
        trial's head-started sandbox when there is one (``head_start.py``); an agent's sandbox,
        once up, gives its trial's verifier that head start."""
        trial = current_trial()
        head = trial.head_start if trial is not None else None
        created = await head.take(self.session_id, self._create_shape(image)) if head is not None else None
        if created is None:
            name, sandbox = await self._create_named(self._sandbox_name, image)
            ready: frozenset[str] = frozenset()
        else:
            name, sandbox, ready = created
        self._sandbox_name = name
        self._archive_transfers = None
        self._known_ready = (set(contract.LAYOUT_DIRS) if self._baked_layout else set()) | ready
        if head is not None and not head.begun and VERIFIER_SESSION_MARK not in self.session_id and not self._pool:
            # A pool claim is sub-second already; a head start would hold a warm member idle.
            head.begin(self.session_id, self._create_shape(image), lambda: self._head_start(image), self._sandboxes.end)
        return sandbox

    async def _head_start(self, image: str | None) -> tuple[str, Any, frozenset[str]]:
        """The verifier's sandbox for this trial (``head_start.py``), its agent workdir emptied."""
        name, sandbox = await self._create_named(
            _sanitize_dns_name(f"hb-{self.session_id}{VERIFIER_SESSION_MARK}head"), image
        )
        workdir = self.task_env_config.workdir or self._workdir
        if not workdir or PurePosixPath(workdir) == PurePosixPath("/"):
            return name, sandbox, frozenset()
        dirs = [str(PurePosixPath(workdir))]
        try:
            argv = self._exec_argv(self._empty_dirs_command(dirs, chmod=True), self._reset_dirs_user())
            handle = await sandbox.exec.aio(*argv, timeout_seconds=120, env=self._merge_env(None) or None)
            emptied = await handle.wait() == 0
        except Exception as exc:  # the verifier empties it itself, as without a head start
            self.logger.debug(f"head start: emptying {dirs} failed early ({exc}); the verifier will")
            emptied = False
        return name, sandbox, frozenset(dirs) if emptied else frozenset()

    async def _create_named(self, name: str, image: str | None) -> tuple[str, Any]:
        """Create (or claim) sandbox ``name`` through the owner's registry and ledger; returns
        the name it goes by (a batch claim's member name) and its handle."""
        sandboxes = self._sandboxes
        await sandboxes.pending(name, self._sdk, self._sdk_name)  # ledger first
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
        env = tuple(sorted((self._persistent_env or {}).items()))
        memory = self._effective_memory_mb
        return (
            image,
            self._pool,
            self._pool_base,
            self._generic_pool,
            self._context_name,
            self._namespace,
            env,
            tuple(self._secrets or ()),
            self._effective_cpus,
            memory,
            self._registry,
            self._network_disabled,
            self.uses_host_network,
        )

    async def _bounded_create(self, image: str | None, name: str) -> Any:
        """The SDK's create, or a pool claim, inside the start bound of whoever submitted this
        trial; each call retried after an API fault only as ``create_checked`` allows."""
        starts = self._owner.starts
        if not self._pool:
            return await create_checked(
                self._sdk, name, lambda: _in_slot(starts, lambda: self._create_fresh(image, name))
            )
        try:
            sandbox, fell_back = await pools.claim(self._claim_request(starts, name))
        except pools.MissingPoolError as missing:
            if missing.generic or not self._pool_base:
                raise
            sandbox, fell_back = await self._claim_named_pool(starts, name, missing)
        if starts is not None:
            starts.note_claim(self._pool, fell_back=fell_back)
        return sandbox

    async def _claim_named_pool(
        self, starts: SandboxStarts | None, name: str, missing: pools.MissingPoolError
    ) -> tuple[Any, bool]:
        """No group pool was prewarmed: claim from the pool the user named, as Harbor does (its
        image is the pool's own, generic, and ``environment/`` is uploaded after the start); if
        that pool does not exist either, the group pool's error, which names both, stands."""
        if not self._enable_environment_dir_upload:  # Harbor's rule: a generic pool needs the upload
            raise missing
        group, base = self._pool, self._pool_base
        self._pool, self._generic_pool = base, True
        try:
            claimed = await pools.claim(self._claim_request(starts, name))
        except pools.MissingPoolError:
            self._pool, self._generic_pool = group, False
            raise missing from None
        self.logger.warning(
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
        assert self._pool is not None
        pool, common = self._pool, self._create_keywords(name)
        batches = starts.batches if starts is not None else None

        async def attempt() -> Any:
            if batches is not None:
                return await batches.claim(self._sdk, pool, name, {k: v for k, v in common.items() if k != "name"})
            # A pool launch inherits image/cpu/memory/network from the pool.
            return await _in_slot(starts, lambda: self._sdk.create.aio(pool=pool, **common))

        async def cold_create() -> Any:
            image, _ = await self.prepare_image()
            return await _in_slot(starts, lambda: self._create_fresh(image, name))

        return pools.ClaimRequest(
            sdk=self._sdk,
            pool=pool,
            name=name,
            attempt=attempt,
            fallback=None if self._generic_pool else cold_create,
            base=self._pool_base,
            generic=self._generic_pool,
        )

    async def _adopt_name(self, name: str, sandbox: Any) -> str:
        """A batch claim names its members from a prefix of its own (``batching``): from here
        on this sandbox goes by its member's name (in the registry and the ledger too)."""
        actual = getattr(sandbox, "name", None)  # a fake SDK's handle may have none: keep ours
        if isinstance(actual, str) and actual != name:
            await self._sandboxes.rename(name, actual)
            return actual
        return name

    def _create_keywords(self, name: str) -> dict[str, Any]:
        """What Harbor's two create calls share (a copy of its keywords, the SDK swapped in)."""
        common: dict[str, Any] = {
            "name": name,
            "context_name": self._context_name,
            "namespace": self._namespace,
            "env": self._persistent_env or None,
            "secrets": self._secrets,
            "timeout": _SANDBOX_TTL_SEC,
        }
        if self.uses_host_network:
            common["host_network"] = True
        return common

    async def _create_fresh(self, image: str | None, name: str) -> Any:
        """Harbor's create of a sandbox from ``image`` (not from a pool)."""
        memory_gb = self._effective_memory_mb / 1024 if self._effective_memory_mb is not None else None
        return await self._sdk.create.aio(
            image=image,
            cpus=self._effective_cpus,
            memory_gb=memory_gb,
            registry=self._registry,
            block_network=self._network_disabled,
            **self._create_keywords(name),
        )

    @override
    async def _upload_environment_dir_after_start(self) -> None:
        """Upload ``environment/`` only where a plain start would, or into a generic pool.

        Harbor ships ``environment/`` into every pool launch because SkyPilot pool images are
        generic. Ours are not: a group pool is per environment group, and the group key
        includes this environment's content hash, so the pool's image is the very image a
        plain start of this task uses; the upload (a ``pwd`` probe and a directory transfer
        per trial) would only repeat what the image holds. A generic pool (a task with no
        environment definition) gets Harbor's own upload."""
        if self._generic_pool:
            await super()._upload_environment_dir_after_start()
        else:
            await BaseEnvironment._upload_environment_dir_after_start(self)

    @override
    async def stop(self, delete: bool) -> None:
        """Harbor's stop, after dropping uploads staged for a sandbox that is going away and
        marking the stop as ours (a failure from here on is not a lost sandbox)."""
        self._stopping = True
        if self._archive_transfers is not None:
            dropped = self._archive_transfers.discard()
            if dropped:
                self.logger.debug(f"{dropped} staged upload(s) not sent: the sandbox is stopping")
            self._archive_transfers = None
        await super().stop(delete)
        if self._owns_itself:  # no backend sweeps after it: a failed terminate gets its last try here
            for failure in await self._owner.close():
                self.logger.warning(f"could not terminate sandbox {failure} (it stays in the ledger)")

    @override
    async def _terminate_sandbox(self) -> None:  # type: ignore[override]  # Harbor's is tenacity-wrapped
        """Through the owner's registry (``OwnedSandboxes.end``): retried on API faults, and a
        failure is never forgotten (retried in the background, by the shutdown sweep, and kept
        in the ledger). In the background inside a trial's scope (``context.trial_scope``: its
        owner settles it before reporting), inline otherwise."""
        self._require_sandbox()
        sandboxes, name = self._sandboxes, self._sandbox_name
        if not sandboxes.registered(name):
            await self._adopt_held_handle(name)
        if not defer_termination(lambda: sandboxes.end(name)):
            await sandboxes.end(name)

    async def _adopt_held_handle(self, name: str) -> None:
        """A handle that reached ``_sandbox`` without our create (set by a caller, as Harbor's own
        tests and tools may): Harbor's stop terminates what it holds, so it joins the owner's
        ledger and registry and is ended like ours, a failure kept and retried, never dropped."""
        self.logger.warning(f"sandbox {name} was not created through this owner: recording it, then terminating it")
        await self._sandboxes.pending(name, self._sdk, self._sdk_name)
        await self._sandboxes.attach(name, self._sandbox)


async def _in_slot(starts: SandboxStarts | None, call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()`` holding one of the submitter's start slots (unbounded without a submitter)."""
    if starts is None:
        return await call()
    async with starts.slot():
        return await call()
