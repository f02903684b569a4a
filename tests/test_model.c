/* tests/test_model.c — model.c's order of work, checked through a Kernels
 * table that counts calls (the CPU backend underneath):
 *   - the LM head in chunks (train.lm_head_chunk, ModelMem.head_rows): a
 *     training forward of N rows runs ceil(N / R) LM-head products of at
 *     most R rows and, right after each, that chunk's backward products
 *     (d(lnf) and the weight gradient), and model_backward runs none: the
 *     chunked head computes nothing twice; the losses equal the unchunked
 *     run's and every gradient is within reduction order of it (the head's
 *     weight gradient is summed chunk by chunk), tied and untied, GPT-2 and
 *     Llama, R dividing N, not dividing it, and R >= N;
 *   - a forward that is not a training forward (forward_only, as evaluation
 *     runs) runs the head's forward products only;
 *   - train.lm_head_chunk 0 (model_head_rows_auto): the whole micro-batch
 *     while its logits take at most HEAD_AUTO_BYTES, else the fewest chunks
 *     that do, equal and a multiple of 64 rows;
 *   - sequence parallelism's activation buffers (test_sp_acts);
 *   - cp.c's ring schedule (test_cp_ring): every k|v block shift, and every
 *     gradient shift but the last (home), is started before a pair of
 *     attention parts and waited after it, so a device communicator moves
 *     it while they run; no part or add writes a buffer in flight or reads
 *     one being received; the shifts' bytes are docs/layouts.md's;
 *   - the load-balanced chunk order (test_cp_balance): rank r holds chunks
 *     r and 2cp-1-r, the ring's parts compute every causal pair once, each
 *     rank as many. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "cp.h"
#include "kernels.h"
#include "model.h"
#include "util.h"

static const Kernels *cpu;
static const float *head_w; /* the LM head's weight: the products that read it are the head's */
static int head_fwd, head_bwd, max_rows;

static void count_forward_a(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    if (w == head_w) {
        head_fwd++;
        if (N > max_rows) max_rows = N;
    }
    cpu->matmul_forward_a(out, inp, w, bias, N, C, OC);
}

static void count_backward_a(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                             int N, int C, int OC) {
    if (w == head_w) {
        head_bwd++;
        if (N > max_rows) max_rows = N;
    }
    cpu->matmul_backward_a(dinp, dw, dbias, dout, inp, w, N, C, OC);
}

static ModelConfig cfg_vocab(int llama, int tied, int vocab) {
    ModelConfig c = {0};
    c.arch = llama ? ARCH_LLAMA : ARCH_GPT2;
    c.n_layer = 2; c.n_embd = 32; c.n_head = 4; c.n_kv_head = llama ? 2 : 4; c.ffn_hidden = llama ? 48 : 0;
    c.vocab_size = vocab; c.max_seq_len = 32; c.norm_eps = 1e-5f; c.rope_theta = 10000; c.tie_embeddings = tied;
    c.ffn_multiple_of = 256;
    model_config_finish(&c, "test");
    return c;
}

static ModelConfig cfg(int llama, int tied) { return cfg_vocab(llama, tied, 61); }

/* Sequence parallelism's activations (ModelMem.seq_parallel), counted
 * buffer by buffer for tp 2, B x T = 2 x 32 (N = 64 rows, S = 32 a rank):
 * each layer's ln1, res2, ln2 and res3 [N, C] and its norms' statistics
 * (rstd, GPT-2 also mean) [N] keep S rows, and so do the embedding output,
 * d(residual) and the final norm's statistics; sequence parallelism adds
 * sp_gath and sp_dgath [N, C], sp_part and sp_lnf [S, C] and sp_dnorm [2C]
 * (every size a multiple of 16 floats: no rounding in the count). */
