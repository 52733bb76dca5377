"""Internals of :mod:`osmosis_harbor.bundle` (the public entry point).

``project``  reads the workflow project: pyproject, import package, source files.
``targets``  turns classes/objects into ``module:attr`` and checks them in a subprocess.
``shim``     the in-container runners copied into every wheel.
``pep517``   builds the project's own wheel with the PyPA ``build`` frontend.
``wheel``    grafts the shim and entry points into that wheel, reproducibly.
``cache``    the content-addressed wheel cache and its atomic publication.
``info``     :class:`BundleInfo` and :func:`inspect_bundle`.
"""
