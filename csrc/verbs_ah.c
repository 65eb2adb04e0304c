/* Address handles of the verbs transport (verbs_int.h).
 *
 * Creating an address handle resolves the peer's MAC in the kernel, which blocks for up to ~1 s on
 * first contact (measured on rxe: rdma-probing.md). The engine thread must never wait for that, so
 * a resolver thread per transport creates them: the engine asks (skh_ah_acquire), gets -EINPROGRESS
 * and keeps the datagram for a later try, and the handle is there when it tries again. Probe
 * targets are resolved ahead, at add_target (skh_ah_resolve, on the caller's thread); replies to a
 * new prober wait for their handle in the engine's retry queue.
 *
 * The cache holds at most its capacity of handles (SKH_AH_DEFAULT unless the engine says otherwise:
 * probes that rotate over ECMP paths need one per target and flow label); when full, the least
 * recently used one that no send in flight holds is destroyed to make room (sends hold theirs until their completion, so a handle
 * never disappears under the NIC). Pool entries never move; an open-addressing index over them is
 * kept with backward-shift deletion.
 */
#include "verbs_int.h"

#ifdef SKH_HAVE_VERBS_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HOP_LIMIT 64
#define RETRY_FAILED_NS (1000LL * 1000LL * 1000LL) /* a failed resolution is tried again after 1 s */

enum ah_state { AH_EMPTY = 0, AH_PENDING, AH_READY, AH_FAILED };

struct ah_ent {
    struct skh_ah_key key;
    struct ibv_ah *ah;
    uint8_t state;
    int err; /* AH_FAILED: -errno */
    uint32_t refs; /* sends in flight holding it */
    uint64_t last_used;
    int64_t retry_ns;
};

struct skh_ah_cache {
    struct ibv_pd *pd;
    pthread_mutex_t lock;
    pthread_cond_t work, done; /* resolver: something to do; owner: a resolution finished */
    pthread_t thread;
    int thread_started, stop;
    uint32_t cap; /* pool entries */
    uint32_t slots_mask; /* index slots - 1: a power of two >= 2 x cap */
    struct ah_ent *pool; /* [cap] */
    uint32_t *index; /* [slots]: pool position + 1; 0 = empty */
    uint32_t *free_list, n_free; /* [cap] */
    uint32_t *queue, q_head, q_tail; /* [cap]: pool positions to resolve */
    struct ibv_ah **doomed; /* [cap]: evicted, to be destroyed by the resolver */
    uint32_t n_doomed;
    uint64_t tick;
    uint64_t created, evicted, failures;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void skh_ah_key_of(const skh_addr *dst, struct skh_ah_key *k)
{
    memset(k, 0, sizeof(*k));
    memcpy(k->dgid, dst->u.ud.gid, 16);
    k->flow_label = dst->u.ud.flow_label & 0xfffff;
    k->sgid_index = dst->u.ud.sgid_index;
    k->traffic_class = dst->u.ud.traffic_class;
    k->sl = dst->u.ud.sl;
    k->port_num = dst->u.ud.port_num;
}

static uint32_t home(const struct skh_ah_cache *c, const struct skh_ah_key *k)
{
    uint32_t h = 2166136261u;
    const uint8_t *p = (const uint8_t *)k;
    for (size_t i = 0; i < sizeof(*k); i++)
        h = (h ^ p[i]) * 16777619u;
    return h & c->slots_mask;
}

/* Index slot of k, or the empty slot where it belongs. Caller holds the lock. */
static uint32_t find(const struct skh_ah_cache *c, const struct skh_ah_key *k)
{
    uint32_t i = home(c, k);
    while (c->index[i] && memcmp(&c->pool[c->index[i] - 1].key, k, sizeof(*k)) != 0)
        i = (i + 1) & c->slots_mask;
    return i;
}

/* Removes index slot i, shifting later members of its cluster back (no tombstones). */
static void unindex(struct skh_ah_cache *c, uint32_t i)
{
    c->index[i] = 0;
    for (uint32_t j = (i + 1) & c->slots_mask; c->index[j]; j = (j + 1) & c->slots_mask) {
        uint32_t h = home(c, &c->pool[c->index[j] - 1].key);
        /* the entry at j may move to i when its home is not cyclically within (i, j] */
        int stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            c->index[i] = c->index[j];
            c->index[j] = 0;
            i = j;
        }
    }
}

