"""Every error osmosis-harbor raises on purpose, under one base: ``OsmosisHarborError``.

The command line turns exactly these into one ``error: ...`` line (exit status 2), and
``HarborBackend.execute`` refuses a rollout with their message; anything else is a bug and keeps
its traceback. Several also subclass a builtin (``ValueError``, ``LookupError``, ...), so
``except ValueError`` around a constructor works.

``TrialPhaseError`` subclasses are raised inside a Harbor trial, which records only the class
*name*; ``recorded_error`` maps that name back to the class, whose ``phase`` and ``category`` say
where the trial failed and what a controller should make of it. Harbor's own exceptions are
matched by name in ``osmosis_harbor.trials.reading`` (they are Harbor's types).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import ClassVar

from osmosis_harbor.rollout_category import LazyCategory

__all__ = [
    "AgentSandboxLostError",
    "BaseImageMissingError",
    "BundleError",
    "BundleInstallError",
    "ConfigError",
    "ContractFileError",
    "DatasetError",
    "DockerEngineUnavailable",
    "ImageBuildError",
    "ImageNotFoundError",
    "IncompatibleTaskImageError",
    "InvalidRequestError",
    "LegacyArgumentError",
    "NoOwnerError",
    "OsmosisHarborError",
    "PoolClaimError",
    "PoolExhaustedError",
    "PoolExistsError",
    "PoolNotFoundError",
    "PrewarmError",
    "SandboxDiskBoundError",
    "SandboxError",
    "SandboxExistsError",
    "SandboxLostError",
    "SandboxNetworkError",
    "SandboxNotFoundError",
    "SandboxSdkMissingError",
    "SandboxUnavailableError",
    "DockerSdkMissingError",
    "TaskResolutionError",
    "TransferLimitError",
    "TrialPhaseError",
    "UnexpectedArgumentError",
    "UnreadableArchiveError",
    "UserError",
    "VerifierGuardError",
    "VerifierSandboxLostError",
    "VerifierTamperedError",
    "WorkflowFailedError",
    "WrongBundleError",
    "recorded_error",
]


class OsmosisHarborError(Exception):
    """A problem the user can act on; the message is one actionable line."""


# ── configuration and input ──────────────────────────────────────────────────


class ConfigError(OsmosisHarborError, ValueError):
    """An option or argument that cannot work (a constructor, ``environment_config``, ...)."""


class LegacyArgumentError(OsmosisHarborError, TypeError):
    """Keyword arguments of the pre-v0.3 ``HarborBackend`` constructor, with how to migrate each."""

    def __init__(self, hints: dict[str, str]) -> None:
        self.hints = dict(hints)
        listed = ", ".join(f"{name}=" for name in hints)
        how = "; ".join(f"{name}=: {hint}" for name, hint in hints.items())
        super().__init__(
            f"HarborBackend no longer accepts {listed} (pre-v0.3 constructor). "
            f"Migrate: {how}. See the v0.3 migration guide."
        )


class UnexpectedArgumentError(OsmosisHarborError, TypeError):
    """Keyword arguments nobody ever accepted."""

    def __init__(self, owner: str, names: Sequence[str]) -> None:
        self.names = list(names)
        super().__init__(f"{owner} got unexpected keyword argument(s): {', '.join(names)}")


class NoOwnerError(OsmosisHarborError, RuntimeError):
    """A call that needs an owner (a backend, a validation run, a command) ran outside every
    owner's scope: what it would make would belong to nobody, so nobody would remove it."""

    def __init__(self, call: str) -> None:
        self.call = call
        super().__init__(
            f"{call} needs an owner: run it inside `with owner_scope(SandboxOwner.make(...))` "
            "(osmosis_harbor.sandbox.owner.context), or through HarborBackend, validate, prewarm or sandbox-check"
        )


class UserError(OsmosisHarborError):
    """A command-line usage problem (options that contradict each other, a missing one)."""


class InvalidRequestError(OsmosisHarborError, ValueError):
    """A rollout request that cannot succeed (an empty prompt, say): refused as validation_error."""


class DatasetError(OsmosisHarborError, ValueError):
    """A dataset or task that cannot be run."""


class TaskResolutionError(OsmosisHarborError, ValueError):
    """Bad task input of a rollout; the message names the offending key or value and the fix."""


class BundleError(OsmosisHarborError, ValueError):
    """A bundle cannot be built or read; the message names the path, import path or table."""


class PrewarmError(OsmosisHarborError, RuntimeError):
    """Prewarm failed for every task, or for a reason no task can avoid."""


# ── sandboxes ────────────────────────────────────────────────────────────────


class SandboxError(OsmosisHarborError):
    """Base of what the sandbox layer raises about sandboxes, pools and engines."""


class SandboxNetworkError(SandboxError):
    """The sandboxes' Docker network exists but cannot be used (no IPv4 gateway, not a bridge)."""


