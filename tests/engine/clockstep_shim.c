/* LD_PRELOAD shim for tests/engine/test_clock_step.py: CLOCK_REALTIME as the process sees it
 * jumps by +SKH_STEP_NS and back every SKH_STEP_PERIOD_NS of the monotonic clock, as a clock
 * stepped by NTP or PTP would (this process only; the system clock is untouched). */
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

int clock_gettime(clockid_t clk, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    static long long period, step;
    if (!real) {
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
        const char *p = getenv("SKH_STEP_PERIOD_NS"), *s = getenv("SKH_STEP_NS");
        period = p ? atoll(p) : 0;
        step = s ? atoll(s) : 0;
    }
    int rc = real(clk, ts);
    if (rc == 0 && clk == CLOCK_REALTIME && period > 0) {
        struct timespec m;
        real(CLOCK_MONOTONIC, &m);
        long long mono = (long long)m.tv_sec * 1000000000LL + m.tv_nsec;
        if ((mono / period) % 2) {
            long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + step;
            ts->tv_sec = ns / 1000000000LL;
            ts->tv_nsec = ns % 1000000000LL;
        }
    }
    return rc;
}
