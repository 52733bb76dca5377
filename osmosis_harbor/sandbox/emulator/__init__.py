"""``skypilot-emulator``: SkyPilot's documented ``sky.sandbox`` SDK, served by a local emulator.

In the spirit of moto or LocalStack: a small API server (``python -m osmosis_harbor emulator``,
or started on demand by this client when ``OSMOSIS_HARBOR_EMULATOR_URL`` is unset) owns
sandboxes and pools on the local Docker engine, and this module is the SDK that talks to it
over HTTP. It has SkyPilot's limits, not Docker's: no archive capability, images only by
registry reference (pulled by the server on every create), DNS-1123 names of at most 53
characters, a 60 s default exec timeout enforced server-side and a 3600 s cap, the TTL, no host
networking. The server's realism knobs (latency, create times, faults) are in ``wire.Knobs``.

The facade is SkyPilot's documented surface and nothing more: ``create``, ``ls``,
``create_pool``, ``set_pool_size``, ``delete_pool``, ``aclose``, and on a sandbox ``exec``,
``write_bytes``, ``read_bytes``, ``write_text``, ``read_text``, ``terminate``, ``snapshot``. What
the server can do beyond it (pool views, terminate by name) is in ``extensions``, which only
tests, benchmarks and the leak check import; production code never needs it.

Module layout: this facade (the public calls), ``handles`` (sandbox and exec handles),
``client`` (the HTTP session and its retries), ``launcher`` (finding or starting the server),
``errors``, ``wire`` (the HTTP models), ``extensions``; server side: ``server``, ``app``,
``state`` and ``pool_state``, ``faults``, ``images``. The facade imports nothing of the server side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from osmosis_harbor.sandbox.emulator.client.handles import AsyncExecHandle, EmulatorSandbox, ExecHandle, sandboxes_from
from osmosis_harbor.sandbox.emulator.client.http import session
from osmosis_harbor.sandbox.emulator.errors import (
    ApiConnectionError,
    ApiServerConnectionError,
    ApiServerError,
    ApiTimeoutError,
    ApiUnavailableError,
    ImagePullError,
    InvalidRequestError,
    NotSupportedError,
    PoolExhaustedError,
    PoolExistsError,
    PoolInUseError,
    PoolNotFoundError,
    PoolWarmTimeoutError,
    RateLimitError,
    RemoteFileNotFoundError,
    RemoteIsADirectoryError,
    SandboxApiError,
    SandboxExistsError,
    SandboxNotFoundError,
)
from osmosis_harbor.sandbox.emulator.wire import CreateRequest, PoolCreateRequest, PoolInfo, PoolResize, SandboxInfo
from osmosis_harbor.sandbox.sdk.calls import Dual, dual

__all__ = [
    "ApiConnectionError",
    "ApiServerConnectionError",
    "ApiServerError",
    "ApiTimeoutError",
    "ApiUnavailableError",
    "AsyncExecHandle",
    "EmulatorSandbox",
    "ExecHandle",
    "ImagePullError",
    "InvalidRequestError",
    "NotSupportedError",
    "PoolExhaustedError",
    "PoolExistsError",
    "PoolInUseError",
    "PoolNotFoundError",
    "PoolWarmTimeoutError",
    "RateLimitError",
    "RemoteFileNotFoundError",
    "RemoteIsADirectoryError",
    "SandboxApiError",
    "SandboxExistsError",
    "SandboxInfo",
    "SandboxNotFoundError",
    "aclose",
    "create",
    "create_pool",
    "delete_pool",
    "ls",
    "set_pool_size",
]


def _create(
    name: str | None = None,
    image: str | None = None,
    pool: str | None = None,
    num_sandboxes: int | None = None,
    cpus: float | None = None,
    memory_gb: float | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] | None = None,
    volumes: Mapping[str, str] | None = None,
    ports: Sequence[int] | None = None,
    enable_docker: bool = False,
    block_network: bool = False,
    timeout: int | None = None,
    registry: str | None = None,
    context_name: str | None = None,
    namespace: str | None = None,
) -> EmulatorSandbox | list[EmulatorSandbox]:
    """A fresh sandbox from ``image`` (pulled by reference), or a claim from ``pool``; with
    ``num_sandboxes=N`` a list named ``<name>-0001`` ... A claim needs a ready member (else
    `PoolExhaustedError`); ``secrets=`` names entries of the server's secrets store. There is no
    ``host_network``: SkyPilot sandboxes reach nothing of the caller's machine."""
    request = CreateRequest(
        name=name,
        image=image,
        pool=pool,
        num_sandboxes=num_sandboxes,
        cpus=cpus,
        memory_gb=memory_gb,
        env=dict(env or {}),
        secrets=list(secrets or ()),
        block_network=block_network,
        timeout=timeout,
        registry=registry,
        context_name=context_name,
        namespace=namespace,
        ports=list(ports or ()),
        volumes=dict(volumes or {}),
        enable_docker=enable_docker,
    )
    made = sandboxes_from(session().call("POST", "/sandboxes", json=request.model_dump(mode="json")).json())
    return made if num_sandboxes is not None else made[0]


def _abandon(made: EmulatorSandbox | list[EmulatorSandbox]) -> None:
    for sandbox in made if isinstance(made, list) else [made]:
        sandbox.terminate()


create: Dual[..., EmulatorSandbox | list[EmulatorSandbox]] = Dual(_create, on_abandon=_abandon)


@dual
def ls() -> list[EmulatorSandbox]:
    """Every live sandbox, as a handle (``terminate()`` works on it) whose record says its
    name, status (``RUNNING``, ...), image and pool (``template_name``), as SkyPilot's do."""
    return sandboxes_from(session().call("GET", "/sandboxes").json())


def _warm(info: PoolInfo, call: str) -> None:
    """SkyPilot's SDK waits for a pool to be fully warm and fails when its timeout passes first."""
    if info.idle < info.replicas:
        raise PoolWarmTimeoutError(
            f"{call}({info.name!r}) didn't fully warm within the SDK timeout: "
            f"last seen {info.idle}/{info.replicas} ready; the pool exists and keeps warming"
        )


@dual
def create_pool(
    name: str,
    image: str,
    cpus: float | None = None,
    memory_gb: float | None = None,
    replicas: int = 1,
    enable_docker: bool = False,
) -> None:
    """A new warm pool of ``replicas`` sandboxes; returns once they are ready. An existing name
    raises `PoolExistsError`; a pool not warm in time raises `PoolWarmTimeoutError` (it exists)."""
    request = PoolCreateRequest(
        name=name, image=image, cpus=cpus, memory_gb=memory_gb, replicas=replicas, enable_docker=enable_docker
    )
    response = session().call("POST", "/pools", json=request.model_dump(mode="json"))
    _warm(PoolInfo.model_validate_json(response.content), "create_pool")


@dual
def set_pool_size(name: str, replicas: int) -> None:
    """Resize a pool; growing returns once the new members are ready (else `PoolWarmTimeoutError`)."""
    body = PoolResize(replicas=replicas).model_dump(mode="json")
    _warm(PoolInfo.model_validate_json(session().call("PUT", f"/pools/{name}", json=body).content), "set_pool_size")


@dual
def delete_pool(name: str) -> None:
    """Delete a pool; refused (`PoolInUseError`, a 500) while sandboxes claimed from it exist."""
    session().call("DELETE", f"/pools/{name}")


@dual
def aclose() -> None:
    """Release the shared HTTP session (the next call opens a new one)."""
    session().close()