static void test_sp_acts(void) {
    for (int llama = 0; llama < 2; llama++) {
        ModelConfig c = cfg_vocab(llama, 0, 64);
        const long N = 64, S = 32, C = c.n_embd, L = c.n_layer, stats = llama ? 1 : 2;
        Model tp, sp;
        model_plan_tp(&tp, &c, 2, 32, 1, 2, 1, (ModelMem){ACT_NONE, 0, 0, 4, 0, 0, 0, 0, 0});
        model_plan_tp(&sp, &c, 2, 32, 1, 2, 1, (ModelMem){ACT_NONE, 0, 0, 4, 1, 0, 0, 0, 0});
        long saved = L * (N - S) * (4 * C + 2 * stats) + 2 * (N - S) * C + (N - S) * stats;
        long added = 2 * N * C + 2 * S * C + 2 * C;
        long got = (long)tp.acts_floats - (long)sp.acts_floats;
        check(sp.tp.sp == 1 && sp.tp.S == S && tp.tp.sp == 0 && got == saved - added,
              "%s, tp 2, sequence parallel: %ld fewer activation floats a rank (want %ld saved - %ld added = %ld)",
              llama ? "llama" : "gpt2", got, saved, added, saved - added);
        model_free(&tp);
        model_free(&sp);
    }
}

/* One training micro-batch (forward, backward) of model m with the given
 * head rows; the counts of the head's products in the forward and in the
 * backward, the mean loss and the gradients (host copy, caller frees). */
typedef struct {
    int fwd_f, fwd_b, bwd_f, bwd_b, rows;
    float loss;
    float *grads;
    size_t n;
} Pass;

static Pass train_pass(const char *name, const ModelConfig *c, const Kernels *k, int head_rows, const int *tok,
                       const int *tgt, int B, int T) {
    Model m;
    model_build_tp(&m, c, k, B, T, 1, 1, 1, 0, (ModelMem){ACT_NONE, head_rows, 0, 0, 0, 0, 0, 0, 0});
    model_init_random(&m, 0.02f, 11);
    head_w = m.p.lm_head;
    Pass p = {0};
    head_fwd = head_bwd = max_rows = 0;
    m.loss_scale = 1.0f / (float)(B * T);
    p.loss = model_forward(&m, tok, tgt);
    p.fwd_f = head_fwd; p.fwd_b = head_bwd;
    head_fwd = head_bwd = 0;
    model_backward(&m, 1.0f / (float)(B * T));
    p.bwd_f = head_fwd; p.bwd_b = head_bwd;
    p.rows = max_rows;
    p.n = m.n_params;
    p.grads = malloc_check(p.n * sizeof(float));
    memcpy(p.grads, m.grads, p.n * sizeof(float));
    /* a forward no backward follows (evaluation): the head's forward only */
    m.forward_only = 1;
    head_fwd = head_bwd = 0;
    float ev = model_forward(&m, tok, tgt);
    int R = head_rows > 0 && head_rows < B * T ? head_rows : B * T, chunks = (B * T + R - 1) / R;
    check(head_fwd == chunks && head_bwd == 0 && fabsf(ev - p.loss) <= 1e-6f * fabsf(p.loss),
          "%s, head_rows %d: an evaluation forward runs %d head product(s), no backward one (%d, %d), the loss "
          "%.7f (training forward %.7f)", name, head_rows, chunks, head_fwd, head_bwd, (double)ev, (double)p.loss);
    head_w = NULL;
    model_free(&m);
    return p;
}

/* cp.c's ring through a fake ModelComm (one rank of the ring: a shift's
 * receive is a copy of what was sent, made at its wait) and part kernels
 * that log themselves: the log holds S (shift started), W (waited), P (a
 * part kernel), A (an add) in order; zero and add are checked for hazards
 * too. */
#define RING_MAX 16
typedef struct { int h, parts; const char *send; char *recv; size_t bytes; } RingShift;
static struct {
    int n; /* shifts in flight */
    RingShift f[RING_MAX];
    int next_h, parts, overlapped, waited, hazards;
    double bytes;
    char log[512];
} ring;
static void ring_log(char c) {
    size_t n = strlen(ring.log);
    if (n + 1 < sizeof ring.log) { ring.log[n] = c; ring.log[n + 1] = 0; }
}
static int ring_meets(const void *p, size_t bytes, const void *q, size_t qbytes) {
    const char *a = p, *b = q;
    return a < b + qbytes && b < a + bytes;
}
/* A kernel writes w[wb] and reads r[rb]: neither a buffer in flight written
 * nor one being received read. */
