"""The compiled engine: a thin wrapper over csrc/engine.h. The public API is skh.probe."""

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset

import os

from skh.errors import EngineError

PROBE_MIN_LEN = SKH_PROBE_MIN_LEN
PROBE_MAX_LEN = SKH_PROBE_MAX_LEN
ACK_LEN = SKH_ACK_LEN
HDR_LEN = SKH_PROTO_HDR_LEN
CAP_TX_STAMPS = SKH_TCAP_TX_STAMPS
CAP_RX_STAMPS = SKH_TCAP_RX_STAMPS
CAP_WIRE_STAMPS = SKH_TCAP_WIRE_STAMPS
MAX_TICK_NS = SKH_MAX_TICK_NS
MAX_IN_FLIGHT = SKH_MAX_IN_FLIGHT
DEFAULT_IN_FLIGHT = SKH_DEFAULT_IN_FLIGHT
MAX_ANSWER_SLOTS = SKH_MAX_ANSWER_SLOTS
ADDRESS_HANDLES_DEFAULT = SKH_ADDRESS_HANDLES_DEFAULT
ADDRESS_HANDLES_MAX = SKH_ADDRESS_HANDLES_MAX
DEFAULT_DIRECTION_WAIT_NS = SKH_DEFAULT_DIRECTION_WAIT_NS
#: bytes of one record (skh_record, static-asserted to 48 in engine.c; skh.layout.PROBE_STRUCT)
RECORD_SIZE = sizeof(skh_record)


cdef raise_errno(int rc, str what):
    err = -rc
    raise EngineError(err, f"{what}: {os.strerror(err)}")


def stat_names():
    """The engine's counter names, in the order FastEngine.stats() returns them."""
    return tuple(skh_stat_names[i].decode() for i in range(SKH_STAT__COUNT))


def transport_stat_names():
    """The transports' counter names, in the order FastEngine.transport_stats() returns them."""
    return tuple(skh_tstat_names[i].decode() for i in range(SKH_TSTAT__COUNT))


def transports():
    """{name: 0 or -errno of available()} for every registered transport."""
    cdef const skh_transport_ops *ops
    cdef unsigned i = 0
    out = {}
    while True:
        ops = skh_transport_at(i)
        if ops == NULL:
            return out
        out[ops.name.decode()] = ops.available() if ops.available != NULL else 0
        i += 1


def verbs_strerror():
    """Why the verbs transport was last found unavailable (this thread), or ''."""
    return skh_verbs_strerror().decode(errors="replace")


def proto_encode(int type, *, int flags=0, int ts_source=0, uint32_t session=0, uint32_t seq=0,
                 uint16_t path_id=0, uint32_t resp_session=0, uint64_t t1=0, uint64_t t3=0,
                 uint64_t t4=0, uint32_t stream=0, uint32_t tseq=0, uint16_t rcpt_span=0,
                 rcpt_bits=0, uint32_t probe_len=SKH_PROBE_MIN_LEN, uint32_t popts=0):
    """Encodes one message with the C encoder (for tests and tools). ``rcpt_bits`` is one int of
    up to 128 bits (bit i: probe tseq-1-i arrived)."""
    cdef skh_msg m
    cdef uint8_t buf[SKH_PROBE_MAX_LEN]
    memset(&m, 0, sizeof(m))
    m.type = <uint8_t>type
    m.flags = <uint8_t>flags
    m.ts_source = <uint8_t>ts_source
    m.session = session
    m.seq = seq
    m.path_id = path_id
    m.resp_session = resp_session
    m.t1 = t1
    m.t3 = t3
    m.t4 = t4
    m.stream = stream
    m.tseq = tseq
    m.popts = popts
    m.rcpt_span = rcpt_span
    m.rcpt_bits[0] = rcpt_bits & 0xFFFFFFFFFFFFFFFF
    m.rcpt_bits[1] = (rcpt_bits >> 64) & 0xFFFFFFFFFFFFFFFF
    rc = skh_proto_encode(&m, probe_len, buf, sizeof(buf))
    if rc < 0:
        raise_errno(rc, "proto_encode")
    return bytes(buf[:rc])


