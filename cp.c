/* cp.c — context parallelism's side of the model (cp.h): the positions a
 * rank's rows hold and ring attention over the context group.
 *
 * Each sequence of T tokens is cut into 2 cp chunks; context rank r holds
 * chunks r and 2cp-1-r, so under the causal mask every rank has the same
 * attention work (Megatron-Core's load-balanced order). A rank's k|v block
 * (both its chunks' keys and values) travels round the ring: at step s
 * rank r holds the block of rank r - s and attends its two query chunks to
 * the block's two key chunks, skipping a pair whose keys all lie after its
 * queries; attention_part_forward merges the pairs by their log-sum-exp.
 * The backward sends each block round again with its gradient, which every
 * rank adds to and which lands back at its owner after the last step.
 * parallel.context_mode all_gather gathers every block at once instead
 * and reduce-scatters their gradients (cp blocks held, no shifts).
 *
 * Overlap: the next step's block is sent (ModelComm.cp_shift) before this
 * step's pairs are computed and waited for after them (cp_wait), so a
 * device communicator moves it while the attention runs. In the
 * backward a gradient leaves once its step's pairs have added to it and is
 * waited for after the next step's pairs, which add into a part of their
 * own (cp_part) that joins the arrived gradient after them: a rank's
 * contribution is summed with the ring's so far as one term (the sum's
 * order is not a serial ring's, a rounding's difference).
 *
 * Element sizes: a block holds k and v as qkv does, act_bytes an element
 * (bf16 under CUDA's default compute dtype: the bytes the ring moves
 * halve, and the block is qkv's own values, already rounded). Its
 * gradient is fp32: it sums the contributions of every rank of the ring
 * (cp steps, or all_gather's reduce-scatter), which in bf16 would be
 * rounded at each, and the reduce-scatter is the float32 collective; it
 * is rounded to act_bytes once, where it lands in d(qkv). On the CPU both
 * are fp32 (act_bytes 4). */
#include "cp.h"
#include "util.h"

void cp_setup(Model *m, int cp, int cp_rank, int mode) {
    m->cp.size = cp;
    m->cp.rank = cp_rank;
    m->cp.mode = mode;
    if (cp == 1) return;
    const Kernels *k = m->k;
    if (!k->attention_part_forward || !k->attention_part_backward || !k->copy_2d)
        die(EXIT_INTERNAL, "context parallelism: the %s backend has no attention parts", k->name);
    if (m->T % 2) die(EXIT_INTERNAL, "context parallelism: %d rows per sequence is odd", m->T);
    double slot = cp_ring_bytes(m, cp, CP_ALL_GATHER) / (cp + 1); /* one k|v block and its gradient */
    m->cp.ring[0] = k->alloc((size_t)slot);
    m->cp.ring[1] = k->alloc((size_t)(cp_ring_bytes(m, cp, mode) - slot));
}

/* The elements of a k|v block of n rows. */
static size_t kv_elems(const Model *m, size_t n) { return n * 2 * (size_t)m->nkv * m->hd; }

double cp_ring_bytes(const Model *m, int cp, int mode) {
    if (cp == 1) return 0;
    double e = (double)kv_elems(m, (size_t)m->B * m->T), slot = e * m->act_bytes + e * sizeof(float);
    /* each buffer: blocks, then as many gradients; the ring's second one
     * also a step's part of a gradient (cp_part) */
    return mode == CP_ALL_GATHER ? (cp + 1) * slot : 2 * slot + e * sizeof(float);
}

/* One segment pair of a ring step: this rank's query chunk a (0: chunk r, 1:
 * chunk 2cp-1-r; rows [qrow, +T/2), positions from q0) against a chunk of
 * the block held (rows [krow, +T/2) of it, positions from k0). */
typedef struct CpPair { int a, qrow, q0, krow, k0; } CpPair;

/* The pairs of ring step s with something to compute (keys not all after
 * the queries): 3 at step 0 (the own block), 2 after it. */