static void ring_touch(const void *w, size_t wb, const void *r, size_t rb) {
    for (int i = 0; i < ring.n; i++) {
        ring.hazards += ring_meets(w, wb, ring.f[i].send, ring.f[i].bytes) || ring_meets(w, wb, ring.f[i].recv, ring.f[i].bytes);
        ring.hazards += r && ring_meets(r, rb, ring.f[i].recv, ring.f[i].bytes);
    }
}
static void ring_part(void) {
    for (int i = 0; i < ring.n; i++) ring.f[i].parts++;
    ring_log('P');
}
static int ring_shift(void *ctx, const void *send, void *recv, size_t bytes) {
    (void)ctx;
    if (ring.n == RING_MAX) die(EXIT_INTERNAL, "test_cp_ring: %d shifts in flight", RING_MAX);
    ring_touch(recv, bytes, NULL, 0);
    ring.f[ring.n++] = (RingShift){ring.next_h, 0, send, recv, bytes};
    ring.bytes += (double)bytes;
    ring_log('S');
    return ring.next_h++;
}
static void ring_wait(void *ctx, int h) {
    (void)ctx;
    for (int i = 0; i < ring.n; i++)
        if (ring.f[i].h == h) {
            memcpy(ring.f[i].recv, ring.f[i].send, ring.f[i].bytes);
            ring.overlapped += ring.f[i].parts > 0;
            ring.waited++;
            ring.f[i] = ring.f[--ring.n];
            ring_log('W');
            return;
        }
    die(EXIT_INTERNAL, "test_cp_ring: wait for handle %d, not in flight", h);
}
static const Model *ring_m;
static size_t kv_bytes(int es) { return (size_t)ring_m->B * ring_m->T * 2 * ring_m->nkv * ring_m->hd * es; }
static void ring_part_fwd(float *out, float *lse, const float *qkv, int qrow, int q0, int nq, const float *kv, int krow, int k0,
                          int nk, const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd, int merge) {
    ring_touch(out, (size_t)B * Tq * nh * hd * 4, kv, kv_bytes(4));
    ring_part();
    cpu->attention_part_forward(out, lse, qkv, qrow, q0, nq, kv, krow, k0, nk, qstart, B, Tq, Tk, nh, nkv, hd, merge);
}
static void ring_part_bwd(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *out, const float *lse,
                          int qrow, int q0, int nq, const float *kv, int krow, int k0, int nk, const int *qstart, int B, int Tq,
                          int Tk, int nh, int nkv, int hd) {
    ring_touch(dkv, kv_bytes(4), kv, kv_bytes(4));
    ring_touch(dqkv, (size_t)B * Tq * ring_m->qkv_dim * 4, NULL, 0);
    ring_part();
    cpu->attention_part_backward(dqkv, dkv, dout, qkv, out, lse, qrow, q0, nq, kv, krow, k0, nk, qstart, B, Tq, Tk, nh, nkv, hd);
}
static void ring_zero(void *p, size_t bytes) {
    ring_touch(p, bytes, NULL, 0);
    cpu->zero(p, bytes);
}
static void ring_add(float *out, const float *a, const float *b, size_t n) {
    ring_touch(out, n * 4, a, n * 4);
    ring_touch(NULL, 0, b, n * 4);
    ring_log('A');
    cpu->add(out, a, b, n);
}

static void test_cp_ring(void) {
    Kernels k = *cpu;
    k.attention_part_forward = ring_part_fwd;
    k.attention_part_backward = ring_part_bwd;
    k.add = ring_add;
    k.zero = ring_zero;
    for (int cp = 2; cp <= 4; cp += 2)
        for (int r = 0; r < cp; r += cp - 1) {
            Model m = {0};
            m.k = &k;
            m.B = 2; m.T = 8; m.nh = 4; m.nkv = 2; m.hd = 8; m.qkv_dim = (m.nh + 2 * m.nkv) * m.hd; m.act_bytes = 4;
            m.comm = (ModelComm){.cp_shift = ring_shift, .cp_wait = ring_wait};
            cp_setup(&m, cp, r, CP_RING);
            ring_m = &m;
            size_t N = (size_t)m.B * m.T, nq = N * m.qkv_dim, no = N * m.nh * m.hd;
            float *qkv = k.alloc(nq * 4), *dqkv = k.alloc(nq * 4), *out = k.alloc(no * 4), *dout = k.alloc(no * 4),
                  *lse = k.alloc(N * m.nh * 4);
            for (size_t i = 0; i < nq; i++) qkv[i] = (float)((i * 37 + 11) % 19) / 19.0f - 0.5f;
            for (size_t i = 0; i < no; i++) dout[i] = (float)((i * 53 + 7) % 23) / 23.0f - 0.5f;
            for (int bwd = 0; bwd < 2; bwd++) {
                memset(&ring, 0, sizeof ring);
                if (bwd) cp_attention_backward(&m, dqkv, dout, qkv, out, lse, NULL, m.B, m.T);
                else cp_attention_forward(&m, out, lse, qkv, NULL, m.B, m.T);
                /* forward: cp - 1 block shifts; backward: as many, and cp gradients */
                int shifts = bwd ? 2 * cp - 1 : cp - 1, overlap = bwd ? 2 * cp - 2 : cp - 1;
                double want = (double)(cp - 1) * kv_bytes(4) + (bwd ? cp * (double)kv_bytes(4) : 0);
                check(ring.waited == shifts && ring.n == 0 && ring.overlapped == overlap && ring.hazards == 0 && ring.bytes == want,
                      "cp %d rank %d %s: %d shifts waited (want %d), %d of them across part kernels (want %d), %d buffer "
                      "hazards, %.0f bytes (want %.0f): %s", cp, r, bwd ? "backward" : "forward", ring.waited, shifts,
                      ring.overlapped, overlap, ring.hazards, ring.bytes, want, ring.log);
            }
            k.free(qkv); k.free(dqkv); k.free(out); k.free(dout); k.free(lse);
            for (int i = 0; i < 2; i++) k.free(m.cp.ring[i]);
        }
}

