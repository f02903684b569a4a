/* shard.c — the sharding runtime (see shard.h): what the optimizer owns
 * and updates, the chunk hooks that gather weights before a chunk runs and
 * reduce-scatter its gradients after, the pooled buffers, the overlap of
 * the collectives with the backward, and the gradient-norm sums queued
 * beside it. */
#include "shard.h"
#include "util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t shard_len(const Sharding *sh, int c) { return sh->model->chunk_size[c] / (size_t)sh->S; }

/* The part of tensor s in this rank's shard of its chunk: sets *off (into
 * the shard arrays) and returns its length, 0 when s lies outside. */
static size_t spec_in_shard(const Sharding *sh, const ParamSpec *s, size_t *off) {
    const Model *m = sh->model;
    size_t len = shard_len(sh, s->chunk);
    size_t lo = m->chunk_offset[s->chunk] + (size_t)sh->dist->shard_index * len, hi = lo + len;
    size_t a = s->offset > lo ? s->offset : lo, b = s->offset + s->numel < hi ? s->offset + s->numel : hi;
    if (a >= b) return 0;
    *off = sh->shard_off[s->chunk] + (a - lo);
    return b - a;
}

/* The optimizer's ranges, built once: every tensor's part of what this rank
 * updates (its shard when sharded, padding skipped; else the whole tensor)
 * with the tensor's weight decay, so each step is one adamw_multi call (one
 * launch on CUDA). norm: the tensor counts in log.param_norm on this rank
 * (under TP a replicated tensor counts on TP rank 0 only, as sumsq_chunk_queue). */
void shard_opt_ranges_build(Sharding *sh) {
    const Config *c = sh->cfg;
    const Model *m = sh->model;
    sh->opt_ranges = malloc_check((size_t)(m->n_specs > 0 ? m->n_specs : 1) * sizeof(AdamWRange));
    sh->opt_elem0 = malloc_check((size_t)(m->n_specs > 0 ? m->n_specs : 1) * sizeof(uint64_t));
    sh->n_opt_ranges = 0;
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        size_t o = s->offset, n = s->numel, first = 0;
        if (sh->sharded) {
            n = spec_in_shard(sh, s, &o);
            size_t lo = m->chunk_offset[s->chunk] + (size_t)sh->dist->shard_index * shard_len(sh, s->chunk);
            first = lo > s->offset ? lo - s->offset : 0;
        }
        if (n == 0) continue;
        sh->opt_elem0[sh->n_opt_ranges] = ((uint64_t)i << 40) + first;
        sh->opt_ranges[sh->n_opt_ranges++] =
            (AdamWRange){o, n, (c->decay_all || s->decay) ? c->weight_decay : 0.0f, s->tp_axis >= 0 || sh->dist->tp_rank == 0};
    }
}

/* Round the master weights into the working copy after `steps_done` steps
 * (also after a skipped step and at a resume, so the stochastic draws, keyed
 * by (init.seed, steps_done, tensor, element), are the same for a resumed
 * run and for any data-parallel layout). */
void shard_refresh_working(Sharding *sh, int steps_done) {
    const Config *c = sh->cfg;
    if (c->param_dtype != 1) return;
    sh->weights_kept = 0; /* the working weights are written here */
    uint64_t seed = 0;
    if (c->stochastic_rounding) seed = splitmix64(c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)steps_done) | 1; /* never 0 (nearest) */
    for (int i = 0; i < sh->n_opt_ranges; i++) {
        const AdamWRange *r = &sh->opt_ranges[i];
        if (sh->sharded) sh->k->pack_bf16(sh->wshard + r->offset, sh->master + r->offset, r->n, seed, sh->opt_elem0[i]);
        else sh->k->round_bf16(sh->model->params + r->offset, sh->master + r->offset, r->n, seed, sh->opt_elem0[i]);
    }
}

/* sumsq (not NULL): this rank's part of the updated master weights' sum of
 * squares (the ranges with norm set); sets sh->weights_kept */
