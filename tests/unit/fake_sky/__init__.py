"""An in-memory ``sky.sandbox``: the fake SDK the unit tests run the product on.

The module itself is the SDK (``create``, ``ls``, ``create_pool``, ``set_pool_size``,
``get_pool``, ``delete_pool``, each blocking with an ``.aio`` twin), as ``sky.sandbox`` is; its
calls go to the current `FakeSky` (``use`` installs a fresh one for a test). Registered as
``sdk="fake"`` by ``fixtures.py`` through the product's own ``registry.register``.

What it answers honestly, in memory and in microseconds:

* files: ``write_bytes`` / ``read_bytes`` (a write makes no parent; a missing file is a 404, a
  directory a 400), ``put_archive`` / ``get_archive`` (tar both ways, links kept as links,
  empty directories kept, names leaving the tree refused);
* exec: argv as given (no implicit shell), exit codes, stdout apart from stderr, ``env`` at
  create and per exec, ``workdir`` (missing: exit 127, as SkyPilot's ``cd``), ``timeout_seconds``
  (default 60, over 3600 refused; a command past it is cancelled and exits 124), concurrent
  commands, ``wait(timeout=)``;
* the programs ``true : false exit echo printf cat mkdir rm test [ pwd cd sleep chmod tar id whoami
  sh bash export sha256sum ln wc stat find`` with the options their docstrings list (``commands.py``),
  ``sh -c`` / ``bash -c`` scripts in the shell subset of ``shell.py``, and executable
  ``#!/bin/sh`` scripts in the sandbox's tree;
* sandboxes: DNS-1123 names, duplicates refused, ``terminate`` idempotent, ``ls()`` records
  with name, status, pool and their own ``terminate``;
* pools: create, resize, view, delete, claims (``create(pool=)``), SkyPilot's refusals;
* faults on request (``faults.py``): API errors on chosen calls, a sandbox lost mid-command
  (gone, or listed with an eviction status), slow execs; and every call recorded (``calls``).

What it refuses (`CannotAnswer`, never a made-up answer): any other program (``python``, ``su``,
``grep``, ``head``, ...), pipes, background jobs, subshells, command substitution, globbing,
``if``/``for``/``case``. It has no users (every command runs as root), no processes to list, no
kernel (no ``/proc``, cgroups, capabilities), no network and no image builds: the conformance
checks about those are skipped, each with its reason (``tests/unit/sandbox/test_fake_sdk_conformance.py``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from .cloud import FakeImage, FakeSky, PoolRecord, SandboxRecord, SdkCall
from .errors import CannotAnswer, Conflict, FakeSkyError, InvalidRequest, NotFound, ServerError, Unavailable
from .twins import Twin

__all__ = [
    "CannotAnswer",
    "Conflict",
    "FakeImage",
    "FakeSky",
    "FakeSkyError",
    "InvalidRequest",
    "NotFound",
    "PoolRecord",
    "SandboxRecord",
    "SdkCall",
    "ServerError",
    "Unavailable",
    "create",
    "create_pool",
    "current",
    "delete_pool",
    "get_pool",
    "ls",
    "set_pool_size",
    "use",
]

_current: list[FakeSky] = [FakeSky()]


def current() -> FakeSky:
    """The cloud the module-level calls go to."""
    return _current[-1]


@contextlib.contextmanager
def use(cloud: FakeSky | None = None) -> Iterator[FakeSky]:
    """Send the module-level calls to ``cloud`` (a fresh one by default) inside the block."""
    cloud = cloud or FakeSky()
    _current.append(cloud)
    try:
        yield cloud
    finally:
        _current.remove(cloud)


def _delegate(name: str) -> Twin:
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await getattr(current(), name).aio(*args, **kwargs)

    def blocking(*args: Any, **kwargs: Any) -> Any:
        return getattr(current(), name)(*args, **kwargs)

    twin = Twin(call, blocking=blocking)
    twin.__signature__ = inspect.signature(getattr(FakeSky(), name).aio)
    return twin


create = _delegate("create")
ls = _delegate("ls")
create_pool = _delegate("create_pool")
set_pool_size = _delegate("set_pool_size")
get_pool = _delegate("get_pool")
delete_pool = _delegate("delete_pool")
