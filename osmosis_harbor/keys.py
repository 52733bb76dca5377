"""The former name of ``osmosis_harbor.key_custody``, kept only while ``backend/`` imports it
(the backend is rewritten apart); delete this module once nothing imports ``osmosis_harbor.keys``."""

from osmosis_harbor.key_custody import (
    MARKER,
    KeyCustody,
    ScrubReport,
    default_trials_dirs,
    scrub_tree,
    sweep_unscrubbed,
)

__all__ = ["MARKER", "KeyCustody", "ScrubReport", "default_trials_dirs", "scrub_tree", "sweep_unscrubbed"]
