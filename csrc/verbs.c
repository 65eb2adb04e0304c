/* The ibverbs UD transport's operations (transport.h; layout of the files in verbs_int.h). */
#include "verbs_int.h"

#include <errno.h>
#include <string.h>

#ifndef SKH_HAVE_VERBS_H

static int verbs_unavailable(void)
{
    skh_verbs_set_err("unavailable: built without libibverbs headers (install libibverbs-dev and "
                      "rebuild)");
    return -EOPNOTSUPP;
}

static int verbs_open_unavailable(const struct skh_transport_cfg *cfg, struct skh_transport **out)
{
    *out = NULL;
    return verbs_unavailable();
}

int skh_verbs_info(struct skh_transport *t, struct skh_verbs_info *out) { return -EINVAL; }

const struct skh_transport_ops skh_transport_verbs = {
    .name = "verbs",
    .available = verbs_unavailable,
    .open = verbs_open_unavailable,
};

#else /* SKH_HAVE_VERBS_H */

#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int verbs_available(void)
{
    int n = 0, rc;
    struct ibv_device **list = skh_ibv_devices(&n, &rc);
    if (!list)
        return rc;
    skh_ibv.free_device_list(list);
    skh_verbs_set_err("%s", "");
    return 0;
}

static uint8_t *tx_buf(struct skh_transport *t, uint32_t slot)
{
    return t->buf + (size_t)SKH_RQ_DEPTH * t->rx_slot + (size_t)slot * t->tx_slot;
}

static void verbs_close(struct skh_transport *t)
{
    if (!t)
        return;
    if (t->qp)
        skh_ibv.destroy_qp(t->qp);
    skh_ah_cache_destroy(t->ahc);
    if (t->cq) {
        struct ibv_cq *ev_cq;
        void *ev_ctx;
        /* destroy_cq waits for every delivered event to be acknowledged */
        while (t->channel && skh_ibv.get_cq_event(t->channel, &ev_cq, &ev_ctx) == 0)
            t->unacked_events++;
        if (t->unacked_events)
            skh_ibv.ack_cq_events(ibv_cq_ex_to_cq(t->cq), t->unacked_events);
        skh_ibv.destroy_cq(ibv_cq_ex_to_cq(t->cq));
    }
    if (t->channel)
        skh_ibv.destroy_comp_channel(t->channel);
    if (t->mr)
        skh_ibv.dereg_mr(t->mr);
    if (t->pd)
        skh_ibv.dealloc_pd(t->pd);
    if (t->ctx)
        skh_ibv.close_device(t->ctx);
    free(t->buf);
    t->magic = 0;
    free(t);
}

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        skh_verbs_set_err(__VA_ARGS__);                                                            \
        rc = (code);                                                                               \
        goto fail;                                                                                 \
    } while (0)

