"""The per-rollout host-cost cuts keep behaviour: settings still follow the environment at
once while parsing it once per distinct value set, and the Docker client reuses one
connection pool on the engine's socket (docker-py alone makes one per request URL: the
positive control), and looks an image reference's id up once, not at every create (with the
recheck interval at 0 it asks each time: the control)."""

from __future__ import annotations

from types import ModuleType

import docker
import pytest

from osmosis_harbor import settings
from osmosis_harbor.sandbox.docker import engine as engine_module
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
