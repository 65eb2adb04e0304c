#include "engine.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "receipts.h"

_Static_assert(sizeof(struct skh_record) == 48, "skh_record must match skh.records.PROBE_DTYPE");
_Static_assert(SKH_ST_LOCAL_ERROR == 7, "statuses are skh.records.ProbeStatus");

const char *const skh_stat_names[SKH_STAT__COUNT] = {
#define SKH_STAT_NAME(name) #name,
    SKH_STATS(SKH_STAT_NAME)
#undef SKH_STAT_NAME
};

#define BATCH 64
#define SEND_ROUNDS 4 /* probe batches per loop turn, so a long due list cannot starve receiving */
#define RECV_ROUNDS 8
#define TXMAP_CAP 4096 /* tx_id -> owner of a send stamp still to come (power of two) */
#define PARK_CAP 4096 /* lost probes waiting to learn their direction (power of two) */
#define DEFER_CAP 1024 /* datagrams waiting to be sent again after a transient local error */
#define RCPT_STREAMS 4096 /* prober streams a responder remembers receipts of */
#define DEFER_RETRY_NS (1000LL * 1000LL) /* retry deferred sends every 1 ms */
/* An ACK is given up after waiting this long to leave (for the address handle of a new prober: ARP
 * takes ~1 s on first contact); later than a prober's timeout it would only be late anyway. */
#define ACK_DEFER_NS (1000LL * 1000LL * 1000LL)
/* Offsets CLOCK_REALTIME - CLOCK_MONOTONIC read apart farther than this (beyond the reads' own
 * spread) mean a step of the realtime clock: both run at one rate, only steps move the offset. */
#define STEP_SLACK_NS 2000LL

/* Slot of a tx_id: consecutive ids of one source never collide; transports that put a source index in
 * the high byte (UDP path sockets) get each source offset, so lock-step sources do not collide. */
static inline unsigned txslot(uint32_t tx_id)
{
    return (tx_id + (tx_id >> 24) * 7919u) & (TXMAP_CAP - 1);
}
/* How long a responder waits for the send stamp of ACK1 before answering ACK2 with user stamps. */
#define T4_WAIT_NS (10LL * 1000000LL)

/* A probe's life in the in-flight table: PENDING until decided; DONE (recorded), DONE_LOST (recorded
 * as loss: a later answer is "late") or PARKED (its record waits in the park for its direction). */
enum slot_state { SLOT_FREE = 0, SLOT_PENDING, SLOT_DONE, SLOT_DONE_LOST, SLOT_PARKED };
#define HAVE_ACK1 0x1u
#define HAVE_ACK2 0x2u
#define HAVE_T34 0x4u

/* CLOCK_REALTIME - CLOCK_MONOTONIC as read around one moment: somewhere in [lo, hi]. */
struct rt_off {
    int64_t lo, hi;
};

struct slot {
    uint32_t wire_seq;
    uint8_t state;
    uint8_t have;
    uint8_t t2_src, t5_src, t34_src;
    uint8_t deferred; /* waiting in the retry queue: not on the wire yet */
    uint8_t stepped; /* CLOCK_REALTIME stepped between T1 and reading ACK1 */
    uint8_t rx_reset; /* our own receive path was reset while it waited: missing answers are ours */
    uint8_t no_t34; /* asked for no RTT (SKH_POPT_NO_T34): done at ACK1, no send stamp taken */
    uint16_t path_id;
    uint32_t dst_ep;
    uint32_t tgt_seq;
    uint32_t stream, tidx; /* the target's receipt stream and its index in the target table */
    uint32_t resp_session;
    uint32_t park; /* index in the park while PARKED */
    int64_t t1, t_wall, t2, t2u, t5, t5u, t3, t4; /* decided at t1 + timeout at the latest */
    struct rt_off off1;
};

/* What the prober has learnt about one target's stream from its responder's receipts (engine
 * thread only; indexed like the target table). */
struct tstate {
    uint32_t stream;
    uint32_t ev_tseq; /* the newest answered probe that carried receipts */
    uint16_t ev_span;
    uint8_t have_ev;
    uint8_t no_rcpt; /* the responder answers without receipts (an older engine) */
    uint64_t ev_bits[2];
    uint32_t parked; /* park entries of this stream */
};

/* A lost probe whose record waits to learn which direction lost it. */
struct park {
    uint8_t live;
    uint8_t linked; /* its slot is still SLOT_PARKED (not yet reused by a newer probe) */
    uint16_t path_id;
    uint32_t wire_seq, dst_ep, tgt_seq, stream, tidx;
    int64_t t_wall, horizon;
};

enum resp_state { RESP_FREE = 0, RESP_WAITING, RESP_DONE };

struct resp_entry {
    uint32_t idx; /* position in the responder ring (entries are reused) */
    uint8_t state;
    uint8_t t3_src;
    uint8_t sent; /* ACK1 left (t4u is its user send time) */
    uint32_t tx_id;
    struct skh_msg probe;
    skh_addr to;
    int64_t t3, t3u, t4u, deadline;
    struct rt_off off3;
};

enum tx_kind { TX_NONE = 0, TX_PROBE, TX_ACK1 };

struct txmap_entry {
    uint32_t tx_id;
    uint8_t kind;
    uint32_t ref; /* TX_PROBE: wire seq; TX_ACK1: responder ring index */
};

struct target {
    uint32_t dst_ep;
    uint16_t path_id; /* the first path id of the rotation */
    uint16_t n_paths; /* probe k takes path_id + k % n_paths (its stream's k: tgt_seq) */
    uint8_t active;
    uint8_t on_grid; /* next_due follows the interval's grid (batching), set after the first probe */
    uint32_t seq;
    uint32_t stream; /* receipt stream id of this probe sequence (new whenever seq restarts) */
    uint32_t remaining; /* probes left to send; 0 = no limit */
    int64_t interval_ns;
    int64_t next_due;
    skh_addr *addrs; /* one per path of the rotation (kept while inactive; freed when replaced) */
    /* the pair's latency sample (skh.analysis.sampling.period_samples, mirrored: sample_wants):
     * period 0 = every probe asks for its RTT */
    int64_t sample_period_ns, sample_phase_ns;
    int64_t sample_done; /* newest period sampled */
    uint32_t sample_want; /* path id wanted next */
    uint32_t ok_next; /* stream number after the newest answered probe's */
};

struct outq { /* datagrams queued for one send() batch */
    struct skh_txpkt pkt[BATCH];
    uint8_t *buf; /* BATCH x probe_len: a datagram is a probe or a reply, never longer */
    uint32_t ref[BATCH]; /* wire seq (probes) or responder index (ACK1) */
    uint8_t kind[BATCH];
    int64_t deadline[BATCH]; /* for a retried datagram: when to give up */
    skh_addr dst[BATCH];
    unsigned n;
};

struct deferred { /* a datagram kept for another try; its bytes are in defer_buf */
    uint8_t kind;
    uint8_t want_stamp;
    uint32_t ref, len;
    int64_t deadline;
    skh_addr dst;
};

struct skh_engine {
    struct skh_engine_cfg cfg;
    const struct skh_transport_ops *ops;
    struct skh_transport *tr;
    unsigned caps;
    int64_t tick_ns; /* cfg.tick_ns where the transport stamps on the wire, else 0 */
    int wake_fd;
    uint32_t session;
    int64_t grid_ns; /* origin of the batching grid (random, or the wall clock's epoch) */

    struct skh_loop *loop; /* the loop whose thread runs it (set by the owner: start, stop) */
    struct skh_loop *own_loop; /* the loop skh_engine_start made for it alone */
    int rx_again; /* its last turn left a whole batch in a receive queue */

    pthread_mutex_t tlock; /* targets */
    struct target *targets;
    size_t n_targets, cap_targets;
    uint32_t next_stream;

    /* prober */
    struct slot *slots; /* indexed by wire seq & slot_mask */
    uint32_t slot_mask;
    uint32_t next_seq, tail_seq;
    uint64_t pending; /* slots in SLOT_PENDING */
    uint64_t deferred_probes; /* of those, not sent yet */
    int blocked; /* the last send_due left due probes behind for the in-flight limit */
    struct tstate *tstate;
    size_t n_tstate;
    struct park *park;
    uint32_t park_head, park_tail;
    uint64_t parked; /* live park entries */
    int park_dirty; /* something happened that may decide a parked probe */
    /* responder */
    struct resp_entry *resp;
    uint32_t resp_head, resp_tail, resp_mask;
    struct txmap_entry *txmap;
    struct skh_rcpt_table *rcpt;
    /* datagrams to retry, oldest first */
    struct deferred *defer;
    uint8_t *defer_buf; /* DEFER_CAP x probe_len */
    uint32_t defer_head, defer_tail;
    int64_t defer_next;

    /* ring: producer = engine thread, consumer = drain() under dlock */
    struct skh_record *ring;
    uint32_t ring_mask;
    _Atomic uint64_t ring_head, ring_tail;
    pthread_mutex_t dlock;

    _Atomic uint64_t stats[SKH_STAT__COUNT];