void shard_adamw_step(Sharding *sh, float lr, float grad_scale, int step, double *sumsq) {
    const Config *c = sh->cfg;
    Model *m = sh->model;
    if (sh->sharded)
        sh->weights_kept = sh->k->adamw_multi(sh->master, sh->gshard, sh->mshard, sh->vshard, sh->opt_ranges, sh->n_opt_ranges, lr,
                                            c->beta1, c->beta2, c->eps, step + 1, grad_scale, sumsq);
    else /* master: its own fp32 copy under bf16 working weights */
        sh->weights_kept = sh->k->adamw_multi(sh->master ? sh->master : m->params, m->grads, m->m, m->v, sh->opt_ranges,
                                            sh->n_opt_ranges, lr, c->beta1, c->beta2, c->eps, step + 1, grad_scale, sumsq);
}

/* Where n bf16 words land in a buffer of n floats to be widened in place
 * (Kernels.unpack_bf16): its upper half. */
static uint16_t *upper_half(float *p, size_t n) { return (uint16_t *)(void *)p + n; }

/* Outside a step (debug.dump): all-gather every chunk
 * into a temporary full-size array that the model reads with the chunk
 * hooks idle; free_full_params gives it back. */
void shard_gather_params(Sharding *sh) {
    Model *m = sh->model;
    if (!sh->full) sh->full = sh->k->alloc(m->n_params * sizeof(float));
    sh->full_peak = fmax(sh->full_peak, (double)m->n_params * sizeof(float));
    for (int c = 0; c < m->n_chunks; c++) {
        size_t o = sh->shard_off[c], n = m->chunk_size[c];
        float *p = sh->full + m->chunk_offset[c];
        if (sh->wshard) { /* bf16 working weights: bf16 words into the chunk's upper half, widened in place */
            dist_allgather(sh->dist, DIST_GROUP_SHARD, DIST_BF16, sh->wshard + o, upper_half(p, n), shard_len(sh, c));
            sh->k->unpack_bf16(p, upper_half(p, n), n);
        } else {
            dist_allgather(sh->dist, DIST_GROUP_SHARD, DIST_F32, sh->master + o, p, shard_len(sh, c));
        }
        m->chunk_params[c] = p;
    }
    m->params = sh->full;
}

void shard_free_full_params(Sharding *sh) {
    Model *m = sh->model;
    if (!sh->full) return;
    sh->k->free(sh->full);
    sh->full = m->params = NULL;
    for (int c = 0; c < m->n_chunks; c++) m->chunk_params[c] = NULL;
}

/* Pool slot class of chunk c: [*lo, *hi) of the slot arrays (0 embeddings,
 * 1 final chunk, 2.. layers). */
static void slot_range(const Sharding *sh, int c, int n_slots, int *lo, int *hi) {
    int last = sh->model->n_chunks - 1;
    *lo = c == 0 ? 0 : c == last ? 1 : 2;
    *hi = c == 0 ? 1 : c == last ? 2 : n_slots;
}

/* Floats of pool slot i: the size of the chunk class it serves. */
static size_t slot_floats(const Sharding *sh, int i) {
    const Model *m = sh->model;
    return m->chunk_size[i == 0 ? 0 : i == 1 ? m->n_chunks - 1 : 1];
}

/* Pool slots: weights for the embeddings, the final chunk and 2 layers (all
 * layers without resharding, which keeps every chunk from its forward to its
 * backward), gradients for the embeddings, the final chunk and 2 layers. */
void shard_pool_slots(const Sharding *sh, int *n_pslots, int *n_gslots) {
    int L = sh->model->cfg.n_layer;
    *n_pslots = 2 + (sh->reshard && L > 2 ? 2 : L);
    *n_gslots = 2 + (L > 2 ? 2 : L);
}

/* Bytes of the pooled working weights (grads = 0) or gradient buffers. */
double shard_pool_bytes(const Sharding *sh, int grads) {
    int np, ng;
    shard_pool_slots(sh, &np, &ng);
    double b = 0;
    for (int i = 0; i < (grads ? ng : np); i++) b += (double)slot_floats(sh, i) * sizeof(float);
    return b;
}

/* Bytes of the working weights the model reads: sharded, the pooled chunk
 * buffers (+ wshard under bf16 params: bf16 words, half of `shard`, the
 * fp32 shard's bytes); else the full params. */
