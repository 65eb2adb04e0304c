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

_Static_assert(sizeof(struct skh_record) == 48, "skh_record must match skh.records.PROBE_DTYPE");

const char *const skh_stat_names[SKH_STAT__COUNT] = {
#define SKH_STAT_NAME(name) #name,
    SKH_STATS(SKH_STAT_NAME)
#undef SKH_STAT_NAME
};

#define BATCH 64
#define SEND_ROUNDS 4 /* probe batches per loop turn, so a long due list cannot starve receiving */
#define RECV_ROUNDS 8
#define RESP_CAP 1024 /* ACK1s waiting for their send stamp (power of two) */
#define TXMAP_CAP 4096 /* tx_id -> owner of a send stamp still to come (power of two) */

/* Slot of a tx_id: consecutive ids of one source never collide; transports that put a source index in
 * the high byte (UDP path sockets) get each source offset, so lock-step sources do not collide. */
static inline unsigned txslot(uint32_t tx_id)
{
    return (tx_id + (tx_id >> 24) * 7919u) & (TXMAP_CAP - 1);
}
/* How long a responder waits for the send stamp of ACK1 before answering ACK2 with user stamps. */
#define T4_WAIT_NS (10LL * 1000000LL)

enum slot_state { SLOT_FREE = 0, SLOT_PENDING, SLOT_DONE, SLOT_DONE_LOST };
#define HAVE_ACK1 0x1u
#define HAVE_ACK2 0x2u
#define HAVE_T34 0x4u

struct slot {
    uint32_t wire_seq;
    uint8_t state;
    uint8_t have;
    uint8_t t2_src, t5_src, t34_src;
    uint16_t path_id;
    uint32_t dst_ep;
    uint32_t tgt_seq;
    uint32_t resp_session;
    int64_t t1, t_wall, t2, t2u, t5, t5u, t3, t4; /* decided at t1 + timeout at the latest */
};

enum resp_state { RESP_FREE = 0, RESP_WAITING, RESP_DONE };

struct resp_entry {
    uint8_t state;
    uint8_t t3_src;
    uint32_t tx_id;
    struct skh_msg probe;
    skh_addr to;
    int64_t t3, t3u, t4u, deadline;
};

enum tx_kind { TX_NONE = 0, TX_PROBE, TX_ACK1 };

struct txmap_entry {
    uint32_t tx_id;
    uint8_t kind;
    uint32_t ref; /* TX_PROBE: wire seq; TX_ACK1: responder ring index */
};

struct target {
    uint32_t dst_ep;
    uint16_t path_id;
    uint8_t active;
    uint8_t on_grid; /* next_due follows the interval's grid (batching), set after the first probe */
    uint32_t seq;
    uint32_t remaining; /* probes left to send; 0 = no limit */
    int64_t interval_ns;
    int64_t next_due;
    skh_addr addr;
};

struct outq { /* datagrams queued for one send() batch */
    struct skh_txpkt pkt[BATCH];
    uint8_t buf[BATCH][SKH_PROBE_MAX_LEN];
    uint32_t ref[BATCH]; /* wire seq (probes) or responder index (ACK1) */
    uint8_t kind[BATCH];
    skh_addr dst[BATCH];
    unsigned n;
};

struct skh_engine {
    struct skh_engine_cfg cfg;
    const struct skh_transport_ops *ops;
    struct skh_transport *tr;
    unsigned caps;
    int wake_fd;
    uint32_t session;
    int64_t grid_ns; /* origin of the batching grid (random) */

    pthread_t thread;
    int thread_started;
    atomic_int running;

    pthread_mutex_t tlock; /* targets */
    struct target *targets;
    size_t n_targets, cap_targets;