/* The load-balanced layout against a reference written here: context
 * rank r's rows are chunk r of the sequence's 2cp chunks, then chunk
 * 2cp-1-r (cp_pos), the ranks together every position once; and the
 * attention parts cp.c runs over the ring (a fake part kernel records
 * them): each query row at its own position, every causal (query, key)
 * pair of the sequence computed exactly once over all ranks and steps,
 * and every rank computing as many pairs (the balance the layout is for;
 * contiguous chunks would give rank cp-1 about 2cp-1 times rank 0's). */
#define BAL_T 8 /* rows a rank */
static struct { int r, cp, T, pairs, badq; unsigned char *cov; } bal;
static void bal_part_fwd(float *out, float *lse, const float *qkv, int qrow, int q0, int nq, const float *kv, int krow, int k0,
                         int nk, const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd, int merge) {
    const int Tg = bal.T * bal.cp;
    for (int i = 0; i < nq; i++) {
        bal.badq += cp_pos(qrow + i, bal.T, bal.cp, bal.r) != q0 + i;
        for (int j = 0; j < nk && k0 + j <= q0 + i; j++) {
            bal.cov[(size_t)(q0 + i) * Tg + k0 + j]++;
            bal.pairs++;
        }
    }
    (void)krow;
    ring_part_fwd(out, lse, qkv, qrow, q0, nq, kv, krow, k0, nk, qstart, B, Tq, Tk, nh, nkv, hd, merge);
}