double shard_params_bytes(const Sharding *sh, double shard) {
    if (!sh->sharded) return (double)sh->model->n_params * sizeof(float);
    return shard_pool_bytes(sh, 0) + (sh->cfg->param_dtype == 1 ? shard / 2 : 0);
}

static int slot_take(const Sharding *sh, int *owner, int n_slots, int c) {
    int lo, hi;
    slot_range(sh, c, n_slots, &lo, &hi);
    for (int i = lo; i < hi; i++)
        if (owner[i] < 0) { owner[i] = c; return i; }
    return -1;
}

/* Start gathering chunk c's weights into a pooled buffer (nothing when it
 * is gathered or on its way, or c is out of range). */
static void chunk_fetch(Sharding *sh, int c) {
    Model *m = sh->model;
    if (c < 0 || c >= m->n_chunks || sh->pslot[c] >= 0) return;
    int i = slot_take(sh, sh->powner, sh->n_pslots, c);
    if (i < 0) die(EXIT_INTERNAL, "sharded step: no free working-weight buffer for chunk %d", c);
    sh->pslot[c] = i;
    m->chunk_params[c] = sh->pbuf[i];
    size_t o = sh->shard_off[c];
    if (sh->wshard) { /* bf16 words into the slot's upper half, widened in place at chunk_ready */
        sh->ag_req[c] = dist_iallgather(sh->dist, DIST_GROUP_SHARD, DIST_BF16, sh->wshard + o, upper_half(sh->pbuf[i], m->chunk_size[c]), shard_len(sh, c));
        sh->ag_unpack[c] = 1;
    } else {
        sh->ag_req[c] = dist_iallgather(sh->dist, DIST_GROUP_SHARD, DIST_F32, sh->master + o, sh->pbuf[i], shard_len(sh, c));
    }
}

static void chunk_ready(Sharding *sh, int c) {
    chunk_fetch(sh, c);
    dist_wait(sh->dist, sh->ag_req[c]);
    sh->ag_req[c] = -1;
    if (sh->ag_unpack[c]) {
        float *p = sh->pbuf[sh->pslot[c]];
        size_t n = sh->model->chunk_size[c];
        sh->k->unpack_bf16(p, upper_half(p, n), n);
        sh->ag_unpack[c] = 0;
    }
}

static void chunk_release(Sharding *sh, int c) {
    if (sh->pslot[c] < 0) return;
    dist_wait(sh->dist, sh->ag_req[c]);
    sh->ag_req[c] = -1;
    sh->ag_unpack[c] = 0;
    sh->powner[sh->pslot[c]] = -1;
    sh->pslot[c] = -1;
    sh->model->chunk_params[c] = NULL;
}

/* The step's last micro-batch is under way (or done): chunk gradients
 * final after their backward are the step's. */
static int last_micro(const Sharding *sh) { return sh->micro + 1 == sh->step_accum; }

static void gnorm_queue(Sharding *sh, int c);

/* Start the data-parallel reduction of chunk c's final gradients: NO_SHARD
 * all-reduces the chunk over the data-parallel group (x: the chunk's
 * gradients), the sharded strategies its shard over the replicate group
 * (x: the shard; none under FULL_SHARD's one replica). Poisons them first
 * for LLMTRAIN_FAULT kind=nan at chunk 0, whose backward is the last: the
 * NaN reaches every replica through the all-reduce. */
static void ar_start(Sharding *sh, int c, float *x, size_t n) {
    if (c == 0 && sh->poison) { float nan = NAN; sh->k->from_host(x, &nan, sizeof nan); }
    if (sh->ar_req[c] >= 0) die(EXIT_INTERNAL, "step: chunk %d's gradient all-reduce started twice", c);
    sh->chunks_done++;
    sh->ar_req[c] = sh->sharded ? dist_iallreduce(sh->dist, DIST_GROUP_REPLICATE, x, n) : dist_iallreduce(sh->dist, DIST_GROUP_DP, x, n);
    if (sh->ar_req[c] < 0) gnorm_queue(sh, c); /* no replicas to all-reduce over: final now */
}

/* Wait for chunk c's gradient reduce-scatter (if any), fold a staged one
 * into the shard and give its gradient buffer back; in the last
 * micro-batch the shard is then final here: start its all-reduce over the
 * replicas (HYBRID_SHARD), which train_step waits for. */
