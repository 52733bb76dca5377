"""Which ``FROM`` images a failed build lacked, and whether the offline stand-ins can make them.

A build whose base image is absent and cannot be pulled fails with the engine's pull error
(``Get "https://registry-1.docker.io/v2/": dial tcp: lookup ... no such host``), which names
neither the image nor the remedy. After a failed build we read the Dockerfile's ``FROM`` lines
and ask the engine which of them it lacks; each one gets a line with a remedy that runs from
anywhere (``python -m osmosis_harbor base-images IMAGE`` when a stand-in recipe exists, asked
through ``base-images.sh --names``, which makes no Docker call; for a ``FROM`` pinned by
digest, which no stand-in can match, dropping the digest or providing the image). A build that
failed for that reason is not retried: nothing would change.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from osmosis_harbor.errors import BaseImageMissingError
from osmosis_harbor.sandbox.images.stand_ins import LIST_HINT, VERB, offline_recipes

__all__ = ["base_images", "missing_base_error"]

LOAD_HINT = "provide the image itself (docker load)"

_ARG = re.compile(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", re.IGNORECASE)
_FROM = re.compile(r"^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE)
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::?[-+][^}]*)?\}?")


def _logical_lines(text: str) -> list[str]:
    """Dockerfile instructions with backslash continuations joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def base_images(dockerfile_text: str) -> list[str]:
    """The external images a Dockerfile builds ``FROM``, in order: stage names, ``scratch``
    and references an ``ARG`` without a default leaves open are skipped."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    for line in _logical_lines(dockerfile_text):
        arg = _ARG.match(line)
        if arg and not stages and not images:  # only ARGs before the first FROM apply to FROM
            if arg.group(2) is not None:
                args[arg.group(1)] = arg.group(2).strip("\"'")
            continue
        found = _FROM.match(line)
        if found is None:
            continue
        ref = _VAR.sub(lambda m: args.get(m.group(1), m.group(0)), found.group(1))
        if found.group(2):
            stages.add(found.group(2).lower())
        if "$" in ref or ref.lower() == "scratch" or ref.lower() in stages or ref in images:
            continue
        images.append(ref)
    return images


def _shown(ref: str) -> str:
    """``ref`` with a digest shortened, so a line stays readable."""
    name, at, digest = ref.partition("@")
    return f"{name}@{digest[:19]}…" if at and len(digest) > 19 else ref


def _remedy(ref: str, recipes: frozenset[str] | None, image_present: Callable[[str], bool]) -> str:
    name, at, _ = ref.partition("@")
    if recipes is None:
        return f"the offline stand-ins ({VERB}) cannot be listed in this installation; {LOAD_HINT}"
    if at:
        pinned = "it is pinned by digest, which no offline stand-in can match"
        if image_present(name):
            return f"{pinned}: drop the digest (FROM {name} uses the stand-in present here) or {LOAD_HINT}"
        if name in recipes:
            return f"{pinned}: drop the digest and make the stand-in ({VERB} {name}), or {LOAD_HINT}"
        return f"{pinned}: {LOAD_HINT} ({name} has no offline recipe either: {LIST_HINT})"
    if name in recipes:
        return f"make its offline stand-in: {VERB} {name}"
    return f"no offline recipe ({LIST_HINT}); {LOAD_HINT}"


def missing_base_error(
    dockerfile: Path, ref: str, image_present: Callable[[str], bool], engine_error: str
) -> BaseImageMissingError | None:
    """The clear error for a failed build of ``ref`` when its Dockerfile's base images are
    absent (None when they are all present: the build failed for another reason)."""
    try:
        wanted = base_images(dockerfile.read_text(errors="replace"))
    except OSError:
        return None
    missing = [image for image in wanted if not image_present(image)]
    if not missing:
        return None
    recipes = offline_recipes()
    lines = [
        f"base image {_shown(image)} is not present and cannot be pulled; {_remedy(image, recipes, image_present)}"
        for image in missing
    ]
    detail = engine_error.strip().splitlines()[0] if engine_error.strip() else ""
    return BaseImageMissingError("; ".join(lines) + (f"\n(docker build of {ref}: {detail})" if detail else ""))
