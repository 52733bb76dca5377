"""The task image, patched to pre-install a bundle's dependencies, and the bundle itself,
into the bundle venv.

The dependencies get a layer of their own and the bundle wheel one small layer after it,
so Docker's build cache keeps the dependency layer when only the bundle changes. The wheel
is copied into ``environment/``, so Harbor's environment hash (and the image) covers the
environment and the bundle: content-addressed. The patch is deterministic and idempotent,
so identical task copies keep one Harbor environment hash and one image.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from osmosis_harbor.shim import contract
from osmosis_harbor.tasks.files import write_file

__all__ = [
    "BAKED_BUNDLE_COMMENT",
    "BUNDLE_DIRNAME",
    "INCOMPATIBLE_IMAGE_MARKER",
    "PATCH_BEGIN",
    "PATCH_END",
    "REQUIREMENTS_FILENAME",
    "EnvironmentPatch",
    "baked_bundle",
    "patch_environment",
]

REQUIREMENTS_FILENAME = "osmosis-requirements.txt"  # in environment/, next to the Dockerfile
BUNDLE_DIRNAME = "osmosis-bundle"  # in environment/: the bundle wheel the image bakes in
GUARD_FILENAME = "osmosis-guard"  # in BUNDLE_DIRNAME: the verifier guard baked in with it
PATCH_BEGIN = "# >>> osmosis-harbor: bundle dependencies (generated; do not edit) >>>"
PATCH_END = "# <<< osmosis-harbor: bundle dependencies <<<"
BAKED_BUNDLE_COMMENT = contract.BAKED_BUNDLE_COMMENT  # + the key; what baked_bundle() reads back
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+-]+$")
_SAFE_KEY = re.compile(r"^[A-Za-z0-9._-]+$")


INCOMPATIBLE_IMAGE_MARKER = "osmosis-harbor: incompatible task image"


class EnvironmentPatch(BaseModel):
    """Dependencies to pre-install into the task image, in a venv of their own, and
    optionally the bundle wheel itself (``wheel`` with its ``bundle_key``, both or neither)."""

    model_config = ConfigDict(frozen=True)

    requirements: list[str]
    venv: str = contract.VENV
    python: str = "python3"
    wheel: Path | None = None
    bundle_key: str | None = None
    # The verifier guard baked in beside the bundle (``sandbox/guard``), with its sha256.
    guard: Path | None = None
    guard_sha256: str | None = None

    @model_validator(mode="after")
    def _bundle(self) -> EnvironmentPatch:
        if (self.wheel is None) != (self.bundle_key is None):
            raise ValueError("wheel and bundle_key go together: give both to bake a bundle, or neither")
        if self.wheel is not None and not (self.wheel.name.endswith(".whl") and _SAFE_PATH.match(self.wheel.name)):
            raise ValueError(f"wheel must be a .whl file named with plain characters, got {self.wheel.name!r}")
        if self.bundle_key is not None and not _SAFE_KEY.match(self.bundle_key):
            raise ValueError(f"bundle_key must be letters, digits, '.', '_' or '-', got {self.bundle_key!r}")
        if (self.guard is None) != (self.guard_sha256 is None) or (self.guard is not None and self.wheel is None):
            raise ValueError("guard and guard_sha256 go together, and only with a baked bundle")
        if self.guard_sha256 is not None and not _SAFE_KEY.match(self.guard_sha256):
            raise ValueError(f"guard_sha256 must be hex, got {self.guard_sha256!r}")
        return self

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
    """Append a block installing ``patch.requirements`` into ``patch.venv`` to the Dockerfile,
    and, with ``patch.wheel``, baking that bundle in after them (``_bundle_lines``).

    The block runs as ``USER root`` and restores the final stage's last ``USER``; a
    Dockerfile without one keeps root afterwards (the base image's own default user
    cannot be known without the image). Output is deterministic and idempotent: an
    earlier block (found by its marker comment) is replaced, not duplicated. Returns
    False, changing nothing, when there is no ``environment/Dockerfile`` (an image-only
    task: the bundle and its dependencies are then installed at setup time).
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
    block = [
        PATCH_BEGIN,
        "USER root",
        f"COPY {REQUIREMENTS_FILENAME} {contract.CONTAINER_REQUIREMENTS}",
        f"RUN {_dependencies_command(patch)}",
        *_bundle_lines(patch),
        *users[-1:],
        PATCH_END,
    ]
    text = base + "\n\n" + "\n".join(block) + "\n"
    _write_if_changed(env_dir / REQUIREMENTS_FILENAME, "".join(f"{r}\n" for r in patch.requirements))
    _stage_wheel(env_dir, patch.wheel, patch.guard)
    _allow_in_dockerignore(env_dir, [REQUIREMENTS_FILENAME, *([BUNDLE_DIRNAME] if patch.wheel else [])])
    if text != original:
        write_file(dockerfile, text)
    return True


