"""``base-images``: make the offline stand-ins for public base images present, or list them."""

from __future__ import annotations

import argparse


def add_base_images_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser(
        "base-images",
        help="build offline stand-ins (Debian under public names) for base images that cannot be pulled",
        description="With no argument: the images the bundled tasks and the tests use.",
    )
    b.add_argument("images", nargs="*", metavar="IMAGE", help="public names to make present (e.g. ubuntu:24.04)")
    what = b.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="every stand-in: what it really is, present or absent")
    what.add_argument("--names", action="store_true", help="every name with a recipe, one a line (no Docker call)")
    what.add_argument("--all", action="store_true", help="make every stand-in present")
    b.set_defaults(func=cmd_base_images)


def cmd_base_images(args: argparse.Namespace) -> int:
    from osmosis_harbor.errors import UserError
    from osmosis_harbor.sandbox.images.stand_ins import run_script

    flags = [f"--{name}" for name in ("list", "names", "all") if getattr(args, name)]
    if flags and args.images:
        raise UserError(f"base-images: {flags[0]} takes no IMAGE (got {' '.join(args.images)})")
    return run_script(flags or args.images)
