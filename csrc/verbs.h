/* The ibverbs UD transport (skh_transport_verbs, registered in transport.c).
 *
 * libibverbs is never linked: verbs_lib.c loads libibverbs.so.1 with dlopen on first use and reaches
 * its exported functions through dlvsym; everything on the data path (post_send/recv, polling,
 * CQ creation) goes through the context's ops table, so the extension imports on machines without
 * RDMA. Built without <infiniband/verbs.h>, the transport is registered but reports unavailable.
 *
 * Per engine: one RDMA device/port/GID, PD, one MR over a slot pool, one extended CQ (completion
 * timestamps where the device has them, else software stamps labelled SKH_TS_USER), a completion
 * channel (pollfd/arm), one UD QP (Q_Key SKH_VERBS_QKEY) with a deep receive queue, recovered when
 * it enters the error state, and an LRU cache of address handles keyed by (dgid, sgid_index,
 * flow_label, traffic_class, sl) that a resolver thread fills. The files: verbs_int.h.
 */
#ifndef SKH_VERBS_H
#define SKH_VERBS_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

extern const struct skh_transport_ops skh_transport_verbs;

/* Human-readable reason of the last available()/open() failure of the verbs transport of this
 * thread ("" when none): e.g. "libibverbs.so.1: cannot open shared object file",
 * "no RDMA devices (kernel has no RDMA support)". */
const char *skh_verbs_strerror(void);

/* What open() chose and found; for local_address() and tests. */
struct skh_verbs_info {
    char device[64];   /* RDMA device name, e.g. "rxe0" */
    uint8_t port_num;
    int gid_index;
    uint8_t gid[16];
    uint32_t qpn;
    uint32_t mtu;      /* active path MTU in bytes: the largest datagram */
    int hw_stamps;     /* 1: CQE completion timestamps (SKH_TS_HW); 0: software (SKH_TS_USER) */
    uint64_t hca_core_clock_khz;
    uint64_t timestamp_mask;
};

/* Fills *out for an open verbs transport; -EINVAL when t is not one. */
int skh_verbs_info(struct skh_transport *t, struct skh_verbs_info *out);

#endif
