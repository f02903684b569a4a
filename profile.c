/* profile.c — the timing kernel table of log.profile_steps (profile.h), and
 * the window of steps it times with its report (collective: every rank's
 * timed ms gathered).
 *
 * Each timed call takes two of the backend's timer slots, one before and one
 * after; when the slots run out, or timing goes off, they are read back
 * (timer_read) and each pair's difference is added to its entry. */
#include "profile.h"
#include "util.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* the entries that do work on the backend: the op list's KERNEL_OP and
 * KERNEL_OP_RET entries (kernels_ops.h), in the kernel table's order; each
 * include of the list below reads them as ENTRY(name) */
#define KERNEL_OP(ret, name, params, args) ENTRY(name)
#define KERNEL_OP_RET(ret, name, params, args) ENTRY(name)
#define KERNEL_CTL(ret, name, params, args)

/* the matrix products a layer's linears call, each with a twin entry that
 * takes the calls made between fp8_scope on and off under compute dtype
 * fp8 (rated at the FP8 peak) */
#define FP8_ENTRIES(X)                                                                                                 \
    X(matmul_forward) X(matmul_backward) X(matmul_forward_res) X(matmul_forward_a) X(matmul_backward_a)              \
    X(matmul_backward_dinp_a) X(matmul_gelu_forward) X(matmul_gelu_backward) X(matmul_swiglu_backward)

#define ENTRY(n) E_##n,
#define X8(n) E_##n##_fp8,
enum {
#include "kernels_ops.h"
    FP8_ENTRIES(X8) E_COUNT
};
#undef ENTRY
#undef X8
#define ENTRY(n) #n,
#define X8(n) #n "_fp8",
static const char *const entry_name[E_COUNT] = {
#include "kernels_ops.h"
    FP8_ENTRIES(X8)};
#undef ENTRY
#undef X8
#define X8(n) [E_##n] = E_##n##_fp8,
static const int fp8_twin[E_COUNT] = {FP8_ENTRIES(X8)}; /* 0: none */
#undef X8
static int is_fp8(int e) { return e >= E_matmul_forward_fp8; } /* the twins come last */

static struct {
    const Kernels *in;
    Kernels table;
    int on;
    int fp8;                         /* between fp8_scope on and off: the products go to their _fp8 twins */
    double fp8_x;                    /* the FP8 peak as a multiple of the products' peak (profile_set_fp8_peak) */
    int n;                           /* slots marked since the last read */
    int pair[KERNEL_TIMER_SLOTS / 2]; /* the entry of each pair of slots */
    double mark[KERNEL_TIMER_SLOTS];
    long calls[E_COUNT];
    double ms[E_COUNT], flops[E_COUNT], bytes[E_COUNT];
} P;

static void harvest(void) {
    if (P.n == 0) return;
    P.in->timer_read(P.n, P.mark);
    for (int i = 0; i < P.n / 2; i++) P.ms[P.pair[i]] += P.mark[2 * i + 1] - P.mark[2 * i];
    P.n = 0;
}

static int begin(void) {
    if (!P.on) return 0;
    if (P.n + 2 > KERNEL_TIMER_SLOTS) harvest();
    P.in->timer_mark(P.n);
    return 1;
}

static void end(int timed, int e, double flops, double bytes) {
    if (!timed) return;
    if (P.fp8 && fp8_twin[e]) e = fp8_twin[e];
    P.in->timer_mark(P.n + 1);
    P.pair[P.n / 2] = e;
    P.n += 2;
    P.calls[e]++;
    P.flops[e] += flops;
    P.bytes[e] += bytes;
}

/* the call, timed as entry e, counting cost's FLOPs and bytes (its COST_e:
 * "flops, bytes", in the op's parameters and, for a KERNEL_OP_RET, its
 * result) */