class SandboxSdkMissingError(SandboxError, RuntimeError):
    """The requested sandbox SDK cannot be imported here. What the registry raises is also
    Harbor's own missing-SDK type (``harbor_compat/missing_sdk.py``: ``MissingExtraError``, an
    ImportError), so code that catches Harbor's catches ours; ``package`` is the module that is
    missing, ``extra`` the SDK's name (no Harbor extra provides ``sky.sandbox``: the message
    says what does)."""

    def __init__(self, sdk: str, hint: str, cause: BaseException | None = None, *, package: str = "") -> None:
        self.sdk = sdk
        self.cause = cause
        self.package = package or sdk
        self.extra = sdk
        # Not super(): Harbor's MissingExtraError.__init__ (later in a subclass's MRO) writes its
        # own pip-extra message, and ours says what to install.
        RuntimeError.__init__(self, hint if cause is None else f"{hint} (import error: {cause})")


class DockerSdkMissingError(SandboxSdkMissingError):
    """Building or inspecting an image on the local engine needs docker-py, which is not installed."""

    HINT = "this needs the Docker SDK for Python: pip install 'osmosis-harbor[docker]'"

    def __init__(self, cause: BaseException | None = None) -> None:
        super().__init__("docker", self.HINT, cause, package="docker")


class SandboxUnavailableError(SandboxError, RuntimeError):
    """What a sandbox SDK talks to is not there (no engine, no emulator, no SkyPilot login):
    the message says what to start or run."""


class DockerEngineUnavailable(SandboxUnavailableError):
    """The Docker engine cannot be reached."""

    def __init__(self, url: str, cause: BaseException) -> None:
        self.url = url
        super().__init__(f"Docker engine not reachable at {url}: start dockerd or run scripts/bootstrap.sh ({cause})")


class SandboxExistsError(SandboxError, RuntimeError):
    """A sandbox of that name already runs."""


class SandboxNotFoundError(SandboxError, LookupError):
    """No such sandbox (terminated, expired or reaped)."""


class PoolNotFoundError(SandboxError, LookupError):
    """No such warm pool."""


class PoolExistsError(SandboxError, ValueError):
    """A warm pool of that name exists with another shape."""


class PoolExhaustedError(SandboxError, RuntimeError):
    """A claim found no ready member in its pool, and the pool does not cold-start one."""


class PoolClaimError(SandboxError, RuntimeError):
    """A pool claim could not be served: no ready member in time, and no cold create to fall back on."""


class ImageNotFoundError(SandboxError, LookupError):
    """The image is not on the engine and cannot be pulled from here."""


class ContractFileError(SandboxError, ValueError):
    """A file a sandbox left in a trial directory that the host will not use: not a regular
    file, too large, not UTF-8, not JSON, or nested too deep. ``relative`` names it inside the
    trial directory (never a host path)."""

    def __init__(self, relative: str, reason: str) -> None:
        super().__init__(f"{relative}: {reason}")
        self.relative = relative
        self.reason = reason


# ── raised inside a trial: Harbor records the class name ─────────────────────


class TrialPhaseError(OsmosisHarborError):
    """Raised during a trial. ``phase``: where the trial failed (None: the phase that was
    running); ``category``: what the rollout's failure is, unless the error says more;
    ``detailed``: the message's lines after the first are the output that explains it, kept
    (bounded) in reports and outcomes, which otherwise show the first line only."""

    phase: ClassVar[str | None] = None
    category = LazyCategory("internal_error")  # the enum imports osmosis_ai.rollout: on first read
    detailed: ClassVar[bool] = False
    # Whether a retry of the trial can help (Harbor 0.26's error policy, ``harbor_compat/
    # error_policies.py``): the infrastructure's failures, None meaning "an internal_error".
    retryable: ClassVar[bool | None] = None

    @classmethod
    def should_retry(cls) -> bool:
        return cls.category.value == "internal_error" if cls.retryable is None else cls.retryable


class ImageBuildError(TrialPhaseError, RuntimeError):
    """``docker build`` or ``docker push`` failed. The message's first line names the failing
    step and its exit code, the lines after it the tail of its output (``sandbox.build_failure``);
    ``engine_error`` is the builder's own last word."""

    phase = "environment"
    detailed = True

    def __init__(self, message: str, *, engine_error: str = "") -> None:
        super().__init__(message)
        self.engine_error = engine_error or (message.splitlines() or [""])[0]


class BaseImageMissingError(ImageBuildError):
    """The build failed because a ``FROM`` image is neither present nor pullable: the message's
    first line names the image and how to make it offline (the engine's own words after it are
    noise), and retrying the build is pointless."""

    detailed = False
    retryable = False


class BundleInstallError(TrialPhaseError, RuntimeError):
    """The bundle could not be installed in the sandbox (pip failed); the lines after the first
    are the tail of pip's output."""

    phase = "agent_setup"
    detailed = True


class IncompatibleTaskImageError(BundleInstallError):
    """The task image cannot run a workflow bundle at all (no python3 >= 3.12)."""

    category = LazyCategory("validation_error")