    /* scratch of the engine thread */
    struct outq out;
    struct skh_rxpkt rx[BATCH];
    uint8_t rxbuf[BATCH][SKH_PROBE_MAX_LEN + 1];
    struct skh_txstamp st[BATCH];
};

static int64_t now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t mono(void) { return now_ns(CLOCK_MONOTONIC); }

/* The realtime clock's offset now; *mono_out gets the monotonic time read first, *real_out the
 * realtime read, *mono_last the monotonic time read last. */
static struct rt_off rt_offset(int64_t *mono_out, int64_t *real_out, int64_t *mono_last)
{
    int64_t m0 = mono(), r = now_ns(CLOCK_REALTIME), m1 = mono();
    if (mono_out)
        *mono_out = m0;
    if (real_out)
        *real_out = r;
    if (mono_last)
        *mono_last = m1;
    return (struct rt_off){.lo = r - m1, .hi = r - m0};
}

static int rt_stepped(struct rt_off a, struct rt_off b)
{
    return b.lo > a.hi + STEP_SLACK_NS || b.hi < a.lo - STEP_SLACK_NS;
}

static void inc(struct skh_engine *e, enum skh_stat s, uint64_t by)
{
    /* single writer: a relaxed load+store is enough and cheaper than a locked add */
    atomic_store_explicit(&e->stats[s], atomic_load_explicit(&e->stats[s], memory_order_relaxed) + by,
                          memory_order_relaxed);
}

static void gauge(struct skh_engine *e, enum skh_stat s, uint64_t v)
{
    atomic_store_explicit(&e->stats[s], v, memory_order_relaxed);
}

static uint32_t pow2_at_least(uint32_t v)
{
    uint32_t p = 1;
    while (p < v && p < (1u << 30))
        p <<= 1;
    return p;
}

static int transient(int err)
{
    return err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || err == ENOMEM ||
           err == EINPROGRESS || err == EBUSY;
}

/* ------------------------------------------------------------------------------------------------ */
/* records */

static void emit(struct skh_engine *e, uint32_t dst_ep, uint32_t seq, uint16_t path_id, int64_t t_wall,
                 uint8_t status, const struct skh_rtt *r)
{
    static const enum skh_stat by_status[] = {
        SKH_STAT_ok,           SKH_STAT_lost,         SKH_STAT_refused,    SKH_STAT_unreachable,
        SKH_STAT_invalid,      SKH_STAT_request_lost, SKH_STAT_reply_lost, SKH_STAT_local_error,
    };
    inc(e, by_status[status], 1);
    uint64_t head = atomic_load_explicit(&e->ring_head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&e->ring_tail, memory_order_acquire);
    if (head - tail > e->ring_mask) {
        inc(e, SKH_STAT_ring_overflow, 1);
        return;
    }
    struct skh_record *rec = &e->ring[head & e->ring_mask];
    rec->src_ep = e->cfg.endpoint_id;
    rec->dst_ep = dst_ep;
    rec->seq = seq;
    rec->path_id = path_id;
    rec->status = status;
    rec->ts_source = r ? r->ts_source : SKH_TS_NONE;
    rec->t_wall_ns = t_wall;
    rec->rtt_ns = r ? r->rtt_ns : -1;
    rec->responder_delay_ns = r ? r->responder_delay_ns : -1;
    rec->prober_delay_ns = r ? r->prober_delay_ns : -1;
    atomic_store_explicit(&e->ring_head, head + 1, memory_order_release);
    inc(e, SKH_STAT_records, 1);
}

static void leave_pending(struct skh_engine *e, struct slot *s)
{
    e->pending--;
    if (s->deferred) {
        s->deferred = 0;
        e->deferred_probes--;
    }
}

/* Records a probe that ended without its answers, or with a status the network gave (ICMP). */
static void finish_status(struct skh_engine *e, struct slot *s, uint8_t status)
{
    leave_pending(e, s);
    int lossy = status == SKH_ST_LOST || status == SKH_ST_REQUEST_LOST || status == SKH_ST_REPLY_LOST;
    s->state = lossy ? SLOT_DONE_LOST : SLOT_DONE;
    emit(e, s->dst_ep, s->tgt_seq, s->path_id, s->t_wall, status, NULL);
}

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static int64_t mod_n(int64_t a, int64_t n)
{
    int64_t r = a % n;
    return r < 0 ? r + n : r;
}

/* Whether an OK of this probe (sent at wall time tw on path id x) could be its pair's latency
 * sample under skh.analysis.sampling.period_samples, the rule the agent's thinner and the
 * analyzer apply to the records: the first OK of a period not sampled yet that is on the path id
 * the pair wants, or, past a quarter of the period, any OK when the wanted id was lost or will not
 * come in the period. Only those probes ask for an RTT (the others for one answer, no stamps);
 * the engine knows its own interval and rotation, which the rule estimates from the records.
 * *step: the sample moves the wanted id on. Engine thread, under tlock. */
static int sample_wants(const struct target *t, int64_t tw, int64_t x, int *step)
{
    int64_t period = t->sample_period_ns, iv = t->interval_ns;
    *step = 0;
    if (period <= 0 || iv * 4 >= 3 * period) /* unsampled, or slow: every OK is a sample */
        return 1;
    int64_t since = tw - t->sample_phase_ns;
    int64_t slot = floor_div(since, period);
    if (slot <= t->sample_done)
        return 0;
    int64_t n = (int64_t)t->path_id + t->n_paths; /* the rule's rotation: the largest id + 1 */
    int64_t want = t->sample_want % n;
    int64_t p_start = t->sample_phase_ns + slot * period;
    int turn = x == want;
    int missed = !turn && tw - mod_n(x - want, n) * iv >= p_start + iv / 2;
    int coming = tw + mod_n(want - x, n) * iv < p_start + period - iv / 2;
    int late = since - slot * period >= period / 4;
    *step = turn || missed;
    return turn || (late && (missed || !coming));
}

/* Whether a probe about to leave asks for an RTT: it may be the latency sample, or the probe
 * before it has not been answered (lost, or the responder stalled): the OK that ends a run of
 * failures must carry the responder's delay, the fast path's evidence of a stall
 * (skh.analysis.fastpath, stall_evidence_ms). Engine thread, under tlock. */
static int probe_asks(const struct target *t, const struct slot *s)
{
    int step;
    return s->tgt_seq != t->ok_next || sample_wants(t, s->t_wall, s->path_id, &step);
}

/* A probe answered OK (with_rtt: with its RTT): the target's run of answers goes on; if it is the
 * sample the rule takes, its period is done (and the wanted id moves on), so the period's later
 * probes ask for no RTT. */
static void target_answered(struct skh_engine *e, const struct slot *s, int with_rtt)
{
    pthread_mutex_lock(&e->tlock);
    struct target *t = s->tidx < e->n_targets ? &e->targets[s->tidx] : NULL;
    if (t && t->active && t->dst_ep == s->dst_ep && t->stream == s->stream) {
        if ((int32_t)(s->tgt_seq + 1u - t->ok_next) > 0)
            t->ok_next = s->tgt_seq + 1u;
        int step;
        if (with_rtt && t->sample_period_ns > 0 && sample_wants(t, s->t_wall, s->path_id, &step)) {
            int64_t n = (int64_t)t->path_id + t->n_paths;
            if (step)
                t->sample_want = (uint32_t)((t->sample_want % n + 1) % n);
            t->sample_done = floor_div(s->t_wall - t->sample_phase_ns, t->sample_period_ns);
        }
    }
    pthread_mutex_unlock(&e->tlock);
}

/* Records a probe both answers of which arrived: OK, or INVALID when the stamps cannot be used. */
static void finish_answered(struct skh_engine *e, struct slot *s)
{
    leave_pending(e, s);
    s->state = SLOT_DONE;
    /* each difference on one clock: the kernel/NIC pair when both stamps share a clock, else user */
    int64_t t2 = s->t2u, t5 = s->t5u;
    uint8_t src_p = SKH_TS_USER;
    if (s->t2_src != SKH_TS_NONE && s->t2_src == s->t5_src) {
        t2 = s->t2;
        t5 = s->t5;
        src_p = s->t2_src;
    }
    struct skh_rtt r;
    if (s->no_t34) { /* answered, and no RTT was asked for */
        r = (struct skh_rtt){.rtt_ns = -1, .responder_delay_ns = -1, .prober_delay_ns = -1};
        target_answered(e, s, 0);
        emit(e, s->dst_ep, s->tgt_seq, s->path_id, s->t_wall, SKH_ST_OK, &r);
        return;
    }
    uint8_t src_r = (s->have & HAVE_T34) ? s->t34_src : SKH_TS_NONE;
    /* T6: when the engine read ACK1, the datagram T5 stamps */
    int st = skh_proto_rtt(s->t1, t2, src_p, s->t3, s->t4, src_r, t5, s->t5u, &r);
    if (st == SKH_ST_OK && src_p == SKH_TS_KERNEL && s->stepped) {
        /* kernel software stamps are CLOCK_REALTIME: a step between T2 and T5 is in T5-T2 */
        inc(e, SKH_STAT_clock_steps, 1);
        st = SKH_ST_INVALID;
        r.rtt_ns = -1;
        r.prober_delay_ns = -1;
    }
    if (st == SKH_ST_OK)
        target_answered(e, s, 1);
    emit(e, s->dst_ep, s->tgt_seq, s->path_id, s->t_wall, (uint8_t)st, &r);
}