def proto_decode(const uint8_t[::1] data):
    """Decodes with the C decoder: a dict, or a negative int (-drop reason) for garbage."""
    cdef skh_msg m
    cdef const uint8_t *p = &data[0] if data.shape[0] else <const uint8_t *>b""
    rc = skh_proto_decode(p, data.shape[0], &m)
    if rc < 0:
        return rc
    return dict(type=m.type, flags=m.flags, ts_source=m.ts_source, session=m.session, seq=m.seq,
                path_id=m.path_id, resp_session=m.resp_session, t1=m.t1, t3=m.t3, t4=m.t4,
                stream=m.stream, tseq=m.tseq, popts=m.popts, rcpt_span=m.rcpt_span,
                rcpt_bits=m.rcpt_bits[0] | (<object>m.rcpt_bits[1]) << 64)


def proto_rtt(int64_t t1, int64_t t2, int src_p, int64_t t3, int64_t t4, int src_r, int64_t t5,
              int64_t t6):
    """(status, rtt_ns, responder_delay_ns, prober_delay_ns, ts_source) of the C arithmetic."""
    cdef skh_rtt r
    st = skh_proto_rtt(t1, t2, <uint8_t>src_p, t3, t4, <uint8_t>src_r, t5, t6, &r)
    return st, r.rtt_ns, r.responder_delay_ns, r.prober_delay_ns, r.ts_source


cdef class FastLoop:
    """A thread that runs the engines started on it, one after another (skh_loop)."""

    def __cinit__(self):
        self._l = NULL
        rc = skh_loop_create(&self._l)
        if rc < 0:
            self._l = NULL
            raise_errno(rc, "loop")

    def __dealloc__(self):
        # engines hold their loop: none is left on it by now
        if self._l != NULL:
            with nogil:
                skh_loop_destroy(self._l)
            self._l = NULL