static void test_cp_balance(void) {
    const int cps[] = {1, 2, 3, 4, 8};
    for (size_t c = 0; c < sizeof cps / sizeof cps[0]; c++) {
        const int cp = cps[c], T = BAL_T, Tc = T / 2, Tg = T * cp;
        int seen[8 * BAL_T] = {0}, bad = 0;
        for (int r = 0; r < cp; r++)
            for (int i = 0; i < T; i++) {
                int chunk = i < Tc ? r : 2 * cp - 1 - r, want = chunk * Tc + (i - (i < Tc ? 0 : Tc));
                int p = cp_pos(i, T, cp, r);
                bad += p != want;
                if (p >= 0 && p < Tg) seen[p]++;
            }
        for (int p = 0; p < Tg; p++) bad += seen[p] != 1;
        check(bad == 0, "cp %d: rank r's rows are chunks r and %d-r of %d, every position once (%d mismatches)", cp,
              2 * cp - 1, 2 * cp, bad);
        if (cp == 1) continue;
        Kernels k = *cpu;
        k.attention_part_forward = bal_part_fwd;
        k.add = ring_add;
        k.zero = ring_zero;
        bal.cov = calloc((size_t)Tg * Tg, 1);
        bal.cp = cp;
        bal.T = T;
        int pairs[8], badq = 0;
        for (int r = 0; r < cp; r++) {
            Model m = {0};
            m.k = &k;
            m.B = 1; m.T = T; m.nh = 2; m.nkv = 1; m.hd = 4; m.qkv_dim = (m.nh + 2 * m.nkv) * m.hd; m.act_bytes = 4;
            m.comm = (ModelComm){.cp_shift = ring_shift, .cp_wait = ring_wait};
            cp_setup(&m, cp, r, CP_RING);
            ring_m = &m;
            size_t N = (size_t)m.B * m.T, nq = N * m.qkv_dim, no = N * m.nh * m.hd;
            float *qkv = k.alloc(nq * 4), *out = k.alloc(no * 4), *lse = k.alloc(N * m.nh * 4);
            for (size_t i = 0; i < nq; i++) qkv[i] = (float)((i * 37 + 11) % 19) / 19.0f - 0.5f;
            memset(&ring, 0, sizeof ring);
            bal.r = r;
            bal.pairs = bal.badq = 0;
            cp_attention_forward(&m, out, lse, qkv, NULL, m.B, m.T);
            pairs[r] = bal.pairs;
            badq += bal.badq;
            k.free(qkv); k.free(out); k.free(lse);
            for (int i = 0; i < 2; i++) k.free(m.cp.ring[i]);
        }
        int once = 0, other = 0, unequal = 0;
        for (int q = 0; q < Tg; q++)
            for (int kk = 0; kk < Tg; kk++) {
                int n = bal.cov[(size_t)q * Tg + kk];
                if (kk <= q) once += n == 1;
                other += kk <= q ? n != 1 : n != 0;
            }
        for (int r = 1; r < cp; r++) unequal += pairs[r] != pairs[0];
        check(badq == 0 && once == Tg * (Tg + 1) / 2 && other == 0 && unequal == 0,
              "cp %d, the ring's parts: %d query rows at another position, %d of %d causal pairs computed once (%d "
              "pairs missed, repeated or past the mask), pairs a rank %d (rank 0) to %d (rank %d): %d ranks unequal",
              cp, badq, once, Tg * (Tg + 1) / 2, other, pairs[0], pairs[cp - 1], cp - 1, unequal);
        free(bal.cov);
    }
}

/* train.lm_head_chunk 0: the whole micro-batch while its logits fit in
 * HEAD_AUTO_BYTES, else the fewest chunks that fit, equal and a multiple of
 * 64 rows (against a search over the chunk counts) */