    /* prober */
    struct slot *slots; /* indexed by wire seq & slot_mask */
    uint32_t slot_mask;
    uint32_t next_seq, tail_seq;
    uint64_t pending; /* slots in SLOT_PENDING */
    int blocked; /* the last send_due left due probes behind for the in-flight limit */
    /* responder */
    struct resp_entry *resp;
    uint32_t resp_head, resp_tail;
    struct txmap_entry *txmap;

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

/* ------------------------------------------------------------------------------------------------ */
/* records */

static void emit(struct skh_engine *e, const struct slot *s, uint8_t status, const struct skh_rtt *r)
{
    static const enum skh_stat by_status[] = {SKH_STAT_ok, SKH_STAT_lost, SKH_STAT_refused,
                                              SKH_STAT_unreachable, SKH_STAT_invalid};
    inc(e, by_status[status], 1);
    uint64_t head = atomic_load_explicit(&e->ring_head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&e->ring_tail, memory_order_acquire);
    if (head - tail > e->ring_mask) {
        inc(e, SKH_STAT_ring_overflow, 1);
        return;
    }
    struct skh_record *rec = &e->ring[head & e->ring_mask];
    rec->src_ep = e->cfg.endpoint_id;
    rec->dst_ep = s->dst_ep;
    rec->seq = s->tgt_seq;
    rec->path_id = s->path_id;
    rec->status = status;
    rec->ts_source = r ? r->ts_source : SKH_TS_NONE;
    rec->t_wall_ns = s->t_wall;
    rec->rtt_ns = r ? r->rtt_ns : -1;
    rec->responder_delay_ns = r ? r->responder_delay_ns : -1;
    rec->prober_delay_ns = r ? r->prober_delay_ns : -1;
    atomic_store_explicit(&e->ring_head, head + 1, memory_order_release);
    inc(e, SKH_STAT_records, 1);
}

/* Decides a pending probe. status is LOST/REFUSED/UNREACHABLE, or OK to compute from the stamps. */
static void finish(struct skh_engine *e, struct slot *s, uint8_t status, int64_t t6)
{
    e->pending--;
    if (status != SKH_ST_OK) {
        s->state = status == SKH_ST_LOST ? SLOT_DONE_LOST : SLOT_DONE;
        emit(e, s, status, NULL);
        return;
    }
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
    uint8_t src_r = (s->have & HAVE_T34) ? s->t34_src : SKH_TS_NONE;
    int st = skh_proto_rtt(s->t1, t2, src_p, s->t3, s->t4, src_r, t5, t6, &r);
    emit(e, s, (uint8_t)st, &r);
}

/* ------------------------------------------------------------------------------------------------ */
/* sending */

static void flush(struct skh_engine *e);

/* Queues one message for the next send() batch. Every message the engine builds encodes (probe_len
 * is checked at create), so encoding cannot fail here. */
static void queue(struct skh_engine *e, uint8_t kind, uint32_t ref, const skh_addr *dst,
                  const struct skh_msg *msg, uint8_t want_stamp)
{
    if (e->out.n == BATCH)
        flush(e);
    unsigned i = e->out.n;
    int len = skh_proto_encode(msg, e->cfg.probe_len, e->out.buf[i], sizeof(e->out.buf[i]));
    e->out.dst[i] = *dst;
    e->out.pkt[i].buf = e->out.buf[i];
    e->out.pkt[i].len = (uint32_t)len;
    e->out.pkt[i].dst = &e->out.dst[i];
    e->out.pkt[i].want_stamp = want_stamp && (e->caps & SKH_TCAP_TX_STAMPS);
    e->out.kind[i] = kind;
    e->out.ref[i] = ref;
    e->out.n++;
}

static uint8_t status_of_errno(int err)
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
        return SKH_ST_UNREACHABLE;
    default:
        return SKH_ST_LOST;
    }
}

static void sent_one(struct skh_engine *e, unsigned i, int64_t t_before)
{
    uint32_t ref = e->out.ref[i];
    struct skh_txpkt *p = &e->out.pkt[i];

    if (e->out.kind[i] == TX_PROBE) {
        struct slot *s = &e->slots[ref & e->slot_mask];
        s->t2u = t_before;
        inc(e, SKH_STAT_sent, 1);
    } else {
        inc(e, SKH_STAT_replies_sent, 1);
    }
    if (p->want_stamp && e->out.kind[i] != TX_NONE) {
        struct txmap_entry *m = &e->txmap[txslot(p->tx_id)];
        m->tx_id = p->tx_id;
        m->kind = e->out.kind[i];
        m->ref = ref;
    }
}

