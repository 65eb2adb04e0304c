/* A stand-in for libibverbs.so.1 with ConnectX-like devices, for testing the engine's hardware
 * path without hardware (tests/verbs/test_hwsim.py; the seam is explained in docs/engine.md).
 *
 * The engine dlopens "libibverbs.so.1" and binds the versioned symbols it needs with dlvsym; the
 * data path goes through the ops of the verbs_context that ibv_open_device returns. This library
 * provides both, compiled against the same <infiniband/verbs.h> as the engine, so everything from
 * the engine's dlopen down runs unmodified: device/GID choice, CQ creation with completion
 * timestamps, the tick clock, AH creation, UD sends, completion channels, QP state handling.
 *
 * The "fabric": every device lives in this process. A UD send is delivered to the destination QP
 * after a configured one-way delay by a delivery thread, with a GRH in front of the payload as
 * RoCE v2 over IPv4 has it. Completion timestamps come from a free-running counter per device:
 * raw = (offset + (t - t0) * khz / 1e6) & mask, t on CLOCK_MONOTONIC, so frequency, start offset and
 * wrap (mask) are each device's own. Events (departures, arrivals) happen on a grid of grid_ns
 * (default 32 ns, a whole number of ticks at 156.25 MHz, 625 MHz and 1 GHz), so stamps carry no
 * quantisation error and a test can demand RTTs exact to a tick.
 *
 * Configuration (environment SKH_HWSIM, read once), ';'-separated:
 *   dev=NAME,IPV4,KHZ,MASK,OFFSET     a device (KHZ 0: no completion timestamps, like rxe)
 *   delay=SRC,DST,NS                  one-way delay from device SRC to DST ('*' = any)
 *   grid=NS                           event grid (1 = none)
 *   ah_delay=NS                       ibv_create_ah blocks this long the first time a device
 *                                     pair is resolved (the kernel's ARP on a real NIC)
 * Test controls (skh_hwsim_*, below): loss per direction and message type, forcing a QP into the
 * error state, failing post_send, and a log of every datagram with its fate.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVS 8
#define MAX_QPS 64
#define LOG_CAP (1u << 18)
/* A function exported under libibverbs' name (its C name differs: verbs.h has macros and
 * prototypes of several); the version script gives it libibverbs' symbol version. */
#define EXPORT(name, ret, ...)                                                                     \
    ret sim_##name(__VA_ARGS__) __asm__(#name);                                                    \
    ret sim_##name(__VA_ARGS__)

typedef unsigned __int128 u128;

struct sim_dev {
    struct ibv_device dev;
    uint32_t ipv4; /* host order */
    uint64_t khz, mask, offset;
    uint8_t gid[4][16];
};

struct sim_ctx {
    struct verbs_context vctx; /* ibv_context is its last member */
    struct sim_dev *dev;
};

struct sim_cqe {
    uint64_t wr_id;
    enum ibv_wc_status status;
    enum ibv_wc_opcode opcode;
    uint32_t byte_len, src_qp, qp_num, wc_flags;
    uint64_t ts;
};

struct sim_channel;

struct sim_cq {
    struct ibv_cq_ex ex;
    struct sim_dev *dev;
    struct sim_cqe *ring, cur;
    unsigned cap, head, tail;
    int armed, ts_enabled;
    struct sim_channel *ch;
};

struct sim_channel {
    struct ibv_comp_channel ch;
    int wfd;
    struct sim_cq *cq;
};

struct sim_rwr {
    uint64_t wr_id, addr;
    uint32_t len;
};

struct sim_qp {
    struct ibv_qp qp;
    struct sim_dev *dev;
    struct sim_cq *scq, *rcq;
    uint32_t qkey;
    struct sim_rwr *rq;
    unsigned rq_cap, rq_head, rq_tail;
    int fail_posts, fail_err;
};

struct sim_ah {
    struct ibv_ah ah;
    struct ibv_ah_attr attr;
    struct sim_dev *dst;
};

struct sim_pkt {
    int64_t due;
    struct sim_dev *dst;
    uint32_t dst_qpn, src_qpn, qkey, len, log_idx;
    uint32_t src_ip, dst_ip;
    uint8_t tclass, hop;
    struct sim_pkt *next;
    uint8_t data[];
};

/* One datagram's fate, for the tests (skh_hwsim_log). */
struct skh_hwsim_event {
    int64_t t_ns; /* departure */
    int64_t deliver_ns; /* when the delivery thread handed it over (late on a busy machine) */
    uint32_t session, seq, stream, tseq, flow_label;
    uint8_t type; /* the probe protocol's message type (byte 5), 0 when not one of ours */
    uint8_t src_dev, dst_dev, tclass, sl;
    uint8_t fate; /* 0 in flight, 1 delivered, 2 dropped by injected loss, 3 no QP/receive */
};

