"""The per-rollout host-cost cuts keep behaviour: settings still follow the environment at
once while parsing it once per distinct value set, and the Docker client reuses one
connection pool on the engine's socket (docker-py alone makes one per request URL: the
positive control), and looks an image reference's id up once, not at every create (with the
recheck interval at 0 it asks each time: the control)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import docker
import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox.docker import engine as engine_module
from osmosis_harbor.sandbox.docker import tmp_seeds as tmp_seeds_module
from osmosis_harbor.sandbox.docker.tmp_seeds import ImageTmpSeeds
from osmosis_harbor.sandbox.docker.transport import share_one_pool


def test_settings_parse_once_per_environment_and_follow_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_HARBOR_MAX_JSON_DEPTH", "42")
    first = settings.current()
    assert first.max_json_depth == 42
    assert settings.current() is first  # same environment: the parsed model is reused

    monkeypatch.setenv("OSMOSIS_HARBOR_MAX_JSON_DEPTH", "43")
    assert settings.current().max_json_depth == 43  # a change is seen at once
    monkeypatch.setenv("DOCKER_HOST", "unix:///elsewhere.sock")
    assert settings.current().docker_host == "unix:///elsewhere.sock"
    monkeypatch.delenv("OSMOSIS_HARBOR_MAX_JSON_DEPTH")
    assert settings.current().max_json_depth == 100


def _new_pools_for_distinct_urls(client: docker.DockerClient) -> int:
    adapter = client.api.get_adapter("http+docker://localhost")
    before = len(adapter.pools)  # the client's own version probe may have made one already
    client.api.version()
    client.api.info()
    client.api.images(quiet=True)
    client.api.containers(limit=1)
    return len(adapter.pools) - before


def test_one_connection_pool_for_every_url_on_the_socket() -> None:
    plain = docker.from_env()
    shared = docker.from_env()
    try:
        if not share_one_pool(shared.api):
            pytest.skip("the engine is not on a Unix socket")
        assert _new_pools_for_distinct_urls(plain) >= 3  # docker-py: one pool per request URL
        assert _new_pools_for_distinct_urls(shared) <= 1  # the shared one, if not made yet
        assert shared.api.trust_env is False
    finally:
        plain.close()
        shared.close()


def test_an_image_reference_is_looked_up_once_per_interval(
    docker_sandbox_sdk: ModuleType, sandbox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every create reads the image's /tmp seed (``Engine._tmp_seed``), which needs its id."""
    engine = docker_sandbox_sdk.get_engine()
    engine._image_ids.clear()
    asked: list[str] = []
    real = engine.api.inspect_image
    monkeypatch.setattr(engine.api, "inspect_image", lambda ref: asked.append(ref) or real(ref))
    seeds = {engine._tmp_seed(sandbox_image) for _ in range(3)}
    assert len(asked) == 1 and len(seeds) == 1
    monkeypatch.setattr(engine_module, "IMAGE_ID_RECHECK_SEC", 0.0)
    engine._tmp_seed(sandbox_image)
    engine._tmp_seed(sandbox_image)
    assert len(asked) == 3  # the control: asked again each time


def test_a_burst_of_creates_on_a_new_image_probes_its_tmp_once(
    docker_sandbox_sdk: ModuleType, sandbox_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The image's /tmp is read from a probe container once, however many creates ask at once
    (a batch's first trials on a new image); each is answered with that one seed. The probe
    answers only once every caller has asked for the image, so they all ask while it is in
    flight. Control: without the wait for the probe in flight, every caller probes."""
    engine = docker_sandbox_sdk.get_engine()
    real = tmp_seeds_module.read_image_tmp
    probes: list[str] = []

    def burst(callers: int, table: _ArrivalsTable, store: Path) -> set[bytes | None]:
        seeds = ImageTmpSeeds(engine.api, store)  # a store of its own: no other process's answer
        monkeypatch.setattr(seeds, "_probes", table)
        monkeypatch.setattr(engine, "tmp_seeds", seeds)
        probes.clear()

        def probe(api: object, image_id: str) -> bytes | None:
            probes.append(image_id)
            assert table.everyone.wait(timeout=30), "the callers never all asked"
            return real(api, image_id)

        monkeypatch.setattr(tmp_seeds_module, "read_image_tmp", probe)
        with ThreadPoolExecutor(callers) as pool:
            return set(pool.map(lambda _: engine._tmp_seed(sandbox_image), range(callers)))

    seeds = burst(4, _ArrivalsTable(4), tmp_path / "burst")
    assert len(probes) == 1 and len(seeds) == 1
    burst(2, _ArrivalsTable(2, shared=False), tmp_path / "control")
    assert len(probes) == 2  # the control: without the wait, both callers probed


def test_the_next_process_reads_an_images_tmp_from_the_store_not_from_a_probe(
    docker_sandbox_sdk: ModuleType, sandbox_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An image id names its content, so what a probe found in its /tmp is kept on disk and a
    later process (here: a fresh table on the same store) answers without a probe container.
    A store holding nothing for the image (the control) probes; a seed over the store's bound
    is not written."""
    api = docker_sandbox_sdk.get_engine().api
    image_id = api.inspect_image(sandbox_image)["Id"]
    real = tmp_seeds_module.read_image_tmp
    probes: list[str] = []
    monkeypatch.setattr(tmp_seeds_module, "read_image_tmp", lambda a, i: probes.append(i) or real(a, i))

    first = ImageTmpSeeds(api, tmp_path / "store").seed(image_id)
    assert probes == [image_id] and len(list((tmp_path / "store").iterdir())) == 1
    assert ImageTmpSeeds(api, tmp_path / "store").seed(image_id) == first
    assert probes == [image_id]  # answered from the store
    ImageTmpSeeds(api, tmp_path / "empty").seed(image_id)
    assert probes == [image_id, image_id]  # the control: an empty store probes

    other = "sha256:" + "a" * 64  # an image whose /tmp holds files: its tar comes back whole
    monkeypatch.setattr(tmp_seeds_module, "read_image_tmp", lambda a, i: b"a tar of /tmp")
    ImageTmpSeeds(api, tmp_path / "store").seed(other)
    monkeypatch.setattr(tmp_seeds_module, "read_image_tmp", lambda a, i: pytest.fail("probed"))
    assert ImageTmpSeeds(api, tmp_path / "store").seed(other) == b"a tar of /tmp"

    big = b"x" * (tmp_seeds_module.MAX_STORED_BYTES + 1)
    monkeypatch.setattr(tmp_seeds_module, "read_image_tmp", lambda a, i: big)
    assert ImageTmpSeeds(api, tmp_path / "bounded").seed(image_id) == big
    assert not (tmp_path / "bounded").exists() or not any((tmp_path / "bounded").iterdir())


class _ArrivalsTable(dict[str, threading.Lock]):
    """The engine's table of probes in flight, which sets ``everyone`` once ``expected`` callers
    have looked their image up in it; ``shared=False`` gives every caller a lock of its own
    (nobody waits for another's probe)."""

    def __init__(self, expected: int, *, shared: bool = True) -> None:
        super().__init__()
        self.expected, self.shared, self.arrived = expected, shared, 0
        self.everyone = threading.Event()

    def setdefault(self, key: str, default: threading.Lock | None = None) -> threading.Lock:  # type: ignore[override]
        self.arrived += 1  # under the seeds' lock
        if self.arrived >= self.expected:
            self.everyone.set()
        return super().setdefault(key, threading.Lock()) if self.shared else threading.Lock()
