"""``rollout PATH``: one rollout end to end through the real osmosis server on this machine."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from osmosis_ai.rollout.types import RolloutResultResponse
from rich.markup import escape
from rich.panel import Panel

from osmosis_harbor import settings
from osmosis_harbor.cli.common import agent_args, environment_for, result_console
from osmosis_harbor.errors import UserError
from osmosis_harbor.tasks.discovery import is_task_dir


def cmd_rollout(args: argparse.Namespace) -> int:
    from harbor.trial.queue import TrialQueue

    from osmosis_harbor.backend import HarborBackend
    from osmosis_harbor.serving.local import local_trajectories, run_one_rollout
    from osmosis_harbor.testing.scripted_policy import FakeChatServer

    if bool(args.chat_url) == bool(args.scripted_reply):
        raise UserError("pass either --chat-url URL (a real policy endpoint) or --scripted-reply TEXT")
    path = Path(args.path)
    mode = "template" if is_task_dir(path) else "dataset"
    if mode == "dataset" and not args.task_id:
        raise UserError(f"{path} is a dataset: pass --task-id ID")
    scripted = FakeChatServer(default_reply=args.scripted_reply) if args.scripted_reply else None
    try:
        with local_trajectories(keep_home=args.settings.keep_home):
            env = environment_for(args)
            backend = HarborBackend(
                orchestrator=TrialQueue(n_concurrent=1),
                tasks_dir=path,
                task_mode=mode,
                environment_config=env,
                **agent_args(args),
            )
            result = asyncio.run(
                run_one_rollout(
                    backend=backend,
                    prompt=args.prompt,
                    chat_completions_url=scripted.base_url if scripted else args.chat_url,
                    api_key=settings.host_variable(args.api_key_env) if args.api_key_env else "local-demo-key",
                    label=args.label,
                    metadata={"harbor_task_id": args.task_id} if args.task_id else None,
                    grade=not args.no_grade,
                )
            )
    finally:
        if scripted:
            scripted.close()
    _print_result(result, as_json=args.json, config=args.settings)
    return 0 if str(result.status) == "success" else 1


def _print_result(result: RolloutResultResponse, *, as_json: bool, config: settings.Settings) -> None:
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    body = f"status: {result.status}\nreward: {result.sample.reward if result.sample else None}"
    if result.err_message:
        body += f"\nerror ({result.err_category}): {result.err_message}"
    if result.sample is not None:
        body += f"\nmetrics: {result.sample.metrics}"
        for message in result.sample.messages:
            body += f"\n[{message.get('role')}] {str(message.get('content'))[:300]}"
    result_console(config).print(Panel(escape(body), title="rollout result"))
