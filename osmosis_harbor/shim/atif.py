"""ATIF (Harbor's Agent Trajectory Interchange Format) to an Osmosis ``RolloutSample``.

Native Harbor agents (terminus-2, mini-swe-agent) record their conversation as an ATIF
``trajectory.json`` rather than an Osmosis sample. The host reads it to build the rollout's
sample, and the verifier shim reads it when a bundled grader grades a native agent's
rollout, so the conversion lives here, where both can import it (standard library and
``osmosis_ai`` only, like the rest of the shim).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.types import RolloutSample


class TrajectoryError(ValueError):
    """A trajectory.json exists but is not a readable ATIF document."""


def _text(content: Any) -> Any:
    """ATIF content (a string or content parts) as OpenAI message content."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p for p in content if isinstance(p, Mapping)]
        if all(p.get("type") == "text" for p in parts):
            return "\n".join(str(p.get("text") or "") for p in parts)
        converted: list[dict[str, Any]] = []
        for part in parts:
            source = _source if isinstance(_source := part.get("source"), Mapping) else {}
            if part.get("type") == "text":
                converted.append({"type": "text", "text": str(part.get("text") or "")})
            elif part.get("type") == "image":
                converted.append({"type": "image_url", "image_url": {"url": str(source.get("path", ""))}})
            else:
                converted.append({"type": "text", "text": f"[{part.get('type')}: {source.get('path', '')}]"})
        return converted
    return json.dumps(content, ensure_ascii=False, default=str)


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments")
    return {
        "id": str(call.get("tool_call_id") or ""),
        "type": "function",
        "function": {
            "name": str(call.get("function_name") or ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}, ensure_ascii=False),
        },
    }


def _agent_messages(step: Mapping[str, Any]) -> list[dict[str, Any]]:
    message: dict[str, Any] = {"role": "assistant", "content": _text(step.get("message"))}
    if step.get("reasoning_content"):
        message["reasoning_content"] = step["reasoning_content"]
    calls = [c for c in step.get("tool_calls") or [] if isinstance(c, Mapping)]
    if calls:
        message["tool_calls"] = [_tool_call(c) for c in calls]
    out = [message]

    observation = _observation if isinstance(_observation := step.get("observation"), Mapping) else {}
    results = [r for r in observation.get("results") or [] if isinstance(r, Mapping) and r.get("content") is not None]
    ids = [c["id"] for c in message.get("tool_calls", [])]
    answered = {r.get("source_call_id") for r in results if r.get("source_call_id") in ids}
    unanswered = [i for i in ids if i not in answered]
    loose = [r for r in results if r.get("source_call_id") not in ids]
    # Results that name no call (some converters drop the id) answer the remaining calls
    # in order when the counts agree; otherwise they are what the policy read next.
    paired = dict(zip((id(r) for r in loose), unanswered, strict=True)) if len(loose) == len(unanswered) else {}
    for result in results:
        call_id = result.get("source_call_id") if result.get("source_call_id") in ids else paired.get(id(result))
        if call_id is not None:
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(result["content"])})
        else:
            out.append({"role": "user", "content": _text(result["content"])})
    return out


def _is_context_marker(step: Mapping[str, Any]) -> bool:
    """A system step recording a summarization/handoff: it delegates to subagent
    trajectories (or declares context management) instead of saying anything to the model."""
    extra = _extra if isinstance(_extra := step.get("extra"), Mapping) else {}
    if extra.get("context_management"):
        return True
    observation = _observation if isinstance(_observation := step.get("observation"), Mapping) else {}
    results = observation.get("results") or []
    return bool(results) and all(
        isinstance(r, Mapping) and r.get("content") is None and r.get("subagent_trajectory_ref") for r in results
    )


def sample_from_atif_file(path: Path) -> RolloutSample | None:
    """The ``RolloutSample`` recorded in an ATIF trajectory file (a native agent's).

    Returns ``None`` when there is no such file (``oracle``, or an agent that failed
    before its first step); raises ``TrajectoryError`` for an unreadable one.
    Messages are OpenAI chat-shaped: ``user`` / ``system`` steps as they are, each agent
    step as an ``assistant`` message (``reasoning_content`` and ``tool_calls`` when
    present) followed by its observations: ``tool`` messages for results tied to a tool
    call, ``user`` messages for what the policy was shown next. Reward and label are left
    to the caller; token totals go to ``metrics``, the trajectory's identity and any
    per-turn token ids/logprobs to ``extra_fields``.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrajectoryError(f"{path}: not a readable JSON document: {exc}") from exc
    return sample_from_atif(document, path)


def sample_from_atif(document: Any, path: Path) -> RolloutSample:
    """``sample_from_atif_file`` for a document already read (the host reads trajectories
    with its own bounded reader); ``path`` only names it."""
    if not isinstance(document, Mapping) or not isinstance(document.get("steps"), list):
        raise TrajectoryError(f"{path}: not an ATIF trajectory (no 'steps' list)")

    messages: list[dict[str, Any]] = []
    turns: dict[str, list[Any]] = {"prompt_token_ids": [], "completion_token_ids": [], "logprobs": []}
    compactions = 0
    llm_calls = 0
    for step in document["steps"]:
        if not isinstance(step, Mapping) or step.get("is_copied_context"):
            continue
        source = step.get("source")
        if source == "agent":
            messages.extend(_agent_messages(step))
            llm_calls += int(step.get("llm_call_count") or 1)
            metrics = _metrics if isinstance(_metrics := step.get("metrics"), Mapping) else {}
            for key in turns:
                turns[key].append(metrics.get(key))
        elif source == "system" and _is_context_marker(step):
            compactions += 1
        elif source in ("system", "user"):
            messages.append({"role": source, "content": _text(step.get("message"))})

    final = _final_metrics if isinstance(_final_metrics := document.get("final_metrics"), Mapping) else {}
    sample_metrics = {
        name: final[key]
        for name, key in (
            ("prompt_tokens", "total_prompt_tokens"),
            ("completion_tokens", "total_completion_tokens"),
            ("cached_tokens", "total_cached_tokens"),
            ("cost_usd", "total_cost_usd"),
        )
        if isinstance(final.get(key), (int, float)) and not isinstance(final.get(key), bool)
    }
    sample_metrics["llm_calls"] = llm_calls
    agent = _agent if isinstance(_agent := document.get("agent"), Mapping) else {}
    extra: dict[str, Any] = {
        "source": "harbor-atif",
        "trajectory_path": f"agent/{path.name}",
        "schema_version": document.get("schema_version"),
        "session_id": document.get("session_id"),
        "agent": {k: agent.get(k) for k in ("name", "version", "model_name") if agent.get(k) is not None},
    }
    if compactions:
        # The context was summarized/handed off: the messages are not one linear chat.
        extra["context_compactions"] = compactions
    if document.get("continued_trajectory_ref"):
        extra["continued_trajectory_ref"] = document["continued_trajectory_ref"]
    for key, values in turns.items():
        if any(v is not None for v in values):
            extra[key] = values
    return RolloutSample(messages=messages, metrics=sample_metrics, extra_fields=extra)
