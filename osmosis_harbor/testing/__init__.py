"""Helpers for users' own tests and demos: a scripted chat-completions endpoint."""

from osmosis_harbor.testing.scripted_policy import FakeChatServer, RecordedRequest

__all__ = ["FakeChatServer", "RecordedRequest"]