static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t G_cond;
static pthread_once_t G_once = PTHREAD_ONCE_INIT;
static struct sim_dev devs[MAX_DEVS];
static struct ibv_device *dev_list[MAX_DEVS + 1];
static int n_devs;
static int64_t delay_ns[MAX_DEVS][MAX_DEVS];
static double loss_p[MAX_DEVS][MAX_DEVS];
static int loss_type[MAX_DEVS][MAX_DEVS];
static uint8_t resolved[MAX_DEVS][MAX_DEVS];
static int64_t grid_ns = 32, ah_delay_ns, t0;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static struct sim_qp *qps[MAX_QPS];
static uint32_t next_qpn = 0x1a0;
static struct sim_pkt *pending;
static struct skh_hwsim_event *log_buf;
static uint32_t log_n;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t snap(int64_t t)
{
    if (grid_ns <= 1)
        return t;
    int64_t k = (t - t0 + grid_ns - 1) / grid_ns;
    return t0 + k * grid_ns;
}

static uint64_t counter(const struct sim_dev *d, int64_t t)
{
    u128 ticks = (u128)(uint64_t)(t - t0) * d->khz / 1000000u;
    return (d->offset + (uint64_t)ticks) & d->mask;
}

static double rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static int dev_index(const char *name)
{
    for (int i = 0; i < n_devs; i++)
        if (strcmp(devs[i].dev.name, name) == 0)
            return i;
    return -1;
}

static void set_pair(int64_t (*m)[MAX_DEVS], const char *a, const char *b, int64_t v)
{
    for (int i = 0; i < n_devs; i++)
        for (int j = 0; j < n_devs; j++)
            if ((!strcmp(a, "*") || i == dev_index(a)) && (!strcmp(b, "*") || j == dev_index(b)))
                m[i][j] = v;
}

static void add_dev(const char *spec)
{
    char name[64], ip[32];
    unsigned long long khz, mask, offset;
    if (n_devs == MAX_DEVS ||
        sscanf(spec, "%63[^,],%31[^,],%llu,%lli,%lli", name, ip, &khz, &mask, &offset) != 5)
        return;
    unsigned a, b, c, d;
    if (sscanf(ip, "%u.%u.%u.%u", &a, &b, &c, &d) != 4)
        return;
    struct sim_dev *s = &devs[n_devs];
    memset(s, 0, sizeof(*s));
    snprintf(s->dev.name, sizeof(s->dev.name), "%s", name);
    snprintf(s->dev.dev_name, sizeof(s->dev.dev_name), "uverbs%d", n_devs);
    s->dev.node_type = IBV_NODE_CA;
    s->dev.transport_type = IBV_TRANSPORT_IB;
    s->ipv4 = a << 24 | b << 16 | c << 8 | d;
    s->khz = khz;
    s->mask = mask;
    s->offset = offset;
    /* a ConnectX's table: link-local v1, v2, then the IPv4 address v1, v2 */
    for (int g = 0; g < 2; g++) {
        uint8_t *ll = s->gid[g];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[8] = 0x02;
        ll[15] = (uint8_t)(n_devs + 1);
        uint8_t *v4 = s->gid[2 + g];
        v4[10] = v4[11] = 0xff;
        v4[12] = (uint8_t)a, v4[13] = (uint8_t)b, v4[14] = (uint8_t)c, v4[15] = (uint8_t)d;
    }
    dev_list[n_devs] = &s->dev;
    n_devs++;
}

static void *deliver_main(void *arg);

static void init_once(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&G_cond, &ca);
    t0 = now_ns();
    log_buf = calloc(LOG_CAP, sizeof(*log_buf));
    const char *env = getenv("SKH_HWSIM");
    char *cfg = strdup(env ? env : "dev=mlx5_0,10.77.0.1,156250,0x7fffffffffffffff,0");
    for (char *save = NULL, *tok = strtok_r(cfg, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        if (!strncmp(tok, "dev=", 4)) {
            add_dev(tok + 4);
        } else if (!strncmp(tok, "delay=", 6)) {
            char a[64], b[64];
            long long ns;
            if (sscanf(tok + 6, "%63[^,],%63[^,],%lld", a, b, &ns) == 3)
                set_pair(delay_ns, a, b, ns);
        } else if (!strncmp(tok, "grid=", 5)) {
            grid_ns = strtoll(tok + 5, NULL, 0);
        } else if (!strncmp(tok, "ah_delay=", 9)) {
            ah_delay_ns = strtoll(tok + 9, NULL, 0);
        }
    }
    free(cfg);
    pthread_t th;
    pthread_create(&th, NULL, deliver_main, NULL);
    pthread_setname_np(th, "hwsim-nic"); /* the NIC's work, told apart from the engines' */
    pthread_detach(th);
}