static int cp_pairs(const Model *m, int s, int T, CpPair pair[4]) {
    int cp = m->cp.size, r = m->cp.rank, j = (r - s + cp) % cp, Tc = T / 2, n = 0;
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 2; c++) {
            int qc = a ? 2 * cp - 1 - r : r, kc = c ? 2 * cp - 1 - j : j;
            if (kc <= qc) pair[n++] = (CpPair){a, a * Tc, qc * Tc, c * Tc, kc * Tc};
        }
    return n;
}

static char *at(void *p, size_t bytes) { return (char *)p + bytes; }

/* The buffers' layout: a ring buffer is a block (KVa bytes) then its
 * gradient (KV4 bytes), cp.ring[1] then a part (KV4, cp_part); all_gather's cp.ring[0] is the own block and its
 * gradient, cp.ring[1] every block, then every gradient. */
typedef struct CpBufs { size_t E, KVa, KV4; } CpBufs;
static CpBufs cp_bufs(const Model *m, int N) {
    size_t E = kv_elems(m, (size_t)N);
    return (CpBufs){E, E * (size_t)m->act_bytes, E * sizeof(float)};
}

/* This rank's k|v block into buf: the k and v columns of qkv's rows. */
static void own_block(Model *m, void *buf, const float *qkv, int N) {
    size_t ab = (size_t)m->act_bytes, KS = (size_t)2 * m->nkv * m->hd;
    m->k->copy_2d(buf, KS * ab, at((void *)qkv, (size_t)m->nh * m->hd * ab), (size_t)m->qkv_dim * ab, KS * ab, (size_t)N);
}

/* The k|v block of ring step s and its gradient: the ring buffer it
 * arrived in, or under all_gather its owner's place among the gathered
 * blocks. */
static float *step_block(const Model *m, int s, const CpBufs *b) {
    if (m->cp.mode == CP_RING) return m->cp.ring[s % 2];
    return (float *)at(m->cp.ring[1], (size_t)((m->cp.rank - s + m->cp.size) % m->cp.size) * b->KVa);
}
static float *step_grad(const Model *m, int s, const CpBufs *b) {
    if (m->cp.mode == CP_RING) return (float *)at(m->cp.ring[s % 2], b->KVa);
    return (float *)at(m->cp.ring[1], (size_t)m->cp.size * b->KVa + (size_t)((m->cp.rank - s + m->cp.size) % m->cp.size) * b->KV4);
}
/* The ring's part of a gradient: what a step's pairs add to the block's
 * gradient while that gradient is still on its way (after cp.ring[1]'s
 * block and gradient). */
static float *cp_part(const Model *m, const CpBufs *b) { return (float *)at(m->cp.ring[1], b->KVa + b->KV4); }

/* Every rank's k|v block into cp.ring[1] in rank order (all_gather). */
static void gather_blocks(Model *m, const float *qkv, int N, const CpBufs *b) {
    own_block(m, m->cp.ring[0], qkv, N);
    m->comm.cp_allgather(m->comm.ctx, m->cp.ring[0], m->cp.ring[1], b->KVa);
}

void cp_attention_forward(Model *m, float *out, float *lse, const float *qkv, const int *qstart, int B, int T) {
    const Kernels *k = m->k;
    int cp = m->cp.size, Tc = T / 2, merge[2] = {0, 0}, ring = m->cp.mode == CP_RING;
    CpBufs b = cp_bufs(m, B * T);
    if (ring) own_block(m, m->cp.ring[0], qkv, B * T);
    else gather_blocks(m, qkv, B * T, &b);
    for (int s = 0; s < cp; s++) {
        float *cur = step_block(m, s, &b);
        /* the next block travels while this one's pairs run */
        int h = ring && s + 1 < cp ? m->comm.cp_shift(m->comm.ctx, cur, m->cp.ring[(s + 1) % 2], b.KVa) : -1;
        CpPair p[4];
        for (int i = 0, n = cp_pairs(m, s, T, p); i < n; i++) {
            k->attention_part_forward(out, lse, qkv, p[i].qrow, p[i].q0, Tc, cur, p[i].krow, p[i].k0, Tc, qstart, B, T, T, m->nh,
                                      m->nkv, m->hd, merge[p[i].a]);
            merge[p[i].a] = 1;
        }
        if (h >= 0) m->comm.cp_wait(m->comm.ctx, h);
    }
}

