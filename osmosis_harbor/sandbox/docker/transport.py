"""One connection pool to the Docker engine's Unix socket, instead of one per request URL.

Why: docker-py's Unix-socket adapter keys its connection pools by the full request URL
(``/containers/<id>/exec``, ``/exec/<id>/start``, ...), so nearly every call of a rollout
builds a fresh pool (filling a queue of ``max_pool_size`` slots), opens a fresh connection
and never reuses one; ``requests`` also scans the process environment for proxies on every
call, which a Unix socket never uses. Together they were a fifth of the host CPU of a
graded rollout. Every URL on the socket reaches the same engine, so one pool serves them
all, with its connections kept alive.
"""

from __future__ import annotations

from typing import Any

from docker.transport import UnixHTTPAdapter

SOCKET_BASE = "http+docker://localhost"  # docker-py's base URL for an engine on a Unix socket


def unix_adapter(api: Any) -> UnixHTTPAdapter | None:
    """``api``'s (a ``docker.APIClient``) adapter when its engine is on a Unix socket, else None
    (TCP, SSH)."""
    adapter = api.get_adapter(SOCKET_BASE)
    return adapter if isinstance(adapter, UnixHTTPAdapter) else None


def share_one_pool(api: Any) -> bool:
    """Route every request of ``api`` (a ``docker.APIClient``) on a Unix socket through one
    pool and skip the proxy lookup; returns whether it applied (not for TCP or SSH)."""
    adapter = unix_adapter(api)
    if adapter is None:
        return False
    by_url = adapter.get_connection

    def one_pool(url: str, proxies: Any = None) -> Any:
        return by_url(SOCKET_BASE, proxies)

    adapter.get_connection = one_pool
    api.trust_env = False  # proxies and .netrc mean nothing on a Unix socket
    return True
