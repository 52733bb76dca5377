"""``sdk="skypilot"``'s preflight beyond the import: a SkyPilot API server to talk to.

Harbor's ``SkypilotEnvironment.preflight`` makes the same check, for every run of its class; ours
runs only when SkyPilot's SDK is the one chosen (``registry.SandboxImplementation.preflight``).
"""

from __future__ import annotations

import importlib

from osmosis_harbor import settings
from osmosis_harbor.errors import SandboxUnavailableError

__all__ = ["check_logged_in"]


def check_logged_in(config: settings.Settings) -> None:
    """An endpoint is configured (``sky api login``, or the environment variable): no network
    round trip, as in Harbor; a server that does not answer fails at the first create."""
    if config.skypilot_api_server_endpoint:
        return
    try:
        server_common = importlib.import_module("sky.server.common")  # SkyPilot's client, when installed
        if server_common.get_server_url():
            return
    except Exception:  # a missing or broken client config: no login
        pass
    raise SandboxUnavailableError(
        "SkyPilot requires a reachable API server. Log in with 'sky api login -e <endpoint>' or set "
        "SKYPILOT_API_SERVER_ENDPOINT, then try again."
    )
