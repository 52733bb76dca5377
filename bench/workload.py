"""The graded rollout the host-cost benchmarks submit: one chat call, then the fixture
project's ``AnswerGrader``, so ``scale``, ``incumbent`` and ``timeline`` measure the same work."""

from __future__ import annotations

from osmosis_ai.rollout.client import RolloutClient

from .env import new_id

__all__ = ["ANSWER", "GRADED_PROMPT", "submit_rollout"]

ANSWER = "osmosis"
GRADED_PROMPT = f"Write {ANSWER} to answer.txt\nreply: echo {ANSWER} > answer.txt"


async def submit_rollout(
    client: RolloutClient, chat_url: str, text: str, *, grade: bool, timeout: float | None
) -> bool:
    """Run one rollout of ``text`` through the osmosis client; whether it succeeded."""
    handle = await client.run_rollout_async(
        initial_messages=[{"role": "user", "content": text}],
        chat_completions_url=chat_url,
        rollout_id=new_id("scale"),
        llm_api_key="sk-bench-not-a-secret",
        label=ANSWER if grade else None,
        grade=grade,
        agent_timeout_sec=timeout,
    )
    result = await handle.wait_for_completion()
    return result.status.value == "success"
