"""Runs the real engine on the libibverbs stand-in (ibverbs_standin.c) and prints what happened
as JSON. Started by tests/verbs/test_hwsim.py in a subprocess whose LD_LIBRARY_PATH puts the
stand-in first (the engine dlopens "libibverbs.so.1") and whose SKH_HWSIM describes the devices.

    python driver.py SCENARIO '{json args}'
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import numpy as np

from skh.probe import Engine, EngineThread


class Event(ctypes.Structure):  # struct skh_hwsim_event
    _fields_ = [
        ("t_ns", ctypes.c_int64),
        ("deliver_ns", ctypes.c_int64),
        ("session", ctypes.c_uint32),
        ("seq", ctypes.c_uint32),
        ("stream", ctypes.c_uint32),
        ("tseq", ctypes.c_uint32),
        ("flow_label", ctypes.c_uint32),
        ("type", ctypes.c_uint8),
        ("src_dev", ctypes.c_uint8),
        ("dst_dev", ctypes.c_uint8),
        ("tclass", ctypes.c_uint8),
        ("sl", ctypes.c_uint8),
        ("fate", ctypes.c_uint8),
    ]


# the same library the engine loads: dlopen of an already loaded soname returns it
sim = ctypes.CDLL("libibverbs.so.1")
sim.skh_hwsim_set_loss.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_double,
    ctypes.c_int,
    ctypes.c_uint64,
]
sim.skh_hwsim_qp_error.argtypes = [ctypes.c_uint32]
sim.skh_hwsim_fail_posts.argtypes = [ctypes.c_uint32, ctypes.c_int, ctypes.c_int]
sim.skh_hwsim_log.argtypes = [ctypes.POINTER(Event), ctypes.c_size_t, ctypes.c_size_t]
sim.skh_hwsim_log.restype = ctypes.c_size_t
sim.skh_hwsim_counter.argtypes = [ctypes.c_char_p]
sim.skh_hwsim_counter.restype = ctypes.c_uint64
sim.skh_hwsim_notifications.argtypes = [ctypes.c_int]
sim.skh_hwsim_notifications.restype = ctypes.c_uint64


def sim_log() -> list[dict]:
    out: list[dict] = []
    buf = (Event * 4096)()
    while True:
        n = sim.skh_hwsim_log(buf, len(out), len(buf))
        out += [{f: getattr(buf[i], f) for f, _ in Event._fields_} for i in range(n)]
        if n < len(buf):
            return out


def rows_json(rows: np.ndarray) -> dict:
    return {name: rows[name].tolist() for name in rows.dtype.names}


def engine(dev: str, ep: int, **kw) -> Engine:
    kw.setdefault("hw_timestamps", True)
    return Engine(endpoint_id=ep, transport="verbs", device=dev, **kw)


def probe(prober: Engine, responder: Engine, dst_ep: int, **kw) -> None:
    a = responder.local_address()
    prober.add_target(dst_ep, "", 0, gid=a["gid"], qpn=a["qpn"], **kw)


def settle(*engines: Engine, decided: int = 0, timeout_s: float = 10.0) -> None:
    """Waits until the first engine decided ``decided`` probes and no engine has any undecided."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engines[0].stats().decided >= decided and all(
            e.stats().in_flight == 0 and e.stats().awaiting_direction == 0 for e in engines
        ):
            return
        time.sleep(0.02)


def result(prober: Engine, responder: Engine, **extra) -> dict:
    return {
        "rows": rows_json(prober.drain()),
        "prober": prober.stats().as_dict(),
        "responder": responder.stats().as_dict(),
        "prober_transport": prober.transport_stats(),
        "responder_transport": responder.transport_stats(),
        **extra,
    }


def scenario_rtt(a: dict) -> dict:
    """n probes from mlx5_0 to mlx5_1; the raw counters before and after show any wrap."""
    t_before = time.monotonic_ns()
    before = {d: sim.skh_hwsim_counter(d.encode()) for d in ("mlx5_0", "mlx5_1")}
    # both engines on one thread, as an agent's are
    thread = {"thread": EngineThread()} if a.get("shared_thread") else {}
    with (
        engine("mlx5_0", 1, timeout_s=0.5, **a.get("prober", {}), **thread) as p,
        engine("mlx5_1", 2, **a.get("responder", {}), **thread) as r,
    ):
        probe(
            p,
            r,
            7,
            interval_s=a["interval_s"],
            count=a["n"],
            path_id=a.get("path_id", 0),
            paths=a.get("paths", 1),
            sample_period_s=a.get("sample_period_s", 0.0),
            sample_phase_ns=a.get("sample_phase_ns", 0),
        )
        settle(p, r, decided=a["n"], timeout_s=a["n"] * a["interval_s"] + 10)
        elapsed_ns = time.monotonic_ns() - t_before
        return result(
            p,
            r,
            counters_before=before,
            elapsed_ns=elapsed_ns,
            log=sim_log(),
            tick_s=[p.tick_s, r.tick_s],
            notify_requests=sim.skh_hwsim_notifications(0),
            notify_events=sim.skh_hwsim_notifications(1),
        )


