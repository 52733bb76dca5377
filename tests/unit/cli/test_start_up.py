"""What a command imports before it runs: the parser and the light commands load neither Harbor
nor osmosis_ai's rollout package nor validation, and the handlers the parser names are the
commands' own (imported when the command runs)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from osmosis_ai.rollout.types import RolloutErrorCategory

import osmosis_harbor.cli as cli
from osmosis_harbor import errors
from osmosis_harbor.cli import prewarm, rollout, sandbox, validate
from tests.support.common import REPO

HEAVY = ("harbor", "osmosis_ai.rollout", "osmosis_harbor.validate", "osmosis_harbor.audit", "docker", "litellm")

# Parses every command's words (building the whole parser), and imports what cleanup, the emulator,
# base-images and seccomp-profile run with: none of it may pull in what HEAVY names.
PROBE = """
import json, sys
from osmosis_harbor.cli import build_parser
parser = build_parser()
for words in (["validate", "x"], ["prewarm", "x"], ["rollout", "x", "--prompt", "p"], ["cleanup"],
              ["sandbox-check"], ["emulator"], ["base-images"], ["seccomp-profile"]):
    try:
        parser.parse_args(words)
    except SystemExit:
        pass
import osmosis_harbor.cli.sandbox, osmosis_harbor.sandbox.ledger.leftovers, osmosis_harbor.sandbox.owner.pools
import osmosis_harbor.sandbox.emulator.server.process, osmosis_harbor.sandbox.images.stand_ins
import osmosis_harbor.sandbox.sdk.seccomp
print(json.dumps(sorted(sys.modules)))

# Then a command that runs Harbor: Harbor's logger, pinned at DEBUG when Harbor is first imported,
# is quiet by the time the command runs (its chatter belongs in the trial logs).
import logging
import osmosis_harbor.cli.validate
from osmosis_harbor.cli import main
def stand_in(args):
    import harbor.trial.queue
    print(json.dumps(logging.getLogger("harbor.utils.logger.harbor.trial").getEffectiveLevel()))
    return 0
osmosis_harbor.cli.validate.cmd_validate = stand_in
main(["validate", "x"])
"""


def test_the_parser_and_the_light_commands_import_no_harbor_and_no_rollout_package() -> None:
    """And a command that does import Harbor runs with Harbor's logs quiet (no ``-v``)."""
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    modules, harbor_level = proc.stdout.splitlines()[-2:]
    loaded = json.loads(modules)
    heavy = [name for name in loaded if any(name == h or name.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], heavy
    assert "osmosis_harbor.sandbox.ledger.leftovers" in loaded  # the probe did import cleanup's machinery
    assert json.loads(harbor_level) == logging.CRITICAL


@pytest.mark.parametrize(
    ("command", "words", "module"),
    [
        ("cmd_validate", ["validate", "x"], validate),
        ("cmd_prewarm", ["prewarm", "x"], prewarm),
        ("cmd_rollout", ["rollout", "x", "--prompt", "p"], rollout),
        ("cmd_cleanup", ["cleanup"], sandbox),
        ("cmd_sandbox_check", ["sandbox-check"], sandbox),
    ],
)
def test_each_command_runs_its_own_module_s_handler(
    command: str, words: list[str], module: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parser's handler hands the arguments to the command module's function, unchanged."""
    seen: list[object] = []
    monkeypatch.setattr(module, command, lambda args: seen.append(args) or 7)
    args = cli.build_parser().parse_args(words)
    assert args.func(args) == 7 and seen == [args]


def test_every_trial_error_names_a_rollout_category() -> None:
    """The categories are looked up when read; each is the enum's own member, on classes and instances."""
    found = errors.trial_errors()
    assert len(found) >= 10
    for cls in found.values():
        assert isinstance(cls.category, RolloutErrorCategory), cls
    assert errors.WorkflowFailedError.category is RolloutErrorCategory.AGENT_ERROR
    assert errors.WorkflowFailedError("exit 1").category is RolloutErrorCategory.AGENT_ERROR
    assert errors.IncompatibleTaskImageError.category is RolloutErrorCategory.VALIDATION_ERROR
    assert errors.ImageBuildError.should_retry() and not errors.VerifierTamperedError.should_retry()
