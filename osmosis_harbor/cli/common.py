"""What several commands share: exit codes, the sandbox options, the agent options, the console.

The parser is built from this module, so it imports neither Harbor nor Rich: what a command
needs of them is imported when the command runs (``--help`` and ``cleanup`` need no Harbor).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_harbor import settings
from osmosis_harbor.errors import UserError
from osmosis_harbor.sandbox.sdk.registry import SDK_NAMES

if TYPE_CHECKING:
    from harbor.models.trial.config import EnvironmentConfig
    from rich.console import Console

EXIT_USAGE = 2


def environment_for(args: argparse.Namespace) -> EnvironmentConfig:
    """The sandbox environment a command's --env/--registry/--pool/... options describe.

    A policy endpoint on this machine's loopback reaches local Docker sandboxes through the
    backend's policy relay, never through the host's network."""
    from osmosis_harbor.sandbox import environment_config

    pool = getattr(args, "pool", None)
    return environment_config(
        args.env,
        registry=getattr(args, "registry", None),
        pool=pool,
        pool_size=(args.pool_size or 1) if pool and hasattr(args, "pool_size") else None,
        force_build=getattr(args, "force_build", False),
    )


def pool_size_arg(value: str) -> int | str:
    """``--pool-size``: a number of members, or ``auto`` (sized from the observed claim rate)."""
    if value == "auto":
        return value
    try:
        size = int(value)
    except ValueError:
        size = -1
    if size < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a number of sandboxes >= 0 nor 'auto'")
    return size


def add_env_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        choices=SDK_NAMES,
        default="docker",
        help="sandbox SDK: local Docker engine (default), SkyPilot, or skypilot-emulator (SkyPilot's API served locally)",
    )
    parser.add_argument("--registry", help="push task images to this registry (e.g. 127.0.0.1:5000)")
    parser.add_argument("--pool", help="claim sandboxes from this warm pool")


DEFAULT_COLUMNS = 120  # the result tables' width when stdout is not a terminal and $COLUMNS is unset


def result_console(config: settings.Settings) -> Console:
    """The terminal's width on a terminal; off one (CI logs, a pipe) ``$COLUMNS`` or
    ``DEFAULT_COLUMNS``, not Rich's 80."""
    from rich.console import Console

    out = Console()
    if not out.is_terminal:
        out = Console(width=config.columns or DEFAULT_COLUMNS)
    return out


def agent_args(args: argparse.Namespace) -> dict[str, Any]:
    """Backend keywords for --workflow/--agent/--grader/--code-dir."""
    if args.workflow and args.agent:
        raise UserError("pass either --workflow (an AgentWorkflow) or --agent (a native Harbor agent), not both")
    return {
        "agent": args.workflow or args.agent or "oracle",
        "workflow_config": args.workflow_config,
        "grader": args.grader,
        "grader_config": args.grader_config,
        "code_dir": Path(args.code_dir) if args.code_dir else None,
        "bundles_dir": Path(args.bundles_dir) if args.bundles_dir else None,
    }


def add_agent_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workflow", metavar="MOD:CLS", help="the AgentWorkflow to bundle and run")
    parser.add_argument("--workflow-config", metavar="MOD:OBJ", help="its module-level config object")
    parser.add_argument("--agent", help="a native Harbor agent instead: oracle, terminus-2, mini-swe-agent")
    parser.add_argument("--grader", metavar="MOD:CLS", help="an Osmosis Grader (else the task's own tests)")
    parser.add_argument("--grader-config", metavar="MOD:OBJ")
    parser.add_argument("--code-dir", help="the workflow project (pyproject.toml + one package)")
    parser.add_argument(
        "--bundles-dir",
        help="bundle cache (default $OSMOSIS_HARBOR_BUNDLES, else $XDG_CACHE_HOME/osmosis-harbor/bundles)",
    )
