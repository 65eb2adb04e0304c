/* The ibverbs UD transport: see verbs.h. libibverbs is reached only through dlopen/dlvsym and the
 * context ops table, so nothing here adds a NEEDED entry or an undefined ibv_* symbol to the .so
 * (tests/verbs/test_build.py checks both). */
#include "verbs.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto.h"
#include "verbs_util.h"

static __thread char verbs_err[256];

static void set_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(verbs_err, sizeof(verbs_err), fmt, ap);
    va_end(ap);
}

const char *skh_verbs_strerror(void)
{
    return verbs_err;
}

/* SKH_NO_VERBS forces the header-less build (tests/verbs/test_build.py compiles it that way). */
#if defined(__has_include) && !defined(SKH_NO_VERBS)
#if __has_include(<infiniband/verbs.h>)
#define SKH_HAVE_VERBS_H 1
#endif
#endif

#ifndef SKH_HAVE_VERBS_H

static int verbs_unavailable(void)
{
    set_err("unavailable: built without libibverbs headers (install libibverbs-dev and rebuild)");
    return -EOPNOTSUPP;
}

static int verbs_open_unavailable(const struct skh_transport_cfg *cfg, struct skh_transport **out)
{
    *out = NULL;
    return verbs_unavailable();
}

int skh_verbs_info(struct skh_transport *t, struct skh_verbs_info *out)
{
    return -EINVAL;
}

const struct skh_transport_ops skh_transport_verbs = {
    .name = "verbs",
    .available = verbs_unavailable,
    .open = verbs_open_unavailable,
};

#else /* SKH_HAVE_VERBS_H */

#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- libibverbs, loaded lazily */

/* Exported entry points. The ops-table inlines of verbs.h (post_send/recv, start_poll, wc_read_*,
 * create_cq_ex, req_notify_cq) need none of these; the other inlines of verbs.h must not be called
 * here, since they reference exported symbols that would then be left undefined. */
static struct {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    ssize_t (*query_gid_table)(struct ibv_context *ctx, struct ibv_gid_entry *entries,
                               size_t max_entries, uint32_t flags, size_t entry_size);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    struct ibv_ah *(*create_ah)(struct ibv_pd *pd, struct ibv_ah_attr *attr);
    int (*destroy_ah)(struct ibv_ah *ah);
} ibv;

