"""Task images: existence checks that work against insecure/local registries, and
building each environment image exactly once per owner however many trials ask.

Harbor's ``SkypilotEnvironment`` asks ``docker manifest inspect`` whether an image exists.
Without ``--insecure`` that fails against a plain-http registry such as
``127.0.0.1:5000``, so Harbor rebuilds and re-pushes on every trial; and nothing stops
ten concurrent trials of the same environment from building it ten times. This module
answers existence through the engine (which knows which registries are insecure) and
serialises builds per image reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_harbor.errors import DockerSdkMissingError, ImageBuildError
from osmosis_harbor.sandbox.images import holds as image_holds
from osmosis_harbor.sandbox.images.base_images import missing_base_error
from osmosis_harbor.sandbox.images.build_failure import parse_build_failure
from osmosis_harbor.sandbox.images.docker_py import docker_py

logger = logging.getLogger(__name__)


def _docker_client() -> Any:  # docker.DockerClient: docker-py is untyped, and imported only when asked
    return docker_py().from_env()


def local_image_exists(ref: str) -> bool:
    """Whether the local engine has ``ref``."""
    try:
        _docker_client().images.get(ref)
        return True
    except docker_py().errors.ImageNotFound:
        return False


def local_image_labels(ref: str) -> dict[str, str] | None:
    """The labels of ``ref`` on the local engine (``{}`` for none); None when it is absent or the
    engine cannot be asked."""
    try:
        return dict(_docker_client().images.get(ref).labels or {})
    except docker_py().errors.DockerException:
        return None


def remove_local_image(ref: str) -> None:
    """Remove ``ref`` from the local engine, if it is there."""
    try:
        _docker_client().images.remove(ref, force=True)
    except docker_py().errors.ImageNotFound:
        pass


def registry_image_exists(ref: str) -> bool:
    """Whether a registry holds ``ref``, plain-http local registries included.

    The engine's distribution endpoint honours its insecure-registry settings (loopback
    registries are insecure by default), which ``docker manifest inspect`` without
    ``--insecure`` does not.
    """
    try:
        _docker_client().images.get_registry_data(ref)
        return True
    except (docker_py().errors.NotFound, docker_py().errors.APIError):
        return False


@dataclass
class ImageBuildStats:
    """What one owner did per image reference (for prewarm reports and benchmarks)."""

    built: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)


class ImageBuildCoordinator:
    """Ensures an image reference is built (and pushed) at most once per owner.

    It belongs to an owner (a backend, a validation run: ``sandbox.owner.context``), never to
    the process, so one backend's builds never make another's ``force_build`` a no-op.
    Concurrent callers for the same reference wait on one lock (dropped once nobody waits);
    once the image is known to exist the answer is cached, so later trials skip even the
    existence check, and this process holds the image (``images/holds.py``): another process's
    clean-up leaves it.
    """

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: Counter[str] = Counter()
        self._guard = threading.Lock()
        self._present: set[str] = set()
        self._built_here: set[str] = set()
        self.stats = ImageBuildStats()

    @contextlib.asynccontextmanager
    async def _locked(self, ref: str) -> AsyncIterator[None]:
        with self._guard:
            lock = self._locks.setdefault(ref, asyncio.Lock())
            self._users[ref] += 1
        try:
            async with lock:
                yield
        finally:
            with self._guard:
                self._users[ref] -= 1
                if self._users[ref] <= 0:
                    del self._users[ref]
                    self._locks.pop(ref, None)

    def built_here(self, ref: str) -> bool:
        """Whether this owner built ``ref`` (a forced build: the prebuilt image was set aside)."""
        with self._guard:
            return ref in self._built_here

    def forget(self, ref: str) -> None:
        """Drop the cached 'present' answer (e.g. after the image was deleted)."""
        with self._guard:
            self._present.discard(ref)

    async def ensure(
        self,
        ref: str,
        *,
        exists: Callable[[], Awaitable[bool]],
        build: Callable[[], Awaitable[None]],
        force_build: bool = False,
    ) -> bool:
        """Make ``ref`` available; returns True when this call built it.

        ``force_build`` distrusts what the registry says, not what this owner built: a forced
        run still builds each environment once, not once per trial.
        """
        if self._satisfied(ref, force_build):
            return False
        async with self._locked(ref):
            if self._satisfied(ref, force_build):
                return False
            if not force_build and await exists():
                await asyncio.to_thread(image_holds.hold, ref)
                with self._guard:
                    self._present.add(ref)
                    self.stats.reused.append(ref)
                return False
            await build()
            await asyncio.to_thread(image_holds.hold, ref)  # so no other process's clean-up removes it
            with self._guard:
                self._present.add(ref)
                self._built_here.add(ref)
                self.stats.built.append(ref)
            return True

    def _satisfied(self, ref: str, force_build: bool) -> bool:
        with self._guard:
            return ref in (self._built_here if force_build else self._present)


async def build_detached(build: Callable[..., None], *args: Any) -> None:
    """``build(*args)`` (``build_image``) in a daemon thread of its own. Why: a build cannot be
    interrupted from another thread, and an executor thread would hold a stopping process until
    the build ends (minutes for a first build); a daemon thread dies with the process, whose
    engine connection closing stops the build. Cancelling this coroutine stops the wait only."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def work() -> None:
        error: BaseException | None = None
        try:
            build(*args)
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=work, name="osmosis-harbor-build", daemon=True).start()
    await done


