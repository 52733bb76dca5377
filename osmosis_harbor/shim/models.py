"""Pydantic models of the files exchanged between the host and the sandbox.

The agent and verifier samples are ``osmosis_ai``'s own ``RolloutSample``
(serialized field for field, see ``files.sample_payload``), so only the
shim-specific files are modelled here. Inputs forbid unknown fields: the shim
ships inside the bundle the host just built, so host and shim are always the
same version, and a stray field (a ``label`` in the agent input above all)
is a host bug worth failing loudly on.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from osmosis_ai.rollout.types import MessageDict, RolloutErrorCategory
from pydantic import BaseModel, ConfigDict, Field, field_validator

Phase = Literal["agent", "verifier"]


class RolloutInput(BaseModel):
    """What the agent phase sees: the prompt and metadata, never the label.

    The label stays out of the container until verification (it reaches it
    inside ``tests/``), so a workflow cannot read the answer.
    """

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    rollout_id: str = Field(min_length=1)
    prompt: list[MessageDict]
    metadata: dict[str, Any] | None = None


class GradingInput(BaseModel):
    """What the verifier phase sees in addition to the agent's sample."""

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    rollout_id: str = Field(min_length=1)
    label: str | None = None
    metadata: dict[str, Any] | None = None
    prompt: list[MessageDict] = Field(default_factory=list)


class RewardFile(BaseModel):
    """Harbor's verifier reward file; Harbor prefers it over ``reward.txt``."""

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid", allow_inf_nan=False)

    reward: float


class ErrorFile(BaseModel):
    """Why a phase failed, in the vocabulary the rollout controller understands.

    ``category`` uses ``RolloutErrorCategory`` values so the host can hand it
    to the controller unchanged.
    """

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    phase: Phase
    type: str
    message: str
    category: RolloutErrorCategory
    traceback: str


class ErrorClaim(BaseModel):
    """An ``error.json`` as the host reads it back: what a sandbox claims about its failure.

    Lenient where ``ErrorFile`` is strict, because the writer is the sandbox and may be hostile
    or broken: unknown fields are ignored, a missing or empty ``type`` is ``"Error"``, other
    values are taken as their text, and a ``category`` that is not a string is no claim at all.
    What the claim may cause is the host's decision (``backend.categories``), never this model's.
    """

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="ignore")

    type: str = "Error"
    message: str = ""
    category: str | None = None

    @field_validator("type", "message", mode="before")
    @classmethod
    def _text(cls, value: Any, info: Any) -> str:
        if value is None or value == "":
            return "Error" if info.field_name == "type" else ""
        return value if isinstance(value, str) else str(value)

    @field_validator("category", mode="before")
    @classmethod
    def _category(cls, value: Any) -> str | None:
        return value if isinstance(value, str) else None
