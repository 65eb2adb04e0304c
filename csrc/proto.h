/* skh probe wire format, shared by every transport (UDP, ibverbs UD).
 *
 * One fixed 48-byte header, big-endian on the wire:
 *
 *   off size field
 *    0   4   magic          SKH_PROTO_MAGIC ("SKHP")
 *    4   1   version        SKH_PROTO_VERSION
 *    5   1   type           SKH_MSG_PROBE / SKH_MSG_ACK1 / SKH_MSG_ACK2
 *    6   1   flags          SKH_FLAG_* (unknown bits are malformed)
 *    7   1   ts_source      ACK2: clock of t3/t4 (TsSource values); 0 in PROBE/ACK1
 *    8   4   session        prober's session id (random per engine start); echoed in ACKs
 *   12   4   seq            prober's wire sequence number; echoed
 *   16   2   path_id        flow label / path index the prober pinned; echoed
 *   18   2   reserved       zero (ACK1 with SKH_FLAG_RCPT: rcpt_span)
 *   20   4   resp_session   responder's session id (0 in PROBE)
 *   24   8   t1             prober's send time (its own clock, opaque to the responder); echoed
 *   32   8   t3             ACK2: responder receive stamp of the PROBE (ACK1 + RCPT: rcpt_bits[0])
 *   40   8   t4             ACK2: responder send stamp of ACK1 (ACK1 + RCPT: rcpt_bits[1])
 *
 * A PROBE is the header padded to at least SKH_PROBE_MIN_LEN bytes; each ACK is exactly the header.
 * Because a responder answers one PROBE with two ACKs, a PROBE must be at least as long as both
 * together: the responder can never be used to amplify traffic.
 *
 * The protocol (R-Pingmesh's two replies): the prober stamps T1 (user clock) and T2 (send stamp of the
 * PROBE), the responder stamps T3 (receive stamp of the PROBE), answers ACK1 at once, learns T4 (send
 * stamp of ACK1) and sends ACK2{t3,t4}; the prober stamps T5 (receive stamp of ACK1) and T6 (its user
 * clock when it read ACK1). network RTT = (T5-T2) - (T4-T3), responder delay = T4-T3, prober delay =
 * (T6-T1) - (T5-T2): each difference is on one host's one clock, so no clock synchronisation is
 * needed.
 *
 * Receipts (which direction lost a probe). Wire version 1 is unchanged for peers that do not use
 * them; a prober that wants them says so in the PROBE's padding, which version-1 responders never
 * read, and a responder answers with them only when asked, so old and new engines interoperate:
 *
 *   PROBE padding   48  4  SKH_RCPT_MAGIC ("RCPT")     absent (anything else) = not asked
 *                   52  4  stream    prober's id of one target's probe sequence (non-zero)
 *                   56  4  tseq      that sequence's probe number
 *                   60  4  reserved  zero
 *   ACK1 + SKH_FLAG_RCPT: rcpt_span (bytes 18..19, 0..128) and rcpt_bits (bytes 32..47): bit i of
 *   the 128 (word i/64, bit i%64) says whether the responder had received probe tseq-1-i of this
 *   stream when it answered tseq; only the first rcpt_span bits are known (the responder remembers a
 *   stream from the first probe of it that it saw), the rest are zero.
 * Probe options (same compatibility rule: padding version-1 responders never read):
 *
 *   PROBE padding   64  4  SKH_OPTS_MAGIC ("OPTS")     absent (anything else) = no options
 *                   68  4  opts      SKH_POPT_* bits; bits this engine does not know are ignored
 *   SKH_POPT_NO_T34: the prober takes no RTT from this probe (only whether, and which way, it was
 *   answered), so the responder answers with ACK1 alone and takes no send stamp for it: one
 *   answer instead of two, and no stamp on either side. An older responder still sends ACK2,
 *   which the prober, already done with the probe, drops.
 * A probe whose answers never came back is then REPLY_LOST if a later answer says its request
 * arrived, REQUEST_LOST if a later answer says it did not, and LOST when no answer tells (see
 * engine.c). One stream's probes share a 5-tuple / flow label, so one path, which delivers in order:
 * "not received when a later probe of the stream was" means the request was lost.
 *
 * Everything here is pure (no I/O, no globals) so it can be unit-tested and fuzzed as plain C.
 */
#ifndef SKH_PROTO_H
#define SKH_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define SKH_PROTO_MAGIC 0x534B4850u /* "SKHP" */
#define SKH_PROTO_VERSION 1u
#define SKH_PROTO_HDR_LEN 48u
#define SKH_ACK_LEN SKH_PROTO_HDR_LEN
#define SKH_PROBE_MIN_LEN (2u * SKH_ACK_LEN)
/* Largest PROBE a responder accepts (one Ethernet MTU of UDP payload); larger datagrams are garbage. */
#define SKH_PROBE_MAX_LEN 1472u

enum skh_msg_type {
    SKH_MSG_PROBE = 1,
    SKH_MSG_ACK1 = 2,
    SKH_MSG_ACK2 = 3,
};

/* ACK2 only: t3/t4 are valid (clear when the responder had no usable pair of stamps). */
#define SKH_FLAG_T34_VALID 0x01u
/* ACK1 only: rcpt_span/rcpt_bits carry receipts (sent only to a PROBE that asked for them). */
#define SKH_FLAG_RCPT 0x02u
#define SKH_FLAG_MASK 0x03u
#define SKH_RCPT_MAGIC 0x52435054u /* "RCPT" */
#define SKH_RCPT_BITS 128u
#define SKH_OPTS_MAGIC 0x4F505453u /* "OPTS" */
#define SKH_POPT_NO_T34 0x01u
#define SKH_POPT_KNOWN 0x01u

