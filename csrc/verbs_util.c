/* Pure logic of the ibverbs transport (see verbs_util.h). */
#include "verbs_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

static uint16_t ipv4_header_checksum(const uint8_t *h)
{
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) {
        if (i == 10)
            continue; /* the checksum field itself counts as zero */
        sum += (uint32_t)h[i] << 8 | h[i + 1];
    }
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

static void v4_to_gid(const uint8_t *addr4, uint8_t gid[16])
{
    memset(gid, 0, 10);
    gid[10] = 0xff;
    gid[11] = 0xff;
    memcpy(gid + 12, addr4, 4);
}

int skh_grh_parse(const uint8_t grh[SKH_GRH_BYTES], struct skh_grh_info *out)
{
    const uint8_t *ip4 = grh + 20;
    int v4_shape = ip4[0] == 0x45; /* version 4, 5-word header: RoCEv2 never sends options */
    int v6 = (grh[0] >> 4) == 6;
    /* Bytes 0..19 are undefined for IPv4 and may look like an IPv6 version nibble; then only a
     * valid IPv4 checksum settles it. Without the nibble the checksum is not required: rxe's
     * loopback path (same device) never fills it in. */
    int v4 = v4_shape && (!v6 || ipv4_header_checksum(ip4) == ((uint16_t)ip4[10] << 8 | ip4[11]));

    memset(out, 0, sizeof(*out));
    if (v4) {
        out->family = 4;
        out->tclass = ip4[1];
        out->hop_limit = ip4[8];
        out->next_header = ip4[9];
        v4_to_gid(ip4 + 12, out->sgid);
        v4_to_gid(ip4 + 16, out->dgid);
        return 0;
    }
    if (v6) {
        uint32_t w0 = (uint32_t)grh[0] << 24 | (uint32_t)grh[1] << 16 | (uint32_t)grh[2] << 8 | grh[3];
        out->family = 6;
        out->tclass = (uint8_t)(w0 >> 20);
        out->flow_label = w0 & 0xfffff;
        out->next_header = grh[6];
        out->hop_limit = grh[7];
        memcpy(out->sgid, grh + 8, 16);
        memcpy(out->dgid, grh + 24, 16);
        return 0;
    }
    return -EPROTO;
}

static int mask_ok(uint64_t mask)
{
    return mask >= 0xff && (mask & (mask + 1)) == 0;
}

/* floor(ticks * 1e6 / kHz), exact in 128 bits (64 would overflow after ~5 h at 1 GHz) */
static __int128 ticks_to_ns128(int64_t ticks, uint64_t khz)
{
    __int128 p = (__int128)ticks * 1000000;
    __int128 q = p / (__int128)khz;
    if (p % (__int128)khz < 0)
        q -= 1;
    return q;
}

static int64_t ticks_to_ns(int64_t ticks, uint64_t khz)
{
    __int128 q = ticks_to_ns128(ticks, khz);
    return q > INT64_MAX ? INT64_MAX : (int64_t)q;
}

/* A position on the extended time line; 0 ("no stamp") for one so far behind the first stamp that
 * it is garbage rather than out of order. */
static int64_t line_ns(int64_t ext, uint64_t khz)
{
    __int128 ns = SKH_TICK_ORIGIN_NS + ticks_to_ns128(ext, khz);
    return ns <= 0 ? 0 : ns > INT64_MAX ? INT64_MAX : (int64_t)ns;
}

int skh_tick_clock_init(struct skh_tick_clock *c, uint64_t mask, uint64_t khz)
{
    if (!mask_ok(mask) || khz == 0)
        return -EINVAL;
    memset(c, 0, sizeof(*c));
    c->mask = mask;
    c->khz = khz;
    return 0;
}

