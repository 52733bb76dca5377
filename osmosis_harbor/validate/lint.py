"""Harbor's own ``harbor lint`` rules, run on each task before ``validate`` starts a sandbox.

The rules, their selection (Harbor's defaults, then a dataset manifest's and the task's own
``[metadata.harbor.lint]``) and the findings are Harbor's. Harbor gives findings no severity
(``harbor lint`` fails on any); validation needs two. An *error* means the task as written is
not what Harbor will run: malformed or misspelled configuration, missing or escaping files,
artifacts that overwrite the logs the verdict is read from. Everything else (verifier isolation,
pinning, answers leaking into the image) is a *warning*: advice an oracle run can still judge.
One rule is ours (``shared-verifier-shell-exec``, a warning): a task whose rollouts training
refuses on the SDK being validated, because the verifier guard cannot protect them there.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel

from osmosis_harbor import settings
from osmosis_harbor.harbor_compat.lint_rules import selected_rules
from osmosis_harbor.sandbox.sdk.registry import SandboxImplementation
from osmosis_harbor.tasks.discovery import DatasetError, TaskRef
from osmosis_harbor.tasks.verification import VerificationMode, decide_verification
from osmosis_harbor.tasks.verifier_shell import RULE as SHELL_EXEC_RULE
from osmosis_harbor.tasks.verifier_shell import unprotected_reason


class LintMode(StrEnum):
    """``--lint``: ``report`` shows findings and runs every task; ``strict`` refuses tasks with
    lint errors (phase ``task``) before their sandbox starts."""

    OFF = "off"
    REPORT = "report"
    STRICT = "strict"


class LintSeverity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


ERROR_RULES = frozenset(
    {
        "invalid-task-config",
        "unknown-config-field",
        "invalid-task-files",
        "overlapping-artifacts",
        "artifact-log-overlap",
    }
)
LINT_FAILED = "lint-failed"  # not a Harbor rule: lint itself could not run on the task
# Harbor's own wording, where it does not say what to do in the terms of this tool.
ADVICE = {
    "shared-verifier": (
        "the verifier runs in the agent's sandbox by Harbor's default; osmosis-harbor runs such tests in a fresh "
        "sandbox of the image unless the task needs the agent's (a service, several steps: then under the "
        'verifier guard); to say so in the task, set [verifier] environment_mode = "separate" and declare the '
        "evidence the tests read as artifacts, or run the agent as an unprivileged [agent] user"
    ),
}


class LintIssue(BaseModel):
    """One finding: a row of ``"lint"`` in the JSON report and a line under its task."""

    rule: str
    severity: LintSeverity
    message: str
    path: str  # relative to the task directory when inside it
    line: int | None = None


def _issue(rule: str, message: str, path: str, line: int | None = None) -> LintIssue:
    severity = LintSeverity.ERROR if rule in ERROR_RULES | {LINT_FAILED} else LintSeverity.WARNING
    return LintIssue(rule=rule, severity=severity, message=ADVICE.get(rule, message), path=path, line=line)


def _relative(path: str, task_dir: Path) -> str:
    try:
        return Path(path).relative_to(task_dir).as_posix()
    except ValueError:
        return path


def lint_task_ref(task: TaskRef) -> list[LintIssue]:
    """Harbor's findings for ``task``, exactly those ``harbor lint TASK_DIR`` prints."""
    import typer
    from harbor.lint import lint_task
    from harbor.lint.compose import ComposeLoadError
    from harbor.lint.models import COMPOSE_RULES, LintConfig

    root = task.path.resolve()
    extra: list[LintIssue] = []
    try:
        rules = selected_rules(root, LintConfig())
        try:
            findings = lint_task(root, selected_rules=rules)
        except ComposeLoadError as exc:  # no Compose plugin here: lint the rest, say what was skipped
            findings = lint_task(root, selected_rules=rules - COMPOSE_RULES)
            extra.append(_issue("compose-checks-skipped", str(exc), "environment/docker-compose.yaml"))
    except typer.BadParameter as exc:
        return [_issue(LINT_FAILED, exc.format_message(), "task.toml")]
    except Exception as exc:  # like `harbor lint`, never echo the text: parsers can quote secrets
        return [
            _issue(
                LINT_FAILED,
                f"harbor lint could not run ({type(exc).__name__}); check the task's files and permissions",
                ".",
            )
        ]
    return [_issue(f.rule.value, f.message, _relative(f.path, root), f.line) for f in findings] + extra


def shell_exec_issues(task: TaskRef, sdk: SandboxImplementation, config: settings.Settings) -> list[LintIssue]:
    """Ours, not Harbor's: a rollout of ``task`` on ``sdk`` that training refuses because the
    verifier guard cannot protect it (``tasks/verifier_shell.py``), with the ways out."""
    try:
        shared = decide_verification(task.path, config=config).mode is VerificationMode.SHARED  # training's own
        guarded = config.verifier_guard and shared
        reason = unprotected_reason(task.path, sdk, guarded=guarded, config=config)
    except Exception:  # an unreadable task.toml: Harbor's own rules report it
        return []
    return [_issue(SHELL_EXEC_RULE, f"training refuses this task: {reason}", "task.toml")] if reason else []


def lint_dataset(
    tasks: list[TaskRef], mode: LintMode, config: settings.Settings, sdk: SandboxImplementation | None = None
) -> dict[str, list[LintIssue]]:
    """Findings per task id (with ``sdk``: ours about that SDK too); empty when linting is off."""
    if mode == LintMode.OFF:
        return {}
    return {task.id: lint_task_ref(task) + (shell_exec_issues(task, sdk, config) if sdk else []) for task in tasks}


def refuse_lint_errors(task: TaskRef, issues: list[LintIssue]) -> None:
    """``--lint=strict``: raise ``DatasetError`` naming the first error, so the task is reported
    in phase ``task`` and never reaches a sandbox."""
    errors = [i for i in issues if i.severity is LintSeverity.ERROR]
    if not errors:
        return
    first = errors[0]
    where = first.path + (f":{first.line}" if first.line else "")
    more = f" (and {len(errors) - 1} more lint error(s))" if len(errors) > 1 else ""
    raise DatasetError(f"task {task.id}: harbor lint error {first.rule} in {where}: {first.message}{more}")
