"""The host's crash-safe record of sandboxes and pools, and the reaping of what dead processes left."""