static void rs_finish(Sharding *sh, int c) {
    if (!sh->rs_state[c]) return;
    dist_wait(sh->dist, sh->rs_req[c]);
    sh->rs_req[c] = -1;
    size_t o = sh->shard_off[c];
    if (sh->rs_state[c] == 2) sh->k->add(sh->gshard + o, sh->gshard + o, sh->gbuf[sh->gslot[c]], shard_len(sh, c));
    sh->rs_state[c] = 0;
    sh->gowner[sh->gslot[c]] = -1;
    sh->gslot[c] = -1;
    if (last_micro(sh)) ar_start(sh, c, sh->gshard + o, shard_len(sh, c));
}

void shard_rs_finish_all(Sharding *sh) {
    for (int c = sh->model->n_chunks - 1; c >= 0; c--) rs_finish(sh, c);
}

/* A gradient buffer for chunk c that starts at zero (grads_fresh: the
 * backward's first product into each tensor stores; rs_start settles it);
 * when its class is all taken by
 * reduce-scatters in flight, wait for them (highest chunk first: the oldest
 * of a backward). */
static void grads_take(Sharding *sh, int c) {
    Model *m = sh->model;
    if (sh->gslot[c] >= 0) return;
    int i;
    while ((i = slot_take(sh, sh->gowner, sh->n_gslots, c)) < 0) {
        int lo, hi, o = -1;
        slot_range(sh, c, sh->n_gslots, &lo, &hi);
        for (int j = lo; j < hi; j++)
            if (sh->gowner[j] >= 0 && sh->rs_state[sh->gowner[j]] && sh->gowner[j] > o) o = sh->gowner[j];
        if (o < 0) die(EXIT_INTERNAL, "sharded step: no free gradient buffer for chunk %d", c);
        rs_finish(sh, o);
    }
    sh->gslot[c] = i;
    m->chunk_grads[c] = sh->gbuf[i];
    sh->k->grads_fresh(sh->gbuf[i], m->chunk_size[c]);
}

/* Chunk c's backward is done: reduce-scatter its gradient (sum over the
 * shard group) into the local shard: the first micro-batch straight into
 * gshard, later ones in place (the result lands at the start of the
 * gradient buffer) and added to gshard at the wait. */
static void rs_start(Sharding *sh, int c) {
    float *g = sh->gbuf[sh->gslot[c]];
    sh->k->grads_settle(g, sh->model->chunk_size[c]);
    sh->rs_state[c] = sh->micro > 0 ? 2 : 1;
    sh->rs_req[c] = dist_ireduce_scatter(sh->dist, DIST_GROUP_SHARD, g, sh->micro > 0 ? g : sh->gshard + sh->shard_off[c], shard_len(sh, c));
    sh->model->chunk_grads[c] = NULL;
}

/* Let the collectives in flight progress (MPI moves non-blocking
 * collectives only inside MPI calls). */
static void comm_progress(Sharding *sh) {
    for (int c = 0; c < sh->model->n_chunks; c++) {
        if (sh->ag_req[c] >= 0) dist_test(sh->dist, sh->ag_req[c]);
        if (sh->rs_req[c] >= 0) dist_test(sh->dist, sh->rs_req[c]);
        if (sh->ar_req[c] >= 0) dist_test(sh->dist, sh->ar_req[c]);
    }
}

/* The model's chunk hook under sharding (FSDP): gather a chunk before its
 * forward and backward, prefetching the next one in order (forward c+1,
 * backward c-1); free it after its forward when resharding (the final
 * chunk, and tied chunk 0 inside it, stay for the backward that follows at
 * once) and after its backward always; reduce-scatter its gradients as soon
 * as its backward is done. Forward only (sh->fwd_only: eval, sample): free
 * every chunk after its forward, whatever reshard_after_forward says (tied
 * chunk 0 is gathered again for the LM head, prefetched with the final
 * chunk, and freed after it), so at most the embeddings, the final chunk and
 * 2 layers are gathered and none after the forward. Idle otherwise. */
