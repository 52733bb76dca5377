"""The sandbox SDK contract: the ``sky.sandbox`` surface, its registry, its faults and errors, and what every SDK must give a sandbox."""
