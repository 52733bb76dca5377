"""The fake SDK is vouched for by the conformance suite ``sandbox-check`` runs on docker and the
skypilot-emulator: it passes every check a fake can answer, and each check it cannot answer is
listed with the reason (printed by the test). A check added to the suite must be put on one
list or the other, and a listed skip that starts to pass must move: both are tested."""

from __future__ import annotations

import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox import conformance
from osmosis_harbor.sandbox.conformance.core import CheckStatus
from tests.unit import fake_sky
from tests.unit.fake_sky.fixtures import FAKE_IMAGE, fake_cloud

__all__ = ["fake_cloud"]

NO_KERNEL = "the fake has no kernel: no processes, cgroups, /proc or /sys to read"
NO_IMAGES = "the fake builds no images and runs no ENTRYPOINT (the suite skips it without a registry)"

# What the fake cannot answer honestly, and why; every other check of the suite must pass.
SKIPPED: dict[str, str] = {
    "exec_timeout_kills_process_group": f"runs a background job (&) and lists /proc: {NO_KERNEL}",
    "exec_large_output": "pipes head into tr: the fake's shell runs no pipelines",
    "non_root_user_via_su": "the fake has no users (every command runs as root): su and useradd are refused",
    "file_permissions": "reads the file as a non-root user through su: the fake has no users",
    "block_network": "reads /proc/net: the fake has no network to block",
    "default_network_has_interface": "reads /proc/net: the fake has no network",
    "bounds": f"reads cgroup bounds: {NO_KERNEL}",
    "pid_limit_contains_fork_bomb": f"runs a fork bomb: {NO_KERNEL}",
    "memory_limit_kills_hog": f"runs a memory hog: {NO_KERNEL}",
    "tmp_bound_refuses_writes": f"fills a bounded /tmp: {NO_KERNEL}",
    "privileges": f"reads capabilities from /proc/self/status: {NO_KERNEL}",
    "environment_image_by_content_hash": NO_IMAGES,
    "environment_default_bounds": f"reads a started environment's cgroup bounds: {NO_KERNEL}",
    "environment_host_network_reaches_loopback": "not applicable: the fake's sandboxes never reach the host",
    "environment_relay_reaches_loopback_endpoint": (
        "nothing to prove: the fake relays no host endpoint (the check passes without running anything)"
    ),
    "assume_exit_127": "a program the fake does not run is refused, not answered 127 (it cannot know an image's PATH)",
    "verifier_guard": "runs the guard's compiled binary: the fake runs no programs but its own",
}
# The ones above that pass vacuously on the fake (the suite's own answer for an SDK without the
# capability): the others must not pass, or the list is stale.
VACUOUS = frozenset({"environment_relay_reaches_loopback_endpoint"})
CLAIMED = [check.name for check in conformance.CHECKS if check.name not in SKIPPED]


# Cancels a start while its sandbox is being made: the fake's create must take long enough to
# be caught (the check polls every 50 ms), so it runs apart, on a slow create.
CANCELLED_CREATE = "environment_cancelled_during_create_leaves_nothing"


@pytest.fixture
def suite_cloud(fake_cloud: fake_sky.FakeSky, monkeypatch: pytest.MonkeyPatch) -> fake_sky.FakeSky:
    """The cloud the suite runs on: the environment checks move directories by Harbor's own
    transfer commands (the fake's shell does not run the product's folded transfer scripts)."""
    monkeypatch.setenv("OSMOSIS_HARBOR_EXEC_ARCHIVES", "0")
    return fake_cloud


def test_every_check_of_the_suite_is_claimed_or_skipped_with_a_reason() -> None:
    names = [check.name for check in conformance.CHECKS]
    assert set(SKIPPED) <= set(names), f"skips of checks the suite no longer has: {set(SKIPPED) - set(names)}"
    assert all(reason.strip() for reason in SKIPPED.values())
    print(f"\nthe fake SDK passes {len(CLAIMED)} of {len(names)} conformance checks; it skips:")
    for name, reason in SKIPPED.items():
        print(f"  {name}: {reason}")


async def test_the_fake_passes_every_check_it_claims(suite_cloud: fake_sky.FakeSky) -> None:
    report = await conformance.run_suite(
        fake_sky, FAKE_IMAGE, only=[n for n in CLAIMED if n != CANCELLED_CREATE], config=settings.current()
    )
    suite_cloud.faults.slow_create(0.5)
    cancelled = await conformance.run_suite(fake_sky, FAKE_IMAGE, only=[CANCELLED_CREATE], config=settings.current())
    results = report.results + cancelled.results
    failed = {r.name: r.detail for r in results if r.status is not CheckStatus.PASSED}
    assert not failed, failed
    assert len(results) == len(CLAIMED) and report.sdk == "fake"
    assert suite_cloud.live() == [] and suite_cloud.pools() == [], "the suite left sandboxes or pools behind"


async def test_the_checks_it_skips_do_not_pass_on_it(suite_cloud: fake_sky.FakeSky) -> None:
    """A skip is a check the fake cannot answer: run, it refuses or fails (never passes)."""
    report = await conformance.run_suite(
        fake_sky, FAKE_IMAGE, only=[n for n in SKIPPED if n not in VACUOUS], config=settings.current()
    )
    passing = [r.name for r in report.results if r.status is CheckStatus.PASSED]
    assert not passing, f"listed as skipped but pass on the fake (move them to the claimed checks): {passing}"
