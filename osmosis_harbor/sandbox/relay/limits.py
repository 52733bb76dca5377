"""What the policy relay admits: connections per sandbox, calls and buffered bodies per rollout.

Every sandbox shares one relay, and a policy under training is root in its sandbox, so no one
sandbox or rollout may use the relay up. Each shared resource (connections, the bytes of
request bodies held while they arrive) has a bound per holder and a total, and the last part
of the total (the *reserve*) goes only to holders that hold little: a sandbox with fewer than
``LIGHT_SOURCE_CONNECTIONS`` connections, a rollout holding no other body. So however many
sandboxes flood, one that chats normally still gets in, and a refusal says whose fault it is:
``OWN`` (the holder is over its bound, or greedy while the relay is busy) or ``INFRA`` (the
relay is full through no fault of this one; the rollout's outcome becomes an ``internal_error``).

State here is the relay loop's own (one thread): no locks.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import Enum

from osmosis_harbor.errors import ConfigError

__all__ = ["LIGHT_SOURCE_CONNECTIONS", "RELAY_FULL", "Blame", "Refusal", "RelayAdmission", "RelayLimits"]

# A sandbox holding fewer connections than this may still use the reserve: a rollout's client
# holds one or two (a call and a kept-alive one), and a few more for parallel calls.
LIGHT_SOURCE_CONNECTIONS = 4
# Connections beyond the total, from light sandboxes only, each held just long enough to read its
# request head and answer 503 to its rollout; beyond these, a connection is closed unanswered.
MAX_OVERFLOW_CONNECTIONS = 64
RELAY_FULL = "relay_full"  # the kind of refusal a connection is still answered with


@dataclass(frozen=True)
class RelayLimits:
    """The relay's bounds (``Settings.relay_*``; the README's Settings table says each)."""

    max_request_bytes: int = 32 * 2**20
    max_response_bytes: int = 64 * 2**20
    timeout_sec: float = 900.0
    max_connections: int = 1024
    reserved_connections: int = 128
    max_source_connections: int = 32
    max_token_calls: int = 16
    max_buffered_bytes: int = 256 * 2**20
    max_token_buffered_bytes: int = 64 * 2**20
    header_timeout_sec: float = 10.0
    body_timeout_sec: float = 30.0

    def __post_init__(self) -> None:
        if self.reserved_connections >= self.max_connections:
            raise ConfigError(
                f"relay_reserved_connections ({self.reserved_connections}) must be below "
                f"relay_max_connections ({self.max_connections})"
            )
        if self.max_token_buffered_bytes >= self.max_buffered_bytes:
            raise ConfigError(
                f"relay_max_token_buffered_bytes ({self.max_token_buffered_bytes}) must be below "
                f"relay_max_buffered_bytes ({self.max_buffered_bytes}): the last that much of it is the reserve"
            )
        if self.max_request_bytes > self.max_token_buffered_bytes:
            raise ConfigError(
                f"relay_max_request_bytes ({self.max_request_bytes}) must not exceed "
                f"relay_max_token_buffered_bytes ({self.max_token_buffered_bytes}): such a body could never be held"
            )


class Blame(Enum):
    OWN = "own"  # the sandbox or rollout is over its own bound: its fault
    INFRA = "infra"  # the relay is full of others' work: not this rollout's fault


@dataclass(frozen=True)
class Refusal:
    """Why a call or connection was refused: ``kind`` is a stable name (what records count),
    ``reason`` the one line for a person."""

    blame: Blame
    kind: str
    reason: str


class RelayAdmission:
    """Counts what each sandbox (by source address) and each rollout (by token) holds."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self.connections = 0
        self.overflow = 0  # connections beyond the total, held only to answer 503 to their token
        self.buffered = 0  # body bytes reserved (a declared length all at once)
        self.received = 0  # body bytes read and held now
        self.calls = 0
        self._by_source: defaultdict[str, int] = defaultdict(int)
        self._calls: defaultdict[str, int] = defaultdict(int)
        self._token_buffered: defaultdict[str, int] = defaultdict(int)

    # ── connections, from accept to close (before any header is read) ─────────────────────
    def connect(self, source: str) -> Refusal | None:
        """Admit a connection from ``source``, or say why not. A ``RELAY_FULL`` refusal is still
        counted (as overflow): the caller reads its request head, answers 503 and closes; any
        other is closed at once."""
        limits, held = self.limits, self._by_source[source]
        if held >= limits.max_source_connections:
            return self._refused(source, "source_connections", f"this sandbox holds {held} connections, its bound")
        light = held < LIGHT_SOURCE_CONNECTIONS
        if self.connections >= limits.max_connections - limits.reserved_connections and not light:
            return self._refused(source, "busy_source", f"the relay is busy and this sandbox holds {held} connections")
        if self.connections >= limits.max_connections:
            if self.overflow >= MAX_OVERFLOW_CONNECTIONS:
                return self._refused(source, "overflow_full", "the relay is full, and so is its overflow", Blame.INFRA)
            self.overflow += 1
            self._by_source[source] += 1
            return Refusal(
                Blame.INFRA, RELAY_FULL, f"the relay is full ({self.connections} connections of all sandboxes)"
            )
        self.connections += 1
        self._by_source[source] += 1
        return None

    def _refused(self, source: str, kind: str, reason: str, blame: Blame = Blame.OWN) -> Refusal:
        if not self._by_source[source]:
            del self._by_source[source]
        return Refusal(blame, kind, reason)

    def disconnect(self, source: str, *, overflow: bool = False) -> None:
        if overflow:
            self.overflow -= 1
        else:
            self.connections -= 1
        left = self._by_source[source] - 1
        if left:
            self._by_source[source] = left
        else:
            del self._by_source[source]

    # ── calls of one rollout, from its request head to the end of its answer ──────────────
    def begin_call(self, token: str) -> Refusal | None:
        calls = self._calls[token]
        if calls >= self.limits.max_token_calls:
            return Refusal(Blame.OWN, "token_calls", f"this rollout has {calls} calls in flight, its bound")
        self._calls[token] = calls + 1
        self.calls += 1
        return None

    def end_call(self, token: str) -> None:
        self.calls -= 1
        left = self._calls[token] - 1
        if left:
            self._calls[token] = left
        else:
            del self._calls[token]

    # ── request bodies, held from their first byte until sent upstream ───────────────────
    def hold(self, token: str, size: int) -> Refusal | None:
        """Reserve ``size`` more bytes of body for ``token``'s call (all of a declared body at
        once, a chunked one as it comes); ``release`` gives them back."""
        limits, held = self.limits, self._token_buffered[token]
        if held + size > limits.max_token_buffered_bytes:
            return Refusal(
                Blame.OWN,
                "token_buffered",
                f"this rollout's calls would hold {held + size} bytes of body, over its bound",
            )
        if held and self.buffered + size > limits.max_buffered_bytes - limits.max_token_buffered_bytes:
            return Refusal(
                Blame.OWN, "busy_buffers", f"the relay's buffers are busy and this rollout already holds {held} bytes"
            )
        if self.buffered + size > limits.max_buffered_bytes:
            return Refusal(Blame.INFRA, "buffers_full", f"the relay's buffers are full ({self.buffered} bytes)")
        self._token_buffered[token] = held + size
        self.buffered += size
        return None

    def release(self, token: str, size: int) -> None:
        if not size:
            return
        self.buffered -= size
        left = self._token_buffered[token] - size
        if left:
            self._token_buffered[token] = left
        else:
            del self._token_buffered[token]

    def stats(self) -> dict[str, int]:
        """What is held now (read from another thread: a best-effort snapshot)."""
        return {
            "connections": self.connections,
            "overflow": self.overflow,
            "buffered_bytes": self.buffered,
            "received_bytes": self.received,
            "sources": len(self._by_source),
            "calls": self.calls,
        }
