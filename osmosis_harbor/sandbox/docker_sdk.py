"""A Docker-backed implementation of the ``sky.sandbox`` SDK surface that Harbor calls.

Harbor's ``SkypilotEnvironment`` talks to ``sky.sandbox`` (``create.aio``, ``exec.aio`` +
``await handle.wait()``, ``write_bytes.aio``, ``read_bytes.aio``, ``terminate.aio``, pools via
``create(pool=)``). SkyPilot sandboxes need the SkyPilot Platform; this module gives the same
surface on a local Docker engine so trials, tests and benchmarks run on one machine, and so that
``conformance.py`` can prove both implementations agree.

How the semantics are mapped:

* A sandbox is a container running ``sleep <ttl>`` under ``init=True``: the TTL is enforced by
  the container itself (``auto_remove`` deletes it when the sleep ends), and ``reap()`` removes
  what a crash left behind (expired, stopped, or owned by a dead process).
* ``exec`` is ``docker exec`` with an argv list, no implicit shell. Runc makes every exec a
  session leader, so a timeout SIGKILLs the whole session from the host (the engine runs on
  this machine), and reports 124 like ``timeout(1)``.
* Files go through the engine's archive API (``put_archive`` / ``get_archive``): binary-safe,
  no shell quoting, works for any size.
* All state lives in the engine (labels, names, labelled volumes), so any process can list,
  adopt or clean up what another created. Pools are in ``docker_pools``.

Every call is a blocking function with an ``.aio`` coroutine twin. The blocking work runs on a
dedicated thread pool sized for many concurrent exec waits (the default executor is small and
shared with the rest of the program).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import errno
import functools
import hashlib
import heapq
import io
import ipaddress
import itertools
import json
import logging
import os
import posixpath
import signal
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from osmosis_harbor.sandbox import docker_pools as pools_mod
from osmosis_harbor.sandbox import labels as L
from osmosis_harbor.sandbox.docker_pools import PoolManager, list_containers, removed_record
from osmosis_harbor.sandbox.labels import (
    ContainerInfo,
    DockerEngineUnavailable,
    ImageNotFoundError,
    Network,
    Owner,
    PoolExistsError,
    PoolInfo,
    PoolNotFoundError,
    PoolSpec,
    RemovedContainer,
    Role,
    SandboxExistsError,
    SandboxNotFoundError,
    SandboxRecord,
)

__all__ = [
    "AsyncExecHandle",
    "DockerEngineUnavailable",
    "DockerSandbox",
    "ExecHandle",
    "ImageNotFoundError",
    "PoolExistsError",
    "PoolInfo",
    "PoolNotFoundError",
    "PoolSpec",
    "RemovedContainer",
    "SandboxExistsError",
    "SandboxNotFoundError",
    "SandboxRecord",
    "create",
    "create_pool",
    "delete_pool",
    "get",
    "get_pool",
    "list_pools",
    "ls",
    "pause_auto_reap",
    "reap",
    "remove_all",
    "set_pool_size",
    "terminate_by_name",
]

log = logging.getLogger(__name__)

DEFAULT_TTL_SEC = 86_400
MAX_EXEC_TIMEOUT_SEC = 3600
TIMEOUT_EXIT_CODE = 124
EXECUTOR_WORKERS = 128
API_TIMEOUT_SEC = 120
# After a timeout kill, give the output stream this long to drain before abandoning it (a
# daemonised grandchild can keep the pipe open; the caller must still get its 124).
KILL_GRACE_SEC = 5.0
AUTO_REAP_INTERVAL_SEC = 60.0
# A sandbox stuck in "created" this long lost the process that was starting it.
STALE_CREATED_SEC = 120.0
_MODE_DIR = 1 << 31
_MODE_SYMLINK = 1 << 27
_MAX_SYMLINK_HOPS = 8


# ── executor and sync/async duality ──────────────────────────────────────────────────────────

_executor_lock = threading.Lock()
_executor_instance: concurrent.futures.ThreadPoolExecutor | None = None


def executor() -> concurrent.futures.ThreadPoolExecutor:
    """The SDK's own pool: every running exec holds one thread while it streams output."""
    global _executor_instance
    with _executor_lock:
        if _executor_instance is None:
            _executor_instance = concurrent.futures.ThreadPoolExecutor(
                max_workers=EXECUTOR_WORKERS, thread_name_prefix="osmosis-docker-sdk"
            )
        return _executor_instance