#define TIMED(e, cost, call)                                                                                           \
    do {                                                                                                               \
        int timed_ = begin();                                                                                          \
        call;                                                                                                          \
        end(timed_, E_##e, cost);                                                                                      \
    } while (0)

/* 2 FLOPs a multiply-add of an [N, C] x [C, OC] product, times how many */
static double mm(int N, int C, int OC, int products) { return 2.0 * N * C * OC * products; }
/* one causal product over [B, nh] heads: QK^T or PV on T(T+1)/2 pairs */
static double att(int B, int T, int nh, int hd) { return (double)B * nh * hd * T * (T + 1.0); }
/* The least traffic of the memory-bound entries: each operand read once and
 * each result written once (an add-into result read and written), fp32
 * unless [a] (A bytes an element, the table's act_bytes); 0 for the products
 * and attention (rated by their FLOPs) and for host copies. */
#define A ((double)P.table.act_bytes)
static double by(size_t n, double bytes_each) { return (double)n * bytes_each; }
static double adamw_bytes(const AdamWRange *r, int n, double each) { /* p, g, m, v read; p, m, v written */
    double b = 0;
    for (int i = 0; i < n; i++) b += by(r[i].n, each);
    return b;
}

/* Each timed op's cost, "FLOPs, least bytes", in the op list's parameter
 * names (kernels_ops.h). */
#define COST_zero 0, bytes
#define COST_copy 0, 2.0 * bytes
#define COST_to_host 0, 0
#define COST_from_host 0, 0
#define COST_embed_forward 0, by(N, pos ? 8 : 4) + by((size_t)N * C, wpe ? 12 : 8)
#define COST_embed_backward 0, 0
#define COST_embed_forward_vp COST_embed_forward
#define COST_embed_backward_vp 0, 0
#define COST_layernorm_forward 0, by((size_t)N * C, 4 + A) + by(N, 8) + by(C, 8)
/* the norms' backward: dout and inp read, dinp read and written, dinp_a written */
#define COST_layernorm_backward 0, by((size_t)N * C, 16 + (dinp_a ? A : 0)) + by(N, 8) + by(C, 20)
#define COST_rmsnorm_forward 0, by((size_t)N * C, 4 + A) + by(N, 4) + by(C, 4)
#define COST_rmsnorm_backward 0, by((size_t)N * C, 16 + (dinp_a ? A : 0)) + by(N, 4) + by(C, 12)
#define COST_add_layernorm_forward 0, by((size_t)N * C, 12 + A) + by(N, 8) + by(C, 8)
#define COST_add_rmsnorm_forward 0, by((size_t)N * C, 12 + A) + by(N, 4) + by(C, 4)
#define COST_matmul_forward mm(N, C, OC, 1), 0
#define COST_matmul_backward mm(N, C, OC, (dinp != NULL) + (dw != NULL)), 0
#define COST_matmul_forward_res mm(N, C, OC, 1), 0
#define COST_matmul_forward_a mm(N, C, OC, 1), 0
#define COST_matmul_backward_a COST_matmul_backward
#define COST_matmul_backward_dinp_a COST_matmul_backward
/* attention's FLOPs are the causal mask's under a block-causal one too (as
 * MFU counts them): the documents' lengths live in the backend's memory */
#define COST_attention_forward 2 * att(B, T, nh, hd), 0
#define COST_attention_backward 5 * att(B, T, nh, hd), 0
#define COST_rope_forward 0, by((size_t)B * T * (nh + nkv) * hd, 2 * A) + (pos ? by((size_t)B * T, 4) : 0)
#define COST_rope_backward COST_rope_forward
#define COST_headnorm_forward 0, by((size_t)N * (nh + 2 * nkv) * hd, 2 * A) + by((size_t)N * (nh + nkv), 4) + by(hd, 8)
#define COST_headnorm_backward 0, by((size_t)N * (nh + nkv) * hd, 3 * A) + by((size_t)N * (nh + nkv), 4) + by(hd, 16)
#define COST_gelu_forward 0, by(n, 2 * A)
#define COST_gelu_backward 0, by(n, 12)
#define COST_matmul_gelu_forward mm(N, C, OC, 1), 0
#define COST_swiglu_forward 0, by((size_t)N * F, 3 * A)
#define COST_swiglu_backward 0, by((size_t)N * F, 2 * A + 20)
#define COST_matmul_gelu_backward mm(N, C, OC, (dpre != NULL) + (dw != NULL)), 0
#define COST_matmul_swiglu_backward COST_matmul_gelu_backward
#define COST_add 0, by(n, 12)
#define COST_crossentropy_forward 0, by((size_t)N * V, 2 * A) + by(N, 8)
#define COST_crossentropy_backward 0, by((size_t)N * V, 2 * A) + by(N, 4)
#define COST_crossentropy_fused 0, by((size_t)N * V, 2 * A) + by(N, 8)
#define COST_crossentropy_vp_max 0, by((size_t)N * V, A) + by(N, 4)
#define COST_crossentropy_vp_expsum 0, by((size_t)N * V, 2 * A) + by(N, 16)
#define COST_crossentropy_vp_finish 0, by((size_t)N * V, 2 * A) + by(N, 20)
#define COST_crossentropy_vp_backward 0, by((size_t)N * V, 2 * A) + by(N, 4)
#define COST_sumsq 0, by(n, 4)
/* no least traffic: on CUDA the sums run beside the compute stream, whose
 * time shows only the queuing (the CPU's is the pass itself), and the take's
 * is how long the compute stream then waits for them */
#define COST_sumsq_queue 0, 0
#define COST_sumsq_take 0, 0
#define COST_sum 0, by(n, 4)
#define COST_scale 0, by(n, 8)
#define COST_adamw 0, by(n, 28)
/* result: the bf16 copies written beside the weights, 2 bytes more each */
#define COST_adamw_multi 0, adamw_bytes(ranges, n_ranges, result ? 30 : 28)
#define COST_round_bf16 0, by(n, 8)
#define COST_pack_bf16 0, by(n, 6)
#define COST_unpack_bf16 0, by(n, 6)
/* no least traffic: CUDA writes nothing at grads_fresh and zeroes at
 * grads_settle only what no kernel stored (the CPU zeroes at grads_fresh) */
#define COST_grads_fresh 0, 0
#define COST_grads_settle 0, 0
#define COST_offload_copy 0, 0
/* the compute stream waiting for an offload copy: its time is the stall */
#define COST_offload_wait 0, 0
/* context parallelism's segment pairs: QK^T (or PV) causal on the diagonal
 * (q0 == k0), else over every query-key pair; forward 2 products, backward 5 */
static double att_part(int B, int nh, int hd, int q0, int nq, int k0, int nk) {
    return q0 == k0 ? att(B, nq, nh, hd) : 2.0 * B * nh * hd * nq * nk;
}
#define COST_attention_part_forward 2 * att_part(B, nh, hd, q0, nq, k0, nk), 0
#define COST_attention_part_backward 5 * att_part(B, nh, hd, q0, nq, k0, nk), 0
#define COST_copy_2d 0, 2.0 * width * rows
/* mixture of experts: probs, logits, the top-k; the permuted rows each
 * read and written once */
#define COST_moe_route 0, by((size_t)N * E, 8) + by((size_t)N * k, 8) + by(N, 4)
#define COST_moe_route_backward 0, by((size_t)N * E, 12) + by((size_t)N * k, 12) + by(N, 4)
#define COST_moe_colsum 0, by((size_t)N * E, 4)
#define COST_moe_permute 0, by((size_t)n * C, 2 * A) + by(n, 4)
#define COST_moe_combine 0, by((size_t)N * C, 8) + by((size_t)N * k, 8) + by((size_t)N * k * C, 4)
#define COST_moe_combine_backward 0, by((size_t)N * C, 4) + by((size_t)N * k * C, 8) + by((size_t)N * k, 12)
#define COST_moe_unpermute_add 0, by((size_t)N * C, 8) + by((size_t)N * k * C, 4) + by((size_t)N * k, 4)

/* the wrappers, w_NAME for each timed op */
#undef ENTRY
#undef KERNEL_OP
#undef KERNEL_OP_RET
#define TIMED_OP(name, call) TIMED(name, COST_##name, call)
#define KERNEL_OP(ret, name, params, args)                                                                             \
    static void w_##name params { TIMED_OP(name, P.in->name args); }
#define KERNEL_OP_RET(ret, name, params, args)                                                                         \
    static ret w_##name params {                                                                                       \
        ret result;                                                                                                    \
        TIMED_OP(name, result = P.in->name args);                                                                      \
        return result;                                                                                                 \
    }