#define SYM(field, name, version) {offsetof(__typeof__(ibv), field), name, version}
static const struct {
    size_t off;
    const char *name;
    const char *version;
} ibv_syms[] = {
    SYM(get_device_list, "ibv_get_device_list", "IBVERBS_1.1"),
    SYM(free_device_list, "ibv_free_device_list", "IBVERBS_1.1"),
    SYM(get_device_name, "ibv_get_device_name", "IBVERBS_1.1"),
    SYM(open_device, "ibv_open_device", "IBVERBS_1.1"),
    SYM(close_device, "ibv_close_device", "IBVERBS_1.1"),
    SYM(query_device, "ibv_query_device", "IBVERBS_1.1"),
    /* rdma-core >= v32: the oldest release this transport supports */
    SYM(query_gid_table, "_ibv_query_gid_table", "IBVERBS_1.11"),
    SYM(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1"),
    SYM(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1"),
    SYM(reg_mr, "ibv_reg_mr", "IBVERBS_1.1"),
    SYM(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1"),
    SYM(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0"),
    SYM(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0"),
    SYM(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1"),
    SYM(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1"),
    SYM(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1"),
    SYM(create_qp, "ibv_create_qp", "IBVERBS_1.1"),
    SYM(modify_qp, "ibv_modify_qp", "IBVERBS_1.1"),
    SYM(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1"),
    SYM(create_ah, "ibv_create_ah", "IBVERBS_1.1"),
    SYM(destroy_ah, "ibv_destroy_ah", "IBVERBS_1.1"),
};
#undef SYM

/* Overridable so a test can build a copy that finds no libibverbs at all. */
#ifndef SKH_IBVERBS_SONAME
#define SKH_IBVERBS_SONAME "libibverbs.so.1"
#endif

static pthread_once_t ibv_once = PTHREAD_ONCE_INIT;
static int ibv_load_rc;
static char ibv_load_err[200];

static void ibv_load_once(void)
{
    /* RTLD_LOCAL: our symbols stay private; libibverbs itself loads the vendor providers */
    void *h = dlopen(SKH_IBVERBS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(ibv_load_err, sizeof(ibv_load_err), "libibverbs unavailable: %s", dlerror());
        ibv_load_rc = -EOPNOTSUPP;
        return;
    }
    for (size_t i = 0; i < sizeof(ibv_syms) / sizeof(ibv_syms[0]); i++) {
        void *p = dlvsym(h, ibv_syms[i].name, ibv_syms[i].version);
        if (!p)
            p = dlsym(h, ibv_syms[i].name);
        if (!p) {
            snprintf(ibv_load_err, sizeof(ibv_load_err),
                     "libibverbs too old: no %s@%s (rdma-core >= v32 needed)", ibv_syms[i].name,
                     ibv_syms[i].version);
            ibv_load_rc = -EOPNOTSUPP;
            return;
        }
        memcpy((char *)&ibv + ibv_syms[i].off, &p, sizeof(p));
    }
}

static int ibv_load(void)
{
    pthread_once(&ibv_once, ibv_load_once);
    if (ibv_load_rc)
        set_err("%s", ibv_load_err);
    return ibv_load_rc;
}

/* NULL with *rc < 0 and the reason set when there is no device at all. */
static struct ibv_device **device_list(int *n, int *rc)
{
    *rc = ibv_load();
    if (*rc)
        return NULL;
    errno = 0;
    struct ibv_device **list = ibv.get_device_list(n);
    if (!list) {
        int e = errno ? errno : ENODEV;
        /* libibverbs answers ENOSYS when /sys/class/infiniband_verbs is missing */
        if (e == ENOSYS)
            set_err("no RDMA devices (kernel has no RDMA support)");
        else
            set_err("no RDMA devices (ibv_get_device_list: %s)", strerror(e));
        *rc = -ENODEV;
        return NULL;
    }
    if (*n == 0) {
        ibv.free_device_list(list);
        set_err("no RDMA devices (the kernel supports RDMA but none is registered)");
        *rc = -ENODEV;
        return NULL;
    }
    return list;
}

static int verbs_available(void)
{
    int n = 0, rc;
    struct ibv_device **list = device_list(&n, &rc);
    if (!list)
        return rc;
    ibv.free_device_list(list);
    verbs_err[0] = '\0';
    return 0;
}

/* ------------------------------------------------------------------------------ the transport */

#define VERBS_MAGIC 0x56524253u /* "VRBS" */
#define RQ_DEPTH 1024u   /* UD drops silently when the RQ is empty: keep it deep */
#define SQ_DEPTH 512u
#define AH_SLOTS 1024u   /* power of two */
#define AH_MAX_USED (AH_SLOTS * 3 / 4)
#define RECV_WRID_BIT (1ull << 63)
#define HOP_LIMIT 64

struct ah_key {
    uint8_t dgid[16];
    uint32_t flow_label;
    uint8_t sgid_index, traffic_class, sl, port_num;
};

struct ah_slot {
    struct ah_key key;
    struct ibv_ah *ah; /* NULL = empty */
};

struct rx_done {
    uint32_t slot;
    uint32_t byte_len;
    uint32_t src_qp;
    uint32_t wc_flags;
    int64_t ts_ns;
};

struct skh_transport {
    uint32_t magic;
    struct skh_verbs_info info;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_mr *mr;
    struct ibv_comp_channel *channel;
    struct ibv_cq_ex *cq;
    struct ibv_qp *qp;
    struct skh_tick_clock clock; /* hw stamps only */
    uint8_t *buf;                /* RQ_DEPTH rx slots, then SQ_DEPTH tx slots; one MR */
    size_t buf_len;
    uint32_t rx_slot, tx_slot, max_payload;
    /* sends: a ring of slots, completed in order on a UD send queue */
    uint64_t tx_head, tx_tail;
    uint32_t next_tx_id;
    uint32_t tx_id[SQ_DEPTH];
    int64_t tx_sw_ns[SQ_DEPTH];
    /* completions harvested from the CQ, waiting for recv()/stamps() */
    struct rx_done rx[RQ_DEPTH];
    uint32_t rx_head, rx_tail;
    struct skh_txstamp st[SQ_DEPTH];
    uint32_t st_head, st_tail;
    unsigned unacked_events;
    int armed; /* a completion notification is requested and has not fired yet */
    pthread_mutex_t ah_lock; /* the cache is filled from the owner's thread too (parse_addr) */
    struct ah_slot ah[AH_SLOTS];
    uint32_t ah_used;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint8_t *rx_buf(struct skh_transport *t, uint32_t slot)
{
    return t->buf + (size_t)slot * t->rx_slot;
}

static uint8_t *tx_buf(struct skh_transport *t, uint32_t slot)
{
    return t->buf + (size_t)RQ_DEPTH * t->rx_slot + (size_t)slot * t->tx_slot;
}

static int post_recv(struct skh_transport *t, uint32_t slot)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)rx_buf(t, slot), .length = t->rx_slot, .lkey = t->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = RECV_WRID_BIT | slot, .sg_list = &sge, .num_sge = 1}, *bad;
    return -ibv_post_recv(t->qp, &wr, &bad);
}

/* Moves every ready completion into t->rx / t->st. Both rings are large enough by construction:
 * at most RQ_DEPTH receives are posted, and send() keeps sends in flight plus undelivered stamps
 * at most SQ_DEPTH.
 * One CQE per start_poll/end_poll pair, never ibv_next_poll: rxe's next_poll already publishes the
 * consumer index and unlocks when the CQ runs empty, and the end_poll that must follow advances
 * the index once more, past the producer, so the whole ring of old CQEs is delivered again. */
static int harvest(struct skh_transport *t)
{
    struct ibv_poll_cq_attr pattr = {0};
    int rc;
    /* every CQE found now had completed by now: one software stamp serves the whole batch */
    int64_t now = t->info.hw_stamps ? 0 : mono_ns();
    while ((rc = ibv_start_poll(t->cq, &pattr)) == 0) {
        uint64_t wr_id = t->cq->wr_id;
        int ok = t->cq->status == IBV_WC_SUCCESS;
        int64_t ts = 0;
        if (ok)
            ts = t->info.hw_stamps ? skh_tick_clock_ns(&t->clock, ibv_wc_read_completion_ts(t->cq))
                                   : now;
        if (wr_id & RECV_WRID_BIT) {
            uint32_t slot = (uint32_t)(wr_id & ~RECV_WRID_BIT);
            if (ok) {
                struct rx_done *d = &t->rx[t->rx_head++ % RQ_DEPTH];
                d->slot = slot;
                d->byte_len = ibv_wc_read_byte_len(t->cq);
                d->src_qp = ibv_wc_read_src_qp(t->cq);
                d->wc_flags = ibv_wc_read_wc_flags(t->cq);
                d->ts_ns = ts;
            }
            ibv_end_poll(t->cq);
            if (!ok) {
                /* repost, or the slot leaks and the RQ slowly empties into silent loss */
                t->info.rx_errors++;
                post_recv(t, slot);
            }
        } else {
            uint32_t slot = (uint32_t)(wr_id % SQ_DEPTH);
            if (ok) {
                struct skh_txstamp *s = &t->st[t->st_head++ % SQ_DEPTH];
                s->tx_id = t->tx_id[slot];
                s->ts_source = t->info.hw_stamps ? SKH_TS_HW : SKH_TS_USER;
                s->ts_ns = t->info.hw_stamps ? ts : t->tx_sw_ns[slot];
            } else {
                t->info.tx_errors++;
            }
            ibv_end_poll(t->cq);
            t->tx_tail++;
        }
    }
    return rc == ENOENT ? 0 : -rc;
}

/* ------------------------------------------------------------------------------ AH cache */

static uint32_t ah_hash(const struct ah_key *k)
{
    uint32_t h = 2166136261u;
    const uint8_t *p = (const uint8_t *)k;
    for (size_t i = 0; i < sizeof(*k); i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static void ah_key_of(const skh_addr *dst, struct ah_key *k)
{
    memset(k, 0, sizeof(*k));
    memcpy(k->dgid, dst->u.ud.gid, 16);
    k->flow_label = dst->u.ud.flow_label & 0xfffff;
    k->sgid_index = dst->u.ud.sgid_index;
    k->traffic_class = dst->u.ud.traffic_class;
    k->sl = dst->u.ud.sl;
    k->port_num = dst->u.ud.port_num;
}

/* The slot of k, or the empty slot where it belongs. Caller holds ah_lock. */
static uint32_t ah_find(struct skh_transport *t, const struct ah_key *k)
{
    uint32_t i = ah_hash(k) & (AH_SLOTS - 1);
    while (t->ah[i].ah && memcmp(&t->ah[i].key, k, sizeof(*k)) != 0)
        i = (i + 1) & (AH_SLOTS - 1);
    return i;
}

static void ah_flush(struct skh_transport *t)
{
    for (uint32_t i = 0; i < AH_SLOTS; i++) {
        if (t->ah[i].ah)
            ibv.destroy_ah(t->ah[i].ah);
        t->ah[i].ah = NULL;
    }
    t->ah_used = 0;
}

static struct ibv_ah *ah_create(struct skh_transport *t, const struct ah_key *k)
{
    struct ibv_ah_attr attr = {
        .grh = {.flow_label = k->flow_label, .sgid_index = k->sgid_index, .hop_limit = HOP_LIMIT,
                .traffic_class = k->traffic_class},
        .sl = k->sl,
        .is_global = 1, /* RoCE: addressing is by GID; mlx5 refuses an AH without GRH */
        .port_num = k->port_num,
    };
    memcpy(attr.grh.dgid.raw, k->dgid, 16);
    errno = 0;
    return ibv.create_ah(t->pd, &attr);
}

/* The cached AH of dst, created on a miss. Creating one resolves the peer's MAC in the kernel,
 * which blocks for up to ~1 s on first contact; parse_addr (the owner's thread, at add_target)
 * therefore creates probe AHs ahead, and the lock is never held across a creation. engine = 1 on
 * the engine thread, the only one that sends, and so the only one that may flush the cache. */
static int ah_get(struct skh_transport *t, const skh_addr *dst, int engine, struct ibv_ah **out)
{
    struct ah_key k;
    ah_key_of(dst, &k);
    pthread_mutex_lock(&t->ah_lock);
    uint32_t i = ah_find(t, &k);
    struct ibv_ah *ah = t->ah[i].ah;
    pthread_mutex_unlock(&t->ah_lock);
    if (ah) {
        *out = ah;
        return 0;
    }
    if (!(ah = ah_create(t, &k)))
        return -(errno ? errno : EIO);
    pthread_mutex_lock(&t->ah_lock);
    if (t->ah_used >= AH_MAX_USED && engine) {
        /* AHs of sends still in flight must outlive them: flush only when the SQ is idle */
        harvest(t);
        if (t->tx_head == t->tx_tail) {
            ah_flush(t);
            t->info.ah_flushes++;
        }
    }
    int rc = 0;
    i = ah_find(t, &k);
    if (t->ah[i].ah) { /* the other thread created it meanwhile */
        ibv.destroy_ah(ah);
        ah = t->ah[i].ah;
    } else if (t->ah_used < AH_MAX_USED) {
        t->ah[i].key = k;
        t->ah[i].ah = ah;
        t->ah_used++;
        t->info.ah_created++;
    } else {
        ibv.destroy_ah(ah);
        ah = NULL;
        rc = -EAGAIN; /* full of AHs still in use: the engine retries later */
    }
    pthread_mutex_unlock(&t->ah_lock);
    *out = ah;
    return rc;
}

/* ------------------------------------------------------------------------------ device choice */

struct want {
    struct skh_gid_want gid;
    const char *bind_text;
};

static int parse_bind(const char *bind, struct want *w)
{
    memset(w, 0, sizeof(*w));
    w->bind_text = bind && *bind ? bind : "0.0.0.0";
    if (strcmp(w->bind_text, "0.0.0.0") == 0) {
        w->gid.family = 4;
        return 0;
    }
    if (strcmp(w->bind_text, "::") == 0) {
        w->gid.family = 6;
        return 0;
    }
    if (skh_gid_parse(w->bind_text, w->gid.addr) < 0) {
        set_err("bind address '%s' is neither an IPv4 nor an IPv6 literal", w->bind_text);
        return -EINVAL;
    }
    w->gid.has_addr = 1;
    w->gid.family = skh_gid_is_v4mapped(w->gid.addr) ? 4 : 6;
    w->gid.link_local = w->gid.family == 6 && skh_gid_is_link_local(w->gid.addr);
    return 0;
}

static uint32_t mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128u << m : 256u;
}

/* Picks port and GID on an open device. Returns 0 with info filled, or -errno with the reason. */
static int choose_port_gid(struct ibv_context *ctx, const struct want *w, int gid_index,
                           struct skh_verbs_info *info)
{
    struct verbs_context *vqp = verbs_get_ctx_op(ctx, query_port);
    struct verbs_context *vqd = verbs_get_ctx_op(ctx, query_device_ex);
    struct ibv_device_attr_ex dattr;
    memset(&dattr, 0, sizeof(dattr));
    if (!vqp) {
        set_err("%s: provider lacks query_port (rdma-core too old)", info->device);
        return -EOPNOTSUPP;
    }
    if (!vqd || vqd->query_device_ex(ctx, NULL, &dattr, sizeof(dattr)) != 0) {
        memset(&dattr, 0, sizeof(dattr));
        if (ibv.query_device(ctx, &dattr.orig_attr) != 0) {
            set_err("%s: ibv_query_device failed: %s", info->device, strerror(errno));
            return -EIO;
        }
    }
    info->timestamp_mask = dattr.completion_timestamp_mask;
    info->hca_core_clock_khz = dattr.hca_core_clock;

    size_t max = 0;
    struct ibv_port_attr pattr[8];
    int nports = dattr.orig_attr.phys_port_cnt < 8 ? dattr.orig_attr.phys_port_cnt : 8;
    for (int p = 1; p <= nports; p++) {
        memset(&pattr[p - 1], 0, sizeof(pattr[0]));
        if (vqp->query_port(ctx, (uint8_t)p, &pattr[p - 1], sizeof(pattr[0])) == 0)
            max += pattr[p - 1].gid_tbl_len;
    }
    if (max == 0) {
        set_err("%s: no port with a GID table", info->device);
        return -ENODEV;
    }
    struct ibv_gid_entry *ent = calloc(max, sizeof(*ent));
    struct skh_gid_cand *cand = calloc(max, sizeof(*cand));
    int rc = -ENOENT;
    if (!ent || !cand) {
        rc = -ENOMEM;
        goto out;
    }
    ssize_t n = ibv.query_gid_table(ctx, ent, max, 0, sizeof(*ent));
    if (n < 0) {
        set_err("%s: ibv_query_gid_table failed: %s", info->device, strerror((int)-n));
        rc = (int)n;
        goto out;
    }
    int saw_active = 0;
    for (int p = 1; p <= nports && rc < 0; p++) {
        const struct ibv_port_attr *pa = &pattr[p - 1];
        if (pa->state != IBV_PORT_ACTIVE || pa->link_layer != IBV_LINK_LAYER_ETHERNET)
            continue;
        saw_active = 1;
        size_t k = 0;
        for (ssize_t i = 0; i < n; i++) {
            if (ent[i].port_num != (uint32_t)p)
                continue;
            memcpy(cand[k].gid, ent[i].gid.raw, 16);
            cand[k].index = ent[i].gid_index;
            cand[k].gid_type = ent[i].gid_type;
            cand[k].ndev_ifindex = ent[i].ndev_ifindex;
            k++;
        }
        int pick = -ENOENT;
        if (gid_index >= 0) {
            for (size_t i = 0; i < k; i++)
                if (cand[i].index == (uint32_t)gid_index)
                    pick = (int)i;
        } else {
            pick = skh_gid_select(cand, k, &w->gid);
        }
        if (pick >= 0) {
            info->port_num = (uint8_t)p;
            info->gid_index = (int)cand[pick].index;
            memcpy(info->gid, cand[pick].gid, 16);
            info->mtu = mtu_bytes(pa->active_mtu);
            rc = 0;
        }
    }
    if (rc == -ENOENT) {
        if (!saw_active)
            set_err("%s: no ACTIVE RoCE (Ethernet) port", info->device);
        else if (gid_index >= 0)
            set_err("%s: no GID at index %d on an active port", info->device, gid_index);
        else
            set_err("%s: no RoCE v2 %s GID%s for bind address %s%s", info->device,
                    w->gid.family == 4 ? "IPv4" : "IPv6",
                    w->gid.family == 6 ? (w->gid.link_local ? " (link-local)" : " (non-link-local)")
                                       : "",
                    w->bind_text, w->gid.ifindex ? " on the requested netdev" : "");
    }
out:
    free(ent);
    free(cand);
    return rc;
}

/* Opens the device named by cfg->device (an RDMA device or a netdev), or the first one that has a
 * GID for the bind address. */
static int open_device(const struct skh_transport_cfg *cfg, struct want *w,
                       struct ibv_context **ctx_out, struct skh_verbs_info *info)
{
    int n = 0, rc;
    struct ibv_device **list = device_list(&n, &rc);
    if (!list)
        return rc;
    int named = -1;
    if (cfg->device && *cfg->device) {
        for (int i = 0; i < n; i++)
            if (strcmp(ibv.get_device_name(list[i]), cfg->device) == 0)
                named = i;
        if (named < 0) {
            unsigned ifindex = if_nametoindex(cfg->device);
            if (!ifindex) {
                set_err("no RDMA device or network interface named '%s'", cfg->device);
                ibv.free_device_list(list);
                return -ENODEV;
            }
            w->gid.ifindex = ifindex; /* only a device with a GID on this netdev qualifies */
        }
    }
    char first_err[sizeof(verbs_err)] = "";
    rc = -ENODEV;
    for (int i = 0; i < n && rc < 0; i++) {
        if (named >= 0 && i != named)
            continue;
        struct ibv_context *ctx = ibv.open_device(list[i]);
        memset(info, 0, sizeof(*info));
        snprintf(info->device, sizeof(info->device), "%s", ibv.get_device_name(list[i]));
        if (!ctx) {
            set_err("%s: ibv_open_device failed: %s", info->device, strerror(errno));
        } else if ((rc = choose_port_gid(ctx, w, cfg->gid_index, info)) == 0) {
            *ctx_out = ctx;
            break;
        } else {
            ibv.close_device(ctx);
        }
        if (!first_err[0])
            memcpy(first_err, verbs_err, sizeof(first_err));
        rc = -ENODEV;
    }
    ibv.free_device_list(list);
    if (rc < 0 && named < 0 && first_err[0]) {
        if (w->gid.ifindex)
            set_err("no RDMA device has a matching GID on netdev '%s' (first: %s)", cfg->device,
                    first_err);
        else
            memcpy(verbs_err, first_err, sizeof(verbs_err));
    }
    return rc;
}

/* ------------------------------------------------------------------------------ open / close */

static void verbs_close(struct skh_transport *t)
{
    if (!t)
        return;
    if (t->qp)
        ibv.destroy_qp(t->qp);
    ah_flush(t);
    if (t->cq) {
        struct ibv_cq *ev_cq;
        void *ev_ctx;
        /* destroy_cq waits for every delivered event to be acknowledged */
        while (t->channel && ibv.get_cq_event(t->channel, &ev_cq, &ev_ctx) == 0)
            t->unacked_events++;
        if (t->unacked_events)
            ibv.ack_cq_events(ibv_cq_ex_to_cq(t->cq), t->unacked_events);
        ibv.destroy_cq(ibv_cq_ex_to_cq(t->cq));
    }
    if (t->channel)
        ibv.destroy_comp_channel(t->channel);
    if (t->mr)
        ibv.dereg_mr(t->mr);
    if (t->pd)
        ibv.dealloc_pd(t->pd);
    if (t->ctx)
        ibv.close_device(t->ctx);
    free(t->buf);
    pthread_mutex_destroy(&t->ah_lock);
    t->magic = 0;
    free(t);
}

/* *hw in: try completion timestamps; out: whether the CQ has them. */
static struct ibv_cq_ex *create_cq(struct skh_transport *t, int *hw)
{
    const uint64_t base = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_SRC_QP;
    int single_threaded = 1;
    for (int attempt = 0; attempt < 4; attempt++) {
        struct ibv_cq_init_attr_ex a = {
            .cqe = RQ_DEPTH + SQ_DEPTH,
            .channel = t->channel,
            .wc_flags = base | (*hw ? IBV_WC_EX_WITH_COMPLETION_TIMESTAMP : 0),
            /* one poller (the engine thread): skip the CQ lock */
            .comp_mask = single_threaded ? IBV_CQ_INIT_ATTR_MASK_FLAGS : 0,
            .flags = single_threaded ? IBV_CREATE_CQ_ATTR_SINGLE_THREADED : 0,
        };
        errno = 0;
        struct ibv_cq_ex *cq = ibv_create_cq_ex(t->ctx, &a);
        if (cq)
            return cq;
        int e = errno ? errno : EIO;
        if (*hw && (e == EOPNOTSUPP || e == ENOTSUP)) {
            /* soft-RoCE and some NICs cannot stamp completions: software stamps instead */
            *hw = 0;
        } else if (single_threaded && e == EINVAL) {
            single_threaded = 0;
        } else {
            errno = e;
            return NULL;
        }
    }
    errno = EOPNOTSUPP;
    return NULL;
}

static int modify_to_rts(struct skh_transport *t)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0,
                            .port_num = t->info.port_num, .qkey = SKH_VERBS_QKEY};
    if (ibv.modify_qp(t->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
        return -1;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR; /* UD: no remote attributes, the AH of each send names the peer */
    if (ibv.modify_qp(t->qp, &a, IBV_QP_STATE))
        return -1;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    return ibv.modify_qp(t->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) ? -1 : 0;
}

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        set_err(__VA_ARGS__);                                                                      \
        rc = (code);                                                                               \
        goto fail;                                                                                 \
    } while (0)

static int verbs_open(const struct skh_transport_cfg *cfg, struct skh_transport **out)
{
    int rc;
    struct want w;
    *out = NULL;
    verbs_err[0] = '\0';
    if (cfg->netns_fd >= 0) {
        set_err("the verbs transport cannot be opened in another network namespace");
        return -EOPNOTSUPP;
    }
    if ((rc = parse_bind(cfg->bind, &w)) < 0)
        return rc;
    struct skh_transport *t = calloc(1, sizeof(*t));
    if (!t) {
        set_err("out of memory");
        return -ENOMEM;
    }
    t->magic = VERBS_MAGIC;
    pthread_mutex_init(&t->ah_lock, NULL);
    if ((rc = open_device(cfg, &w, &t->ctx, &t->info)) < 0) {
        pthread_mutex_destroy(&t->ah_lock);
        free(t);
        return rc;
    }
    const char *dev = t->info.device;
    t->max_payload = t->info.mtu < SKH_PROBE_MAX_LEN ? t->info.mtu : SKH_PROBE_MAX_LEN;
    t->rx_slot = (SKH_GRH_BYTES + t->max_payload + 63u) & ~63u;
    t->tx_slot = (t->max_payload + 63u) & ~63u;
    t->buf_len = (size_t)RQ_DEPTH * t->rx_slot + (size_t)SQ_DEPTH * t->tx_slot;
    t->buf = aligned_alloc(4096, (t->buf_len + 4095) & ~(size_t)4095);
    if (!t->buf)
        FAIL(-ENOMEM, "out of memory for %zu bytes of probe buffers", t->buf_len);
    memset(t->buf, 0, t->buf_len);
    if (!(t->pd = ibv.alloc_pd(t->ctx)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_alloc_pd: %s", dev, strerror(errno));
    if (!(t->mr = ibv.reg_mr(t->pd, t->buf, t->buf_len, IBV_ACCESS_LOCAL_WRITE)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_reg_mr of %zu bytes: %s (RLIMIT_MEMLOCK?)", dev,
             t->buf_len, strerror(errno));
    if (!(t->channel = ibv.create_comp_channel(t->ctx)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_create_comp_channel: %s", dev, strerror(errno));
    int fl = fcntl(t->channel->fd, F_GETFL);
    if (fl < 0 || fcntl(t->channel->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        FAIL(-errno, "%s: completion channel fd: %s", dev, strerror(errno));
    /* Always ask for completion timestamps, even where the device attributes say it has none:
     * the provider's EOPNOTSUPP is the authoritative answer and the fallback path stays exercised */
    int hw = 1;
    if (!(t->cq = create_cq(t, &hw)))
        FAIL(-errno, "%s: ibv_create_cq_ex: %s", dev, strerror(errno));
    if (hw && skh_tick_clock_init(&t->clock, t->info.timestamp_mask, t->info.hca_core_clock_khz)) {
        /* stamps we cannot convert to ns are no stamps: start over with software ones */
        struct ibv_cq *old = ibv_cq_ex_to_cq(t->cq);
        t->cq = NULL;
        ibv.destroy_cq(old);
        hw = 0;
        if (!(t->cq = create_cq(t, &hw)))
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
        .cap = {.max_send_wr = SQ_DEPTH, .max_recv_wr = RQ_DEPTH, .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_UD,
        .sq_sig_all = 0, /* every send is signalled explicitly: its completion is T2/T4 */
    };
    if (!(t->qp = ibv.create_qp(t->pd, &qa)))
        FAIL(-errno ? -errno : -EIO, "%s: ibv_create_qp(UD): %s", dev, strerror(errno));
    if (modify_to_rts(t) < 0)
        FAIL(-errno ? -errno : -EIO, "%s: UD QP to RTS: %s", dev, strerror(errno));
    t->info.qpn = t->qp->qp_num;
    for (uint32_t i = 0; i < RQ_DEPTH; i++)
        if ((rc = post_recv(t, i)) < 0)
            FAIL(rc, "%s: ibv_post_recv: %s", dev, strerror(-rc));
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
    return t && t->magic == VERBS_MAGIC ? t : NULL;
}

int skh_verbs_info(struct skh_transport *t, struct skh_verbs_info *out)
{
    if (!as_verbs(t))
        return -EINVAL;
    *out = t->info;
    return 0;
}

static unsigned verbs_caps(struct skh_transport *t)
{
    return SKH_TCAP_TX_STAMPS | SKH_TCAP_RX_STAMPS;
}

static int verbs_pollfd(struct skh_transport *t)
{
    return t->channel->fd;
}

static int verbs_arm(struct skh_transport *t)
{
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    while (ibv.get_cq_event(t->channel, &ev_cq, &ev_ctx) == 0) {
        t->unacked_events++;
        t->armed = 0; /* a notification fires once per request */
    }
    if (t->unacked_events) {
        ibv.ack_cq_events(ibv_cq_ex_to_cq(t->cq), t->unacked_events);
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
    if ((rc = harvest(t)) < 0)
        return rc;
    return t->rx_head != t->rx_tail || t->st_head != t->st_tail;
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
        else if ((uint32_t)(t->tx_head - t->tx_tail) + (t->st_head - t->st_tail) >= SQ_DEPTH) {
            harvest(t);
            if ((uint32_t)(t->tx_head - t->tx_tail) + (t->st_head - t->st_tail) >= SQ_DEPTH)
                rc = -EAGAIN;
        }
        struct ibv_ah *ah = NULL;
        if (rc == 0)
            rc = ah_get(t, dst, 1, &ah);
        if (rc < 0)
            return i ? (int)i : rc;
        uint32_t slot = (uint32_t)(t->tx_head % SQ_DEPTH);
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
        /* software T2/T4: the last user-clock read before the datagram leaves, so T5-T2 (and T4-T3)
         * bracket the network; a stamp taken when the completion is polled could come after T5 */
        t->tx_sw_ns[slot] = t->info.hw_stamps ? 0 : mono_ns();
        rc = ibv_post_send(t->qp, &wr, &bad);
        if (rc)
            return i ? (int)i : -rc;
        t->tx_head++;
        pkts[i].tx_id = id;
    }
    return (int)i;
}

static int verbs_recv(struct skh_transport *t, struct skh_rxpkt *pkts, unsigned n)
{
    int rc = harvest(t);
    if (rc < 0)
        return rc;
    unsigned k = 0;
    while (k < n && t->rx_tail != t->rx_head) {
        struct rx_done d = t->rx[t->rx_tail++ % RQ_DEPTH];
        const uint8_t *slot = rx_buf(t, d.slot);
        struct skh_grh_info g;
        if (!(d.wc_flags & IBV_WC_GRH) || d.byte_len < SKH_GRH_BYTES ||
            skh_grh_parse(slot, &g) < 0) {
            /* RoCE always carries a GRH; without one the sender cannot be answered */
            t->info.rx_no_grh++;
            post_recv(t, d.slot);
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
        p->src.u.ud.traffic_class = g.tclass & 0xfc; /* the prober's DSCP, not its ECN bits */
        /* Replies must take the prober's path. An IPv4 GRH has no flow label at all, so the path is
         * read from the probe itself (the engine echoes path_id, and so does the ACK's AH). */
        struct skh_msg m;
        p->src.u.ud.flow_label = skh_proto_decode(payload, plen, &m) == 0
                                     ? skh_path_flow_label(m.path_id)
                                     : g.flow_label;
        post_recv(t, d.slot);
    }
    return (int)k;
}

static int verbs_stamps(struct skh_transport *t, struct skh_txstamp *out, unsigned n)
{
    int rc = harvest(t);
    if (rc < 0)
        return rc;
    unsigned k = 0;
    while (k < n && t->st_tail != t->st_head)
        out[k++] = t->st[t->st_tail++ % SQ_DEPTH];
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
        set_err("'%s' is not a GID (IPv6 notation or IPv4)", text ? text : "");
        return -EINVAL;
    }
    if (qpn == 0 || qpn > 0xffffff) {
        set_err("a verbs target needs its QPN (1..0xffffff), got %u", qpn);
        return -EINVAL;
    }
    if (skh_gid_is_v4mapped(out->u.ud.gid) != skh_gid_is_v4mapped(t->info.gid)) {
        set_err("target GID %s and local GID (index %d) are of different address families", text,
                t->info.gid_index);
        return -EAFNOSUPPORT;
    }
    out->kind = SKH_ADDR_UD;
    out->u.ud.qpn = qpn;
    out->u.ud.qkey = SKH_VERBS_QKEY;
    out->u.ud.flow_label = skh_path_flow_label(path_id);
    out->u.ud.sgid_index = (uint8_t)t->info.gid_index;
    out->u.ud.port_num = t->info.port_num;
    /* resolve the peer now, off the engine thread; an unreachable peer is an error the caller
     * sees at once instead of a stalled engine and a lost probe */
    struct ibv_ah *ah;
    int rc = ah_get(t, out, 0, &ah);
    if (rc < 0 && rc != -EAGAIN) {
        set_err("cannot create an address handle for %s (GID index %d): %s", text,
                t->info.gid_index, strerror(-rc));
        return rc;
    }
    return 0;
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
};

#endif /* SKH_HAVE_VERBS_H */
