"""The workflow: ask the policy for one shell command, run it, keep its output as the answer.

Everything the grader and a person need is left in ``ctx.artifacts_dir`` (the answer, the
command, a transcript): the platform shows that directory as the run's Artifacts, and the
grader reads the answer from it, wherever it runs.
"""

from __future__ import annotations

import asyncio
import re
import tempfile

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowConfig, AgentWorkflowContext, AgentWorkflowOutput

from calc_rollout.llm import chat

SYSTEM_PROMPT = """\
You work in a Linux shell. Reply with exactly one shell command whose standard output is the
answer to the user's question, and nothing else."""
CODE_BLOCK = re.compile(r"```(?:sh|bash|shell)?\s*\n(.*?)```", re.DOTALL)


class CalcConfig(AgentWorkflowConfig):
    name: str = "calc"
    command_timeout_sec: float = 30.0


calc_config = CalcConfig()


class CalcWorkflow(AgentWorkflow[CalcConfig]):
    async def run(self, ctx: AgentWorkflowContext[CalcConfig]) -> AgentWorkflowOutput:
        config = ctx.config or CalcConfig()
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *ctx.prompt]
        reply = await chat(messages)
        messages.append({"role": "assistant", "content": reply})
        command = to_command(reply)
        exit_code, output = await run_command(command, config.command_timeout_sec)
        answer = output.strip()
        if ctx.artifacts_dir is not None:
            (ctx.artifacts_dir / "answer.txt").write_text(answer + "\n")
            (ctx.artifacts_dir / "command.sh").write_text(command + "\n")
            (ctx.artifacts_dir / "transcript.txt").write_text(f"$ {command}\n{output}[exit code {exit_code}]\n")
        messages.append({"role": "user", "content": f"$ {command}\n{output}[exit code {exit_code}]"})
        return AgentWorkflowOutput(messages=messages, metrics={"exit_code": float(exit_code)})


def to_command(reply: str) -> str:
    """The command in ``reply``: its fenced block, else the reply itself."""
    block = CODE_BLOCK.search(reply)
    return (block.group(1) if block else reply).strip()


async def run_command(command: str, timeout: float) -> tuple[int, str]:
    """``sh -c command`` in a fresh directory; its exit code and output (stdout, then stderr)."""
    with tempfile.TemporaryDirectory(prefix="calc-") as workdir:
        process = await asyncio.create_subprocess_exec(
            "sh", "-c", command, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            return 124, f"timed out after {timeout:.0f} s\n"
    return process.returncode or 0, stdout.decode(errors="replace") + stderr.decode(errors="replace")
