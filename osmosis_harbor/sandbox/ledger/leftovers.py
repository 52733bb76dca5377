"""Reaping what a dead owner left, on any SDK: the ledger cross-checked with the SDK's listing.

A host process killed mid-rollout or mid-prewarm (SIGKILL, OOM, a lost node) cannot terminate
its sandboxes or delete its pools; on SkyPilot they would bill until their TTL. The ledger
(``ledger/store.py``) says what each owner made; an entry whose owner is dead (``OwnerProcess.is_dead``: the
pid is gone or reused, on this host) is looked up in the SDK's ``ls`` (sandboxes) or pool
listing, removed when it is there and dropped from the ledger either way. A pool a live owner
still uses (the ledger's pool users) is not a leftover. Entries of live owners
(another server, another backend of a live process) and of other hosts are left alone. Run by
``HarborBackend`` at start and by ``python -m osmosis_harbor cleanup --env SDK``. The Docker
SDK's own labels (``docker/reap.py``) remain a second source for sandboxes the ledger never saw.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel
from tenacity import Retrying

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.ledger.store import Kind, Ledger, LedgerEntry, State, default_ledger, endpoint_for
from osmosis_harbor.sandbox.sdk import records
from osmosis_harbor.sandbox.sdk.errors import is_missing
from osmosis_harbor.sandbox.sdk.faults import ApiRetry
from osmosis_harbor.sandbox.sdk.protocol import SandboxSdk
from osmosis_harbor.sandbox.sdk.registry import load_sandbox_sdk

__all__ = ["Action", "Leftover", "reap_dead_owners"]

log = logging.getLogger(__name__)


class Action(StrEnum):
    TERMINATED = "terminated"
    DELETED = "pool deleted"
    ALREADY_GONE = "already gone (dropped from the ledger)"
    WOULD_REMOVE = "would be removed (--dry-run)"
    FAILED = "could not be removed (stays in the ledger)"


class Leftover(BaseModel):
    """One thing a dead owner left, and what was done about it."""

    kind: Kind
    name: str
    sdk: str
    owner: str  # host:pid
    state: str  # the ledger's last word on it
    action: Action
    detail: str | None = None


def _safe[T](retry: ApiRetry, call: Callable[..., T], *args: Any) -> T:
    """A blocking SDK call that is safe to retry (``sdk.faults.CALL_SAFETY``), retried."""
    return Retrying(**retry.policy())(call, *args)


def _listed(sdk: SandboxSdk, retry: ApiRetry) -> dict[str, Any]:
    """The SDK's ``ls()`` records by name."""
    return {str(records.name_of(r)): r for r in _safe(retry, sdk.ls)}


def _pool_listed(sdk: SandboxSdk, name: str, retry: ApiRetry) -> bool | None:
    """Whether the pool exists, where the SDK can list pools (the Docker SDK); None: cannot tell."""
    list_pools = getattr(sdk, "list_pools", None)
    if list_pools is None:
        return None
    return name in {records.name_of(p) for p in _safe(retry, list_pools)}


def _terminate(sdk: SandboxSdk, record: Any, retry: ApiRetry) -> None:
    """Terminate a listed sandbox: by name where the SDK offers it, else through its record."""
    by_name = getattr(sdk, "terminate_by_name", None)
    if by_name is not None:
        _safe(retry, by_name, records.name_of(record))
        return
    if getattr(record, "terminate", None) is None:
        raise ConfigError(f"sandbox {records.name_of(record)}: this SDK's ls() records cannot be terminated")
    _safe(retry, record.terminate)


def _delete_pool(sdk: SandboxSdk, name: str, retry: ApiRetry) -> bool:
    """Delete the pool; False when it was already gone."""
    try:
        _safe(retry, sdk.delete_pool, name)
    except Exception as exc:
        if is_missing(exc):
            return False
        raise
    return True


def _reap_one(
    sdk: SandboxSdk, entry: LedgerEntry, ledger: Ledger, listed: dict[str, Any], dry_run: bool, retry: ApiRetry
) -> Leftover:
    owner = f"{entry.owner.host}:{entry.owner.pid}"
    base = {"kind": entry.kind, "name": entry.name, "sdk": entry.sdk, "owner": owner, "state": entry.state}
    present = entry.name in listed if entry.kind is Kind.SANDBOX else _pool_listed(sdk, entry.name, retry)
    if present is False:
        if not dry_run:
            ledger.forget(entry.kind, entry.sdk, entry.endpoint, entry.name)
        return Leftover(**base, action=Action.ALREADY_GONE)
    if dry_run:
        detail = None if present else "if it still exists: this SDK cannot list pools"
        return Leftover(**base, action=Action.WOULD_REMOVE, detail=detail)
    try:
        if entry.kind is Kind.SANDBOX:
            _terminate(sdk, listed[entry.name], retry)
            gone = Action.TERMINATED
        else:
            gone = Action.DELETED if _delete_pool(sdk, entry.name, retry) else Action.ALREADY_GONE
    except Exception as exc:
        return Leftover(**base, action=Action.FAILED, detail=f"{type(exc).__name__}: {exc}")
    ledger.forget(entry.kind, entry.sdk, entry.endpoint, entry.name)
    return Leftover(**base, action=gone)


def _in_use(ledger: Ledger, entry: LedgerEntry) -> bool:
    """A dead owner's pool that a live owner still uses is that owner's to delete, not a leftover."""
    return entry.kind is Kind.POOL and bool(ledger.live_pool_users(entry.sdk, entry.endpoint, entry.name))


def reap_dead_owners(
    sdk_name: str, config: settings.Settings, *, ledger: Ledger | None = None, dry_run: bool = False
) -> list[Leftover]:
    """Remove (or, ``dry_run``, list) every sandbox and pool of ``sdk_name`` whose owner is dead,
    sandboxes first (a pool they were claimed from cannot be deleted before them). The SDK is
    loaded only when the ledger names something to check. ``config``: the caller's settings
    (the ledger, unless ``ledger`` is given, the SDK's endpoint, the retries)."""
    ledger = ledger or default_ledger(config)
    retry = ApiRetry.of(config)
    entries = ledger.entries(sdk=sdk_name, endpoint=endpoint_for(sdk_name, config))
    dead = [e for e in entries if e.state is not State.HANDED_OVER and e.owner.is_dead() and not _in_use(ledger, e)]
    if not dead:
        return []
    dead.sort(key=lambda e: e.kind is Kind.POOL)
    sdk = load_sandbox_sdk(sdk_name)
    listed = _listed(sdk, retry) if any(e.kind is Kind.SANDBOX for e in dead) else {}
    reaped = [_reap_one(sdk, entry, ledger, listed, dry_run, retry) for entry in dead]
    for item in reaped:
        log.warning("%s %s of dead owner %s (%s): %s", item.kind, item.name, item.owner, item.sdk, item.action)
    return reaped
