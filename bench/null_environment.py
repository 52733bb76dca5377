"""A Harbor environment that does no work: the instrument for Harbor's own per-trial cost.

Every ``exec`` succeeds at once with no output, uploads are dropped, and a download of the
verifier's directory brings back ``reward.txt`` = 1. So a trial through Harbor's real
``TrialQueue`` and ``Trial`` (task load, trial lock, checksum, logging, result files, the
separate verifier's setup) spends no time in any sandbox, SDK or agent: what its process
spends is Harbor's share, the part of a rollout's host CPU no sandbox layer can remove
(``bench.harbor_floor``). Used by the benchmarks only, never by the product.
"""

from __future__ import annotations

from pathlib import Path

from harbor.environments.base import BaseEnvironment, ExecResult


class NullEnvironment(BaseEnvironment):
    """Harbor's environment interface with every call a no-op."""

    @staticmethod
    def type() -> str:  # type: ignore[override]  # Harbor types it as its EnvironmentType enum
        return "null"

    def _validate_definition(self) -> None:
        return None

    async def start(self, force_build: bool) -> None:
        return None

    async def stop(self, delete: bool) -> None:
        return None

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        return None

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        return None

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        Path(target_path).write_text("1")

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        if "verifier" in source_dir:
            (target / "reward.txt").write_text("1")

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        return ExecResult(stdout="", stderr="", return_code=0)
