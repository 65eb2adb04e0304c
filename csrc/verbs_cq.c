/* Completion queue and queue pair of the verbs transport (verbs_int.h): creation, polling, and
 * recovery of a queue pair that entered the error state.
 *
 * A UD queue pair goes to the error state on a fatal error (a bad work request, a port event, a
 * device reset); from then on every work request completes with IBV_WC_WR_FLUSH_ERR and nothing is
 * sent or received. Left alone the engine would go silent for good. Seeing an error completion, the
 * transport drains the CQ, asks the QP's state, and when it is in error takes it through RESET, INIT,
 * RTR and RTS again, reposts the receive buffers and counts a recovery; sends flushed meanwhile are
 * reported to the engine as not sent (its probes become LOCAL_ERROR, never network loss).
 */
#include "verbs_int.h"

#ifdef SKH_HAVE_VERBS_H

#include <errno.h>
#include <string.h>
#include <time.h>

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct ibv_cq_ex *skh_verbs_create_cq(struct skh_transport *t, int *hw)
{
    const uint64_t base = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_SRC_QP;
    int single_threaded = 1;
    for (int attempt = 0; attempt < 4; attempt++) {
        struct ibv_cq_init_attr_ex a = {
            .cqe = SKH_RQ_DEPTH + SKH_SQ_DEPTH,
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

int skh_verbs_qp_to_rts(struct skh_transport *t)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0,
                            .port_num = t->info.port_num, .qkey = SKH_VERBS_QKEY};
    if (skh_ibv.modify_qp(t->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
        return -1;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR; /* UD: no remote attributes, the AH of each send names the peer */
    if (skh_ibv.modify_qp(t->qp, &a, IBV_QP_STATE))
        return -1;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    return skh_ibv.modify_qp(t->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) ? -1 : 0;
}

void skh_verbs_post_recv(struct skh_transport *t, uint32_t slot)
{
    if (t->qp_suspect) { /* reposted once the QP is known to be healthy (recover) */
        t->rx_state[slot] = RX_FREE;
        return;
    }
    struct ibv_sge sge = {.addr = (uintptr_t)(t->buf + (size_t)slot * t->rx_slot),
                          .length = t->rx_slot,
                          .lkey = t->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = SKH_RECV_WRID_BIT | slot, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(t->qp, &wr, &bad) == 0) {
        t->rx_state[slot] = RX_POSTED;
    } else {
        t->rx_state[slot] = RX_FREE;
        t->qp_suspect = 1;
    }
}

/* A send completed (ok: its stamp; else it never left): the engine hears of it if it asked, the
 * send's AH is released. */
static void send_done(struct skh_transport *t, uint32_t slot, int ok, int64_t ts)
{
    if (t->tx_want[slot]) {
        struct skh_txstamp *s = &t->st[t->st_head++ % SKH_SQ_DEPTH];
        s->tx_id = t->tx_id[slot];
        s->err = ok ? 0 : -EIO;
        s->ts_source = !ok ? SKH_TS_NONE : t->info.hw_stamps ? SKH_TS_HW : SKH_TS_USER;
        s->ts_ns = !ok ? 0 : t->info.hw_stamps ? ts : t->tx_sw_ns[slot];
    }
    skh_ah_release(t->ahc, t->tx_ah[slot]);
    t->tx_ah[slot] = SKH_AH_NONE;
    t->tx_tail++;
}

/* The QP after error completions: back to RTS if it is in an error state, receives reposted. */
static int recover(struct skh_transport *t)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr init;
    memset(&a, 0, sizeof(a));
    if (skh_ibv.query_qp(t->qp, &a, IBV_QP_STATE, &init) != 0)
        return -(errno ? errno : EIO);
    if (a.qp_state == IBV_QPS_ERR || a.qp_state == IBV_QPS_SQE || a.qp_state == IBV_QPS_RESET) {
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RESET;
        if (skh_ibv.modify_qp(t->qp, &a, IBV_QP_STATE) != 0 || skh_verbs_qp_to_rts(t) != 0)
            return -(errno ? errno : EIO); /* tried again after the next error completion */
        /* a reset discards work requests without completions: sends still outstanding never left,
         * receives still posted are gone */
        while (t->tx_tail != t->tx_head)
            send_done(t, (uint32_t)(t->tx_tail % SKH_SQ_DEPTH), 0, 0);
        for (uint32_t i = 0; i < SKH_RQ_DEPTH; i++)
            if (t->rx_state[i] == RX_POSTED)
                t->rx_state[i] = RX_FREE;
        t->qp_recoveries++;
        t->rx_reset = 1;
    }
    t->qp_suspect = 0;
    for (uint32_t i = 0; i < SKH_RQ_DEPTH; i++)
        if (t->rx_state[i] == RX_FREE)
            skh_verbs_post_recv(t, i);
    return 0;
}

/* One CQE per start_poll/end_poll pair, never ibv_next_poll: rxe's next_poll already publishes the
 * consumer index and unlocks when the CQ runs empty, and the end_poll that must follow advances
 * the index once more, past the producer, so the whole ring of old CQEs is delivered again. Both
 * rings are large enough by construction: at most SKH_RQ_DEPTH receives are posted, and send()
 * keeps sends in flight plus undelivered stamps at most SKH_SQ_DEPTH. */
int skh_verbs_harvest(struct skh_transport *t)
{
    struct ibv_poll_cq_attr pattr = {0};
    int rc;
    while ((rc = ibv_start_poll(t->cq, &pattr)) == 0) {
        uint64_t wr_id = t->cq->wr_id;
        int ok = t->cq->status == IBV_WC_SUCCESS;
        int64_t ts = 0;
        /* a software receive stamp is read once the CQE is seen, never before: a clock read at the
         * start of the loop would be earlier than a CQE that arrived during it, and its T5 (or T3)
         * too early could make an RTT negative (send stamps are read before posting instead) */
        if (ok)
            ts = t->info.hw_stamps ? skh_tick_clock_ns(&t->clock, ibv_wc_read_completion_ts(t->cq))
                                   : mono_ns();
        if (wr_id & SKH_RECV_WRID_BIT) {
            uint32_t slot = (uint32_t)(wr_id & ~SKH_RECV_WRID_BIT) % SKH_RQ_DEPTH;
            if (ok) {
                struct skh_rx_done *d = &t->rx[t->rx_head++ % SKH_RQ_DEPTH];
                d->slot = slot;
                d->byte_len = ibv_wc_read_byte_len(t->cq);
                d->src_qp = ibv_wc_read_src_qp(t->cq);
                d->wc_flags = ibv_wc_read_wc_flags(t->cq);
                d->ts_ns = ts;
                t->rx_state[slot] = RX_READY;
            } else {
                /* reposted once the QP's state is known: on a QP in error a repost only flushes
                 * again, and reposting from here would loop */
                t->rx_errors++;
                t->rx_state[slot] = RX_FREE;
                t->qp_suspect = 1;
            }
            ibv_end_poll(t->cq);
        } else {
            if (!ok) {
                t->tx_errors++;
                t->qp_suspect = 1;
            }
            ibv_end_poll(t->cq);
            if (t->tx_tail != t->tx_head)
                send_done(t, (uint32_t)(wr_id % SKH_SQ_DEPTH), ok, ts);
        }
    }
    if (rc != ENOENT)
        return -rc;
    if (t->qp_suspect)
        return recover(t);
    return 0;
}

#endif /* SKH_HAVE_VERBS_H */
