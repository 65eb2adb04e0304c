"""``skh config check FILE`` validates a daemon config (and its CURVE key files) and prints the
effective settings; ``skh config keygen DIR NAME`` writes a CURVE key pair with the identity it
stands for; ``skh config keyring DIR`` writes every key of a deployment (docs/trust.md)."""

from __future__ import annotations

import argparse
import json

from skh.cli._daemon_args import add_common, config_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="check configuration, generate CURVE keys")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    c = csub.add_parser(
        "check", help="validate a config file (with overrides) and print it as JSON"
    )
    add_common(c)
    c.add_argument("file", nargs="?", help="TOML config (same as --config)")
    c.add_argument(
        "--role",
        choices=("controller", "analyzer", "agent"),
        help="also check the CURVE keys this daemon needs",
    )
    c.set_defaults(func=run_check)
    k = csub.add_parser(
        "keygen",
        help="write NAME.key and NAME.key_secret (CURVE, the secret 0600) into DIR",
        description="The identity (--role and where it acts) is written into both files' "
        "metadata: copy NAME.key into the controller's and the analyzer's "
        "authorized_keys_dir to trust it. Existing keys are never overwritten without --force.",
    )
    k.add_argument("dir")
    k.add_argument("name")
    k.add_argument(
        "--role", choices=("admin", "analyzer", "subscriber", "underlay", "overlay", "server")
    )
    k.add_argument("--host", help="underlay and overlay: the host it acts for")
    k.add_argument("--job", help="overlay: its job")
    k.add_argument("--container", help="overlay: its container")
    k.add_argument("--force", action="store_true", help="replace existing key files")
    k.set_defaults(func=run_keygen)
    r = csub.add_parser(
        "keyring",
        help="write the keys of a deployment or test bed into DIR (docs/trust.md layout)",
    )
    r.add_argument("dir")
    r.add_argument("--host", action="append", default=[], help="an underlay agent's host")
    r.add_argument(
        "--sidecar",
        action="append",
        default=[],
        metavar="NAME=JOB/CONTAINER@HOST",
        help="a sidecar provisioned with a key (the others enrol)",
    )
    r.set_defaults(func=run_keyring)


def run_check(args: argparse.Namespace) -> int:
    if args.file:
        args.config = args.file
    cfg = config_from(args, {})
    if args.role:
        cfg.security.check(server=args.role != "agent", client=args.role != "controller")
    print(json.dumps(cfg.to_mapping(), indent=2, sort_keys=True))
    return 0


def run_keygen(args: argparse.Namespace) -> int:
    from skh.errors import ConfigError
    from skh.orchestrator.security import Identity, generate_keypair

    meta = {
        k: v
        for k, v in (
            ("role", args.role),
            ("host", args.host),
            ("job", args.job),
            ("container", args.container),
        )
        if v
    }
    if args.role and args.role != "server":
        # the same checks the daemons apply when they read it (a placeholder key here)
        Identity(
            "0" * 40, args.name, args.role, args.host or "", args.container or "", args.job or ""
        ).check()
    elif args.role == "server":
        meta = {}
    elif args.host or args.job or args.container:
        raise ConfigError("--host, --job and --container describe a --role")
    public, secret = generate_keypair(args.dir, args.name, metadata=meta, overwrite=args.force)
    print(json.dumps({"public": str(public), "secret": str(secret), "identity": meta}))
    return 0


def run_keyring(args: argparse.Namespace) -> int:
    from skh.errors import ConfigError
    from skh.orchestrator.keyring import make_keyring
    from skh.orchestrator.security import underlay_identity

    sidecars = []
    for spec in args.sidecar:
        name, _, rest = spec.partition("=")
        where, _, host = rest.partition("@")
        job, _, container = where.partition("/")
        if not (name and job and container and host):
            raise ConfigError(f"--sidecar must look like NAME=JOB/CONTAINER@HOST, not {spec!r}")
        sidecars.append((name, job, container, host))
    ring = make_keyring(args.dir, hosts=args.host, sidecars=sidecars)
    out = {
        "controller": ring.controller(),
        "analyzer": ring.analyzer(),
        "admin": ring.admin(),
        "subscriber": ring.subscriber(),
        **{underlay_identity(h): ring.underlay(h) for h in args.host},
        **{name: ring.client(name) for name, *_ in sidecars},
    }
    print(json.dumps({k: _mapping(v) for k, v in out.items()}, indent=2))
    return 0


def _mapping(sec: object) -> dict[str, object]:
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(sec).items() if v not in ("", False)}  # type: ignore[call-overload]
