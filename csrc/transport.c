#include "transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

const char *const skh_tstat_names[SKH_TSTAT__COUNT] = {
#define SKH_TSTAT_NAME(name) #name,
    SKH_TSTATS(SKH_TSTAT_NAME)
#undef SKH_TSTAT_NAME
};

extern const struct skh_transport_ops skh_transport_udp;
/* Weak: the tree links (and "verbs" is simply not offered) while csrc/verbs.c is absent. */
extern const struct skh_transport_ops skh_transport_verbs __attribute__((weak));

static const struct skh_transport_ops *transport_at(unsigned i)
{
    const struct skh_transport_ops *table[] = {
        &skh_transport_udp,
        &skh_transport_verbs,
    };
    unsigned n = sizeof(table) / sizeof(table[0]);
    /* skip unresolved weak entries without renumbering the live ones */
    for (unsigned k = 0; k < n; k++) {
        if (!table[k])
            continue;
        if (i == 0)
            return table[k];
        i--;
    }
    return NULL;
}

const struct skh_transport_ops *skh_transport_at(unsigned i) { return transport_at(i); }

const struct skh_transport_ops *skh_transport_find(const char *name)
{
    const struct skh_transport_ops *ops;
    for (unsigned i = 0; (ops = transport_at(i)) != NULL; i++)
        if (strcmp(ops->name, name) == 0)
            return ops;
    return NULL;
}

int skh_addr_format(const skh_addr *addr, char *host, size_t host_len, uint32_t *port_or_qpn)
{
    switch (addr->kind) {
    case SKH_ADDR_IP4:
        if (!inet_ntop(AF_INET, &addr->u.in4.sin_addr, host, (socklen_t)host_len))
            return -errno;
        *port_or_qpn = ntohs(addr->u.in4.sin_port);
        return 0;
    case SKH_ADDR_IP6:
        if (!inet_ntop(AF_INET6, &addr->u.in6.sin6_addr, host, (socklen_t)host_len))
            return -errno;
        *port_or_qpn = ntohs(addr->u.in6.sin6_port);
        return 0;
    case SKH_ADDR_UD:
        if (!inet_ntop(AF_INET6, addr->u.ud.gid, host, (socklen_t)host_len))
            return -errno;
        *port_or_qpn = addr->u.ud.qpn;
        return 0;
    default:
        return -EAFNOSUPPORT;
    }
}

int skh_addr_kind(const skh_addr *addr) { return addr->kind; }

int skh_addr_gid_index(const skh_addr *addr)
{
    return addr->kind == SKH_ADDR_UD ? addr->u.ud.sgid_index : -1;
}
