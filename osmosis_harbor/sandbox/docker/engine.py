"""The process's one Docker client, and the container primitives built on it.

`Engine` owns the connection (one client per process, pooled for many concurrent calls),
turns "engine not reachable" into `DockerEngineUnavailable`, and implements the container
operations shared by sandboxes and pools: image presence (pulling only from loopback
registries), create-with-TTL within the sandbox bounds (``bounds.py``: CPU, memory, pids, a
tmpfs /tmp seeded with the image's own, each file's size, the writable layer's disk and inodes
through ``layer_bound``) and
privileges (``privileges.py``: capabilities dropped, no-new-privileges), start, force-remove,
lookup by name or id, and name reuse. Pool members are created here too, so they get the same
bounds. It is the ``Launcher`` that ``pools.PoolManager`` borrows, and it owns the per-engine
state (pool manager, exec deadline timer, layer bound, last auto-reap time). `get_engine()` is
the lazy singleton.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import threading
import time
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from osmosis_harbor import settings
from osmosis_harbor.errors import (
    DockerEngineUnavailable,
    ImageNotFoundError,
    SandboxExistsError,
)
from osmosis_harbor.sandbox.docker import inventory
from osmosis_harbor.sandbox.docker import labels as L
from osmosis_harbor.sandbox.docker import reap as docker_reap
from osmosis_harbor.sandbox.docker.config import DockerConfig
from osmosis_harbor.sandbox.docker.exec import Deadlines
from osmosis_harbor.sandbox.docker.labels import (
    ContainerInfo,
    Network,
)
from osmosis_harbor.sandbox.docker.layer_bound import LayerBound
from osmosis_harbor.sandbox.docker.lean_http import install_lean_requests
from osmosis_harbor.sandbox.docker.network import SandboxNetwork, ensure_sandbox_network
from osmosis_harbor.sandbox.docker.pools import PoolManager
from osmosis_harbor.sandbox.docker.tmp_seeds import ImageTmpSeeds
from osmosis_harbor.sandbox.docker.tmp_volume import tmp_mount
from osmosis_harbor.sandbox.docker.transport import share_one_pool
from osmosis_harbor.sandbox.sdk.bounds import SandboxBounds
from osmosis_harbor.sandbox.sdk.calls import executor

log = logging.getLogger(__name__)

API_TIMEOUT_SEC = 120
AUTO_REAP_INTERVAL_SEC = 60.0
# How long a reference's image id is trusted before it is looked up again (``_image_id``).
IMAGE_ID_RECHECK_SEC = 60.0


def check_reachable(config: settings.Settings) -> None:
    """The engine answers a ping (``sdk="docker"``'s preflight), without making the process's
    `Engine`: a run that never starts a sandbox here keeps no client."""
    url = config.docker_host
    try:
        client = docker.from_env(version="auto", timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise DockerEngineUnavailable(url, exc) from exc


def _is_loopback_registry(image: str) -> bool:
    """Pulls are only attempted from registries on this machine (network rule: loopback only)."""
    first = image.split("/", 1)[0] if "/" in image else ""
    host = first.rsplit(":", 1)[0] if first.count(":") == 1 else first
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Engine:
    """One Docker client per process, plus the container primitives the pools borrow.

    ``config``: the SDK's settings as the latest call into it found them (``get_engine``); the
    engine's client, pools and layer bound are made from the one it was made with."""

    def __init__(self, config: DockerConfig) -> None:
        self.config = config
        url = config.docker_host
        try:
            self.client = docker.from_env(
                version="auto", timeout=API_TIMEOUT_SEC, max_pool_size=config.docker_sdk_threads
            )
            info = self.client.info()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise DockerEngineUnavailable(url, exc) from exc
        self.api = self.client.api
        share_one_pool(self.api)
        install_lean_requests(self.api, enabled=config.lean_engine_client)
        self.ncpu = float(info.get("NCPU") or os.cpu_count() or 1)
        self.key = hashlib.sha256(f"{url}|{info.get('ID', '')}".encode()).hexdigest()[:12]
        self.deadlines = Deadlines()
        self.pools = PoolManager(self.api, self, executor().submit, engine_key=self.key, lock_dir=config.lock_dir)
        self._last_auto_reap = 0.0
        self.tmp_seeds = ImageTmpSeeds(self.api, config.image_tmp_dir)
        self._image_ids: dict[str, tuple[str, float]] = {}  # reference -> (image id, when looked up)
        self._pending_seeds: dict[str, bytes] = {}  # created container id -> seed to apply at start
        self._seed_lock = threading.Lock()
        self._bridge: str | None = None  # the sandboxes' bridge, once found (sandbox_bridge)
        self.layers = LayerBound(
            self.api,
            engine_url=url,
            storage_root=str(info.get("DockerRootDir") or ""),
            inspect=self.inspect_info,
            remove=lambda container_id, claimed: self.remove_container(container_id, claimed=claimed),
        )

    # Launcher protocol -------------------------------------------------------------------------

    def ensure_image(self, image: str) -> None:
        try:
            self.api.inspect_image(image)
            return
        except docker.errors.ImageNotFound:
            pass
        if not _is_loopback_registry(image):
            raise ImageNotFoundError(
                f"image {image!r} is not in the local Docker engine; build or load it first "
                "(this emulation pulls only from registries on 127.0.0.1/localhost)"
            )
        log.info("pulling %s from a local registry", image)
        self.api.pull(image)

    def create_container(
        self,
        *,
        name: str,
        image: str,
        cpus: float | None,
        memory_gb: float | None,
        network: Network,
        ttl_sec: int,
        labels: dict[str, str],
        env: dict[str, str] | None = None,
    ) -> str:
        """Create (not start) a container whose main process is the TTL itself, within its
        bounds (``bounds.py``: CPU, memory without swap, pids, a size-limited /tmp, the writable
        layer) and with its privileges cut (``privileges.py``)."""
        config = self.config  # one create, one config
        bounds = SandboxBounds.resolve(cpus, memory_gb, disk_mb=config.sandbox_disk_mb, inodes=config.sandbox_inodes)
        privileges = config.privileges()

        def create(network_mode: str) -> str:
            host_config = self.api.create_host_config(
                init=True,
                auto_remove=True,
                nano_cpus=self._nano_cpus(bounds.cpus),
                mem_limit=bounds.memory_bytes,
                memswap_limit=bounds.memory_bytes,
                pids_limit=bounds.pids_limit,
                mounts=[tmp_mount(bounds)],
                network_mode=network_mode,
                storage_opt=self.layers.option(bounds),
                ulimits=_ulimits(bounds),
                **privileges.host_config(),
            )
            kwargs: dict[str, Any] = {
                "command": ["sleep", str(int(ttl_sec))],
                "name": name,
                "labels": labels,
                "environment": env or None,
                "host_config": host_config,
                "detach": True,
            }
            try:
                return str(self.api.create_container(image, **kwargs)["Id"])
            except docker.errors.ImageNotFound:
                with self._seed_lock:
                    self._image_ids.pop(image, None)
                self.ensure_image(image)
                return str(self.api.create_container(image, **kwargs)["Id"])
            except docker.errors.APIError as exc:
                if not self.layers.refused(exc, host_config):
                    raise
                return create(network_mode)  # without the size option: the host watches the layer

        try:
            if network != "bridge":
                container_id = create(network)
            else:  # the sandboxes' own bridge (network.py), never Docker's default one
                try:
                    container_id = create(self.sandbox_bridge())
                except docker.errors.NotFound:  # pruned under a long-running server: made again
                    container_id = create(self.sandbox_bridge(refresh=True))
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise SandboxExistsError(f"a sandbox named {name!r} already exists") from exc
            raise
        self.layers.created(container_id, bounds)
        try:
            seed = self._tmp_seed(image)
        except BaseException:
            self.remove_container(container_id)
            raise
        if seed is not None:
            with self._seed_lock:
                self._pending_seeds[container_id] = seed
        return container_id

    def sandbox_bridge(self, *, refresh: bool = False) -> str:
        """The sandboxes' bridge network's name: found (or made) once per engine, which saves
        every create two engine requests; a create that finds it gone asks again."""
        with self._seed_lock:
            known = None if refresh else self._bridge
        if known is None:
            known = ensure_sandbox_network(self.api).name
            with self._seed_lock:
                self._bridge = known
        return known

    def start_container(self, container_id: str) -> None:
        self.api.start(container_id)
        with self._seed_lock:
            seed = self._pending_seeds.pop(container_id, None)
        if seed is not None:
            self.api.put_archive(container_id, "/", seed)
        self.layers.started(container_id)

    def _tmp_seed(self, image: str) -> bytes | None:
        """The image's own /tmp content, which the tmpfs mounted there would hide (None: empty)."""
        return self.tmp_seeds.seed(self._image_id(image))

    def _image_id(self, image: str) -> str:
        """The id of the image ``image`` names, looked up at most once per ``IMAGE_ID_RECHECK_SEC``
        per reference, so a create does not ask the engine (one request of a sandbox's four).
        A tag moved to another image is seen within that time (at once when the old image is
        gone: a create that finds no image forgets the reference); the content-addressed
        references our task images have never move."""
        now = time.monotonic()
        with self._seed_lock:
            known = self._image_ids.get(image)
        if known is not None and now - known[1] < IMAGE_ID_RECHECK_SEC:
            return known[0]
        image_id = str(self.api.inspect_image(image)["Id"])
        with self._seed_lock:
            self._image_ids[image] = (image_id, now)
        return image_id

    def remove_container(self, container_id: str, *, wait: bool = False, claimed: bool = True) -> bool:
        """Force-remove; tolerant of "already gone" and of auto-remove racing us. ``claimed=False``
        (a sandbox created, not claimed from a pool) skips removing a claim volume it never had.
        ``wait``: a removal the engine confirmed needs no polling; one already in progress does."""
        removed = True
        in_progress = False
        with self._seed_lock:
            self._pending_seeds.pop(container_id, None)
        self.layers.removed(container_id)
        try:
            # v=True: the anonymous /tmp volume goes with its container (auto_remove does the same)
            self.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            removed = False
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress (auto_remove)
                raise
            in_progress = True
        if claimed:
            inventory.remove_volume(self.api, inventory.claim_volume_name(container_id))
        if wait and in_progress:
            self._wait_gone(container_id)
        return removed

    def _wait_gone(self, container_id: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.02
        while time.monotonic() < deadline:
            try:
                self.api.inspect_container(container_id)
            except docker.errors.NotFound:
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        raise TimeoutError(f"container {container_id[:12]} still present after {timeout}s")

    def _nano_cpus(self, cpus: float | None) -> int | None:
        """Clamp to the engine's cores: a task asking for 4 CPUs still runs on a 2-core box."""
        if cpus is None:
            return None
        if cpus <= 0:
            raise ValueError("cpus must be positive")
        if cpus > self.ncpu:
            log.debug("clamping cpus=%s to the engine's %s cores", cpus, self.ncpu)
        return int(max(0.01, min(cpus, self.ncpu)) * 1e9)

    # lookups ---------------------------------------------------------------------------------

    def inspect_info(self, name_or_id: str) -> ContainerInfo | None:
        """A managed container by exact name or id, claim merged; None if absent/unmanaged."""
        try:
            data = self.api.inspect_container(name_or_id)
        except docker.errors.NotFound:
            return None
        name = data.get("Name", "").lstrip("/")
        if name_or_id not in (name, data["Id"]):  # inspect also matches id prefixes
            return None
        labels = (data.get("Config") or {}).get("Labels") or {}
        if labels.get(L.MANAGED) != "1":
            return None
        claim = None
        try:
            claim = self.api.inspect_volume(inventory.claim_volume_name(data["Id"])).get("Labels")
        except docker.errors.NotFound:
            pass
        return ContainerInfo(
            id=data["Id"],
            name=name,
            image=(data.get("Config") or {}).get("Image", ""),
            state=(data.get("State") or {}).get("Status", "unknown"),
            labels=labels,
            claim=claim,
        )

    def ensure_name_free(self, name: str) -> None:
        """Clear a stale holder of *name* (expired, stopped, dead owner); refuse a live one."""
        try:
            data = self.api.inspect_container(name)
        except docker.errors.NotFound:
            return
        if data.get("Name", "").lstrip("/") != name:
            return
        info = self.inspect_info(name)
        if info is not None and docker_reap.stale_reason(info, time.time(), dead_owners=True) is not None:
            log.info("removing stale sandbox %s to reuse its name", name)
            self.remove_container(info.id, wait=True)
            return
        raise SandboxExistsError(f"a sandbox named {name!r} already exists")

    # housekeeping ----------------------------------------------------------------------------

    def maybe_auto_reap(self) -> None:
        """Reap in the background at most once a minute, so crashes do not accumulate."""
        if not docker_reap.auto_reap_enabled() or time.monotonic() - self._last_auto_reap < AUTO_REAP_INTERVAL_SEC:
            return
        self._last_auto_reap = time.monotonic()
        executor().submit(docker_reap.background_reap, self)


_engine_lock = threading.Lock()
_engine_instance: Engine | None = None


def get_engine() -> Engine:
    """The process's engine (made on first use), carrying the settings as this call into the SDK
    finds them: the Docker SDK's one reading of the settings, once per call, as each call of
    SkyPilot's SDK reads its own configuration (a bound set before a create applies to it)."""
    global _engine_instance
    config = DockerConfig.of(settings.current())
    with _engine_lock:
        if _engine_instance is None:
            _engine_instance = Engine(config)
        else:
            _engine_instance.config = config
        return _engine_instance


def sandbox_network() -> SandboxNetwork:
    """The sandboxes' bridge on this process's Docker engine, created if missing."""
    return ensure_sandbox_network(get_engine().api)


def _ulimits(bounds: SandboxBounds) -> list[docker.types.Ulimit] | None:
    """The file size limit, soft and hard (root may lower, never raise, a hard limit without
    CAP_SYS_RESOURCE, which Docker's default set does not grant)."""
    if (limit := bounds.file_size_limit) is None:
        return None
    return [docker.types.Ulimit(name="fsize", soft=limit, hard=limit)]
