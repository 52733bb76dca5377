"""Tiny workflows for tests of the bundler and the shim; not part of the example.

They never call the policy, so they run anywhere; one per return shape the SDK
accepts (``AgentWorkflowOutput``, a message list, ``None`` with a registered
sample source), plus one that fails.
"""

from __future__ import annotations

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    RolloutSample,
    SampleSource,
    get_rollout_context,
)


def _echo(ctx: AgentWorkflowContext) -> list[dict]:
    return [*ctx.prompt, {"role": "assistant", "content": "42"}]


class OutputWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
        return AgentWorkflowOutput(messages=_echo(ctx), metrics={"steps": 1.0})


class ListWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        return _echo(ctx)


class _FixedSource(SampleSource):
    def __init__(self, messages: list[dict]) -> None:
        self.messages = messages

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=self.messages)


class NoneWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        rollout = get_rollout_context()
        assert rollout is not None, "NoneWorkflow needs an active RolloutContext"
        rollout.set_sample_source(_FixedSource(_echo(ctx)))


class FailingWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        raise RuntimeError("FailingWorkflow always fails")
