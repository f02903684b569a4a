/* profile.h — log.profile_steps: where a training step's compute time goes,
 * per entry of the kernel table, on any backend and any GPU runtime (no
 * profiler needed); the window of steps a run times, and its report.
 *
 * profile_wrap returns a kernel table that calls the given one and, while
 * timing is on, brackets every call that does work with the backend's
 * timer_mark: an event on the CUDA compute stream, the clock on the CPU. So
 * an entry's time is what its kernels, GEMMs and copies took on the stream,
 * not the host's time to queue them. Matrix products and attention also
 * count their FLOPs (attention's causal half: QK^T and PV over the
 * T(T+1)/2 query-key pairs, forward 2 products, backward 5), so the table
 * gives their achieved rate; the memory-bound entries count the least
 * traffic they must make (each operand read once, each result written
 * once), for their achieved bandwidth. Results are the wrapped table's,
 * bit for bit. */
#ifndef LLMTRAIN_PROFILE_H
#define LLMTRAIN_PROFILE_H
#include "kernels.h"
#include "parallel.h"
#include <stdio.h>

/* One wrapper per process: wrapping twice, or a second table, is exit 70. */
const Kernels *profile_wrap(const Kernels *inner);
/* Timing on (totals kept across on/off) or off (what was marked is read
 * back and added). Both wait until the backend has run everything queued
 * (on CUDA, for the compute stream), so the host's clock around an on/off
 * pair bounds the time of every call timed inside it. */
void profile_set(int on);
/* Forget the totals. */
void profile_reset(void);

typedef struct {
    const char *name; /* the kernel-table entry */
    long calls;
    double ms;        /* on the backend's clock, summed */
    double flops;     /* matrix products and attention only, else 0 */
    double bytes;     /* the memory-bound entries' least traffic (profile.c), else 0 */
    int fp8;          /* an FP8 product's entry (its name ends _fp8): rated at the FP8 peak */
} ProfileRow;

/* The time of every call timed since the last reset, in ms. */
double profile_total_ms(void);
/* The entries called since the last reset, most time first; returns how
 * many (at most max). */
int profile_rows(ProfileRow *rows, int max);
/* The table of `steps` timed steps whose wall time was wall_ms in all:
 * prefix on every line, the products' and attention's rates against
 * peak_gflops and the memory-bound entries' against peak_gbs, each when
 * above 0, and with both the time the calls would take at those peaks. */
void profile_print(FILE *f, const char *prefix, const char *what, int steps, double wall_ms, double peak_gflops,
                   double peak_gbs);
/* Under compute dtype fp8 the layers' linears' products are timed in
 * entries of their own (matmul_forward_fp8 and so on), rated against
 * `times` x peak_gflops (CUDA: 2, FP8 tensor cores' dense rate; the CPU's
 * fake-quantized fp32 products: 1). Default 1. */
void profile_set_fp8_peak(double times);

/* The same totals as JSON ({"backend", "first_step" (1-based), "steps",
 * "wall_ms", "peak_gflops", "peak_fp8_gflops", "peak_gbs" (0: none), "entries": [{"name", "calls",
 * "ms", "flops", "bytes", "fp8"}], and with world > 1 "rank_ms": each rank's timed ms a step},
 * sums over the steps, most time first), written whole (a temporary file
 * renamed): 0, or -1 with errno set. */
int profile_write_json(const char *path, int first_step, int steps, double wall_ms, double peak_gflops,
                       double peak_gbs, const double *rank_ms, int world);

/* The window of steps a run times: from its second step (the first builds
 * plans, grows scratch and warms caches) unless it has only one, for
 * log.profile_steps steps at most up to its last. Steps [first, last]
 * (0-based; -1: none) are timed, n of them so far in wall seconds (from an
 * idle stream to the end of each step's last kernel); printed once the
 * table is out. */
typedef struct ProfileWindow {
    int first, last, n, printed;
    double wall, t0;           /* t0: when the step being timed began */
} ProfileWindow;
void profile_window_init(ProfileWindow *w, int step_base, int steps, int profile_steps);
/* Around a step: begin turns timing on inside the window and returns
 * whether it did; end turns it off and counts the step. */
int profile_window_begin(ProfileWindow *w, int step);
void profile_window_end(ProfileWindow *w, int timed);
/* Once, after the window or at a stop inside it: every rank's timed ms a
 * step gathered (a slow rank shows as the spread); rank 0 prints the table
 * and writes it to json_path. Returns 0, or -1 with errno set when the
 * file could not be written. Collective; nothing when no step was timed. */
int profile_window_report(ProfileWindow *w, Dist *d, const char *json_path, double peak_gflops, double peak_gbs);

#endif
