"""Every Harbor name we use beyond its documented API or patch, in one package: the fast paths for its task checks and the surface check."""
