/* libibverbs, loaded lazily (verbs_int.h): nothing here adds a NEEDED entry or an undefined ibv_*
 * symbol to the extension (tests/verbs/test_build.py checks both), so it imports on any machine. */
#include "verbs_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static __thread char verbs_err[256];

void skh_verbs_set_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(verbs_err, sizeof(verbs_err), fmt, ap);
    va_end(ap);
}

char *skh_verbs_errbuf(size_t *len)
{
    *len = sizeof(verbs_err);
    return verbs_err;
}

const char *skh_verbs_strerror(void) { return verbs_err; }

#ifdef SKH_HAVE_VERBS_H

#include <dlfcn.h>
#include <pthread.h>

struct skh_ibv skh_ibv;

#define SYM(field, name, version) {offsetof(struct skh_ibv, field), name, version}
static const struct {
    size_t off;
    const char *name;
    const char *version;
} ibv_syms[] = {
    SYM(get_device_list, "ibv_get_device_list", "IBVERBS_1.1"),
    SYM(free_device_list, "ibv_free_device_list", "IBVERBS_1.1"),
    SYM(get_device_name, "ibv_get_device_name", "IBVERBS_1.1"),
    SYM(open_device, "ibv_open_device", "IBVERBS_1.1"),
    SYM(close_device, "ibv_close_device", "IBVERBS_1.1"),
    SYM(query_device, "ibv_query_device", "IBVERBS_1.1"),
    /* rdma-core >= v32: the oldest release this transport supports */
    SYM(query_gid_table, "_ibv_query_gid_table", "IBVERBS_1.11"),
    SYM(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1"),
    SYM(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1"),
    SYM(reg_mr, "ibv_reg_mr", "IBVERBS_1.1"),
    SYM(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1"),
    SYM(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0"),
    SYM(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0"),
    SYM(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1"),
    SYM(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1"),
    SYM(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1"),
    SYM(create_qp, "ibv_create_qp", "IBVERBS_1.1"),
    SYM(modify_qp, "ibv_modify_qp", "IBVERBS_1.1"),
    SYM(query_qp, "ibv_query_qp", "IBVERBS_1.1"),
    SYM(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1"),
    SYM(create_ah, "ibv_create_ah", "IBVERBS_1.1"),
    SYM(destroy_ah, "ibv_destroy_ah", "IBVERBS_1.1"),
};
#undef SYM

/* Overridable so a test can build a copy that finds no libibverbs at all. */
#ifndef SKH_IBVERBS_SONAME
#define SKH_IBVERBS_SONAME "libibverbs.so.1"
#endif

static pthread_once_t ibv_once = PTHREAD_ONCE_INIT;
static int ibv_load_rc;
static char ibv_load_err[200];

static void ibv_load_once(void)
{
    /* RTLD_LOCAL: our symbols stay private; libibverbs itself loads the vendor providers */
    void *h = dlopen(SKH_IBVERBS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(ibv_load_err, sizeof(ibv_load_err), "libibverbs unavailable: %s", dlerror());
        ibv_load_rc = -EOPNOTSUPP;
        return;
    }
    for (size_t i = 0; i < sizeof(ibv_syms) / sizeof(ibv_syms[0]); i++) {
        void *p = dlvsym(h, ibv_syms[i].name, ibv_syms[i].version);
        if (!p)
            p = dlsym(h, ibv_syms[i].name);
        if (!p) {
            snprintf(ibv_load_err, sizeof(ibv_load_err),
                     "libibverbs too old: no %s@%s (rdma-core >= v32 needed)", ibv_syms[i].name,
                     ibv_syms[i].version);
            ibv_load_rc = -EOPNOTSUPP;
            return;
        }
        memcpy((char *)&skh_ibv + ibv_syms[i].off, &p, sizeof(p));
    }
}

int skh_ibv_load(void)
{
    pthread_once(&ibv_once, ibv_load_once);
    if (ibv_load_rc)
        skh_verbs_set_err("%s", ibv_load_err);
    return ibv_load_rc;
}

struct ibv_device **skh_ibv_devices(int *n, int *rc)
{
    *rc = skh_ibv_load();
    if (*rc)
        return NULL;
    errno = 0;
    struct ibv_device **list = skh_ibv.get_device_list(n);
    if (!list) {
        int e = errno ? errno : ENODEV;
        /* libibverbs answers ENOSYS when /sys/class/infiniband_verbs is missing */
        if (e == ENOSYS)
            skh_verbs_set_err("no RDMA devices (kernel has no RDMA support)");
        else
            skh_verbs_set_err("no RDMA devices (ibv_get_device_list: %s)", strerror(e));
        *rc = -ENODEV;
        return NULL;
    }
    if (*n == 0) {
        skh_ibv.free_device_list(list);
        skh_verbs_set_err("no RDMA devices (the kernel supports RDMA but none is registered)");
        *rc = -ENODEV;
        return NULL;
    }
    return list;
}

#endif /* SKH_HAVE_VERBS_H */
