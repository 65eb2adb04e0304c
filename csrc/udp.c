/* UDP transport: non-blocking datagram sockets, SO_TIMESTAMPING kernel (or NIC) stamps,
 * sendmmsg/recvmmsg, and the error queue for send stamps and ICMP errors (IP_RECVERR).
 *
 * Class of service: every socket sends with the configured IP TOS / IPv6 traffic class and
 * SO_PRIORITY; it also receives each datagram's TOS (IP_RECVTOS / IPV6_RECVTCLASS), so a reply
 * carries its probe's DSCP (an IP_TOS / IPV6_TCLASS cmsg when that differs from the socket's).
 *
 * Details measured on the build machines are in shared/notes/rdma-probing.md §3.3:
 *   - receive stamps arrive as SCM_TIMESTAMPING cmsgs (ts[0] software, ts[2] raw hardware);
 *   - send stamps are requested per datagram (a SO_TIMESTAMPING cmsg with TX flags) so only probes and
 *     ACK1s, whose send times are T2 and T4, cost an error-queue entry; ACK2s need none;
 *   - OPT_TSONLY: the error queue returns the stamp without the payload (works when
 *     net.core.tstamp_allow_data = 0 and copies nothing back);
 *   - OPT_ID keys each stamp: kernels >= 6.13 accept our own key per datagram (SCM_TS_OPT_ID, cmsg 81),
 *     older ones count stamped datagrams from 0 per socket, which we mirror.
 *
 * ECMP paths: a switch hashes the 5-tuple, and one socket cannot change its source port per datagram,
 * so each path_id gets its own socket (rdma-probing.md §3.3): path 0 is the bound port, which peers
 * probe; every other path_id gets one ephemeral source port, opened on first use and kept, so a
 * path_id always takes the same path. Replies leave from the socket the probe came in on, so the
 * return path is pinned too. The sockets sit in one epoll set, which the engine polls once there are
 * several.
 * An address carries its local socket's index in _pad[0]; a tx_id is (socket index << 24 | key).
 */
#include "transport.h"
#include "proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <linux/ethtool.h>
#include <linux/net_tstamp.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifndef SO_TIMESTAMPING
#define SO_TIMESTAMPING 37
#endif
#ifndef SCM_TIMESTAMPING
#define SCM_TIMESTAMPING SO_TIMESTAMPING
#endif
#ifndef SCM_TS_OPT_ID
#define SCM_TS_OPT_ID 81
#endif
#ifndef SO_EE_ORIGIN_TIMESTAMPING
#define SO_EE_ORIGIN_TIMESTAMPING 4
#endif

#define UDP_BATCH 64
#define ERRQ_CAP 1024 /* power of two */
#define CMSG_RX_SPACE 256
#define UDP_MAX_PATHS 64 /* sockets per transport (bits of a ready mask) */
#define ID_BITS 24
#define ID_MASK ((1u << ID_BITS) - 1)

struct usock {
    int fd;
    uint16_t path_id;
    uint32_t next_id; /* next key for a stamped datagram (= the kernel's counter in implicit mode) */
};

struct udp_transport {
    int epfd;
    int family;
    uint8_t tclass; /* TOS byte of every socket */
    uint8_t priority;
    unsigned caps;
    unsigned tsflags; /* SO_TIMESTAMPING flags every socket gets (0: no stamps) */
    int hw;
    int explicit_id; /* SCM_TS_OPT_ID accepted */
    int netns_fd; /* where path sockets are created (a dup of the caller's), or -1 */
    char bind_ip[64];
    pthread_mutex_t lock; /* serializes parse_addr() creating path sockets */
    struct usock socks[UDP_MAX_PATHS];
    _Atomic unsigned nsock; /* published after the slot is complete: the engine thread reads it */
    uint64_t rx_ready; /* sockets with datagrams waiting, from the last readiness check */
    int checked; /* rx_ready is fresh (stamps() ran since the last recv()) */
    /* error-queue entries read but not yet handed out */
    struct skh_txstamp stamps[ERRQ_CAP];
    unsigned st_head, st_tail;
    struct skh_rxpkt errs[UDP_BATCH];
    uint8_t errbuf[UDP_BATCH][SKH_ACK_LEN];
    unsigned n_errs;
};

static int udp_available(void) { return 0; }

