"""osmosis-harbor: Osmosis rollouts as Harbor trials in SkyPilot (or local Docker) sandboxes."""

import os as _os

# Harbor's agents import litellm, which otherwise downloads its model-price map from the
# internet at import time; the bundled copy is enough and keeps hosts without egress quiet.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def __getattr__(name: str):
    """``from osmosis_harbor import HarborBackend`` without importing Harbor at package import."""
    if name == "HarborBackend":
        from .backend import HarborBackend

        return HarborBackend
    raise AttributeError(name)


__all__ = ["HarborBackend"]
