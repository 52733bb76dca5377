"""Per-rollout task copies: prompt rendering, materialization and Dockerfile patching.

Host-side only. For every rollout the backend resolves a task (``TaskResolver``, see
``osmosis_harbor.taskrefs``) and calls ``materialize_task`` to copy it into the
rollout's work directory, where the rollout's own files are staged:

* ``instruction.md``: replaced by the rendered prompt (template mode);
* ``tests/osmosis_grading_input.json``: what the Osmosis grader reads in the verifier;
* ``tests/test.sh``: generated to run the grader, only when the task has no tests of
  its own (a task's own ``tests/test.sh`` always wins);
* ``environment/Dockerfile``: optionally patched to pre-install the bundle's
  dependencies into ``/opt/osmosis/venv`` (``patch_environment``). The patch is
  deterministic, so identical copies keep one Harbor environment hash and one image.

A copy of a small task takes a few milliseconds (``shutil.copytree`` keeping symlinks,
after checking that none leads outside the task).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from .dataset import INSTRUCTION, is_task_dir, symlink_problem
from .taskrefs import (
    ResolvedTask,
    TaskMode,
    TaskResolutionError,
    TaskResolver,
    UnpinnedTaskRefWarning,
)

__all__ = [
    "CONTAINER_REQUIREMENTS",
    "GRADING_INPUT_FILENAME",
    "REQUIREMENTS_FILENAME",
    "EnvironmentPatch",
    "MaterializedTask",
    "ResolvedTask",
    "TaskMode",
    "TaskResolutionError",
    "TaskResolver",
    "UnpinnedTaskRefWarning",
    "materialize_task",
    "patch_environment",
    "render_prompt",
]

GRADING_INPUT_FILENAME = "osmosis_grading_input.json"  # /tests/osmosis_grading_input.json in the sandbox
REQUIREMENTS_FILENAME = "osmosis-requirements.txt"  # in environment/, next to the Dockerfile
CONTAINER_REQUIREMENTS = "/opt/osmosis/requirements.txt"
PATCH_BEGIN = "# >>> osmosis-harbor: bundle dependencies (generated; do not edit) >>>"
PATCH_END = "# <<< osmosis-harbor: bundle dependencies <<<"


# -- prompts -------------------------------------------------------------------------


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return json.dumps(part, default=str)
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text") or (kind is None and "text" in part):
        return str(part.get("text") or "")
    if kind == "refusal":
        return str(part.get("refusal") or "")
    if kind in ("image_url", "input_image"):
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        return "[image]" if not url or str(url).startswith("data:") else f"[image: {url}]"
    if kind in ("input_audio", "audio"):
        return "[audio]"
    if kind in ("file", "input_file"):
        file = part.get("file") if isinstance(part.get("file"), dict) else part
        name = file.get("filename") or file.get("file_id")
        return f"[file: {name}]" if name else "[file]"
    return f"[{kind}]" if kind else json.dumps(part, default=str)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_part_text(p) for p in content) if t)
    return _part_text(content)


def _tool_call_line(call: Any) -> str:
    if not isinstance(call, dict):
        return f"Tool call: {call}"
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name = fn.get("name") or "?"
    args = fn.get("arguments")
    if not isinstance(args, str):
        args = json.dumps(args if args is not None else {}, ensure_ascii=False, default=str)
    ident = f" [{call['id']}]" if call.get("id") else ""
    return f"Tool call{ident}: {name}({args})"


def render_prompt(prompt: list[dict[str, Any]]) -> str:
    """Render a chat prompt as the ``instruction.md`` a native agent reads.

    A single user message becomes its text (content parts joined, one per line). Longer
    prompts become system/developer text first, then one ``## <role>`` section per
    message; tool calls become ``Tool call [id]: name(arguments)`` lines.
    """
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        raise ValueError("prompt must be a list of chat messages (dicts with 'role' and 'content')")
    if len(prompt) == 1 and prompt[0].get("role", "user") == "user" and not prompt[0].get("tool_calls"):
        text = _content_text(prompt[0].get("content"))
        if not text.strip():
            raise ValueError("prompt is empty: its only user message has no text")
        return text
    preamble: list[str] = []
    sections: list[str] = []
    for message in prompt:
        role = str(message.get("role") or "user")
        text = _content_text(message.get("content")).strip()
        if role in ("system", "developer"):
            if text:
                preamble.append(text)
            continue
        heading = f"## {role}"
        if role == "tool" and message.get("tool_call_id"):
            heading += f" (result of {message['tool_call_id']})"
        elif message.get("name"):
            heading += f" ({message['name']})"
        body = [text] if text else []
        body += [_tool_call_line(c) for c in message.get("tool_calls") or []]
        sections.append(heading + "\n\n" + ("\n".join(body) if body else "(empty)"))
    rendered = "\n\n".join([*preamble, *sections]).strip()
    if not rendered:
        raise ValueError("prompt is empty: no message has any text")
    return rendered + "\n"


# -- materialization -----------------------------------------------------------------


class MaterializedTask(Path):
    """The materialized task directory: a real ``Path``, plus what was staged in it.

    ``generated_tests`` is True when ``tests/test.sh`` was generated from
    ``grade_command`` (False: the task's own tests run, or no grade command was given).
    Paths derived from it (``/``, ``parent``, ``resolve()``) are plain ``Path`` objects.
    """

    generated_tests: bool = False
    instruction_replaced: bool = False
    grading_input_written: bool = False
    environment_patched: bool = False
    verifier_isolated: bool = False

    @property
    def path(self) -> Path:
        return Path(self)

    def with_segments(self, *pathsegments: Any) -> Path:
        return Path(*pathsegments)

    def __reduce__(self) -> Any:
        return (_rebuild_materialized, (str(self), self.flags()))

    def flags(self) -> dict[str, bool]:
        return {
            "generated_tests": self.generated_tests,
            "instruction_replaced": self.instruction_replaced,
            "grading_input_written": self.grading_input_written,
            "environment_patched": self.environment_patched,
            "verifier_isolated": self.verifier_isolated,
        }


def _rebuild_materialized(path: str, flags: dict[str, bool]) -> MaterializedTask:
    result = MaterializedTask(path)
    for name, value in flags.items():
        setattr(result, name, value)
    return result


def _write(path: Path, data: str, mode: int | None = None) -> None:
    """Write a file of ours, replacing (never writing through) a symlink at that name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(data, encoding="utf-8")
    if mode is not None:
        path.chmod(mode)


def _relink_absolute(src_root: Path, dest: Path) -> None:
    """Point absolute symlinks (already known to stay inside the task) at the copy."""
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in [*dirnames, *filenames]:
            link = Path(dirpath) / name
            if link.is_symlink() and os.path.isabs(target := os.readlink(link)):
                inside = Path(target).resolve().relative_to(src_root)
                link.unlink()
                link.symlink_to(os.path.relpath(dest / inside, link.parent))


def materialize_task(
    source: ResolvedTask | Path,
    dest: Path,
    *,
    instruction: str | None = None,
    grading_input: dict[str, Any] | None = None,
    grade_command: str | None = None,
    environment_patch: EnvironmentPatch | None = None,
    isolate_grader: bool = False,
    grader_inputs: list[str] | tuple[str, ...] = (),
) -> MaterializedTask:
    """Copy a task to ``dest`` (which must not exist, or be empty) and stage rollout files.

    ``isolate_grader``: when ``tests/test.sh`` is generated (the grader is the verifier),
    the grader runs in a fresh sandbox of the same image (``isolate_verifier``).

    Returns a ``MaterializedTask`` (a ``Path`` to ``dest``) whose flags say what happened.
    Symlinks are kept as symlinks; one leading outside the task is refused, and absolute
    ones inside it are rewritten to point into the copy.
    """
    src = Path(source.path if isinstance(source, ResolvedTask) else source)
    label = source.task_id if isinstance(source, ResolvedTask) else str(src)
    if not is_task_dir(src):
        raise TaskResolutionError(f"task {label}: {src} has no task.toml, so it is not a Harbor task")
    if grade_command is not None and ("\n" in grade_command or "\r" in grade_command or not grade_command.strip()):
        raise ValueError(f"grade_command must be one non-empty shell command line, got {grade_command!r}")
    problem = symlink_problem(src)
    if problem is not None:
        raise TaskResolutionError(f"task {label}: {problem}")
    dest = Path(dest)
    if dest.resolve().is_relative_to(src.resolve()):
        raise ValueError(f"materialize_task: destination {dest} is inside the task {src}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"materialize_task: {dest} already exists and is not an empty directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    result = MaterializedTask(dest)
    try:
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=dest.exists())
        _relink_absolute(src.resolve(), dest)
        if instruction is not None:
            _write(dest / INSTRUCTION, instruction)
            result.instruction_replaced = True
        elif not (dest / INSTRUCTION).is_file() and not task_step_names(dest):  # steps carry their own
            raise TaskResolutionError(f"task {label}: no {INSTRUCTION} and no instruction was given")
        tests = dest / "tests"
        if grading_input is not None:
            _write(tests / GRADING_INPUT_FILENAME, json.dumps(grading_input, ensure_ascii=False, default=str))
            result.grading_input_written = True
        if grade_command is not None and not any(
            (tests / name).exists() or (tests / name).is_symlink() for name in ("test.sh", "test.bat")
        ):
            _write(tests / "test.sh", generated_test_sh(grade_command), mode=0o755)
            result.generated_tests = True
            if isolate_grader:
                isolate_verifier(dest, grader_inputs)
                result.verifier_isolated = True
        if environment_patch is not None:
            result.environment_patched = patch_environment(dest / "environment", environment_patch)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return result


AGENT_LOGS_ARTIFACT = "/logs/agent"


def task_step_names(task_dir: Path) -> list[str]:
    """The ``[[steps]]`` of a multi-step task, in order (empty for a single-step task)."""
    from harbor.models.task.config import TaskConfig

    config = TaskConfig.model_validate_toml((Path(task_dir) / "task.toml").read_text(encoding="utf-8"))
    return [step.name for step in config.steps or []]


def agent_workdir(task_dir: Path) -> str | None:
    """Where the agent works: ``[environment].workdir``, else the Dockerfile's WORKDIR."""
    from harbor.environments.definition import parse_dockerfile_workdir
    from harbor.models.task.config import TaskConfig

    config = TaskConfig.model_validate_toml((Path(task_dir) / "task.toml").read_text(encoding="utf-8"))
    return config.environment.workdir or parse_dockerfile_workdir(Path(task_dir) / "environment" / "Dockerfile")


def isolate_verifier(task_dir: Path, grader_inputs: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Make Harbor grade this task copy in a sandbox the agent never touched.

    The workflow runs as whatever user the task gives it, often root, in the agent
    sandbox: there it can rewrite the installed grader, replace the grade script, or leave
    a process that rewrites ``/logs/verifier/reward.json`` after the grader is done. So the
    verifier runs in Harbor's ``separate`` mode: the agent sandbox is stopped, a fresh
    sandbox starts from the same image (same environment hash, so no extra build), and
    only the agent's products are copied in, as data, through Harbor's sanitising
    artifact upload: ``/logs/agent`` (its sample or trajectory), ``/logs/artifacts``, the
    agent's working directory (what a grader usually inspects; not when it is ``/``) and
    ``grader_inputs``. The grader is installed there from ``tests/`` and the reward is
    read from that sandbox alone. Returns the paths carried over. The task config is
    rewritten through Harbor's own model, never by text edits."""
    from harbor.models.task.config import TaskConfig, VerifierEnvironmentMode

    path = Path(task_dir) / "task.toml"
    config = TaskConfig.model_validate_toml(path.read_text(encoding="utf-8"))
    config.verifier.environment_mode = VerifierEnvironmentMode.SEPARATE
    carried = [AGENT_LOGS_ARTIFACT]
    workdir = agent_workdir(task_dir)
    if workdir and PurePosixPath(workdir) != PurePosixPath("/"):
        carried.append(str(PurePosixPath(workdir)))
    carried += [str(PurePosixPath(p)) for p in grader_inputs]
    for entry in dict.fromkeys(carried):
        if entry not in config.artifacts:
            config.artifacts.append(entry)
    _write(path, config.model_dump_toml())
    return list(dict.fromkeys(carried))


def generated_test_sh(grade_command: str) -> str:
    return (
        "#!/bin/sh\n"
        "# Generated by osmosis-harbor: this task has no tests of its own, so the Osmosis\n"
        f"# grader is its verifier (it reads /tests/{GRADING_INPUT_FILENAME}).\n"
        "set -e\n"
        f"exec {grade_command}\n"
    )


# -- Dockerfile patching -------------------------------------------------------------

_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+-]+$")


MIN_BUNDLE_PYTHON = (3, 12)
INCOMPATIBLE_IMAGE_MARKER = "osmosis-harbor: incompatible task image"


class EnvironmentPatch(BaseModel):
    """Dependencies to pre-install into the task image, in a venv of their own."""

    model_config = ConfigDict(frozen=True)

    requirements: list[str]
    venv: str = "/opt/osmosis/venv"
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
    need = ".".join(map(str, MIN_BUNDLE_PYTHON))
    install = (
        f"{{ command -v {python} >/dev/null && {python} -c "
        f"'import sys; sys.exit(sys.version_info < {MIN_BUNDLE_PYTHON})'; }} || "
        f"{{ echo '{INCOMPATIBLE_IMAGE_MARKER}: the task image has no {python} >= {need}, "
        "which the workflow bundle needs' >&2; exit 90; }; "
        f"{python} -m venv {venv}"
    )
    if patch.requirements:
        install += f" && {venv}/bin/pip install --no-cache-dir -r {CONTAINER_REQUIREMENTS}"
    block = [
        PATCH_BEGIN,
        "USER root",
        f"COPY {REQUIREMENTS_FILENAME} {CONTAINER_REQUIREMENTS}",
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
            _write(ignore, rules.rstrip("\n") + f"\n!{REQUIREMENTS_FILENAME}\n")
    if text != original:
        _write(dockerfile, text)
    return True


def _write_if_changed(path: Path, data: str) -> None:
    if path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8") == data:
        return
    _write(path, data)