static void chunk_hook(void *ctx, int c, int ev) {
    Sharding *sh = ctx;
    if (!sh->in_step && !sh->fwd_only) return;
    int last = sh->model->n_chunks - 1, tied = sh->model->cfg.tie_embeddings;
    switch (ev) {
    case CHUNK_PRE_FORWARD:
        chunk_ready(sh, c);
        if (c == last) sh->head_fwd = 1;
        if (!sh->head_fwd) {
            chunk_fetch(sh, c + 1);
            if (c + 1 == last && tied) chunk_fetch(sh, 0);
        }
        break;
    case CHUNK_POST_FORWARD:
        if (sh->fwd_only) {
            chunk_release(sh, c);
            if (c == last) sh->head_fwd = 0;
        } else if (sh->reshard && !sh->head_fwd) {
            chunk_release(sh, c);
        }
        break;
    case CHUNK_PRE_BACKWARD:
        sh->head_fwd = 0;
        chunk_ready(sh, c);
        /* a chunk's reduce-scatter has the backward of the chunk below it
         * to run behind and is waited for here, at the start of the next
         * one's (where the layers' two gradient buffers would need it
         * anyway): at one point of the backward on every rank, so that every
         * rank starts the replicate all-reduces that follow in one order (MPI
         * requires one order of collectives on a communicator; NCCL runs
         * every group's on one stream, where two ranks with different orders
         * wait for each other forever) */
        for (int o = last; o > c + 1; o--) rs_finish(sh, o);
        grads_take(sh, c);
        if (c > 0) chunk_fetch(sh, c - 1);
        break;
    case CHUNK_POST_BACKWARD:
        chunk_release(sh, c);
        rs_start(sh, c);
        break;
    default: die(EXIT_INTERNAL, "chunk hook: unknown event %d", ev);
    }
    comm_progress(sh);
}

/* Sums of squares over a model-sized array (gradients, weights), each
 * parameter once: a is this rank's shard of it when sharded (replicas hold
 * the same), else all of it; under TP split tensors count on every TP rank,
 * replicated ones on tp_rank 0 only. sumsq_chunk_queue queues chunk c's part
 * (Kernels.sumsq_queue: beside the compute on CUDA) into slot c, or under TP
 * each counted tensor's part into its own slot; sumsq_slots_take adds the
 * slots in order (the same bits every run) and sums over the ranks. */
static void sumsq_chunk_queue(Sharding *sh, const float *a, int c) {
    const Model *m = sh->model;
    if (sh->dist->tp == 1) {
        if (sh->sharded) sh->k->sumsq_queue(a + sh->shard_off[c], shard_len(sh, c), sh->gsq_dev + c);
        else sh->k->sumsq_queue(a + m->chunk_offset[c], m->chunk_size[c], sh->gsq_dev + c);
        return;
    }
    for (int i = m->chunk_spec0[c]; i < m->chunk_spec0[c + 1]; i++) {
        const ParamSpec *s = &m->specs[i];
        if (s->tp_axis < 0 && sh->dist->tp_rank != 0) continue;
        size_t o, n = sh->sharded ? spec_in_shard(sh, s, &o) : (o = s->offset, s->numel);
        if (n) sh->k->sumsq_queue(a + o, n, sh->gsq_dev + i);
    }
}

/* this rank's part of a model-wide sum of squares, summed over the shard
 * group when sharded and over the TP group */
double shard_model_sumsq_ranks(Sharding *sh, double sq) {
    if (sh->sharded) dist_allreduce(sh->dist, DIST_GROUP_SHARD, DIST_F64, DIST_SUM, &sq, 1);
    dist_allreduce(sh->dist, DIST_GROUP_TP, DIST_F64, DIST_SUM, &sq, 1);
    return sq;
}

double shard_sumsq_slots_take(Sharding *sh) {
    sh->k->sumsq_take(sh->gsq_host, sh->gsq_dev, sh->n_gsq);
    double sq = 0.0;
    for (int i = 0; i < sh->n_gsq; i++) sq += sh->gsq_host[i];
    return shard_model_sumsq_ranks(sh, sq);
}

