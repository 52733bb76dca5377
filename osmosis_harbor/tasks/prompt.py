"""A chat prompt rendered as the ``instruction.md`` an agent reads (template mode)."""

from __future__ import annotations

import json
from typing import Any

from osmosis_harbor.errors import InvalidRequestError

__all__ = ["render_prompt"]


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
        file = _file if isinstance(_file := part.get("file"), dict) else part
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
    fn = _function if isinstance(_function := call.get("function"), dict) else call
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
        raise InvalidRequestError("prompt must be a list of chat messages (dicts with 'role' and 'content')")
    if len(prompt) == 1 and prompt[0].get("role", "user") == "user" and not prompt[0].get("tool_calls"):
        text = _content_text(prompt[0].get("content"))
        if not text.strip():
            raise InvalidRequestError("prompt is empty: its only user message has no text")
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
        raise InvalidRequestError("prompt is empty: no message has any text")
    return rendered + "\n"