#include "kernels_ops.h"
#undef KERNEL_OP
#undef KERNEL_OP_RET
#define KERNEL_OP(ret, name, params, args) ENTRY(name)
#define KERNEL_OP_RET(ret, name, params, args) ENTRY(name)
#undef A
static void w_fp8_scope(int on) {
    P.fp8 = on != 0;
    P.in->fp8_scope(on);
}

const Kernels *profile_wrap(const Kernels *inner) {
    if (P.in) die(EXIT_INTERNAL, "profile_wrap: the %s table is wrapped already", P.in->name);
    if (!inner->timer_mark || !inner->timer_read) die(EXIT_INTERNAL, "profile_wrap: the %s table has no timer", inner->name);
    P.in = inner;
    Kernels *k = &P.table;
    *k = *inner; /* name, act_bytes and the entries that do no work on the backend */
#define ENTRY(n) k->n = w_##n;
#include "kernels_ops.h"
#undef ENTRY
    if (!inner->attention_part_forward) { /* a backend without context parallelism's parts keeps saying so */
        k->attention_part_forward = NULL;
        k->attention_part_backward = NULL;
        k->copy_2d = NULL;
    }
    if (inner->fp8_scope) k->fp8_scope = w_fp8_scope;
    P.fp8_x = 1.0;
    return k;
}

