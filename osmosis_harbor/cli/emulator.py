"""``emulator``: serve the skypilot-emulator (SkyPilot's Sandbox API on the local Docker engine)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_emulator_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = sub.add_parser("emulator", help="serve the skypilot-emulator (SkyPilot's sandbox API, locally)")
    e.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    e.add_argument("--port", type=int, default=8765, help="0: the kernel picks one (default 8765)")
    e.add_argument("--registry", default="127.0.0.1:5000", help="where snapshots are pushed")
    e.add_argument("--latency-ms", type=float, default=80.0, help="delay added to every API call (default 80)")
    e.add_argument("--cold-create-sec", type=float, default=0.0, help="time a create without a pool takes")
    e.add_argument("--pool-claim-sec", type=float, default=0.0, help="time a claim from a warm pool takes")
    e.add_argument("--seed", type=int, default=0, help="seed of the injected-fault sequence")
    for kind in ("503", "429", "reset", "reset-after", "hang"):
        e.add_argument(f"--rate-{kind}", type=float, default=0.0, help=f"chance per call of a {kind} fault")
    e.add_argument("--evict-rate", type=float, default=0.0, help="chance per call that a sandbox is evicted")
    e.add_argument("--pool-warm-sec", type=float, default=0.0, help="time a pool member takes to become ready")
    e.add_argument(
        "--pool-warm-timeout-sec",
        type=float,
        default=180.0,
        help="how long create_pool / set_pool_size wait for a fully warm pool (default 180)",
    )
    e.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME",
        help="register the secret NAME, its value taken from this server's environment (repeatable)",
    )
    e.add_argument("--state-file", help=argparse.SUPPRESS)
    e.add_argument("--knobs-json", help=argparse.SUPPRESS)  # a restart keeps the knobs it had
    e.set_defaults(func=cmd_emulator)


def cmd_emulator(args: argparse.Namespace) -> int:
    from osmosis_harbor.sandbox.emulator.server.process import serve
    from osmosis_harbor.sandbox.emulator.wire import Knobs

    if args.knobs_json:
        knobs = Knobs.model_validate_json(args.knobs_json)
    else:
        knobs = Knobs(
            latency_ms=args.latency_ms,
            cold_create_sec=args.cold_create_sec,
            pool_claim_sec=args.pool_claim_sec,
            seed=args.seed,
            rate_503=args.rate_503,
            rate_429=args.rate_429,
            rate_reset=args.rate_reset,
            rate_reset_after=args.rate_reset_after,
            rate_hang=args.rate_hang,
            evict_rate=args.evict_rate,
            pool_warm_sec=args.pool_warm_sec,
            pool_warm_timeout_sec=args.pool_warm_timeout_sec,
        )
    state_file = Path(args.state_file) if args.state_file else None
    serve(args.host, args.port, knobs, args.registry, state_file, secret_names=args.secret)
    return 0
