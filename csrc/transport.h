/* The engine's internal transport interface: how probe packets leave and arrive.
 *
 * The engine (engine.c) owns the protocol (proto.h), the schedule, the in-flight table and the ring.
 * A transport only moves opaque datagrams of <= SKH_PROBE_MAX_LEN bytes and reports clocks:
 *   - send():   a batch of datagrams to addresses; gives each a tx_id;
 *   - stamps(): send stamps learnt since, keyed by those tx_ids (T2 for probes, T4 for ACK1s);
 *   - recv():   a batch of received datagrams with their receive stamps (T3, T5), and error reports
 *               about datagrams this transport sent earlier (ICMP port/host unreachable);
 *   - pollfd()/arm(): how the engine sleeps until one of the above has work.
 * All calls come from the engine thread only, except open/close/available (owner's thread, engine
 * thread not running) and parse_addr (any thread, at any time: it must only read state that open()
 * fixed). No call blocks: they return what
 * is ready now. Every function returns >= 0 or -errno and never prints.
 *
 * HOW A TRANSPORT REGISTERS
 *   1. Define `const struct skh_transport_ops skh_transport_<name> = { .name = "<name>", ... };`
 *      in csrc/<name>.c (every .c file in csrc/ is compiled into skh._fastprobe by setup.py).
 *   2. Add one line `&skh_transport_<name>,` to the table in transport.c and one weak declaration
 *      to transport.c, so the tree still links while a transport's file is absent.
 *   3. Python selects it by name: Engine(transport="<name>"); capabilities() lists every registered
 *      transport whose available() returns 0.
 * A transport that needs an optional library (libibverbs) must keep the extension importable without
 * it (dlopen at open time, or a stub whose available() and open() return -EOPNOTSUPP).
 */
#ifndef SKH_TRANSPORT_H
#define SKH_TRANSPORT_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

enum skh_addr_kind {
    SKH_ADDR_NONE = 0,
    SKH_ADDR_IP4 = 1, /* u.in4 */
    SKH_ADDR_IP6 = 2, /* u.in6 */
    SKH_ADDR_UD = 3, /* u.ud: an ibverbs UD destination */
};

/* Opaque to the engine: it stores, copies and hands back addresses, never looks inside. A transport
 * may keep its own bookkeeping in _pad (UDP: [0] which local socket, i.e. which ECMP path, an address
 * is reached from -- a received datagram's src says which socket it arrived on, so replies leave
 * there; [1] the traffic class a reply to that datagram carries, valid when [2] is 1). */
typedef struct skh_addr {
    uint8_t kind; /* enum skh_addr_kind */
    uint8_t _pad[3];
    union {
        struct sockaddr_in in4;
        struct sockaddr_in6 in6;
        struct {
            uint8_t gid[16];
            uint32_t qpn;
            uint32_t qkey;
            uint32_t flow_label; /* pins the ECMP path (UDP source port on RoCEv2) */
            uint8_t sgid_index;
            uint8_t port_num;
            uint8_t traffic_class;
            uint8_t sl;
        } ud;
        uint8_t raw[56];
    } u;
} skh_addr;

struct skh_transport_cfg {
    const char *bind; /* local IP literal ("0.0.0.0", "::", "10.0.0.1"); NULL = any IPv4 */
    uint16_t port; /* UDP port to bind, 0 = ephemeral (ignored by verbs) */
    const char *device; /* netdev (UDP hw stamps) or RDMA device (verbs); NULL = choose */
    int gid_index; /* verbs: -1 = choose by type/family/netdev */
    int netns_fd; /* >= 0: create the socket/QP inside this network namespace */
    int hw_timestamps; /* ask for NIC stamps; open() fails -EOPNOTSUPP when the NIC has none */
    int no_kernel_stamps; /* ask for no stamps at all (the engine then uses its user clock) */
    /* Class of service of probes: the IP TOS / IPv6 traffic class byte (DSCP << 2 | ECN) of UDP
     * datagrams and of the RoCE GRH, and the priority (UDP: SO_PRIORITY, i.e. the egress queue and
     * VLAN PCP; verbs: the service level). Replies carry the DSCP their probe arrived with (so the
     * return path rides the prober's class) with this engine's ECN bits and priority. */
    uint8_t traffic_class;
    uint8_t priority;
    /* verbs: address handles kept at most (0 = SKH_ADDRESS_HANDLES_DEFAULT) */
    uint32_t address_handles;
};