static void init(void) { pthread_once(&G_once, init_once); }

/* ---------------------------------------------------------------------------------- CQs */

/* completion notifications requested and delivered (events written to channels): on a NIC each
 * event is an interrupt and each request a doorbell */
static uint64_t n_notify_requests, n_notify_events;

static void push_cqe(struct sim_cq *cq, const struct sim_cqe *e)
{
    if (cq->tail - cq->head == cq->cap)
        return; /* overrun: a real CQ would go to error; the engine sizes it so this never happens */
    cq->ring[cq->tail++ % cq->cap] = *e;
    if (cq->armed && cq->ch) {
        cq->armed = 0;
        n_notify_events++;
        (void)!write(cq->ch->wfd, "x", 1);
    }
}

static int cq_start_poll(struct ibv_cq_ex *ex, struct ibv_poll_cq_attr *attr)
{
    struct sim_cq *cq = (struct sim_cq *)ex;
    pthread_mutex_lock(&G);
    if (cq->head == cq->tail) {
        pthread_mutex_unlock(&G);
        return ENOENT;
    }
    cq->cur = cq->ring[cq->head++ % cq->cap];
    pthread_mutex_unlock(&G);
    ex->wr_id = cq->cur.wr_id;
    ex->status = cq->cur.status;
    return 0;
}

static int cq_next_poll(struct ibv_cq_ex *ex) { return cq_start_poll(ex, NULL); }
static void cq_end_poll(struct ibv_cq_ex *ex) {}
static enum ibv_wc_opcode cq_opcode(struct ibv_cq_ex *ex) { return ((struct sim_cq *)ex)->cur.opcode; }
static uint32_t cq_vendor_err(struct ibv_cq_ex *ex) { return 0; }
static uint32_t cq_byte_len(struct ibv_cq_ex *ex) { return ((struct sim_cq *)ex)->cur.byte_len; }
static uint32_t cq_qp_num(struct ibv_cq_ex *ex) { return ((struct sim_cq *)ex)->cur.qp_num; }
static uint32_t cq_src_qp(struct ibv_cq_ex *ex) { return ((struct sim_cq *)ex)->cur.src_qp; }
static unsigned cq_wc_flags(struct ibv_cq_ex *ex) { return ((struct sim_cq *)ex)->cur.wc_flags; }
static uint64_t cq_ts(struct ibv_cq_ex *ex) { return ((struct sim_cq *)ex)->cur.ts; }

static int ctx_req_notify(struct ibv_cq *cq, int solicited_only)
{
    pthread_mutex_lock(&G);
    ((struct sim_cq *)cq)->armed = 1;
    n_notify_requests++;
    pthread_mutex_unlock(&G);
    return 0;
}

static int ctx_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return -1; }

static struct ibv_cq_ex *ctx_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *a)
{
    struct sim_dev *dev = ((struct sim_ctx *)verbs_get_ctx(ctx))->dev;
    if ((a->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) && !dev->khz) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct sim_cq *cq = calloc(1, sizeof(*cq));
    cq->dev = dev;
    cq->cap = (unsigned)a->cqe * 2 + 64;
    cq->ring = calloc(cq->cap, sizeof(*cq->ring));
    cq->ts_enabled = (a->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) != 0;
    cq->ch = a->channel ? (struct sim_channel *)a->channel : NULL;
    if (cq->ch)
        cq->ch->cq = cq;
    struct ibv_cq_ex *ex = &cq->ex;
    ex->context = ctx;
    ex->channel = a->channel;
    ex->cq_context = a->cq_context;
    ex->cqe = (int)a->cqe;
    ex->start_poll = cq_start_poll;
    ex->next_poll = cq_next_poll;
    ex->end_poll = cq_end_poll;
    ex->read_opcode = cq_opcode;
    ex->read_vendor_err = cq_vendor_err;
    ex->read_byte_len = cq_byte_len;
    ex->read_qp_num = cq_qp_num;
    ex->read_src_qp = cq_src_qp;
    ex->read_wc_flags = cq_wc_flags;
    ex->read_completion_ts = cq_ts;
    return ex;
}