/* Destroys the least recently used idle handle; 0 when one was freed, -EAGAIN when every handle is
 * held by a send or being resolved. Caller holds the lock. */
static int evict_one(struct skh_ah_cache *c)
{
    uint32_t best = SKH_AH_NONE;
    for (uint32_t p = 0; p < c->cap; p++) {
        const struct ah_ent *e = &c->pool[p];
        if ((e->state == AH_READY || e->state == AH_FAILED) && e->refs == 0 &&
            (best == SKH_AH_NONE || e->last_used < c->pool[best].last_used))
            best = p;
    }
    if (best == SKH_AH_NONE)
        return -EAGAIN;
    struct ah_ent *e = &c->pool[best];
    unindex(c, find(c, &e->key));
    if (e->ah) {
        c->doomed[c->n_doomed++] = e->ah; /* destroyed by the resolver, off the engine thread */
        c->evicted++;
        pthread_cond_signal(&c->work);
    }
    memset(e, 0, sizeof(*e));
    c->free_list[c->n_free++] = best;
    return 0;
}

/* A pool entry for k, PENDING and queued for the resolver; SKH_AH_NONE when the cache is full of
 * handles in use. Caller holds the lock, and k is not in the index. */
static uint32_t add_pending(struct skh_ah_cache *c, const struct skh_ah_key *k)
{
    if (c->n_free == 0 && evict_one(c) < 0)
        return SKH_AH_NONE;
    uint32_t p = c->free_list[--c->n_free];
    struct ah_ent *e = &c->pool[p];
    memset(e, 0, sizeof(*e));
    e->key = *k;
    e->state = AH_PENDING;
    e->last_used = ++c->tick;
    c->index[find(c, k)] = p + 1;
    c->queue[c->q_tail++ % c->cap] = p;
    pthread_cond_signal(&c->work);
    return p;
}

static void requeue(struct skh_ah_cache *c, uint32_t p)
{
    c->pool[p].state = AH_PENDING;
    c->queue[c->q_tail++ % c->cap] = p;
    pthread_cond_signal(&c->work);
}

static struct ibv_ah *create(struct ibv_pd *pd, const struct skh_ah_key *k)
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
    return skh_ibv.create_ah(pd, &attr);
}

static void *resolver(void *arg)
{
    struct skh_ah_cache *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->stop && c->q_head == c->q_tail && c->n_doomed == 0)
            pthread_cond_wait(&c->work, &c->lock);
        if (c->stop)
            break;
        if (c->n_doomed) {
            struct ibv_ah *ah = c->doomed[--c->n_doomed];
            pthread_mutex_unlock(&c->lock);
            skh_ibv.destroy_ah(ah);
            pthread_mutex_lock(&c->lock);
            continue;
        }
        uint32_t p = c->queue[c->q_head++ % c->cap];
        struct skh_ah_key k = c->pool[p].key; /* a PENDING entry is never evicted or moved */
        pthread_mutex_unlock(&c->lock);
        struct ibv_ah *ah = create(c->pd, &k); /* may block on neighbour resolution */
        int err = ah ? 0 : -(errno ? errno : EIO);
        pthread_mutex_lock(&c->lock);
        struct ah_ent *e = &c->pool[p];
        e->ah = ah;
        e->err = err;
        e->state = ah ? AH_READY : AH_FAILED;
        e->retry_ns = mono_ns() + RETRY_FAILED_NS;
        if (ah)
            c->created++;
        else
            c->failures++;
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int skh_ah_cache_create(struct ibv_pd *pd, uint32_t cap, struct skh_ah_cache **out)
{
    if (cap == 0)
        cap = SKH_AH_DEFAULT;
    if (cap > SKH_AH_MAX)
        return -EINVAL;
    struct skh_ah_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->pd = pd;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    uint32_t slots = 1;
    while (slots < 2 * cap)
        slots <<= 1;
    c->cap = cap;
    c->slots_mask = slots - 1;
    /* calloc: pages of entries never used are never touched, so a large capacity costs no memory */
    c->pool = calloc(cap, sizeof(*c->pool));
    c->index = calloc(slots, sizeof(*c->index));
    c->free_list = calloc(cap, sizeof(*c->free_list));
    c->queue = calloc(cap, sizeof(*c->queue));
    c->doomed = calloc(cap, sizeof(*c->doomed));
    if (!c->pool || !c->index || !c->free_list || !c->queue || !c->doomed) {
        skh_ah_cache_destroy(c);
        return -ENOMEM;
    }
    for (uint32_t p = 0; p < cap; p++)
        c->free_list[p] = cap - 1 - p;
    c->n_free = cap;
    int rc = pthread_create(&c->thread, NULL, resolver, c);
    if (rc) {
        skh_ah_cache_destroy(c);
        return -rc;
    }
    c->thread_started = 1;
    *out = c;
    return 0;
}

