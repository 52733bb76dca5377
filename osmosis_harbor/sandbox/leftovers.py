"""Reaping what a dead owner left, on any SDK: the ledger cross-checked with the SDK's listing.

A host process killed mid-rollout or mid-prewarm (SIGKILL, OOM, a lost node) cannot terminate
its sandboxes or delete its pools; on SkyPilot they would bill until their TTL. The ledger
(``ledger.py``) says what each owner made; an entry whose owner is dead (``Owner.is_dead``: the
pid is gone or reused, on this host) is looked up in the SDK's ``ls`` (sandboxes) or pool
listing, removed when it is there and dropped from the ledger either way. Entries of live owners
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
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.api_faults import is_api_fault
from osmosis_harbor.sandbox.ledger import Kind, Ledger, LedgerEntry, default_ledger, endpoint_for
from osmosis_harbor.sandbox.protocol import SandboxSdk
from osmosis_harbor.sandbox.registry import load_sandbox_sdk

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


def _safe[T](call: Callable[..., T], *args: Any) -> T:
    """A blocking SDK call that is safe to retry (``api_faults.CALL_SAFETY``), retried."""
    current = settings.current()
    retrying = Retrying(
        retry=retry_if_exception(is_api_fault),
        stop=stop_after_attempt(current.api_attempts),
        wait=wait_random_exponential(multiplier=0.2, max=current.api_retry_max_wait),
        reraise=True,
    )
    return retrying(call, *args)


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def _sandbox_names(sdk: SandboxSdk) -> set[str]:
    return {str(_field(r, "name")) for r in _safe(sdk.ls)}


def _pool_exists(sdk: SandboxSdk, name: str) -> bool:
    list_pools = getattr(sdk, "list_pools", None)
    if list_pools is not None:
        return name in {str(_field(p, "name")) for p in _safe(list_pools)}
    try:
        _safe(sdk.get_pool, name)
    except LookupError:
        return False
    return True


def _terminate(sdk: SandboxSdk, name: str) -> None:
    by_name = getattr(sdk, "terminate_by_name", None)
    if by_name is not None:
        _safe(by_name, name)
        return
    for record in _safe(sdk.ls):
        if _field(record, "name") == name and hasattr(record, "terminate"):
            _safe(record.terminate)
            return
    raise ConfigError(f"sandbox {name}: this SDK offers no way to terminate a sandbox by name; remove it by hand")


def _reap_one(sdk: SandboxSdk, entry: LedgerEntry, ledger: Ledger, present: bool, dry_run: bool) -> Leftover:
    owner = f"{entry.owner.host}:{entry.owner.pid}"
    base = {"kind": entry.kind, "name": entry.name, "sdk": entry.sdk, "owner": owner, "state": entry.state}
    if not present:
        if not dry_run:
            ledger.forget(entry.kind, entry.sdk, entry.endpoint, entry.name)
        return Leftover(**base, action=Action.ALREADY_GONE)
    if dry_run:
        return Leftover(**base, action=Action.WOULD_REMOVE)
    try:
        if entry.kind is Kind.SANDBOX:
            _terminate(sdk, entry.name)
        else:
            _safe(sdk.delete_pool, entry.name)
    except Exception as exc:
        return Leftover(**base, action=Action.FAILED, detail=f"{type(exc).__name__}: {exc}")
    ledger.forget(entry.kind, entry.sdk, entry.endpoint, entry.name)
    return Leftover(**base, action=Action.TERMINATED if entry.kind is Kind.SANDBOX else Action.DELETED)


def reap_dead_owners(sdk_name: str, *, ledger: Ledger | None = None, dry_run: bool = False) -> list[Leftover]:
    """Remove (or, ``dry_run``, list) every sandbox and pool of ``sdk_name`` whose owner is dead.
    The SDK is loaded only when the ledger names something to check."""
    ledger = ledger or default_ledger()
    dead = [e for e in ledger.entries(sdk=sdk_name, endpoint=endpoint_for(sdk_name)) if e.owner.is_dead()]
    if not dead:
        return []
    sdk = load_sandbox_sdk(sdk_name)
    names = _sandbox_names(sdk) if any(e.kind is Kind.SANDBOX for e in dead) else set()
    reaped = []
    for entry in dead:
        present = entry.name in names if entry.kind is Kind.SANDBOX else _pool_exists(sdk, entry.name)
        reaped.append(_reap_one(sdk, entry, ledger, present, dry_run))
    for item in reaped:
        log.warning("%s %s of dead owner %s (%s): %s", item.kind, item.name, item.owner, item.sdk, item.action)
    return reaped
