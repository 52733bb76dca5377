"""``python -m osmosis_harbor``: see ``osmosis_harbor.cli``."""

from osmosis_harbor.cli import main

raise SystemExit(main())
