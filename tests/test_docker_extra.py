"""docker-py is the ``[docker]`` extra: a SkyPilot user without it imports and configures
everything, and whatever needs a local engine says which extra to install."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# A meta-path finder that makes ``import docker`` fail, as on a machine without docker-py.
_WITHOUT_DOCKER_PY = textwrap.dedent(
    """
    import importlib, json, sys

    class NoDockerPy:
        def find_spec(self, name, path=None, target=None):
            if name == "docker" or name.startswith("docker."):
                raise ImportError(f"No module named {name!r} (blocked by the test)")

    if sys.argv[1] == "blocked":
        sys.meta_path.insert(0, NoDockerPy())
    out = {}
    """
)


def _run(body: str, mode: str = "blocked") -> dict[str, object]:
    code = _WITHOUT_DOCKER_PY + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_skypilot_path_imports_and_configures_without_docker_py() -> None:
    out = _run(
        """
        for name in ("osmosis_harbor.backend", "osmosis_harbor.cli", "osmosis_harbor.prewarm",
                     "osmosis_harbor.validate", "osmosis_harbor.sandbox.environment.sandbox_environment",
                     "osmosis_harbor.sandbox.emulator", "osmosis_harbor.sandbox.conformance"):
            importlib.import_module(name)
        from osmosis_harbor.sandbox import SandboxEnvironment, environment_config
        out["environment"] = SandboxEnvironment.__name__
        out["emulator_config"] = environment_config("skypilot-emulator").import_path
        try:
            import docker  # noqa: F401
        except ImportError:
            out["docker_py"] = "absent"
        out["loaded"] = sorted(m for m in sys.modules if m == "docker" or m.startswith("docker."))
        """
    )
    assert out["docker_py"] == "absent" and out["loaded"] == []
    assert out["environment"] == "SandboxEnvironment"
    assert out["emulator_config"] == "osmosis_harbor.sandbox.environment:SandboxEnvironment"


def test_what_needs_a_local_engine_names_the_extra_without_docker_py() -> None:
    out = _run(
        """
        from osmosis_harbor.errors import DockerSdkMissingError, SandboxSdkMissingError
        from osmosis_harbor.sandbox import environment_config
        from osmosis_harbor.sandbox.images import builds, holds
        try:
            environment_config("docker")
        except SandboxSdkMissingError as exc:
            out["docker_sdk"] = str(exc)
        try:
            builds.registry_image_exists("127.0.0.1:5000/x:1")
        except DockerSdkMissingError as exc:
            out["build_check"] = str(exc)
        holds.hold("osmosis-harbor/env:x")  # best effort: nothing local to hold
        out["hold"] = "no-op"
        out["leftovers"] = builds.remove_failed_build_containers(" ---> Running in 0123456789ab\\n")
        """
    )
    assert "pip install 'osmosis-harbor[docker]'" in str(out["docker_sdk"])
    assert "pip install 'osmosis-harbor[docker]'" in str(out["build_check"])
    assert out["hold"] == "no-op" and out["leftovers"] == []


@pytest.mark.parametrize("mode", ["blocked", "installed"])
def test_the_docker_sdk_loads_only_where_docker_py_is(mode: str) -> None:
    """Positive control for the two tests above: the finder really hides docker-py, and with it
    installed the Docker SDK loads."""
    out = _run(
        """
        try:
            importlib.import_module("osmosis_harbor.sandbox.docker")
            out["docker_sdk"] = "loaded"
        except ImportError as exc:
            out["docker_sdk"] = f"missing: {exc}"
        """,
        mode,
    )
    if mode == "blocked":
        assert str(out["docker_sdk"]).startswith("missing: No module named 'docker")
    else:
        assert out["docker_sdk"] == "loaded"
