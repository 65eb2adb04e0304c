/* Device, port and GID choice of the verbs transport (verbs_int.h). */
#include "verbs_int.h"

#ifdef SKH_HAVE_VERBS_H

#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int skh_verbs_parse_bind(const char *bind, struct skh_verbs_want *w)
{
    memset(w, 0, sizeof(*w));
    w->bind_text = bind && *bind ? bind : "0.0.0.0";
    if (strcmp(w->bind_text, "0.0.0.0") == 0) {
        w->gid.family = 4;
        return 0;
    }
    if (strcmp(w->bind_text, "::") == 0) {
        w->gid.family = 6;
        return 0;
    }
    if (skh_gid_parse(w->bind_text, w->gid.addr) < 0) {
        skh_verbs_set_err("bind address '%s' is neither an IPv4 nor an IPv6 literal", w->bind_text);
        return -EINVAL;
    }
    w->gid.has_addr = 1;
    w->gid.family = skh_gid_is_v4mapped(w->gid.addr) ? 4 : 6;
    w->gid.link_local = w->gid.family == 6 && skh_gid_is_link_local(w->gid.addr);
    return 0;
}

static uint32_t mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128u << m : 256u;
}

/* Picks port and GID on an open device. Returns 0 with info filled, or -errno with the reason. */
static int choose_port_gid(struct ibv_context *ctx, const struct skh_verbs_want *w, int gid_index,
                           struct skh_verbs_info *info)
{
    struct verbs_context *vqp = verbs_get_ctx_op(ctx, query_port);
    struct verbs_context *vqd = verbs_get_ctx_op(ctx, query_device_ex);
    struct ibv_device_attr_ex dattr;
    memset(&dattr, 0, sizeof(dattr));
    if (!vqp) {
        skh_verbs_set_err("%s: provider lacks query_port (rdma-core too old)", info->device);
        return -EOPNOTSUPP;
    }
    if (!vqd || vqd->query_device_ex(ctx, NULL, &dattr, sizeof(dattr)) != 0) {
        memset(&dattr, 0, sizeof(dattr));
        if (skh_ibv.query_device(ctx, &dattr.orig_attr) != 0) {
            skh_verbs_set_err("%s: ibv_query_device failed: %s", info->device, strerror(errno));
            return -EIO;
        }
    }
    info->timestamp_mask = dattr.completion_timestamp_mask;
    info->hca_core_clock_khz = dattr.hca_core_clock;