/* Drops the CQEs of qpn from cq (a reset QP's completions vanish, as mlx5 cleans them). */
static void cq_clean(struct sim_cq *cq, uint32_t qpn)
{
    if (!cq)
        return;
    unsigned w = cq->head;
    for (unsigned r = cq->head; r != cq->tail; r++)
        if (cq->ring[r % cq->cap].qp_num != qpn)
            cq->ring[w++ % cq->cap] = cq->ring[r % cq->cap];
    cq->tail = w;
}

/* ---------------------------------------------------------------------------------- QPs */

static void flush_rq(struct sim_qp *qp)
{
    while (qp->rq_head != qp->rq_tail) {
        struct sim_rwr *w = &qp->rq[qp->rq_head++ % qp->rq_cap];
        struct sim_cqe e = {.wr_id = w->wr_id, .status = IBV_WC_WR_FLUSH_ERR, .opcode = IBV_WC_RECV,
                            .qp_num = qp->qp.qp_num};
        push_cqe(qp->rcq, &e);
    }
}

static void set_state(struct sim_qp *qp, enum ibv_qp_state s)
{
    if (s == IBV_QPS_RESET) {
        qp->rq_head = qp->rq_tail = 0;
        cq_clean(qp->scq, qp->qp.qp_num);
        cq_clean(qp->rcq, qp->qp.qp_num);
    } else if (s == IBV_QPS_ERR) {
        flush_rq(qp);
    }
    qp->qp.state = s;
}

static const char *hdr_of(const uint8_t *p, uint32_t len, struct skh_hwsim_event *ev)
{
    /* the probe protocol's header (csrc/proto.h), read only to label the log */
    if (len < 48 || p[0] != 'S' || p[1] != 'K' || p[2] != 'H' || p[3] != 'P')
        return NULL;
    ev->type = p[5];
    ev->session = (uint32_t)p[8] << 24 | p[9] << 16 | p[10] << 8 | p[11];
    ev->seq = (uint32_t)p[12] << 24 | p[13] << 16 | p[14] << 8 | p[15];
    if (p[5] == 1 && len >= 64 && !memcmp(p + 48, "RCPT", 4)) {
        ev->stream = (uint32_t)p[52] << 24 | p[53] << 16 | p[54] << 8 | p[55];
        ev->tseq = (uint32_t)p[56] << 24 | p[57] << 16 | p[58] << 8 | p[59];
    }
    return "";
}

static int ctx_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct sim_qp *qp = (struct sim_qp *)ibqp;
    int64_t now = now_ns();
    pthread_mutex_lock(&G);
    for (; wr; wr = wr->next) {
        if (qp->fail_posts > 0) {
            qp->fail_posts--;
            *bad = wr;
            pthread_mutex_unlock(&G);
            return qp->fail_err;
        }
        int signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        if (qp->qp.state == IBV_QPS_ERR) { /* accepted, then flushed */
            struct sim_cqe e = {.wr_id = wr->wr_id, .status = IBV_WC_WR_FLUSH_ERR,
                                .opcode = IBV_WC_SEND, .qp_num = ibqp->qp_num};
            if (signaled)
                push_cqe(qp->scq, &e);
            continue;
        }
        if (qp->qp.state != IBV_QPS_RTS || wr->opcode != IBV_WR_SEND || !wr->wr.ud.ah) {
            *bad = wr;
            pthread_mutex_unlock(&G);
            return EINVAL;
        }
        struct sim_ah *ah = (struct sim_ah *)wr->wr.ud.ah;
        uint32_t len = 0;
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        struct sim_pkt *p = malloc(sizeof(*p) + len);
        uint32_t off = 0;
        for (int i = 0; i < wr->num_sge; i++) {
            memcpy(p->data + off, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
            off += wr->sg_list[i].length;
        }
        int64_t depart = snap(now);
        int si = (int)(qp->dev - devs), di = (int)(ah->dst - devs);
        p->due = depart + delay_ns[si][di];
        p->dst = ah->dst;
        p->dst_qpn = wr->wr.ud.remote_qpn;
        p->src_qpn = ibqp->qp_num;
        p->qkey = wr->wr.ud.remote_qkey;
        p->len = len;
        p->src_ip = qp->dev->ipv4;
        p->dst_ip = ah->dst->ipv4;
        p->tclass = ah->attr.grh.traffic_class;
        p->hop = ah->attr.grh.hop_limit;
        struct skh_hwsim_event ev = {.t_ns = depart, .src_dev = (uint8_t)si, .dst_dev = (uint8_t)di,
                                     .tclass = ah->attr.grh.traffic_class, .sl = ah->attr.sl,
                                     .flow_label = ah->attr.grh.flow_label};
        hdr_of(p->data, len, &ev);
        int drop = loss_p[si][di] > 0 && (!loss_type[si][di] || loss_type[si][di] == ev.type) &&
                   rnd() < loss_p[si][di];
        ev.fate = drop ? 2 : 0;
        p->log_idx = log_n < LOG_CAP ? log_n : UINT32_MAX;
        if (log_n < LOG_CAP)
            log_buf[log_n++] = ev;
        if (signaled) {
            struct sim_cqe e = {.wr_id = wr->wr_id, .status = IBV_WC_SUCCESS, .opcode = IBV_WC_SEND,
                                .qp_num = ibqp->qp_num, .ts = counter(qp->dev, depart)};
            push_cqe(qp->scq, &e);
        }
        if (drop) {
            free(p);
            continue;
        }
        struct sim_pkt **pp = &pending; /* sorted by due; equal dues keep their order */
        while (*pp && (*pp)->due <= p->due)
            pp = &(*pp)->next;
        p->next = *pp;
        *pp = p;
        pthread_cond_signal(&G_cond);
    }
    pthread_mutex_unlock(&G);
    return 0;
}