int64_t skh_tick_clock_ns(struct skh_tick_clock *c, uint64_t raw)
{
    raw &= c->mask;
    if (!c->primed) {
        c->primed = 1;
        c->last_raw = raw;
        c->last_ext = 0;
        return SKH_TICK_ORIGIN_NS;
    }
    uint64_t fwd = (raw - c->last_raw) & c->mask;
    if (fwd <= c->mask / 2) {
        c->last_ext += (int64_t)fwd;
        c->last_raw = raw;
        return line_ns(c->last_ext, c->khz);
    }
    /* slightly older than the newest stamp: place it behind without moving the newest */
    uint64_t back = (c->last_raw - raw) & c->mask;
    if (back > (uint64_t)INT64_MAX)
        return 0;
    return line_ns(c->last_ext - (int64_t)back, c->khz);
}

int64_t skh_ticks_delta_ns(uint64_t later, uint64_t earlier, uint64_t mask, uint64_t khz)
{
    if (!mask_ok(mask) || khz == 0)
        return -EINVAL;
    return ticks_to_ns((int64_t)((later - earlier) & mask & (UINT64_MAX >> 1)), khz);
}

int skh_rt_stamp_decode(uint64_t stamp, int64_t *ns_out)
{
    uint64_t sec = stamp >> 32, ns = stamp & 0xffffffffu;
    if (ns >= 1000000000u)
        return -EINVAL;
    *ns_out = (int64_t)(sec * 1000000000u + ns);
    return 0;
}

int skh_rt_stamp_plausible(uint64_t stamp, int64_t now_real_ns)
{
    int64_t ns;
    const int64_t day_ns = 86400LL * 1000000000LL;
    if (skh_rt_stamp_decode(stamp, &ns) < 0)
        return 0;
    return ns > now_real_ns - day_ns && ns < now_real_ns + day_ns;
}

int skh_gid_is_v4mapped(const uint8_t gid[16])
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(gid, prefix, 12) == 0;
}

int skh_gid_is_link_local(const uint8_t gid[16])
{
    return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80;
}

static int gid_is_zero(const uint8_t gid[16])
{
    for (int i = 0; i < 16; i++)
        if (gid[i])
            return 0;
    return 1;
}

int skh_gid_select(const struct skh_gid_cand *c, size_t n, const struct skh_gid_want *w)
{
    int best = -ENOENT;
    if (w->family != 4 && w->family != 6)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *g = c[i].gid;
        if (c[i].gid_type != SKH_GID_TYPE_ROCE_V2 || gid_is_zero(g))
            continue;
        if (skh_gid_is_v4mapped(g) != (w->family == 4))
            continue;
        if (w->family == 6 && skh_gid_is_link_local(g) != !!w->link_local)
            continue;
        if (w->ifindex && c[i].ndev_ifindex != w->ifindex)
            continue;
        if (w->has_addr && memcmp(g, w->addr, 16) != 0)
            continue;
        if (best < 0 || c[i].index < c[best].index)
            best = (int)i;
    }
    return best;
}

int skh_gid_format(const uint8_t gid[16], char *buf, size_t len)
{
    const char *r = skh_gid_is_v4mapped(gid) ? inet_ntop(AF_INET, gid + 12, buf, (socklen_t)len)
                                              : inet_ntop(AF_INET6, gid, buf, (socklen_t)len);
    return r ? 0 : -ENOSPC;
}

int skh_gid_parse(const char *text, uint8_t gid[16])
{
    uint8_t a4[4];
    if (inet_pton(AF_INET, text, a4) == 1) {
        v4_to_gid(a4, gid);
        return 0;
    }
    return inet_pton(AF_INET6, text, gid) == 1 ? 0 : -EINVAL;
}

uint16_t skh_flow_label_to_udp_sport(uint32_t flow_label)
{
    uint32_t fl_low = flow_label & 0x03fff, fl_high = flow_label & 0xfc000;
    return (uint16_t)(0xc000 | ((fl_low ^ (fl_high >> 14)) & 0x3fff));
}

uint32_t skh_path_flow_label(uint16_t path_id)
{
    return 1u + (uint32_t)path_id % 0x3fffu;
}
