"""``skh demo``: the whole pipeline on an emulated cluster with scripted faults, shown live, then
an HTML report in ``./skh-report/``. As root it runs on the namespace testbed with the real
daemons; ``--sim`` runs the same pipeline over the simulator (no root needed). The exit code
says whether every fault was detected, localized on the right component and resolved (and, live,
whether every skeleton covers the traffic's truth: no pair the job uses goes unprobed).
``--sim --serve`` plays the simulated scenario behind a real analyzer instead, for alert
subscribers to try (docs/alerts.md)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from skh.cli._daemon_args import add_common, config_from

_NEEDS_ROOT = (
    "skh demo builds an emulated cluster out of network namespaces, veth pairs, bridges, VXLAN and "
    "nftables, which needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).\n"
    "  Run it as root:                 sudo make demo"
    "   (or: sudo .venv/bin/python -m skh demo)\n"
    "  Or run the simulator-backed demo (same pipeline, simulated cluster, no root):"
    "  skh demo --sim"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on an emulated cluster with faults; write an HTML report",
    )
    p.add_argument(
        "--sim",
        action="store_true",
        help="use the simulator instead of the namespace testbed (no root)",
    )
    p.add_argument("--out", default="skh-report", help="report directory (default: ./skh-report)")
    p.add_argument(
        "--prefix",
        default=os.environ.get("SKH_TESTBED_PREFIX", "skht"),
        help=(
            "name prefix of the testbed's namespaces and links"
            " (default: $SKH_TESTBED_PREFIX or skht)"
        ),
    )
    p.add_argument(
        "--port-base", type=int, default=7550, help="first TCP port of the daemons (default: 7550)"
    )
    p.add_argument(
        "--hosts", type=int, default=4, help="hosts of the emulated cluster (even, >= 4)"
    )
    p.add_argument("--rnics", type=int, default=4, help="RNICs (rails) per host")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--faults",
        help="comma-separated fault kinds (default: link_down,fdb_blackhole,slow_path,agent_crash)",
    )
    which.add_argument(
        "--all-faults",
        action="store_true",
        help="every fault kind the testbed can inject, one after the other (about 8 minutes)",
    )
    p.add_argument(
        "--keys",
        metavar="DIR",
        help=(
            "the keyring's directory (docs/trust.md layout; made there, or completed, and kept);"
            " default: a fresh one in the run directory. Every link runs CURVE with a key per"
            " daemon, host agent and sidecar unless --insecure"
        ),
    )
    p.add_argument("--seed", type=int, default=1, help="--sim: simulator seed")
    p.add_argument(
        "--serve",
        action="store_true",
        help="--sim: play the scenario behind a real analyzer (alert bus, replay, metrics from "
        "--config/--set) for subscribers to try; no report",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=10.0,
        help="--serve: virtual seconds per second (default 10: the 6 min scenario in 36 s)",
    )
    p.add_argument(
        "--linger-s",
        type=float,
        help="--serve: exit this long after the scenario ended (default: at SIGTERM)",
    )
    add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(highlight=False)
    if getattr(args, "serve", False):
        return run_serve(args)
    if args.sim:
        from skh.demo.simmode import run_sim

        return run_sim(Path(args.out), console=console, seed=args.seed)
    if os.geteuid() != 0:
        console.print(f"[bold red]{_NEEDS_ROOT}[/]")
        if sys.stdin.isatty() and console.input(
            "Run the simulator-backed demo now? [Y/n] "
        ).strip().lower() in ("", "y", "yes"):
            from skh.demo.simmode import run_sim

            return run_sim(Path(args.out), console=console, seed=args.seed)
        return 2
    return run_live(args, console)


def run_serve(args: argparse.Namespace) -> int:
    import threading

    from skh.demo.simbus import serve
    from skh.errors import ConfigError
    from skh.orchestrator.daemon import install_stop_signals

    if not args.sim:
        raise ConfigError("--serve plays the simulator: use it with --sim")
    if args.speed <= 0:
        raise ConfigError(f"--speed must be > 0. Got {args.speed!r} instead.")
    cfg = config_from(args, {"analyzer.detector": "none"})
    cfg.security.check(server=True, client=False)
    stop = threading.Event()
    install_stop_signals(stop)
    return serve(
        cfg,
        seed=args.seed,
        speed=args.speed,
        linger_s=args.linger_s,
        stop=stop,
        say=lambda line: print(line, flush=True),
    )


def run_live(args: argparse.Namespace, console) -> int:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from skh.demo.live import ALL_FAULTS, DemoSpec, LiveDemo
    from skh.demo.report import build_data, load_spool, write_report
    from skh.errors import SkhError

    if args.all_faults:
        kinds = ALL_FAULTS
    elif args.faults:
        kinds = tuple(k.strip() for k in args.faults.split(","))
    else:
        kinds = DemoSpec().faults
    spec = DemoSpec(
        hosts=args.hosts,
        rnics_per_host=args.rnics,
        prefix=args.prefix,
        port_base=args.port_base,
        faults=kinds,
        keys_dir=args.keys or "",
        insecure=args.insecure,
    )
    out = Path(args.out)
    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("setting up", total=3 + len(kinds) + 1)
        t_start = time.monotonic()

        def say(text: str) -> None:
            stamp = f"[dim]{time.monotonic() - t_start:6.1f}s[/]"
            style = (
                "bold red"
                if "NOT" in text
                else ("green" if text.lstrip().startswith(("detected", "cleared;")) else "")
            )
            progress.console.print(f"{stamp} [{style}]{text}[/]" if style else f"{stamp} {text}")
            if text.startswith(
                ("controller and analyzer up", "training traffic", "skeleton of job1")
            ):
                progress.advance(task)

        demo = LiveDemo(spec, run_dir, say=say)
        error = ""
        # SIGTERM (systemd, `timeout`, a CI runner) would otherwise end the process without
        # unwinding, and the testbed's namespaces and daemons (their own sessions) outlive it.
        stopped_by, restore = _interrupt_on_stop_signals()
        try:
            demo.start()
            progress.update(task, description="injecting faults")
            for kind in kinds:
                demo.fault(kind)
                progress.advance(task)
        except (SkhError, OSError, KeyboardInterrupt) as exc:
            error = str(exc)
            if isinstance(exc, KeyboardInterrupt):
                error = f"interrupted by {signal.Signals(stopped_by[0] or signal.SIGINT).name}"
            progress.console.print(
                f"[bold red]demo failed: {error}[/]\n"
                f"every process's log (logs/), the controller's and testbed's last state"
                f" (state.json) and the alert log are kept in {run_dir.resolve()}/ —"
                " send that directory with a report"
            )
        finally:
            # a second Ctrl-C must not leave the teardown half done
            _ignore_stop_signals()
            progress.update(task, description="tearing down")
            left = demo.stop()
            progress.advance(task)
            restore()
    table = Table(title="Faults vs verdicts")
    for col in ("fault", "truth", "verdict", "type", "detect", "alert", "resolve", "ok"):
        table.add_column(col)

    def secs(x: float | None, sign: str = "") -> str:
        return "—" if x is None else f"{x:{sign}.1f} s"

    for o in demo.outcomes:
        t, d = o.truth, o.detected
        comp = " | ".join(t["component"]) if isinstance(t["component"], list) else t["component"]
        table.add_row(
            t["kind"],
            f"{t['layer']} {comp}",
            f"{d['layer']} {d['component']} ({d['failure_type']})" if d else "—",
            {True: "[green]right[/]", False: "[yellow]other[/]", None: "—"}[o.type_ok],
            secs(o.detect_s),
            secs(o.alert_s),
            secs(o.resolve_s, "+"),
            "[green]yes[/]" if o.ok else "[red]no[/]",
        )
    console.print(table)
    skeleton_ok = bool(demo.skeletons) and all(s["covers"] for s in demo.skeletons.values())
    data = build_data(
        title="skh demo: SkeletonHunter on a namespace testbed",
        mode="live",
        cluster=demo.cluster,
        skeletons=demo.skeletons,
        probes=load_spool(run_dir / "spool"),
        faults=demo.outcomes,
        alerts=demo.alerts(),
        timeline=demo.timeline,
        started_ns=demo.t_start_ns,
        ended_ns=demo.t_end_ns,
        skeleton_ok=skeleton_ok,
    )
    if error:
        data["error"] = error
        data["ok"] = False
    shutil.rmtree(run_dir / "spool", ignore_errors=True)
    path = write_report(out, data)
    console.print(f"report: [bold]{path.resolve()}[/]  (daemon logs and the alert log: {run_dir}/)")
    console.print(f"teardown removed {left}")
    ok = bool(data["ok"]) and len(demo.outcomes) == len(kinds)
    console.print(
        "[bold green]every fault was caught, localized and resolved[/]"
        if ok
        else "[bold red]not every fault was caught and localized[/]"
        f" (logs and state kept in {run_dir.resolve()}/)"
    )
    if stopped_by[0]:
        return 128 + stopped_by[0]  # the shell's convention for a command a signal ended
    return 0 if ok else 1


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt_on_stop_signals() -> tuple[list[int], Callable[[], None]]:
    """Makes each stop signal raise KeyboardInterrupt in the main thread (a BaseException, so no
    ``except Exception`` on the way swallows it); returns a one-item list that then holds the
    signal's number, and a function restoring the previous handlers."""
    got = [0]

    def handler(signum: int, _frame: object) -> None:
        got[0] = signum
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, handler) for sig in _STOP_SIGNALS}

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    return got, restore


def _ignore_stop_signals() -> None:
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