static void test_head_rows_auto(void) {
    const struct { int N, V, b; } cases[] = {
        {16384, 50304, 2}, {16384, 50304, 4}, {4096, 128256, 2}, {16384, 128256, 2}, {65536, 128256, 2},
        {65536, 128256 / 8, 2}, {8191, 131072, 2}, {8193, 131072, 2}, {1000, 1 << 24, 4}, {64, 96, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int N = cases[i].N, V = cases[i].V, b = cases[i].b;
        const size_t row = (size_t)V * b;
        int want = N;
        if ((size_t)N * row > HEAD_AUTO_BYTES)
            for (int k = 2;; k++) { /* the fewest chunks whose rows, rounded up to 64, fit (or 64 rows) */
                int r = ((N + k - 1) / k + 63) / 64 * 64;
                if ((size_t)r * row <= HEAD_AUTO_BYTES || r == 64) { want = r; break; }
            }
        int got = model_head_rows_auto(N, V, b);
        check(got == want && (got == N || got % 64 == 0),
              "lm_head_chunk 0 for %d rows of %d x %d bytes: %d rows a chunk (expected %d; %.0f MiB of logits, "
              "the bound %zu MiB)", N, V, b, got, want, (double)got * (double)row / 1048576, HEAD_AUTO_BYTES >> 20);
    }
}

/* config_canonical_diff: the first differing line, both values, excerpts
 * of long values around their first difference, another key table */
static void test_canonical_diff(void) {
    char out[600], a[900], b[900], longa[500], longb[500];
    int rc = config_canonical_diff("x=1\ny=2\n", "x=1\ny=2\n", "here", "there", out, sizeof out);
    check(rc == 0, "equal canonical texts: no difference (%d)", rc);
    rc = config_canonical_diff("x=1\ny=2\nz=\"a\"\n", "x=1\ny=3\nz=\"b\"\n", "on rank 3", "on rank 0", out, sizeof out);
    check(rc == 1 && !strcmp(out, "y is 2 on rank 3, 3 on rank 0"), "the first differing key and both values: %s", out);
    memset(longa, 'p', 450);
    memcpy(longb, longa, 450);
    longa[450] = longb[450] = 0;
    longa[250] = 'A';
    longb[250] = 'B';
    snprintf(a, sizeof a, "data.train=\"%s\"\n", longa);
    snprintf(b, sizeof b, "data.train=\"%s\"\n", longb);
    rc = config_canonical_diff(a, b, "on rank 1", "on rank 0", out, sizeof out);
    char want[400];
    snprintf(want, sizeof want, "data.train is ...%.60sA%.99s... on rank 1, ...%.60sB%.99s... on rank 0", longa, longa, longb, longb);
    check(rc == 1 && !strcmp(out, want), "452-byte values differing at byte 252: 160-byte excerpts from 60 bytes before it, "
          "cut with ... (%zu bytes)", strlen(out));
    rc = config_canonical_diff("x=1\nnew.key=2\n", "x=1\nold.key=2\n", "on rank 1", "on rank 0", out, sizeof out);
    check(rc == 1 && !strcmp(out, "the key table differs: new.key on rank 1 where old.key on rank 0"), "another key table: %s", out);
    rc = config_canonical_diff("x=1\n", "x=1\ny=2\n", "on rank 1", "on rank 0", out, sizeof out);
    check(rc == 1 && !strcmp(out, "the key table differs: (none) on rank 1 where y on rank 0"), "a shorter key table: %s", out);
}

int main(void) {
    test_canonical_diff();
    test_head_rows_auto();
    test_sp_acts();
    cpu = kernels_cpu();
    test_cp_ring();
    test_cp_balance();
    Kernels k = *cpu;
    k.matmul_forward_a = count_forward_a;
    k.matmul_backward_a = count_backward_a;
    const int B = 2, T = 32, N = B * T;
    int tok[64], tgt[64];
    for (int i = 0; i < N; i++) { tok[i] = (i * 37 + 5) % 61; tgt[i] = (i * 53 + 17) % 61; }
    for (int arch = 0; arch < 2; arch++)
        for (int tied = 0; tied < 2; tied++) {
            ModelConfig c = cfg(arch, tied);
            const char *name = arch ? (tied ? "llama tied" : "llama") : (tied ? "gpt2 tied" : "gpt2");
            Pass ref = train_pass(name, &c, &k, 0, tok, tgt, B, T);
            check(ref.fwd_f == 1 && ref.fwd_b == 1 && ref.bwd_f == 0 && ref.bwd_b == 0 && ref.rows == N,
                  "%s, whole micro-batch: the forward runs the head's product and its backward (%d, %d of %d rows), "
                  "model_backward neither (%d, %d)", name, ref.fwd_f, ref.fwd_b, ref.rows, ref.bwd_f, ref.bwd_b);
            const int rows[] = {7, 16, 64, 100};
            for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
                int R = rows[i] < N ? rows[i] : N, chunks = (N + R - 1) / R;
                Pass p = train_pass(name, &c, &k, rows[i], tok, tgt, B, T);
                check(p.fwd_f == chunks && p.fwd_b == chunks && p.bwd_f == 0 && p.bwd_b == 0 && p.rows == R,
                      "%s, head_rows %d: the forward runs %d chunk(s) of at most %d rows, each product once with its "
                      "backward (%d, %d of at most %d rows), model_backward none (%d, %d)",
                      name, rows[i], chunks, R, p.fwd_f, p.fwd_b, p.rows, p.bwd_f, p.bwd_b);
                double worst = 0, scale = 0;
                for (size_t j = 0; j < p.n; j++) {
                    double d = fabs((double)p.grads[j] - ref.grads[j]);
                    if (d > worst) worst = d;
                    if (fabs(ref.grads[j]) > scale) scale = fabs(ref.grads[j]);
                }
                /* within 1e-6 relative, not bit for bit: BLAS may sum a product of fewer rows in
                 * another order (OpenBLAS on one thread does, for the 7 and 16 rows here) */
                check(fabs((double)p.loss - ref.loss) <= 1e-6 * fabs(ref.loss) && p.n == ref.n && worst <= 1e-5 * scale,
                      "%s, head_rows %d: the loss is the unchunked one within 1e-6 relative (%.7f, %.7f), every "
                      "gradient within %.1e (largest %.3e)", name, rows[i], (double)p.loss, (double)ref.loss, worst, scale);
                free(p.grads);
            }
            free(ref.grads);
        }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