/* Clock of a stamp or of a pair of stamps; the numeric values are skh.records.TsSource. */
enum skh_ts_source {
    SKH_TS_NONE = 0,
    SKH_TS_USER = 1,
    SKH_TS_KERNEL = 2,
    SKH_TS_HW = 3,
};

/* Outcome of one probe; the numeric values are skh.records.ProbeStatus. */
enum skh_status {
    SKH_ST_OK = 0,
    SKH_ST_LOST = 1,
    SKH_ST_REFUSED = 2,
    SKH_ST_UNREACHABLE = 3,
    SKH_ST_INVALID = 4,
    SKH_ST_REQUEST_LOST = 5, /* the responder never saw the request */
    SKH_ST_REPLY_LOST = 6,   /* the responder saw the request, an answer did not come back */
    SKH_ST_LOCAL_ERROR = 7,  /* could not be sent (EAGAIN/ENOBUFS, no AH, QP in error) */
};

/* Why a received datagram was dropped. skh_proto_decode returns the first five (negated);
 * the engine adds the others. The order is the order of the counters in struct skh_stats. */
enum skh_drop_reason {
    SKH_DROP_TRUNCATED = 1, /* shorter than its type needs, or cut by the receive buffer */
    SKH_DROP_BAD_MAGIC,
    SKH_DROP_BAD_VERSION,
    SKH_DROP_BAD_TYPE,
    SKH_DROP_MALFORMED, /* reserved bits/fields set, impossible ts_source, oversized PROBE */
    SKH_DROP_UNSOLICITED, /* an ACK for a session/seq this engine never sent (or long forgotten) */
    SKH_DROP_REPLAY, /* a second copy of an ACK already taken */
    SKH_DROP_LATE, /* an ACK for a probe already declared lost */
    SKH_DROP__COUNT
};

struct skh_msg {
    uint8_t type;
    uint8_t flags;
    uint8_t ts_source;
    uint16_t path_id;
    uint32_t session;
    uint32_t seq;
    uint32_t resp_session;
    uint64_t t1;
    uint64_t t3;
    uint64_t t4;
    uint32_t stream; /* PROBE: receipt request (0 = none) */
    uint32_t tseq; /* PROBE with stream: the stream's probe number */
    uint32_t popts; /* PROBE: SKH_POPT_* (0 = none) */
    uint16_t rcpt_span; /* ACK1 with SKH_FLAG_RCPT */
    uint64_t rcpt_bits[2];
};

/* Writes msg into buf as a PROBE of probe_len bytes (padded with zeros) or an ACK of SKH_ACK_LEN bytes.
 * probe_len is ignored for ACKs. Returns the number of bytes written, -EINVAL for an invalid message
 * or length, -ENOSPC when cap is too small. */
int skh_proto_encode(const struct skh_msg *msg, uint32_t probe_len, uint8_t *buf, size_t cap);

/* Parses and validates buf. Returns 0 and fills *out, or -SKH_DROP_* saying why it is garbage.
 * A PROBE must be SKH_PROBE_MIN_LEN..SKH_PROBE_MAX_LEN bytes (its padding is not inspected);
 * an ACK at least SKH_ACK_LEN (trailing bytes ignored). */
int skh_proto_decode(const uint8_t *buf, size_t len, struct skh_msg *out);

/* Reads only the header (magic, version, type, ids) of a datagram we sent ourselves and got back in
 * an ICMP error report, which may carry just its start. Returns 0 or -SKH_DROP_*. */
int skh_proto_peek(const uint8_t *buf, size_t len, struct skh_msg *out);

/* Builds the ACK1 answering probe (t3/t4 empty; with receipts when span > 0 or the probe asked)
 * and the ACK2 carrying (t3, t4, src). */
void skh_proto_ack1(const struct skh_msg *probe, uint32_t resp_session, struct skh_msg *ack);
void skh_proto_ack1_rcpt(const struct skh_msg *probe, uint32_t resp_session, uint16_t span,
                         const uint64_t bits[2], struct skh_msg *ack);
void skh_proto_ack2(const struct skh_msg *probe, uint32_t resp_session, uint64_t t3, uint64_t t4,
                    uint8_t ts_source, struct skh_msg *ack);

/* The two-reply arithmetic. All outputs are -1 when unknown.
 * prober pair (t2, t5) and responder pair (t3, t4) must each come from one clock (src_p, src_r);
 * t1/t6 from the prober's user clock (t6: when the prober read ACK1, whose receive stamp is t5).
 * Returns the record status: OK, or INVALID when a pair is missing or a difference is negative or
 * absurd (then rtt is -1, the delays that are known are still filled). */
struct skh_rtt {
    int64_t rtt_ns;
    int64_t responder_delay_ns;
    int64_t prober_delay_ns;
    uint8_t ts_source; /* the weaker of src_p and src_r */
};
int skh_proto_rtt(int64_t t1, int64_t t2, uint8_t src_p, int64_t t3, int64_t t4, uint8_t src_r,
                  int64_t t5, int64_t t6, struct skh_rtt *out);

#endif
