"""``python -m osmosis_harbor bundle``: build the bundle wheel of a workflow project."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from osmosis_harbor import settings
from osmosis_harbor.bundle.builder import build
from osmosis_harbor.bundle.cache import ENV_CACHE_DIR
from osmosis_harbor.cli.common import EXIT_USAGE
from osmosis_harbor.errors import BundleError

# The explicit export lands where you run it (the repository's own bundles/ holds such wheels);
# runs build into the user cache instead (settings.Settings.bundle_cache).
DEFAULT_OUT = Path("bundles")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_harbor bundle",
        description="Build the bundle wheel of a workflow project (cached by content).",
    )
    add = parser.add_argument
    add("code_dir", metavar="CODE_DIR", type=Path, help="project dir: pyproject.toml + one package")
    add("--workflow", metavar="MOD:CLS", help="the AgentWorkflow, e.g. calc_agent.workflow:CalcWorkflow")
    add("--workflow-config", metavar="MOD:OBJ", help="a module-level AgentWorkflowConfig")
    add("--grader", metavar="MOD:CLS", help="the Grader class; adds the <pkg>-grade script")
    add("--grader-config", metavar="MOD:OBJ", help="a module-level GraderConfig")
    add(
        "--out",
        metavar="DIR",
        type=Path,
        help=f"where the wheel goes, as a content-addressed cache (default: ${ENV_CACHE_DIR}, else ./{DEFAULT_OUT})",
    )
    add("--json", action="store_true", help="print the result as JSON")
    return parser


def cli_main(argv: Sequence[str] | None, config: settings.Settings) -> int:
    """``python -m osmosis_harbor bundle``; *argv* are the arguments after ``bundle``, ``config``
    the command's settings (read once by ``cli.main``).

    A user error is one plain ``error: ...`` line on stderr (never rich markup, which would
    eat ``[project]``) and exit status 2, as for every other command."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error (argparse exits 2 too)
        return int(exc.code or 0)
    try:
        result = build(
            args.code_dir,
            workflow=args.workflow,
            workflow_config=args.workflow_config,
            grader=args.grader,
            grader_config=args.grader_config,
            cache_dir=args.out or config.bundles or DEFAULT_OUT,
        )
    except BundleError as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}))
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    info = result.info
    if args.json:
        payload = {
            "wheel": str(info.wheel),
            "key": info.key,
            "console_scripts": info.console_scripts,
            "dependencies": info.dependencies,
            **info.model_dump(mode="json", exclude={"wheel", "key", "dependencies"}),
            "cached": result.cached,
            "seconds": round(result.seconds, 3),
        }
        print(json.dumps(payload, indent=2))
        return 0
    how = "cache hit" if result.cached else ("built (isolated env)" if result.isolated else "built")
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    # Cells are markup: escape what comes from the project (extras such as osmosis-ai[server]).
    table.add_row("wheel", escape(str(info.wheel)))
    table.add_row("key", info.key)
    for name, target in info.console_scripts.items():
        table.add_row("script", escape(f"{name} -> {target}"))
    for kind in ("workflow", "workflow_config", "grader", "grader_config"):
        if getattr(info, kind):
            table.add_row(kind.replace("_", " "), escape(getattr(info, kind)))
    table.add_row("dependencies", escape("\n".join(info.dependencies)) or "-")
    table.add_row("shim", info.shim_version)
    out = Console()
    title = f"[green]bundle[/] {escape(info.distribution)} {escape(info.version)}: {how} in {result.seconds:.2f} s"
    out.print(title, highlight=False)
    out.print(table)
    return 0