static void send_failed(struct skh_engine *e, unsigned i, int err, int64_t now)
{
    uint32_t ref = e->out.ref[i];
    if (e->out.kind[i] == TX_PROBE) {
        struct slot *s = &e->slots[ref & e->slot_mask];
        inc(e, SKH_STAT_send_errors, 1);
        finish(e, s, status_of_errno(err), now);
        return;
    }
    inc(e, SKH_STAT_reply_errors, 1);
    if (e->out.kind[i] == TX_ACK1) /* no ACK1 on the wire: no ACK2 either */
        e->resp[ref & (RESP_CAP - 1)].state = RESP_DONE;
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
        if (err == ECONNREFUSED && stale_retries++ < 2)
            continue;
        if (err == EINTR)
            continue;
        send_failed(e, done, err, t);
        done++;
    }
    e->out.n = 0;
}

/* When probes are batched, a target's schedule sits on the grid of its interval (multiples of it
 * from the engine's grid_ns), so targets that share an interval fall due together however far apart
 * they were added, and one wake-up sends them all. The step onto the grid is at least half an
 * interval. Each engine's grid has its own random origin: engines on one host do not burst in step. */
static int64_t next_slot(const struct skh_engine *e, const struct target *t, int64_t now)
{
    if (e->cfg.batch_window_ns == 0)
        return now + t->interval_ns;
    int64_t x = now + t->interval_ns / 2 - e->grid_ns;
    int64_t k = x / t->interval_ns - (x % t->interval_ns < 0); /* floor */
    return e->grid_ns + (k + 1) * t->interval_ns;
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
            memset(s, 0, sizeof(*s));
            s->wire_seq = seq;
            s->state = SLOT_PENDING;
            e->pending++;
            s->dst_ep = t->dst_ep;
            s->tgt_seq = t->seq++;
            s->path_id = t->path_id;
            s->t_wall = now_ns(CLOCK_REALTIME);
            s->t1 = mono();
            struct skh_msg m = {.type = SKH_MSG_PROBE, .session = e->session, .seq = seq,
                                .path_id = t->path_id, .t1 = (uint64_t)s->t1};
            queue(e, TX_PROBE, seq, &t->addr, &m, 1);
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
    } else {
        skh_proto_ack2(&r->probe, e->session, (uint64_t)r->t3u, (uint64_t)r->t4u, SKH_TS_USER, &ack);
        inc(e, SKH_STAT_replies_user_stamps, 1);
    }
    r->state = RESP_DONE;
    queue(e, TX_NONE, 0, &r->to, &ack, 0);
}

static void resp_sweep(struct skh_engine *e, int64_t now, int64_t *next)
{
    while (e->resp_tail != e->resp_head) {
        struct resp_entry *r = &e->resp[e->resp_tail & (RESP_CAP - 1)];
        if (r->state == RESP_WAITING) {
            if (now < r->deadline) {
                if (r->deadline < *next)
                    *next = r->deadline;
                return;
            }
            send_ack2(e, r, 0, 0, SKH_TS_NONE);
        }
        r->state = RESP_FREE;
        e->resp_tail++;
    }
}

