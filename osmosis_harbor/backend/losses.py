"""A trial whose sandbox was lost is read as lost, whatever Harbor recorded.

The environment raises `SandboxLostError` when the infrastructure took its sandbox, but the
error does not always reach the trial's result: Harbor wraps a failed test upload or verifier
download (``AddTestsDirError``, ``DownloadVerifierDirError``, the loss being their cause), and
swallows a failed agent-log download as best-effort, after which the verifier finds no sample
and the rollout would read as the workflow's failure. The environment hands every loss it
raises to the trial's ``liveness.loss_scope``; a trial with a loss there is recorded here as
lost (``internal_error``, or an ``infra_retries`` attempt on a fresh sandbox). Only the host's
own observation counts: the sandbox can neither cause nor hide a loss this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from harbor.models.trial.result import ExceptionInfo, TrialResult

from osmosis_harbor.errors import SandboxLostError, recorded_error

__all__ = ["HARBOR_WRAPPERS", "recognise_loss"]

# Harbor's exceptions that carry a failed transfer (a lost sandbox among its causes) as theirs.
HARBOR_WRAPPERS = frozenset({"AddTestsDirError", "DownloadVerifierDirError"})


def recognise_loss(result: TrialResult, losses: Sequence[SandboxLostError]) -> TrialResult:
    """``result``, with the first loss the host saw as its exception when Harbor recorded
    another one (or none); unchanged when nothing was lost or Harbor recorded the loss."""
    info = result.exception_info
    if not losses or (info is not None and recorded_error(info.exception_type) is SandboxLostError):
        return result
    loss = losses[0]
    if info is None:
        recorded, traceback, at = "no exception", "", datetime.now(UTC)
    else:
        first_line = (info.exception_message or "").strip().splitlines()[:1]
        recorded = f"{info.exception_type}: {first_line[0] if first_line else ''}".rstrip(": ")
        traceback, at = info.exception_traceback, info.occurred_at
    lost = ExceptionInfo(
        exception_type=SandboxLostError.__name__,
        exception_message=str(loss),
        exception_traceback=f"{traceback}\nread as {SandboxLostError.__name__} (the host saw the loss; "
        f"Harbor recorded {recorded})\n",
        occurred_at=at,
    )
    return result.model_copy(update={"exception_info": lost})
