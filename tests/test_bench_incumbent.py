"""The side-by-side's stand-ins for what osmosis-ai 0.3.8's Harbor backend needs and this machine
lacks: the one Harbor 0.24 name it imports, and its Dockerfile patch with the image's Python. The
benchmark itself (``python -m bench --only incumbent``) runs both backends in real sandboxes."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from harbor.trial import network_policy

from bench.incumbent import UV_IMAGE, _harbor_024_compat, _preinstall_sdk


def test_the_incumbent_imports_on_this_harbor_only_with_the_compat_name() -> None:
    had = hasattr(network_policy, "resolve_agent_phase_policy")
    if not had:  # positive control: Harbor 0.25 really lacks the name the incumbent imports
        sys.modules.pop("osmosis_ai.rollout.backend.harbor.environment", None)
        try:
            importlib.import_module("osmosis_ai.rollout.backend.harbor.environment")
        except ImportError as exc:
            assert "resolve_agent_phase_policy" in str(exc)
        else:
            raise AssertionError("the incumbent imported without the compat name")
    _harbor_024_compat()
    module = importlib.import_module("osmosis_ai.rollout.backend.harbor.backend")
    assert module.HarborBackend.__module__ == "osmosis_ai.rollout.backend.harbor.backend"


def test_the_incumbents_sdk_patch_keeps_its_paths_and_uses_the_images_python(tmp_path: Path) -> None:
    from osmosis_ai.rollout.backend.harbor.tasks import SDK_REQUIREMENTS_FILENAME, SDK_UV, SDK_VENV

    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /workspace\n")
    _preinstall_sdk(tmp_path, ["osmosis-ai==0.3.8", "pydantic>=2"])
    text = (tmp_path / "Dockerfile").read_text()
    assert text.startswith("FROM python:3.12-slim\nWORKDIR /workspace\n")
    assert f"COPY --from={UV_IMAGE} /uv {SDK_UV}" in text
    assert f"{SDK_UV} venv {SDK_VENV} --python python3 " in text and "--python 3.12" not in text
    assert (tmp_path / SDK_REQUIREMENTS_FILENAME).read_text() == "osmosis-ai==0.3.8\npydantic>=2\n"
