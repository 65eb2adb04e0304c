"""``skh eval``: the paper's evaluation on the simulator, side by side with the paper's figures."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="evaluate detection, localization, skeleton and probing cost on the simulator"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--quick",
        dest="profile",
        action="store_const",
        const="quick",
        help="scaled-down cluster, minutes on two cores (CI; the default)",
    )
    g.add_argument(
        "--full",
        dest="profile",
        action="store_const",
        const="full",
        help="4,096 hosts x 8 RNICs, hours of virtual time, every fault type 3 times",
    )
    g.add_argument(
        "--profile", dest="profile", choices=("tiny", "quick", "full"), help=argparse.SUPPRESS
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument(
        "--seed",
        type=int,
        action="append",
        help="simulation seed (repeat for several; default: the profile's number of seeds, "
        "drawn at run time, never a training seed)",
    )
    p.add_argument(
        "--noise",
        default="field",
        help="benign-noise regime: field (default), field-heavy (held out of calibration), lab",
    )
    p.add_argument("--out", metavar="DIR", help="also write eval.json, eval.md and eval.html here")
    p.add_argument("--no-agent", action="store_true", help="skip the agent-cost measurement")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes the independent stages (seeds, ramps, localization, probing) run in "
        "(default: one per CPU; the result is the same for any N)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a headline figure misses the CI gate (precision, recall, end-to-end "
        "localization and type accuracy, skeleton coverage, false positives per 1k host-hours)",
    )
    p.set_defaults(func=run, profile="quick")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from skh.errors import ConfigError
    from skh.eval import profile, run_eval
    from skh.eval.report import to_html, to_markdown

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"The '--workers' option must be >= 1. Got {args.workers} instead.")
    res = run_eval(
        profile(args.profile),
        seeds=args.seed,
        noise=args.noise,
        agent=not args.no_agent,
        workers=args.workers,
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(res, indent=1) + "\n")
        (out / "eval.md").write_text(to_markdown(res))
        (out / "eval.html").write_text(to_html(res))
    print(json.dumps(res) if args.json else to_markdown(res))
    return 1 if args.check and not res["meets_thresholds"] else 0
