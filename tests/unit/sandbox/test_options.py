"""The typed sandbox options (``sandbox/options.py``): one model built from
``environment_config``'s kwargs, one default per knob, and the one place that reads
``EnvironmentConfig.kwargs``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from harbor.models.trial.config import EnvironmentConfig
from pydantic import ValidationError

import osmosis_harbor
from osmosis_harbor.errors import ConfigError
from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
from osmosis_harbor.sandbox.options import IMPORT_PATH, SandboxOptions, environment_label
from osmosis_harbor.sandbox.owner import pools
from osmosis_harbor.sandbox.sdk.registry import DEFAULT_SDK

PACKAGE = Path(osmosis_harbor.__file__).parent


def test_the_options_round_trip_through_the_environment_config() -> None:
    config = environment_config("docker", registry="127.0.0.1:5000", pool="warm", pool_size="auto", secrets=["s"])
    options = SandboxOptions.of(config)
    assert (options.sdk, options.registry, options.pool, options.pool_size, options.secrets) == (
        "docker",
        "127.0.0.1:5000",
        "warm",
        "auto",
        ["s"],
    )
    assert options.to_kwargs() == config.kwargs
    with pytest.raises(ValidationError):
        options.pool = "other"  # type: ignore[misc]  # frozen


def test_one_default_per_knob_shared_by_the_config_and_the_environment() -> None:
    defaults = SandboxOptions.of(EnvironmentConfig(import_path=IMPORT_PATH, kwargs={}))
    assert defaults == SandboxOptions() and defaults.sdk == DEFAULT_SDK and not defaults.host_network
    assert environment_config("docker").kwargs == {"sdk": "docker"}  # defaults are not written out
    # the environment's own keyword defaults are the model's (Harbor instantiates it with the kwargs)
    parameters = inspect.signature(SandboxEnvironment.__init__).parameters
    for name, field in SandboxOptions.model_fields.items():
        if name in parameters:
            assert parameters[name].default == field.default, name


def test_an_unknown_key_is_named_and_harbors_own_keywords_pass_through() -> None:
    with pytest.raises(ConfigError, match="unknown sandbox option 'pool_sise'"):
        environment_config("docker", pool_sise=3)
    with pytest.raises(ConfigError, match="unknown sandbox option 'hostnetwork'"):
        SandboxOptions.of(EnvironmentConfig(import_path=IMPORT_PATH, kwargs={"sdk": "docker", "hostnetwork": True}))
    config = environment_config("docker", enable_environment_dir_upload=False)  # a BaseEnvironment keyword
    assert config.kwargs["enable_environment_dir_upload"] is False
    assert SandboxOptions.of(config).harbor == {"enable_environment_dir_upload": False}


def test_checks_that_span_fields_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="host_network"):
        SandboxOptions.build(sdk="skypilot-emulator", host_network=True)
    with pytest.raises(ConfigError, match="pool_size needs pool"):
        SandboxOptions.build(pool_size=2)
    with pytest.raises(ConfigError, match="pool_size must be"):
        SandboxOptions.build(pool="warm", pool_size=-1)
    with pytest.raises(ConfigError, match="sandbox option registry"):
        SandboxOptions.build(registry=5000)


def test_a_trial_gets_the_pool_base_only_when_it_claims_and_never_the_size() -> None:
    config = environment_config("docker", pool="warm", pool_size=3)
    options = SandboxOptions.of(config)
    assert options.for_trial(claims_pool=True).applied_to(config).kwargs == {"sdk": "docker", "pool": "warm"}
    assert options.for_trial(claims_pool=False).applied_to(config).kwargs == {"sdk": "docker"}


def test_another_environments_config_is_left_alone() -> None:
    harbors = EnvironmentConfig(type="docker", kwargs={"anything": 1})
    assert SandboxOptions.of(harbors) == SandboxOptions()
    assert SandboxOptions().applied_to(harbors) is harbors
    assert environment_label(harbors) == str(harbors.type)  # as reports named it before
    assert environment_label(environment_config("skypilot-emulator")) == "skypilot-emulator"


def test_prewarm_sizes_pools_from_one_rule() -> None:
    assert pools.prewarm_size(None, None, 4) == (1, False)
    assert pools.prewarm_size(None, 3, 4) == (3, False)
    assert pools.prewarm_size(5, 3, 4) == (5, False)
    assert pools.prewarm_size(None, "auto", 0) == (1, True)
    assert pools.prewarm_size("auto", 2, 4) == (4, True)
    assert pools.selected(["warm-a", "cold-b"], ["warm"], everything=False) == ["warm-a"]
    assert pools.selected(["warm-a", "cold-b"], None, everything=True) == ["warm-a", "cold-b"]


def _reads_kwargs(path: Path) -> list[int]:
    """Lines reading ``<something environment/config>.kwargs`` (an EnvironmentConfig's)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "kwargs":
            owner = ast.unparse(node.value).lower()
            if "environment" in owner or owner.endswith("config"):
                lines.append(node.lineno)
    return lines


def test_only_the_options_module_reads_environment_config_kwargs() -> None:
    readers = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _reads_kwargs(path)) and path.name != "options.py"
    }
    # agent configs are AgentConfig.kwargs, not the environment's
    readers = {where: lines for where, lines in readers.items() if not where.startswith(("agents/", "backend/options"))}
    assert not readers, f"EnvironmentConfig.kwargs read outside sandbox/options.py: {readers}"
    assert _reads_kwargs(PACKAGE / "sandbox" / "options.py")  # control: the scan sees a read