/* ------------------------------------------------------------------------------------------------ */
/* direction of a loss: receipts (proto.h) */

enum { DIR_WAIT = 0xff };

/* What the target's receipts say about its probe tseq that got no answer: REQUEST_LOST, REPLY_LOST,
 * LOST (nothing will tell), or DIR_WAIT (a later answer may still tell). */
static uint8_t direction(const struct skh_engine *e, uint32_t tidx, uint32_t stream, uint32_t tseq)
{
    if (tidx >= e->n_tstate || e->tstate[tidx].stream != stream)
        return SKH_ST_LOST; /* the target was replaced: its old stream gets no more answers */
    const struct tstate *ts = &e->tstate[tidx];
    if (ts->no_rcpt)
        return SKH_ST_LOST;
    if (ts->have_ev) {
        int32_t back = (int32_t)(ts->ev_tseq - tseq);
        if (back > 0) {
            if ((uint32_t)back > ts->ev_span)
                return SKH_ST_LOST; /* the responder did not know the stream back then */
            unsigned i = (unsigned)back - 1;
            return (ts->ev_bits[i / 64] >> (i % 64)) & 1 ? SKH_ST_REPLY_LOST : SKH_ST_REQUEST_LOST;
        }
    }
    return DIR_WAIT;
}

/* The receipt state of slot s's stream; NULL when its target index has moved on to a newer stream. */
static struct tstate *tstate_of(struct skh_engine *e, const struct slot *s)
{
    if (s->tidx >= e->n_tstate)
        return NULL;
    struct tstate *ts = &e->tstate[s->tidx];
    if (ts->stream != s->stream) {
        if (ts->stream && (int32_t)(s->stream - ts->stream) < 0)
            return NULL;
        /* first event of a new stream on this target index: the old stream's parked probes get no
         * more answers (direction() now says LOST for them) */
        if (ts->parked)
            e->park_dirty = 1;
        memset(ts, 0, sizeof(*ts));
        ts->stream = s->stream;
    }
    return ts;
}

static void park_emit(struct skh_engine *e, struct park *p, uint8_t status)
{
    p->live = 0;
    e->parked--;
    if (p->tidx < e->n_tstate && e->tstate[p->tidx].stream == p->stream)
        e->tstate[p->tidx].parked--;
    struct slot *s = &e->slots[p->wire_seq & e->slot_mask];
    if (p->linked && s->state == SLOT_PARKED && s->wire_seq == p->wire_seq)
        s->state = SLOT_DONE_LOST;
    emit(e, p->dst_ep, p->tgt_seq, p->path_id, p->t_wall, status, NULL);
}

/* Decides parked probes that can be decided (or that waited past their horizon). */
static void park_sweep(struct skh_engine *e, int64_t now, int64_t *next)
{
    e->park_dirty = 0;
    for (uint32_t i = e->park_tail; i != e->park_head; i++) {
        struct park *p = &e->park[i & (PARK_CAP - 1)];
        if (!p->live)
            continue;
        uint8_t d = direction(e, p->tidx, p->stream, p->tgt_seq);
        if (d == DIR_WAIT && now >= p->horizon)
            d = SKH_ST_LOST;
        if (d != DIR_WAIT)
            park_emit(e, p, d);
        else if (p->horizon < *next)
            *next = p->horizon;
    }
    while (e->park_tail != e->park_head && !e->park[e->park_tail & (PARK_CAP - 1)].live)
        e->park_tail++;
}

/* A probe reached its timeout without any answer. */
static void finish_unanswered(struct skh_engine *e, struct slot *s, int64_t now)
{
    struct tstate *ts = tstate_of(e, s);
    uint8_t d = ts ? direction(e, s->tidx, s->stream, s->tgt_seq) : SKH_ST_LOST;
    if (d == DIR_WAIT && e->cfg.direction_wait_ns == 0)
        d = SKH_ST_LOST;
    if (d != DIR_WAIT) {
        finish_status(e, s, d);
        return;
    }
    if (!e->park && !(e->park = calloc(PARK_CAP, sizeof(*e->park)))) {
        finish_status(e, s, SKH_ST_LOST); /* no memory to wait in */
        return;
    }
    if (e->park_head - e->park_tail == PARK_CAP) {
        /* full: the oldest gives up waiting */
        struct park *old = &e->park[e->park_tail & (PARK_CAP - 1)];
        if (old->live)
            park_emit(e, old, SKH_ST_LOST);
        e->park_tail++;
    }
    uint32_t idx = e->park_head++;
    struct park *p = &e->park[idx & (PARK_CAP - 1)];
    *p = (struct park){.live = 1, .linked = 1, .path_id = s->path_id, .wire_seq = s->wire_seq,
                       .dst_ep = s->dst_ep, .tgt_seq = s->tgt_seq, .stream = s->stream,
                       .tidx = s->tidx, .t_wall = s->t_wall};
    /* a later answer (its receipts, or this probe's own late reply) may still tell */
    p->horizon = now + e->cfg.direction_wait_ns;
    leave_pending(e, s);
    s->state = SLOT_PARKED;
    s->park = idx;
    ts->parked++;
    e->parked++;
}

/* Receipts of an ACK1 answering slot s. */
static void on_receipts(struct skh_engine *e, const struct slot *s, const struct skh_msg *m)
{
    struct tstate *ts = tstate_of(e, s);
    if (!ts)
        return;
    if (!(m->flags & SKH_FLAG_RCPT)) {
        ts->no_rcpt = 1;
    } else {
        ts->no_rcpt = 0;
        if (ts->have_ev && (int32_t)(s->tgt_seq - ts->ev_tseq) <= 0)
            return; /* an older answer than what we know */
        ts->have_ev = 1;
        ts->ev_tseq = s->tgt_seq;
        ts->ev_span = m->rcpt_span;
        ts->ev_bits[0] = m->rcpt_bits[0];
        ts->ev_bits[1] = m->rcpt_bits[1];
    }
    if (ts->parked)
        e->park_dirty = 1;
}

/* ------------------------------------------------------------------------------------------------ */
/* sending */

static void flush(struct skh_engine *e);

static unsigned out_slot(struct skh_engine *e)
{
    if (e->out.n == BATCH)
        flush(e);
    return e->out.n;
}

/* Queues one message for the next send() batch. Every message the engine builds encodes (probe_len
 * is checked at create), so encoding cannot fail here. */
static void queue(struct skh_engine *e, uint8_t kind, uint32_t ref, const skh_addr *dst,
                  const struct skh_msg *msg, uint8_t want_stamp)
{
    unsigned i = out_slot(e);
    uint8_t *buf = e->out.buf + (size_t)i * e->cfg.probe_len;
    int len = skh_proto_encode(msg, e->cfg.probe_len, buf, e->cfg.probe_len);
    e->out.dst[i] = *dst;
    e->out.pkt[i].buf = buf;
    e->out.pkt[i].len = (uint32_t)len;
    e->out.pkt[i].dst = &e->out.dst[i];
    e->out.pkt[i].want_stamp = want_stamp && (e->caps & SKH_TCAP_TX_STAMPS);
    e->out.kind[i] = kind;
    e->out.ref[i] = ref;
    e->out.deadline[i] = 0;
    e->out.n++;
}

/* A send failure that is final: which record it makes. */
static uint8_t status_of_send_errno(int err)
{
    switch (err) {
    case ECONNREFUSED:
        return SKH_ST_REFUSED;
    case ENETUNREACH:
    case EHOSTUNREACH:
    case EHOSTDOWN:
    case ENONET:
    case EADDRNOTAVAIL:
    case EACCES:
    case EPERM:
    case ENETDOWN:
    case EPROTO:
    case ETIMEDOUT: /* neighbour (ARP/ND) resolution of the peer failed */
        return SKH_ST_UNREACHABLE;
    default: /* EMSGSIZE, EINVAL, EIO...: the prober's own problem */
        return SKH_ST_LOCAL_ERROR;
    }
}

/* An ICMP error about a probe we sent: the network said why the request did not arrive. */
static uint8_t status_of_icmp_errno(int err)
{
    uint8_t st = status_of_send_errno(err);
    return st == SKH_ST_LOCAL_ERROR ? SKH_ST_REQUEST_LOST : st;
}

static struct slot *live_probe(struct skh_engine *e, uint32_t wire_seq)
{
    struct slot *s = &e->slots[wire_seq & e->slot_mask];
    return s->state == SLOT_PENDING && s->wire_seq == wire_seq ? s : NULL;
}

