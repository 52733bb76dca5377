"""Whose fault a relayed call's failure is, from what the host saw: the endpoint's, or the call's.

A failed call is ``internal_error`` for its rollout (masked and retried by a trainer), so a
failure the sandbox can cause with its own request must not read as the infrastructure's:
otherwise a policy learns that a malformed call after a wrong answer costs nothing. The relay
therefore tells them apart by what it can observe, never by what the request says:

* a body that is not strict JSON (when it is declared JSON, or not declared at all) is refused
  with a 400 before any upstream sees it (``body_refusal``): no upstream can choke on it;
* a failure before the request was sent (connect refused or timed out, the relay's own pool) is
  the endpoint's: no byte of the sandbox's choosing reached it;
* a failure after it was sent (the upstream dropped the connection, broke off its answer, or
  did not answer within ``relay_timeout_sec``) is the call's own when the endpoint is otherwise
  reachable: another call to it was answered since this one began, or a probe (``GET
  <prefix>/models``, no key) gets any answer but a gateway error (502, 503, 504). Only when
  neither is the endpoint down for everyone, and the failure the infrastructure's.

A request h11 cannot even write upstream (its headers) is the call's own at once.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Iterable

import httpcore

from osmosis_harbor.sandbox.relay.limits import Blame, Refusal

__all__ = ["BODY_NOT_JSON", "Reachability", "UPSTREAM_ERRORS", "body_refusal"]

BODY_NOT_JSON = "body_not_json"
# What reaching the upstream can raise besides a timeout (httpcore's exceptions have no common base).
UPSTREAM_ERRORS = (
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
    httpcore.ConnectionNotAvailable,
)
# Raised before a byte of the request left the host: the endpoint (or the host) failed, not the call.
_BEFORE_SENT = (
    httpcore.ConnectError,
    httpcore.ConnectTimeout,
    httpcore.PoolTimeout,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
    httpcore.ConnectionNotAvailable,
)
_GATEWAY_ERRORS = frozenset({502, 503, 504})  # a proxy in front answering for an upstream that is not there
PROBE_SEC = 10.0
# Larger bodies are parsed on a thread (inline, one this size takes about 2 ms of the loop that
# serves every sandbox; 2 MB about 25 ms).
_OFF_LOOP_BYTES = 256 * 1024
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _declares_json(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether the body is to be JSON: declared so, or not declared at all (chat APIs take JSON)."""
    for name, value in headers:
        if name.lower() == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return True


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _json_problem(body: bytes) -> str | None:
    """Why ``body`` is not strict JSON (UTF-8, RFC 8259: no NaN, no lone surrogate), else None."""
    try:
        document = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (byte {exc.start})"
    except RecursionError:
        return "nested too deep to parse"
    except ValueError as exc:
        return str(exc)
    if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(document):
        return "a string holds a lone surrogate"
    return None


def _has_lone_surrogate(document: object) -> bool:
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if _LONE_SURROGATE.search(value):
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


async def body_refusal(headers: Iterable[tuple[bytes, bytes]], body: bytes) -> Refusal | None:
    """A 400 for a body declared (or taken as) JSON that is not strict JSON; None otherwise."""
    if not body or not _declares_json(headers):
        return None
    problem = await asyncio.to_thread(_json_problem, body) if len(body) > _OFF_LOOP_BYTES else _json_problem(body)
    if problem is None:
        return None
    return Refusal(Blame.OWN, BODY_NOT_JSON, f"the request body is not valid JSON ({problem[:200]}): not forwarded")


class Reachability:
    """Whether an endpoint answers calls other than a failed one; the relay loop's own state.

    ``answered`` is told of every answer the relay forwards; ``judge`` turns a failed call into
    a refusal with its blame (module docstring). Probes of one origin run one at a time: a
    burst of failed calls waits for the same probe, so a sandbox cannot flood the endpoint
    with probes."""

    def __init__(self, client: Callable[[], httpcore.AsyncConnectionPool], timeout_sec: float) -> None:
        self._client = client
        self._timeout_sec = timeout_sec
        self._answered: dict[str, float] = {}
        self._probes: dict[str, asyncio.Task[bool]] = {}

    def answered(self, origin: str) -> None:
        self._answered[origin] = time.monotonic()

    async def judge(self, exc: Exception, origin: str, host: bytes, prefix: str, started: float) -> Refusal:
        """The refusal a call that began at ``started`` (monotonic) and failed with ``exc`` gets."""
        if isinstance(exc, httpcore.LocalProtocolError):
            return Refusal(Blame.OWN, "call_unsendable", f"the request cannot be forwarded as HTTP ({exc})")
        if isinstance(exc, _BEFORE_SENT):
            return Refusal(
                Blame.INFRA, "upstream_unreachable", f"the policy endpoint is unreachable ({type(exc).__name__})"
            )
        timed_out = isinstance(exc, httpcore.TimeoutException)
        if await self._reachable(origin, host, prefix, started):
            if timed_out:
                return Refusal(
                    Blame.OWN,
                    "call_timeout",
                    f"the policy endpoint did not answer this call within {self._timeout_sec:g} s while it answers "
                    "others: the call's own parameters made it too slow",
                )
            return Refusal(
                Blame.OWN,
                "call_dropped",
                f"the policy endpoint dropped this call ({type(exc).__name__}) while it answers others: "
                "the request itself failed it",
            )
        what = "timed out" if timed_out else f"is unreachable ({type(exc).__name__})"
        kind = "upstream_timeout" if timed_out else "upstream_unreachable"
        return Refusal(Blame.INFRA, kind, f"the policy endpoint {what}, and answers no probe either")

    async def _reachable(self, origin: str, host: bytes, prefix: str, started: float) -> bool:
        if self._answered.get(origin, -math.inf) > started:
            return True
        probe = self._probes.get(origin)
        if probe is None:
            probe = self._probes[origin] = asyncio.create_task(self._probe(origin, host, prefix))
            probe.add_done_callback(lambda _t: self._probes.pop(origin, None))
        return await asyncio.shield(probe)

    async def _probe(self, origin: str, host: bytes, prefix: str) -> bool:
        wait = min(PROBE_SEC, self._timeout_sec)
        timeouts = {"connect": wait, "read": wait, "write": wait, "pool": wait}
        request = httpcore.Request(
            b"GET", f"{origin}{prefix}/models", headers=[(b"host", host)], extensions={"timeout": timeouts}
        )
        try:
            async with asyncio.timeout(wait):
                response = await self._client().handle_async_request(request)
                await response.aclose()
        except (TimeoutError, OSError, httpcore.TimeoutException, *UPSTREAM_ERRORS):
            return False  # no answer: for everyone, as far as the host can tell
        if response.status not in _GATEWAY_ERRORS:
            self.answered(origin)
            return True
        return False
