"""The policy relay's admission and blame, without a socket: its bounds per sandbox and per
rollout with a reserve for light holders (``relay/limits.py``), whose fault a refusal or a failed
call is (``relay/blame.py``), and what a rollout's record makes of it (``relay/refusals.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpcore
import pytest

from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.relay.blame import BODY_NOT_JSON, Reachability, body_refusal
from osmosis_harbor.sandbox.relay.limits import (
    LIGHT_SOURCE_CONNECTIONS,
    RELAY_FULL,
    Blame,
    Refusal,
    RelayAdmission,
    RelayLimits,
)
from osmosis_harbor.sandbox.relay.refusals import RelayRecord

SMALL = RelayLimits(
    max_connections=10,
    reserved_connections=4,
    max_source_connections=8,
    max_token_calls=2,
    max_buffered_bytes=1000,
    max_token_buffered_bytes=400,
    max_request_bytes=300,
)


def _fill(admission: RelayAdmission, source: str, count: int) -> None:
    for _ in range(count):
        assert admission.connect(source) is None


def test_a_heavy_sandbox_is_refused_as_its_own_fault_once_the_relay_is_into_its_reserve() -> None:
    admission = RelayAdmission(SMALL)
    _fill(admission, "10.0.0.2", 6)  # max_connections - reserved_connections
    refusal = admission.connect("10.0.0.2")
    assert refusal is not None and (refusal.blame, refusal.kind) == (Blame.OWN, "busy_source")
    assert admission.connect("10.0.0.3") is None, "a light sandbox still gets in: the reserve is its"


def test_the_reserve_goes_to_light_sandboxes_and_a_full_relay_is_not_their_fault() -> None:
    admission = RelayAdmission(SMALL)
    _fill(admission, "flood", 6)  # up to the reserve
    assert admission.connect("flood").kind == "busy_source"  # type: ignore[union-attr]
    for index in range(4):  # the reserve: light sandboxes only
        assert admission.connect(f"light-{index}") is None
    full = admission.connect("light-late")
    assert full is not None and (full.blame, full.kind) == (Blame.INFRA, RELAY_FULL)
    assert admission.stats()["overflow"] == 1
    admission.disconnect("light-late", overflow=True)
    admission.disconnect("light-0")
    assert admission.connect("light-again") is None
    assert admission.stats()["connections"] == SMALL.max_connections


def test_a_source_at_its_bound_is_refused_whatever_the_relay_holds() -> None:
    admission = RelayAdmission(RelayLimits(max_connections=100, reserved_connections=10, max_source_connections=3))
    _fill(admission, "greedy", 3)
    refusal = admission.connect("greedy")
    assert refusal is not None and (refusal.blame, refusal.kind) == (Blame.OWN, "source_connections")
    assert LIGHT_SOURCE_CONNECTIONS > 3 and admission.stats()["sources"] == 1


def test_calls_in_flight_are_bounded_per_rollout() -> None:
    admission = RelayAdmission(SMALL)
    assert admission.begin_call("tok-a") is None and admission.begin_call("tok-a") is None
    refusal = admission.begin_call("tok-a")
    assert refusal is not None and (refusal.blame, refusal.kind) == (Blame.OWN, "token_calls")
    assert admission.begin_call("tok-b") is None, "another rollout is not held back"
    admission.end_call("tok-a")
    assert admission.begin_call("tok-a") is None


def test_buffered_bodies_are_bounded_per_rollout_and_in_total_with_a_reserve() -> None:
    admission = RelayAdmission(SMALL)
    over = admission.hold("a", 401)
    assert over is not None and (over.blame, over.kind) == (Blame.OWN, "token_buffered")
    for token in ("a", "b"):
        assert admission.hold(token, 300) is None
    busy = admission.hold("a", 50)  # holds already, and the relay is into its reserve
    assert busy is not None and (busy.blame, busy.kind) == (Blame.OWN, "busy_buffers")
    assert admission.hold("c", 300) is None, "a rollout holding nothing may use the reserve"
    full = admission.hold("d", 200)
    assert full is not None and (full.blame, full.kind) == (Blame.INFRA, "buffers_full")
    admission.release("c", 300)
    assert admission.hold("d", 200) is None and admission.stats()["buffered_bytes"] == 800


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"max_connections": 10, "reserved_connections": 10}, "relay_reserved_connections"),
        ({"max_buffered_bytes": 100, "max_token_buffered_bytes": 100}, "relay_max_token_buffered_bytes"),
        ({"max_request_bytes": 2**27}, "relay_max_request_bytes"),
    ],
)
def test_inconsistent_limits_are_refused_by_the_setting_name(limits: dict[str, int], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RelayLimits(**limits)


@pytest.mark.parametrize(
    ("headers", "body", "refused"),
    [
        ([], b'{"model": "m"}', False),
        ([(b"Content-Type", b"application/json")], b"{not json", True),
        ([], b"\xff\xfe", True),  # not UTF-8, and no content type: chat APIs take JSON
        ([], b'{"x": NaN}', True),
        ([], b'{"x": "\\ud800"}', True),  # a lone surrogate
        ([(b"content-type", b"text/plain")], b"{not json", False),  # declared not JSON: not ours to judge
        ([], b"", False),
    ],
)
async def test_a_body_that_is_not_strict_json_is_refused_before_any_upstream(
    headers: list[tuple[bytes, bytes]], body: bytes, refused: bool
) -> None:
    refusal = await body_refusal(headers, body)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert (refusal.blame, refusal.kind) == (Blame.OWN, BODY_NOT_JSON)


class _Response:
    def __init__(self, status: int) -> None:
        self.status = status

    async def aclose(self) -> None:
        return None


class _Pool:
    """The relay's upstream pool, answering its reachability probe with ``status`` (or failing)."""

    def __init__(self, status: int | None) -> None:
        self.status, self.probes = status, 0

    async def handle_async_request(self, request: Any) -> _Response:
        self.probes += 1
        if self.status is None:
            raise httpcore.ConnectError("refused")
        return _Response(self.status)