static void sent_one(struct skh_engine *e, unsigned i, int64_t t_before)
{
    uint32_t ref = e->out.ref[i];
    struct skh_txpkt *p = &e->out.pkt[i];

    if (e->out.kind[i] == TX_PROBE) {
        struct slot *s = &e->slots[ref & e->slot_mask];
        s->t2u = t_before;
        if (s->deferred) {
            s->deferred = 0;
            e->deferred_probes--;
        }
        inc(e, SKH_STAT_sent, 1);
    } else {
        if (e->out.kind[i] == TX_ACK1) {
            struct resp_entry *r = &e->resp[ref & e->resp_mask];
            /* user-clock T4 is read before the send (and T3 after receiving the probe): the pair
             * under-estimates the responder's delay, never over-estimates it */
            r->sent = 1;
            r->t4u = t_before;
        }
        inc(e, SKH_STAT_replies_sent, 1);
    }
    if (p->want_stamp && e->out.kind[i] != TX_NONE) {
        struct txmap_entry *m = &e->txmap[txslot(p->tx_id)];
        m->tx_id = p->tx_id;
        m->kind = e->out.kind[i];
        m->ref = ref;
    }
}

static void ack_failed(struct skh_engine *e, uint8_t kind, uint32_t ref)
{
    inc(e, SKH_STAT_reply_errors, 1);
    if (kind == TX_ACK1) /* no ACK1 on the wire: no ACK2 either */
        e->resp[ref & e->resp_mask].state = RESP_DONE;
}

static void send_failed(struct skh_engine *e, unsigned i, int err)
{
    uint32_t ref = e->out.ref[i];
    if (e->out.kind[i] == TX_PROBE) {
        struct slot *s = live_probe(e, ref);
        if (s) {
            inc(e, SKH_STAT_send_errors, 1);
            finish_status(e, s, status_of_send_errno(err));
        }
        return;
    }
    ack_failed(e, e->out.kind[i], ref);
}

/* Keeps out[i] for another try (a transient local error). */
static void defer_one(struct skh_engine *e, unsigned i, int64_t now)
{
    uint8_t kind = e->out.kind[i];
    uint32_t ref = e->out.ref[i];
    struct slot *s = kind == TX_PROBE ? live_probe(e, ref) : NULL;
    if (kind == TX_PROBE && !s)
        return;
    int64_t deadline = e->out.deadline[i];
    if (!deadline)
        deadline = s ? s->t1 + e->cfg.timeout_ns : now + ACK_DEFER_NS;
    if (!e->defer) { /* first use: most engines never defer anything */
        e->defer = calloc(DEFER_CAP, sizeof(*e->defer));
        e->defer_buf = calloc(DEFER_CAP, e->cfg.probe_len);
        if (!e->defer || !e->defer_buf) {
            free(e->defer);
            free(e->defer_buf);
            e->defer = NULL;
            e->defer_buf = NULL;
        }
    }
    if (!e->defer || e->defer_head - e->defer_tail == DEFER_CAP || now >= deadline) {
        send_failed(e, i, EAGAIN);
        return;
    }
    uint8_t *buf = &e->defer_buf[(size_t)(e->defer_head % DEFER_CAP) * e->cfg.probe_len];
    struct deferred *d = &e->defer[e->defer_head++ % DEFER_CAP];
    d->kind = kind;
    d->ref = ref;
    d->want_stamp = e->out.pkt[i].want_stamp;
    d->len = e->out.pkt[i].len;
    d->deadline = deadline;
    d->dst = e->out.dst[i];
    memcpy(buf, e->out.pkt[i].buf, d->len);
    if (s && !s->deferred) {
        s->deferred = 1;
        e->deferred_probes++;
    }
    inc(e, SKH_STAT_send_deferred, 1);
    if (e->defer_next == 0)
        e->defer_next = now + DEFER_RETRY_NS;
}

static void flush(struct skh_engine *e)
{
    unsigned done = 0, stale_retries = 0;
    while (done < e->out.n) {
        /* read before sending: a user-clock T2 must not be later than the real send, so a user-clock
         * RTT can only over-estimate, never go negative */
        int64_t t = mono();
        int rc = e->ops->send(e->tr, &e->out.pkt[done], e->out.n - done);
        if (rc > 0) {
            for (int k = 0; k < rc; k++)
                sent_one(e, done + (unsigned)k, t);
            done += (unsigned)rc;
            continue;
        }
        int err = rc < 0 ? -rc : EIO;
        /* A pending ICMP error of an earlier datagram can surface on a later send once; it is already
         * on the error queue, so retry. */
        if ((err == ECONNREFUSED && stale_retries++ < 2) || err == EINTR)
            continue;
        if (err == EINPROGRESS) {
            /* this destination is not ready yet (its address handle is being resolved): only
             * this datagram waits, the others go on */
            defer_one(e, done, t);
            done++;
            continue;
        }
        if (transient(err)) {
            /* the rest of the batch would meet the same full queue: keep it all, in order */
            for (; done < e->out.n; done++)
                defer_one(e, done, t);
            break;
        }
        send_failed(e, done, err);
        done++;
    }
    e->out.n = 0;
}

/* Hands deferred datagrams to the transport again, oldest first. */
static void retry_deferred(struct skh_engine *e, int64_t now)
{
    uint32_t n = e->defer_head - e->defer_tail;
    e->defer_next = 0;
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *buf = &e->defer_buf[(size_t)(e->defer_tail % DEFER_CAP) * e->cfg.probe_len];
        struct deferred *d = &e->defer[e->defer_tail++ % DEFER_CAP];
        if (d->kind == TX_PROBE && !live_probe(e, d->ref))
            continue; /* decided meanwhile (its timeout) */
        const struct resp_entry *r = &e->resp[d->ref & e->resp_mask];
        if (d->kind == TX_ACK1 && (r->state != RESP_WAITING || r->idx != d->ref))
            continue;
        if (now >= d->deadline) {
            if (d->kind == TX_PROBE) {
                inc(e, SKH_STAT_send_errors, 1);
                finish_status(e, live_probe(e, d->ref), SKH_ST_LOCAL_ERROR);
            } else {
                ack_failed(e, d->kind, d->ref);
            }
            continue;
        }
        unsigned i = out_slot(e);
        uint8_t *out = e->out.buf + (size_t)i * e->cfg.probe_len;
        memcpy(out, buf, d->len);
        e->out.dst[i] = d->dst;
        e->out.pkt[i].buf = out;
        e->out.pkt[i].len = d->len;
        e->out.pkt[i].dst = &e->out.dst[i];
        e->out.pkt[i].want_stamp = d->want_stamp;
        e->out.kind[i] = d->kind;
        e->out.ref[i] = d->ref;
        e->out.deadline[i] = d->deadline;
        e->out.n++;
    }
    flush(e);
}

/* When probes are batched, a target's schedule sits on the grid of its interval (multiples of it
 * from the engine's grid_ns), so targets that share an interval fall due together however far apart
 * they were added, and one wake-up sends them all. The step onto the grid is at least half an
 * interval. Each engine's grid has its own random origin, so engines do not burst in step; with
 * wall_grid every engine's is the wall clock's epoch, so they do (see skh_engine_cfg). */
static int64_t next_slot(const struct skh_engine *e, const struct target *t, int64_t now)
{
    if (e->cfg.batch_window_ns == 0)
        return now + t->interval_ns;
    int64_t x = now + t->interval_ns / 2 - e->grid_ns;
    int64_t k = x / t->interval_ns - (x % t->interval_ns < 0); /* floor */
    return e->grid_ns + (k + 1) * t->interval_ns;
}

/* The per-target receipt state follows the target table's size (engine thread, under tlock). */
static int grow_tstate(struct skh_engine *e)
{
    if (e->n_tstate >= e->n_targets)
        return 0;
    size_t n = e->cap_targets;
    struct tstate *ts = realloc(e->tstate, n * sizeof(*ts));
    if (!ts)
        return -ENOMEM;
    memset(ts + e->n_tstate, 0, (n - e->n_tstate) * sizeof(*ts));
    e->tstate = ts;
    e->n_tstate = n;
    return 0;
}

/* Sends every due probe (bounded per turn), and with them each target's next probe that falls due
 * within the batch window. Returns the next due time or INT64_MAX. */