static int kernel_at_least(int major, int minor)
{
    struct utsname u;
    int ma = 0, mi = 0;
    if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &ma, &mi) != 2)
        return 0;
    return ma > major || (ma == major && mi >= minor);
}

static int parse_ip(const char *host, uint16_t port, int family, skh_addr *out)
{
    struct in_addr a4;
    struct in6_addr a6;

    memset(out, 0, sizeof(*out));
    if (inet_pton(AF_INET, host, &a4) == 1) {
        if (family == AF_INET6) { /* a dual-stack socket reaches IPv4 peers as ::ffff:a.b.c.d */
            out->kind = SKH_ADDR_IP6;
            out->u.in6.sin6_family = AF_INET6;
            out->u.in6.sin6_port = htons(port);
            out->u.in6.sin6_addr.s6_addr[10] = 0xff;
            out->u.in6.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&out->u.in6.sin6_addr.s6_addr[12], &a4, 4);
            return 0;
        }
        out->kind = SKH_ADDR_IP4;
        out->u.in4.sin_family = AF_INET;
        out->u.in4.sin_port = htons(port);
        out->u.in4.sin_addr = a4;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        if (family == AF_INET)
            return -EAFNOSUPPORT;
        out->kind = SKH_ADDR_IP6;
        out->u.in6.sin6_family = AF_INET6;
        out->u.in6.sin6_port = htons(port);
        out->u.in6.sin6_addr = a6;
        return 0;
    }
    return -EINVAL;
}

static void addr_from_sockaddr(const struct sockaddr_storage *ss, skh_addr *out)
{
    memset(out, 0, sizeof(*out));
    if (ss->ss_family == AF_INET) {
        out->kind = SKH_ADDR_IP4;
        memcpy(&out->u.in4, ss, sizeof(out->u.in4));
    } else if (ss->ss_family == AF_INET6) {
        out->kind = SKH_ADDR_IP6;
        memcpy(&out->u.in6, ss, sizeof(out->u.in6));
    }
}

/* NIC stamps need the device to stamp (SIOCSHWTSTAMP, CAP_NET_ADMIN) and to say it can. */
static int enable_hw_stamps(int fd, const char *device)
{
    struct ifreq ifr;
    struct ethtool_ts_info info;
    struct hwtstamp_config hw;

    if (!device || strlen(device) >= IFNAMSIZ)
        return -EINVAL;
    memset(&ifr, 0, sizeof(ifr));
    memset(&info, 0, sizeof(info));
    strcpy(ifr.ifr_name, device);
    info.cmd = ETHTOOL_GET_TS_INFO;
    ifr.ifr_data = (void *)&info;
    if (ioctl(fd, SIOCETHTOOL, &ifr) != 0)
        return -errno;
    unsigned need = SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE;
    if ((info.so_timestamping & need) != need || info.phc_index < 0)
        return -EOPNOTSUPP;
    memset(&hw, 0, sizeof(hw));
    hw.tx_type = HWTSTAMP_TX_ON;
    hw.rx_filter = HWTSTAMP_FILTER_ALL;
    ifr.ifr_data = (void *)&hw;
    if (ioctl(fd, SIOCSHWTSTAMP, &ifr) != 0)
        return -errno;
    return 0;
}

