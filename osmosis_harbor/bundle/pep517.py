"""Build the project's own wheel with the PyPA ``build`` frontend.

The build runs in this interpreter when it already satisfies the project's build
requirements (fast, offline), else in an isolated environment that ``build``
creates and fills with pip, exactly as ``python -m build --wheel`` would.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyproject_hooks
from build import (
    BuildBackendException,
    BuildException,
    ProjectBuilder,
    check_dependency,
)
from build.env import DefaultIsolatedEnv

from osmosis_harbor import settings
from osmosis_harbor.errors import BundleError

__all__ = ["build_wheel", "SOURCE_DATE_EPOCH"]

SOURCE_DATE_EPOCH = 315532800  # 1980-01-01T00:00:00Z, the earliest ZIP timestamp
OUTPUT_TAIL = 4000


class _CapturingRunner:
    """A ``pyproject_hooks`` runner that keeps the backend's output for error messages."""

    def __init__(self) -> None:
        self.output: list[str] = []

    def __call__(self, cmd, cwd=None, extra_environ=None) -> None:
        env = settings.child_environment()
        env.update(extra_environ or {})
        env.update(SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH), PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        self.output.append(proc.stdout)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd, output=proc.stdout)

    def tail(self) -> str:
        return "".join(self.output)[-OUTPUT_TAIL:]


def build_wheel(source_dir: Path, out_dir: Path, *, label: Path) -> tuple[Path, bool]:
    """Build a wheel of *source_dir* into *out_dir*; return it and whether the build was isolated.

    *label* is the user's project path, used in error messages.
    """
    runner = _CapturingRunner()
    try:
        builder = ProjectBuilder(source_dir, runner=runner)
        if _satisfied(builder):
            return Path(builder.build("wheel", out_dir)), False
        runner = _CapturingRunner()
        with DefaultIsolatedEnv() as env:
            builder = ProjectBuilder.from_isolated_env(env, source_dir, runner=runner)
            env.install(builder.build_system_requires)
            env.install(builder.get_requires_for_build("wheel"))
            return Path(builder.build("wheel", out_dir)), True
    except BuildBackendException as exc:
        raise BundleError(
            f"the build backend of {label} failed to build a wheel ({exc}); fix the project's build "
            f"configuration (reproduce with `python -m build --wheel {label}`). Backend output tail:\n"
            f"{runner.tail() or _process_output(exc.exception)}"
        ) from None
    except subprocess.CalledProcessError as exc:  # installing the build requirements
        raise BundleError(
            f"installing the build requirements of {label} failed; check [build-system].requires. "
            f"Installer output tail:\n{_process_output(exc)}"
        ) from None
    except BuildException as exc:
        raise BundleError(f"cannot build {label}: {exc}; fix [build-system] in its pyproject.toml") from None


def _satisfied(builder: ProjectBuilder) -> bool:
    """True when this interpreter has every build requirement (static, then the backend's own)."""
    if any(any(True for _ in check_dependency(req)) for req in builder.build_system_requires):
        return False
    try:
        return not builder.check_dependencies("wheel")
    except BuildBackendException as exc:
        if isinstance(exc.exception, pyproject_hooks.BackendUnavailable):
            return False  # its module is not importable here: build isolated
        raise


def _process_output(exc: BaseException) -> str:
    parts = [getattr(exc, "output", None), getattr(exc, "stderr", None)]
    text = "".join(p.decode(errors="replace") if isinstance(p, bytes) else p for p in parts if p)
    return text[-OUTPUT_TAIL:] or repr(exc)
