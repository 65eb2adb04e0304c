#include "receipts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define PROBE_LIMIT 8 /* slots looked at per key: a full neighbourhood evicts its oldest */

typedef unsigned __int128 u128;

struct entry {
    uint32_t session, stream; /* session 0 = empty (a prober's session is never 0) */
    uint32_t hi; /* newest tseq seen */
    uint32_t known; /* tseqs hi-known+1 .. hi are known (1..128) */
    u128 win; /* bit i: hi - i arrived */
    int64_t last_ns;
};

struct skh_rcpt_table {
    uint32_t mask;
    struct entry e[];
};

int skh_rcpt_create(uint32_t cap, struct skh_rcpt_table **out)
{
    uint32_t n = 16;
    while (n < cap && n < (1u << 24))
        n <<= 1;
    /* calloc: pages are touched only as streams arrive */
    struct skh_rcpt_table *t = calloc(1, sizeof(*t) + (size_t)n * sizeof(struct entry));
    if (!t)
        return -ENOMEM;
    t->mask = n - 1;
    *out = t;
    return 0;
}

void skh_rcpt_destroy(struct skh_rcpt_table *t) { free(t); }

static uint32_t hash(uint32_t session, uint32_t stream)
{
    uint64_t x = ((uint64_t)session << 32 | stream) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

static struct entry *lookup(struct skh_rcpt_table *t, uint32_t session, uint32_t stream, int *fresh)
{
    uint32_t h = hash(session, stream);
    struct entry *victim = NULL;
    for (uint32_t k = 0; k < PROBE_LIMIT; k++) {
        struct entry *e = &t->e[(h + k) & t->mask];
        if (e->session == session && e->stream == stream) {
            *fresh = 0;
            return e;
        }
        if (e->session == 0) {
            victim = e;
            break;
        }
        if (!victim || e->last_ns < victim->last_ns)
            victim = e;
    }
    *fresh = 1;
    memset(victim, 0, sizeof(*victim));
    victim->session = session;
    victim->stream = stream;
    return victim;
}

void skh_rcpt_note(struct skh_rcpt_table *t, uint32_t session, uint32_t stream, uint32_t tseq,
                   int64_t now_ns, uint16_t *span, uint64_t bits[2])
{
    int fresh;
    struct entry *e = lookup(t, session, stream, &fresh);
    e->last_ns = now_ns;
    if (fresh) {
        e->hi = tseq;
        e->known = 1;
        e->win = 1;
    } else {
        int32_t d = (int32_t)(tseq - e->hi);
        if (d > 0) {
            /* the tseqs skipped over are known not to have arrived (yet) */
            e->win = (uint32_t)d >= SKH_RCPT_BITS ? 0 : e->win << d;
            e->win |= 1;
            e->hi = tseq;
            e->known = e->known + (uint32_t)d > SKH_RCPT_BITS ? SKH_RCPT_BITS : e->known + (uint32_t)d;
        } else if (d < 0 && (uint32_t)-d < e->known) {
            e->win |= (u128)1 << -d; /* a late arrival */
        }
    }
    /* receipts of tseq-1-i: window bits behind tseq's own position */
    uint32_t back = e->hi - tseq; /* 0 unless tseq arrived late */
    uint32_t n = 0;
    u128 w = 0;
    if (back + 1 < e->known) { /* then back + 1 < 128: the shifts below are defined */
        n = e->known - back - 1;
        w = (e->win >> (back + 1)) & (((u128)1 << n) - 1);
    }
    *span = (uint16_t)n;
    bits[0] = (uint64_t)w;
    bits[1] = (uint64_t)(w >> 64);
}
