/* Internals of the ibverbs UD transport, shared by its files (one concern each):
 *   verbs_lib.c  libibverbs loaded with dlopen/dlvsym, the error text of the last failure
 *   verbs_dev.c  device, port and GID choice
 *   verbs_ah.c   address handles: created off the engine thread, cached, evicted LRU
 *   verbs_cq.c   completion queue and queue pair: creation, polling, error-state recovery
 *   verbs.c      the transport operations the engine calls (transport.h)
 * Only verbs.c is built when <infiniband/verbs.h> is missing (it then registers a transport that
 * reports itself unavailable); the others compile to nothing. */
#ifndef SKH_VERBS_INT_H
#define SKH_VERBS_INT_H

#include "verbs.h"

/* SKH_NO_VERBS forces the header-less build (tests/verbs/test_build.py compiles it that way). */
#if defined(__has_include) && !defined(SKH_NO_VERBS)
#if __has_include(<infiniband/verbs.h>)
#define SKH_HAVE_VERBS_H 1
#endif
#endif

void skh_verbs_set_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The thread's error text, writable (open_device keeps the first of several failures). */
char *skh_verbs_errbuf(size_t *len);

#ifdef SKH_HAVE_VERBS_H

#include <infiniband/verbs.h>
#include <pthread.h>

#include "proto.h"
#include "verbs_util.h"

/* ---------------------------------------------------------------- verbs_lib.c */

/* Exported entry points of libibverbs, filled by skh_ibv_load(). The ops-table inlines of verbs.h
 * (post_send/recv, start_poll, wc_read_*, create_cq_ex, req_notify_cq, query_port) need none of
 * these; the other inlines of verbs.h must not be called, since they reference exported symbols
 * that would then be left undefined in the extension. */
struct skh_ibv {
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
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                    struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
    struct ibv_ah *(*create_ah)(struct ibv_pd *pd, struct ibv_ah_attr *attr);
    int (*destroy_ah)(struct ibv_ah *ah);
};
extern struct skh_ibv skh_ibv;

/* Loads libibverbs once; 0 or -EOPNOTSUPP with the reason set. */
int skh_ibv_load(void);
/* The device list, or NULL with *rc < 0 and the reason set when there is no device at all. */
struct ibv_device **skh_ibv_devices(int *n, int *rc);

/* ---------------------------------------------------------------- verbs_ah.c */

#define SKH_AH_DEFAULT SKH_ADDRESS_HANDLES_DEFAULT
#define SKH_AH_MAX SKH_ADDRESS_HANDLES_MAX
#define SKH_AH_NONE UINT32_MAX

struct skh_ah_key {
    uint8_t dgid[16];
    uint32_t flow_label;
    uint8_t sgid_index, traffic_class, sl, port_num;
};

struct skh_ah_cache; /* opaque: verbs_ah.c */

int skh_ah_cache_create(struct ibv_pd *pd, uint32_t cap, struct skh_ah_cache **out);
/* Stops the resolver thread and destroys every address handle. */
void skh_ah_cache_destroy(struct skh_ah_cache *c);
void skh_ah_key_of(const skh_addr *dst, struct skh_ah_key *k);
/* Engine thread: the handle of k, reserved for one send until skh_ah_release(*ref). A handle not
 * resolved yet is asked of the resolver thread: -EINPROGRESS, try again later; -errno when its
 * resolution failed lately (retried after a while). Never blocks. */
int skh_ah_acquire(struct skh_ah_cache *c, const struct skh_ah_key *k, struct ibv_ah **ah,
                   uint32_t *ref);
void skh_ah_release(struct skh_ah_cache *c, uint32_t ref);
/* Owner's thread: resolves k now (waiting for the resolver) so an unreachable peer is reported
 * at add_target; 0 or -errno. */
int skh_ah_resolve(struct skh_ah_cache *c, const struct skh_ah_key *k);
void skh_ah_counters(struct skh_ah_cache *c, uint64_t *created, uint64_t *evicted,
                     uint64_t *failures);

