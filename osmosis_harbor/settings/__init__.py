"""Every knob osmosis-harbor reads from the host environment, in one model read in one place.

``settings.current()`` is the model as the environment says now (``environment.py``, the only
module that touches ``os.environ``); the fields are in ``model.py``, documented by the README's
"Settings" table. Read the settings once per owner or command and carry them.
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
