"""Serving a backend: ``server.serve`` (uvicorn with a drain before the socket closes), the
drain itself (``drain``) and one local rollout end to end (``local``)."""
