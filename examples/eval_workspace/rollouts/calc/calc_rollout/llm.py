"""Call the policy through the rollout's chat-completions endpoint (the active ``RolloutContext``):
how the platform, or ``osmosis eval run``'s model bridge, serves the model and records the trace."""

from __future__ import annotations

from typing import Any

import httpx
from osmosis_ai.rollout import get_rollout_context


async def chat(messages: list[dict[str, Any]]) -> str:
    rollout = get_rollout_context()
    if rollout is None or not rollout.chat_completions_url:
        raise RuntimeError("no rollout context: run this workflow through an Osmosis execution backend")
    url = rollout.chat_completions_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
    body = {"model": "osmosis-rollout", "messages": messages, "max_tokens": 256}
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=30.0)) as client:
        response = await client.post(url, json=body, headers=headers)
    if response.status_code >= 400:
        raise RuntimeError(f"chat completion failed: HTTP {response.status_code} {response.text[:300]}")
    return response.json()["choices"][0]["message"].get("content") or ""