static int64_t send_due(struct skh_engine *e, int64_t now)
{
    int64_t next = INT64_MAX;
    int64_t early = now + e->cfg.batch_window_ns;
    unsigned budget = SEND_ROUNDS * BATCH;
    int blocked = 0;

    if (e->blocked && e->pending > e->cfg.max_in_flight / 2) { /* see the refill rule in engine_main */
        blocked = 1;
        budget = 0;
    }

    pthread_mutex_lock(&e->tlock);
    if (grow_tstate(e) < 0)
        budget = 0; /* out of memory: try again next turn */
    for (size_t i = 0; i < e->n_targets; i++) {
        struct target *t = &e->targets[i];
        if (!t->active)
            continue;
        /* one probe per target at most leaves early: a fast target's probes stay spaced, never a burst */
        for (int joined = 0; budget > 0 && (t->next_due <= now || (!joined && t->next_due <= early));
             joined = 1) {
            if (e->pending >= e->cfg.max_in_flight || e->next_seq - e->tail_seq > e->slot_mask) {
                inc(e, SKH_STAT_inflight_full, 1);
                blocked = 1;
                budget = 0;
                break;
            }
            uint32_t seq = e->next_seq++;
            struct slot *s = &e->slots[seq & e->slot_mask];
            if (s->state == SLOT_PARKED) /* the park entry outlives the slot; it keeps the record */
                e->park[s->park & (PARK_CAP - 1)].linked = 0;
            memset(s, 0, sizeof(*s));
            s->wire_seq = seq;
            s->state = SLOT_PENDING;
            e->pending++;
            s->dst_ep = t->dst_ep;
            s->tgt_seq = t->seq++;
            s->stream = t->stream;
            s->tidx = (uint32_t)i;
            unsigned k = t->n_paths > 1 ? s->tgt_seq % t->n_paths : 0;
            s->path_id = (uint16_t)(t->path_id + k);
            s->off1 = rt_offset(NULL, &s->t_wall, &s->t1); /* T1: the last clock read */
            /* an RTT only from the probes that may be the latency sample: the others cost one
             * answer and no stamps */
            s->no_t34 = t->sample_period_ns > 0 && !probe_asks(t, s);
            if (s->no_t34)
                inc(e, SKH_STAT_probes_no_rtt, 1);
            struct skh_msg m = {.type = SKH_MSG_PROBE, .session = e->session, .seq = seq,
                                .path_id = s->path_id, .t1 = (uint64_t)s->t1, .stream = t->stream,
                                .tseq = s->tgt_seq, .popts = s->no_t34 ? SKH_POPT_NO_T34 : 0};
            queue(e, TX_PROBE, seq, &t->addrs[k], &m, !s->no_t34);
            budget--;
            if (t->remaining && --t->remaining == 0) {
                t->active = 0;
                break;
            }
            if (!t->on_grid && e->cfg.batch_window_ns) {
                t->next_due = next_slot(e, t, now);
                t->on_grid = 1;
                continue;
            }
            t->next_due += t->interval_ns;
            if (t->next_due < now) /* after a stall, resume the cadence instead of bursting */
                t->next_due = next_slot(e, t, now);
        }
    }
    for (size_t i = 0; i < e->n_targets; i++) {
        const struct target *t = &e->targets[i];
        /* a probe held back by the in-flight limit waits for a reply or a timeout, not for a clock */
        if (t->active && t->next_due < next && !(blocked && t->next_due <= now))
            next = t->next_due;
    }
    pthread_mutex_unlock(&e->tlock);
    e->blocked = blocked;
    flush(e);
    return next;
}

/* ------------------------------------------------------------------------------------------------ */
/* responder */

static void send_ack2(struct skh_engine *e, struct resp_entry *r, int use_stamp, int64_t t4, uint8_t src)
{
    struct skh_msg ack;
    if (use_stamp && src == r->t3_src) {
        skh_proto_ack2(&r->probe, e->session, (uint64_t)r->t3, (uint64_t)t4, src, &ack);
    } else if (r->sent) {
        skh_proto_ack2(&r->probe, e->session, (uint64_t)r->t3u, (uint64_t)r->t4u, SKH_TS_USER, &ack);
        inc(e, SKH_STAT_replies_user_stamps, 1);
    } else { /* ACK1 never left: an ACK2 without stamps still says the probe arrived */
        skh_proto_ack2(&r->probe, e->session, 0, 0, SKH_TS_NONE, &ack);
    }
    r->state = RESP_DONE;
    queue(e, TX_NONE, 0, &r->to, &ack, 0);
}

static void resp_sweep(struct skh_engine *e, int64_t now, int64_t *next)
{
    while (e->resp_tail != e->resp_head) {
        struct resp_entry *r = &e->resp[e->resp_tail & e->resp_mask];
        if (r->state == RESP_WAITING) {
            if (now < r->deadline || !r->sent) {
                /* an ACK1 still waiting to be sent ends in the retry queue, by its own deadline */
                if (r->deadline < *next && r->sent)
                    *next = r->deadline;
                return;
            }
            send_ack2(e, r, 0, 0, SKH_TS_NONE);
        }
        r->state = RESP_FREE;
        e->resp_tail++;
    }
}

static void on_probe(struct skh_engine *e, const struct skh_msg *m, const struct skh_rxpkt *p, int64_t t_rx,
                     struct rt_off off)
{
    inc(e, SKH_STAT_probes_received, 1);
    if (e->resp_head - e->resp_tail > e->resp_mask) {
        /* the oldest waiter gives up on its stamp so this probe still gets both answers */
        struct resp_entry *old = &e->resp[e->resp_tail & e->resp_mask];
        if (old->state == RESP_WAITING)
            send_ack2(e, old, 0, 0, SKH_TS_NONE);
        old->state = RESP_FREE;
        e->resp_tail++;
    }
    uint32_t idx = e->resp_head++;
    struct resp_entry *r = &e->resp[idx & e->resp_mask];
    r->idx = idx;
    r->state = RESP_WAITING;
    r->sent = 0;
    r->probe = *m;
    r->to = p->src;
    r->t3 = p->ts_ns;
    r->t3_src = p->ts_source;
    r->t3u = t_rx;
    r->t4u = 0;
    r->off3 = off;
    r->deadline = t_rx + T4_WAIT_NS;
    struct skh_msg ack;
    int one_answer = (m->popts & SKH_POPT_NO_T34) != 0;
    if (one_answer)
        r->state = RESP_DONE; /* no ACK2 to send, no send stamp to wait for */
    if (m->stream && (e->rcpt || skh_rcpt_create(RCPT_STREAMS, &e->rcpt) == 0)) {
        uint16_t span;
        uint64_t bits[2];
        skh_rcpt_note(e->rcpt, m->session, m->stream, m->tseq, t_rx, &span, bits);
        skh_proto_ack1_rcpt(m, e->session, span, bits, &ack);
    } else {
        skh_proto_ack1(m, e->session, &ack);
    }
    if (one_answer)
        queue(e, TX_NONE, 0, &p->src, &ack, 0);
    else
        queue(e, TX_ACK1, idx, &p->src, &ack, r->t3_src != SKH_TS_NONE);
}

