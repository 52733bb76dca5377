"""The Harbor agent that runs an Osmosis ``AgentWorkflow`` bundle inside the sandbox.

Harbor drives it like any agent: ``setup`` puts the rollout input (id, prompt, metadata:
never the label) in the sandbox and ``run`` executes ``<pkg>-agent`` from the bundle's own
venv (``/opt/osmosis/venv``; the image's Python and user are left alone). When the task
image bakes the bundle in (``bundle_baked``, see ``osmosis_harbor.tasks.dockerfile``),
setup is one file upload and ``run`` checks the image's bundle marker in the same exec as
the workflow; otherwise (an image built elsewhere) setup pip-installs the wheel first. The chat endpoint and API key are looked up in host memory by rollout id
and given to that one process through its environment, so they never reach a file.
A workflow failure is raised as ``WorkflowFailedError`` carrying the shim's structured
error, which Harbor records as the trial's exception (and skips verification).
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path, PurePosixPath
from typing import Any, override

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from osmosis_ai.rollout.types import RolloutSample

from osmosis_harbor.agents.limits import limits_note
from osmosis_harbor.errors import (
    BundleInstallError,
    IncompatibleTaskImageError,
    WorkflowFailedError,
    WrongBundleError,
)
from osmosis_harbor.sandbox.images.build_failure import last_lines
from osmosis_harbor.sandbox.owner.context import current_owner
from osmosis_harbor.shim import contract
from osmosis_harbor.shim.errors import Redactor
from osmosis_harbor.shim.models import ErrorFile, RolloutInput
from osmosis_harbor.trials.contract_files import ContractBounds, FileKind, read_json

__all__ = [
    "IMPORT_PATH",
    "VENV",
    "WorkflowAgent",
    "agent_timeout_budget",
    "bundle_check_command",
    "install_bundle",
    "install_command",
    "wrong_bundle_line",
]

IMPORT_PATH = "osmosis_harbor.agents.workflow:WorkflowAgent"
BUNDLE_ROOT = PurePosixPath(contract.BUNDLE_ROOT)
VENV = PurePosixPath(contract.VENV)
ROLLOUT_INPUT = PurePosixPath(contract.ROLLOUT_INPUT)
AGENT_LOGS = PurePosixPath(contract.AGENT_LOGS)
MIN_PYTHON = contract.MIN_PYTHON
# The shim's own deadline fires this much before Harbor's kill, so a workflow that runs out
# of time ends with a clean error.json (category timeout) rather than a killed process.
SHIM_DEADLINE_MARGIN = 0.1


def agent_timeout_budget(agent_timeout_sec: float | None) -> float | None:
    """The deadline the shim enforces (``OSMOSIS_AGENT_TIMEOUT_SEC``) for a rollout's agent
    timeout: a little under Harbor's, which stays the backstop."""
    if agent_timeout_sec is None:
        return None
    return round(agent_timeout_sec * (1 - SHIM_DEADLINE_MARGIN), 3)


def install_command(wheel: PurePosixPath, *, deps_preinstalled: bool, python: str = "python3") -> str:
    """Shell command that installs ``wheel`` into the bundle venv, creating it if needed."""
    venv = shlex.quote(str(VENV))
    need = ".".join(str(p) for p in MIN_PYTHON)
    no_deps = "--no-deps --no-index " if deps_preinstalled else ""
    return (
        "set -e; "
        f"if [ ! -x {venv}/bin/python ]; then "
        f"  command -v {python} >/dev/null || {{ echo 'the task image has no {python}: the workflow bundle needs Python >= {need}' >&2; exit {contract.EXIT_NO_PYTHON}; }}; "
        f"  {python} -c 'import sys; sys.exit(sys.version_info < {MIN_PYTHON})' || "
        f'    {{ echo "the task image\'s {python} is $({python} -V 2>&1): the workflow bundle needs Python >= {need}" >&2; exit {contract.EXIT_OLD_PYTHON}; }}; '
        f"  {python} -m venv {venv}; "
        "fi; "
        f"{venv}/bin/python -m pip install --disable-pip-version-check -q {no_deps}{shlex.quote(str(wheel))}"
    )


def bundle_check_command(key: str) -> str:
    """Shell that fails with one line (exit ``EXIT_WRONG_BUNDLE``) unless the image's bundle
    marker names bundle ``key``: a baked image is checked where the bundle runs, in the same
    call, instead of installing. The line names both keys and the way out."""
    marker = contract.BUNDLE_MARKER
    return (
        f'held=$(cat {marker} 2>/dev/null); [ "$held" = {shlex.quote(key)} ] || {{ '
        f'echo "{contract.WRONG_BUNDLE_MESSAGE}: this rollout runs bundle {shlex.quote(key)} but the image '
        f"holds ${{held:-no bundle}} ({marker}): a sandbox image or warm pool built for another bundle; "
        f're-run prewarm with this bundle" >&2; exit {contract.EXIT_WRONG_BUNDLE}; }}'
    )


