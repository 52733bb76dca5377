"""``AgentSetup``: the agent setup a backend's rollouts run, proved once in a started sandbox."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment

from osmosis_harbor.agents.native import native_agent_config, scoped_api_key
from osmosis_harbor.agents.workflow import VENV, bundle_check_command, install_bundle, wrong_bundle_line
from osmosis_harbor.bundle.info import BundleInfo
from osmosis_harbor.errors import BundleInstallError

__all__ = ["AgentSetup"]


@dataclass(frozen=True)
class AgentSetup:
    """A workflow bundle's console script, or a native agent's own setup (``native_agent``: its
    name; the oracle has none)."""

    bundle: BundleInfo | None
    native_agent: str | None
    model_name: str
    native_agent_kwargs: Mapping[str, Any] = field(default_factory=dict)

    async def prove(self, environment: BaseEnvironment, *, deps_baked: bool, bundle_baked: str | None = None) -> None:
        """Run the agent setup once in ``environment``: with the bundle baked into the image,
        one exec checks its marker and runs the console script, as a trial's would; otherwise
        the wheel is pip-installed first. `BundleInstallError` says what failed."""
        if self.native_agent is None:
            if self.bundle is not None and self.bundle.agent_script:
                await self._prove_bundle(environment, self.bundle, deps_baked=deps_baked, bundle_baked=bundle_baked)
        elif self.native_agent != "oracle":
            await self._prove_native(environment, self.native_agent)

    @staticmethod
    async def _prove_bundle(
        environment: BaseEnvironment, bundle: BundleInfo, *, deps_baked: bool, bundle_baked: str | None
    ) -> None:
        probe_command = f"{VENV / 'bin' / str(bundle.agent_script)} --help"
        if bundle_baked is not None:
            probe_command = f"{bundle_check_command(bundle_baked)}; {probe_command}"
        else:
            await install_bundle(environment, bundle.wheel, deps_preinstalled=deps_baked)
        probe = await environment.exec(probe_command)
        if wrong := wrong_bundle_line(probe.return_code, probe.stderr):
            raise BundleInstallError(wrong)
        if probe.return_code != 0:
            raise BundleInstallError(
                f"{bundle.agent_script} does not run in the sandbox: {(probe.stderr or probe.stdout or '').strip()[-500:]}"
            )

    async def _prove_native(self, environment: BaseEnvironment, agent_name: str) -> None:
        from harbor.agents.factory import AgentFactory

        with scoped_api_key(None) as key_env, tempfile.TemporaryDirectory() as logs:
            config = native_agent_config(
                agent_name,
                chat_completions_url="http://127.0.0.1/v1",
                api_key_env=key_env,
                model_name=self.model_name,
                native_agent_kwargs=dict(self.native_agent_kwargs),
            )
            agent = AgentFactory.create_agent_from_config(config, logs_dir=Path(logs))
            await agent.setup(environment)