def _judge(pool: _Pool, exc: Exception, started: float = 0.0) -> Refusal:
    reachability = Reachability(lambda: pool, timeout_sec=5.0)  # type: ignore[arg-type, return-value]
    return asyncio.run(reachability.judge(exc, "http://policy", b"policy", "/v1", started))


@pytest.mark.parametrize(
    ("exc", "probe", "blame", "kind"),
    [
        (httpcore.ConnectError("refused"), 200, Blame.INFRA, "upstream_unreachable"),  # nothing was sent
        (httpcore.ReadTimeout("slow"), 200, Blame.OWN, "call_timeout"),  # it answers others
        (httpcore.RemoteProtocolError("dropped"), 401, Blame.OWN, "call_dropped"),  # any answer but a gateway's
        (httpcore.ReadTimeout("slow"), 503, Blame.INFRA, "upstream_timeout"),  # down for everyone
        (httpcore.RemoteProtocolError("dropped"), None, Blame.INFRA, "upstream_unreachable"),
        (httpcore.LocalProtocolError("bad header"), 200, Blame.OWN, "call_unsendable"),
    ],
)
def test_a_failed_call_is_blamed_by_what_the_host_observes(
    exc: Exception, probe: int | None, blame: Blame, kind: str
) -> None:
    refusal = _judge(_Pool(probe), exc)
    assert (refusal.blame, refusal.kind) == (blame, kind)


def test_an_answer_since_the_call_began_proves_the_endpoint_up_without_a_probe() -> None:
    pool = _Pool(None)
    reachability = Reachability(lambda: pool, timeout_sec=5.0)  # type: ignore[arg-type, return-value]
    reachability.answered("http://policy")
    refusal = asyncio.run(reachability.judge(httpcore.ReadTimeout("slow"), "http://policy", b"p", "/v1", started=0.0))
    assert refusal.blame is Blame.OWN and pool.probes == 0


def test_a_rollouts_record_fails_it_only_on_an_unrecovered_infrastructure_refusal() -> None:
    record = RelayRecord()
    record.refused(Refusal(Blame.OWN, "token_calls", "too many"))
    assert record.report().failure_message() is None and record.report().extra_fields() == {
        "refused": {"own": {"token_calls": 1}}
    }
    record.refused(Refusal(Blame.INFRA, RELAY_FULL, "the relay is full"))
    assert "through no fault of its own: the relay is full" in (record.report().failure_message() or "")
    record.answered()  # a later call got through: recovered, only counted
    report = record.report()
    assert report.failure is None and report.infra == {RELAY_FULL: 1}
    record.clear()
    assert record.report().extra_fields() == {}
