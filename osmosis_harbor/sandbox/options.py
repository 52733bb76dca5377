"""The sandbox options of one environment config, typed, with one default per knob.

``environment_config(...)`` writes them into Harbor's ``EnvironmentConfig.kwargs`` (Harbor
passes that dict to ``SandboxEnvironment(**kwargs)``), and every host-side reader (the
backend's admission, plan and lifecycle, prewarm, ``validate``) reads them back through
`SandboxOptions.of`: this module is the only one that reads ``EnvironmentConfig.kwargs``.
Before it existed, the dict was read with ``.get`` in eight places whose defaults disagreed.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any, Literal

from harbor.environments.base import BaseEnvironment
from harbor.models.trial.config import EnvironmentConfig
from pydantic import BaseModel, ConfigDict, ValidationError

from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox.sdk.registry import DEFAULT_SDK, SDK_NAMES, SandboxImplementation, implementation

__all__ = ["IMPORT_PATH", "SandboxOptions", "environment_label"]

IMPORT_PATH = "osmosis_harbor.sandbox.environment:SandboxEnvironment"
DEFAULT_PLATFORM = "linux/amd64"


@cache
def harbor_keywords() -> frozenset[str]:
    """Harbor's own environment keywords (``BaseEnvironment.__init__``): a config may carry
    them for Harbor, and they pass through untouched."""
    parameters = inspect.signature(BaseEnvironment.__init__).parameters
    return frozenset(name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY or p.default is not p.empty)


class SandboxOptions(BaseModel):
    """Every sandbox knob of an environment config (see ``environment_config`` for each).

    Made by `build` or `of`, which check what spans fields; frozen from then on."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    sdk: str = DEFAULT_SDK
    registry: str | None = None
    pool: str | None = None  # a base name: each environment group claims ``pools.pool_name_for(pool, group)``
    pool_size: int | Literal["auto"] | None = None  # read by prewarm only; trials claim
    context_name: str | None = None
    namespace: str | None = None
    secrets: list[str] | None = None
    platform: str = DEFAULT_PLATFORM
    host_network: bool = False
    auto_mounting: bool = False  # Harbor's own (bind its output dirs); Harbor 0.26 reads it here
    harbor: dict[str, Any] = {}  # Harbor's own keywords (``harbor_keywords``), passed through

    def _check(self) -> SandboxOptions:
        """The checks that span fields, as `ConfigError`s naming the option (pydantic would
        wrap them in its ValidationError inside a validator)."""
        impl = implementation(self.sdk)  # an unknown SDK: its own error, naming the choices
        if self.host_network and not impl.reaches_host:
            reachers = " or ".join(repr(name) for name in SDK_NAMES if implementation(name).reaches_host)
            raise ConfigError(
                f"host_network=True is only available with sdk={reachers}, not {self.sdk!r}: "
                "its sandboxes reach the rollout endpoint over the network"
            )
        size = self.pool_size
        if size is not None and size != "auto" and (isinstance(size, bool) or size < 0):
            raise ConfigError(f"pool_size must be an integer >= 0 or 'auto', got {size!r}")
        if size is not None and self.pool is None:
            raise ConfigError("pool_size needs pool= (the warm pool's base name)")
        return self

    @classmethod
    def build(cls, **values: Any) -> SandboxOptions:
        """Options from keywords, a wrong type or an unknown name raised as `ConfigError`."""
        values = {k: v for k, v in values.items() if v is not None}
        if isinstance(values.get("secrets"), tuple):
            values["secrets"] = list(values["secrets"])
        known = set(cls.model_fields) - {"harbor"}
        harbor = {k: v for k, v in values.items() if k not in known}
        unknown = sorted(set(harbor) - harbor_keywords())
        if unknown:
            raise ConfigError(
                f"unknown sandbox option {unknown[0]!r}: environment_config takes {', '.join(sorted(known))} "
                "(and Harbor's own environment keywords)"
            )
        try:
            options = cls(**{k: v for k, v in values.items() if k in known}, harbor=harbor)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else "options"
            if field == "pool_size":
                raise ConfigError(f"pool_size must be an integer >= 0 or 'auto', got {values['pool_size']!r}") from None
            raise ConfigError(f"sandbox option {field}: {error['msg']} (got {error.get('input')!r})") from None
        return options._check()

    @classmethod
    def of(cls, config: EnvironmentConfig) -> SandboxOptions:
        """The options a config carries; another environment's config (not ours) has none."""
        if config.import_path != IMPORT_PATH:
            return cls()
        return cls.build(**config.kwargs)

    @property
    def impl(self) -> SandboxImplementation:
        return implementation(self.sdk)

    def to_kwargs(self) -> dict[str, Any]:
        """``EnvironmentConfig.kwargs``: the SDK, and every other knob that is not its default."""
        kwargs: dict[str, Any] = {"sdk": self.sdk, **self.harbor}
        for name, value in self.model_dump(exclude_defaults=True, exclude={"sdk", "harbor"}).items():
            kwargs[name] = value
        return kwargs

    def for_trial(self, *, claims_pool: bool) -> SandboxOptions:
        """What one trial's environment gets: the pool base only when it claims from the pool
        (prewarm made its group's pool), never the size (prewarm's alone)."""
        return self.model_copy(update={"pool_size": None, "pool": self.pool if claims_pool else None})

    def applied_to(self, config: EnvironmentConfig) -> EnvironmentConfig:
        """``config`` carrying these options (another environment's config: unchanged)."""
        if config.import_path != IMPORT_PATH:
            return config
        return config.model_copy(update={"kwargs": self.to_kwargs()})


def environment_label(config: EnvironmentConfig) -> str:
    """What reports call an environment: our SDK's name, or another environment's type/path."""
    if config.import_path == IMPORT_PATH:
        return SandboxOptions.of(config).sdk
    return str(config.type or config.import_path)
