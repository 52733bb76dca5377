"""``seccomp-profile``: Docker's seccomp profile, restricted to refuse what the file size limit cannot see."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_seccomp_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "seccomp-profile",
        help="restrict a seccomp profile (Docker's default.json) to refuse fallocate --keep-size and io_uring",
        description="Writes BASE with fallocate allowed only when it grows a file (or punches a hole) and io_uring "
        "refused; point OSMOSIS_HARBOR_SANDBOX_SECCOMP_PROFILE at the result.",
    )
    s.add_argument("base", type=Path, metavar="BASE", help="Docker's default.json for the engine's version")
    s.add_argument("-o", "--output", type=Path, help="where to write it (default: stdout)")
    s.set_defaults(func=cmd_seccomp_profile)


def cmd_seccomp_profile(args: argparse.Namespace) -> int:
    from osmosis_harbor.sandbox.sdk.seccomp import read_profile, restrict_preallocation

    restricted = (
        json.dumps(
            restrict_preallocation(json.loads(read_profile(args.base, f"seccomp-profile {str(args.base)!r}"))), indent=1
        )
        + "\n"
    )
    if args.output is None:
        sys.stdout.write(restricted)
    else:
        args.output.write_text(restricted)
    return 0
