"""The agent's sandbox under the verifier guard: every command of the agent phase marked, the
check before the task's own tests, and the guard's own calls.

Its launch sits below the exec records' (``exec_records.py``), so it sees every argv the SDK will
run (an exec record's wrapper included) and puts the guard in front: ``/proc/<daemon>/exe drop -- ARGV``. The magic link always runs the daemon's sealed image,
whatever the agent did to the files on disk. The guard's own commands (start, record, check) go
straight to the SDK, with no shell and no record wrapper: nothing of the sandbox's disk runs
before the guard does. Which phase a trial is in is the session's (``session.py``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

from osmosis_harbor.errors import VerifierTamperedError
from osmosis_harbor.sandbox.environment.exec_records import Launch
from osmosis_harbor.sandbox.environment.preparation import REMOVE_REWARDS_COMMAND
from osmosis_harbor.sandbox.environment.session import exec_result
from osmosis_harbor.sandbox.environment.state import EnvironmentState
from osmosis_harbor.sandbox.guard import commands
from osmosis_harbor.sandbox.guard.allowance import Allowance, Verdict, judge
from osmosis_harbor.sandbox.guard.binary import guard_binary
from osmosis_harbor.sandbox.guard.report import GuardReport, ReportRejected, parse_report, shown
from osmosis_harbor.sandbox.guard.session import GuardCheck, GuardSession, GuardStage
from osmosis_harbor.settings import Settings
from osmosis_harbor.shim import contract

__all__ = ["VerifierGuardExecs", "baked_guard"]

log = logging.getLogger(__name__)


def baked_guard(dockerfile: Path) -> str | None:
    """The sha256 of the guard a patched Dockerfile bakes in (``contract.GUARD_PATH``), or None."""
    try:
        text = dockerfile.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(contract.BAKED_GUARD_COMMENT):
            return line[len(contract.BAKED_GUARD_COMMENT) :].strip()
    return None


class VerifierGuardExecs:
    """Commands of a guarded trial's agent sandbox (see the module docstring). ``launch`` is the
    session's launch, ``guarded`` its loss guard, ``write_bytes`` its file write; ``workdirs``
    are where the agent works (the check looks there for pytest's hooks)."""

    def __init__(
        self,
        session: GuardSession | None,
        dockerfile: Path,
        state: EnvironmentState,
        *,
        platform: str,
        workdirs: list[str],
        launch: Launch,
        guarded: Callable[[Awaitable[Any]], Awaitable[Any]],
        write_bytes: Callable[[bytes, str], Awaitable[None]],
        config: Settings,
    ) -> None:
        self.session = session
        self._baked = baked_guard(dockerfile) if session is not None else None  # the image's guard, if any
        self._state = state
        self._platform = platform
        self._workdirs = workdirs
        self._launch = launch
        self._guarded = guarded
        self._write_bytes = write_bytes
        self._config = config  # the environment's settings: the guard's cache dir
        self._timeout_sec = int(config.verifier_guard_timeout_sec)

    async def took(self, command: str, user: str | int | None) -> frozenset[str] | None:
        """Harbor's verifier first clears stale rewards (``REMOVE_REWARDS_COMMAND``, as root): the
        check, due then, empties ``/logs/verifier``, so it takes that command's place. Returns
        None when it did not, else the dirs the check left empty and 0777 (known ready)."""
        session = self.session
        if session is None or session.stage is not GuardStage.PENDING or user not in ("root", 0):
            return None
        if command != REMOVE_REWARDS_COMMAND:
            return None
        checked = session.daemon_pid is not None
        await self.guard_before_command(session)
        return frozenset({contract.VERIFIER_LOGS}) if checked else frozenset()

    async def dispatch(
        self, argv: list[str], *, workdir: str | None, timeout_seconds: int, env: dict[str, str] | None = None
    ) -> Any:
        session = self.session
        if session is not None and session.stage is not GuardStage.FRESH:
            argv = [*await self.guard_before_command(session), *argv]
        return await self._launch(argv, workdir=workdir, timeout_seconds=timeout_seconds, env=env)

    async def guard_before_command(self, session: GuardSession) -> list[str]:
        """What must happen before a command in this phase, and the argv prefix it then gets:
        the daemon started (the first agent command), the manifest recorded again (an agent
        phase after a check), the check run (the first command once verification starts)."""
        async with session.lock:
            if session.tampered is not None:
                raise VerifierTamperedError(str(session.tampered))
            if session.stage is GuardStage.PENDING:
                await self._guard_check(session)
            if session.stage is not GuardStage.AGENT:
                return []
            if session.daemon_pid is None:
                await self._guard_start(session)
            elif not session.recorded_since_check:
                await self._guard_record(session)
            assert session.daemon_pid is not None
            return commands.drop_prefix(session.daemon_pid)

    async def _guard_exec(self, argv: list[str], *, env: dict[str, str] | None = None) -> tuple[int, bytes, str]:
        """One of the guard's own commands: straight to the SDK (no record wrapper, no shell)."""

        async def run() -> Any:
            return await exec_result(await self._launch(argv, workdir=None, timeout_seconds=self._timeout_sec, env=env))

        result = await self._guarded(run())
        return result.return_code, (result.stdout or "").encode("utf-8", "surrogateescape"), result.stderr or ""

    async def _guard_start(self, session: GuardSession) -> None:
        binary, record_id = guard_binary(self._platform, config=self._config), secrets.token_hex(16)
        baked = self._baked == binary.sha256
        if not baked:
            await self._write_bytes(binary.read(), commands.UPLOAD_PATH)
        argv = commands.start_argv(contract.GUARD_PATH if baked else None, record_id, self._workdirs)
        key, began = secrets.token_bytes(32), time.monotonic()
        code, out, err = await self._guard_exec(argv, env={commands.KEY_ENV: key.hex()})
        started = commands.parse_started(code, out, err, self._state.name)
        session.daemon_pid, session.key, session.record_id = started.daemon, key, record_id
        session.recorded_since_check = True
        log.debug(
            "verifier guard started in %s (daemon %s, %s entries recorded) in %.3f s",
            self._state.name,
            started.daemon,
            started.entries,
            time.monotonic() - began,
        )

    async def _guard_record(self, session: GuardSession) -> None:
        assert session.daemon_pid is not None
        record_id = secrets.token_hex(16)
        code, out, _ = await self._guard_exec(commands.record_argv(session.daemon_pid, record_id, self._workdirs))
        if code != 0 or not out.startswith(commands.RECORDED):
            self._tampered(session, Verdict(True, ["the guard daemon was killed or replaced"]), GuardReport())
        session.record_id, session.recorded_since_check = record_id, True

    async def _guard_check(self, session: GuardSession) -> None:
        if session.daemon_pid is None:  # no agent command ran: nothing to check
            session.stage = GuardStage.VERIFIED
            return
        assert session.key is not None and session.record_id is not None
        nonce, plan = secrets.token_hex(16), session.plan
        argv = commands.check_argv(
            session.daemon_pid,
            nonce,
            session.record_id,
            self._workdirs,
            ports=sorted(plan.allowance.ports),
            keep_listening=plan.record_allowance,
        )
        began = time.monotonic()
        _, out, _ = await self._guard_exec(argv)
        log.debug("verifier guard checked %s in %.3f s", self._state.name, time.monotonic() - began)
        try:
            report = parse_report(out, key=session.key, nonce=nonce, record_id=session.record_id)
        except ReportRejected as exc:
            self._tampered(session, Verdict(True, [str(exc)]), GuardReport())
        allowance = plan.allowance.merged(Allowance.recorded(report)) if plan.record_allowance else plan.allowance
        verdict = judge(report, allowance, processes_are_tampering=plan.processes_are_tampering)
        self._log_check(report, verdict)
        if verdict.tampered:
            self._tampered(session, verdict, report)
        session.checks.append(GuardCheck(report, verdict))
        session.stage, session.recorded_since_check = GuardStage.VERIFIED, False  # /logs/verifier: empty, 0777

    def _tampered(self, session: GuardSession, verdict: Verdict, report: GuardReport) -> NoReturn:
        session.checks.append(GuardCheck(report, verdict))
        session.stage = GuardStage.TAMPERED
        session.tampered = VerifierTamperedError(verdict.message())
        log.warning("sandbox %s: %s", self._state.name, verdict.message())
        raise VerifierTamperedError(verdict.message())

    def _log_check(self, report: GuardReport, verdict: Verdict) -> None:
        if report.kept:
            ports = ", ".join(str(k.port) for k in report.kept if k.port)
            log.info(
                "sandbox %s: %d service process(es) kept for the tests (ports %s)",
                self._state.name,
                len(report.kept),
                ports,
            )
        if report.killed:
            names = ", ".join(shown(k.cmdline or k.exe)[:60] for k in report.killed[:5])
            log.info(
                "sandbox %s: the guard ended %d process(es) the agent left: %s",
                self._state.name,
                len(report.killed),
                names,
            )
        for path in report.set_aside:
            log.info("sandbox %s: package cache %s set aside (the agent changed it)", self._state.name, shown(path))