def _dependencies_command(patch: EnvironmentPatch) -> str:
    """The venv and the bundle's dependencies; fails the build with a sentence, not
    "exit 127", when the image cannot host a bundle."""
    venv, python = patch.venv, patch.python
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
    return install


def _bundle_lines(patch: EnvironmentPatch) -> list[str]:
    """The bundle layer: after the dependencies' RUN, so a new bundle costs this one small
    layer. It installs the wheel (offline: its dependencies are already there), writes the
    marker a trial checks instead of installing, and makes the directories a trial would
    otherwise make with an exec: Harbor's log dirs, fresh and empty (777, as Harbor's own
    ``ensure_dirs``/``empty_dirs`` leave them; the sandbox environment relies on it to skip
    those commands on a fresh sandbox) and the rollout input's (755: root writes it, any
    agent user reads it)."""
    if patch.wheel is None:
        return []
    wheel = f"{contract.WHEELS_DIR}/{patch.wheel.name}"
    logs = " ".join(contract.LAYOUT_DIRS)
    run = (
        f"{patch.venv}/bin/python -m pip install --disable-pip-version-check -q --no-deps --no-index "
        f"--no-cache-dir {wheel} && echo {patch.bundle_key} > {contract.BUNDLE_MARKER} && "
        f"rm -rf {logs} && mkdir -p {logs} {contract.ROLLOUT_INPUT_DIR} && chmod 777 {logs} && chmod 755 {contract.ROLLOUT_INPUT_DIR}"
    )
    guard = []
    if patch.guard is not None:
        guard = [
            f"COPY {BUNDLE_DIRNAME}/{GUARD_FILENAME} {contract.GUARD_PATH}",
            f"{contract.BAKED_GUARD_COMMENT}{patch.guard_sha256}",
        ]
    return [
        f"COPY {BUNDLE_DIRNAME}/{patch.wheel.name} {wheel}",
        *guard,
        f"RUN {run}",
        f"{BAKED_BUNDLE_COMMENT}{patch.bundle_key}",
    ]


def _stage_wheel(env_dir: Path, wheel: Path | None, guard: Path | None = None) -> None:
    """``environment/osmosis-bundle/`` holds exactly the baked wheel and guard (nothing when none is)."""
    staged = env_dir / BUNDLE_DIRNAME
    if staged.is_symlink() or (staged.exists() and not staged.is_dir()):
        staged.unlink()
    if wheel is None:
        shutil.rmtree(staged, ignore_errors=True)
        return
    staged.mkdir(exist_ok=True)
    keep = {wheel.name} | ({GUARD_FILENAME} if guard is not None else set())
    for other in staged.iterdir():  # an earlier bundle's wheel would change the hash
        if other.is_dir() and not other.is_symlink():
            shutil.rmtree(other)
        elif other.name not in keep or other.is_symlink():
            other.unlink()
    for source, target in ((wheel, staged / wheel.name), (guard, staged / GUARD_FILENAME)):
        if source is not None and not (target.is_file() and target.read_bytes() == source.read_bytes()):
            shutil.copyfile(source, target)
    if guard is not None:
        (staged / GUARD_FILENAME).chmod(0o755)  # COPY keeps the mode: the guard runs from the image


def _allow_in_dockerignore(env_dir: Path, names: list[str]) -> None:
    """A task's ``.dockerignore`` must not hide what the patch copies into the image."""
    ignore = env_dir / ".dockerignore"
    if not ignore.is_file():
        return
    rules = ignore.read_text(encoding="utf-8")
    missing = [f"!{name}" for name in names if f"!{name}" not in rules.splitlines()]
    if missing:
        write_file(ignore, rules.rstrip("\n") + "\n" + "".join(f"{rule}\n" for rule in missing))


def baked_bundle(env_dir: Path) -> str | None:
    """The key of the bundle the patched ``environment/Dockerfile`` bakes in, or None (no
    Dockerfile, no patch, or a patch without the bundle). A text scan of the patch block:
    cheap enough to call for every sandbox."""
    try:
        text = (Path(env_dir) / "Dockerfile").read_text(encoding="utf-8")
    except OSError:
        return None
    start = text.find(PATCH_BEGIN)
    if start < 0:
        return None
    end = text.find(PATCH_END, start)
    for line in text[start : end if end >= 0 else len(text)].splitlines():
        if line.startswith(BAKED_BUNDLE_COMMENT):
            key = line[len(BAKED_BUNDLE_COMMENT) :].strip()
            return key if _SAFE_KEY.match(key) else None
    return None


def _write_if_changed(path: Path, data: str) -> None:
    if path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8") == data:
        return
    write_file(path, data)
