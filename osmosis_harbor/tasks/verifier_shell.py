"""Which rollouts the verifier guard cannot protect: a root agent, tests in its sandbox, and an
SDK whose exec runs a shell of the sandbox.

Why refuse rather than guard: on SkyPilot's path every exec runs as ``sh -c`` in the pod, with
``sh`` found on the pod's PATH (Harbor's ``SkypilotEnvironment``: the SDK "shell-quotes argv and
runs it via sh -c"; the emulator does the same). A root agent that writes ``/usr/local/sbin/sh``
has its program run first, unmarked and with every capability, in every later exec: the
guard's check and the tests included. Nothing the host sends can run before that shell, so no
check can be trusted after it. Three ways out: verify in a fresh sandbox (a task that does not
declare ``[verifier] environment_mode = "shared"`` and keeps no service), an unprivileged
``[agent] user`` (it cannot write a PATH directory of root's), or the explicit opt-in
``OSMOSIS_HARBOR_ALLOW_SHARED_VERIFIER_WITH_SHELL_EXEC=1`` (unprotected: docs/threat-model.md).
"""

from __future__ import annotations

from pathlib import Path

from osmosis_harbor import settings
from osmosis_harbor.sandbox.sdk.registry import SandboxImplementation
from osmosis_harbor.tasks.verifier import agent_users

__all__ = ["OPT_IN", "RULE", "shell_exec_refusal", "unprotected_reason"]

OPT_IN = "OSMOSIS_HARBOR_ALLOW_SHARED_VERIFIER_WITH_SHELL_EXEC=1"
RULE = "shared-verifier-shell-exec"  # the lint finding's name in validate's report


def _root(user: str | int | None) -> bool:
    """None is the image's default user, which the guard must assume is root."""
    return user is None or str(user) in ("root", "0")


def unprotected_reason(
    task_dir: Path, sdk: SandboxImplementation, *, guarded: bool, config: settings.Settings
) -> str | None:
    """Why rollouts of this task cannot run on ``sdk`` (naming the ways out), or None.
    ``guarded``: the task's tests run in the agent's sandbox under the verifier guard (with the
    guard switched off, ``OSMOSIS_HARBOR_VERIFIER_GUARD=0``, nothing is promised to refuse)."""
    if not guarded or not sdk.exec_runs_sandbox_shell or config.allow_shared_verifier_with_shell_exec:
        return None
    if not any(_root(user) for user in agent_users(task_dir)):
        return None
    return (
        f"its tests run in the agent's sandbox with a root agent, and sdk={sdk.name!r} runs every command "
        "through a shell of the sandbox that such an agent can replace, so the verifier guard cannot protect "
        'its reward: verify in a fresh sandbox (drop [verifier] environment_mode = "shared" and keep no '
        f"service), run the agent as an unprivileged [agent] user in task.toml, or set {OPT_IN} to run it unprotected"
    )


def shell_exec_refusal(
    task_dir: Path, task_id: str, sdk: SandboxImplementation, *, guarded: bool, config: settings.Settings
) -> str | None:
    """The refusal of a rollout of this task on ``sdk`` (one line), or None (``unprotected_reason``)."""
    reason = unprotected_reason(task_dir, sdk, guarded=guarded, config=config)
    return f"task {task_id}: {reason}" if reason else None