static void on_probe(struct skh_engine *e, const struct skh_msg *m, const struct skh_rxpkt *p, int64_t t_rx)
{
    inc(e, SKH_STAT_probes_received, 1);
    if (e->resp_head - e->resp_tail >= RESP_CAP) {
        /* the oldest waiter gives up on its stamp so this probe still gets both answers */
        struct resp_entry *old = &e->resp[e->resp_tail & (RESP_CAP - 1)];
        if (old->state == RESP_WAITING)
            send_ack2(e, old, 0, 0, SKH_TS_NONE);
        old->state = RESP_FREE;
        e->resp_tail++;
    }
    uint32_t idx = e->resp_head++;
    struct resp_entry *r = &e->resp[idx & (RESP_CAP - 1)];
    r->state = RESP_WAITING;
    r->probe = *m;
    r->to = p->src;
    r->t3 = p->ts_ns;
    r->t3_src = p->ts_source;
    r->t3u = t_rx;
    r->t4u = 0;
    r->deadline = t_rx + T4_WAIT_NS;
    struct skh_msg ack;
    skh_proto_ack1(m, e->session, &ack);
    queue(e, TX_ACK1, idx, &p->src, &ack, r->t3_src != SKH_TS_NONE);
}

/* After ACK1s went out: note their user send time; without a stamp to wait for, answer ACK2 now. */
static void after_ack1s(struct skh_engine *e, uint32_t from, int64_t t_sent)
{
    for (uint32_t i = from; i != e->resp_head; i++) {
        struct resp_entry *r = &e->resp[i & (RESP_CAP - 1)];
        if (r->state != RESP_WAITING || r->t4u)
            continue;
        r->t4u = t_sent;
        if (r->t3_src == SKH_TS_NONE || !(e->caps & SKH_TCAP_TX_STAMPS))
            send_ack2(e, r, 0, 0, SKH_TS_NONE);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* prober side of receiving */

static void maybe_complete(struct skh_engine *e, struct slot *s, int64_t now)
{
    if ((s->have & (HAVE_ACK1 | HAVE_ACK2)) != (HAVE_ACK1 | HAVE_ACK2))
        return;
    /* wait for T2 while it can still come (a NIC stamps asynchronously); the deadline ends the wait */
    if ((e->caps & SKH_TCAP_TX_STAMPS) && s->t2_src == SKH_TS_NONE && s->t5_src != SKH_TS_NONE)
        return;
    finish(e, s, SKH_ST_OK, now);
}

static void on_ack(struct skh_engine *e, const struct skh_msg *m, const struct skh_rxpkt *p, int64_t t_rx)
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
    } else if (m->flags & SKH_FLAG_T34_VALID) {
        s->have |= HAVE_T34;
        s->t3 = (int64_t)m->t3;
        s->t4 = (int64_t)m->t4;
        s->t34_src = m->ts_source;
    }
    maybe_complete(e, s, t_rx);
}

static void on_error_report(struct skh_engine *e, const struct skh_rxpkt *p, int64_t now)
{
    struct skh_msg m;
    inc(e, SKH_STAT_icmp_errors, 1);
    if (skh_proto_peek(p->buf, p->len, &m) != 0 || m.type != SKH_MSG_PROBE || m.session != e->session)
        return; /* about an ACK we sent (its prober went away): nothing to decide */
    struct slot *s = &e->slots[m.seq & e->slot_mask];
    if (s->state != SLOT_PENDING || s->wire_seq != m.seq)
        return;
    finish(e, s, status_of_errno(-p->err), now);
}

static int on_stamps(struct skh_engine *e, int64_t now);

static int on_rx(struct skh_engine *e)
{
    for (unsigned i = 0; i < BATCH; i++) {
        e->rx[i].buf = e->rxbuf[i];
        e->rx[i].cap = sizeof(e->rxbuf[i]);
    }
    int n = e->ops->recv(e->tr, e->rx, BATCH);
    if (n <= 0)
        return 0;
    int64_t t_rx = mono();
    uint32_t resp_from = e->resp_head;
    inc(e, SKH_STAT_received, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const struct skh_rxpkt *p = &e->rx[i];
        struct skh_msg m;
        if (p->err) {
            on_error_report(e, p, t_rx);
            continue;
        }
        int rc = p->truncated || p->len > SKH_PROBE_MAX_LEN ? -SKH_DROP_TRUNCATED
                                                            : skh_proto_decode(p->buf, p->len, &m);
        if (rc < 0) {
            inc(e, (enum skh_stat)(SKH_STAT_drop_truncated + (-rc - 1)), 1);
            continue;
        }
        if (m.type == SKH_MSG_PROBE)
            on_probe(e, &m, p, t_rx);
        else
            on_ack(e, &m, p, t_rx);
    }
    if (e->out.n) {
        /* user-clock T4 is read before sending ACK1 (and T3 after receiving the probe): the pair
         * under-estimates the responder's delay, never over-estimates it */
        int64_t t_send = mono();
        flush(e);
        after_ack1s(e, resp_from, t_send);
        flush(e);
        /* lo/veth (and most NICs' software path) stamp ACK1 during the send: answering ACK2 now lets
         * the prober take both replies in one wake-up */
        if (e->resp_head != resp_from)
            on_stamps(e, mono());
    }
    return n;
}

