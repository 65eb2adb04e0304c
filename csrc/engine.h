/* The probing engine: probes targets on a schedule from a background thread, answers probes from
 * others (responder), matches replies, times out losses and writes fixed-size records into a bounded
 * ring. Plain C (no Python.h); every call returns 0 / a count, or -errno.
 *
 * Threads: an engine runs on a loop's thread, its own (skh_engine_start) or one it shares with
 * other engines (skh_engine_start_on: one wake-up serves them all, so an agent's engines, one per
 * RNIC, cost one thread's sleeps rather than eight). skh_engine_create/start/stop/destroy and the
 * skh_loop calls come from the owner; add/remove_target, drain, stats and local may come from any
 * thread while the engine runs (they take short locks or read atomics).
 */
#ifndef SKH_ENGINE_H
#define SKH_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "transport.h"

/* One probe outcome; byte-for-byte skh.records.PROBE_DTYPE (little-endian x86-64/arm64). */
struct skh_record {
    uint32_t src_ep;
    uint32_t dst_ep;
    uint32_t seq;
    uint16_t path_id;
    uint8_t status; /* enum skh_status */
    uint8_t ts_source; /* enum skh_ts_source */
    int64_t t_wall_ns;
    int64_t rtt_ns;
    int64_t responder_delay_ns;
    int64_t prober_delay_ns;
};

/* Counters, in the order Python's EngineStats lists them. The drop_* block follows
 * enum skh_drop_reason. Invariants the tests check:
 *   sent + send_errors == ok + lost + refused + unreachable + invalid + request_lost + reply_lost
 *                         + local_error + in_flight + awaiting_direction
 *   ok + ... + local_error == records + ring_overflow
 *   received == probes_received + acks_received + icmp_errors + sum(drop_*)
 */
#define SKH_STATS(X)                                                                                     \
    X(sent)                 /* probes handed to the transport */                                         \
    X(send_errors)          /* probes that never left: refused by the transport, or still waiting to */ \
                            /* be retried at their timeout (recorded LOCAL_ERROR/UNREACHABLE/...) */     \
    X(send_deferred)        /* datagrams kept for a retry after a transient local error (EAGAIN...) */   \
    X(received)             /* datagrams and error reports read */                                       \
    X(probes_received)      /* valid PROBEs answered with ACK1 (+ ACK2) */                               \
    X(replies_sent)         /* ACK1 + ACK2 sent */                                                       \
    X(reply_errors)         /* ACKs that could not be sent */                                            \
    X(replies_user_stamps)  /* ACK2s carrying user-clock T3/T4 (no kernel/NIC stamp of ACK1) */         \
    X(acks_received)        /* valid ACK1/ACK2 matched to a pending probe */                             \
    X(ok) X(lost) X(refused) X(unreachable) X(invalid)                                                   \
    X(request_lost) X(reply_lost) X(local_error) /* probe outcomes, in ProbeStatus order */             \
    X(icmp_errors)          /* error reports (ICMP unreachable) about our datagrams */                   \
    X(tx_stamps)            /* send stamps matched to a probe or ACK1 */                                 \
    X(tx_stamps_unmatched)  /* send stamps for nothing pending (arrived after a fallback) */             \
    X(clock_steps)          /* kernel stamp pairs a CLOCK_REALTIME step fell between (not used) */       \
    X(records)              /* records written to the ring */                                            \
    X(ring_overflow)        /* records lost because the ring was full */                                 \
    X(drop_truncated) X(drop_bad_magic) X(drop_bad_version) X(drop_bad_type) X(drop_malformed)           \
    X(drop_unsolicited) X(drop_replay) X(drop_late)                                                      \
    X(in_flight)            /* gauge: probes sent, waiting for their answers or their timeout */         \
    X(awaiting_direction)   /* gauge: unanswered probes whose record waits for a later answer's */      \
                            /* receipts to say which direction lost them */                              \
    X(inflight_full)        /* times a due probe waited because the in-flight table was full */         \
    X(wakeups)              /* turns of the loop it runs on (it sleeps between events; engines */      \
                            /* sharing a loop each count its turns) */                                   \
    X(probes_no_rtt)        /* probes that asked for no RTT (not a latency sample: one answer) */

enum skh_stat {
#define SKH_STAT_ENUM(name) SKH_STAT_##name,
    SKH_STATS(SKH_STAT_ENUM)
#undef SKH_STAT_ENUM
    SKH_STAT__COUNT
};

extern const char *const skh_stat_names[SKH_STAT__COUNT];

