/* The OpenMP team of the calling thread held on distinct CPUs for one call (see
 * tilework.codegen.c.team). Linux only: elsewhere every function reports that it did nothing. */
#define _GNU_SOURCE
#include <stdint.h>
#if defined(__linux__)
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define TW_TEAM_MAX 64

extern int omp_get_max_threads(void);
extern int omp_get_num_threads(void);
extern int omp_get_thread_num(void);

#if defined(__linux__)
/* the calling thread's team (libgomp keeps a pool of workers a thread that starts parallel
   regions, for as long as that thread lives): its workers' thread ids, recorded once */
static __thread int tw_tids[TW_TEAM_MAX];
static __thread int tw_size;
static __thread int tw_pinned;
static __thread cpu_set_t tw_masks[TW_TEAM_MAX]; /* each thread's mask before the pin */

static int tw_gettid(void) { return (int)syscall(SYS_gettid); }

/* thread id tid is a thread of this process (a recorded worker that exited is not pinned) */
static int tw_ours(int tid) { return syscall(SYS_tgkill, getpid(), tid, 0) == 0; }

/* Record the workers of the calling thread's team: one parallel region (which wakes them). */
int tw_team_record(void) {
    int n = omp_get_max_threads();
    if (n < 2 || n > TW_TEAM_MAX) return 0;
    int ids[TW_TEAM_MAX] = {0}, got = 0;
#pragma omp parallel num_threads(n)
    {
        ids[omp_get_thread_num()] = tw_gettid();
        if (omp_get_thread_num() == 0) got = omp_get_num_threads();
    }
    if (got != n) return 0;
    for (int i = 0; i < n; ++i) tw_tids[i] = ids[i];
    tw_size = n;
    return n;
}

/* Hold the calling thread on the CPU it runs on and each worker of its team on another CPU of
   its mask (the next ones after the caller's), until tw_team_release. 1 if held; 0 if not
   (fewer CPUs than threads, no recorded team of the current size: then it records one, for the
   next call). */
int tw_team_hold(void) {
    if (tw_pinned) return 0;
    int n = omp_get_max_threads();
    if (n < 2 || n > TW_TEAM_MAX) return 0;
    if (tw_size != n) {
        tw_team_record();
        return 0;
    }
    cpu_set_t mine, one;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0 || CPU_COUNT(&mine) < n) return 0;
    int here = sched_getcpu();
    if (here < 0 || here >= CPU_SETSIZE || !CPU_ISSET(here, &mine)) return 0;
    /* the CPUs after the caller's first, wrapping around: on the usual numbering the caller's
       neighbours (its socket's other cores before an SMT sibling, numbered half the CPUs on) */
    int others[TW_TEAM_MAX], k = 0;
    for (int i = 1; i < CPU_SETSIZE && k < n - 1; ++i) {
        int c = (here + i) % CPU_SETSIZE;
        if (CPU_ISSET(c, &mine)) others[k++] = c;
    }
    if (k < n - 1) return 0;
    for (int i = 1; i < n; ++i)
        if (!tw_ours(tw_tids[i])) {
            tw_size = 0; /* a worker is gone: record the team again next time */
            return 0;
        }
    tw_masks[0] = mine;
    CPU_ZERO(&one);
    CPU_SET(here, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return 0;
    for (int i = 1; i < n; ++i) {
        if (sched_getaffinity(tw_tids[i], sizeof tw_masks[i], &tw_masks[i]) != 0) tw_masks[i] = mine;
        CPU_ZERO(&one);
        CPU_SET(others[i - 1], &one);
        sched_setaffinity(tw_tids[i], sizeof one, &one);
    }
    tw_pinned = n;
    return 1;
}

/* Give each thread held by tw_team_hold its mask back. */
void tw_team_release(void) {
    int n = tw_pinned;
    if (!n) return;
    tw_pinned = 0;
    for (int i = n - 1; i >= 1; --i) sched_setaffinity(tw_tids[i], sizeof tw_masks[i], &tw_masks[i]);
    sched_setaffinity(0, sizeof tw_masks[0], &tw_masks[0]);
}
#else
int tw_team_record(void) { return 0; }
int tw_team_hold(void) { return 0; }
void tw_team_release(void) {}
#endif