static socklen_t addr_len(const skh_addr *a)
{
    return a->kind == SKH_ADDR_IP4 ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

/* Creates one socket bound to (bind_ip, port) with the transport's options, in its namespace. */
static int make_socket_here(struct udp_transport *t, uint16_t port, int *out)
{
    skh_addr bind_addr;
    int one = 1, rc;
    int fd;

    rc = parse_ip(t->bind_ip, port, t->family, &bind_addr);
    if (rc)
        return rc;
    fd = socket(t->family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* ICMP errors (port/host unreachable) of unconnected sockets reach us only with RECVERR */
    if (t->family == AF_INET)
        rc = setsockopt(fd, SOL_IP, IP_RECVERR, &one, sizeof(one));
    else
        rc = setsockopt(fd, SOL_IPV6, IPV6_RECVERR, &one, sizeof(one));
    if (rc)
        goto fail;
    if (t->family == AF_INET6) {
        int off = 0;
        (void)setsockopt(fd, SOL_IPV6, IPV6_V6ONLY, &off, sizeof(off));
        (void)setsockopt(fd, SOL_IP, IP_RECVERR, &one, sizeof(one));
    }
    /* room for bursts (many probers answering at once, a flood of garbage); FORCE passes
     * net.core.rmem_max when we have CAP_NET_ADMIN */
    int rcvbuf = 4 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    if (t->tsflags && setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &t->tsflags, sizeof(t->tsflags)) != 0)
        goto fail;
    int tos = t->tclass, prio = t->priority;
    if (setsockopt(fd, SOL_IP, IP_TOS, &tos, sizeof(tos)) != 0 ||
        setsockopt(fd, SOL_IP, IP_RECVTOS, &one, sizeof(one)) != 0)
        goto fail;
    if (t->family == AF_INET6 && (setsockopt(fd, SOL_IPV6, IPV6_TCLASS, &tos, sizeof(tos)) != 0 ||
                                  setsockopt(fd, SOL_IPV6, IPV6_RECVTCLASS, &one, sizeof(one)) != 0))
        goto fail;
    /* priorities above 6 need CAP_NET_ADMIN: a clear EPERM at open, not a silent default */
    if (prio && setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &prio, sizeof(prio)) != 0)
        goto fail;
    if (bind(fd, (const struct sockaddr *)&bind_addr.u, addr_len(&bind_addr)) != 0)
        goto fail;
    *out = fd;
    return 0;
fail:
    rc = -errno;
    close(fd);
    return rc;
}

/* A socket belongs to the namespace of the thread that creates it: enter, create, come back. */
static int make_socket(struct udp_transport *t, uint16_t port, int *out)
{
    int saved_ns = -1, rc;
    if (t->netns_fd >= 0) {
        saved_ns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
        if (saved_ns < 0)
            return -errno;
        if (setns(t->netns_fd, CLONE_NEWNET) != 0) {
            rc = -errno;
            close(saved_ns);
            return rc;
        }
    }
    rc = make_socket_here(t, port, out);
    if (saved_ns >= 0) {
        if (setns(saved_ns, CLONE_NEWNET) != 0 && rc == 0) {
            rc = -errno;
            close(*out);
        }
        close(saved_ns);
    }
    return rc;
}

/* Adds a socket for path_id as slot nsock (caller holds the lock or is open()). */
static int add_socket(struct udp_transport *t, uint16_t port, uint16_t path_id)
{
    unsigned idx = atomic_load(&t->nsock);
    int fd = -1, rc;
    if (idx >= UDP_MAX_PATHS)
        return -ENOSPC;
    rc = make_socket(t, port, &fd);
    if (rc)
        return rc;
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = idx};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    t->socks[idx].fd = fd;
    t->socks[idx].path_id = path_id;
    t->socks[idx].next_id = 0;
    atomic_store(&t->nsock, idx + 1);
    return 0;
}