def _abandon(callback: Callable[[Any], None], future: concurrent.futures.Future[Any]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    try:
        callback(future.result())
    except Exception:
        log.exception("cleanup of an abandoned call failed")


async def run_blocking[R](fn: Callable[[], R], *, on_abandon: Callable[[R], None] | None = None) -> R:
    """Run *fn* on the SDK executor; if the awaiting task is cancelled, clean up its result.

    Without ``on_abandon`` a ``create.aio`` cancelled mid-flight would leave a container nobody
    holds a handle to (until its TTL).
    """
    future = executor().submit(fn)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        if on_abandon is not None:
            future.add_done_callback(functools.partial(_abandon, on_abandon))
        raise


class Dual[**P, R]:
    """A blocking callable that also offers ``.aio`` (the shape of the ``sky.sandbox`` API).

    Works on module functions and, as a descriptor, on methods.
    """

    def __init__(self, fn: Callable[P, R], *, on_abandon: Callable[[R], None] | None = None) -> None:
        self._fn = fn
        self._on_abandon = on_abandon
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._fn(*args, **kwargs)

    async def aio(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return await run_blocking(functools.partial(self._fn, *args, **kwargs), on_abandon=self._on_abandon)

    def __get__(self, obj: object, objtype: type | None = None) -> Dual[..., R]:
        if obj is None:
            return self
        bound: Callable[..., R] = functools.partial(self._fn, obj)  # type: ignore[arg-type]
        return Dual(bound, on_abandon=self._on_abandon)


def dual[**P, R](fn: Callable[P, R]) -> Dual[P, R]:
    """Decorator form of `Dual`."""
    return Dual(fn)


# ── deadlines ────────────────────────────────────────────────────────────────────────────────


class _Deadlines:
    """One timer thread for all exec timeouts (a thread per exec would double the threads).

    A fired callback gets a short-lived thread of its own, not an executor slot: when every
    executor thread is busy draining a running command, the kill that frees one must still run.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, list[Any]]] = []
        self._cond = threading.Condition()
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, delay: float, callback: Callable[[], None]) -> list[Any]:
        """Returns a token for `cancel`."""
        entry: list[Any] = [callback, False]
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._counter), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="osmosis-docker-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
        return entry

    @staticmethod
    def cancel(entry: list[Any]) -> None:
        """Drop the callback too: the entry stays queued until its time, its exec's output need not."""
        entry[1] = True
        entry[0] = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                when, _, entry = self._heap[0]
                wait = when - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            callback = entry[0]
            if not entry[1] and callback is not None:
                threading.Thread(target=self._fire, args=(callback,), name="osmosis-docker-timeout", daemon=True).start()

    @staticmethod
    def _fire(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("exec timeout handling failed")


# ── engine ───────────────────────────────────────────────────────────────────────────────────


def _engine_url() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


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


class _Engine:
    """One Docker client per process, plus the container primitives the pools borrow."""

    def __init__(self) -> None:
        url = _engine_url()
        try:
            self.client = docker.from_env(version="auto", timeout=API_TIMEOUT_SEC, max_pool_size=EXECUTOR_WORKERS)
            info = self.client.info()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise DockerEngineUnavailable(
                f"Docker engine not reachable at {url}: start dockerd or run scripts/bootstrap.sh ({exc})"
            ) from exc
        self.api = self.client.api
        self.ncpu = float(info.get("NCPU") or os.cpu_count() or 1)
        self.key = hashlib.sha256(f"{url}|{info.get('ID', '')}".encode()).hexdigest()[:12]
        self.deadlines = _Deadlines()
        self.pools = PoolManager(self.api, self, executor().submit, engine_key=self.key)
        self._last_auto_reap = 0.0

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
        """Create (not start) a container whose main process is the TTL itself."""
        host_config = self.api.create_host_config(
            init=True,
            auto_remove=True,
            nano_cpus=self._nano_cpus(cpus),
            mem_limit=int(memory_gb * 1024**3) if memory_gb else None,
            network_mode=None if network == "bridge" else network,
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
            try:
                return str(self.api.create_container(image, **kwargs)["Id"])
            except docker.errors.ImageNotFound:
                self.ensure_image(image)
                return str(self.api.create_container(image, **kwargs)["Id"])
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise SandboxExistsError(f"a sandbox named {name!r} already exists") from exc
            raise

    def start_container(self, container_id: str) -> None:
        self.api.start(container_id)

    def remove_container(self, container_id: str, *, wait: bool = False) -> bool:
        """Force-remove; tolerant of "already gone" and of auto-remove racing us."""
        removed = True
        try:
            self.api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            removed = False
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress (auto_remove)
                raise
        pools_mod.remove_volume(self.api, pools_mod.claim_volume_name(container_id))
        if wait:
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
            claim = self.api.inspect_volume(pools_mod.claim_volume_name(data["Id"])).get("Labels")
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
        if info is not None and stale_reason(info, time.time(), dead_owners=True) is not None:
            log.info("removing stale sandbox %s to reuse its name", name)
            self.remove_container(info.id, wait=True)
            return
        raise SandboxExistsError(f"a sandbox named {name!r} already exists")

    # housekeeping ----------------------------------------------------------------------------

    def maybe_auto_reap(self) -> None:
        """Reap in the background at most once a minute, so crashes do not accumulate."""
        if not _auto_reap_enabled or time.monotonic() - self._last_auto_reap < AUTO_REAP_INTERVAL_SEC:
            return
        self._last_auto_reap = time.monotonic()

        def run() -> None:
            try:
                with _reap_lock:
                    if _auto_reap_enabled:
                        _reap_locked(self, expired=True, dead_owners=True)
            except Exception:
                log.exception("background reap failed")

        executor().submit(run)


_engine_lock = threading.Lock()
_engine_instance: _Engine | None = None


def _engine() -> _Engine:
    global _engine_instance
    with _engine_lock:
        if _engine_instance is None:
            _engine_instance = _Engine()
        return _engine_instance


# ── exec ─────────────────────────────────────────────────────────────────────────────────────


def _proc_stat(pid_dir: Path) -> tuple[int, int] | None:
    """(process group, session) of a /proc entry, or None if it vanished."""
    try:
        fields = (pid_dir / "stat").read_text().rsplit(")", 1)[-1].split()
        return int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None


def _kill_session(leader_pid: int, container_id: str) -> bool:
    """SIGKILL every process in the exec's session (its group and any group it made).

    ``leader_pid`` is the host pid the engine reports. Guarded so a pid from another pid
    namespace (remote engine) can never hit an unrelated local process: the leader must sit in
    this container's cgroup, and victims must share its pid namespace.
    """
    leader = Path("/proc") / str(leader_pid)
    try:
        if container_id not in (leader / "cgroup").read_text():
            return False
        pid_ns = os.readlink(leader / "ns" / "pid")
    except OSError:
        return False
    killed = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        ids = _proc_stat(entry)
        if ids is None or leader_pid not in ids:
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != pid_ns:
                continue
            os.kill(int(entry.name), signal.SIGKILL)
            killed = True
        except (OSError, ProcessLookupError):
            continue
    return killed


class _ExecRun:
    """One running command: its output buffers, its deadline and its exit code future."""

    def __init__(self, engine: _Engine, container_id: str, exec_id: str, stream: Any, timeout: float) -> None:
        self._engine = engine
        self._container_id = container_id
        self._exec_id = exec_id
        self._stream = stream
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.timed_out = False
        self._deadline: list[Any] | None = None
        self._grace: list[Any] | None = None
        self.future: concurrent.futures.Future[int] = executor().submit(self._drain)
        self._deadline = engine.deadlines.schedule(timeout, self._on_timeout)

    def _drain(self) -> int:
        try:
            for out, err in self._stream:
                if out:
                    self.stdout += out
                if err:
                    self.stderr += err
        except (OSError, ValueError) as exc:  # stream closed under us after a timeout
            if not self.timed_out:
                raise
            log.debug("exec stream closed after timeout: %s", exc)
        finally:
            for token in (self._deadline, self._grace):
                if token is not None:
                    self._engine.deadlines.cancel(token)
            self._stream.close()
        return TIMEOUT_EXIT_CODE if self.timed_out else self._exit_code()

    def _exit_code(self) -> int:
        """The stream can end a moment before the engine records the exit code: poll briefly."""
        deadline = time.monotonic() + 10.0
        delay = 0.002
        while True:
            info = self._engine.api.exec_inspect(self._exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else -1
            if time.monotonic() > deadline:
                raise TimeoutError(f"exec {self._exec_id[:12]} output ended but it still runs")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _on_timeout(self) -> None:
        if self.future.done():  # finished while the timer fired
            return
        self.timed_out = True
        self.kill()
        self._grace = self._engine.deadlines.schedule(KILL_GRACE_SEC, self._abandon_stream)

    def kill(self) -> None:
        try:
            info = self._engine.api.exec_inspect(self._exec_id)
        except docker.errors.APIError:
            return
        if info.get("Running") and info.get("Pid") and not _kill_session(int(info["Pid"]), self._container_id):
            log.warning("cannot kill exec %s from the host (remote engine?)", self._exec_id[:12])

    def _abandon_stream(self) -> None:
        if not self.future.done():
            log.warning("exec %s output still open %ss after kill; closing it", self._exec_id[:12], KILL_GRACE_SEC)
            self._stream.close()


class OutputStream:
    """``handle.stdout`` / ``handle.stderr``: ``read()`` returns the whole output as text."""

    def __init__(self, run: _ExecRun, which: str) -> None:
        self._run = run
        self._which = which

    def read_bytes(self) -> bytes:
        self._run.future.result()
        return bytes(getattr(self._run, self._which))

    def read(self) -> str:
        """Blocks until the command ends (immediate after ``wait()``)."""
        return self.read_bytes().decode("utf-8", errors="replace")


class _HandleBase:
    def __init__(self, run: _ExecRun) -> None:
        self._run = run
        self.stdout = OutputStream(run, "stdout")
        self.stderr = OutputStream(run, "stderr")

    @property
    def returncode(self) -> int | None:
        future = self._run.future
        return future.result() if future.done() else None

    @property
    def timed_out(self) -> bool:
        return self._run.timed_out

    def kill(self) -> None:
        """Kill the command's whole session now (not reported as a timeout)."""
        self._run.kill()


class ExecHandle(_HandleBase):
    """Returned by the blocking ``sandbox.exec(...)``: ``wait()`` blocks."""

    def wait(self, timeout: float | None = None) -> int:
        return self._run.future.result(timeout)


class AsyncExecHandle(_HandleBase):
    """Returned by ``await sandbox.exec.aio(...)``: ``await handle.wait()`` (what Harbor does)."""

    async def wait(self) -> int:
        return await asyncio.wrap_future(self._run.future)


class _ExecMethod:
    """``sandbox.exec(*argv, ...)`` and ``await sandbox.exec.aio(*argv, ...)``."""

    def __init__(self, sandbox: DockerSandbox) -> None:
        self._sandbox = sandbox

    def __call__(
        self,
        *argv: str,
        workdir: str | None = None,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecHandle:
        return ExecHandle(self._sandbox._launch(argv, workdir, timeout_seconds, env))

    async def aio(
        self,
        *argv: str,
        workdir: str | None = None,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncExecHandle:
        launch = functools.partial(self._sandbox._launch, argv, workdir, timeout_seconds, env)
        run = await run_blocking(launch, on_abandon=lambda r: r.kill())
        return AsyncExecHandle(run)


def _exec_timeout(timeout_seconds: float | None) -> float:
    """Default and ceiling are SkyPilot's server-side cap; larger values are clamped like it."""
    if timeout_seconds is None:
        return float(MAX_EXEC_TIMEOUT_SEC)
    if timeout_seconds <= 0:
        raise ValueError("timeout_seconds must be positive")
    return float(min(timeout_seconds, MAX_EXEC_TIMEOUT_SEC))


def _check_env(env: Mapping[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise ValueError(f"invalid environment entry {key!r}: keys and values must be strings, keys without '='")
    return dict(env)


# ── files ────────────────────────────────────────────────────────────────────────────────────


def _abs_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"sandbox paths must be absolute, got {path!r}")
    return posixpath.normpath(path)


def _file_tar(base: str, new_dirs: list[str], path: str, data: bytes) -> bytes:
    """A tar of the missing parent directories (0755) and the file (0644), relative to *base*."""
    buf = io.BytesIO()
    mtime = time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in new_dirs:
            info = tarfile.TarInfo(posixpath.relpath(directory, base))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        info = tarfile.TarInfo(posixpath.relpath(path, base))
        info.size, info.mode, info.mtime = len(data), 0o644, mtime
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _single_file(archive: bytes, path: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.next()
        if member is None or not member.isfile():
            raise IsADirectoryError(errno.EISDIR, "not a regular file in the sandbox", path)
        extracted = tar.extractfile(member)
        assert extracted is not None
        return extracted.read()


# ── sandbox ──────────────────────────────────────────────────────────────────────────────────


class DockerSandbox:
    """A live sandbox: a container plus the persistent env applied to every exec.

    The persistent env is merged into each exec rather than relying on the container's env, so
    a pool claim (whose container env was fixed before the claim) behaves like a fresh create.
    """

    def __init__(
        self,
        engine: _Engine,
        *,
        name: str,
        container_id: str,
        image: str,
        pool: str | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._engine = engine
        self._name = name
        self._id = container_id
        self._image = image
        self._pool = pool
        self._env = dict(env or {})

    def __repr__(self) -> str:
        return f"DockerSandbox(name={self._name!r}, id={self._id[:12]!r}, image={self._image!r}, pool={self._pool!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def id(self) -> str:
        return self._id

    @property
    def image(self) -> str:
        return self._image

    @property
    def pool(self) -> str | None:
        return self._pool

    @property
    def exec(self) -> _ExecMethod:
        return _ExecMethod(self)

    def _gone(self, exc: Exception) -> SandboxNotFoundError:
        return SandboxNotFoundError(f"sandbox {self._name!r} is gone (terminated, expired or reaped): {exc}")

    def _launch(
        self,
        argv: Sequence[str],
        workdir: str | None,
        timeout_seconds: float | None,
        env: Mapping[str, str] | None,
    ) -> _ExecRun:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("exec needs a non-empty argv of strings (no implicit shell)")
        timeout = _exec_timeout(timeout_seconds)
        environment = {**self._env, **_check_env(env or {})}
        api = self._engine.api
        try:
            exec_id = api.exec_create(
                self._id,
                list(argv),
                stdout=True,
                stderr=True,
                environment=environment or None,
                workdir=workdir or None,
            )["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=True)
        except docker.errors.NotFound as exc:
            raise self._gone(exc) from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # container not running
                raise self._gone(exc) from exc
            raise
        return _ExecRun(self._engine, self._id, exec_id, stream, timeout)

    # files -------------------------------------------------------------------------------------

    def _stat(self, path: str) -> dict[str, Any] | None:
        """The engine's stat of *path* (HEAD on the archive endpoint), None if missing."""
        api = self._engine.api
        resp = api.head(api._url("/containers/{0}/archive", self._id), params={"path": path})
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            self._raise_stat_error(path)
        stat: dict[str, Any] = json.loads(base64.b64decode(resp.headers["X-Docker-Container-Path-Stat"]))
        return stat

    def _raise_stat_error(self, path: str) -> None:
        """HEAD carries no error text: repeat as GET to learn why (e.g. a file used as a dir)."""
        api = self._engine.api
        resp = api.get(api._url("/containers/{0}/archive", self._id), params={"path": path}, stream=True)
        try:
            message = resp.json().get("message", "") if resp.status_code != 200 else ""
        except ValueError:
            message = resp.text
        finally:
            resp.close()
        if "not a directory" in message:
            raise NotADirectoryError(errno.ENOTDIR, "a parent is not a directory in the sandbox", path)
        api._raise_for_status(resp)
        raise OSError(errno.EIO, f"cannot stat in the sandbox: {message}", path)

    def _require_alive(self) -> None:
        if self._stat("/") is None:
            raise self._gone(FileNotFoundError("/"))

    def _existing_ancestor(self, directory: str) -> tuple[str, list[str]]:
        """Deepest existing ancestor of *directory* and the directories to create below it."""
        missing: list[str] = []
        while True:
            st = self._stat(directory)
            if st is None:
                if directory == "/":
                    raise self._gone(FileNotFoundError("/"))
                missing.append(directory)
                directory = posixpath.dirname(directory)
                continue
            if not st["mode"] & (_MODE_DIR | _MODE_SYMLINK):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory in the sandbox", directory)
            return directory, list(reversed(missing))

    @dual
    def write_bytes(self, data: bytes | bytearray | memoryview, path: str) -> None:
        """Write *data* to *path*, creating parent directories (mode 0755; file 0644)."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        path = _abs_path(path)
        st = self._stat(path) if path != "/" else {"mode": _MODE_DIR}
        if st is not None and st["mode"] & _MODE_DIR:
            raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", path)
        new_dirs: list[str] = []
        if st is not None:
            base = posixpath.dirname(path)
        else:
            base, new_dirs = self._existing_ancestor(posixpath.dirname(path))
        try:
            self._engine.api.put_archive(self._id, base, _file_tar(base, new_dirs, path, payload))
        except docker.errors.NotFound as exc:
            raise self._gone(exc) from exc

    @dual
    def read_bytes(self, path: str) -> bytes:
        """Read a regular file (symlinks followed); directories raise IsADirectoryError."""
        path = _abs_path(path)
        for _ in range(_MAX_SYMLINK_HOPS):
            st = self._stat(path)
            if st is None:
                self._require_alive()
                raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", path)
            if st["mode"] & _MODE_DIR:
                raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", path)
            if st["mode"] & _MODE_SYMLINK:
                path = posixpath.normpath(posixpath.join(posixpath.dirname(path), st["linkTarget"]))
                continue
            try:
                stream, _ = self._engine.api.get_archive(self._id, path)
            except docker.errors.NotFound as exc:
                raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", path) from exc
            return _single_file(b"".join(stream), path)
        raise OSError(errno.ELOOP, "too many symlinks in the sandbox", path)

    # lifecycle ---------------------------------------------------------------------------------

    @dual
    def terminate(self, wait: bool = True) -> None:
        """Remove the container (idempotent). ``wait=False`` returns before removal completes."""
        if wait:
            self._engine.remove_container(self._id, wait=True)
        else:
            executor().submit(self._engine.remove_container, self._id)

    @dual
    def status(self) -> str:
        """Engine state ("running", "exited", ...) or "terminated" when the container is gone."""
        info = self._engine.inspect_info(self._id)
        return info.state if info is not None else "terminated"


# ── module API ───────────────────────────────────────────────────────────────────────────────


def _network(block_network: bool, host_network: bool) -> Network:
    if block_network and host_network:
        raise ValueError("block_network and host_network are mutually exclusive")
    return "none" if block_network else "host" if host_network else "bridge"


def _ttl(timeout: int | None) -> int:
    if timeout is None:
        return DEFAULT_TTL_SEC
    if int(timeout) <= 0:
        raise ValueError("timeout (the sandbox TTL, seconds) must be positive")
    return int(timeout)


def _secret_env(secrets: Sequence[str] | None) -> dict[str, str]:
    """Secret values come from this process's environment and go only into the container env."""
    values: dict[str, str] = {}
    for secret in secrets or ():
        if secret not in os.environ:
            raise ValueError(f"secret {secret!r} is not set in the environment of this process")
        values[secret] = os.environ[secret]
    return values


def _check_pool_args(image: str | None, cpus: float | None, memory_gb: float | None) -> None:
    """Like the real SDK: a pool fixes image and resources. Network flags are checked against
    the pool's own network at claim time (asking for what the pool already has is allowed)."""
    if image is not None:
        raise ValueError("image comes from the pool: do not pass image= together with pool=")
    if cpus is not None or memory_gb is not None:
        raise ValueError("cpus/memory_gb come from the pool: do not pass them together with pool=")


def _create(
    name: str | None = None,
    image: str | None = None,
    pool: str | None = None,
    cpus: float | None = None,
    memory_gb: float | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] | None = None,
    block_network: bool = False,
    timeout: int | None = None,
    registry: str | None = None,
    context_name: str | None = None,
    namespace: str | None = None,
    host_network: bool = False,
) -> DockerSandbox:
    """Create a running sandbox, or claim one from *pool*; see the module docstring."""
    name = L.validate_name(name or f"sb-{uuid.uuid4().hex[:12]}")
    ttl = _ttl(timeout)
    network = _network(block_network, host_network)
    persistent = {**_check_env(env or {}), **_secret_env(secrets)}
    extra = {L.NAMESPACE: namespace or "", L.CONTEXT: context_name or "", L.REGISTRY: registry or ""}
    if pool is not None:
        _check_pool_args(image, cpus, memory_gb)
    elif not image:
        raise ValueError("image is required unless pool= is given")
    engine = _engine()
    engine.maybe_auto_reap()
    engine.ensure_name_free(name)
    owner = Owner.current()
    if pool is not None:
        container_id, spec = engine.pools.claim(
            pool, name=name, ttl_sec=ttl, owner=owner, extra=extra, network=None if network == "bridge" else network
        )
        return DockerSandbox(engine, name=name, container_id=container_id, image=spec.image, pool=pool, env=persistent)
    assert image is not None
    labels = L.container_labels(
        sandbox=name, role=Role.SANDBOX, owner=owner, created_at=time.time(), ttl_sec=ttl, network=network, extra=extra
    )
    container_id = engine.create_container(
        name=name, image=image, cpus=cpus, memory_gb=memory_gb, network=network, ttl_sec=ttl, labels=labels, env=persistent
    )
    try:
        engine.start_container(container_id)
    except BaseException:
        engine.remove_container(container_id)
        raise
    return DockerSandbox(engine, name=name, container_id=container_id, image=image, pool=None, env=persistent)


create: Dual[..., DockerSandbox] = Dual(_create, on_abandon=lambda sb: sb.terminate())


@dual
def get(name: str) -> DockerSandbox:
    """Attach to an existing sandbox by name (its create-time env is not known here)."""
    engine = _engine()
    info = engine.inspect_info(name)
    if info is None or info.is_idle_member:
        raise SandboxNotFoundError(f"no sandbox named {name!r}")
    return DockerSandbox(engine, name=info.name, container_id=info.id, image=info.image, pool=info.pool)


@dual
def terminate_by_name(name: str) -> bool:
    """Remove the sandbox called *name* if it exists (for callers that never got a handle).

    Returns whether something was removed; idle pool members are never touched.
    """
    engine = _engine()
    info = engine.inspect_info(name)
    if info is None or info.is_idle_member:
        return False
    return engine.remove_container(info.id, wait=True)


@dual
def ls() -> list[SandboxRecord]:
    """All managed sandboxes on the engine, any owner (idle pool members are not sandboxes)."""
    infos = list_containers(_engine().api)
    return sorted((i.to_record() for i in infos if not i.is_idle_member), key=lambda r: r.created_at)


def stale_reason(info: ContainerInfo, at: float, *, dead_owners: bool, expired: bool = True) -> str | None:
    """Why *info* should be reaped, or None. Idle pool members never die with their creator."""
    created_long_ago = at - info.created_at > STALE_CREATED_SEC
    if expired and info.is_expired(at):
        return "expired"
    if expired and info.state in ("exited", "dead"):
        return "stopped"
    if expired and info.state == "created" and created_long_ago:
        return "never started"
    if info.is_idle_member or not dead_owners:
        return None
    owner = info.owner
    if owner is not None and owner.is_dead():
        return f"owner pid {owner.pid} is dead"
    return None


_reap_lock = threading.Lock()
_auto_reap_enabled = True


@contextmanager
def pause_auto_reap() -> Iterator[None]:
    """Stop the background reap (and wait for one in flight): for tests of `reap()` itself."""
    global _auto_reap_enabled
    previous, _auto_reap_enabled = _auto_reap_enabled, False
    with _reap_lock:
        pass
    try:
        yield
    finally:
        _auto_reap_enabled = previous


def _reap(expired: bool = True, dead_owners: bool = True) -> list[RemovedContainer]:
    """Remove expired/stopped sandboxes and those whose owner process on this host died.

    Idle pool members are removed only when expired or stopped. Returns what was removed.
    """
    with _reap_lock:
        return _reap_locked(_engine(), expired=expired, dead_owners=dead_owners)


def _reap_locked(engine: _Engine, *, expired: bool, dead_owners: bool) -> list[RemovedContainer]:
    at = time.time()
    infos = list_containers(engine.api)
    # Specs listed after containers: a member listed above whose pool is missing here is an
    # orphan, while members of a pool created meanwhile are not in `infos` at all.
    pools = set(engine.pools.spec_names())
    removed: list[RemovedContainer] = []
    for info in infos:
        reason = stale_reason(info, at, dead_owners=dead_owners, expired=expired)
        if reason is None and expired and info.is_idle_member and info.pool not in pools:
            reason = "pool deleted"
        if reason is not None and engine.remove_container(info.id):
            removed.append(removed_record(info, reason))
    _remove_orphan_claims(engine, {i.id for i in infos})
    return removed


def _remove_orphan_claims(engine: _Engine, live_ids: set[str]) -> None:
    """Claims of containers that vanished (TTL auto-remove, crash) are dead weight."""
    for container_id in pools_mod.list_claims(engine.api):
        if container_id not in live_ids:
            pools_mod.remove_volume(engine.api, pools_mod.claim_volume_name(container_id))


reap: Dual[..., list[RemovedContainer]] = Dual(_reap)


@dual
def remove_all(owner_pid: int | None = None) -> list[RemovedContainer]:
    """Remove every managed container (or those owned by *owner_pid* on this host).

    With no owner this also drops every pool spec and claim; with an owner, the pools that
    process created. For test teardown and ``osmosis-harbor`` cleanup commands.
    """
    engine = _engine()
    host = socket.gethostname()
    removed: list[RemovedContainer] = []
    infos = list_containers(engine.api)
    for info in infos:
        owner = info.owner
        if owner_pid is not None and (owner is None or owner.pid != owner_pid or owner.host != host):
            continue
        if engine.remove_container(info.id):
            removed.append(removed_record(info, "remove_all"))
    _remove_pool_specs(engine, owner_pid, host)
    _remove_orphan_claims(engine, {i.id for i in infos} - {r.container_id for r in removed})
    return removed


def _remove_pool_specs(engine: _Engine, owner_pid: int | None, host: str) -> None:
    volumes = engine.api.volumes(filters={"label": [L.MANAGED_FILTER, L.POOL_SPEC]}).get("Volumes") or []
    for vol in volumes:
        owner = Owner.from_labels(vol.get("Labels") or {})
        if owner_pid is None or (owner is not None and owner.pid == owner_pid and owner.host == host):
            pools_mod.remove_volume(engine.api, vol["Name"])


# ── pools ────────────────────────────────────────────────────────────────────────────────────


@dual
def create_pool(
    name: str,
    image: str,
    cpus: float | None = None,
    memory_gb: float | None = None,
    replicas: int = 1,
    *,
    member_ttl_sec: int = pools_mod.DEFAULT_MEMBER_TTL_SEC,
    host_network: bool = False,
    block_network: bool = False,
) -> PoolInfo:
    """Define a warm pool and return once *replicas* members are running (idempotent)."""
    return _engine().pools.create_pool(
        name,
        image,
        cpus=cpus,
        memory_gb=memory_gb,
        replicas=replicas,
        member_ttl_sec=member_ttl_sec,
        network=_network(block_network, host_network),
    )


@dual
def set_pool_size(name: str, replicas: int) -> PoolInfo:
    """Resize a pool: growing returns when the new members run; shrinking drops idle ones."""
    return _engine().pools.set_pool_size(name, replicas)


@dual
def delete_pool(name: str) -> list[RemovedContainer]:
    """Delete the pool spec and its idle members (claimed sandboxes are left alone)."""
    return _engine().pools.delete_pool(name)


@dual
def get_pool(name: str) -> PoolInfo:
    """The pool's spec with idle / claimed / starting member counts."""
    return _engine().pools.get_pool(name)


@dual
def list_pools() -> list[PoolInfo]:
    """Every pool defined on the engine."""
    return _engine().pools.list_pools()
