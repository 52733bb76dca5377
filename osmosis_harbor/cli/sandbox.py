"""``sandbox-check`` (the SDK conformance suite) and ``cleanup`` (what dead owners and prewarm left)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from osmosis_harbor.cli.common import result_console

STATUS_STYLE = {
    "passed": "[green]pass[/]",
    "failed": "[red]FAIL[/]",
    "skipped": "[yellow]skipped[/]",
    "not_applicable": "[dim]n/a[/]",
}


def cmd_sandbox_check(args: argparse.Namespace) -> int:
    """Exit 1 when a check failed, or with ``--strict`` when one was skipped; a check that is
    not applicable (the SDK lacks its capability, shown in the capability table) never fails."""
    from rich.table import Table

    from osmosis_harbor.sandbox import load_sandbox_sdk
    from osmosis_harbor.sandbox.conformance import run_suite
    from osmosis_harbor.sandbox.images.builds import names_registry, publish_local_image
    from osmosis_harbor.sandbox.sdk.registry import implementation

    impl = implementation(args.sdk)
    sdk = load_sandbox_sdk(args.sdk)
    image = args.image
    if impl.default_registry and not names_registry(image):
        # its sandboxes pull by reference: publish the local image to the registry first
        image = publish_local_image(image, args.settings.registry or impl.default_registry)
    report = asyncio.run(run_suite(sdk, image, config=args.settings, include_pools=not args.no_pools, only=args.check))
    console = result_console(args.settings)
    caps = Table(title=f"capabilities of {args.sdk}")
    for col in ("capability", "offered", "note"):
        caps.add_column(col)
    words = {True: "yes", False: "no", None: "unknown"}
    for name, value in report.capabilities.offered.items():
        caps.add_row(name, words[value], report.capabilities.notes.get(name, ""))
    console.print(caps)
    table = Table(title=f"sky.sandbox conformance ({args.sdk}, image {image})")
    for col in ("check", "result", "seconds", "detail"):
        table.add_column(col)
    for r in report.results:
        table.add_row(r.name, STATUS_STYLE[r.status.value], f"{r.seconds:.2f}", r.detail or "")
    console.print(table)
    assumed = Table(title=f"what our code assumes of {args.sdk} where SkyPilot's docs are silent")
    for col in ("check", "assumption", "held", "result"):
        assumed.add_column(col)
    held_words = {True: "[green]held[/]", False: "[yellow]did not hold[/]", None: "not checked"}
    for r in report.results:
        if r.assumption is not None:
            assumed.add_row(r.name, r.assumption, held_words[r.held], STATUS_STYLE[r.status.value])
    if assumed.row_count:
        console.print(assumed)
        console.print(f"{args.sdk}: {report.assumptions_summary()}")
    ok = report.ok(strict=args.strict)
    console.print(
        f"{args.sdk}: {report.summary()}" + ("" if ok else " -> FAILED" + (" (--strict)" if args.strict else ""))
    )
    if args.json:
        Path(args.json).write_text(report.model_dump_json(indent=2) + "\n")
    return 0 if ok else 1


def cmd_cleanup(args: argparse.Namespace) -> int:
    """Remove what dead owners left on ``--env`` (the ledger cross-checked with the SDK's
    listing, on any SDK), then, on Docker, what its labels say is expired or orphaned, and the
    warm pools named by ``--pool`` / ``--all-pools`` (pools outlive the prewarm command by design)."""
    from rich.table import Table

    from osmosis_harbor.sandbox.ledger.leftovers import reap_dead_owners

    leftovers = reap_dead_owners(args.env, args.settings, dry_run=args.dry_run)
    rows = [(item.name, f"{item.kind} of dead owner {item.owner}: {item.action}") for item in leftovers]
    if not args.dry_run:
        rows += _cleanup_pools(args) if args.env != "docker" else _cleanup_docker(args)
    table = Table(title="Would remove" if args.dry_run else "Removed")
    table.add_column("name")
    table.add_column("why")
    for name, why in rows:
        table.add_row(name, str(why))
    result_console(args.settings).print(table if rows else "nothing to remove")
    if args.json:
        report = {
            "env": args.env,
            "dry_run": args.dry_run,
            "ledger": [item.model_dump(mode="json") for item in leftovers],
        }
        report["other"] = [{"name": name, "why": str(why)} for name, why in rows[len(leftovers) :]]
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if any(item.action == "could not be removed (stays in the ledger)" for item in leftovers) else 0


def _cleanup_pools(args: argparse.Namespace) -> list[tuple[str, str]]:
    """On a remote-style SDK the service reaps expired sandboxes itself (their TTL); what is
    left to clean is the warm pools a prewarm handed over, found in the ledger (SkyPilot's SDK
    cannot list pools). A pool a live process's sandbox was claimed from is refused by the SDK
    and reported, never forced."""
    from osmosis_harbor.sandbox import load_sandbox_sdk
    from osmosis_harbor.sandbox.ledger.store import Kind, State, default_ledger, endpoint_for
    from osmosis_harbor.sandbox.owner import pools
    from osmosis_harbor.sandbox.sdk.errors import is_missing

    if not (args.pool or args.all_pools):
        return []
    ledger, endpoint = default_ledger(args.settings), endpoint_for(args.env, args.settings)
    handed = [e.name for e in ledger.entries(sdk=args.env, endpoint=endpoint) if e.state is State.HANDED_OVER]
    sdk = load_sandbox_sdk(args.env)
    removed: list[tuple[str, str]] = []
    for name in pools.selected(sorted(set(handed)), args.pool, everything=args.all_pools):
        try:
            sdk.delete_pool(name)
            removed.append((name, "pool deleted"))
        except Exception as exc:
            if not is_missing(exc):
                removed.append((name, f"pool not deleted: {type(exc).__name__}: {exc}"))
                continue
            removed.append((name, "pool already gone"))
        ledger.forget(Kind.POOL, args.env, endpoint, name)
    return removed


def _live_claimers(listed: list[Any], pool: str) -> list[str]:
    """The live processes (other than this one) whose sandboxes were claimed from ``pool``."""
    from osmosis_harbor.owner_process import OwnerProcess

    me = OwnerProcess.current()
    users = set()
    for record in listed:
        if record.pool != pool or record.owner_pid is None:
            continue
        owner = OwnerProcess(pid=record.owner_pid, host=record.owner_host or "")
        if owner.pid != me.pid and not owner.is_dead():
            users.add(f"pid {owner.pid}")
    return sorted(users)


def _cleanup_docker(args: argparse.Namespace) -> list[tuple[str, str]]:
    from osmosis_harbor.sandbox import docker as docker_sdk
    from osmosis_harbor.sandbox.ledger.store import Kind, default_ledger, endpoint_for
    from osmosis_harbor.sandbox.owner import pools

    removed: list[tuple[str, str]] = [(r.name, r.reason) for r in docker_sdk.reap(expired=True, dead_owners=True)]
    ledger = default_ledger(args.settings)
    for name in pools.selected([pool.name for pool in docker_sdk.list_pools()], args.pool, everything=args.all_pools):
        users = _live_claimers(docker_sdk.ls(), name)
        if users:  # another live process runs a sandbox claimed from it: not this cleanup's to take
            removed.append((name, f"pool kept: in use by {', '.join(users)}"))
            continue
        removed += [(r.name, f"pool {name} deleted") for r in docker_sdk.delete_pool(name)]
        removed.append((name, "pool spec deleted"))
        ledger.forget(Kind.POOL, "docker", endpoint_for("docker", args.settings), name)  # a handed-over pool's row
    return removed
