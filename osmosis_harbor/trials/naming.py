"""Names for the trials we submit: unique, and readable in `trials/` and `docker ps`.

Harbor derives the sandbox name from the trial name (DNS-1123, at most 53 characters),
so the readable part is a short slug of what the trial is for.
"""

from __future__ import annotations

import re
import uuid


def trial_name(label: str, *, max_slug: int, fallback: str) -> str:
    """``<slug of label>__<8 hex>``; ``fallback`` when the label has no usable characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:max_slug] or fallback
    return f"{slug}__{uuid.uuid4().hex[:8]}"