cdef class FastEngine:
    """One C engine (thread, transport, ring). Arguments are validated by skh.probe.Engine."""

    def __cinit__(self, *, uint32_t endpoint_id, str transport, str bind, int port, str device,
                  int gid_index, int netns_fd, bint hw_timestamps, bint kernel_timestamps,
                  int64_t timeout_ns, uint32_t ring_records, uint32_t probe_len, uint32_t max_in_flight=0,
                  int64_t batch_window_ns=0, uint8_t traffic_class=0, uint8_t priority=0,
                  int64_t direction_wait_ns=SKH_DEFAULT_DIRECTION_WAIT_NS,
                  uint32_t address_handles=0, uint32_t answer_slots=0, int64_t tick_ns=0,
                  bint wall_grid=False):
        cdef skh_engine_cfg cfg
        cdef bytes b_transport = transport.encode()
        cdef bytes b_bind = bind.encode()
        cdef bytes b_device = device.encode() if device else b""
        memset(&cfg, 0, sizeof(cfg))
        self._e = NULL
        self.transport = transport
        cfg.endpoint_id = endpoint_id
        cfg.transport = b_transport
        cfg.tcfg.bind = b_bind
        cfg.tcfg.port = <uint16_t>port
        if device:
            cfg.tcfg.device = b_device
        cfg.tcfg.gid_index = gid_index
        cfg.tcfg.netns_fd = netns_fd
        cfg.tcfg.hw_timestamps = hw_timestamps
        cfg.tcfg.no_kernel_stamps = not kernel_timestamps
        cfg.tcfg.traffic_class = traffic_class
        cfg.tcfg.priority = priority
        cfg.tcfg.address_handles = address_handles
        cfg.timeout_ns = timeout_ns
        cfg.ring_records = ring_records
        cfg.probe_len = probe_len
        cfg.max_in_flight = max_in_flight
        cfg.answer_slots = answer_slots
        cfg.batch_window_ns = batch_window_ns
        cfg.direction_wait_ns = direction_wait_ns
        cfg.tick_ns = tick_ns
        cfg.wall_grid = wall_grid
        rc = skh_engine_create(&cfg, &self._e)
        if rc < 0:
            self._e = NULL
            detail = ""
            if transport == "verbs":
                detail = skh_verbs_strerror().decode(errors="replace")
            raise EngineError(-rc, f"cannot open the {transport} transport: {os.strerror(-rc)}"
                              + (f" ({detail})" if detail else ""))

    def __dealloc__(self):
        if self._e != NULL:
            with nogil:
                skh_engine_destroy(self._e)
            self._e = NULL

    cdef skh_engine *_live(self) except NULL:
        if self._e == NULL:
            raise EngineError(9, "the engine is closed")  # EBADF
        return self._e

    def start(self, FastLoop loop=None):
        cdef skh_engine *e = self._live()
        if loop is None:
            rc = skh_engine_start(e)
        else:
            rc = skh_engine_start_on(e, loop._l)
        if rc < 0:
            raise_errno(rc, "start")
        # the engine must not outlive its loop's thread
        self._loop = loop

    def stop(self):
        cdef skh_engine *e = self._live()
        with nogil:
            rc = skh_engine_stop(e)
        if rc < 0:
            raise_errno(rc, "stop")

    def close(self):
        cdef skh_engine *e = self._e
        self._e = NULL
        if e != NULL:
            with nogil:
                skh_engine_destroy(e)

    @property
    def closed(self):
        return self._e == NULL

    @property
    def session(self):
        return skh_engine_session(self._live())

    @property
    def caps(self):
        return skh_engine_transport_caps(self._live())

    def add_target(self, uint32_t dst_ep, str host, int port, str gid, uint32_t qpn, uint16_t path_id,
                   uint16_t n_paths, int64_t interval_ns, uint32_t count=0,
                   int64_t sample_period_ns=0, int64_t sample_phase_ns=0):
        cdef bytes b_host = host.encode()
        cdef bytes b_gid = gid.encode()
        cdef const char *c_gid = NULL
        if gid:
            c_gid = b_gid
        rc = skh_engine_add_target(self._live(), dst_ep, b_host, <uint16_t>port, c_gid, qpn, path_id,
                                   n_paths, interval_ns, count, sample_period_ns, sample_phase_ns)
        if rc < 0:
            raise_errno(rc, f"add_target({dst_ep}, {host!r})")

    def remove_target(self, uint32_t dst_ep):
        rc = skh_engine_remove_target(self._live(), dst_ep)
        if rc < 0:
            raise_errno(rc, f"remove_target({dst_ep})")

    def pending_records(self):
        return skh_engine_pending_records(self._live())

    def drain(self, size_t max_records):
        """Moves up to max_records records out of the ring into a new bytearray of packed
        records (RECORD_SIZE bytes each, the layout of skh.layout.PROBE_STRUCT): no numpy here,
        so that the overlay agent never loads it."""
        cdef skh_engine *e = self._live()
        cdef size_t n = skh_engine_pending_records(e)
        if n > max_records:
            n = max_records
        out = bytearray(n * sizeof(skh_record))
        if n == 0:
            return out
        cdef char *raw = out  # no buffer export: the bytearray may shrink below
        got = skh_engine_drain(e, <skh_record *>raw, n)
        if got < n:
            del out[got * sizeof(skh_record):]
        return out

    def stats(self):
        cdef uint64_t vals[SKH_STAT__COUNT]
        skh_engine_stats(self._live(), vals)
        return tuple(vals[i] for i in range(SKH_STAT__COUNT))

    def transport_stats(self):
        cdef uint64_t vals[SKH_TSTAT__COUNT]
        skh_engine_transport_counters(self._live(), vals)
        return tuple(vals[i] for i in range(SKH_TSTAT__COUNT))

    def local(self):
        """(kind, host or gid, port or qpn, gid_index) of the bound socket / QP."""
        cdef skh_addr a
        cdef char host[64]
        cdef uint32_t port_or_qpn = 0
        rc = skh_engine_local(self._live(), &a)
        if rc < 0:
            raise_errno(rc, "local address")
        rc = skh_addr_format(&a, host, sizeof(host), &port_or_qpn)
        if rc < 0:
            raise_errno(rc, "local address")
        return skh_addr_kind(&a), host.decode(), port_or_qpn, skh_addr_gid_index(&a)
