/* A wall clock that can jump: an LD_PRELOAD library (built by zeps_dev/wallclock.py, never committed
 * compiled) that adds an offset to what a process reads as the time of day -- clock_gettime of the
 * CLOCK_REALTIME clocks, gettimeofday, time -- and leaves every other clock alone, as an NTP step or
 * a mis-set host clock does. The offset, in seconds (a decimal number, negative: back), is read from
 * the file ZEPS_WALLCLOCK_FILE names, again every 20 ms of the process's monotonic clock; no file,
 * an empty one or one that does not parse: no offset. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static atomic_llong offset_ns;     /* the offset last read */
static atomic_llong next_read_ns;  /* monotonic time of the next read of the file */

static clock_gettime_fn real_clock_gettime(void) {
    static _Atomic(clock_gettime_fn) real;
    clock_gettime_fn fn = atomic_load(&real);
    if (fn == NULL) {
        fn = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        atomic_store(&real, fn);
    }
    return fn;
}

static long long current_offset(void) {
    struct timespec mono;
    if (real_clock_gettime()(CLOCK_MONOTONIC, &mono) != 0) return atomic_load(&offset_ns);
    long long now = (long long)mono.tv_sec * 1000000000LL + mono.tv_nsec;
    if (now < atomic_load(&next_read_ns)) return atomic_load(&offset_ns);
    atomic_store(&next_read_ns, now + 20000000LL);
    long long offset = 0;
    const char *path = getenv("ZEPS_WALLCLOCK_FILE");
    if (path != NULL) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char text[64];
            ssize_t n = read(fd, text, sizeof text - 1);
            close(fd);
            if (n > 0) {
                text[n] = '\0';
                char *end;
                double seconds = strtod(text, &end);
                if (end != text) offset = (long long)(seconds * 1e9);
            }
        }
    }
    atomic_store(&offset_ns, offset);
    return offset;
}

static void shift(struct timespec *tp, long long by) {
    long long ns = (long long)tp->tv_sec * 1000000000LL + tp->tv_nsec + by;
    tp->tv_sec = (time_t)(ns / 1000000000LL);
    tp->tv_nsec = (long)(ns % 1000000000LL);
    if (tp->tv_nsec < 0) {
        tp->tv_nsec += 1000000000L;
        tp->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clk, struct timespec *tp) {
    int rc = real_clock_gettime()(clk, tp);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(tp, current_offset());
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {  /* glibc declares tv nonnull */
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