void profile_set_fp8_peak(double times) { P.fp8_x = times; }

void profile_set(int on) {
    if (!P.in) die(EXIT_INTERNAL, "profile_set: no table wrapped");
    if (on && !P.on) { /* wait for what was queued before: the window starts with the stream idle */
        harvest();
        P.in->timer_mark(0);
        P.in->timer_read(1, P.mark);
    }
    if (!on) harvest();
    P.on = on != 0;
}

void profile_reset(void) {
    harvest();
    memset(P.calls, 0, sizeof P.calls);
    memset(P.ms, 0, sizeof P.ms);
    memset(P.flops, 0, sizeof P.flops);
    memset(P.bytes, 0, sizeof P.bytes);
}

static int by_time(const void *a, const void *b) {
    double x = ((const ProfileRow *)a)->ms, y = ((const ProfileRow *)b)->ms;
    return x < y ? 1 : x > y ? -1 : strcmp(((const ProfileRow *)a)->name, ((const ProfileRow *)b)->name);
}

double profile_total_ms(void) {
    harvest();
    double ms = 0;
    for (int e = 0; e < E_COUNT; e++) ms += P.ms[e];
    return ms;
}

int profile_rows(ProfileRow *rows, int max) {
    harvest();
    ProfileRow all[E_COUNT];
    int n = 0;
    for (int e = 0; e < E_COUNT; e++)
        if (P.calls[e] > 0) all[n++] = (ProfileRow){entry_name[e], P.calls[e], P.ms[e], P.flops[e], P.bytes[e], is_fp8(e)};
    qsort(all, (size_t)n, sizeof all[0], by_time);
    if (n > max) n = max;
    memcpy(rows, all, (size_t)n * sizeof all[0]);
    return n;
}