/* Chunk c's gradients are final (the last micro-batch's backward done, its
 * reduce-scatter waited for when sharded, its all-reduce over the
 * data-parallel replicas waited for when there is one: ar_start,
 * ar_wait_all): queue their sums of squares for the gradient norm, so that
 * on CUDA they overlap the backward of the chunks below instead of a pass
 * over every gradient after it; the step takes them (sumsq_slots_take). */
static void gnorm_queue(Sharding *sh, int c) { sumsq_chunk_queue(sh, sh->sharded ? sh->gshard : sh->model->grads, c); }

/* The sum of squares of a model-sized array, all at once (the parameter
 * norm of a step AdamW did not sum). */
double shard_model_sumsq(Sharding *sh, const float *a) {
    for (int c = 0; c < sh->model->n_chunks; c++) sumsq_chunk_queue(sh, a, c);
    return shard_sumsq_slots_take(sh);
}

/* After the last micro-batch's backward: every chunk's all-reduce has
 * started (ar_start: unsharded, grads_done_hook; sharded, rs_finish); wait
 * for them, in phase allreduce. A chunk whose all-reduce this waited for
 * has its gradient norm queued then. */
void shard_ar_wait_all(Sharding *sh, int step) {
    dist_phase(sh->dist, step + 1, "allreduce");
    if (sh->chunks_done != sh->model->n_chunks)
        die(EXIT_INTERNAL, "step: %d of %d chunks finished their backward", sh->chunks_done, sh->model->n_chunks);
    for (int c = sh->model->n_chunks - 1; c >= 0; c--) {
        int started = sh->ar_req[c] >= 0;
        dist_wait(sh->dist, sh->ar_req[c]);
        sh->ar_req[c] = -1;
        if (started) gnorm_queue(sh, c);
    }
}

/* Unsharded (NO_SHARD, or a single rank), after chunk c's backward of the
 * step's last micro-batch: its gradients are final here. Settle them (what
 * no kernel wrote is zero) and start their all-reduce over the
 * data-parallel group, so that it overlaps the backward of the chunks below
 * (PyTorch DDP's gradient buckets, one a chunk; chunk 0, the embeddings,
 * comes last and cannot). */
static void grads_done_hook(void *ctx, int c) {
    Sharding *sh = ctx;
    Model *m = sh->model;
    if (!sh->in_step || !last_micro(sh)) return;
    float *g = m->grads + m->chunk_offset[c];
    sh->k->grads_settle(g, m->chunk_size[c]);
    ar_start(sh, c, g, m->chunk_size[c]);
    for (int i = 0; i < m->n_chunks; i++) /* progress for MPI's (it moves them inside MPI calls) */
        if (sh->ar_req[i] >= 0 && i != c) dist_test(sh->dist, sh->ar_req[i]);
}

/* Sharded: copy this rank's shard of the initial weights into the master
 * shards, free the model's full params and grads and set up the chunk
 * pools: params for the embeddings, the final chunk and 2 layers (all
 * layers without resharding, which keeps every chunk from its forward to its
 * backward), grads for the embeddings, the final chunk and 2 layers. */
