"""A workflow's trials never import litellm: Harbor's agent base parses the model name with
LiteLLM (5 s of CPU on import) unless told to skip it, and a workflow reaches its model through the
rollout's chat endpoint, where that parse means nothing. Every process that runs trials (a
backend, each worker, ``osmosis eval run``) starts that much faster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# litellm's import is refused (and noted) rather than paid for: the control shows the refusal bites.
MAKE_AGENT = """
import sys
from pathlib import Path

class RefuseLitellm:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "litellm":
            print("litellm-import-attempted", flush=True)
            raise ImportError("litellm refused by the test")
        return None

sys.meta_path.insert(0, RefuseLitellm())
from osmosis_harbor import settings
from osmosis_harbor.agents.workflow import WorkflowAgent
from osmosis_harbor.trials.contract_files import ContractBounds
agent = WorkflowAgent(
    logs_dir=Path(sys.argv[1]), model_name="openai/gpt-4o-mini", bundle_wheel="w.whl",
    agent_script="pkg-agent", rollout_id="r-1", rollout_input="in.json", output_max_bytes=1024,
    contract_bounds=ContractBounds.of(settings.current()),
    {extra}
)
print("made", agent.skip_model_parsing)
"""


def _make(tmp_path: Path, extra: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", MAKE_AGENT.format(extra=extra), str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )


def test_a_workflow_agent_does_not_import_litellm(tmp_path: Path) -> None:
    made = _make(tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stdout.split() == ["made", "True"]


def test_control_with_the_parse_the_agent_imports_litellm(tmp_path: Path) -> None:
    made = _make(tmp_path, "skip_model_parsing=False,")
    assert "litellm-import-attempted" in made.stdout
    assert "made" not in made.stdout.split()