/* Address handles a verbs transport keeps by default: one per (peer, flow label, class) in use, for
 * its probes and for its replies, and agents rotate each target over its ECMP paths (4,096 covers
 * 32 targets x 64 path ids both ways). A handle costs ~100 B of cache plus the driver's object;
 * past the limit the least recently used idle one is destroyed and made again when needed. */
#define SKH_ADDRESS_HANDLES_DEFAULT 4096u
#define SKH_ADDRESS_HANDLES_MAX (1u << 20)

/* One datagram to send. The engine fills buf/len/dst; send() fills tx_id for those it sent. */
struct skh_txpkt {
    const uint8_t *buf;
    uint32_t len;
    const skh_addr *dst;
    uint8_t want_stamp; /* a send stamp is needed (PROBE: T2, ACK1: T4) */
    uint32_t tx_id; /* out: key of this datagram's later send stamp in stamps() (want_stamp only) */
};

/* One received datagram or error report. The engine sets buf/cap once; recv() fills the rest and
 * leaves buf/cap as they are. */
struct skh_rxpkt {
    uint8_t *buf;
    uint32_t cap;
    uint32_t len; /* out: bytes in buf */
    uint8_t truncated; /* out: the datagram was longer than cap */
    uint8_t ts_source; /* out: clock of ts_ns (SKH_TS_NONE: no receive stamp) */
    int32_t err; /* out: 0 = a datagram from src; < 0 = -errno of an error report about a datagram
                  * this transport sent to src, buf then holds (the start of) that datagram;
                  * -ENETRESET (len 0, nothing else valid): the transport lost whatever was on its
                  * way in (a queue pair reset), so answers due now may never arrive */
    int64_t ts_ns; /* out: receive stamp */
    skh_addr src; /* out: sender (or, for an error report, the original destination) */
};

/* A send stamp learnt after the fact (the kernel's error queue, a send completion); or, with err < 0,
 * the news that a datagram send() had accepted was not sent after all (a flushed work request of a
 * queue pair in error). */
struct skh_txstamp {
    uint32_t tx_id;
    uint8_t ts_source;
    int32_t err;
    int64_t ts_ns;
};

/* Counters a transport keeps about itself, in the order skh.probe.Engine.transport_stats() names
 * them; a transport leaves those that do not apply at 0. */
#define SKH_TSTATS(X)                                                                              \
    X(qp_recoveries)        /* queue pair found in error state and brought back to RTS */         \
    X(ah_created)           /* address handles created (off the engine thread) */                 \
    X(ah_evicted)           /* least recently used address handles destroyed to make room */     \
    X(ah_failures)          /* address handle creations that failed (peer not resolvable) */      \
    X(tx_completion_errors) /* send completions with an error status */                           \
    X(rx_completion_errors) /* receive completions with an error status */                        \
    X(rx_no_grh)            /* datagrams without a usable GRH (sender unknown), dropped */

enum skh_tstat {
#define SKH_TSTAT_ENUM(name) SKH_TSTAT_##name,
    SKH_TSTATS(SKH_TSTAT_ENUM)
#undef SKH_TSTAT_ENUM
    SKH_TSTAT__COUNT
};

extern const char *const skh_tstat_names[SKH_TSTAT__COUNT];

struct skh_transport; /* each transport defines its own struct */

