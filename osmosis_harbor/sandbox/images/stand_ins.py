"""The offline stand-ins for public base images: the script that makes them, and what one is.

``base-images.sh`` ships inside the package, so ``python -m osmosis_harbor base-images`` runs
it from wherever the user is (``scripts/base-images.sh`` in a checkout is a wrapper of it). A
stand-in is Debian under a public name (``python:3.13-slim-bookworm`` is Debian trixie here),
and the script labels it so: ``osmosis-harbor.stand-in`` holds the public name it stands in
for, ``osmosis-harbor.stand-in.really`` what a task may notice (``Debian 13 trixie, Python
3.13.5, OpenSSL 3.5.1``; stand-ins built before that label have only
``osmosis-harbor.stand-in.distribution``). A failure report quotes it, so a task that fails
only because of the stand-in says so instead of reading like a broken solution.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from osmosis_harbor import settings
from osmosis_harbor.errors import UserError

__all__ = ["LIST_HINT", "SCRIPT", "VERB", "offline_recipes", "run_script", "stand_in_note", "what_stands_in"]

SCRIPT = Path(__file__).with_name("base-images.sh")
VERB = "python -m osmosis_harbor base-images"
LIST_HINT = f"{VERB} --list"
LABEL = "osmosis-harbor.stand-in"
# Repositories whose stand-ins are the distribution the name says (debian:bookworm-slim is
# Debian bookworm from Debian's archive): a failure on one is not the stand-in's doing.
FAITHFUL = frozenset({"debian"})

LabelsOf = Callable[[str], Mapping[str, str] | None]  # an image's labels, None when it is absent


def offline_recipes(script: Path = SCRIPT) -> frozenset[str] | None:
    """The names the script can build offline; None when it is not there or fails."""
    if not script.is_file():
        return None
    try:
        out = subprocess.run(["bash", str(script), "--names"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset(line.strip() for line in out.stdout.splitlines() if line.strip())


def what_stands_in(image: str, labels_of: LabelsOf) -> str | None:
    """What the local ``image`` really is when it is a stand-in that differs from its name
    (``Debian 13 trixie, Python 3.13.5, OpenSSL 3.5.1``); None otherwise."""
    name = image.split("@", 1)[0]
    repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    if repository in FAITHFUL:
        return None
    labels = labels_of(name) or {}
    if labels.get(LABEL) != name:
        return None  # the real image, or one this machine got some other way
    really = labels.get(f"{LABEL}.really")
    if really:
        return really
    suite = labels.get(f"{LABEL}.distribution", "debian/?").rsplit("/", 1)[-1]
    return f"Debian {suite}"


def stand_in_note(images: Iterable[str], labels_of: LabelsOf) -> str | None:
    """One sentence naming each of ``images`` that is an offline stand-in and what it really
    is; None when none is."""
    parts = []
    for image in dict.fromkeys(images):
        really = what_stands_in(image, labels_of)
        if really is not None:
            parts.append(f"{image} here is an offline stand-in: {really}")
    if not parts:
        return None
    return "; ".join(parts) + " (no uv-managed Pythons offline; the real image may behave differently)"


def run_script(args: Sequence[str]) -> int:
    """Run the script with ``args`` in the foreground, its output the user's; its exit status.

    Ctrl-C reaches the script from the terminal (it unmounts and removes a half-made root file
    system); this process waits for it to finish that rather than cut it short."""
    env = settings.child_environment(HOST_PYTHON=sys.executable)  # a Python with pip, to fetch uv from PyPI
    try:
        proc = subprocess.Popen(["bash", str(SCRIPT), *args], env=env)
    except FileNotFoundError as exc:
        raise UserError(f"base-images needs bash: {exc.strerror}") from None
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue  # the script has the same signal and is cleaning up
