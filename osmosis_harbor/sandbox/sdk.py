"""Choosing the ``sky.sandbox`` implementation a sandbox environment talks to.

Production uses SkyPilot's Sandbox SDK (``sky.sandbox``), which ships with the SkyPilot
Platform installer and not with PyPI's ``skypilot``. Locally and in tests we use our
Docker-backed implementation of the same surface. The choice is an explicit value
(``sdk="docker"`` / ``sdk="skypilot"``) carried in the environment kwargs, never a patched
module global, so both can coexist in one process.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Literal

SandboxSdkName = Literal["docker", "skypilot"]
SDK_NAMES: tuple[str, ...] = ("docker", "skypilot")

SKYPILOT_SDK_MISSING = (
    "The SkyPilot Sandbox SDK ('sky.sandbox') is not installed in this environment. "
    "It ships with the SkyPilot Platform installer, not with PyPI's 'skypilot' (which "
    "cannot be installed next to harbor 0.25 and has no 'sky.sandbox'). Install the "
    "Platform Sandbox SDK into this virtualenv, run 'sky api login -e <endpoint>', and "
    "retry; or use the local Docker sandbox with --env docker / sdk=\"docker\"."
)


class SandboxSdkMissingError(RuntimeError):
    """The requested sandbox SDK cannot be imported here."""


def load_sandbox_sdk(name: str) -> ModuleType:
    """Return the module implementing the ``sky.sandbox`` surface for ``name``."""
    if name == "docker":
        return importlib.import_module("osmosis_harbor.sandbox.docker_sdk")
    if name == "skypilot":
        try:
            return importlib.import_module("sky.sandbox")
        except Exception as exc:  # a broken ~/.sky config raises more than ImportError
            raise SandboxSdkMissingError(f"{SKYPILOT_SDK_MISSING} (import error: {exc})") from exc
    raise ValueError(f"unknown sandbox sdk {name!r}: choose one of {', '.join(SDK_NAMES)}")