/* After sends: ACK1s that left and have no send stamp to wait for get their ACK2 now. */
static void after_ack1s(struct skh_engine *e, uint32_t from)
{
    int no_stamps = !(e->caps & SKH_TCAP_TX_STAMPS);
    for (uint32_t i = from; i != e->resp_head; i++) {
        struct resp_entry *r = &e->resp[i & e->resp_mask];
        if (r->state == RESP_WAITING && r->sent && (r->t3_src == SKH_TS_NONE || no_stamps))
            send_ack2(e, r, 0, 0, SKH_TS_NONE);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* prober side of receiving */

static void maybe_complete(struct skh_engine *e, struct slot *s)
{
    if (s->no_t34) {
        if (s->have & HAVE_ACK1)
            finish_answered(e, s);
        return;
    }
    if ((s->have & (HAVE_ACK1 | HAVE_ACK2)) != (HAVE_ACK1 | HAVE_ACK2))
        return;
    /* wait for T2 while it can still come (a NIC stamps asynchronously); the deadline ends the wait */
    if ((e->caps & SKH_TCAP_TX_STAMPS) && s->t2_src == SKH_TS_NONE && s->t5_src != SKH_TS_NONE)
        return;
    finish_answered(e, s);
}

static void on_ack(struct skh_engine *e, const struct skh_msg *m, const struct skh_rxpkt *p, int64_t t_rx,
                   struct rt_off off)
{
    if (m->session != e->session) {
        inc(e, SKH_STAT_drop_unsolicited, 1);
        return;
    }
    struct slot *s = &e->slots[m->seq & e->slot_mask];
    if (s->state == SLOT_FREE || s->wire_seq != m->seq || (uint64_t)s->t1 != m->t1) {
        inc(e, SKH_STAT_drop_unsolicited, 1);
        return;
    }
    if (s->state == SLOT_PARKED) {
        /* a late answer: the request did arrive, the reply missed the timeout */
        struct park *pk = &e->park[s->park & (PARK_CAP - 1)];
        if (pk->live && pk->linked && pk->wire_seq == s->wire_seq)
            park_emit(e, pk, SKH_ST_REPLY_LOST);
        s->state = SLOT_DONE_LOST;
    }
    if (s->state == SLOT_DONE_LOST) {
        inc(e, SKH_STAT_drop_late, 1);
        return;
    }
    uint8_t bit = m->type == SKH_MSG_ACK1 ? HAVE_ACK1 : HAVE_ACK2;
    if (s->state == SLOT_DONE || (s->have & bit)) {
        inc(e, SKH_STAT_drop_replay, 1);
        return;
    }
    if ((s->have & (HAVE_ACK1 | HAVE_ACK2)) && s->resp_session != m->resp_session) {
        /* the two answers come from different responder lives: their stamps do not belong together */
        inc(e, SKH_STAT_drop_unsolicited, 1);
        return;
    }
    inc(e, SKH_STAT_acks_received, 1);
    s->resp_session = m->resp_session;
    s->have |= bit;
    if (bit == HAVE_ACK1) {
        s->t5 = p->ts_ns;
        s->t5_src = p->ts_source;
        s->t5u = t_rx;
        s->stepped = rt_stepped(s->off1, off);
        if (s->stream)
            on_receipts(e, s, m);
    } else if (m->flags & SKH_FLAG_T34_VALID) {
        s->have |= HAVE_T34;
        s->t3 = (int64_t)m->t3;
        s->t4 = (int64_t)m->t4;
        s->t34_src = m->ts_source;
    }
    maybe_complete(e, s);
}

static void on_error_report(struct skh_engine *e, const struct skh_rxpkt *p)
{
    struct skh_msg m;
    inc(e, SKH_STAT_icmp_errors, 1);
    if (skh_proto_peek(p->buf, p->len, &m) != 0 || m.type != SKH_MSG_PROBE || m.session != e->session)
        return; /* about an ACK we sent (its prober went away): nothing to decide */
    struct slot *s = live_probe(e, m.seq);
    if (s && !s->have)
        finish_status(e, s, status_of_icmp_errno(-p->err));
}

/* The transport lost what was on its way in: every probe waiting for answers may have lost them
 * on this host, not in the network. */
static void receive_path_reset(struct skh_engine *e)
{
    for (uint32_t q = e->tail_seq; q != e->next_seq; q++) {
        struct slot *s = live_probe(e, q);
        if (s)
            s->rx_reset = 1;
    }
}

static int on_stamps(struct skh_engine *e);

static int on_rx(struct skh_engine *e)
{
    int n = e->ops->recv(e->tr, e->rx, BATCH);
    if (n <= 0)
        return 0;
    int64_t t_rx;
    struct rt_off off = rt_offset(&t_rx, NULL, NULL);
    uint32_t resp_from = e->resp_head;
    inc(e, SKH_STAT_received, (uint64_t)n - (e->rx[0].err == -ENETRESET));
    for (int i = 0; i < n; i++) {
        const struct skh_rxpkt *p = &e->rx[i];
        struct skh_msg m;
        if (p->err == -ENETRESET) {
            receive_path_reset(e);
            continue;
        }
        if (p->err) {
            on_error_report(e, p);
            continue;
        }
        int rc = p->truncated || p->len > SKH_PROBE_MAX_LEN ? -SKH_DROP_TRUNCATED
                                                            : skh_proto_decode(p->buf, p->len, &m);
        if (rc < 0) {
            inc(e, (enum skh_stat)(SKH_STAT_drop_truncated + (-rc - 1)), 1);
            continue;
        }
        if (m.type == SKH_MSG_PROBE)
            on_probe(e, &m, p, t_rx, off);
        else
            on_ack(e, &m, p, t_rx, off);
    }
    if (e->out.n) {
        flush(e);
        after_ack1s(e, resp_from);
        flush(e);
        /* lo/veth (and most NICs' software path) stamp ACK1 during the send: answering ACK2 now lets
         * the prober take both replies in one wake-up */
        if (e->resp_head != resp_from)
            on_stamps(e);
    }
    return n;
}

static int on_stamps(struct skh_engine *e)
{
    int n = e->ops->stamps(e->tr, e->st, BATCH);
    struct rt_off off = {0, 0};
    int have_off = 0;
    for (int i = 0; i < n; i++) {
        const struct skh_txstamp *ts = &e->st[i];
        struct txmap_entry *m = &e->txmap[txslot(ts->tx_id)];
        if (m->kind == TX_NONE || m->tx_id != ts->tx_id) {
            if (!ts->err)
                inc(e, SKH_STAT_tx_stamps_unmatched, 1);
            continue;
        }
        uint8_t kind = m->kind;
        m->kind = TX_NONE;
        if (kind == TX_PROBE) {
            struct slot *s = live_probe(e, m->ref);
            if (!s) {
                if (!ts->err)
                    inc(e, SKH_STAT_tx_stamps_unmatched, 1);
                continue;
            }
            if (ts->err) { /* accepted, then not sent (a flushed work request) */
                if (!s->have)
                    finish_status(e, s, SKH_ST_LOCAL_ERROR);
                continue;
            }
            s->t2 = ts->ts_ns;
            s->t2_src = ts->ts_source;
            inc(e, SKH_STAT_tx_stamps, 1);
            maybe_complete(e, s);
        } else {
            struct resp_entry *r = &e->resp[m->ref & e->resp_mask];
            if (r->state != RESP_WAITING) {
                if (!ts->err)
                    inc(e, SKH_STAT_tx_stamps_unmatched, 1);
                continue;
            }
            if (ts->err) {
                inc(e, SKH_STAT_reply_errors, 1);
                r->sent = 0;
                send_ack2(e, r, 0, 0, SKH_TS_NONE);
                continue;
            }
            inc(e, SKH_STAT_tx_stamps, 1);
            int use = 1;
            if (ts->ts_source == SKH_TS_KERNEL) {
                /* CLOCK_REALTIME stamps: a step between T3 and T4 would be in T4-T3 */
                if (!have_off) {
                    off = rt_offset(NULL, NULL, NULL);
                    have_off = 1;
                }
                if (rt_stepped(r->off3, off)) {
                    inc(e, SKH_STAT_clock_steps, 1);
                    use = 0;
                }
            }
            send_ack2(e, r, use, ts->ts_ns, ts->ts_source);
        }
    }
    if (e->out.n)
        flush(e);
    return n;
}

/* Decides timed-out probes in order. Returns the next deadline or INT64_MAX. */
static int64_t expire(struct skh_engine *e, int64_t now)
{
    while (e->tail_seq != e->next_seq) {
        struct slot *s = &e->slots[e->tail_seq & e->slot_mask];
        if (s->state == SLOT_PENDING) {
            int64_t deadline = s->t1 + e->cfg.timeout_ns;
            if (now < deadline)
                return deadline;
            if (s->deferred) { /* never left: still waiting for room to be sent */
                inc(e, SKH_STAT_send_errors, 1);
                finish_status(e, s, SKH_ST_LOCAL_ERROR);
            } else if ((s->have & (HAVE_ACK1 | HAVE_ACK2)) == (HAVE_ACK1 | HAVE_ACK2)) {
                finish_answered(e, s); /* both answers but no T2: the user pair decides */
            } else if (s->rx_reset) {
                /* its answers may have reached us while our receive queue was being reset */
                finish_status(e, s, SKH_ST_LOCAL_ERROR);
            } else if (s->have) {
                /* one answer: the request arrived and the other answer was lost on the way back */
                finish_status(e, s, SKH_ST_REPLY_LOST);
            } else {
                finish_unanswered(e, s, now);
            }
        }
        e->tail_seq++;
    }
    return INT64_MAX;
}

/* ------------------------------------------------------------------------------------------------ */
/* the thread: a loop runs its engines' turns, one after another, and sleeps for all of them */

struct skh_loop {
    pthread_mutex_t mu; /* the engine list; the thread holds it while it works on the engines */
    struct skh_engine **eng;
    size_t n, cap;
    uint64_t gen; /* bumped as engines come and go: poll results older than that are stale */
    int wake_fd;
    pthread_t thread;
    int thread_started;
    atomic_int running;
    /* the thread's own */
    struct pollfd *pfd; /* per engine: its transport, its wake fd; then the loop's wake fd */
    size_t pfd_cap;
};

/* One turn of e's work: due sends and timers, and its receive queues when rx says they may hold
 * something. Returns when e next needs a turn (INT64_MAX: only on I/O); *again when it wants the
 * next turn at once (a queue gave a whole batch, or held-back probes may go). */
static int64_t engine_turn(struct skh_engine *e, int rx, int *again)
{
    inc(e, SKH_STAT_wakeups, 1);
    int64_t now = mono();
    if (e->defer_next && now >= e->defer_next)
        retry_deferred(e, now);
    int64_t next = send_due(e, now);
    int busy = 0;
    for (int r = 0; rx && r < RECV_ROUNDS; r++) {
        int a = on_stamps(e);
        int b = on_rx(e);
        busy = a == BATCH || b == BATCH;
        if (!busy) /* both queues were emptied: no need to ask again before sleeping */
            break;
    }
    now = mono();
    int64_t d = expire(e, now);
    if (d < next)
        next = d;
    resp_sweep(e, now, &next);
    if (e->park_dirty || (e->parked && now >= e->park[e->park_tail & (PARK_CAP - 1)].horizon))
        park_sweep(e, now, &next);
    else if (e->parked && e->park[e->park_tail & (PARK_CAP - 1)].horizon < next)
        next = e->park[e->park_tail & (PARK_CAP - 1)].horizon;
    if (e->out.n)
        flush(e);
    if (e->defer_next && e->defer_next < next)
        next = e->defer_next;
    gauge(e, SKH_STAT_in_flight, e->pending - e->deferred_probes);
    gauge(e, SKH_STAT_awaiting_direction, e->parked);
    /* Replies or timeouts made room for probes that were held back: send them now, once half the
     * limit is free, so they leave (and come back) in batches rather than one per wake-up. */
    *again = busy || (e->blocked && e->pending <= e->cfg.max_in_flight / 2 &&
                      e->next_seq - e->tail_seq <= e->slot_mask);
    e->rx_again = busy;
    return next;
}

static void drain_eventfd(int fd)
{
    uint64_t v;
    (void)!read(fd, &v, sizeof(v));
}

static void *loop_main(void *arg)
{
    struct skh_loop *l = arg;
    int64_t woke = mono(); /* when the last sleep ended: a tick's wait or ppoll */
    uint64_t polled_gen = 0;
    int polled = 0; /* pfd's results are fresh (from the last ppoll, over the engines of polled_gen) */
    nfds_t nfd = 0;

    while (atomic_load_explicit(&l->running, memory_order_acquire)) {
        pthread_mutex_lock(&l->mu);
        int fresh = polled && polled_gen == l->gen;
        if (fresh)
            for (size_t i = 0; i < l->n; i++)
                if (l->pfd[2 * i + 1].revents)
                    drain_eventfd(l->eng[i]->wake_fd);
        int64_t next = INT64_MAX, tick = SKH_MAX_TICK_NS;
        int again = 0;
        for (size_t i = 0; i < l->n; i++) {
            struct skh_engine *e = l->eng[i];
            /* After a ppoll only the engines whose transport had something are read: the others'
             * receive calls would find nothing (verbs' completion channel says nothing of what
             * arrived unarmed: its queues are always read). */
            int rx = !fresh || e->ops->arm || e->rx_again || l->pfd[2 * i].revents;
            int a = 0;
            int64_t d = engine_turn(e, rx, &a);
            again |= a;
            if (d < next)
                next = d;
            if (e->tick_ns < tick)
                tick = e->tick_ns;
        }
        polled = 0;
        if (again) {
            pthread_mutex_unlock(&l->mu);
            continue;
        }
        if (tick && l->n) {
            /* the rest of the tick first: what arrives meanwhile is read in one turn after it */
            int64_t until = woke + tick;
            if (mono() < until) {
                pthread_mutex_unlock(&l->mu);
                struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
                    ;
                woke = mono();
                /* a new tick: what verbs' arm() finds now is handled without a ppoll, then the
                 * thread waits out this tick before it looks again */
                pthread_mutex_lock(&l->mu);
            }
        }
        /* Completion notifications only for a sleep: while something falls due by now (a busy
         * endpoint, every tick) the next turn reads the queues anyway, so its completions need
         * no event, no read of the channel and no re-arm (on a NIC an interrupt each) */
        int sleeps = next > mono();
        for (size_t i = 0; sleeps && i < l->n; i++)
            if (l->eng[i]->ops->arm && l->eng[i]->ops->arm(l->eng[i]->tr) > 0)
                again = 1;
        if (again) {
            pthread_mutex_unlock(&l->mu);
            continue;
        }
        if (l->pfd_cap < 2 * l->n + 1) {
            struct pollfd *p = realloc(l->pfd, (2 * l->n + 1) * sizeof(*p));
            if (!p) { /* out of memory: look again in a millisecond */
                pthread_mutex_unlock(&l->mu);
                struct timespec ms = {.tv_sec = 0, .tv_nsec = 1000000};
                nanosleep(&ms, NULL);
                continue;
            }
            l->pfd = p;
            l->pfd_cap = 2 * l->n + 1;
        }
        nfd = 0;
        for (size_t i = 0; i < l->n; i++) {
            /* a transport's fd may change as it grows (UDP path sockets) */
            l->pfd[nfd++] = (struct pollfd){.fd = l->eng[i]->ops->pollfd(l->eng[i]->tr), .events = POLLIN};
            l->pfd[nfd++] = (struct pollfd){.fd = l->eng[i]->wake_fd, .events = POLLIN};
        }
        l->pfd[nfd++] = (struct pollfd){.fd = l->wake_fd, .events = POLLIN};
        polled_gen = l->gen;
        pthread_mutex_unlock(&l->mu);
        /* Engines that leave meanwhile (stop) are off the list once it is unlocked: their fds may
         * still be polled once here, never read (gen moved, and so do the results). */
        struct timespec ts, *tsp = NULL;
        int64_t now = mono();
        if (next != INT64_MAX) {
            int64_t wait = next > now ? next - now : 0;
            ts.tv_sec = wait / 1000000000LL;
            ts.tv_nsec = wait % 1000000000LL;
            tsp = &ts;
        }
        int r = ppoll(l->pfd, nfd, tsp, NULL);
        polled = r >= 0;
        if (r > 0 && (l->pfd[nfd - 1].revents & POLLIN))
            drain_eventfd(l->wake_fd);
        if (r < 0)
            for (nfds_t i = 0; i < nfd; i++)
                l->pfd[i].revents = 0;
        woke = mono();
    }
    return NULL;
}

int skh_loop_create(struct skh_loop **out)
{
    struct skh_loop *l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd < 0) {
        int rc = -errno;
        free(l);
        return rc;
    }
    pthread_mutex_init(&l->mu, NULL);
    *out = l;
    return 0;
}

static void loop_wake(struct skh_loop *l)
{
    uint64_t one = 1;
    (void)!write(l->wake_fd, &one, sizeof(one));
}

/* Takes e off its loop: once the list is unlocked the thread no longer touches it. */
static void loop_detach(struct skh_engine *e)
{
    struct skh_loop *l = e->loop;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n; i++)
        if (l->eng[i] == e) {
            memmove(&l->eng[i], &l->eng[i + 1], (l->n - i - 1) * sizeof(*l->eng));
            l->n--;
            l->gen++;
            break;
        }
    size_t left = l->n;
    pthread_mutex_unlock(&l->mu);
    e->loop = NULL;
    if (left) {
        loop_wake(l); /* stop polling e's fds */
    } else if (l->thread_started) { /* the last one: the thread ends (the next start makes one) */
        atomic_store_explicit(&l->running, 0, memory_order_release);
        loop_wake(l);
        pthread_join(l->thread, NULL);
        l->thread_started = 0;
    }
}