static void udp_close(struct skh_transport *tp)
{
    struct udp_transport *t = (struct udp_transport *)tp;
    if (!t)
        return;
    unsigned n = atomic_load(&t->nsock);
    for (unsigned i = 0; i < n; i++)
        close(t->socks[i].fd);
    if (t->epfd >= 0)
        close(t->epfd);
    if (t->netns_fd >= 0)
        close(t->netns_fd);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static int udp_open(const struct skh_transport_cfg *cfg, struct skh_transport **out)
{
    struct udp_transport *t = calloc(1, sizeof(*t));
    const char *bind_ip = cfg->bind ? cfg->bind : "0.0.0.0";
    struct in_addr a4;
    int rc;

    if (!t)
        return -ENOMEM;
    t->epfd = -1;
    t->netns_fd = -1;
    pthread_mutex_init(&t->lock, NULL);
    if (strlen(bind_ip) >= sizeof(t->bind_ip)) {
        rc = -EINVAL;
        goto fail;
    }
    strcpy(t->bind_ip, bind_ip);
    t->family = inet_pton(AF_INET, bind_ip, &a4) == 1 ? AF_INET : AF_INET6;
    t->tclass = cfg->traffic_class;
    t->priority = cfg->priority;
    t->explicit_id = kernel_at_least(6, 13);
    if (cfg->netns_fd >= 0 && (t->netns_fd = fcntl(cfg->netns_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        rc = -errno;
        goto fail;
    }
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (t->epfd < 0) {
        rc = -errno;
        goto fail;
    }
    rc = add_socket(t, cfg->port, 0);
    if (rc)
        goto fail;
    int fd0 = t->socks[0].fd;
    if (cfg->hw_timestamps) {
        rc = enable_hw_stamps(fd0, cfg->device);
        if (rc)
            goto fail;
        t->hw = 1;
    }
    if (!cfg->no_kernel_stamps || t->hw) {
        unsigned flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID |
                         SOF_TIMESTAMPING_OPT_TSONLY;
        if (t->hw)
            flags |= SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE;
        if (setsockopt(fd0, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof(flags)) == 0) {
            t->tsflags = flags; /* path sockets get the same */
            t->caps = SKH_TCAP_TX_STAMPS | SKH_TCAP_RX_STAMPS | SKH_TCAP_WIRE_STAMPS;
        } else if (t->hw) {
            rc = -errno;
            goto fail;
        }
    }
    *out = (struct skh_transport *)t;
    return 0;
fail:
    udp_close((struct skh_transport *)t);
    return rc;
}

static unsigned udp_caps(struct skh_transport *tp) { return ((struct udp_transport *)tp)->caps; }

/* One socket is polled directly (cheaper per wake-up than through epoll); more go through the set. */
static int udp_pollfd(struct skh_transport *tp)
{
    struct udp_transport *t = (struct udp_transport *)tp;
    return atomic_load(&t->nsock) == 1 ? t->socks[0].fd : t->epfd;
}

static unsigned sock_of(const struct udp_transport *t, const skh_addr *a, unsigned nsock)
{
    return a->_pad[0] < nsock ? a->_pad[0] : 0;
}

/* Appends one cmsg carrying an int-sized value (IP_TOS takes an int on send) at buf + len. */
static size_t put_cmsg(char *buf, size_t len, int level, int type, uint32_t value)
{
    struct cmsghdr *c = (struct cmsghdr *)(buf + len);
    c->cmsg_level = level;
    c->cmsg_type = type;
    c->cmsg_len = CMSG_LEN(sizeof(uint32_t));
    memcpy(CMSG_DATA(c), &value, sizeof(uint32_t));
    return len + CMSG_SPACE(sizeof(uint32_t));
}

static int udp_send(struct skh_transport *tp, struct skh_txpkt *pkts, unsigned n)
{
    struct udp_transport *t = (struct udp_transport *)tp;
    struct mmsghdr msgs[UDP_BATCH];
    struct iovec iov[UDP_BATCH];
    union {
        char buf[CMSG_SPACE(sizeof(uint32_t)) * 2 + CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl[UDP_BATCH];
    unsigned tx_flags = t->hw ? SOF_TIMESTAMPING_TX_HARDWARE : SOF_TIMESTAMPING_TX_SOFTWARE;
    int stamped = (t->caps & SKH_TCAP_TX_STAMPS) != 0;
    unsigned nsock = atomic_load(&t->nsock);

    if (n > UDP_BATCH)
        n = UDP_BATCH;
    /* one sendmmsg per socket: send the leading run that shares pkts[0]'s socket */
    unsigned idx = sock_of(t, pkts[0].dst, nsock);
    unsigned run = 1;
    while (run < n && sock_of(t, pkts[run].dst, nsock) == idx)
        run++;
    n = run;
    struct usock *us = &t->socks[idx];

    memset(msgs, 0, n * sizeof(msgs[0]));
    uint8_t with_stamp[UDP_BATCH];
    uint32_t key = us->next_id;
    for (unsigned i = 0; i < n; i++) {
        struct msghdr *m = &msgs[i].msg_hdr;
        iov[i].iov_base = (void *)pkts[i].buf;
        iov[i].iov_len = pkts[i].len;
        m->msg_iov = &iov[i];
        m->msg_iovlen = 1;
        m->msg_name = (void *)&pkts[i].dst->u;
        m->msg_namelen = addr_len(pkts[i].dst);
        pkts[i].tx_id = 0;
        m->msg_control = ctl[i].buf;
        size_t ctl_len = 0;
        with_stamp[i] = stamped && pkts[i].want_stamp;
        if (with_stamp[i]) {
            /* keys in order; in implicit mode the kernel's counter only counts stamped datagrams */
            pkts[i].tx_id = (idx << ID_BITS) | (key & ID_MASK);
            ctl_len = put_cmsg(ctl[i].buf, ctl_len, SOL_SOCKET, SO_TIMESTAMPING, tx_flags);
            if (t->explicit_id)
                ctl_len = put_cmsg(ctl[i].buf, ctl_len, SOL_SOCKET, SCM_TS_OPT_ID, key);
            key++;
        }
        const skh_addr *d = pkts[i].dst;
        int reply_tos = d->_pad[2] ? (d->_pad[1] & 0xfc) | (t->tclass & 0x03) : t->tclass;
        if (reply_tos != t->tclass) { /* a reply in its probe's class */
            if (d->kind == SKH_ADDR_IP4 || IN6_IS_ADDR_V4MAPPED(&d->u.in6.sin6_addr))
                ctl_len = put_cmsg(ctl[i].buf, ctl_len, SOL_IP, IP_TOS, (uint32_t)reply_tos);
            else
                ctl_len = put_cmsg(ctl[i].buf, ctl_len, SOL_IPV6, IPV6_TCLASS, (uint32_t)reply_tos);
        }
        m->msg_controllen = ctl_len;
        if (!ctl_len)
            m->msg_control = NULL;
    }
    int sent = sendmmsg(us->fd, msgs, n, MSG_DONTWAIT);
    if (sent < 0) {
        int err = errno;
        if (err == EINVAL && t->explicit_id && with_stamp[0]) {
            /* a kernel without SCM_TS_OPT_ID despite its version: count like the kernel does */
            t->explicit_id = 0;
            return udp_send(tp, pkts, n);
        }
        return -err;
    }
    for (int i = 0; i < sent; i++)
        if (with_stamp[i])
            us->next_id++;
    return sent;
}

/* The stamp of a received datagram or an error-queue entry; *tos gets the datagram's TOS / traffic
 * class byte, or -1 when there is none. */
static void read_stamp(struct msghdr *m, int hw, int64_t *ts_ns, uint8_t *src, int *tos)
{
    *ts_ns = 0;
    *src = SKH_TS_NONE;
    if (tos)
        *tos = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (tos && c->cmsg_level == SOL_IP && c->cmsg_type == IP_TOS) {
            *tos = *(const uint8_t *)CMSG_DATA(c);
            continue;
        }
        if (tos && c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_TCLASS) {
            int v;
            memcpy(&v, CMSG_DATA(c), sizeof(v));
            *tos = v & 0xff;
            continue;
        }
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPING)
            continue;
        struct scm_timestamping ts;
        memcpy(&ts, CMSG_DATA(c), sizeof(ts));
        if (hw && (ts.ts[2].tv_sec || ts.ts[2].tv_nsec)) {
            *ts_ns = (int64_t)ts.ts[2].tv_sec * 1000000000LL + ts.ts[2].tv_nsec;
            *src = SKH_TS_HW;
        } else if (ts.ts[0].tv_sec || ts.ts[0].tv_nsec) {
            *ts_ns = (int64_t)ts.ts[0].tv_sec * 1000000000LL + ts.ts[0].tv_nsec;
            *src = SKH_TS_KERNEL;
        }
    }
}

static int icmp_errno_ok(const struct sock_extended_err *ee)
{
    return ee->ee_origin == SO_EE_ORIGIN_ICMP || ee->ee_origin == SO_EE_ORIGIN_ICMP6 ||
           ee->ee_origin == SO_EE_ORIGIN_LOCAL;
}

/* Reads socket idx's error queue into the stamp ring and the error list until empty or full. */
static void errq_pump(struct udp_transport *t, unsigned idx)
{
    struct mmsghdr msgs[UDP_BATCH];
    struct iovec iov[UDP_BATCH];
    struct sockaddr_storage names[UDP_BATCH];
    union {
        char buf[CMSG_RX_SPACE];
        struct cmsghdr align;
    } ctl[UDP_BATCH];
    uint8_t data[UDP_BATCH][SKH_ACK_LEN];

    for (;;) {
        unsigned room_st = ERRQ_CAP - (t->st_tail - t->st_head);
        unsigned room_err = UDP_BATCH - t->n_errs;
        unsigned n = room_st < room_err ? room_st : room_err;
        if (n == 0)
            return;
        if (n > UDP_BATCH)
            n = UDP_BATCH;
        memset(msgs, 0, n * sizeof(msgs[0]));
        for (unsigned i = 0; i < n; i++) {
            iov[i].iov_base = data[i];
            iov[i].iov_len = sizeof(data[i]);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &names[i];
            msgs[i].msg_hdr.msg_namelen = sizeof(names[i]);
            msgs[i].msg_hdr.msg_control = ctl[i].buf;
            msgs[i].msg_hdr.msg_controllen = sizeof(ctl[i].buf);
        }
        int got = recvmmsg(t->socks[idx].fd, msgs, n, MSG_ERRQUEUE | MSG_DONTWAIT, NULL);
        if (got <= 0)
            return;
        for (int i = 0; i < got; i++) {
            struct msghdr *m = &msgs[i].msg_hdr;
            const struct sock_extended_err *ee = NULL;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
                if ((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
                    (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR))
                    ee = (const struct sock_extended_err *)CMSG_DATA(c);
            if (!ee)
                continue;
            if (ee->ee_origin == SO_EE_ORIGIN_TIMESTAMPING) {
                struct skh_txstamp *s = &t->stamps[t->st_tail & (ERRQ_CAP - 1)];
                read_stamp(m, t->hw, &s->ts_ns, &s->ts_source, NULL);
                if (s->ts_source == SKH_TS_NONE)
                    continue;
                s->err = 0;
                s->tx_id = (idx << ID_BITS) | (ee->ee_data & ID_MASK);
                t->st_tail++;
            } else if (icmp_errno_ok(ee) && ee->ee_errno) {
                struct skh_rxpkt *e = &t->errs[t->n_errs];
                memcpy(t->errbuf[t->n_errs], data[i], sizeof(data[i]));
                e->buf = t->errbuf[t->n_errs];
                e->len = msgs[i].msg_len < sizeof(data[i]) ? msgs[i].msg_len : sizeof(data[i]);
                e->truncated = 0;
                e->ts_source = SKH_TS_NONE;
                e->ts_ns = 0;
                e->err = -(int32_t)ee->ee_errno;
                addr_from_sockaddr(&names[i], &e->src);
                e->src._pad[0] = (uint8_t)idx;
                t->n_errs++;
            }
        }
        if ((unsigned)got < n)
            return;
    }
}

/* Learns which sockets have work: reads the error queues that have entries, notes the sockets with
 * datagrams in rx_ready. With one socket, asking costs more than just reading it. */
static void check_ready(struct udp_transport *t)
{
    unsigned nsock = atomic_load(&t->nsock);
    if (nsock == 1) {
        errq_pump(t, 0);
        t->rx_ready = 1;
    } else {
        struct epoll_event ev[UDP_MAX_PATHS];
        int n = epoll_wait(t->epfd, ev, UDP_MAX_PATHS, 0);
        t->rx_ready = 0;
        for (int i = 0; i < n; i++) {
            unsigned idx = ev[i].data.u32;
            if (ev[i].events & EPOLLERR)
                errq_pump(t, idx);
            if (ev[i].events & EPOLLIN)
                t->rx_ready |= 1ull << idx;
        }
    }
    t->checked = 1;
}

static int udp_stamps(struct skh_transport *tp, struct skh_txstamp *out, unsigned n)
{
    struct udp_transport *t = (struct udp_transport *)tp;
    unsigned k = 0;

    if (t->st_head == t->st_tail)
        check_ready(t);
    while (k < n && t->st_head != t->st_tail)
        out[k++] = t->stamps[t->st_head++ & (ERRQ_CAP - 1)];
    return (int)k;
}

/* recvmmsg on one socket into pkts[0..n); returns the count (0 when empty or on a soft error). */
static int recv_sock(struct udp_transport *t, unsigned idx, struct skh_rxpkt *pkts, unsigned n)
{
    struct mmsghdr msgs[UDP_BATCH];
    struct iovec iov[UDP_BATCH];
    struct sockaddr_storage names[UDP_BATCH];
    union {
        char buf[CMSG_RX_SPACE];
        struct cmsghdr align;
    } ctl[UDP_BATCH];

    if (n > UDP_BATCH)
        n = UDP_BATCH;
    memset(msgs, 0, n * sizeof(msgs[0]));
    for (unsigned i = 0; i < n; i++) {
        iov[i].iov_base = pkts[i].buf;
        iov[i].iov_len = pkts[i].cap;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &names[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(names[i]);
        msgs[i].msg_hdr.msg_control = ctl[i].buf;
        msgs[i].msg_hdr.msg_controllen = sizeof(ctl[i].buf);
    }
    int got;
    for (int tries = 0;; tries++) {
        got = recvmmsg(t->socks[idx].fd, msgs, n, MSG_DONTWAIT, NULL);
        /* A queued ICMP error also sets the socket's pending error, which the next receive call
         * returns once; the details are already on the error queue, so just receive again. */
        if (got < 0 && tries < 4 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
            errno != ENOMEM && errno != EBADF && errno != EFAULT && errno != EINVAL)
            continue;
        break;
    }
    if (got <= 0)
        return 0;
    for (int i = 0; i < got; i++) {
        struct skh_rxpkt *p = &pkts[i];
        struct msghdr *m = &msgs[i].msg_hdr;
        p->len = msgs[i].msg_len;
        p->truncated = (m->msg_flags & MSG_TRUNC) != 0;
        p->err = 0;
        int tos;
        read_stamp(m, t->hw, &p->ts_ns, &p->ts_source, &tos);
        addr_from_sockaddr(&names[i], &p->src);
        p->src._pad[0] = (uint8_t)idx;
        if (tos >= 0) {
            p->src._pad[1] = (uint8_t)tos;
            p->src._pad[2] = 1;
        }
    }
    return got;
}

static int udp_recv(struct skh_transport *tp, struct skh_rxpkt *pkts, unsigned n)
{
    struct udp_transport *t = (struct udp_transport *)tp;
    unsigned k = 0;

    if (!t->checked)
        check_ready(t);
    t->checked = 0;
    for (unsigned i = 0; i < t->n_errs && k < n; i++, k++) {
        uint8_t *buf = pkts[k].buf;
        uint32_t cap = pkts[k].cap;
        uint32_t len = t->errs[i].len < cap ? t->errs[i].len : cap;
        pkts[k] = t->errs[i];
        pkts[k].buf = buf;
        pkts[k].cap = cap;
        memcpy(buf, t->errs[i].buf, len);
        pkts[k].len = len;
    }
    if (k) {
        memmove(&t->errs[0], &t->errs[k], (t->n_errs - k) * sizeof(t->errs[0]));
        memmove(&t->errbuf[0], &t->errbuf[k], (t->n_errs - k) * sizeof(t->errbuf[0]));
        t->n_errs -= k;
        for (unsigned i = 0; i < t->n_errs; i++)
            t->errs[i].buf = t->errbuf[i];
    }
    for (uint64_t ready = t->rx_ready; ready && k < n; ready &= ready - 1)
        k += (unsigned)recv_sock(t, (unsigned)__builtin_ctzll(ready), pkts + k, n - k);
    return (int)k;
}

static int udp_local(struct skh_transport *tp, skh_addr *out)
{
    struct udp_transport *t = (struct udp_transport *)tp;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(t->socks[0].fd, (struct sockaddr *)&ss, &sl) != 0)
        return -errno;
    addr_from_sockaddr(&ss, out);
    return 0;
}

static int udp_parse_addr(struct skh_transport *tp, const char *host, uint16_t port, const char *gid,
                          uint32_t qpn, uint16_t path_id, skh_addr *out)
{
    struct udp_transport *t = (struct udp_transport *)tp;
    int rc;
    if (!host || port == 0)
        return -EINVAL;
    rc = parse_ip(host, port, t->family, out);
    if (rc || path_id == 0)
        return rc;
    pthread_mutex_lock(&t->lock);
    unsigned nsock = atomic_load(&t->nsock), idx;
    for (idx = 1; idx < nsock && t->socks[idx].path_id != path_id; idx++)
        ;
    if (idx == nsock)
        rc = add_socket(t, 0, path_id);
    pthread_mutex_unlock(&t->lock);
    if (rc == 0)
        out->_pad[0] = (uint8_t)idx;
    return rc;
}

const struct skh_transport_ops skh_transport_udp = {
    .name = "udp",
    .available = udp_available,
    .open = udp_open,
    .close = udp_close,
    .caps = udp_caps,
    .pollfd = udp_pollfd,
    .arm = NULL,
    .send = udp_send,
    .recv = udp_recv,
    .stamps = udp_stamps,
    .local = udp_local,
    .parse_addr = udp_parse_addr,
};
