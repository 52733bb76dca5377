"""The workflow: the policy writes one shell command (or an expression), the sandbox runs it.

Its output is the answer: written to ``<workdir>/answer.txt`` for the grader and,
with the command, to ``ctx.artifacts_dir`` for people to look at.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
import time
from pathlib import Path

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
)

from calc_agent.llm import chat

SYSTEM_PROMPT = """\
You work in a Linux sandbox. Answer the user's task by writing exactly one shell
command whose standard output is the answer, in a ```sh code block. For pure
arithmetic you may instead reply with just the expression, e.g. (17 + 4) * 2."""

CODE_BLOCK = re.compile(r"```(?:sh|bash|shell)?\s*\n(.*?)```", re.DOTALL)
EXPRESSION = re.compile(r"[\d\s.+\-*/%()]+")


class CalcConfig(AgentWorkflowConfig):
    name: str = "calc-agent"
    workdir: str = "/workspace"  # the task's working directory in the sandbox
    temperature: float = 1.0
    max_tokens: int = 1024
    command_timeout_sec: float = 60.0


calc_config = CalcConfig()


class CalcWorkflow(AgentWorkflow[CalcConfig]):
    async def run(self, ctx: AgentWorkflowContext[CalcConfig]) -> AgentWorkflowOutput:
        config = ctx.config or CalcConfig()
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *ctx.prompt]
        reply = await chat(messages, temperature=config.temperature, max_tokens=config.max_tokens)
        messages.append({"role": "assistant", "content": reply})

        command = to_command(reply)
        workdir = resolve_workdir(config.workdir)
        started = time.monotonic()
        exit_code, stdout, stderr = await run_command(command, workdir, config.command_timeout_sec)
        seconds = time.monotonic() - started

        answer = stdout.strip()
        (workdir / "answer.txt").write_text(answer + "\n")
        if ctx.artifacts_dir:
            (ctx.artifacts_dir / "command.sh").write_text(command + "\n")
            (ctx.artifacts_dir / "stdout.txt").write_text(stdout)
            (ctx.artifacts_dir / "stderr.txt").write_text(stderr)
        transcript = f"$ {command}\n{stdout}{stderr}[exit code {exit_code}]"
        messages.append({"role": "user", "content": transcript})
        return AgentWorkflowOutput(
            messages=messages,
            metrics={"exit_code": float(exit_code), "command_seconds": seconds, "llm_calls": 1.0},
        )


def resolve_workdir(workdir: str) -> Path:
    """*workdir* where it exists (the sandbox), else the current directory (a local run)."""
    return Path(workdir) if Path(workdir).is_dir() else Path.cwd()


def to_command(reply: str) -> str:
    """The shell command in *reply*: its ```sh block, or a bare arithmetic expression."""
    if block := CODE_BLOCK.search(reply):
        return block.group(1).strip()
    text = reply.strip().rstrip(".")
    if EXPRESSION.fullmatch(text):
        return shlex.join([sys.executable, "-c", f"print({text})"])
    return shlex.join(["echo", text])  # no command at all: the reply itself is the answer


async def run_command(command: str, workdir: Path, timeout: float) -> tuple[int, str, str]:
    """Run *command* with ``sh -c`` in *workdir*; return its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", command, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return 124, "", f"timed out after {timeout:.0f} s\n"
    return process.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")
