/* The responder's memory of which probes of each stream it received (csrc/proto.h, "Receipts").
 *
 * A stream is one prober target's probe sequence, keyed by (prober session, stream id). For each the
 * table keeps the newest probe number seen and a 128-probe window of receipts behind it, so the ACK1
 * answering probe tseq can say which of tseq-1 .. tseq-128 arrived. Bounded: a full neighbourhood
 * gives its least recently heard stream's entry to the new one (that prober's next answers then
 * carry a short span, never a wrong bit). Pure logic, engine thread only. */
#ifndef SKH_RECEIPTS_H
#define SKH_RECEIPTS_H

#include <stdint.h>

struct skh_rcpt_table;

/* cap: entries (rounded up to a power of two). Returns 0 or -ENOMEM. */
int skh_rcpt_create(uint32_t cap, struct skh_rcpt_table **out);
void skh_rcpt_destroy(struct skh_rcpt_table *t);

/* Notes that probe tseq of (session, stream) arrived at now_ns and fills the receipts to send
 * back with it: *span tseqs before it are known, bit i of bits = tseq-1-i arrived. */
void skh_rcpt_note(struct skh_rcpt_table *t, uint32_t session, uint32_t stream, uint32_t tseq,
                   int64_t now_ns, uint16_t *span, uint64_t bits[2]);

#endif
