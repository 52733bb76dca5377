"""A trial whose sandbox was lost is read as lost, whatever Harbor recorded.

The environment raises `SandboxLostError` when the infrastructure took its sandbox, but the
error does not always reach the trial's result: Harbor wraps a failed test upload or verifier
download (``AddTestsDirError``, ``DownloadVerifierDirError``, the loss being their cause), and
swallows a failed agent-log download as best-effort, after which the verifier finds no sample
and the rollout would read as the workflow's failure. The environment hands every loss it
raises to the trial's scope (``owner.context.TrialContext.record_loss``); a trial with a loss there is recorded here as
lost (``internal_error``, or an ``infra_retries`` attempt on a fresh sandbox). Only the host's
own observation counts: the sandbox can neither cause nor hide a loss this way.
"""

from __future__ import annotations

from collections.abc import Sequence

from harbor.models.trial.result import ExceptionInfo, TrialResult

from osmosis_harbor.errors import SandboxLostError

__all__ = ["recognise_loss"]


def recognise_loss(result: TrialResult, losses: Sequence[SandboxLostError]) -> TrialResult:
    """``result``, with the first loss the host saw as its exception (its class, so whose sandbox
    it was, and when the host saw it); unchanged when nothing was lost. Harbor may have recorded
    another exception, none, or a later loss (a call failing fast after the first), whose time
    would say the trial was further on than it was when the sandbox went."""
    if not losses:
        return result
    loss = losses[0]
    info = result.exception_info
    if info is None:
        recorded, traceback = "no exception", ""
    else:
        first_line = (info.exception_message or "").strip().splitlines()[:1]
        recorded = f"{info.exception_type}: {first_line[0] if first_line else ''}".rstrip(": ")
        traceback = info.exception_traceback
    lost = ExceptionInfo(
        exception_type=type(loss).__name__,
        exception_message=str(loss),
        exception_traceback=f"{traceback}\nread as {type(loss).__name__} (the host saw the loss at "
        f"{loss.observed_at.isoformat()}; Harbor recorded {recorded})\n",
        occurred_at=loss.observed_at,
    )
    return result.model_copy(update={"exception_info": lost})
