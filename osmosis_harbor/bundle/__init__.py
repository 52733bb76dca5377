"""Workflow project -> bundle wheel: built once, content-addressed, cached (see ``builder``)."""

from osmosis_harbor.bundle.builder import BuildResult, build, build_bundle
from osmosis_harbor.bundle.info import BundleInfo, inspect_bundle
from osmosis_harbor.errors import BundleError

__all__ = ["BuildResult", "BundleError", "BundleInfo", "build", "build_bundle", "inspect_bundle"]
