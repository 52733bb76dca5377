"""docker-py is the ``[docker]`` extra: a SkyPilot user without it imports and configures
everything, and whatever needs a local engine says which extra to install."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from osmosis_harbor.sandbox.emulator.server.launcher import STATE_FILE
from osmosis_harbor.sandbox.emulator.server.process import read_state
from tests.support.common import process_alive, wait_until

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


# -- the emulator's on-demand server, a process of its own ----------------------------------------

_ON_DEMAND_CLIENT = textwrap.dedent(
    """
    import json
    from osmosis_harbor import settings
    from osmosis_harbor.sandbox import emulator as sky
    from osmosis_harbor.sandbox.emulator.errors import EmulatorStartError
    from osmosis_harbor.sandbox.sdk.registry import implementation
    out = {}
    try:
        implementation("skypilot-emulator").preflight(settings.current())
        out["preflight"] = "passed"
    except SystemExit as exc:
        out["preflight"] = str(exc)
    try:
        out["ls"] = len(sky.ls())
    except EmulatorStartError as exc:
        out["ls"] = str(exc)
    print(json.dumps(out))
    """
)


def _on_demand_client(tmp_path: Path, *, docker_py: bool) -> dict[str, object]:
    """A client process whose first call starts the server on demand (its own account under
    ``tmp_path``); without docker-py, a ``docker`` package that cannot be imported comes first on
    ``PYTHONPATH``, which the server it starts inherits."""
    stand_in = tmp_path / "no-docker-py"
    (stand_in / "docker").mkdir(parents=True)
    (stand_in / "docker" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'docker' (test stand-in)\")\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OSMOSIS_HARBOR_EMULATOR_URL"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    if not docker_py:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(stand_in), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _ON_DEMAND_CLIENT], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_emulator_server_without_docker_py_says_which_extra_is_missing(tmp_path: Path) -> None:
    """The preflight and the on-demand start both name the ``[docker]`` extra, not only an exit
    status and a log path."""
    out = _on_demand_client(tmp_path, docker_py=False)
    log = tmp_path / "cache" / "osmosis-harbor" / "emulator" / "server.log"
    assert "pip install 'osmosis-harbor[docker]'" in str(out["preflight"]), out
    started = str(out["ls"])
    assert started.startswith("the skypilot-emulator server exited with 2: "), started
    assert "pip install 'osmosis-harbor[docker]'" in started and "test stand-in" in started
    assert started.endswith(f"; see {log}")
    # the server stopped on our one-line error, not a traceback from inside sandbox.docker
    assert "Traceback" not in log.read_text()


def test_an_emulator_server_with_docker_py_starts_on_demand(tmp_path: Path) -> None:
    """Positive control: the same client without the stand-in starts a server, answers, and the
    server is stopped again."""
    out = _on_demand_client(tmp_path, docker_py=True)
    assert out == {"preflight": "passed", "ls": out["ls"]} and isinstance(out["ls"], int)
    state = read_state(tmp_path / "cache" / "osmosis-harbor" / "emulator" / STATE_FILE)
    assert state is not None
    os.kill(state.pid, signal.SIGTERM)
    wait_until(lambda: not process_alive(state.pid), timeout=30, what="the started server to stop")
