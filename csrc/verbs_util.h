/* Pure logic of the ibverbs transport: no libibverbs, no I/O, so it builds and is unit-tested
 * everywhere. GRH parsing (both RoCEv2 layouts), HCA tick -> ns with wrap-around, mlx5
 * real-time-format stamps, GID table selection, flow label -> UDP source port.
 * Functions return 0 / a non-negative value on success and -errno on failure. */
#ifndef SKH_VERBS_UTIL_H
#define SKH_VERBS_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every UD receive buffer starts with this many bytes of GRH, present or not. */
#define SKH_GRH_BYTES 40
/* Fleet-wide Q_Key (MSB clear: a controlled Q_Key cannot be sent by ordinary consumers). */
#define SKH_VERBS_QKEY 0x11111111u

struct skh_grh_info {
    uint8_t family;       /* 4 (IPv4 header in bytes 20..39) or 6 (IPv6 header) */
    uint8_t tclass;       /* IPv6 traffic class / IPv4 TOS */
    uint8_t hop_limit;    /* IPv6 hop limit / IPv4 TTL */
    uint8_t next_header;  /* IPv6 next header / IPv4 protocol: 17 (UDP) for RoCEv2 */
    uint32_t flow_label;  /* 20 bits; always 0 for IPv4, where no flow label is on the wire */
    uint8_t sgid[16];     /* source address as a GID (IPv4 as ::ffff:a.b.c.d) */
    uint8_t dgid[16];
};

/* Parse the 40-byte GRH area of a UD receive buffer: IPv4 when bytes 20..39 hold a 20-byte IPv4
 * header (bytes 0..19 are undefined then; when they start with an IPv6 version nibble, the IPv4
 * checksum must also be valid), else IPv6 when the version nibble says 6. -EPROTO when neither
 * layout fits. */
int skh_grh_parse(const uint8_t grh[SKH_GRH_BYTES], struct skh_grh_info *out);

/* HCA free-running clock, extended past its wrap-around and converted to ns. Feed it raw
 * completion stamps of ONE device in roughly increasing order; a stamp at most half a wrap
 * behind the newest is taken as slightly out of order (send vs receive CQ), not as a wrap.
 * Only tick counts since the first stamp are ever converted, never the raw counter itself: a
 * counter may start anywhere in its range (mlx5 reports a 63-bit mask, and a raw value near
 * 2^63 ticks is past INT64_MAX once in ns at any clock above 1 GHz, at any clock at all once
 * shifted by a wrap), while the ticks between two stamps of one run stay small. */
struct skh_tick_clock {
    uint64_t mask;          /* completion_timestamp_mask: 2^n - 1 */
    uint64_t khz;           /* hca_core_clock in kHz */
    uint64_t last_raw;      /* newest raw stamp seen (masked) */
    int64_t last_ext;       /* its distance in ticks from the first stamp */
    int primed;
};

/* ns of the first stamp: every stamp is > 0 (0 means "no stamp" to the engine), and so is any
 * placed behind the first, up to ~146 years. */
#define SKH_TICK_ORIGIN_NS (1LL << 62)

/* -EINVAL unless mask is 2^n - 1 (n >= 8) and khz > 0. */
int skh_tick_clock_init(struct skh_tick_clock *c, uint64_t mask, uint64_t khz);
/* ns on the extended tick time line: SKH_TICK_ORIGIN_NS at the first stamp. */
int64_t skh_tick_clock_ns(struct skh_tick_clock *c, uint64_t raw);
/* later - earlier for two raw stamps of one device, modulo the mask, in ns; -EINVAL on bad
 * mask/khz. The delta is always taken forward (a wrapped later stamp gives a small delta). */
int64_t skh_ticks_delta_ns(uint64_t later, uint64_t earlier, uint64_t mask, uint64_t khz);

/* mlx5 real-time CQE format: seconds in the upper 32 bits, ns in the lower 32. -EINVAL when the
 * ns word is >= 1e9 (not RT format). */
int skh_rt_stamp_decode(uint64_t stamp, int64_t *ns_out);
/* 1 if stamp decodes as RT format and lies within +/- 1 day of now_real_ns, else 0. Guards
 * against a provider that returns raw ticks where wallclock ns were asked for. */
int skh_rt_stamp_plausible(uint64_t stamp, int64_t now_real_ns);

/* GID table selection. Types mirror enum ibv_gid_type. */
enum { SKH_GID_TYPE_IB = 0, SKH_GID_TYPE_ROCE_V1 = 1, SKH_GID_TYPE_ROCE_V2 = 2 };

struct skh_gid_cand {
    uint8_t gid[16];
    uint32_t index;
    uint32_t gid_type;
    uint32_t ndev_ifindex;
};

struct skh_gid_want {
    int family;            /* 4 or 6 */
    int link_local;        /* IPv6 only: 1 = want an fe80::/10 GID, 0 = never one */
    uint32_t ifindex;      /* 0 = any netdev, else the GID's ndev_ifindex must match */
    int has_addr;          /* 1: the GID must equal addr (an exact configured address) */
    uint8_t addr[16];      /* IPv4 as ::ffff:a.b.c.d */
};

/* Position in c[] of the best GID for w: RoCE v2 only, non-zero, right family, link-local only
 * when asked, right netdev, right address if given; ties go to the lowest table index (so index
 * 0 wins only when it really is the match). -ENOENT when nothing qualifies. */
int skh_gid_select(const struct skh_gid_cand *c, size_t n, const struct skh_gid_want *w);

int skh_gid_is_v4mapped(const uint8_t gid[16]);
int skh_gid_is_link_local(const uint8_t gid[16]);
/* 16-byte GID <-> text (dotted quad for IPv4-mapped GIDs, else IPv6 notation). */
int skh_gid_format(const uint8_t gid[16], char *buf, size_t len);
int skh_gid_parse(const char *text, uint8_t gid[16]);

/* RoCEv2 UDP source port an mlx5 AH uses for a non-zero flow label (rdma-core >= v29). */
uint16_t skh_flow_label_to_udp_sport(uint32_t flow_label);
/* Flow label that pins probe path path_id: never 0 (0 = a random source port per AH). Labels
 * 1..0x3FFF map one-to-one onto source ports 0xC001..0xFFFF. */
uint32_t skh_path_flow_label(uint16_t path_id);

#ifdef __cplusplus
}
#endif
#endif