class WrongBundleError(BundleInstallError):
    """The sandbox says its image bakes another bundle (the check's line, in the workflow's own
    exec). It is the sandbox's word, which a workflow can print too, so its category is one a
    sandbox may cause: a ``validation_error`` (re-run prewarm), never an ``internal_error``."""

    category = LazyCategory("validation_error")


class WorkflowFailedError(TrialPhaseError, RuntimeError):
    """The workflow process exited non-zero; its category is in its ``error.json``."""

    phase = "agent"
    category = LazyCategory("agent_error")


class SandboxLostError(TrialPhaseError, SandboxError, RuntimeError):
    """The sandbox is gone, or stopped without this trial stopping it: the infrastructure's
    doing, not the workflow's (see ``osmosis_harbor.sandbox.sdk.liveness``).

    Harbor records only the class name, so the subclass says whose sandbox it was (``role``).
    ``observed_at``: when the host saw it, which tells what the trial was doing (Harbor's agent
    timing ends before the agent's outputs are downloaded)."""

    role: ClassVar[str | None] = None

    def __init__(self, name: str, reason: str, *, observed_at: datetime | None = None) -> None:
        super().__init__(f"sandbox {name} was lost ({reason})")
        self.sandbox_name = name
        self.reason = reason
        self.observed_at = observed_at or datetime.now(UTC)

    @staticmethod
    def of_role(role: str, name: str, reason: str) -> SandboxLostError:
        """The loss of the sandbox ``name`` playing ``role`` (``"agent"`` or ``"verifier"``)."""
        kinds = {kind.role: kind for kind in (AgentSandboxLostError, VerifierSandboxLostError)}
        return kinds[role](name, reason)


class AgentSandboxLostError(SandboxLostError):
    """The agent's sandbox (Harbor's ``{trial}__env``) was lost: the workflow's ``internal_error``
    until the host has its outputs, then (a verification in that same sandbox) the grading's."""

    role = "agent"


class VerifierSandboxLostError(SandboxLostError):
    """A separate verifier's own sandbox (``{trial}__verifier__{key}``) was lost: the grading
    failed; the workflow's outputs were already on the host."""

    role = "verifier"
    phase = "verifier"


class SandboxDiskBoundError(TrialPhaseError, SandboxError, RuntimeError):
    """The sandbox was evicted because its writable layer passed its disk bound: its own writes,
    so the workflow's failure (``agent_error``), never a lost sandbox. ``message`` is the SDK's
    word on the eviction (kubelet's, with the figures where the SDK gives them)."""

    category = LazyCategory("agent_error")

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"sandbox {name} was evicted for its disk use, over its disk bound: {message}")
        self.sandbox_name = name
        self.message = message


class TransferLimitError(TrialPhaseError, SandboxError, ValueError):
    """What a sandbox sent back exceeds a transfer bound (``Settings.transfer_*``): the
    workflow's output, so the workflow's failure. Carries what, how much and the bound."""

    category = LazyCategory("agent_error")

    def __init__(self, transfer: str, what: str, amount: int, limit: int, setting: str) -> None:
        super().__init__(
            f"sandbox output {transfer}: {what} is {amount}, over the bound of {limit} "
            f"(raise OSMOSIS_HARBOR_{setting.upper()} if it is legitimate)"
        )
        self.transfer, self.what, self.amount, self.limit, self.setting = transfer, what, amount, limit, setting


class UnreadableArchiveError(TrialPhaseError, SandboxError, ValueError):
    """An archive made in a sandbox is not a readable tar stream (corrupt or truncated)."""

    category = LazyCategory("agent_error")

    def __init__(self, transfer: str, cause: BaseException) -> None:
        super().__init__(f"sandbox output {transfer}: not a readable tar archive ({type(cause).__name__}: {cause})")
        self.transfer = transfer


class VerifierGuardError(TrialPhaseError, RuntimeError):
    """The verifier guard cannot protect a sandbox: no compiler to build it, an architecture it
    does not run on, or a sandbox whose root holds no capability to mark the agent's processes
    with. The deployment's problem, named with the way out; never the workflow's."""


class VerifierTamperedError(TrialPhaseError, RuntimeError):
    """The guard found the verifier's environment tampered with before a task's own tests ran in
    the agent's sandbox: a toolchain file changed, a start-up hook added, a process left behind,
    or the guard itself attacked. The workflow's failure (reward 0), never infrastructure's."""

    phase = "verifier"
    category = LazyCategory("agent_error")


def _trial_errors(base: type[TrialPhaseError] = TrialPhaseError) -> dict[str, type[TrialPhaseError]]:
    found = {base.__name__: base}
    for sub in base.__subclasses__():
        found.update(_trial_errors(sub))
    return found


def trial_errors() -> dict[str, type[TrialPhaseError]]:
    """Every error raised inside a trial, by the class name Harbor records."""
    return _trial_errors()


def recorded_error(exception_type: str | None) -> type[TrialPhaseError] | None:
    """Our class behind the exception name Harbor recorded on a trial, if it is one of ours."""
    return _trial_errors().get(exception_type or "")