    size_t max = 0;
    struct ibv_port_attr pattr[8];
    int nports = dattr.orig_attr.phys_port_cnt < 8 ? dattr.orig_attr.phys_port_cnt : 8;
    for (int p = 1; p <= nports; p++) {
        memset(&pattr[p - 1], 0, sizeof(pattr[0]));
        if (vqp->query_port(ctx, (uint8_t)p, &pattr[p - 1], sizeof(pattr[0])) == 0)
            max += pattr[p - 1].gid_tbl_len;
    }
    if (max == 0) {
        skh_verbs_set_err("%s: no port with a GID table", info->device);
        return -ENODEV;
    }
    struct ibv_gid_entry *ent = calloc(max, sizeof(*ent));
    struct skh_gid_cand *cand = calloc(max, sizeof(*cand));
    int rc = -ENOENT;
    if (!ent || !cand) {
        rc = -ENOMEM;
        goto out;
    }
    ssize_t n = skh_ibv.query_gid_table(ctx, ent, max, 0, sizeof(*ent));
    if (n < 0) {
        skh_verbs_set_err("%s: ibv_query_gid_table failed: %s", info->device, strerror((int)-n));
        rc = (int)n;
        goto out;
    }
    int saw_active = 0;
    for (int p = 1; p <= nports && rc < 0; p++) {
        const struct ibv_port_attr *pa = &pattr[p - 1];
        if (pa->state != IBV_PORT_ACTIVE || pa->link_layer != IBV_LINK_LAYER_ETHERNET)
            continue;
        saw_active = 1;
        size_t k = 0;
        for (ssize_t i = 0; i < n; i++) {
            if (ent[i].port_num != (uint32_t)p)
                continue;
            memcpy(cand[k].gid, ent[i].gid.raw, 16);
            cand[k].index = ent[i].gid_index;
            cand[k].gid_type = ent[i].gid_type;
            cand[k].ndev_ifindex = ent[i].ndev_ifindex;
            k++;
        }
        int pick = -ENOENT;
        if (gid_index >= 0) {
            for (size_t i = 0; i < k; i++)
                if (cand[i].index == (uint32_t)gid_index)
                    pick = (int)i;
        } else {
            pick = skh_gid_select(cand, k, &w->gid);
        }
        if (pick >= 0) {
            info->port_num = (uint8_t)p;
            info->gid_index = (int)cand[pick].index;
            memcpy(info->gid, cand[pick].gid, 16);
            info->mtu = mtu_bytes(pa->active_mtu);
            rc = 0;
        }
    }
    if (rc == -ENOENT) {
        if (!saw_active)
            skh_verbs_set_err("%s: no ACTIVE RoCE (Ethernet) port", info->device);
        else if (gid_index >= 0)
            skh_verbs_set_err("%s: no GID at index %d on an active port", info->device, gid_index);
        else
            skh_verbs_set_err("%s: no RoCE v2 %s GID%s for bind address %s%s", info->device,
                    w->gid.family == 4 ? "IPv4" : "IPv6",
                    w->gid.family == 6 ? (w->gid.link_local ? " (link-local)" : " (non-link-local)")
                                       : "",
                    w->bind_text, w->gid.ifindex ? " on the requested netdev" : "");
    }
out:
    free(ent);
    free(cand);
    return rc;
}

int skh_verbs_open_device(const struct skh_transport_cfg *cfg, struct skh_verbs_want *w,
                          struct ibv_context **ctx_out, struct skh_verbs_info *info)
{
    int n = 0, rc;
    struct ibv_device **list = skh_ibv_devices(&n, &rc);
    if (!list)
        return rc;
    int named = -1;
    if (cfg->device && *cfg->device) {
        for (int i = 0; i < n; i++)
            if (strcmp(skh_ibv.get_device_name(list[i]), cfg->device) == 0)
                named = i;
        if (named < 0) {
            unsigned ifindex = if_nametoindex(cfg->device);
            if (!ifindex) {
                skh_verbs_set_err("no RDMA device or network interface named '%s'", cfg->device);
                skh_ibv.free_device_list(list);
                return -ENODEV;
            }
            w->gid.ifindex = ifindex; /* only a device with a GID on this netdev qualifies */
        }
    }
    size_t err_len;
    char *verbs_err = skh_verbs_errbuf(&err_len);
    char first_err[256] = "";
    rc = -ENODEV;
    for (int i = 0; i < n && rc < 0; i++) {
        if (named >= 0 && i != named)
            continue;
        struct ibv_context *ctx = skh_ibv.open_device(list[i]);
        memset(info, 0, sizeof(*info));
        snprintf(info->device, sizeof(info->device), "%s", skh_ibv.get_device_name(list[i]));
        if (!ctx) {
            skh_verbs_set_err("%s: ibv_open_device failed: %s", info->device, strerror(errno));
        } else if ((rc = choose_port_gid(ctx, w, cfg->gid_index, info)) == 0) {
            *ctx_out = ctx;
            break;
        } else {
            skh_ibv.close_device(ctx);
        }
        if (!first_err[0])
            snprintf(first_err, sizeof(first_err), "%s", verbs_err);
        rc = -ENODEV;
    }
    skh_ibv.free_device_list(list);
    if (rc < 0 && named < 0 && first_err[0]) {
        if (w->gid.ifindex)
            skh_verbs_set_err("no RDMA device has a matching GID on netdev '%s' (first: %s)", cfg->device,
                    first_err);
        else
            snprintf(verbs_err, err_len, "%s", first_err);
    }
    return rc;
}

#endif /* SKH_HAVE_VERBS_H */
