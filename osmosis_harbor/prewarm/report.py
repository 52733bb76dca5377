"""What a prewarm reports: per environment group, and in sum (``prewarm --json``, ``health()``)."""

from __future__ import annotations

from pydantic import BaseModel

from osmosis_harbor.audit import EnvironmentAudit

__all__ = ["PrewarmGroup", "PrewarmReport"]


class PrewarmGroup(BaseModel):
    """One environment group: its tasks, its image and what prewarm did for it."""

    key: str
    environment_id: str
    task_ids: list[str]
    image: str | None = None
    built: bool = False
    reused: bool = False
    setup_ok: bool = False
    pool: str | None = None
    pool_size: int | None = None
    # an existing pool adopted, or one still warming (usable: claims wait or fall back); or why no
    # pool can serve the group (its tasks run cold, and that is no failure)
    pool_note: str | None = None
    error: str | None = None
    timings_sec: dict[str, float] = {}
    audit: EnvironmentAudit | None = None  # the leak audit of its sandbox (osmosis_harbor.audit)


class PrewarmReport(BaseModel):
    """The summary ``prewarm --json`` writes and ``health()`` shows."""

    groups: int
    tasks: int
    built: int
    reused: int
    failed: int
    wall_sec: float
    groups_detail: list[PrewarmGroup]
    failed_tasks: dict[str, str] = {}
