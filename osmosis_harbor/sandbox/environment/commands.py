"""Every command of one environment, through one explicit pipeline down to the SDK:

    verifier guard  (its check may take the command's place: ``verifier_guard.py``)
    -> preparation  (a command that changes nothing is answered here: ``preparation.py``)
    -> transfers    (staged uploads flushed, or folded into the command's exec: ``routes.py``)
    -> exec records (launched under a record that survives an API fault: ``exec_records.py``)
    -> guard's drop (a guarded agent phase's argv behind the guard: ``verifier_guard.py``)
    -> session      (``handle.exec.aio``; a failure asks whether the sandbox lives: ``session.py``)

Harbor's own classes are not on the way: the environment hands its ``exec`` here with the
argv, env, workdir and capped timeout it built as Harbor's ``SkypilotEnvironment`` does."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from harbor.environments.base import ExecResult

from osmosis_harbor.sandbox.environment.exec_records import ExecRecorder
from osmosis_harbor.sandbox.environment.preparation import PreparationElider
from osmosis_harbor.sandbox.environment.routes import CommandFold, TransferRoutes
from osmosis_harbor.sandbox.environment.session import SandboxSession, exec_result
from osmosis_harbor.sandbox.environment.verifier_guard import VerifierGuardExecs

__all__ = ["Command", "CommandPipeline", "done", "exec_argv", "launched", "raw_shell"]


def done() -> ExecResult:
    """The answer to a command that needed no round trip."""
    return ExecResult(stdout="", stderr="", return_code=0)


def exec_argv(command: str, user: str | int | None) -> list[str]:
    """Harbor's argv for ``command`` (``SkypilotEnvironment._exec_argv``): the SDK shell-quotes
    argv and runs it through ``sh -c`` in the sandbox, so a plain command is ``bash -c command``;
    another user's runs through ``su -s /bin/bash USER -c``, a numeric one's name looked up in
    the sandbox (``getent``) by one ``bash -c`` script, as the lookup needs a shell."""
    if user is None:
        return ["bash", "-c", command]
    shell_cmd = f"bash -c {shlex.quote(command)}"
    if isinstance(user, int):
        su_cmd = f'su -s /bin/bash "$(getent passwd {user} | cut -d: -f1)" -c {shlex.quote(shell_cmd)}'
        return ["bash", "-c", su_cmd]
    return ["su", "-s", "/bin/bash", str(user), "-c", shell_cmd]


async def launched(
    records: ExecRecorder,
    argv: list[str],
    *,
    workdir: str | None,
    timeout_seconds: int,
    env: dict[str, str] | None = None,
) -> ExecResult:
    """``argv`` under its exec record, behind the guard, in the sandbox: its result (unguarded,
    flushing nothing: the transfers' own commands take this way)."""
    handle = await records.dispatch(argv, workdir=workdir, timeout_seconds=timeout_seconds, env=env)
    return await exec_result(handle)


async def raw_shell(records: ExecRecorder, command: str, timeout_seconds: int) -> ExecResult:
    """Harbor's ``_run_shell``: ``sh -c command``, no workdir, env or user."""
    return await launched(records, ["sh", "-c", command], workdir=None, timeout_seconds=timeout_seconds)


@dataclass(frozen=True)
class Command:
    """One command as the SDK will run it: Harbor's argv for it (``bash -c``, or ``su`` for
    another user), its env, its workdir and its timeout (capped at SkyPilot's 3600 s)."""

    text: str
    user: str | int | None
    argv: list[str]
    env: dict[str, str] | None
    workdir: str | None
    timeout_seconds: int


class CommandPipeline:
    """An environment's commands (see the module docstring)."""

    def __init__(
        self,
        guard: VerifierGuardExecs,
        preparation: PreparationElider,
        routes: TransferRoutes,
        records: ExecRecorder,
        session: SandboxSession,
    ) -> None:
        self._guard = guard
        self._preparation = preparation
        self._routes = routes
        self._records = records
        self._session = session

    async def run(self, command: Command) -> ExecResult:
        """Harbor's exec of ``command``, through every stage."""
        ready = await self._guard.took(command.text, command.user)
        if ready is not None:
            self._routes.mark_ready(sorted(ready))
            return done()
        if self._preparation.skips(command.text, command.user):
            return done()
        async with self._routes.command(command.text) as fold:  # transfers may ride it (exec_folds.py)
            result = await self._session.guarded(self._launch(command, fold))
        return await self._routes.settle(fold, result)

    async def _launch(self, command: Command, fold: CommandFold | None) -> ExecResult:
        argv, timeout = command.argv, command.timeout_seconds
        if fold is not None:
            argv, timeout = fold.riding(argv, timeout)
        return await launched(self._records, argv, workdir=command.workdir, timeout_seconds=timeout, env=command.env)

    async def shell(self, command: str, timeout_seconds: int) -> ExecResult:
        """A raw shell command as any command is: after the uploads before it, guarded."""
        return await self._routes.shell(command, timeout_seconds)