void skh_ah_cache_destroy(struct skh_ah_cache *c)
{
    if (!c)
        return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->lock);
        c->stop = 1;
        pthread_cond_signal(&c->work);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->thread, NULL);
    }
    for (uint32_t i = 0; c->doomed && i < c->n_doomed; i++)
        skh_ibv.destroy_ah(c->doomed[i]);
    for (uint32_t p = 0; c->pool && p < c->cap; p++)
        if (c->pool[p].ah)
            skh_ibv.destroy_ah(c->pool[p].ah);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->done);
    free(c->pool);
    free(c->index);
    free(c->free_list);
    free(c->queue);
    free(c->doomed);
    free(c);
}

int skh_ah_acquire(struct skh_ah_cache *c, const struct skh_ah_key *k, struct ibv_ah **ah,
                   uint32_t *ref)
{
    int rc = -EINPROGRESS;
    pthread_mutex_lock(&c->lock);
    uint32_t i = find(c, k);
    if (!c->index[i]) {
        if (add_pending(c, k) == SKH_AH_NONE)
            rc = -EAGAIN;
    } else {
        uint32_t p = c->index[i] - 1;
        struct ah_ent *e = &c->pool[p];
        e->last_used = ++c->tick;
        if (e->state == AH_READY) {
            e->refs++;
            *ah = e->ah;
            *ref = p;
            rc = 0;
        } else if (e->state == AH_FAILED) {
            if (mono_ns() >= e->retry_ns)
                requeue(c, p);
            else
                rc = e->err;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void skh_ah_release(struct skh_ah_cache *c, uint32_t ref)
{
    if (ref == SKH_AH_NONE)
        return;
    pthread_mutex_lock(&c->lock);
    if (c->pool[ref].refs)
        c->pool[ref].refs--;
    pthread_mutex_unlock(&c->lock);
}

int skh_ah_resolve(struct skh_ah_cache *c, const struct skh_ah_key *k)
{
    pthread_mutex_lock(&c->lock);
    int rc = 0;
    for (;;) {
        uint32_t i = find(c, k);
        if (!c->index[i]) {
            if (add_pending(c, k) == SKH_AH_NONE) {
                rc = -EAGAIN;
                break;
            }
            continue;
        }
        struct ah_ent *e = &c->pool[c->index[i] - 1];
        if (e->state == AH_READY)
            break;
        if (e->state == AH_FAILED) {
            /* the caller asks now: a failure older than the retry delay is tried once more */
            if (mono_ns() < e->retry_ns) {
                rc = e->err;
                break;
            }
            requeue(c, c->index[i] - 1);
        }
        pthread_cond_wait(&c->done, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void skh_ah_counters(struct skh_ah_cache *c, uint64_t *created, uint64_t *evicted,
                     uint64_t *failures)
{
    pthread_mutex_lock(&c->lock);
    *created = c->created;
    *evicted = c->evicted;
    *failures = c->failures;
    pthread_mutex_unlock(&c->lock);
}

#endif /* SKH_HAVE_VERBS_H */
