# C declarations of the engine (csrc/engine.h, csrc/proto.h, csrc/transport.h) for _fastprobe.pyx.
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "proto.h" nogil:
    enum:
        SKH_PROTO_HDR_LEN
        SKH_ACK_LEN
        SKH_PROBE_MIN_LEN
        SKH_PROBE_MAX_LEN
        SKH_DROP__COUNT

    struct skh_msg:
        uint8_t type
        uint8_t flags
        uint8_t ts_source
        uint16_t path_id
        uint32_t session
        uint32_t seq
        uint32_t resp_session
        uint64_t t1
        uint64_t t3
        uint64_t t4
        uint32_t stream
        uint32_t tseq
        uint32_t popts
        uint16_t rcpt_span
        uint64_t rcpt_bits[2]

    struct skh_rtt:
        int64_t rtt_ns
        int64_t responder_delay_ns
        int64_t prober_delay_ns
        uint8_t ts_source

    int skh_proto_encode(const skh_msg *msg, uint32_t probe_len, uint8_t *buf, size_t cap)
    int skh_proto_decode(const uint8_t *buf, size_t len, skh_msg *out)
    int skh_proto_rtt(int64_t t1, int64_t t2, uint8_t src_p, int64_t t3, int64_t t4, uint8_t src_r,
                      int64_t t5, int64_t t6, skh_rtt *out)


cdef extern from "transport.h" nogil:
    ctypedef struct skh_addr:
        pass

    struct skh_transport_cfg:
        const char *bind
        uint16_t port
        const char *device
        int gid_index
        int netns_fd
        int hw_timestamps
        int no_kernel_stamps
        uint8_t traffic_class
        uint8_t priority
        uint32_t address_handles

    enum:
        SKH_ADDRESS_HANDLES_DEFAULT
        SKH_ADDRESS_HANDLES_MAX

    struct skh_transport_ops:
        const char *name
        int (*available)()

    const skh_transport_ops *skh_transport_at(unsigned i)
    int skh_addr_kind(const skh_addr *addr)
    int skh_addr_gid_index(const skh_addr *addr)
    int skh_addr_format(const skh_addr *addr, char *host, size_t host_len, uint32_t *port_or_qpn)
    enum:
        SKH_TCAP_TX_STAMPS
        SKH_TCAP_RX_STAMPS
        SKH_TCAP_WIRE_STAMPS
        SKH_TSTAT__COUNT
    const char *const skh_tstat_names[]


cdef extern from "verbs.h" nogil:
    const char *skh_verbs_strerror()


cdef extern from "engine.h" nogil:
    struct skh_record:
        pass

    enum:
        SKH_STAT__COUNT
        SKH_MAX_IN_FLIGHT
        SKH_DEFAULT_IN_FLIGHT
        SKH_MAX_ANSWER_SLOTS
    int64_t SKH_DEFAULT_DIRECTION_WAIT_NS
    int64_t SKH_MAX_TICK_NS

    const char *const skh_stat_names[]

    struct skh_engine_cfg:
        uint32_t endpoint_id
        const char *transport
        skh_transport_cfg tcfg
        int64_t timeout_ns
        uint32_t ring_records
        uint32_t probe_len
        uint32_t max_in_flight
        uint32_t answer_slots
        int64_t batch_window_ns
        int64_t direction_wait_ns
        int64_t tick_ns
        int wall_grid

    struct skh_engine:
        pass

    struct skh_loop:
        pass

    int skh_engine_create(const skh_engine_cfg *cfg, skh_engine **out)
    int skh_engine_start(skh_engine *e)
    int skh_engine_start_on(skh_engine *e, skh_loop *l)
    int skh_loop_create(skh_loop **out)
    void skh_loop_destroy(skh_loop *l)
    int skh_engine_stop(skh_engine *e)
    void skh_engine_destroy(skh_engine *e)
    int skh_engine_add_target(skh_engine *e, uint32_t dst_ep, const char *host, uint16_t port,
                              const char *gid, uint32_t qpn, uint16_t path_id, uint16_t n_paths,
                              int64_t interval_ns, uint32_t count, int64_t sample_period_ns,
                              int64_t sample_phase_ns)
    int skh_engine_remove_target(skh_engine *e, uint32_t dst_ep)
    size_t skh_engine_pending_records(skh_engine *e)
    size_t skh_engine_drain(skh_engine *e, skh_record *out, size_t max)
    void skh_engine_stats(skh_engine *e, uint64_t *out)
    void skh_engine_transport_counters(skh_engine *e, uint64_t *out)
    int skh_engine_local(skh_engine *e, skh_addr *out)
    unsigned skh_engine_transport_caps(skh_engine *e)
    uint32_t skh_engine_session(skh_engine *e)


cdef class FastLoop:
    cdef skh_loop *_l


cdef class FastEngine:
    cdef skh_engine *_e
    cdef FastLoop _loop
    cdef readonly str transport
    cdef skh_engine *_live(self) except NULL
