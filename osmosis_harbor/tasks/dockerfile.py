"""The task image, patched to pre-install a bundle's dependencies into the bundle venv.

The patch is deterministic and idempotent, so identical task copies keep one Harbor
environment hash and one image.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, field_validator

from osmosis_harbor.shim import contract
from osmosis_harbor.tasks.files import write_file

__all__ = [
    "INCOMPATIBLE_IMAGE_MARKER",
    "PATCH_BEGIN",
    "PATCH_END",
    "REQUIREMENTS_FILENAME",
    "EnvironmentPatch",
    "patch_environment",
]

REQUIREMENTS_FILENAME = "osmosis-requirements.txt"  # in environment/, next to the Dockerfile
PATCH_BEGIN = "# >>> osmosis-harbor: bundle dependencies (generated; do not edit) >>>"
PATCH_END = "# <<< osmosis-harbor: bundle dependencies <<<"
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+-]+$")


INCOMPATIBLE_IMAGE_MARKER = "osmosis-harbor: incompatible task image"


class EnvironmentPatch(BaseModel):
    """Dependencies to pre-install into the task image, in a venv of their own."""

    model_config = ConfigDict(frozen=True)

    requirements: list[str]
    venv: str = contract.VENV
    python: str = "python3"

    @field_validator("requirements")
    @classmethod
    def _normalize(cls, value: list[str]) -> list[str]:
        cleaned = set()
        for req in value:
            if any(c in req for c in "\r\n\x00"):
                raise ValueError(f"requirement {req!r} spans lines; give one requirement per item")
            if req.strip() and not req.strip().startswith("#"):
                cleaned.add(req.strip())
        return sorted(cleaned, key=lambda r: (r.lower(), r))

    @field_validator("venv")
    @classmethod
    def _venv(cls, value: str) -> str:
        if not (PurePosixPath(value).is_absolute() and _SAFE_PATH.match(value) and ".." not in value.split("/")):
            raise ValueError(f"venv must be an absolute path of plain characters, got {value!r}")
        return value.rstrip("/")

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        if not _SAFE_PATH.match(value) or value.startswith("-"):
            raise ValueError(f"python must be a command name or path, got {value!r}")
        return value


def _instructions(lines: list[str]) -> list[tuple[str, str]]:
    """(keyword, full text) of each Dockerfile instruction, joining continuations, skipping heredocs."""
    escape = "\\"
    for line in lines:  # parser directives come first, before any instruction or blank line
        match = re.match(r"^\s*#\s*escape\s*=\s*(\S)\s*$", line, re.I)
        if match:
            escape = match.group(1)
        if not line.strip().startswith("#"):
            break
    out: list[tuple[str, str]] = []
    current = ""
    heredoc: str | None = None
    for line in lines:
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):  # also ignored inside continuations
            continue
        if stripped.endswith(escape):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword = current.split(None, 1)[0].upper() if current.split() else ""
        out.append((keyword, current))
        marker = re.search(r"<<-?\s*[\"']?([A-Za-z_][A-Za-z0-9_]*)[\"']?", current)
        if marker and keyword in ("RUN", "COPY", "ADD"):
            heredoc = marker.group(1)
        current = ""
    return out


def _strip_patch(text: str) -> str:
    start = text.find(PATCH_BEGIN)
    if start < 0:
        return text
    end = text.find(PATCH_END, start)
    end = len(text) if end < 0 else end + len(PATCH_END)
    return (text[:start].rstrip("\n") + "\n" + text[end:].lstrip("\n")).rstrip("\n") + "\n"


def patch_environment(env_dir: Path, patch: EnvironmentPatch) -> bool:
    """Append a block installing ``patch.requirements`` into ``patch.venv`` to the Dockerfile.

    The block runs as ``USER root`` and restores the final stage's last ``USER``; a
    Dockerfile without one keeps root afterwards (the base image's own default user
    cannot be known without the image). Output is deterministic and idempotent: an
    earlier block (found by its marker comment) is replaced, not duplicated. Returns
    False, changing nothing, when there is no ``environment/Dockerfile`` (an image-only
    task: dependencies are then installed at setup time).
    """
    env_dir = Path(env_dir)
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        return False
    original = dockerfile.read_text(encoding="utf-8")
    base = _strip_patch(original).rstrip("\n")
    instructions = _instructions(base.splitlines())
    last_from = max((i for i, (kw, _) in enumerate(instructions) if kw == "FROM"), default=-1)
    users = [text for kw, text in instructions[last_from + 1 :] if kw == "USER"]
    venv, python = patch.venv, patch.python
    # Fail the build with a sentence, not "exit 127", when the image cannot host a bundle.
    need = ".".join(map(str, contract.MIN_PYTHON))
    install = (
        f"{{ command -v {python} >/dev/null && {python} -c "
        f"'import sys; sys.exit(sys.version_info < {contract.MIN_PYTHON})'; }} || "
        f"{{ echo '{INCOMPATIBLE_IMAGE_MARKER}: the task image has no {python} >= {need}, "
        f"which the workflow bundle needs' >&2; exit {contract.EXIT_NO_PYTHON}; }}; "
        f"{python} -m venv {venv}"
    )
    if patch.requirements:
        install += f" && {venv}/bin/pip install --no-cache-dir -r {contract.CONTAINER_REQUIREMENTS}"
    block = [
        PATCH_BEGIN,
        "USER root",
        f"COPY {REQUIREMENTS_FILENAME} {contract.CONTAINER_REQUIREMENTS}",
        f"RUN {install}",
        *users[-1:],
        PATCH_END,
    ]
    text = base + "\n\n" + "\n".join(block) + "\n"
    _write_if_changed(env_dir / REQUIREMENTS_FILENAME, "".join(f"{r}\n" for r in patch.requirements))
    ignore = env_dir / ".dockerignore"
    if ignore.is_file():
        rules = ignore.read_text(encoding="utf-8")
        if f"!{REQUIREMENTS_FILENAME}" not in rules.splitlines():
            write_file(ignore, rules.rstrip("\n") + f"\n!{REQUIREMENTS_FILENAME}\n")
    if text != original:
        write_file(dockerfile, text)
    return True


def _write_if_changed(path: Path, data: str) -> None:
    if path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8") == data:
        return
    write_file(path, data)
