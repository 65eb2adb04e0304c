"""Type stubs of the compiled engine wrapper (skh/_fastprobe.pyx). Use skh.probe instead."""

import numpy as np

PROBE_MIN_LEN: int
PROBE_MAX_LEN: int
ACK_LEN: int
HDR_LEN: int
CAP_TX_STAMPS: int
CAP_RX_STAMPS: int
MAX_IN_FLIGHT: int
DEFAULT_IN_FLIGHT: int
ADDRESS_HANDLES_DEFAULT: int
ADDRESS_HANDLES_MAX: int
DEFAULT_DIRECTION_WAIT_NS: int

def stat_names() -> tuple[str, ...]: ...
def transport_stat_names() -> tuple[str, ...]: ...
def transports() -> dict[str, int]: ...
def verbs_strerror() -> str: ...
def proto_encode(
    type: int,
    *,
    flags: int = 0,
    ts_source: int = 0,
    session: int = 0,
    seq: int = 0,
    path_id: int = 0,
    resp_session: int = 0,
    t1: int = 0,
    t3: int = 0,
    t4: int = 0,
    stream: int = 0,
    tseq: int = 0,
    rcpt_span: int = 0,
    rcpt_bits: int = 0,
    probe_len: int = ...,
    popts: int = 0,
) -> bytes: ...
def proto_decode(data: bytes | bytearray | memoryview) -> dict[str, int] | int: ...
def proto_rtt(
    t1: int, t2: int, src_p: int, t3: int, t4: int, src_r: int, t5: int, t6: int
) -> tuple[int, int, int, int, int]: ...

class FastLoop:
    def __init__(self) -> None: ...

class FastEngine:
    transport: str
    def __init__(
        self,
        *,
        endpoint_id: int,
        transport: str,
        bind: str,
        port: int,
        device: str,
        gid_index: int,
        netns_fd: int,
        hw_timestamps: bool,
        kernel_timestamps: bool,
        timeout_ns: int,
        ring_records: int,
        probe_len: int,
        max_in_flight: int = 0,
        batch_window_ns: int = 0,
        traffic_class: int = 0,
        priority: int = 0,
        direction_wait_ns: int = ...,
        address_handles: int = 0,
        answer_slots: int = 0,
        tick_ns: int = 0,
        wall_grid: bool = False,
    ) -> None: ...
    def start(self, loop: FastLoop | None = None) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def session(self) -> int: ...
    @property
    def caps(self) -> int: ...
    def add_target(
        self,
        dst_ep: int,
        host: str,
        port: int,
        gid: str,
        qpn: int,
        path_id: int,
        n_paths: int,
        interval_ns: int,
        count: int = 0,
        sample_period_ns: int = 0,
        sample_phase_ns: int = 0,
    ) -> None: ...
    def remove_target(self, dst_ep: int) -> None: ...
    def pending_records(self) -> int: ...
    def drain(self, max_records: int) -> np.ndarray: ...
    def stats(self) -> tuple[int, ...]: ...
    def transport_stats(self) -> tuple[int, ...]: ...
    def local(self) -> tuple[int, str, int, int]: ...