void profile_print(FILE *f, const char *prefix, const char *what, int steps, double wall_ms, double peak_gflops,
                   double peak_gbs) {
    ProfileRow r[E_COUNT];
    int n = profile_rows(r, E_COUNT);
    /* the FP8 products' rate against the FP8 peak, the others' against peak_gflops */
    const double peak_fp8 = peak_gflops * P.fp8_x;
    double ms = 0, calls = 0, fl = 0, fl_ms = 0, fl_floor = 0, by = 0, by_ms = 0;
    int fp8_rows = 0;
    for (int i = 0; i < n; i++) {
        ms += r[i].ms;
        calls += (double)r[i].calls;
        if (r[i].flops > 0) {
            fl += r[i].flops;
            fl_ms += r[i].ms;
            fl_floor += r[i].flops / ((r[i].fp8 ? peak_fp8 : peak_gflops) * 1e6);
            fp8_rows += r[i].fp8;
        } else if (r[i].bytes > 0) {
            by += r[i].bytes;
            by_ms += r[i].ms;
        }
    }
    double s = steps > 0 ? steps : 1;
    const char *clock = strcmp(P.in->name, "cuda") == 0 ? "timed on the CUDA compute stream" : "timed by the host clock";
    fprintf(f, "%s%s (%d step%s): %.2f ms a step in %.0f calls of the kernel table (%s), %.1f%% of the step's %.2f ms\n",
            prefix, what, steps, steps == 1 ? "" : "s", ms / s, calls / s, clock, wall_ms > 0 ? 100 * ms / wall_ms : 0.0,
            wall_ms / s);
    if (fl > 0)
        fprintf(f, "%smatrix products and attention: %.4g TFLOP a step in %.2f ms, %.4g TFLOP/s%s", prefix, fl / s / 1e12,
                fl_ms / s, fl / (fl_ms * 1e9), peak_gflops > 0 ? "" : "\n");
    if (fl > 0 && peak_gflops > 0 && !fp8_rows)
        fprintf(f, " (%.1f%% of the %.4g TFLOP/s peak)\n", 100 * fl / (fl_ms * 1e6) / peak_gflops, peak_gflops / 1e3);
    else if (fl > 0 && peak_gflops > 0) /* the share of the peaks: their time at the peaks over the time taken */
        fprintf(f, " (%.1f%% of the peaks: %.4g TFLOP/s, FP8 products %.4g)\n", 100 * fl_floor / fl_ms, peak_gflops / 1e3,
                peak_fp8 / 1e3);
    if (by > 0)
        fprintf(f, "%smemory-bound entries: %.4g GB a step in %.2f ms, %.4g GB/s%s", prefix, by / s / 1e9, by_ms / s,
                by / (by_ms * 1e6), peak_gbs > 0 ? "" : "\n");
    if (by > 0 && peak_gbs > 0)
        fprintf(f, " (%.1f%% of the %.4g GB/s peak)\n", 100 * by / (by_ms * 1e6) / peak_gbs, peak_gbs);
    /* The floor: the products at the compute peak, the memory-bound entries
     * at the bandwidth peak, the rest (neither counted) as timed. */
    if (fl > 0 && by > 0 && peak_gflops > 0 && peak_gbs > 0) {
        double by_floor = by / (peak_gbs * 1e6), rest = ms - fl_ms - by_ms;
        double floor = fl_floor + by_floor + rest;
        fprintf(f,
                "%sat the peaks these calls would take %.2f ms a step (the products and attention %.2f, the memory-bound "
                "entries %.2f, the rest %.2f as timed): %.1f%% of their timed %.2f ms\n",
                prefix, floor / s, fl_floor / s, by_floor / s, rest / s, ms > 0 ? 100 * floor / ms : 0.0, ms / s);
    }
    fprintf(f, "%s%9s %6s %8s %10s %9s %6s %8s  %s\n", prefix, "ms/step", "share", "calls", "us/call", "TFLOP/s", "peak",
            "GB/s", "entry");
    for (int i = 0; i < n; i++) {
        char rate[16] = "", pk[16] = "", bw[16] = "";
        if (r[i].flops > 0 && r[i].ms > 0) {
            double tf = r[i].flops / (r[i].ms * 1e9);
            snprintf(rate, sizeof rate, "%.4g", tf);
            if (peak_gflops > 0) snprintf(pk, sizeof pk, "%.1f%%", 100 * tf * 1e3 / (r[i].fp8 ? peak_fp8 : peak_gflops));
        } else if (r[i].bytes > 0 && r[i].ms > 0) {
            double gbs = r[i].bytes / (r[i].ms * 1e6);
            snprintf(bw, sizeof bw, "%.4g", gbs);
            if (peak_gbs > 0) snprintf(pk, sizeof pk, "%.1f%%", 100 * gbs / peak_gbs);
        }
        fprintf(f, "%s%9.3f %5.1f%% %8.1f %10.1f %9s %6s %8s  %s\n", prefix, r[i].ms / s,
                ms > 0 ? 100 * r[i].ms / ms : 0.0, (double)r[i].calls / s, 1000 * r[i].ms / (double)r[i].calls, rate, pk,
                bw, r[i].name);
    }
}

