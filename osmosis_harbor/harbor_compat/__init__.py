"""Every Harbor name we use beyond its documented API or patch, in one package: the fast paths, the lock facts, the artifact copy and the surface check."""
