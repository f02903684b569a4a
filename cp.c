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
 * and reduce-scatters their gradients (cp blocks held, no shifts). */
#include "cp.h"
#include "util.h"

void cp_setup(Model *m, int cp, int cp_rank, int mode) {
    m->cp = cp;
    m->cp_rank = cp_rank;
    m->cp_mode = mode;
    if (cp == 1) return;
    const Kernels *k = m->k;
    if (!k->attention_part_forward || !k->attention_part_backward || !k->copy_2d)
        die(EXIT_INTERNAL, "context parallelism: the %s backend has no attention parts", k->name);
    if (m->T % 2) die(EXIT_INTERNAL, "context parallelism: %d rows per sequence is odd", m->T);
    double block = cp_ring_bytes(m, cp, CP_RING) / 4; /* one k|v block's bytes */
    m->cp_ring[0] = k->alloc((size_t)(2 * block));
    m->cp_ring[1] = k->alloc((size_t)((mode == CP_ALL_GATHER ? cp : 1) * 2 * block));
}

double cp_ring_bytes(const Model *m, int cp, int mode) {
    if (cp == 1) return 0;
    double block = (double)m->B * m->T * 2.0 * m->nkv * m->hd * sizeof(float);
    return (mode == CP_ALL_GATHER ? cp + 1 : 2) * 2 * block; /* each buffer: blocks, then as many gradients */
}

/* One segment pair of a ring step: this rank's query chunk a (0: chunk r, 1:
 * chunk 2cp-1-r; rows [qrow, +T/2), positions from q0) against a chunk of
 * the block held (rows [krow, +T/2) of it, positions from k0). */
typedef struct CpPair { int a, qrow, q0, krow, k0; } CpPair;

/* The pairs of ring step s with something to compute (keys not all after
 * the queries): 3 at step 0 (the own block), 2 after it. */
static int cp_pairs(const Model *m, int s, int T, CpPair pair[4]) {
    int cp = m->cp, r = m->cp_rank, j = (r - s + cp) % cp, Tc = T / 2, n = 0;
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 2; c++) {
            int qc = a ? 2 * cp - 1 - r : r, kc = c ? 2 * cp - 1 - j : j;
            if (kc <= qc) pair[n++] = (CpPair){a, a * Tc, qc * Tc, c * Tc, kc * Tc};
        }
    return n;
}

/* This rank's k|v block into buf: the k and v columns of qkv's rows. */
static void own_block(Model *m, float *buf, const float *qkv, int N) {
    size_t KS = (size_t)2 * m->nkv * m->hd;
    m->k->copy_2d(buf, KS * sizeof(float), qkv + (size_t)m->nh * m->hd, (size_t)m->qkv_dim * sizeof(float), KS * sizeof(float),
                  (size_t)N);
}

/* The k|v block of ring step s: the ring buffer it arrived in, or under
 * all_gather its owner's place among the gathered blocks. */
static float *step_block(const Model *m, int s, size_t KV) {
    if (m->cp_mode == CP_RING) return m->cp_ring[s % 2];
    return m->cp_ring[1] + (size_t)((m->cp_rank - s + m->cp) % m->cp) * KV;
}

/* Every rank's k|v block into cp_ring[1] in rank order (all_gather). */
static void gather_blocks(Model *m, const float *qkv, int N, size_t KV) {
    own_block(m, m->cp_ring[0], qkv, N);
    m->comm.cp_allgather(m->comm.ctx, m->cp_ring[0], m->cp_ring[1], KV * sizeof(float));
}

void cp_attention_forward(Model *m, float *out, float *lse, const float *qkv, const int *qstart, int B, int T) {
    const Kernels *k = m->k;
    int cp = m->cp, Tc = T / 2, merge[2] = {0, 0}, ring = m->cp_mode == CP_RING;
    size_t KV = (size_t)B * T * 2 * m->nkv * m->hd;
    if (ring) own_block(m, m->cp_ring[0], qkv, B * T);
    else gather_blocks(m, qkv, B * T, KV);
    for (int s = 0; s < cp; s++) {
        float *cur = step_block(m, s, KV);
        /* blocking: the next block is in before this one's pairs run */
        if (ring && s + 1 < cp) m->comm.cp_shift(m->comm.ctx, cur, m->cp_ring[(s + 1) % 2], KV * sizeof(float));
        CpPair p[4];
        for (int i = 0, n = cp_pairs(m, s, T, p); i < n; i++) {
            k->attention_part_forward(out, lse, qkv, p[i].qrow, p[i].q0, Tc, cur, p[i].krow, p[i].k0, Tc, qstart, B, T, T, m->nh,
                                      m->nkv, m->hd, merge[p[i].a]);
            merge[p[i].a] = 1;
        }
    }
}

void cp_attention_backward(Model *m, float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                           const int *qstart, int B, int T) {
    const Kernels *k = m->k;
    int cp = m->cp, Tc = T / 2, N = B * T, ring = m->cp_mode == CP_RING;
    size_t KV = (size_t)N * 2 * m->nkv * m->hd, KS = (size_t)2 * m->nkv * m->hd;
    k->zero(dqkv, (size_t)N * m->qkv_dim * sizeof(float)); /* dQ adds up over the steps */
    /* ring: a block's gradient follows it in its buffer; all_gather: the
     * gradients of all blocks follow all blocks */
    size_t grad = ring ? KV : (size_t)cp * KV;
    if (ring) own_block(m, m->cp_ring[0], qkv, N);
    else gather_blocks(m, qkv, N, KV);
    k->zero((ring ? m->cp_ring[0] : m->cp_ring[1]) + grad, grad * sizeof(float));
    for (int s = 0; s < cp; s++) {
        float *cur = step_block(m, s, KV), *next = m->cp_ring[(s + 1) % 2];
        CpPair p[4];
        for (int i = 0, n = cp_pairs(m, s, T, p); i < n; i++)
            k->attention_part_backward(dqkv, cur + grad, dout, qkv, out, lse, p[i].qrow, p[i].q0, Tc, cur, p[i].krow, p[i].k0, Tc,
                                       qstart, B, T, T, m->nh, m->nkv, m->hd);
        if (!ring) continue;
        /* the block and its gradient on; after the last step only the gradient, home to its owner */
        if (s + 1 < cp) m->comm.cp_shift(m->comm.ctx, cur, next, 2 * KV * sizeof(float));
        else m->comm.cp_shift(m->comm.ctx, cur + KV, next + KV, KV * sizeof(float));
    }
    /* this rank's own block's gradient, every rank's share added */
    const float *home = m->cp_ring[cp % 2] + KV;
    if (!ring) {
        m->comm.cp_reduce_scatter(m->comm.ctx, m->cp_ring[1] + grad, m->cp_ring[0] + KV, KV);
        home = m->cp_ring[0] + KV;
    }
    k->copy_2d(dqkv + (size_t)m->nh * m->hd, (size_t)m->qkv_dim * sizeof(float), home, KS * sizeof(float), KS * sizeof(float),
               (size_t)N);
}
