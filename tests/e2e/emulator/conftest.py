"""The emulator's own tests share one fixture trio: a private server per module (its knobs and
faults never reach another module's), the test image pushed to the local registry (the emulator
pulls by reference, as SkyPilot does), and the knobs reset before each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.emulator import EmulatorServer, private_emulator, push_to_local_registry


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    with private_emulator(tmp_path_factory.mktemp("emulator")) as server:
        yield server


@pytest.fixture(scope="module")
def image(sandbox_image: str) -> str:
    return push_to_local_registry(sandbox_image)


@pytest.fixture(autouse=True)
def _clean_knobs(emulator: EmulatorServer) -> None:
    emulator.reset()