void shard_setup(Sharding *sh) {
    Model *m = sh->model;
    const Kernels *k = sh->k;
    sh->shard_off = calloc_check((size_t)m->n_chunks, sizeof(size_t));
    sh->n_shard = 0;
    for (int c = 0; c < m->n_chunks; c++) { sh->shard_off[c] = sh->n_shard; sh->n_shard += shard_len(sh, c); }
    sh->ar_req = malloc_check((size_t)m->n_chunks * sizeof(int));
    for (int c = 0; c < m->n_chunks; c++) sh->ar_req[c] = -1;
    sh->n_gsq = sh->dist->tp > 1 ? m->n_specs : m->n_chunks;
    sh->gsq_dev = k->alloc((size_t)sh->n_gsq * sizeof(double));
    sh->gsq_host = calloc_check((size_t)sh->n_gsq, sizeof(double));
    if (!sh->sharded) {
        m->comm.hook_ctx = sh;
        m->comm.grads_done = grads_done_hook;
        return;
    }
    size_t bytes = sh->n_shard * sizeof(float);
    sh->master = k->alloc(bytes);
    sh->gshard = k->alloc(bytes);
    sh->mshard = k->alloc(bytes);
    sh->vshard = k->alloc(bytes);
    for (int c = 0; c < m->n_chunks; c++)
        k->copy(sh->master + sh->shard_off[c], m->params + m->chunk_offset[c] + (size_t)sh->dist->shard_index * shard_len(sh, c),
                shard_len(sh, c) * sizeof(float));
    k->free(m->params);
    k->free(m->grads);
    m->params = m->grads = NULL;
    int n = m->n_chunks;
    for (int c = 0; c < n; c++) m->chunk_params[c] = m->chunk_grads[c] = NULL;
    shard_pool_slots(sh, &sh->n_pslots, &sh->n_gslots);
    sh->pbuf = calloc_check((size_t)sh->n_pslots, sizeof(float *));
    sh->gbuf = calloc_check((size_t)sh->n_gslots, sizeof(float *));
    sh->powner = malloc_check((size_t)sh->n_pslots * sizeof(int));
    sh->gowner = malloc_check((size_t)sh->n_gslots * sizeof(int));
    for (int i = 0; i < sh->n_pslots; i++) { sh->pbuf[i] = k->alloc(slot_floats(sh, i) * sizeof(float)); sh->powner[i] = -1; }
    for (int i = 0; i < sh->n_gslots; i++) { sh->gbuf[i] = k->alloc(slot_floats(sh, i) * sizeof(float)); sh->gowner[i] = -1; }
    int *st = malloc_check(6 * (size_t)n * sizeof(int));
    sh->pslot = st; sh->gslot = st + n; sh->ag_req = st + 2 * n; sh->rs_req = st + 3 * n; sh->rs_state = st + 4 * n;
    sh->ag_unpack = st + 5 * n;
    for (int i = 0; i < 4 * n; i++) st[i] = -1;
    for (int i = 4 * n; i < 6 * n; i++) st[i] = 0;
    m->comm.hook_ctx = sh;
    m->comm.chunk = chunk_hook;
}

/* train.param_dtype bf16: the fp32 master weights (sharded: the master
 * shards; else a full copy of its own) are what AdamW updates and what
 * checkpoints hold; the working weights the model reads are their rounding
 * to bf16 precision. Sharded, the rounding is kept as bf16 words (wshard),
 * so the all-gathers move 2 bytes a weight, as FSDP's param_dtype bf16 does;
 * a gathered chunk lands in the upper half of its pool slot and is widened
 * there to fp32 words (exactly, in place) when the chunk is ready. */
void shard_setup_bf16(Sharding *sh) {
    if (sh->cfg->param_dtype != 1) return;
    Model *m = sh->model;
    if (sh->sharded) {
        sh->wshard = sh->k->alloc(sh->n_shard * sizeof(uint16_t));
    } else {
        sh->master = sh->k->alloc(m->n_params * sizeof(float));
        sh->k->copy(sh->master, m->params, m->n_params * sizeof(float));
    }
}

float *shard_state_ptr(Sharding *sh, int k, int c, size_t lo) {
    Model *m = sh->model;
    if (!sh->sharded) {
        float *a[3] = {sh->master ? sh->master : m->params, m->m, m->v};
        return a[k] + lo;
    }
    float *a[3] = {sh->master, sh->mshard, sh->vshard};
    size_t base = m->chunk_offset[c] + (size_t)sh->dist->shard_index * shard_len(sh, c);
    return a[k] + sh->shard_off[c] + (lo - base);
}

void shard_install_state(Sharding *sh, const float *p, const float *mm, const float *vv) {
    Model *m = sh->model;
    const Kernels *k = sh->k;
    sh->weights_kept = 0;
    if (!sh->sharded) {
        k->from_host(sh->master ? sh->master : m->params, p, m->n_params * sizeof(float));
        k->from_host(m->m, mm, m->n_params * sizeof(float));
        k->from_host(m->v, vv, m->n_params * sizeof(float));
        return;
    }
    k->from_host(sh->master, p, sh->n_shard * sizeof(float));
    k->from_host(sh->mshard, mm, sh->n_shard * sizeof(float));
    k->from_host(sh->vshard, vv, sh->n_shard * sizeof(float)); /* steps gather the working weights from these */
}