def wrong_bundle_line(return_code: int | None, output: str | None) -> str | None:
    """The check's line when ``bundle_check_command`` failed (and not the workflow, which
    could exit with the same code), else None."""
    if return_code != contract.EXIT_WRONG_BUNDLE:
        return None
    return next((line for line in (output or "").splitlines() if line.startswith(contract.WRONG_BUNDLE_MESSAGE)), None)


class WorkflowAgent(BaseAgent):
    """Runs ``<pkg>-agent`` from an Osmosis bundle as the trial's agent."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        bundle_wheel: str,
        agent_script: str,
        rollout_id: str,
        rollout_input: str,
        output_max_bytes: int,
        contract_bounds: dict[str, int],
        deps_preinstalled: bool = False,
        bundle_baked: str | None = None,
        steps: list[str] | None = None,
        shim_timeout_sec: float | None = None,
        **kwargs: Any,
    ) -> None:
        # The workflow reaches its model through the rollout's chat endpoint (the policy relay), so
        # Harbor's LiteLLM provider parse says nothing about it, and it would import litellm (5 s
        # of CPU) in every process that runs a trial.
        kwargs.setdefault("skip_model_parsing", True)
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self._wheel = Path(bundle_wheel)
        self._script = agent_script
        self._rollout_id = rollout_id
        self._rollout_input = Path(rollout_input)
        self._deps_preinstalled = deps_preinstalled
        self._bundle_baked = bundle_baked  # the key the image's marker must hold
        self._steps = list(steps or [])
        self._shim_timeout_sec = shim_timeout_sec
        self._output_max_bytes = output_max_bytes  # the backend's Settings.exec_output_max_bytes
        self._bounds = ContractBounds.model_validate(contract_bounds)  # the backend's, for files the sandbox wrote
        self._step_index = 0
        # Where the shim finds this run's input: the file, unless ``_stage_input`` sent it inline.
        self._input_env: dict[str, str] = {contract.ROLLOUT_INPUT_ENV: str(ROLLOUT_INPUT)}

    @staticmethod
    @override
    def name() -> str:
        return "osmosis-workflow"

    @override
    def version(self) -> str | None:
        return self._wheel.name

    @override
    async def setup(self, environment: BaseEnvironment) -> None:
        if self._bundle_baked is not None:
            # The image holds the bundle and /osmosis (755): no exec. A multi-step task stages
            # each step's input in run instead.
            if not self._steps:
                await self._stage_input(self._rollout_input, environment)
            return
        # The rollout input travels with the bundle: setup runs as root, so one exec
        # installs the wheel and makes the input readable by whatever user the agent runs as.
        await install_bundle(
            environment, self._wheel, deps_preinstalled=self._deps_preinstalled, rollout_input=self._rollout_input
        )

    async def _stage_step_input(self, instruction: str, environment: BaseEnvironment) -> None:
        """Multi-step tasks: each step is one more turn of the same conversation.

        Harbor calls ``run`` once per step, in one sandbox. Step ``k`` gets the previous
        step's messages (its ``sample.json``, which Harbor has archived under
        ``steps/<name>/agent/`` by now; the request's prompt for the first step) plus the
        step's instruction as a new user message, and ``metadata["harbor_step"]`` says
        which step it is."""
        index = self._step_index
        self._step_index += 1
        base = RolloutInput.model_validate_json(self._rollout_input.read_text())
        prompt = list(base.prompt)
        if index > 0:
            previous = PurePosixPath("steps", self._steps[index - 1], "agent", contract.SAMPLE_FILENAME)
            try:  # the previous step's sandbox wrote it: a contract file, read off the event loop
                document = await asyncio.to_thread(
                    read_json, self.logs_dir.parent, previous, FileKind.SAMPLE, self._bounds
                )
                prompt = [dict(m) for m in RolloutSample.model_validate(document).messages]
            except (OSError, ValueError) as exc:
                raise WorkflowFailedError(
                    f"[agent_error] step {self._steps[index]}: the previous step left no usable "
                    f"sample.json ({type(exc).__name__})"
                ) from None
        prompt.append({"role": "user", "content": instruction})
        metadata = dict(base.metadata or {})
        metadata["harbor_step"] = {"name": self._steps[index], "index": index, "count": len(self._steps)}
        staged = self._rollout_input.with_name(f"{self._rollout_input.stem}.step{index}.json")
        staged.write_text(base.model_copy(update={"prompt": prompt, "metadata": metadata}).model_dump_json())
        await self._stage_input(staged, environment)

    async def _stage_input(self, path: Path, environment: BaseEnvironment) -> None:
        """This run's input: inline in the workflow's exec when the bundle is baked and the
        input small (no call), else uploaded as the file the shim reads."""
        text = inline_input(path) if self._bundle_baked is not None else None
        if text is not None:
            self._input_env = {contract.ROLLOUT_INPUT_JSON_ENV: text}
            return
        path.chmod(0o644)  # an SDK that keeps the mode: any agent user reads it
        await environment.upload_file(path, str(ROLLOUT_INPUT))
        self._input_env = {contract.ROLLOUT_INPUT_ENV: str(ROLLOUT_INPUT)}

    @override
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        if self._steps:
            await self._stage_step_input(instruction, environment)
        creds = current_owner("the workflow agent's rollout credentials").credentials.get(self._rollout_id)
        env = {**self._input_env, contract.ROLLOUT_ID_ENV: self._rollout_id}
        if self._shim_timeout_sec is not None:
            env[contract.AGENT_TIMEOUT_ENV] = str(self._shim_timeout_sec)
        if creds is not None:
            # The relay's URL when the endpoint is on the host's loopback (the backend decided).
            env[contract.CHAT_URL_ENV] = creds.sandbox_url or creds.chat_completions_url
            if creds.api_key:
                env[contract.KEY_ENV] = creds.api_key
        command = shlex.quote(str(VENV / "bin" / self._script))
        if self._bundle_baked is not None:
            command = f"{bundle_check_command(self._bundle_baked)}; exec {command}"
        if (logs_follow := getattr(environment, "logs_follow", None)) is not None:
            logs_follow(command)  # Harbor reads /logs next: on SkyPilot's path the read rides this exec
        result = await environment.exec(command, env=env)
        redactor = Redactor.for_key(creds.api_key if creds else None)
        log = output_tail(redactor.text((result.stdout or "") + (result.stderr or "")), self._output_max_bytes)
        (self.logs_dir / "workflow.log").write_text(log)
        if self._bundle_baked is not None and (wrong := wrong_bundle_line(result.return_code, result.stderr)):
            raise WrongBundleError(wrong)
        if result.return_code != 0:
            summary = await self._error_summary(environment, result.return_code, redactor, log)
            note = await limits_note(environment)  # first: the outcome finds it by its place
            raise WorkflowFailedError(f"{note} | {summary}" if note else summary)

    async def _error_summary(self, environment: BaseEnvironment, code: int, redactor: Redactor, log: str) -> str:
        local = self.logs_dir / "error.json"
        try:
            await environment.download_file(str(AGENT_LOGS / contract.ERROR_FILENAME), local)
            # The workflow's own words (the host decides the category: backend/categories.py).
            document = await asyncio.to_thread(read_json, local.parent, local.name, FileKind.ERROR, self._bounds)
            error = ErrorFile.model_validate(document)
            said = f"[{error.category.value}] {error.type}: {error.message}"
            return redactor.text(said[:2000])
        except Exception:
            tail = log.strip().splitlines()[-1:] or [""]
            return f"[agent_error] workflow exited with status {code}: {tail[0]}"

    @override
    def populate_context_post_run(self, context: AgentContext) -> None:
        return None


def output_tail(text: str, limit: int) -> str:
    """The end of a workflow's output, as much as ``limit`` characters (the backend's
    ``Settings.exec_output_max_bytes``, carried in the agent's kwargs), with a note of what was
    cut: an SDK may hand over all of it, and the log file and failure summary need only its
    end. Cut after redaction, so no partial key."""
    if len(text) <= limit:
        return text
    return (
        f"[osmosis-harbor: the first {len(text) - limit} characters of the workflow output were dropped]\n"
        + text[-limit:]
    )


def inline_input(path: Path) -> str | None:
    """The input's JSON text when it is small enough to ride the exec's environment
    (``contract.INLINE_INPUT_MAX_BYTES``), else None (it goes as a file)."""
    data = path.read_bytes()
    if len(data) > contract.INLINE_INPUT_MAX_BYTES or b"\x00" in data:
        return None
    return data.decode("utf-8")


async def install_bundle(
    environment: BaseEnvironment, wheel: Path, *, deps_preinstalled: bool, rollout_input: Path | None = None
) -> None:
    """Upload ``wheel`` (and the rollout input) and install the wheel into the bundle venv,
    as root since the venv is shared. Each exec is a round trip to the sandbox, so the
    directories are made in one and the install and permissions done in another."""
    remote = PurePosixPath(contract.WHEELS_DIR) / wheel.name
    await environment.exec(f"mkdir -p {shlex.quote(str(remote.parent))} {ROLLOUT_INPUT.parent}", user="root")
    await environment.upload_file(wheel, str(remote))
    command = install_command(remote, deps_preinstalled=deps_preinstalled)
    if rollout_input is not None:
        await environment.upload_file(rollout_input, str(ROLLOUT_INPUT))
        command += f" && chmod 755 {ROLLOUT_INPUT.parent} && chmod 644 {ROLLOUT_INPUT}"
    result = await environment.exec(command, user="root", timeout_sec=1800)
    if result.return_code in contract.IMAGE_PROBLEM_EXITS:
        raise IncompatibleTaskImageError((result.stderr or result.stdout or "").strip())
    if result.return_code != 0:
        output = ((result.stdout or "") + (result.stderr or "")).strip()
        raise BundleInstallError(
            f"installing {wheel.name} in the sandbox failed (exit {result.return_code}); pip's last lines:\n"
            + last_lines(output)
        )