static int on_stamps(struct skh_engine *e, int64_t now)
{
    int n = e->ops->stamps(e->tr, e->st, BATCH);
    for (int i = 0; i < n; i++) {
        const struct skh_txstamp *ts = &e->st[i];
        struct txmap_entry *m = &e->txmap[txslot(ts->tx_id)];
        if (m->kind == TX_NONE || m->tx_id != ts->tx_id) {
            inc(e, SKH_STAT_tx_stamps_unmatched, 1);
            continue;
        }
        uint8_t kind = m->kind;
        m->kind = TX_NONE;
        if (kind == TX_PROBE) {
            struct slot *s = &e->slots[m->ref & e->slot_mask];
            if (s->state != SLOT_PENDING || s->wire_seq != m->ref) {
                inc(e, SKH_STAT_tx_stamps_unmatched, 1);
                continue;
            }
            s->t2 = ts->ts_ns;
            s->t2_src = ts->ts_source;
            inc(e, SKH_STAT_tx_stamps, 1);
            maybe_complete(e, s, now);
        } else {
            struct resp_entry *r = &e->resp[m->ref & (RESP_CAP - 1)];
            if (r->state != RESP_WAITING) {
                inc(e, SKH_STAT_tx_stamps_unmatched, 1);
                continue;
            }
            inc(e, SKH_STAT_tx_stamps, 1);
            send_ack2(e, r, 1, ts->ts_ns, ts->ts_source);
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
            /* Both answers but no T2: the user pair decides. One answer only: the path works but the
             * stamps are incomplete, which the arithmetic turns into INVALID. None: lost. */
            finish(e, s, s->have ? SKH_ST_OK : SKH_ST_LOST, now);
        }
        e->tail_seq++;
    }
    return INT64_MAX;
}

/* ------------------------------------------------------------------------------------------------ */
/* the thread */