def scenario_loss(a: dict) -> dict:
    """Injected loss per direction; the log says which datagram the stand-in dropped."""
    with (
        engine("mlx5_0", 1, timeout_s=a["timeout_s"], direction_wait_s=a["direction_wait_s"]) as p,
        engine("mlx5_1", 2) as r,
    ):
        for src, dst, prob, kind in a["loss"]:
            sim.skh_hwsim_set_loss(src.encode(), dst.encode(), prob, kind, a["seed"])
        probe(p, r, 7, interval_s=a["interval_s"], count=a["n"])
        settle(p, r, decided=a["n"], timeout_s=a["n"] * a["interval_s"] + 10)
        return result(p, r, log=sim_log(), session=p.session)


def scenario_qp_error(a: dict) -> dict:
    """Forces the prober's (and/or responder's) QP into the error state mid-run."""
    with engine("mlx5_0", 1, timeout_s=0.2) as p, engine("mlx5_1", 2) as r:
        probe(p, r, 7, interval_s=a["interval_s"])
        time.sleep(a["before_s"])
        t_fault = time.time_ns()
        for who in a["who"]:
            sim.skh_hwsim_qp_error((p if who == "prober" else r).local_address()["qpn"])
        time.sleep(a["after_s"])
        p.remove_target(7)
        settle(p, r)
        return result(p, r, t_fault_ns=t_fault)


def scenario_fail_posts(a: dict) -> dict:
    """post_send fails with ENOMEM (a full send queue) for the next n calls."""
    with engine("mlx5_0", 1, timeout_s=a["timeout_s"]) as p, engine("mlx5_1", 2) as r:
        probe(p, r, 7, interval_s=0.01, count=3)
        time.sleep(0.1)
        p.drain()
        sim.skh_hwsim_fail_posts(p.local_address()["qpn"], a["n_fail"], 12)  # ENOMEM
        probe(p, r, 8, interval_s=0.01, count=a["n"])
        settle(p, r, decided=a["n"] + 3, timeout_s=a["n"] * 0.01 + 10)
        return result(p, r)


def scenario_ah_async(a: dict) -> dict:
    """A responder answering prober A steadily when prober C, on a device it never talked to,
    starts: the reply's address handle resolves (slowly, like ARP) without stalling A's answers."""
    with (
        engine("mlx5_1", 2) as r,
        engine("mlx5_0", 1, timeout_s=2.0) as pa,
        engine("mlx5_2", 3, timeout_s=2.0) as pc,
    ):
        probe(pa, r, 7, interval_s=a["interval_s"])
        time.sleep(a["warm_s"])
        pa.drain()
        t_c = time.time_ns()
        probe(pc, r, 7, interval_s=a["interval_s"], count=a["n_c"])  # C resolves R here, itself
        time.sleep(a["run_s"])
        pa.remove_target(7)
        settle(pc, pa, r, decided=a["n_c"])
        return {
            "a": rows_json(pa.drain()),
            "c": rows_json(pc.drain()),
            "t_c_ns": t_c,
            "responder": r.stats().as_dict(),
            "responder_transport": r.transport_stats(),
        }


def scenario_many_paths(a: dict) -> dict:
    """More distinct (GID, flow label) destinations than the address-handle cache holds."""
    # each target keeps the phase it was added at, so answers come back spread over the interval
    # rather than in one burst larger than the receive queue (a UD receive queue drops silently)
    ah = a.get("address_handles", 0)
    with (
        engine("mlx5_0", 1, timeout_s=1.0, batch_window_s=0, address_handles=ah) as p,
        engine("mlx5_1", 2, address_handles=ah) as r,
    ):
        for i in range(a["n_paths"]):
            probe(p, r, i, interval_s=a["interval_s"], path_id=i, count=a["count"])
            time.sleep(a["interval_s"] / a["n_paths"])
        want = a["n_paths"] * a["count"]
        settle(p, r, decided=want, timeout_s=a["count"] * a["interval_s"] + 30)
        return result(p, r)


def main() -> None:
    name, args = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(globals()[f"scenario_{name}"](args)))


if __name__ == "__main__":
    main()
