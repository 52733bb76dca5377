"""Call the policy through the rollout's chat-completions endpoint.

Every LLM call of a rollout must go through the URL the execution backend put
in the active ``RolloutContext``: that is how the training cluster serves the
current policy and records the trace. ``httpx`` comes with osmosis-ai.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from osmosis_ai.rollout import get_rollout_context


async def chat(messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
    """One chat completion from the policy; returns the assistant's text."""
    rollout = get_rollout_context()
    if rollout is None or not rollout.chat_completions_url:
        raise RuntimeError("no rollout context: run this workflow through an Osmosis execution backend")
    # The URL is an OpenAI-style base: clients append /chat/completions.
    url = rollout.chat_completions_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
    body = {
        "model": "osmosis-rollout",  # the gateway picks the policy; the name is informational
        "messages": messages,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0)) as client:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code >= 400:
                await response.aread()
                raise RuntimeError(f"chat completion failed: HTTP {response.status_code} {response.text[:500]}")
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                return await _read_stream(response)
            payload = json.loads(await response.aread())
            return payload["choices"][0]["message"].get("content") or ""


async def _read_stream(response: httpx.Response) -> str:
    """Concatenate the content deltas of a server-sent-events completion."""
    parts: list[str] = []
    async for line in response.aiter_lines():
        data = line.removeprefix("data:").strip()
        if not line.startswith("data:") or data == "[DONE]":
            continue
        for choice in json.loads(data).get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)