def build_image(context_dir: Path, dockerfile: Path, ref: str, platform: str | None) -> None:
    """Build ``ref`` from ``context_dir`` on the local engine (docker SDK, legacy builder).

    A build that failed because a ``FROM`` image is absent and unpullable raises
    ``BaseImageMissingError`` naming that image (see ``images/base_images.py``)."""
    try:
        _build(context_dir, dockerfile, ref, platform)
    except ImageBuildError as exc:
        missing = missing_base_error(dockerfile, ref, local_image_exists, exc.engine_error)
        if missing is not None:
            raise missing from None
        raise


def _build(context_dir: Path, dockerfile: Path, ref: str, platform: str | None) -> None:
    client = _docker_client()
    log: list[str] = []
    try:
        stream = client.api.build(
            path=str(context_dir),
            dockerfile=str(dockerfile.relative_to(context_dir)),
            tag=ref,
            rm=True,
            forcerm=True,
            decode=True,
            platform=platform,
        )
        for chunk in stream:
            if "stream" in chunk:
                log.append(chunk["stream"])
            if "error" in chunk:
                error = str(chunk["error"]).strip()
                failure = parse_build_failure(ref, "".join(log), error)
                raise ImageBuildError(failure.message(), engine_error=error)
    except docker_py().errors.APIError as exc:
        error = str(exc.explanation or exc)
        raise ImageBuildError(f"docker build failed for {ref}: {error}", engine_error=error) from exc


def push_image(ref: str) -> None:
    """Push ``ref`` to its registry, surfacing the engine's error text."""
    client = _docker_client()
    repo, _, tag = ref.rpartition(":")
    for chunk in client.api.push(repo, tag=tag, stream=True, decode=True):
        if "error" in chunk:
            raise ImageBuildError(f"docker push failed for {ref}: {chunk['error'].strip()}")


_RUNNING_IN = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})\s*$", re.MULTILINE)


def remove_failed_build_containers(build_output: str) -> list[str]:
    """Remove the containers a failed ``docker build`` left behind, named in its own output.

    Why: Harbor builds with the Docker CLI's legacy builder and without ``--force-rm``, so a
    failing ``RUN`` step leaves its stopped intermediate container on the engine, one per failed
    attempt, forever. Only the ids the build itself printed (`` ---> Running in <id>``) are
    touched, so nobody else's containers are. Returns the ids removed."""
    try:
        client = _docker_client()
    except DockerSdkMissingError:
        return []  # without docker-py the leftovers stay for `docker container prune`
    removed: list[str] = []
    for container_id in dict.fromkeys(_RUNNING_IN.findall(build_output)):
        try:
            client.api.remove_container(container_id, force=True)
        except docker_py().errors.NotFound:
            continue  # the step succeeded and the builder removed it already
        except docker_py().errors.APIError:
            continue  # best effort: a leftover is not worth failing the build report over
        removed.append(container_id)
    return removed


def names_registry(ref: str) -> bool:
    """Whether ``ref`` starts with a registry host (``host.domain/...``, ``host:port/...``)."""
    first, sep, _ = ref.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def publish_local_image(image: str, registry: str) -> str:
    """``image`` from the local engine, tagged and pushed as ``{registry}/{image}``: for an SDK
    whose sandboxes pull by reference (the skypilot-emulator, SkyPilot) and a locally made image."""
    ref = f"{registry.rstrip('/')}/{image if ':' in image.rsplit('/', 1)[-1] else image + ':latest'}"
    repository, _, tag = ref.rpartition(":")
    try:
        _docker_client().images.get(image).tag(repository, tag)
    except docker_py().errors.ImageNotFound as exc:
        raise ImageBuildError(f"image {image!r} is not on the local engine: build or load it first") from exc
    push_image(ref)
    return ref