struct skh_engine_cfg {
    uint32_t endpoint_id;
    const char *transport; /* registered transport name ("udp", "verbs") */
    struct skh_transport_cfg tcfg;
    int64_t timeout_ns; /* a probe without both replies by then is decided */
    uint32_t ring_records; /* ring capacity (rounded up to a power of two) */
    uint32_t probe_len; /* PROBE datagram size, SKH_PROBE_MIN_LEN..SKH_PROBE_MAX_LEN */
    uint32_t max_in_flight; /* probes awaiting a decision before due probes wait; 0 = the default */
    /* Answered probes whose second reply waits for the first's send stamp (at most 10 ms each);
     * when all are taken the oldest gives up its stamp. 0 = SKH_MAX_ANSWER_SLOTS, the most. */
    uint32_t answer_slots;
    /* Batching: a target's probes fall on multiples of its interval (after the first, sent at once),
     * so targets sharing an interval fall due together however far apart they were added; and a
     * target whose next probe is due within this much of a send batch joins it (one probe early, its
     * cadence kept). One wake-up and one send call per round of a target list rather than one per
     * target. 0 = exact schedule: each target keeps the phase it was added with. */
    int64_t batch_window_ns;
    /* How long past its timeout an unanswered probe's record may wait for a later answer whose
     * receipts say which direction lost it (proto.h); then it is LOST. Records of loss are late by
     * at most this. 0 (the default) = never wait: a loss is REQUEST_LOST/REPLY_LOST when the
     * receipts are there at its timeout -- at probe intervals well below the timeout they usually
     * are -- and LOST otherwise; agents need their records at the analyzer within its allowed
     * lateness, which a wait would eat into. */
    int64_t direction_wait_ns;
    /* The engine thread wakes up at most once per tick: what arrives within a tick of its last
     * wake-up (peers' probes, answers, send stamps) waits for the tick's end and is handled in one
     * turn, with one receive and one send call per socket, not one wake-up per datagram. RTTs do
     * not move (their stamps are taken by the kernel or the NIC as the datagrams pass); what does
     * move, by up to a tick: the responder delay (ACK1 leaves later), the prober delay (ACK1 is
     * read later), send times (a due probe waits) and decisions at timeouts. Only with stamps
     * taken on the wire (transport cap SKH_TCAP_WIRE_STAMPS): with user-clock stamps, taken
     * when a datagram is read, the wait would be in the RTT, so the tick is not applied. 0 (the
     * default) = wake up for every event; at most SKH_MAX_TICK_NS. */
    int64_t tick_ns;
    /* Nonzero: the batching grid starts at the wall clock's epoch (CLOCK_REALTIME), not at a
     * random point of this engine's, so engines on hosts whose clocks agree send their batches at
     * the same instants and a responder gets its peers' probes of one interval together, in one
     * wake-up, instead of one by one. Every such engine probes in step with every other: the
     * network is sampled at the same instants everywhere. Needs batch_window_ns > 0. */
    int wall_grid;
};

#define SKH_DEFAULT_DIRECTION_WAIT_NS 0LL
/* Half the 10 ms a responder waits for its ACK1's send stamp before answering ACK2 without it:
 * a stamp that comes a tick after its datagram left is still awaited. */
#define SKH_MAX_TICK_NS (5LL * 1000LL * 1000LL)

/* Probes one engine keeps undecided, the default and the most. The in-flight table is sized from it
 * and decided in send order, so it must hold probes/s x timeout_s (a lost probe keeps its place until
 * its timeout); every slot gets touched as sequence numbers cycle, so a generous limit costs resident
 * memory (about 128 B a slot) for the engine's life. */
#define SKH_DEFAULT_IN_FLIGHT 2048u
#define SKH_MAX_IN_FLIGHT 65536u
#define SKH_MAX_ANSWER_SLOTS 1024u

struct skh_engine;
struct skh_loop;

int skh_engine_create(const struct skh_engine_cfg *cfg, struct skh_engine **out);
/* Runs e on a thread of its own. */
int skh_engine_start(struct skh_engine *e);
/* Runs e on l's thread, turn by turn with l's other engines; the thread waits for the shortest
 * tick among them. The thread starts with its first engine and ends when its last one stops.
 * -EBUSY when e runs on another loop. */
int skh_engine_start_on(struct skh_engine *e, struct skh_loop *l);
/* Once it returns the thread no longer touches e (its own thread is joined); pending probes stay
 * pending, and a start goes on with them. */
int skh_engine_stop(struct skh_engine *e);
void skh_engine_destroy(struct skh_engine *e);
int skh_loop_create(struct skh_loop **out);
/* Stops the engines still on l, then ends its thread. */
void skh_loop_destroy(struct skh_loop *l);

/* Adds (or replaces, same dst_ep) a target probed every interval_ns, first probe at once; after
 * count probes (0 = no limit) the target retires by itself. Its probes rotate over the n_paths path
 * ids path_id .. path_id + n_paths - 1 (ECMP paths: UDP source ports, RoCE flow labels), probe k of
 * its stream on path_id + k % n_paths; a target added again keeps its stream and its place in the
 * rotation. -EINVAL for n_paths 0 or ids past 65535; a transport's limit on paths (UDP: 64 path ids
 * per engine, -ENOSPC) fails the whole call. With sample_period_ns > 0 only the probes whose OK
 * could be the pair's latency sample (one per period, skh.analysis.sampling.period_samples; its
 * periods start at sample_phase_ns, in [0, sample_period_ns)) ask for an RTT; the others ask the
 * responder for one answer (SKH_POPT_NO_T34), take no send stamp, and are recorded OK with
 * rtt_ns -1. 0 = every probe asks. */
int skh_engine_add_target(struct skh_engine *e, uint32_t dst_ep, const char *host, uint16_t port,
                          const char *gid, uint32_t qpn, uint16_t path_id, uint16_t n_paths,
                          int64_t interval_ns, uint32_t count, int64_t sample_period_ns,
                          int64_t sample_phase_ns);
/* -ENOENT when absent. Probes already in flight are still decided and recorded. */
int skh_engine_remove_target(struct skh_engine *e, uint32_t dst_ep);

size_t skh_engine_pending_records(struct skh_engine *e);
/* Copies up to max records out of the ring (oldest first); returns how many. */
size_t skh_engine_drain(struct skh_engine *e, struct skh_record *out, size_t max);
void skh_engine_stats(struct skh_engine *e, uint64_t out[SKH_STAT__COUNT]);
/* The transport's own counters (SKH_TSTATS; zeros for those it does not keep). */
void skh_engine_transport_counters(struct skh_engine *e, uint64_t out[SKH_TSTAT__COUNT]);
int skh_engine_local(struct skh_engine *e, skh_addr *out);
unsigned skh_engine_transport_caps(struct skh_engine *e);
uint32_t skh_engine_session(struct skh_engine *e);

#endif
