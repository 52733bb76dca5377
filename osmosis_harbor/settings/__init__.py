"""Every knob osmosis-harbor reads from the host environment, in one model read in one place.

``current()`` is the model as the environment says now (``environment.py``, the only module that
touches ``os.environ``); the fields are in ``model.py``, documented by the README's "Settings"
table. The settings are read once per owner or command and carried as values (the owner's
``Settings``, or a small frozen part of it: ``TransferLimits``, ``ApiRetry``, ``DockerConfig``).
Who reads them:

* the entry points: a command (``cli``), a backend's options (``backend/options.py``), a
  validation run (``validate/run.py``), ``serve()`` and ``build_bundle`` given no port or cache
  (``serving/server.py``, ``bundle/cache.py``), Harbor's class preflight
  (``environment/class_facts.py``) and each environment Harbor constructs
  (``sandbox_environment.py``); an owner (``SandboxOwner.make``) takes its maker's;
* the SDKs, where a call enters them, as SkyPilot's SDK reads its own configuration: the Docker
  SDK (``docker/engine.py: get_engine``), the emulator's client (``emulator/client/http.py``),
  and their calls' shared thread pool when it is made (``sdk/calls.py``).
"""

from __future__ import annotations

from osmosis_harbor.settings.environment import (
    child_environment,
    current,
    host_variable,
    scoped_variable,
    secret_values,
    use_bundled_model_prices,
)
from osmosis_harbor.settings.model import DEFAULT_DOCKER_HOST, MIB, Settings

__all__ = [
    "DEFAULT_DOCKER_HOST",
    "MIB",
    "Settings",
    "child_environment",
    "current",
    "host_variable",
    "scoped_variable",
    "secret_values",
    "use_bundled_model_prices",
]
