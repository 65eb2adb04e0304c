#include "proto.h"

#include <errno.h>
#include <string.h>

/* An RTT beyond this is a broken clock, not a slow network (the engine's timeout is far shorter). */
#define SKH_RTT_SANE_MAX_NS (60LL * 1000000000LL)

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static uint32_t get32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t get64(const uint8_t *p) { return ((uint64_t)get32(p) << 32) | get32(p + 4); }

/* A receipt window is consistent: span <= 128 and no bit set beyond it. */
static int rcpt_ok(uint16_t span, const uint64_t bits[2])
{
    if (span > SKH_RCPT_BITS)
        return 0;
    uint64_t lo_mask = span >= 64 ? ~0ull : (1ull << span) - 1;
    uint64_t hi_mask = span >= 128 ? ~0ull : span <= 64 ? 0 : (1ull << (span - 64)) - 1;
    return !(bits[0] & ~lo_mask) && !(bits[1] & ~hi_mask);
}

int skh_proto_encode(const struct skh_msg *msg, uint32_t probe_len, uint8_t *buf, size_t cap)
{
    uint32_t len;

    if (msg->type == SKH_MSG_PROBE) {
        if (probe_len < SKH_PROBE_MIN_LEN || probe_len > SKH_PROBE_MAX_LEN ||
            (msg->popts & ~SKH_POPT_KNOWN))
            return -EINVAL;
        len = probe_len;
    } else if (msg->type == SKH_MSG_ACK1 || msg->type == SKH_MSG_ACK2) {
        len = SKH_ACK_LEN;
    } else {
        return -EINVAL;
    }
    if ((msg->flags & ~SKH_FLAG_MASK) || msg->ts_source > SKH_TS_HW)
        return -EINVAL;
    int rcpt = (msg->flags & SKH_FLAG_RCPT) != 0;
    if ((rcpt && (msg->type != SKH_MSG_ACK1 || !rcpt_ok(msg->rcpt_span, msg->rcpt_bits))) ||
        ((msg->flags & SKH_FLAG_T34_VALID) && msg->type != SKH_MSG_ACK2))
        return -EINVAL;
    if (cap < len)
        return -ENOSPC;
    memset(buf, 0, len);
    put32(buf, SKH_PROTO_MAGIC);
    buf[4] = SKH_PROTO_VERSION;
    buf[5] = msg->type;
    buf[6] = msg->flags;
    buf[7] = msg->ts_source;
    put32(buf + 8, msg->session);
    put32(buf + 12, msg->seq);
    put16(buf + 16, msg->path_id);
    put32(buf + 20, msg->resp_session);
    put64(buf + 24, msg->t1);
    if (rcpt) {
        put16(buf + 18, msg->rcpt_span);
        put64(buf + 32, msg->rcpt_bits[0]);
        put64(buf + 40, msg->rcpt_bits[1]);
    } else {
        put64(buf + 32, msg->t3);
        put64(buf + 40, msg->t4);
    }
    if (msg->type == SKH_MSG_PROBE && msg->stream) {
        put32(buf + 48, SKH_RCPT_MAGIC);
        put32(buf + 52, msg->stream);
        put32(buf + 56, msg->tseq);
    }
    if (msg->type == SKH_MSG_PROBE && msg->popts) {
        put32(buf + 64, SKH_OPTS_MAGIC);
        put32(buf + 68, msg->popts);
    }
    return (int)len;
}

int skh_proto_decode(const uint8_t *buf, size_t len, struct skh_msg *out)
{
    if (len < 6)
        return -SKH_DROP_TRUNCATED;
    if (get32(buf) != SKH_PROTO_MAGIC)
        return -SKH_DROP_BAD_MAGIC;
    if (buf[4] != SKH_PROTO_VERSION)
        return -SKH_DROP_BAD_VERSION;
    uint8_t type = buf[5];
    if (type != SKH_MSG_PROBE && type != SKH_MSG_ACK1 && type != SKH_MSG_ACK2)
        return -SKH_DROP_BAD_TYPE;
    if (len < (type == SKH_MSG_PROBE ? SKH_PROBE_MIN_LEN : SKH_ACK_LEN))
        return -SKH_DROP_TRUNCATED;
    if (type == SKH_MSG_PROBE && len > SKH_PROBE_MAX_LEN)
        return -SKH_DROP_MALFORMED;

    memset(out, 0, sizeof(*out));
    out->type = type;
    out->flags = buf[6];
    out->ts_source = buf[7];
    out->session = get32(buf + 8);
    out->seq = get32(buf + 12);
    out->path_id = get16(buf + 16);
    out->resp_session = get32(buf + 20);
    out->t1 = get64(buf + 24);
    out->t3 = get64(buf + 32);
    out->t4 = get64(buf + 40);
    uint16_t reserved = get16(buf + 18);

    if ((out->flags & ~SKH_FLAG_MASK) || out->ts_source > SKH_TS_HW)
        return -SKH_DROP_MALFORMED;
    if (type == SKH_MSG_ACK1 && (out->flags & SKH_FLAG_RCPT)) {
        out->rcpt_span = reserved;
        out->rcpt_bits[0] = out->t3;
        out->rcpt_bits[1] = out->t4;
        out->t3 = out->t4 = 0;
        if (out->ts_source || !rcpt_ok(out->rcpt_span, out->rcpt_bits))
            return -SKH_DROP_MALFORMED;
        return 0;
    }
    if (reserved != 0)
        return -SKH_DROP_MALFORMED;
    switch (type) {
    case SKH_MSG_PROBE:
        if (out->flags || out->ts_source || out->resp_session || out->t3 || out->t4)
            return -SKH_DROP_MALFORMED;
        /* the padding is opaque unless it starts with the receipt request */
        if (get32(buf + 48) == SKH_RCPT_MAGIC) {
            out->stream = get32(buf + 52);
            out->tseq = get32(buf + 56);
            if (out->stream == 0 || get32(buf + 60) != 0)
                return -SKH_DROP_MALFORMED;
        }
        if (get32(buf + 64) == SKH_OPTS_MAGIC)
            out->popts = get32(buf + 68) & SKH_POPT_KNOWN;
        break;
    case SKH_MSG_ACK1:
        if (out->flags || out->ts_source || out->t3 || out->t4)
            return -SKH_DROP_MALFORMED;
        break;
    case SKH_MSG_ACK2:
        if (out->flags & SKH_FLAG_RCPT)
            return -SKH_DROP_MALFORMED;
        if (out->flags & SKH_FLAG_T34_VALID) {
            if (out->ts_source == SKH_TS_NONE || out->t3 == 0 || out->t4 < out->t3)
                return -SKH_DROP_MALFORMED;
        } else if (out->ts_source || out->t3 || out->t4) {
            return -SKH_DROP_MALFORMED;
        }
        break;
    }
    return 0;
}