static int ctx_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct sim_qp *qp = (struct sim_qp *)ibqp;
    pthread_mutex_lock(&G);
    for (; wr; wr = wr->next) {
        if (qp->qp.state == IBV_QPS_RESET || qp->rq_tail - qp->rq_head == qp->rq_cap) {
            *bad = wr;
            pthread_mutex_unlock(&G);
            return qp->qp.state == IBV_QPS_RESET ? EINVAL : ENOMEM;
        }
        qp->rq[qp->rq_tail++ % qp->rq_cap] =
            (struct sim_rwr){.wr_id = wr->wr_id, .addr = wr->sg_list[0].addr, .len = wr->sg_list[0].length};
        if (qp->qp.state == IBV_QPS_ERR)
            flush_rq(qp);
    }
    pthread_mutex_unlock(&G);
    return 0;
}

static uint16_t csum(const uint8_t *h)
{
    uint32_t s = 0;
    for (int i = 0; i < 20; i += 2)
        if (i != 10)
            s += (uint32_t)h[i] << 8 | h[i + 1];
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

/* Delivery thread: hands due datagrams to their QP's receive queue. Caller holds G. */
static void deliver(struct sim_pkt *p)
{
    struct sim_qp *qp = NULL;
    for (int i = 0; i < MAX_QPS; i++)
        if (qps[i] && qps[i]->qp.qp_num == p->dst_qpn && qps[i]->dev == p->dst)
            qp = qps[i];
    int ok = qp && (qp->qp.state == IBV_QPS_RTR || qp->qp.state == IBV_QPS_RTS) &&
             qp->qkey == p->qkey && qp->rq_head != qp->rq_tail;
    if (p->log_idx != UINT32_MAX) {
        log_buf[p->log_idx].fate = ok ? 1 : 3;
        log_buf[p->log_idx].deliver_ns = now_ns();
    }
    if (!ok)
        return; /* UD: no QP, wrong Q_Key or an empty receive queue is a silent drop */
    struct sim_rwr w = qp->rq[qp->rq_head++ % qp->rq_cap];
    struct sim_cqe e = {.wr_id = w.wr_id, .opcode = IBV_WC_RECV, .qp_num = qp->qp.qp_num,
                        .src_qp = p->src_qpn, .wc_flags = IBV_WC_GRH,
                        .ts = counter(p->dst, p->due)};
    if (40 + p->len > w.len) {
        e.status = IBV_WC_LOC_LEN_ERR;
    } else {
        /* RoCE v2 over IPv4: 20 undefined bytes, then the IPv4 header */
        uint8_t *g = (uint8_t *)(uintptr_t)w.addr;
        memset(g, 0, 40);
        uint8_t *ip = g + 20;
        uint16_t tot = (uint16_t)(20 + 8 + 12 + p->len + 4);
        ip[0] = 0x45;
        ip[1] = p->tclass;
        ip[2] = (uint8_t)(tot >> 8), ip[3] = (uint8_t)tot;
        ip[8] = p->hop;
        ip[9] = 17;
        for (int k = 0; k < 4; k++) {
            ip[12 + k] = (uint8_t)(p->src_ip >> (24 - 8 * k));
            ip[16 + k] = (uint8_t)(p->dst_ip >> (24 - 8 * k));
        }
        uint16_t c = csum(ip);
        ip[10] = (uint8_t)(c >> 8), ip[11] = (uint8_t)c;
        memcpy(g + 40, p->data, p->len);
        e.status = IBV_WC_SUCCESS;
        e.byte_len = 40 + p->len;
    }
    push_cqe(qp->rcq, &e);
}

static void *deliver_main(void *arg)
{
    pthread_mutex_lock(&G);
    for (;;) {
        int64_t now = now_ns();
        while (pending && pending->due <= now) {
            struct sim_pkt *p = pending;
            pending = p->next;
            deliver(p);
            free(p);
        }
        if (pending) {
            struct timespec ts = {.tv_sec = pending->due / 1000000000LL,
                                  .tv_nsec = pending->due % 1000000000LL};
            pthread_cond_timedwait(&G_cond, &G, &ts);
        } else {
            pthread_cond_wait(&G_cond, &G);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------- context ops */

static int ctx_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t len)
{
    if (port != 1)
        return EINVAL;
    memset(a, 0, len);
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = IBV_MTU_4096;
    a->gid_tbl_len = 256;
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

static int ctx_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
                               struct ibv_device_attr_ex *a, size_t len)
{
    struct sim_dev *dev = ((struct sim_ctx *)verbs_get_ctx(ctx))->dev;
    memset(a, 0, len);
    a->orig_attr.phys_port_cnt = 1;
    a->orig_attr.max_qp = MAX_QPS;
    a->orig_attr.max_qp_wr = 32768;
    a->orig_attr.max_cqe = 1 << 22;
    a->orig_attr.max_ah = 1 << 20;
    a->completion_timestamp_mask = dev->khz ? dev->mask : 0;
    a->hca_core_clock = dev->khz;
    return 0;
}

/* ----------------------------------------------------------------- exported symbols */

EXPORT(ibv_get_device_list, struct ibv_device **, int *num)
{
    init();
    if (num)
        *num = n_devs;
    return dev_list;
}

EXPORT(ibv_free_device_list, void, struct ibv_device **list) {}

EXPORT(ibv_get_device_name, const char *, struct ibv_device *dev) { return dev->name; }

EXPORT(ibv_open_device, struct ibv_context *, struct ibv_device *dev)
{
    struct sim_ctx *c = calloc(1, sizeof(*c));
    c->dev = (struct sim_dev *)dev;
    c->vctx.sz = sizeof(struct verbs_context);
    c->vctx.query_port = ctx_query_port;
    c->vctx.query_device_ex = ctx_query_device_ex;
    c->vctx.create_cq_ex = ctx_create_cq_ex;
    struct ibv_context *ctx = &c->vctx.context;
    ctx->device = dev;
    ctx->cmd_fd = ctx->async_fd = -1;
    ctx->num_comp_vectors = 1;
    ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
    ctx->ops.post_send = ctx_post_send;
    ctx->ops.post_recv = ctx_post_recv;
    ctx->ops.req_notify_cq = ctx_req_notify;
    ctx->ops.poll_cq = ctx_poll_cq;
    pthread_mutex_init(&ctx->mutex, NULL);
    return ctx;
}

EXPORT(ibv_close_device, int, struct ibv_context *ctx)
{
    free(verbs_get_ctx(ctx));
    return 0;
}

EXPORT(ibv_query_device, int, struct ibv_context *ctx, struct ibv_device_attr *a)
{
    struct ibv_device_attr_ex ex;
    ctx_query_device_ex(ctx, NULL, &ex, sizeof(ex));
    *a = ex.orig_attr;
    return 0;
}

EXPORT(_ibv_query_gid_table, ssize_t, struct ibv_context *ctx, struct ibv_gid_entry *e, size_t max,
       uint32_t flags, size_t entry_size)
{
    struct sim_dev *dev = ((struct sim_ctx *)verbs_get_ctx(ctx))->dev;
    size_t n = 0;
    for (uint32_t i = 0; i < 4 && n < max; i++, n++) {
        struct ibv_gid_entry *x = (struct ibv_gid_entry *)((char *)e + n * entry_size);
        memset(x, 0, entry_size);
        memcpy(x->gid.raw, dev->gid[i], 16);
        x->gid_index = i;
        x->port_num = 1;
        x->gid_type = i % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
    }
    return (ssize_t)n;
}

EXPORT(ibv_alloc_pd, struct ibv_pd *, struct ibv_context *ctx)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    pd->context = ctx;
    return pd;
}

EXPORT(ibv_dealloc_pd, int, struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

EXPORT(ibv_reg_mr, struct ibv_mr *, struct ibv_pd *pd, void *addr, size_t len, int access)
{
    struct ibv_mr *mr = calloc(1, sizeof(*mr));
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = addr;
    mr->length = len;
    mr->lkey = mr->rkey = 0x1234;
    return mr;
}

EXPORT(ibv_dereg_mr, int, struct ibv_mr *mr)
{
    free(mr);
    return 0;
}

EXPORT(ibv_create_comp_channel, struct ibv_comp_channel *, struct ibv_context *ctx)
{
    struct sim_channel *ch = calloc(1, sizeof(*ch));
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        free(ch);
        return NULL;
    }
    ch->ch.context = ctx;
    ch->ch.fd = fds[0];
    ch->wfd = fds[1];
    return &ch->ch;
}

EXPORT(ibv_destroy_comp_channel, int, struct ibv_comp_channel *c)
{
    struct sim_channel *ch = (struct sim_channel *)c;
    close(ch->ch.fd);
    close(ch->wfd);
    free(ch);
    return 0;
}

EXPORT(ibv_get_cq_event, int, struct ibv_comp_channel *c, struct ibv_cq **cq, void **cq_ctx)
{
    struct sim_channel *ch = (struct sim_channel *)c;
    char b;
    if (read(ch->ch.fd, &b, 1) != 1)
        return -1;
    *cq = (struct ibv_cq *)&ch->cq->ex;
    *cq_ctx = ch->cq->ex.cq_context;
    return 0;
}

EXPORT(ibv_ack_cq_events, void, struct ibv_cq *cq, unsigned n) {}

EXPORT(ibv_destroy_cq, int, struct ibv_cq *ibcq)
{
    struct sim_cq *cq = (struct sim_cq *)ibcq;
    pthread_mutex_lock(&G);
    if (cq->ch)
        cq->ch->cq = NULL;
    pthread_mutex_unlock(&G);
    free(cq->ring);
    free(cq);
    return 0;
}

EXPORT(ibv_create_qp, struct ibv_qp *, struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    if (a->qp_type != IBV_QPT_UD) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct sim_qp *qp = calloc(1, sizeof(*qp));
    qp->dev = ((struct sim_ctx *)verbs_get_ctx(pd->context))->dev;
    qp->scq = (struct sim_cq *)a->send_cq;
    qp->rcq = (struct sim_cq *)a->recv_cq;
    qp->rq_cap = a->cap.max_recv_wr;
    qp->rq = calloc(qp->rq_cap, sizeof(*qp->rq));
    qp->qp.context = pd->context;
    qp->qp.pd = pd;
    qp->qp.send_cq = a->send_cq;
    qp->qp.recv_cq = a->recv_cq;
    qp->qp.qp_type = IBV_QPT_UD;
    qp->qp.state = IBV_QPS_RESET;
    pthread_mutex_lock(&G);
    qp->qp.qp_num = next_qpn++;
    for (int i = 0; i < MAX_QPS; i++)
        if (!qps[i]) {
            qps[i] = qp;
            break;
        }
    pthread_mutex_unlock(&G);
    return &qp->qp;
}

EXPORT(ibv_modify_qp, int, struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
    struct sim_qp *qp = (struct sim_qp *)ibqp;
    if (!(mask & IBV_QP_STATE))
        return 0;
    pthread_mutex_lock(&G);
    enum ibv_qp_state from = qp->qp.state, to = a->qp_state;
    int ok = to == IBV_QPS_RESET || to == IBV_QPS_ERR ||
             (to == IBV_QPS_INIT && (from == IBV_QPS_RESET || from == IBV_QPS_INIT)) ||
             (to == IBV_QPS_RTR && from == IBV_QPS_INIT) || (to == IBV_QPS_RTS && from == IBV_QPS_RTR);
    if (ok) {
        if (mask & IBV_QP_QKEY)
            qp->qkey = a->qkey;
        set_state(qp, to);
    }
    pthread_mutex_unlock(&G);
    return ok ? 0 : EINVAL;
}

EXPORT(ibv_query_qp, int, struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask,
       struct ibv_qp_init_attr *init)
{
    struct sim_qp *qp = (struct sim_qp *)ibqp;
    pthread_mutex_lock(&G);
    a->qp_state = qp->qp.state;
    a->qkey = qp->qkey;
    pthread_mutex_unlock(&G);
    return 0;
}

EXPORT(ibv_destroy_qp, int, struct ibv_qp *ibqp)
{
    struct sim_qp *qp = (struct sim_qp *)ibqp;
    pthread_mutex_lock(&G);
    for (int i = 0; i < MAX_QPS; i++)
        if (qps[i] == qp)
            qps[i] = NULL;
    pthread_mutex_unlock(&G);
    free(qp->rq);
    free(qp);
    return 0;
}

EXPORT(ibv_create_ah, struct ibv_ah *, struct ibv_pd *pd, struct ibv_ah_attr *a)
{
    struct sim_dev *src = ((struct sim_ctx *)verbs_get_ctx(pd->context))->dev, *dst = NULL;
    for (int i = 0; i < n_devs; i++)
        for (int g = 0; g < 4; g++)
            if (!memcmp(devs[i].gid[g], a->grh.dgid.raw, 16))
                dst = &devs[i];
    if (!a->is_global || a->grh.sgid_index > 3) {
        errno = EINVAL;
        return NULL;
    }
    int si = (int)(src - devs), di = dst ? (int)(dst - devs) : 0;
    pthread_mutex_lock(&G);
    int first = dst && !resolved[si][di];
    resolved[si][di] = dst != NULL;
    pthread_mutex_unlock(&G);
    if ((first || !dst) && ah_delay_ns) { /* neighbour resolution, as the kernel does it */
        struct timespec ts = {.tv_sec = ah_delay_ns / 1000000000LL, .tv_nsec = ah_delay_ns % 1000000000LL};
        nanosleep(&ts, NULL);
    }
    if (!dst) {
        errno = ETIMEDOUT; /* nobody answers ARP for that address */
        return NULL;
    }
    struct sim_ah *ah = calloc(1, sizeof(*ah));
    ah->ah.context = pd->context;
    ah->ah.pd = pd;
    ah->attr = *a;
    ah->dst = dst;
    return &ah->ah;
}

EXPORT(ibv_destroy_ah, int, struct ibv_ah *ah)
{
    free(ah);
    return 0;
}

/* ------------------------------------------------------------------------ test controls */

#define CONTROL __attribute__((visibility("default")))

/* Drops datagrams from device src to dst ('*' = any) with probability p, only those of protocol
 * message type `type` (1 PROBE, 2 ACK1, 3 ACK2; 0 = all). The generator is seeded by seed. */
CONTROL int skh_hwsim_set_loss(const char *src, const char *dst, double p, int type, uint64_t seed)
{
    init();
    pthread_mutex_lock(&G);
    for (int i = 0; i < n_devs; i++)
        for (int j = 0; j < n_devs; j++)
            if ((!strcmp(src, "*") || i == dev_index(src)) && (!strcmp(dst, "*") || j == dev_index(dst))) {
                loss_p[i][j] = p;
                loss_type[i][j] = type;
            }
    if (seed)
        rng_state = seed;
    pthread_mutex_unlock(&G);
    return 0;
}

CONTROL int skh_hwsim_set_delay(const char *src, const char *dst, int64_t ns)
{
    init();
    pthread_mutex_lock(&G);
    set_pair(delay_ns, src, dst, ns);
    pthread_mutex_unlock(&G);
    return 0;
}

/* Puts QP qpn into the error state, as a fatal error would (its receives are flushed). */
CONTROL int skh_hwsim_qp_error(uint32_t qpn)
{
    int rc = -ENOENT;
    pthread_mutex_lock(&G);
    for (int i = 0; i < MAX_QPS; i++)
        if (qps[i] && qps[i]->qp.qp_num == qpn) {
            set_state(qps[i], IBV_QPS_ERR);
            rc = 0;
        }
    pthread_mutex_unlock(&G);
    return rc;
}

/* The next n post_send calls on QP qpn fail with err (ENOMEM: a full send queue). */
CONTROL int skh_hwsim_fail_posts(uint32_t qpn, int n, int err)
{
    int rc = -ENOENT;
    pthread_mutex_lock(&G);
    for (int i = 0; i < MAX_QPS; i++)
        if (qps[i] && qps[i]->qp.qp_num == qpn) {
            qps[i]->fail_posts = n;
            qps[i]->fail_err = err;
            rc = 0;
        }
    pthread_mutex_unlock(&G);
    return rc;
}

/* Copies log entries [from, from + max) out; returns how many. */
CONTROL size_t skh_hwsim_log(struct skh_hwsim_event *out, size_t from, size_t max)
{
    pthread_mutex_lock(&G);
    size_t n = from < log_n ? log_n - from : 0;
    if (n > max)
        n = max;
    memcpy(out, log_buf + from, n * sizeof(*out));
    pthread_mutex_unlock(&G);
    return n;
}

/* The raw completion-timestamp counter of a device now. */
CONTROL uint64_t skh_hwsim_counter(const char *dev)
{
    init();
    int i = dev_index(dev);
    return i < 0 ? 0 : counter(&devs[i], now_ns());
}

/* Completion notifications so far: which = 0 requested (ibv_req_notify_cq), 1 delivered. */
CONTROL uint64_t skh_hwsim_notifications(int which)
{
    pthread_mutex_lock(&G);
    uint64_t n = which ? n_notify_events : n_notify_requests;
    pthread_mutex_unlock(&G);
    return n;
}