void skh_loop_destroy(struct skh_loop *l)
{
    if (!l)
        return;
    while (l->n) /* engines still on it: stopped (their owner's to destroy) */
        loop_detach(l->eng[0]);
    close(l->wake_fd);
    pthread_mutex_destroy(&l->mu);
    free(l->eng);
    free(l->pfd);
    free(l);
}

static int loop_start(struct skh_loop *l)
{
    if (l->thread_started)
        return 0;
    atomic_store(&l->running, 1);
    /* The thread takes no signals: they belong to the owner (Python runs its handlers in the main
     * thread, and a Ctrl-C delivered here would not interrupt the main thread's sleep). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&l->thread, NULL, loop_main, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        atomic_store(&l->running, 0);
        return -rc;
    }
    pthread_setname_np(l->thread, "skh-engine"); /* /proc tells its CPU time from its owner's */
    l->thread_started = 1;
    return 0;
}

int skh_engine_start_on(struct skh_engine *e, struct skh_loop *l)
{
    if (e->loop)
        return e->loop == l ? 0 : -EBUSY;
    pthread_mutex_lock(&l->mu);
    int rc = 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        struct skh_engine **ne = realloc(l->eng, cap * sizeof(*ne));
        if (ne) {
            l->eng = ne;
            l->cap = cap;
        } else {
            rc = -ENOMEM;
        }
    }
    if (!rc)
        rc = loop_start(l);
    if (!rc) {
        e->rx_again = 1; /* its first turn reads what came before it was polled */
        l->eng[l->n++] = e;
        l->gen++;
        e->loop = l;
    }
    pthread_mutex_unlock(&l->mu);
    loop_wake(l);
    return rc;
}

static void wake(struct skh_engine *e)
{
    uint64_t one = 1;
    (void)!write(e->wake_fd, &one, sizeof(one));
}

/* ------------------------------------------------------------------------------------------------ */
/* public */