/* Capability bits a transport reports through caps(). */
#define SKH_TCAP_TX_STAMPS 0x1u /* stamps() will deliver send stamps */
#define SKH_TCAP_RX_STAMPS 0x2u /* recv() fills ts_ns */
/* The stamps are taken by the kernel or the NIC as a datagram passes (SO_TIMESTAMPING, CQE
 * timestamps), not when the engine reads it: reading later moves none of them (engine tick_ns). */
#define SKH_TCAP_WIRE_STAMPS 0x4u

struct skh_transport_ops {
    const char *name;
    /* 0 when this machine can open the transport at all, else -errno (-EOPNOTSUPP, -ENODEV...). */
    int (*available)(void);
    int (*open)(const struct skh_transport_cfg *cfg, struct skh_transport **out);
    void (*close)(struct skh_transport *t);
    unsigned (*caps)(struct skh_transport *t);
    /* An fd that becomes readable (POLLIN) or reports POLLERR when recv() or stamps() has work.
     * Asked before every sleep: it may change after parse_addr() (which the engine follows with a
     * wake-up), e.g. from a single socket to an epoll set. */
    int (*pollfd)(struct skh_transport *t);
    /* Optional (NULL for UDP). Called just before the engine sleeps on pollfd(): re-arms the
     * notification (ibv_req_notify_cq) and drains the channel. Returns 1 when work arrived meanwhile
     * (the engine then polls again instead of sleeping), 0 when sleeping is safe, or -errno. */
    int (*arm)(struct skh_transport *t);
    /* Sends pkts[0..n) in order. Returns how many were sent (their tx_id set); when pkts[0] itself
     * could not be sent, -errno of that failure. -EAGAIN / -ENOBUFS / -ENOMEM mean "not now, for
     * anything" (a full queue or buffer), -EINPROGRESS "not now, for this destination" (its
     * address handle is still being resolved): the engine keeps the datagram (and, for the former,
     * the rest of the batch) and tries again; any other error is final for that datagram. */
    int (*send)(struct skh_transport *t, struct skh_txpkt *pkts, unsigned n);
    /* Up to n received datagrams / error reports; 0 when none is ready. The engine calls stamps()
     * right before recv() in each round, so a transport may gather both from one queue read. */
    int (*recv)(struct skh_transport *t, struct skh_rxpkt *pkts, unsigned n);
    /* Up to n send stamps; 0 when none is ready. */
    int (*stamps)(struct skh_transport *t, struct skh_txstamp *out, unsigned n);
    /* The local address peers must probe (for UD: own GID, QPN, qkey, chosen sgid_index). */
    int (*local)(struct skh_transport *t, skh_addr *out);
    /* Builds a destination from (host, port) or (gid, qpn) plus the path id to pin. */
    int (*parse_addr)(struct skh_transport *t, const char *host, uint16_t port, const char *gid,
                      uint32_t qpn, uint16_t path_id, skh_addr *out);
    /* Optional: fills out[0..SKH_TSTAT__COUNT) (any thread; values may be a moment old). */
    void (*counters)(struct skh_transport *t, uint64_t *out);
};

/* The registered transport called name, or NULL. */
const struct skh_transport_ops *skh_transport_find(const char *name);
/* Iterates registered transports: i = 0, 1, ... until NULL. */
const struct skh_transport_ops *skh_transport_at(unsigned i);

/* The kind of addr (enum skh_addr_kind) and, for SKH_ADDR_UD, the local GID index (else -1). */
int skh_addr_kind(const skh_addr *addr);
int skh_addr_gid_index(const skh_addr *addr);

/* Formats addr for humans and Python ("10.0.0.1" + port, or a GID "fe80::..." + qpn). Returns 0 or
 * -errno; host gets the address text, *port_or_qpn the port (UDP) or QPN (verbs). */
int skh_addr_format(const skh_addr *addr, char *host, size_t host_len, uint32_t *port_or_qpn);

#endif