static int verbs_open(const struct skh_transport_cfg *cfg, struct skh_transport **out)
{
    int rc;
    struct skh_verbs_want w;
    *out = NULL;
    skh_verbs_set_err("%s", "");
    if (cfg->netns_fd >= 0) {
        skh_verbs_set_err("the verbs transport cannot be opened in another network namespace");
        return -EOPNOTSUPP;
    }
    if ((rc = skh_verbs_parse_bind(cfg->bind, &w)) < 0)
        return rc;
    struct skh_transport *t = calloc(1, sizeof(*t));
    if (!t) {
        skh_verbs_set_err("out of memory");
        return -ENOMEM;
    }
    t->magic = SKH_VERBS_MAGIC;
    t->tclass = cfg->traffic_class;
    t->priority = cfg->priority;
    for (uint32_t i = 0; i < SKH_SQ_DEPTH; i++)
        t->tx_ah[i] = SKH_AH_NONE;
    if ((rc = skh_verbs_open_device(cfg, &w, &t->ctx, &t->info)) < 0) {
        free(t);
        return rc;
    }
    const char *dev = t->info.device;
    t->max_payload = t->info.mtu < SKH_PROBE_MAX_LEN ? t->info.mtu : SKH_PROBE_MAX_LEN;
    t->rx_slot = (SKH_GRH_BYTES + t->max_payload + 63u) & ~63u;
    t->tx_slot = (t->max_payload + 63u) & ~63u;
    t->buf_len = (size_t)SKH_RQ_DEPTH * t->rx_slot + (size_t)SKH_SQ_DEPTH * t->tx_slot;
    t->buf = aligned_alloc(4096, (t->buf_len + 4095) & ~(size_t)4095);
    if (!t->buf)
        FAIL(-ENOMEM, "out of memory for %zu bytes of probe buffers", t->buf_len);
    memset(t->buf, 0, t->buf_len);
    if (!(t->pd = skh_ibv.alloc_pd(t->ctx)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_alloc_pd: %s", dev, strerror(errno));
    if (!(t->mr = skh_ibv.reg_mr(t->pd, t->buf, t->buf_len, IBV_ACCESS_LOCAL_WRITE)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_reg_mr of %zu bytes: %s (RLIMIT_MEMLOCK?)", dev,
             t->buf_len, strerror(errno));
    if ((rc = skh_ah_cache_create(t->pd, cfg->address_handles, &t->ahc)) < 0)
        FAIL(rc, "%s: address handle resolver: %s", dev, strerror(-rc));
    if (!(t->channel = skh_ibv.create_comp_channel(t->ctx)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_create_comp_channel: %s", dev, strerror(errno));
    int fl = fcntl(t->channel->fd, F_GETFL);
    if (fl < 0 || fcntl(t->channel->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        FAIL(-errno, "%s: completion channel fd: %s", dev, strerror(errno));
    /* Always ask for completion timestamps, even where the device attributes say it has none:
     * the provider's EOPNOTSUPP is the authoritative answer and the fallback path stays exercised */
    int hw = 1;
    if (!(t->cq = skh_verbs_create_cq(t, &hw)))
        FAIL(-errno, "%s: ibv_create_cq_ex: %s", dev, strerror(errno));
    if (hw && skh_tick_clock_init(&t->clock, t->info.timestamp_mask, t->info.hca_core_clock_khz)) {
        /* stamps we cannot convert to ns are no stamps: start over with software ones */
        struct ibv_cq *old = ibv_cq_ex_to_cq(t->cq);
        t->cq = NULL;
        skh_ibv.destroy_cq(old);
        hw = 0;
        if (!(t->cq = skh_verbs_create_cq(t, &hw)))
            FAIL(-errno, "%s: ibv_create_cq_ex: %s", dev, strerror(errno));
    }
    t->info.hw_stamps = hw;
    if (cfg->hw_timestamps && !hw)
        FAIL(-EOPNOTSUPP, "%s: no usable completion timestamps (timestamp mask 0x%llx, core clock "
                          "%llu kHz); hardware stamps were required",
             dev, (unsigned long long)t->info.timestamp_mask,
             (unsigned long long)t->info.hca_core_clock_khz);
    struct ibv_qp_init_attr qa = {
        .send_cq = ibv_cq_ex_to_cq(t->cq),
        .recv_cq = ibv_cq_ex_to_cq(t->cq),
        .cap = {.max_send_wr = SKH_SQ_DEPTH, .max_recv_wr = SKH_RQ_DEPTH, .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_UD,
        .sq_sig_all = 0, /* every send is signalled explicitly: its completion is T2/T4 */
    };
    if (!(t->qp = skh_ibv.create_qp(t->pd, &qa)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_create_qp(UD): %s", dev, strerror(errno));
    if (skh_verbs_qp_to_rts(t) < 0)
        FAIL(-errno ? -errno : -EIO, "%s: UD QP to RTS: %s", dev, strerror(errno));
    t->info.qpn = t->qp->qp_num;
    for (uint32_t i = 0; i < SKH_RQ_DEPTH; i++) {
        skh_verbs_post_recv(t, i);
        if (t->rx_state[i] != RX_POSTED)
            FAIL(-EIO, "%s: ibv_post_recv failed", dev);
    }
    if ((rc = -ibv_req_notify_cq(ibv_cq_ex_to_cq(t->cq), 0)) < 0)
        FAIL(rc, "%s: ibv_req_notify_cq: %s", dev, strerror(-rc));
    t->armed = 1;
    *out = t;
    return 0;
fail:
    verbs_close(t);
    return rc < 0 ? rc : -EIO;
}

#undef FAIL

static struct skh_transport *as_verbs(struct skh_transport *t)
{
    return t && t->magic == SKH_VERBS_MAGIC ? t : NULL;
}

int skh_verbs_info(struct skh_transport *t, struct skh_verbs_info *out)
{
    if (!as_verbs(t))
        return -EINVAL;
    *out = t->info;
    return 0;
}

/* Without completion timestamps the stamps are read from the clock as completions are polled. */
static unsigned verbs_caps(struct skh_transport *t)
{
    return SKH_TCAP_TX_STAMPS | SKH_TCAP_RX_STAMPS | (t->info.hw_stamps ? SKH_TCAP_WIRE_STAMPS : 0);
}

static int verbs_pollfd(struct skh_transport *t) { return t->channel->fd; }

static int verbs_arm(struct skh_transport *t)
{
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    while (skh_ibv.get_cq_event(t->channel, &ev_cq, &ev_ctx) == 0) {
        t->unacked_events++;
        t->armed = 0; /* a notification fires once per request */
    }
    if (t->unacked_events) {
        skh_ibv.ack_cq_events(ibv_cq_ex_to_cq(t->cq), t->unacked_events);
        t->unacked_events = 0;
    }
    /* re-request only after the last request fired: on rxe each request is a system call */
    if (!t->armed) {
        int rc = ibv_req_notify_cq(ibv_cq_ex_to_cq(t->cq), 0);
        if (rc)
            return -rc;
        t->armed = 1;
    }
    int rc;
    /* completions that landed before the re-arm raise no event: take them now */
    if ((rc = skh_verbs_harvest(t)) < 0)
        return rc;
    return t->rx_head != t->rx_tail || t->st_head != t->st_tail;
}

static int sq_full(struct skh_transport *t)
{
    return (uint32_t)(t->tx_head - t->tx_tail) + (t->st_head - t->st_tail) >= SKH_SQ_DEPTH;
}

static int verbs_send(struct skh_transport *t, struct skh_txpkt *pkts, unsigned n)
{
    unsigned i;
    for (i = 0; i < n; i++) {
        const skh_addr *dst = pkts[i].dst;
        int rc = 0;
        if (!dst || dst->kind != SKH_ADDR_UD)
            rc = -EAFNOSUPPORT;
        else if (pkts[i].len > t->max_payload)
            rc = -EMSGSIZE;
        else if (sq_full(t) && (skh_verbs_harvest(t), sq_full(t)))
            rc = -EAGAIN;
        struct ibv_ah *ah = NULL;
        uint32_t ah_ref = SKH_AH_NONE;
        if (rc == 0) {
            struct skh_ah_key k;
            skh_ah_key_of(dst, &k);
            rc = skh_ah_acquire(t->ahc, &k, &ah, &ah_ref); /* -EINPROGRESS: being resolved */
        }
        if (rc < 0)
            return i ? (int)i : rc;
        uint32_t slot = (uint32_t)(t->tx_head % SKH_SQ_DEPTH);
        memcpy(tx_buf(t, slot), pkts[i].buf, pkts[i].len);
        struct ibv_sge sge = {
            .addr = (uintptr_t)tx_buf(t, slot), .length = pkts[i].len, .lkey = t->mr->lkey};
        struct ibv_send_wr wr = {
            .wr_id = slot,
            .sg_list = &sge,
            .num_sge = 1,
            .opcode = IBV_WR_SEND,
            .send_flags = IBV_SEND_SIGNALED,
            .wr.ud = {.ah = ah, .remote_qpn = dst->u.ud.qpn, .remote_qkey = dst->u.ud.qkey},
        }, *bad;
        uint32_t id = t->next_tx_id++;
        t->tx_id[slot] = id;
        t->tx_ah[slot] = ah_ref;
        t->tx_want[slot] = pkts[i].want_stamp;
        /* software T2/T4: the last user-clock read before the datagram leaves, so T5-T2 (and T4-T3)
         * bracket the network; a stamp taken when the completion is polled could come after T5 */
        t->tx_sw_ns[slot] = t->info.hw_stamps ? 0 : mono_ns();
        rc = ibv_post_send(t->qp, &wr, &bad);
        if (rc) {
            skh_ah_release(t->ahc, ah_ref);
            t->tx_ah[slot] = SKH_AH_NONE;
            t->qp_suspect = 1; /* the next harvest looks at the QP's state */
            /* ENOMEM: the send queue is full after all; anything else is final for this one */
            return i ? (int)i : -(rc == ENOMEM ? EAGAIN : rc);
        }
        t->tx_head++;
        pkts[i].tx_id = id;
    }
    return (int)i;
}

static int verbs_recv(struct skh_transport *t, struct skh_rxpkt *pkts, unsigned n)
{
    int rc = skh_verbs_harvest(t);
    if (rc < 0)
        return rc;
    unsigned k = 0;
    if (t->rx_reset && n) {
        t->rx_reset = 0;
        pkts[k].len = 0;
        pkts[k].truncated = 0;
        pkts[k].err = -ENETRESET;
        pkts[k].ts_source = SKH_TS_NONE;
        memset(&pkts[k].src, 0, sizeof(pkts[k].src));
        k++;
    }
    while (k < n && t->rx_tail != t->rx_head) {
        struct skh_rx_done d = t->rx[t->rx_tail++ % SKH_RQ_DEPTH];
        const uint8_t *slot = t->buf + (size_t)d.slot * t->rx_slot;
        struct skh_grh_info g;
        if (!(d.wc_flags & IBV_WC_GRH) || d.byte_len < SKH_GRH_BYTES ||
            skh_grh_parse(slot, &g) < 0) {
            /* RoCE always carries a GRH; without one the sender cannot be answered */
            t->rx_no_grh++;
            skh_verbs_post_recv(t, d.slot);
            continue;
        }
        struct skh_rxpkt *p = &pkts[k++];
        const uint8_t *payload = slot + SKH_GRH_BYTES;
        uint32_t plen = d.byte_len - SKH_GRH_BYTES;
        p->len = plen < p->cap ? plen : p->cap;
        p->truncated = plen > p->cap;
        memcpy(p->buf, payload, p->len);
        p->err = 0;
        p->ts_ns = d.ts_ns;
        p->ts_source = t->info.hw_stamps ? SKH_TS_HW : SKH_TS_USER;
        memset(&p->src, 0, sizeof(p->src));
        p->src.kind = SKH_ADDR_UD;
        memcpy(p->src.u.ud.gid, g.sgid, 16);
        p->src.u.ud.qpn = d.src_qp;
        p->src.u.ud.qkey = SKH_VERBS_QKEY;
        p->src.u.ud.sgid_index = (uint8_t)t->info.gid_index;
        p->src.u.ud.port_num = t->info.port_num;
        /* a reply rides its probe's class: the prober's DSCP, our ECN bits and priority */
        p->src.u.ud.traffic_class = (uint8_t)((g.tclass & 0xfc) | (t->tclass & 0x03));
        p->src.u.ud.sl = t->priority;
        /* Replies must take the prober's path. An IPv4 GRH has no flow label at all, so the path is
         * read from the probe itself (the engine echoes path_id, and so does the ACK's AH). */
        struct skh_msg m;
        p->src.u.ud.flow_label = skh_proto_decode(payload, plen, &m) == 0
                                     ? skh_path_flow_label(m.path_id)
                                     : g.flow_label;
        skh_verbs_post_recv(t, d.slot);
    }
    return (int)k;
}

static int verbs_stamps(struct skh_transport *t, struct skh_txstamp *out, unsigned n)
{
    int rc = skh_verbs_harvest(t);
    if (rc < 0)
        return rc;
    unsigned k = 0;
    while (k < n && t->st_tail != t->st_head)
        out[k++] = t->st[t->st_tail++ % SKH_SQ_DEPTH];
    return (int)k;
}

static int verbs_local(struct skh_transport *t, skh_addr *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = SKH_ADDR_UD;
    memcpy(out->u.ud.gid, t->info.gid, 16);
    out->u.ud.qpn = t->info.qpn;
    out->u.ud.qkey = SKH_VERBS_QKEY;
    out->u.ud.sgid_index = (uint8_t)t->info.gid_index;
    out->u.ud.port_num = t->info.port_num;
    return 0;
}

static int verbs_parse_addr(struct skh_transport *t, const char *host, uint16_t port,
                            const char *gid, uint32_t qpn, uint16_t path_id, skh_addr *out)
{
    const char *text = gid && *gid ? gid : host;
    memset(out, 0, sizeof(*out));
    if (!text || skh_gid_parse(text, out->u.ud.gid) < 0) {
        skh_verbs_set_err("'%s' is not a GID (IPv6 notation or IPv4)", text ? text : "");
        return -EINVAL;
    }
    if (qpn == 0 || qpn > 0xffffff) {
        skh_verbs_set_err("a verbs target needs its QPN (1..0xffffff), got %u", qpn);
        return -EINVAL;
    }
    if (skh_gid_is_v4mapped(out->u.ud.gid) != skh_gid_is_v4mapped(t->info.gid)) {
        skh_verbs_set_err("target GID %s and local GID (index %d) are of different address "
                          "families",
                          text, t->info.gid_index);
        return -EAFNOSUPPORT;
    }
    out->kind = SKH_ADDR_UD;
    out->u.ud.qpn = qpn;
    out->u.ud.qkey = SKH_VERBS_QKEY;
    out->u.ud.flow_label = skh_path_flow_label(path_id);
    out->u.ud.sgid_index = (uint8_t)t->info.gid_index;
    out->u.ud.port_num = t->info.port_num;
    out->u.ud.traffic_class = t->tclass;
    out->u.ud.sl = t->priority;
    /* resolve the peer now, on the caller's thread: an unreachable peer is an error the caller
     * sees at once instead of a silent stream of lost probes */
    struct skh_ah_key k;
    skh_ah_key_of(out, &k);
    int rc = skh_ah_resolve(t->ahc, &k);
    if (rc < 0 && rc != -EAGAIN) {
        skh_verbs_set_err("cannot create an address handle for %s (GID index %d): %s", text,
                          t->info.gid_index, strerror(-rc));
        return rc;
    }
    return 0;
}

static void verbs_counters(struct skh_transport *t, uint64_t *out)
{
    out[SKH_TSTAT_qp_recoveries] = t->qp_recoveries;
    out[SKH_TSTAT_tx_completion_errors] = t->tx_errors;
    out[SKH_TSTAT_rx_completion_errors] = t->rx_errors;
    out[SKH_TSTAT_rx_no_grh] = t->rx_no_grh;
    skh_ah_counters(t->ahc, &out[SKH_TSTAT_ah_created], &out[SKH_TSTAT_ah_evicted],
                    &out[SKH_TSTAT_ah_failures]);
}

const struct skh_transport_ops skh_transport_verbs = {
    .name = "verbs",
    .available = verbs_available,
    .open = verbs_open,
    .close = verbs_close,
    .caps = verbs_caps,
    .pollfd = verbs_pollfd,
    .arm = verbs_arm,
    .send = verbs_send,
    .recv = verbs_recv,
    .stamps = verbs_stamps,
    .local = verbs_local,
    .parse_addr = verbs_parse_addr,
    .counters = verbs_counters,
};

#endif /* SKH_HAVE_VERBS_H */
