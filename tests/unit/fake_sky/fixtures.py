"""Shared fixtures of the unit layer on the fake SDK: import them explicitly where used
(``from tests.unit.fake_sky.fixtures import fake_cloud``), so a module says what it relies on.

The fake is selectable as ``sdk="fake"`` through the product's own registry (``register``), the
way any implementation of ``sky.sandbox`` is: no product code knows it exists.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from osmosis_harbor.sandbox.sdk.registry import SandboxImplementation, register

from . import FakeSky, use

__all__ = ["FAKE", "FAKE_IMAGE", "FAKE_SDK", "fake_cloud"]

FAKE_SDK = "fake"
FAKE_IMAGE = "fake.local/debian:trixie-slim"
# Nothing here reaches the host, relays an endpoint, keeps exec records or runs an image's
# ENTRYPOINT: every flag is the registration's default, said once.
FAKE = register(SandboxImplementation(FAKE_SDK, "tests.unit.fake_sky"))


@pytest.fixture
def fake_cloud() -> Iterator[FakeSky]:
    """A fresh fake cloud for one test, the one ``sdk="fake"`` talks to; nothing outlives it."""
    with use() as cloud:
        cloud.add_image(FAKE_IMAGE)
        yield cloud