static void *engine_main(void *arg)
{
    struct skh_engine *e = arg;
    struct pollfd pfd[2] = {
        {.fd = e->ops->pollfd(e->tr), .events = POLLIN},
        {.fd = e->wake_fd, .events = POLLIN},
    };

    while (atomic_load_explicit(&e->running, memory_order_acquire)) {
        inc(e, SKH_STAT_wakeups, 1);
        int64_t now = mono();
        int64_t next = send_due(e, now);
        int busy = 0;
        for (int r = 0; r < RECV_ROUNDS; r++) {
            int a = on_stamps(e, mono());
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
        if (e->out.n)
            flush(e);
        gauge(e, SKH_STAT_in_flight, e->pending);
        /* Replies or timeouts made room for probes that were held back: send them now, once half the
         * limit is free, so they leave (and come back) in batches rather than one per wake-up. */
        if (busy || (e->blocked && e->pending <= e->cfg.max_in_flight / 2 && e->next_seq - e->tail_seq <= e->slot_mask))
            continue;
        if (e->ops->arm) {
            int a = e->ops->arm(e->tr);
            if (a > 0)
                continue;
        }
        struct timespec ts, *tsp = NULL;
        now = mono();
        if (next != INT64_MAX) {
            int64_t wait = next > now ? next - now : 0;
            ts.tv_sec = wait / 1000000000LL;
            ts.tv_nsec = wait % 1000000000LL;
            tsp = &ts;
        }
        pfd[0].fd = e->ops->pollfd(e->tr); /* may change as a transport grows (UDP path sockets) */
        if (ppoll(pfd, 2, tsp, NULL) > 0 && (pfd[1].revents & POLLIN)) {
            uint64_t v;
            (void)!read(e->wake_fd, &v, sizeof(v));
        }
    }
    return NULL;
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
        cfg->probe_len < SKH_PROBE_MIN_LEN || cfg->probe_len > SKH_PROBE_MAX_LEN ||
        cfg->ring_records == 0 || cfg->max_in_flight > SKH_MAX_IN_FLIGHT)
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
    e->resp = calloc(RESP_CAP, sizeof(*e->resp));
    e->txmap = calloc(TXMAP_CAP, sizeof(*e->txmap));
    int rc = -ENOMEM;
    if (!e->ring || !e->slots || !e->resp || !e->txmap)
        goto fail;
    if (getrandom(&e->session, sizeof(e->session), 0) != sizeof(e->session))
        e->session = (uint32_t)now_ns(CLOCK_REALTIME) ^ (uint32_t)getpid();
    if (e->session == 0)
        e->session = 1;
    e->grid_ns = (int64_t)e->session; /* a random point within ~4 s */
    /* start wire seqs at a random point so a restarted prober's old replies cannot match */
    e->next_seq = e->tail_seq = (uint32_t)now_ns(CLOCK_MONOTONIC);
    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->wake_fd < 0) {
        rc = -errno;
        goto fail;
    }
    rc = ops->open(&cfg->tcfg, &e->tr);
    if (rc)
        goto fail;
    e->caps = ops->caps(e->tr);
    *out = e;
    return 0;
fail:
    skh_engine_destroy(e);
    return rc;
}

int skh_engine_start(struct skh_engine *e)
{
    if (e->thread_started)
        return 0;
    atomic_store(&e->running, 1);
    /* The thread takes no signals: they belong to the owner (Python runs its handlers in the main
     * thread, and a Ctrl-C delivered here would not interrupt the main thread's sleep). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&e->thread, NULL, engine_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        atomic_store(&e->running, 0);
        return -rc;
    }
    e->thread_started = 1;
    return 0;
}

int skh_engine_stop(struct skh_engine *e)
{
    if (!e->thread_started)
        return 0;
    atomic_store_explicit(&e->running, 0, memory_order_release);
    wake(e);
    int rc = pthread_join(e->thread, NULL);
    e->thread_started = 0;
    return -rc;
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
    free(e->targets);
    free(e->ring);
    free(e->slots);
    free(e->resp);
    free(e->txmap);
    free(e);
}

int skh_engine_add_target(struct skh_engine *e, uint32_t dst_ep, const char *host, uint16_t port,
                          const char *gid, uint32_t qpn, uint16_t path_id, int64_t interval_ns,
                          uint32_t count)
{
    skh_addr addr;
    if (interval_ns <= 0)
        return -EINVAL;
    int rc = e->ops->parse_addr(e->tr, host, port, gid, qpn, path_id, &addr);
    if (rc)
        return rc;
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
                return -ENOMEM;
            }
            e->targets = nt;
            e->cap_targets = cap;
        }
        t = &e->targets[e->n_targets++];
        memset(t, 0, sizeof(*t));
    }
    if (!t->active || t->dst_ep != dst_ep)
        t->seq = 0;
    t->dst_ep = dst_ep;
    t->path_id = path_id;
    t->addr = addr;
    t->interval_ns = interval_ns;
    t->remaining = count;
    t->next_due = mono();
    t->on_grid = 0;
    t->active = 1;
    pthread_mutex_unlock(&e->tlock);
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

int skh_engine_local(struct skh_engine *e, skh_addr *out) { return e->ops->local(e->tr, out); }

unsigned skh_engine_transport_caps(struct skh_engine *e) { return e->caps; }

uint32_t skh_engine_session(struct skh_engine *e) { return e->session; }
