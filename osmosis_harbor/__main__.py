"""``python -m osmosis_harbor``: see ``osmosis_harbor.cli``."""

from .cli import main

raise SystemExit(main())