int skh_proto_peek(const uint8_t *buf, size_t len, struct skh_msg *out)
{
    if (len < SKH_PROTO_HDR_LEN)
        return -SKH_DROP_TRUNCATED;
    if (get32(buf) != SKH_PROTO_MAGIC)
        return -SKH_DROP_BAD_MAGIC;
    if (buf[4] != SKH_PROTO_VERSION)
        return -SKH_DROP_BAD_VERSION;
    memset(out, 0, sizeof(*out));
    out->type = buf[5];
    out->session = get32(buf + 8);
    out->seq = get32(buf + 12);
    out->path_id = get16(buf + 16);
    out->resp_session = get32(buf + 20);
    return 0;
}

void skh_proto_ack1(const struct skh_msg *probe, uint32_t resp_session, struct skh_msg *ack)
{
    memset(ack, 0, sizeof(*ack));
    ack->type = SKH_MSG_ACK1;
    ack->session = probe->session;
    ack->seq = probe->seq;
    ack->path_id = probe->path_id;
    ack->resp_session = resp_session;
    ack->t1 = probe->t1;
}

void skh_proto_ack1_rcpt(const struct skh_msg *probe, uint32_t resp_session, uint16_t span,
                         const uint64_t bits[2], struct skh_msg *ack)
{
    skh_proto_ack1(probe, resp_session, ack);
    ack->flags = SKH_FLAG_RCPT;
    ack->rcpt_span = span > SKH_RCPT_BITS ? SKH_RCPT_BITS : span;
    ack->rcpt_bits[0] = bits[0];
    ack->rcpt_bits[1] = bits[1];
}

void skh_proto_ack2(const struct skh_msg *probe, uint32_t resp_session, uint64_t t3, uint64_t t4,
                    uint8_t ts_source, struct skh_msg *ack)
{
    skh_proto_ack1(probe, resp_session, ack);
    ack->type = SKH_MSG_ACK2;
    if (ts_source != SKH_TS_NONE && t3 != 0 && t4 >= t3) {
        ack->flags = SKH_FLAG_T34_VALID;
        ack->ts_source = ts_source;
        ack->t3 = t3;
        ack->t4 = t4;
    }
}

int skh_proto_rtt(int64_t t1, int64_t t2, uint8_t src_p, int64_t t3, int64_t t4, uint8_t src_r,
                  int64_t t5, int64_t t6, struct skh_rtt *out)
{
    int64_t kernel_rtt = -1;

    out->rtt_ns = -1;
    out->responder_delay_ns = -1;
    out->prober_delay_ns = -1;
    out->ts_source = src_p < src_r ? src_p : src_r;

    if (src_r != SKH_TS_NONE && t3 > 0 && t4 >= t3)
        out->responder_delay_ns = t4 - t3;
    if (src_p != SKH_TS_NONE && t2 > 0 && t5 >= t2) {
        kernel_rtt = t5 - t2;
        if (t1 > 0 && t6 >= t1 && (t6 - t1) >= kernel_rtt)
            out->prober_delay_ns = (t6 - t1) - kernel_rtt;
    }
    if (kernel_rtt < 0 || out->responder_delay_ns < 0 || out->ts_source == SKH_TS_NONE)
        return SKH_ST_INVALID;
    int64_t rtt = kernel_rtt - out->responder_delay_ns;
    if (rtt < 0 || rtt > SKH_RTT_SANE_MAX_NS)
        return SKH_ST_INVALID;
    out->rtt_ns = rtt;
    return SKH_ST_OK;
}
