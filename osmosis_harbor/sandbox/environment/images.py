"""The environment's images: which reference, whether it exists, and its one build and push.

What ours do in place of Harbor's image methods:

* one image per environment *content* (``environment_id``), whatever the task is called, so
  tasks sharing an ``environment/`` share one build;
* existence answered correctly for plain-http registries and images kept on the local engine;
* with the Docker SDK and no registry, images stay on the local engine (never pushed); with a
  registry, Harbor's build and push (``docker build --platform``, ``docker push``: the same two
  commands as ``SkypilotEnvironment._build_and_push_image``) run once per attempt of our retry,
  which knows that a missing base image stays missing;
* concurrent trials of one environment build it once per owner (``SandboxOwner.builds``).

The engine calls themselves are ``images.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from osmosis_harbor.errors import BaseImageMissingError, DockerSdkMissingError, ImageBuildError
from osmosis_harbor.sandbox.images.base_images import missing_base_error
from osmosis_harbor.sandbox.images.build_failure import last_lines, parse_build_failure
from osmosis_harbor.sandbox.images.builds import (
    ImageBuildCoordinator,
    build_detached,
    build_image,
    local_image_exists,
    registry_image_exists,
    remove_failed_build_containers,
)
from osmosis_harbor.shim import contract

__all__ = ["NEEDS_A_REGISTRY", "ImageResolver", "ImageSource", "declares_baked_layout"]

LOCAL_IMAGE_NAMESPACE = "osmosis-harbor"
SHARED_REPOSITORY = "osmosis-harbor-env"
# Harbor's words when a task needs an image built and no registry can hold it.
NEEDS_A_REGISTRY = (
    "The skypilot environment needs a container registry to build and push task images. Set the "
    "'registry' environment kwarg or the HARBOR_SKYPILOT_REGISTRY environment variable, or use a "
    "prebuilt [environment].docker_image or a warm 'pool'."
)


def declares_baked_layout(dockerfile: Path) -> bool:
    """Whether this Dockerfile bakes a bundle in (the patch's marker comment), so its image
    holds Harbor's log dirs empty and world-writable (``contract.LAYOUT_DIRS``)."""
    try:
        text = dockerfile.read_text(encoding="utf-8")
    except OSError:
        return False
    return any(line.startswith(contract.BAKED_BUNDLE_COMMENT) for line in text.splitlines())


def _worth_retrying(error: BaseException) -> bool:
    """A failed build is tried once more, except a missing base image (it stays missing) and a
    cancellation (tenacity would otherwise swallow it and build again)."""
    return isinstance(error, Exception) and not isinstance(error, BaseImageMissingError)


def _local_image_known(ref: str) -> bool:
    """Whether the local engine has ``ref``; False where docker-py cannot ask (an error report
    must not fail on the question)."""
    try:
        return local_image_exists(ref)
    except DockerSdkMissingError:
        return False


@dataclass(frozen=True)
class ImageSource:
    """What this environment's image is built from, and where it is kept (decided at init)."""

    environment_dir: Path
    dockerfile: Path
    docker_image: str | None  # a task's prebuilt image: nothing to build
    registry: str | None
    platform: str
    local_only: bool  # sandboxes on the engine that builds need no registry: images stay local


async def _run(*argv: str) -> tuple[int | None, str]:
    """A docker CLI command's exit status and combined output."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    stdout, _ = await process.communicate()
    return process.returncode, stdout.decode(errors="replace")


async def manifest_exists(ref: str) -> bool:
    """Harbor's existence check, ``docker manifest inspect`` (for want of docker-py)."""
    process = await asyncio.create_subprocess_exec(
        "docker", "manifest", "inspect", ref, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await process.wait() == 0


async def build_and_push(source: ImageSource, ref: str, logger: logging.Logger) -> None:
    """One attempt of Harbor's build and push: its two CLI commands, its RuntimeError words
    (``docker build failed for REF: OUTPUT``), which `ImageResolver._build_error` reads."""
    logger.debug(f"Building and pushing image: {ref}")
    platform = ["--platform", source.platform] if source.platform else []
    code, output = await _run(
        "docker", "build", *platform, "-t", ref, "-f", str(source.dockerfile), str(source.environment_dir)
    )
    if code != 0:
        raise RuntimeError(f"docker build failed for {ref}: {output}")
    code, output = await _run("docker", "push", ref)
    if code != 0:
        raise RuntimeError(f"docker push failed for {ref}: {output}")
    logger.debug(f"Successfully built and pushed: {ref}")


class ImageResolver:
    """Harbor's image methods, content-addressed and built once (see the module docstring)."""

    def __init__(
        self,
        source: ImageSource,
        environment_id: str,
        builds: ImageBuildCoordinator,
        logger: logging.Logger,
    ) -> None:
        self._source = source
        self._environment_id = environment_id
        self._builds = builds
        self._logger = logger

    @property
    def ref(self) -> str:
        """One image per environment *content*, whatever the task is called.

        Harbor names the repository after the task, so tasks that share an environment
        each build and push their own copy. Keying by the content hash alone lets every
        task with the same ``environment/`` share one build.
        """
        source = self._source
        if source.local_only:
            return f"{LOCAL_IMAGE_NAMESPACE}/env:{self._environment_id}"
        if not source.registry:
            raise RuntimeError(NEEDS_A_REGISTRY)
        return f"{source.registry.rstrip('/')}/{SHARED_REPOSITORY}:{self._environment_id}"

    async def exists(self) -> bool:
        """Harbor asks ``docker manifest inspect``, which answers "missing" for a plain-http
        registry (127.0.0.1:5000) and knows nothing of images kept on the local engine."""
        ref = self.ref
        if self._source.local_only:
            return await asyncio.to_thread(local_image_exists, ref)
        try:
            return await asyncio.to_thread(registry_image_exists, ref)
        except DockerSdkMissingError:
            return await manifest_exists(ref)  # no docker-py: Harbor's own CLI check

    @retry(
        stop=stop_after_attempt(2),
        wait=wait_exponential(multiplier=2, min=5, max=60),
        retry=retry_if_exception(_worth_retrying),
        reraise=True,
    )
    async def build(self) -> None:
        """With a registry: Harbor's build and push (``docker build`` / ``docker push``),
        one attempt of it per attempt here, so that a missing base image is not built twice. Without a registry, sandboxes run on the
        engine that builds: built there, never pushed (Harbor's would push to Docker Hub)."""
        ref, source = self.ref, self._source
        if source.local_only:
            self._logger.debug(f"Building image {ref}")
            await build_detached(build_image, source.environment_dir, source.dockerfile, ref, source.platform)
            return
        try:
            await build_and_push(source, ref, self._logger)
        except RuntimeError as exc:
            await asyncio.to_thread(remove_failed_build_containers, str(exc))
            raise self._build_error(ref, str(exc)) from exc

    def _build_error(self, ref: str, harbor_message: str) -> ImageBuildError:
        """Harbor's build failure (a RuntimeError carrying the whole build output) as ours: a
        missing base image named with its remedy, or, first, the failing step and its exit code
        (a trial's report keeps the first line; Harbor's output starts with Docker's legacy-builder
        notice), then the step's output tail (phase ``environment``)."""
        lines = harbor_message.splitlines()
        last = next((line for line in reversed(lines) if line.strip()), "")
        missing = missing_base_error(self._source.dockerfile, ref, _local_image_known, last)
        if missing is not None:
            return missing
        prefix = f"docker build failed for {ref}: "
        output = harbor_message.removeprefix(prefix) if harbor_message.startswith(prefix) else harbor_message
        if harbor_message.startswith(f"docker push failed for {ref}"):
            return ImageBuildError(
                "\n".join(lines[:1] + [last_lines("\n".join(lines[1:]))]).rstrip(), engine_error=last
            )
        return ImageBuildError(parse_build_failure(ref, output, last).message(), engine_error=last)

    def _built_here(self) -> bool:
        """Whether this owner built this environment in place of its prebuilt image (a forced
        build). Harbor starts a separate verifier without ``force_build``: it gets the image its
        trial's agent got. Nothing is built where there is no reference to build to."""
        source = self._source
        return bool(source.local_only or source.registry) and self._builds.built_here(self.ref)

    async def prepare(self, force_build: bool = False) -> tuple[str | None, bool]:
        """Make this environment's image available; returns (reference, built-by-this-call).

        A task's prebuilt ``docker_image`` is returned as it is (nothing to build). Concurrent
        trials of one environment build it once (the owner's ``ImageBuildCoordinator``).
        """
        source = self._source
        forced = force_build or self._built_here()
        if source.docker_image and not (forced and source.dockerfile.is_file()):
            return source.docker_image, False
        ref = self.ref
        built = await self._builds.ensure(ref, exists=self.exists, build=self.build, force_build=force_build)
        return ref, built
