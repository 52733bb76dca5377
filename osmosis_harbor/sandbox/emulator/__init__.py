"""``skypilot-emulator``: SkyPilot's documented ``sky.sandbox`` SDK, served by a local emulator.

In the spirit of moto or LocalStack: a small API server (``python -m osmosis_harbor emulator``,
or started on demand by this client when ``OSMOSIS_HARBOR_EMULATOR_URL`` is unset) owns
sandboxes and pools on the local Docker engine, and this module is the SDK that talks to it
over HTTP. It has SkyPilot's limits, not Docker's: no archive capability, images only by
registry reference (pulled by the server on every create), DNS-1123 names of at most 53
characters, a 60 s default exec timeout enforced server-side and a 3600 s cap, the TTL, no host
networking. The server's realism knobs (latency, create times, faults) are in ``wire.Knobs``.

Module layout: this facade (the public calls), ``handles`` (sandbox and exec handles),
``client`` (the HTTP session and its retries), ``launcher`` (finding or starting the server),
``errors``, ``wire`` (the HTTP models); server side: ``server``, ``app``, ``state``, ``faults``,
``images``. The facade imports nothing of the server side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import quote

from osmosis_harbor import settings
from osmosis_harbor.sandbox.docker.calls import Dual, dual
from osmosis_harbor.sandbox.emulator.client import session
from osmosis_harbor.sandbox.emulator.errors import (
    ApiConnectionError,
    ApiServerError,
    ApiTimeoutError,
    ApiUnavailableError,
    ImagePullError,
    InvalidRequestError,
    NotSupportedError,
    PoolExistsError,
    PoolNotFoundError,
    RateLimitError,
    SandboxApiError,
    SandboxExistsError,
    SandboxNotFoundError,
)
from osmosis_harbor.sandbox.emulator.handles import AsyncExecHandle, EmulatorSandbox, ExecHandle, sandboxes_from
from osmosis_harbor.sandbox.emulator.wire import CreateRequest, PoolCreateRequest, PoolInfo, PoolResize, SandboxInfo

__all__ = [
    "ApiConnectionError",
    "ApiServerError",
    "ApiTimeoutError",
    "ApiUnavailableError",
    "AsyncExecHandle",
    "EmulatorSandbox",
    "ExecHandle",
    "ImagePullError",
    "InvalidRequestError",
    "NotSupportedError",
    "PoolExistsError",
    "PoolInfo",
    "PoolNotFoundError",
    "RateLimitError",
    "SandboxApiError",
    "SandboxExistsError",
    "SandboxInfo",
    "SandboxNotFoundError",
    "aclose",
    "create",
    "create_pool",
    "delete_pool",
    "get_pool",
    "list_pools",
    "ls",
    "set_pool_size",
    "terminate_by_name",
]


def _secret_values(secrets: Sequence[str] | None) -> dict[str, str]:
    """SkyPilot sends ``secrets=`` (names of variables in the caller's environment) by value."""
    values: dict[str, str] = {}
    for secret in secrets or ():
        value = settings.host_variable(secret)
        if value is None:
            raise InvalidRequestError(f"secret {secret!r} is not set in the environment of this process")
        values[secret] = value
    return values


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
    ``num_sandboxes=N`` a list named ``<name>-0001`` ... There is no ``host_network``:
    SkyPilot sandboxes reach nothing of the caller's machine."""
    request = CreateRequest(
        name=name,
        image=image,
        pool=pool,
        num_sandboxes=num_sandboxes,
        cpus=cpus,
        memory_gb=memory_gb,
        env=dict(env or {}),
        secret_env=_secret_values(secrets),
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
def ls() -> list[SandboxInfo]:
    """Every live sandbox: name, status (``RUNNING``, ...), image, pool, created/expires."""
    return [SandboxInfo.model_validate(item) for item in session().call("GET", "/sandboxes").json()]


@dual
def terminate_by_name(name: str) -> None:
    """Terminate the sandbox called ``name`` (idempotent): for a caller that never got a handle,
    such as the ledger's reaper after its owner died."""
    session().call("DELETE", f"/sandboxes/{quote(name, safe='')}")


@dual
def create_pool(
    name: str,
    image: str,
    cpus: float | None = None,
    memory_gb: float | None = None,
    replicas: int = 1,
    enable_docker: bool = False,
    *,
    block_network: bool = False,
) -> PoolInfo:
    """A warm pool of ``replicas`` running sandboxes; returns once they run (idempotent)."""
    request = PoolCreateRequest(
        name=name,
        image=image,
        cpus=cpus,
        memory_gb=memory_gb,
        replicas=replicas,
        enable_docker=enable_docker,
        block_network=block_network,
    )
    return PoolInfo.model_validate_json(session().call("POST", "/pools", json=request.model_dump(mode="json")).content)


@dual
def set_pool_size(name: str, replicas: int) -> PoolInfo:
    body = PoolResize(replicas=replicas).model_dump(mode="json")
    return PoolInfo.model_validate_json(session().call("PUT", f"/pools/{name}", json=body).content)


@dual
def delete_pool(name: str) -> None:
    session().call("DELETE", f"/pools/{name}")


@dual
def get_pool(name: str) -> PoolInfo:
    return PoolInfo.model_validate_json(session().call("GET", f"/pools/{name}").content)


@dual
def list_pools() -> list[PoolInfo]:
    return [PoolInfo.model_validate(item) for item in session().call("GET", "/pools").json()]


@dual
def aclose() -> None:
    """Release the shared HTTP session (the next call opens a new one)."""
    session().close()
