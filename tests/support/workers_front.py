"""A ``HarborBackend(workers=2)`` front in a process of its own, running one sleeping rollout on
each worker, so that a test can SIGKILL the front and watch what its workers do.

``python -m tests.support.workers_front --work DIR --bundles DIR --chat URL``: prints one JSON line with
the workers' pids once both rollouts are in their sandboxes, then waits to be killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.types import ExecutionRequest

from tests.support.backends import make_backend


async def _rollout(backend, chat: str, rollout_id: str) -> None:
    with RolloutContext(chat_completions_url=chat, api_key="sk-front-test", rollout_id=rollout_id):
        prompt = [{"role": "user", "content": f"reply: sleep 300 #{rollout_id}"}]
        await backend.execute(ExecutionRequest(id=rollout_id, prompt=prompt, grade=False))


async def main(args: argparse.Namespace) -> None:
    backend = make_backend(args.work, args.bundles, agent="OutputWorkflow", workers=2)
    ids = ["front-a", "front-b"]
    tasks = [asyncio.create_task(_rollout(backend, args.chat, rid)) for rid in ids]
    while any((backend.rollout_status(rid) or {}).get("status") != "running" for rid in ids):
        await asyncio.sleep(0.1)
    root = str(backend.workspace.root)
    print(json.dumps({"workers": [h.pid for h in backend.front.handles], "root": root}), flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--bundles", type=Path, required=True)
    parser.add_argument("--chat", required=True)
    asyncio.run(main(parser.parse_args()))
