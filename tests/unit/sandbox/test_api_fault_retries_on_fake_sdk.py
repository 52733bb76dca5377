"""Which SDK calls survive an API fault by being retried (``sdk/faults.py``), on the fake SDK:
reads, writes and terminations are retried; a refusal or a "not found" is an answer and is not;
a create is retried only once ``ls`` shows what the failed call left, and an exec never is."""

from __future__ import annotations

import pytest

from osmosis_harbor import settings
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.sdk.faults import ApiRetry, create_checked, retry_safe, terminate_by_name
from tests.unit import fake_sky
from tests.unit.fake_sky import FakeSky, InvalidRequest, NotFound
from tests.unit.fake_sky.fixtures import FAKE_IMAGE, fake_cloud

__all__ = ["fake_cloud"]


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_API_RETRY_MAX_WAIT", "0.01")
    monkeypatch.setenv("OSMOSIS_HARBOR_API_ATTEMPTS", "3")


async def test_a_safe_call_is_retried_through_api_faults(fake_cloud: FakeSky) -> None:
    await fake_cloud.create.aio(name="listed", image=FAKE_IMAGE)
    fake_cloud.faults.fail("ls", times=2)
    records = await retry_safe("ls", ApiRetry.of(settings.current()), fake_sky.ls.aio)
    assert [r.name for r in records] == ["listed"] and len(fake_cloud.calls_of("ls")) == 3


async def test_the_retries_are_bounded_and_the_last_fault_is_raised(fake_cloud: FakeSky) -> None:
    fake_cloud.faults.fail("ls", times=5)
    with pytest.raises(fake_sky.Unavailable):
        await retry_safe("ls", ApiRetry.of(settings.current()), fake_sky.ls.aio)
    assert len(fake_cloud.calls_of("ls")) == 3


@pytest.mark.parametrize("answer", [NotFound("no such sandbox"), InvalidRequest("bad name")])
async def test_an_answer_is_not_retried(fake_cloud: FakeSky, answer: Exception) -> None:
    fake_cloud.faults.fail("ls", answer, times=5)
    with pytest.raises(type(answer)):
        await retry_safe("ls", ApiRetry.of(settings.current()), fake_sky.ls.aio)
    assert len(fake_cloud.calls_of("ls")) == 1


async def test_an_exec_or_a_create_is_never_retried_blindly() -> None:
    for call in ("exec", "create"):
        with pytest.raises(ConfigError, match="not safe to retry"):
            await retry_safe(call, ApiRetry.of(settings.current()), fake_sky.ls.aio)


async def test_a_create_whose_fault_made_nothing_is_tried_again(fake_cloud: FakeSky) -> None:
    fake_cloud.faults.fail("create")
    made = await create_checked(
        fake_sky, "twice", lambda: fake_sky.create.aio(name="twice", image=FAKE_IMAGE), ApiRetry.of(settings.current())
    )
    assert made.name == "twice" and fake_cloud.live() == ["twice"]
    assert len(fake_cloud.calls_of("create")) == 2 and not fake_cloud.calls_of("terminate")


async def test_a_create_whose_answer_was_lost_terminates_what_it_made_before_trying_again(fake_cloud: FakeSky) -> None:
    fake_cloud.faults.fail("create", after=True)  # made, then the answer failed
    made = await create_checked(
        fake_sky, "made", lambda: fake_sky.create.aio(name="made", image=FAKE_IMAGE), ApiRetry.of(settings.current())
    )
    assert fake_cloud.live() == ["made"] and fake_cloud.sandboxes["made"] is made
    assert [c.call for c in fake_cloud.calls if c.call in ("create", "terminate")] == ["create", "terminate", "create"]


async def test_a_refused_create_is_not_tried_again(fake_cloud: FakeSky) -> None:
    with pytest.raises(InvalidRequest):
        await create_checked(
            fake_sky,
            "Bad_Name",
            lambda: fake_sky.create.aio(name="Bad_Name", image=FAKE_IMAGE),
            ApiRetry.of(settings.current()),
        )
    assert len(fake_cloud.calls_of("create")) == 1


async def test_terminate_by_name_goes_through_the_ls_record_and_absent_is_done(fake_cloud: FakeSky) -> None:
    await fake_cloud.create.aio(name="by-name", image=FAKE_IMAGE)
    fake_cloud.faults.fail("terminate")
    await terminate_by_name(fake_sky, "by-name", ApiRetry.of(settings.current()))
    await terminate_by_name(fake_sky, "never-was", ApiRetry.of(settings.current()))
    assert fake_cloud.live() == [] and len(fake_cloud.calls_of("terminate")) == 2