/* ---------------------------------------------------------------- the transport */

#define SKH_VERBS_MAGIC 0x56524253u /* "VRBS" */
#define SKH_RQ_DEPTH 1024u /* UD drops silently when the RQ is empty: keep it deep */
#define SKH_SQ_DEPTH 512u
#define SKH_RECV_WRID_BIT (1ull << 63)

enum rx_slot_state { RX_FREE = 0, RX_POSTED, RX_READY };

struct skh_rx_done {
    uint32_t slot;
    uint32_t byte_len;
    uint32_t src_qp;
    uint32_t wc_flags;
    int64_t ts_ns;
};

struct skh_transport {
    uint32_t magic;
    struct skh_verbs_info info;
    uint8_t tclass, priority; /* of probes; replies keep their probe's DSCP */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_mr *mr;
    struct ibv_comp_channel *channel;
    struct ibv_cq_ex *cq;
    struct ibv_qp *qp;
    struct skh_ah_cache *ahc;
    struct skh_tick_clock clock; /* hw stamps only */
    uint8_t *buf; /* SKH_RQ_DEPTH rx slots, then SKH_SQ_DEPTH tx slots; one MR */
    size_t buf_len;
    uint32_t rx_slot, tx_slot, max_payload;
    uint8_t rx_state[SKH_RQ_DEPTH];
    /* sends: a ring of slots, completed in order on a UD send queue */
    uint64_t tx_head, tx_tail;
    uint32_t next_tx_id;
    uint32_t tx_id[SKH_SQ_DEPTH];
    uint32_t tx_ah[SKH_SQ_DEPTH]; /* the address handle each send holds until its completion */
    uint8_t tx_want[SKH_SQ_DEPTH]; /* the engine wants this send's stamp (or news of its failure) */
    int64_t tx_sw_ns[SKH_SQ_DEPTH];
    /* completions harvested from the CQ, waiting for recv()/stamps() */
    struct skh_rx_done rx[SKH_RQ_DEPTH];
    uint32_t rx_head, rx_tail;
    struct skh_txstamp st[SKH_SQ_DEPTH];
    uint32_t st_head, st_tail;
    unsigned unacked_events;
    int armed; /* a completion notification is requested and has not fired yet */
    int qp_suspect; /* an error completion was seen: check the QP's state once the CQ is drained */
    int rx_reset; /* the QP was reset: tell the engine (recv() reports -ENETRESET once) */
    /* counters (engine thread writes, other threads may read a moment-old value) */
    uint64_t qp_recoveries, tx_errors, rx_errors, rx_no_grh;
};

/* ---------------------------------------------------------------- verbs_dev.c */

struct skh_verbs_want {
    struct skh_gid_want gid;
    const char *bind_text;
};

int skh_verbs_parse_bind(const char *bind, struct skh_verbs_want *w);
/* Opens the device named by cfg->device (an RDMA device or a netdev), or the first one that has
 * a GID for the bind address; fills info. 0 or -errno with the reason set. */
int skh_verbs_open_device(const struct skh_transport_cfg *cfg, struct skh_verbs_want *w,
                          struct ibv_context **ctx_out, struct skh_verbs_info *info);

/* ---------------------------------------------------------------- verbs_cq.c */

/* *hw in: try completion timestamps; out: whether the CQ has them. */
struct ibv_cq_ex *skh_verbs_create_cq(struct skh_transport *t, int *hw);
int skh_verbs_qp_to_rts(struct skh_transport *t);
/* Posts rx slot as a receive (or leaves it free while the QP is being recovered). */
void skh_verbs_post_recv(struct skh_transport *t, uint32_t slot);
/* Moves every ready completion into t->rx / t->st, and brings a QP found in error state back.
 * 0 or -errno. */
int skh_verbs_harvest(struct skh_transport *t);

#endif /* SKH_HAVE_VERBS_H */
#endif