int profile_write_json(const char *path, int first_step, int steps, double wall_ms, double peak_gflops,
                       double peak_gbs, const double *rank_ms, int world) {
    ProfileRow r[E_COUNT];
    int n = profile_rows(r, E_COUNT);
    Buf b = {0};
    buf_add(&b, "{\"backend\":\"%s\",\"first_step\":%d,\"steps\":%d,\"wall_ms\":%.17g,\"peak_gflops\":%.17g,"
                "\"peak_fp8_gflops\":%.17g,\"peak_gbs\":%.17g,\"entries\":[",
            P.in->name, first_step, steps, wall_ms, peak_gflops, peak_gflops * P.fp8_x, peak_gbs);
    for (int i = 0; i < n; i++)
        buf_add(&b, "%s\n{\"name\":\"%s\",\"calls\":%ld,\"ms\":%.17g,\"flops\":%.17g,\"bytes\":%.17g,\"fp8\":%s}",
                i ? "," : "", r[i].name, r[i].calls, r[i].ms, r[i].flops, r[i].bytes, r[i].fp8 ? "true" : "false");
    buf_add(&b, "]");
    if (world > 1) {
        buf_add(&b, ",\n\"rank_ms\":[");
        for (int i = 0; i < world; i++) buf_add(&b, "%s%.17g", i ? "," : "", rank_ms[i]);
        buf_add(&b, "]");
    }
    buf_add(&b, "}\n");
    /* whole or not at all: a temporary file renamed over the name */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fwrite(b.s, 1, b.len, f) == b.len;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    int err = errno;
    if (!ok) remove(tmp);
    free(b.s);
    errno = err;
    return ok ? 0 : -1;
}

void profile_window_init(ProfileWindow *w, int step_base, int steps, int profile_steps) {
    *w = (ProfileWindow){.first = -1, .last = -1};
    if (profile_steps <= 0 || step_base >= steps) return;
    w->first = step_base + (steps - step_base > 1);
    /* at most the run's last step; compared before adding, as first +
     * profile_steps overflows an int after a resume when profile_steps is
     * near its maximum (every step) */
    w->last = profile_steps > steps - w->first ? steps - 1 : w->first + profile_steps - 1;
}

int profile_window_begin(ProfileWindow *w, int step) {
    if (w->first < 0 || step < w->first || step > w->last) return 0;
    profile_set(1);
    w->t0 = now_s();
    return 1;
}

void profile_window_end(ProfileWindow *w, int timed) {
    if (!timed) return;
    profile_set(0);
    w->n++;
    w->wall += now_s() - w->t0;
}

int profile_window_report(ProfileWindow *w, Dist *d, const char *json_path, double peak_gflops, double peak_gbs) {
    if (w->n == 0 || w->printed) return 0;
    w->printed = 1;
    int W = d->world, rc = 0;
    double mine = profile_total_ms() / w->n;
    double *rank_ms = malloc_check((size_t)W * sizeof(double));
    dist_gather(d, DIST_GROUP_WORLD, DIST_F64, &mine, rank_ms, 1);
    if (d->rank != 0) {
        free(rank_ms);
        return 0;
    }
    char what[96];
    int a = w->first + 1, b = w->first + w->n;
    if (a == b) snprintf(what, sizeof what, "step %d", a);
    else snprintf(what, sizeof what, "steps %d-%d", a, b);
    profile_print(stdout, "profile: ", what, w->n, 1000 * w->wall, peak_gflops, peak_gbs);
    if (W > 1) {
        int lo = 0, hi = 0;
        double sum = 0;
        for (int r = 0; r < W; r++) {
            sum += rank_ms[r];
            if (rank_ms[r] < rank_ms[lo]) lo = r;
            if (rank_ms[r] > rank_ms[hi]) hi = r;
        }
        printf("profile: timed ms a step over the %d ranks: min %.2f (rank %d), mean %.2f, max %.2f (rank %d)%s\n", W,
               rank_ms[lo], lo, sum / W, rank_ms[hi], hi,
               rank_ms[hi] > 1.1 * rank_ms[lo] ? ": the slowest rank holds the others up at every collective" : "");
    }
    int e = 0;
    if (profile_write_json(json_path, w->first + 1, w->n, 1000 * w->wall, peak_gflops, peak_gbs, rank_ms, W) != 0) {
        e = errno; /* the write's, not a later call's */
        rc = -1;
    } else {
        printf("profile: %s\n", json_path);
    }
    fflush(stdout);
    free(rank_ms);
    errno = e;
    return rc;
}