void cp_attention_backward(Model *m, float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                           const int *qstart, int B, int T) {
    const Kernels *k = m->k;
    int cp = m->cp.size, Tc = T / 2, N = B * T, ring = m->cp.mode == CP_RING, hg = -1;
    size_t ab = (size_t)m->act_bytes, KS = (size_t)2 * m->nkv * m->hd;
    CpBufs b = cp_bufs(m, N);
    k->zero(dqkv, (size_t)N * m->qkv_dim * ab); /* dQ adds up over the steps */
    if (ring) own_block(m, m->cp.ring[0], qkv, N);
    else gather_blocks(m, qkv, N, &b);
    k->zero(step_grad(m, ring ? 0 : m->cp.rank, &b), (ring ? 1 : (size_t)cp) * b.KV4); /* all_gather: every gradient */
    for (int s = 0; s < cp; s++) {
        float *cur = step_block(m, s, &b), *grad = step_grad(m, s, &b), *next = m->cp.ring[(s + 1) % 2];
        /* ring: the next block travels while this one's pairs run, and so
         * does the gradient of the previous step's block, arriving here as
         * this step's: the pairs add into a part of their own (the own
         * block's at step 0), summed with the arrived gradient after them */
        int h = ring && s + 1 < cp ? m->comm.cp_shift(m->comm.ctx, cur, next, b.KVa) : -1;
        float *acc = ring && s > 0 ? cp_part(m, &b) : grad;
        if (acc != grad) k->zero(acc, b.KV4);
        CpPair p[4];
        for (int i = 0, n = cp_pairs(m, s, T, p); i < n; i++)
            k->attention_part_backward(dqkv, acc, dout, qkv, out, lse, p[i].qrow, p[i].q0, Tc, cur, p[i].krow, p[i].k0, Tc,
                                       qstart, B, T, T, m->nh, m->nkv, m->hd);
        if (!ring) continue;
        if (h >= 0) m->comm.cp_wait(m->comm.ctx, h);
        if (hg >= 0) m->comm.cp_wait(m->comm.ctx, hg);
        if (acc != grad) k->add(grad, grad, acc, b.E);
        /* this block's gradient on to the next rank (after the last step,
         * home to its owner), waited after the next step's pairs */
        hg = m->comm.cp_shift(m->comm.ctx, grad, at(next, b.KVa), b.KV4);
    }
    if (hg >= 0) m->comm.cp_wait(m->comm.ctx, hg);
    /* this rank's own block's gradient, every rank's share added, in the
     * gradient half of a buffer whose block half is free */
    void *home = m->cp.ring[cp % 2];
    if (!ring) {
        m->comm.cp_reduce_scatter(m->comm.ctx, (float *)at(m->cp.ring[1], (size_t)cp * b.KVa), (float *)at(m->cp.ring[0], b.KVa),
                                  b.E);
        home = m->cp.ring[0];
    }
    const void *src = at(home, b.KVa);
    if (ab == 2) { /* rounded once to the [a] bf16 of d(qkv), in the free block half */
        k->pack_bf16((uint16_t *)home, (const float *)src, b.E, 0, 0);
        src = home;
    } else if (ab != sizeof(float)) {
        die(EXIT_INTERNAL, "context parallelism: [a] elements of %zu bytes", ab);
    }
    k->copy_2d(at(dqkv, (size_t)m->nh * m->hd * ab), (size_t)m->qkv_dim * ab, src, KS * ab, KS * ab, (size_t)N);
}
