"""``python -m osmosis_harbor.testing``: serve a scripted policy (``scripted_policy.main``)."""

from osmosis_harbor.testing.scripted_policy import main

main()