int skh_engine_create(const struct skh_engine_cfg *cfg, struct skh_engine **out)
{
    const struct skh_transport_ops *ops = skh_transport_find(cfg->transport ? cfg->transport : "udp");
    if (!ops)
        return -EPROTONOSUPPORT;
    if (cfg->timeout_ns <= 0 || cfg->batch_window_ns < 0 || cfg->batch_window_ns >= cfg->timeout_ns ||
        cfg->direction_wait_ns < 0 || cfg->tick_ns < 0 || cfg->tick_ns > SKH_MAX_TICK_NS ||
        (cfg->wall_grid && cfg->batch_window_ns == 0) ||
        cfg->probe_len < SKH_PROBE_MIN_LEN || cfg->probe_len > SKH_PROBE_MAX_LEN ||
        cfg->ring_records == 0 || cfg->max_in_flight > SKH_MAX_IN_FLIGHT ||
        cfg->answer_slots > SKH_MAX_ANSWER_SLOTS)
        return -EINVAL;

    struct skh_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->cfg = *cfg;
    e->cfg.transport = NULL; /* the caller's string need not outlive create */
    if (e->cfg.max_in_flight == 0)
        e->cfg.max_in_flight = SKH_DEFAULT_IN_FLIGHT;
    e->slot_mask = pow2_at_least(e->cfg.max_in_flight) - 1;
    e->cfg.tcfg.bind = NULL;
    e->cfg.tcfg.device = NULL;
    e->ops = ops;
    e->wake_fd = -1;
    pthread_mutex_init(&e->tlock, NULL);
    pthread_mutex_init(&e->dlock, NULL);
    uint32_t ring_n = pow2_at_least(cfg->ring_records);
    e->ring_mask = ring_n - 1;
    /* calloc'd tables are touched page by page as they fill, so an idle engine stays small */
    e->ring = calloc(ring_n, sizeof(*e->ring));
    e->slots = calloc((size_t)e->slot_mask + 1, sizeof(*e->slots));
    e->resp_mask = pow2_at_least(cfg->answer_slots ? cfg->answer_slots : SKH_MAX_ANSWER_SLOTS) - 1;
    e->resp = calloc((size_t)e->resp_mask + 1, sizeof(*e->resp));
    e->txmap = calloc(TXMAP_CAP, sizeof(*e->txmap));
    e->out.buf = calloc(BATCH, cfg->probe_len);
    for (unsigned i = 0; i < BATCH; i++) { /* recv() leaves them as they are */
        e->rx[i].buf = e->rxbuf[i];
        e->rx[i].cap = sizeof(e->rxbuf[i]);
    }
    /* the park and the retry queue are allocated when first needed */
    int rc = -ENOMEM;
    if (!e->ring || !e->slots || !e->resp || !e->txmap || !e->out.buf)
        goto fail;
    if (getrandom(&e->session, sizeof(e->session), 0) != sizeof(e->session))
        e->session = (uint32_t)now_ns(CLOCK_REALTIME) ^ (uint32_t)getpid();
    if (e->session == 0)
        e->session = 1;
    e->grid_ns = (int64_t)e->session; /* a random point within ~4 s */
    if (cfg->wall_grid) {
        /* CLOCK_REALTIME's epoch on the monotonic clock: slots fall on wall-clock multiples of
         * each interval (a later step of the realtime clock does not move them) */
        struct rt_off off = rt_offset(NULL, NULL, NULL);
        e->grid_ns = -(off.lo / 2 + off.hi / 2);
    }
    /* start wire seqs at a random point so a restarted prober's old replies cannot match */
    e->next_seq = e->tail_seq = (uint32_t)now_ns(CLOCK_MONOTONIC);
    e->next_stream = e->session * 2654435761u;
    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->wake_fd < 0) {
        rc = -errno;
        goto fail;
    }
    rc = ops->open(&cfg->tcfg, &e->tr);
    if (rc)
        goto fail;
    e->caps = ops->caps(e->tr);
    e->tick_ns = (e->caps & SKH_TCAP_WIRE_STAMPS) ? cfg->tick_ns : 0;
    *out = e;
    return 0;
fail:
    skh_engine_destroy(e);
    return rc;
}

int skh_engine_start(struct skh_engine *e)
{
    if (e->loop)
        return 0;
    if (!e->own_loop) {
        int rc = skh_loop_create(&e->own_loop);
        if (rc)
            return rc;
    }
    return skh_engine_start_on(e, e->own_loop);
}

int skh_engine_stop(struct skh_engine *e)
{
    if (e->loop)
        loop_detach(e);
    /* its own thread ends with it (a start makes another) */
    skh_loop_destroy(e->own_loop);
    e->own_loop = NULL;
    return 0;
}

void skh_engine_destroy(struct skh_engine *e)
{
    if (!e)
        return;
    skh_engine_stop(e);
    if (e->tr)
        e->ops->close(e->tr);
    if (e->wake_fd >= 0)
        close(e->wake_fd);
    pthread_mutex_destroy(&e->tlock);
    pthread_mutex_destroy(&e->dlock);
    skh_rcpt_destroy(e->rcpt);
    for (size_t i = 0; i < e->n_targets; i++)
        free(e->targets[i].addrs);
    free(e->targets);
    free(e->tstate);
    free(e->ring);
    free(e->slots);
    free(e->resp);
    free(e->txmap);
    free(e->out.buf);
    free(e->park);
    free(e->defer);
    free(e->defer_buf);
    free(e);
}

int skh_engine_add_target(struct skh_engine *e, uint32_t dst_ep, const char *host, uint16_t port,
                          const char *gid, uint32_t qpn, uint16_t path_id, uint16_t n_paths,
                          int64_t interval_ns, uint32_t count, int64_t sample_period_ns,
                          int64_t sample_phase_ns)
{
    if (interval_ns <= 0 || n_paths == 0 || (uint32_t)path_id + n_paths - 1u > UINT16_MAX ||
        sample_period_ns < 0 || sample_phase_ns < 0 ||
        (sample_period_ns > 0 && sample_phase_ns >= sample_period_ns))
        return -EINVAL;
    /* every path's address is made here, on the caller's thread: a transport may open a socket
     * (UDP) or resolve an address handle (verbs) per path, which the engine thread must not wait for */
    skh_addr *addrs = calloc(n_paths, sizeof(*addrs));
    if (!addrs)
        return -ENOMEM;
    for (unsigned k = 0; k < n_paths; k++) {
        int rc = e->ops->parse_addr(e->tr, host, port, gid, qpn, (uint16_t)(path_id + k), &addrs[k]);
        if (rc) {
            free(addrs);
            return rc;
        }
    }
    pthread_mutex_lock(&e->tlock);
    struct target *t = NULL;
    for (size_t i = 0; i < e->n_targets; i++)
        if (e->targets[i].active && e->targets[i].dst_ep == dst_ep)
            t = &e->targets[i];
    for (size_t i = 0; !t && i < e->n_targets; i++)
        if (!e->targets[i].active)
            t = &e->targets[i];
    if (!t) {
        if (e->n_targets == e->cap_targets) {
            size_t cap = e->cap_targets ? e->cap_targets * 2 : 16;
            struct target *nt = realloc(e->targets, cap * sizeof(*nt));
            if (!nt) {
                pthread_mutex_unlock(&e->tlock);
                free(addrs);
                return -ENOMEM;
            }
            e->targets = nt;
            e->cap_targets = cap;
        }
        t = &e->targets[e->n_targets++];
        memset(t, 0, sizeof(*t));
    }
    if (!t->active || t->dst_ep != dst_ep || t->sample_period_ns != sample_period_ns ||
        t->sample_phase_ns != sample_phase_ns) {
        /* a new pair, or new sampling periods: no period sampled yet, path id 0 wanted first */
        t->sample_done = INT64_MIN;
        t->sample_want = 0;
    }
    t->sample_period_ns = sample_period_ns;
    t->sample_phase_ns = sample_phase_ns;
    if (!t->active || t->dst_ep != dst_ep) {
        t->seq = 0;
        t->ok_next = 0;
        /* a new probe sequence is a new receipt stream: responders never mix it with the old one */
        if (++e->next_stream == 0)
            ++e->next_stream;
        t->stream = e->next_stream;
    }
    skh_addr *old = t->addrs;
    t->dst_ep = dst_ep;
    t->path_id = path_id;
    t->n_paths = n_paths;
    t->addrs = addrs;
    t->interval_ns = interval_ns;
    t->remaining = count;
    t->next_due = mono();
    t->on_grid = 0;
    t->active = 1;
    pthread_mutex_unlock(&e->tlock);
    free(old); /* only the engine thread reads addresses, and only under tlock */
    wake(e);
    return 0;
}

int skh_engine_remove_target(struct skh_engine *e, uint32_t dst_ep)
{
    int rc = -ENOENT;
    pthread_mutex_lock(&e->tlock);
    for (size_t i = 0; i < e->n_targets; i++)
        if (e->targets[i].active && e->targets[i].dst_ep == dst_ep) {
            e->targets[i].active = 0;
            rc = 0;
        }
    pthread_mutex_unlock(&e->tlock);
    return rc;
}

size_t skh_engine_pending_records(struct skh_engine *e)
{
    return (size_t)(atomic_load_explicit(&e->ring_head, memory_order_acquire) -
                    atomic_load_explicit(&e->ring_tail, memory_order_relaxed));
}

size_t skh_engine_drain(struct skh_engine *e, struct skh_record *out, size_t max)
{
    pthread_mutex_lock(&e->dlock);
    uint64_t tail = atomic_load_explicit(&e->ring_tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&e->ring_head, memory_order_acquire);
    size_t n = (size_t)(head - tail);
    if (n > max)
        n = max;
    size_t cap = (size_t)e->ring_mask + 1;
    size_t first = tail & e->ring_mask;
    size_t k = n < cap - first ? n : cap - first;
    memcpy(out, &e->ring[first], k * sizeof(*out));
    memcpy(out + k, &e->ring[0], (n - k) * sizeof(*out));
    atomic_store_explicit(&e->ring_tail, tail + n, memory_order_release);
    pthread_mutex_unlock(&e->dlock);
    return n;
}

void skh_engine_stats(struct skh_engine *e, uint64_t out[SKH_STAT__COUNT])
{
    for (int i = 0; i < SKH_STAT__COUNT; i++)
        out[i] = atomic_load_explicit(&e->stats[i], memory_order_relaxed);
}

void skh_engine_transport_counters(struct skh_engine *e, uint64_t out[SKH_TSTAT__COUNT])
{
    memset(out, 0, SKH_TSTAT__COUNT * sizeof(out[0]));
    if (e->ops->counters)
        e->ops->counters(e->tr, out);
}

int skh_engine_local(struct skh_engine *e, skh_addr *out) { return e->ops->local(e->tr, out); }

unsigned skh_engine_transport_caps(struct skh_engine *e) { return e->caps; }

uint32_t skh_engine_session(struct skh_engine *e) { return e->session; }
