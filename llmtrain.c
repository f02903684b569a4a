/* llmtrain.c — main: job -> topology -> model -> train loop -> exit code.
 *
 * One training step, top to bottom (train_step below):
 *   zero grads; for each micro-batch: forward, backward (accumulating)
 *   -> sum gradients over data-parallel ranks (NO_SHARD: all-reduce; sharded
 *   strategies: the chunk hooks all-gather each layer chunk before its
 *   forward/backward and reduce-scatter its gradients into the local shard
 *   after its backward; all-reduce over replicas) -> global norm -> clip
 *   -> AdamW at the scheduled LR -> log.
 * Everything numeric is in model.c/kernels; everything collective in parallel.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ckpt.h"
#include "config.h"
#include "data.h"
#include "kernels.h"
#include "model.h"
#include "parallel.h"
#include "util.h"
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define LLMTRAIN_VERSION "0.1.0"

typedef struct Trainer {
    Config cfg;
    Dist dist;
    const Kernels *k;
    Model model;
    DataSet train, val;
    int have_val;
    Vocab vocab;
    int have_vocab;
    int accum;                 /* micro-batches per rank per step */
    int threads;               /* CPU threads of this rank */
    int *tok, *tgt;            /* host batch [B*T] */
    float *host_flat;          /* host copy of a flat array (dump, checkpoints) */
    FILE *metrics;
    double peak_gflops;
    double flops_per_token;
    int nonfinite_run;         /* consecutive skipped steps */
    int nonfinite_total;
    double train_time;         /* seconds spent in steps, for the ETA */
    int timed_steps;
    uint64_t sample_rng;
    /* sharded data parallel (parallel.strategy other than NO_SHARD with a
     * shard group of S > 1 ranks): the optimizer owns, per chunk, the slice
     * [chunk_offset + shard_index*len, +len) with len = chunk_size / S. */
    int S;                     /* shard group size (1: replicated) */
    int sharded;               /* S > 1 */
    int reshard;               /* parallel.reshard_after_forward: free a chunk's weights after its forward, re-gather for backward */
    size_t *shard_off;         /* [n_chunks] offset of chunk c's shard in the arrays below */
    size_t n_shard;            /* floats in the local shard (sum over chunks) */
    float *master, *gshard, *mshard, *vshard; /* [n_shard] fp32 master weights, grads, AdamW m, v */
    /* Sharded: the model holds no full-size params or grads. A chunk's
     * working weights / gradients live in a pooled buffer while the chunk
     * hook (chunk_hook) has it gathered / accumulating; slots of class
     * 0 (embeddings), 1 (final chunk) and 2 (layers) serve only that class. */
    float **pbuf, **gbuf;      /* [n_pslots], [n_gslots] pooled working params / grads */
    int *powner, *gowner;      /* chunk holding each slot, -1: free */
    int n_pslots, n_gslots;
    int *pslot, *gslot;        /* [n_chunks] slot a chunk holds, -1: none */
    int *ag_req, *rs_req;      /* [n_chunks] non-blocking all-gather / reduce-scatter handle, -1: none */
    int *rs_state;             /* [n_chunks] 0: no reduce-scatter; 1: one in flight into gshard, 2: in place (added at the wait) */
    int in_step, micro, head_fwd; /* inside a step's forward/backward; micro-batch; inside the final chunk's forward */
    float *full;               /* outside a step: all weights gathered (eval, sample, checkpoint, dump), else NULL */
} Trainer;

static int is_root(const Trainer *t) { return t->dist.rank == 0; }

/* ------------------------------------------------------------------ */
/* schedule and optimizer                                              */

/* LR at 0-based step s: linear warmup, then cosine from lr to min_lr. */
static float lr_at(const Config *c, int s) {
    if (s < c->warmup_steps) return c->lr * (float)(s + 1) / (float)c->warmup_steps;
    int span = c->decay_steps - c->warmup_steps;
    double p = (double)(s - c->warmup_steps) / (double)(span > 1 ? span : 1);
    if (p > 1.0) p = 1.0;
    return (float)(c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * p)));
}

static size_t shard_len(const Trainer *t, int c) { return t->model.chunk_size[c] / (size_t)t->S; }

/* AdamW on the local shard only: each chunk's shard range is walked spec by
 * spec (padding has no spec and is skipped), with the spec's weight decay. */
/* The part of tensor s in this rank's shard of its chunk: sets *off (into
 * the shard arrays) and returns its length, 0 when s lies outside. */
static size_t spec_in_shard(const Trainer *t, const ParamSpec *s, size_t *off) {
    const Model *m = &t->model;
    size_t len = shard_len(t, s->chunk);
    size_t lo = m->chunk_offset[s->chunk] + (size_t)t->dist.shard_index * len, hi = lo + len;
    size_t a = s->offset > lo ? s->offset : lo, b = s->offset + s->numel < hi ? s->offset + s->numel : hi;
    if (a >= b) return 0;
    *off = t->shard_off[s->chunk] + (a - lo);
    return b - a;
}

static void adamw_step_sharded(Trainer *t, float lr, float grad_scale, int step) {
    const Config *c = &t->cfg;
    Model *m = &t->model;
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        size_t o, n = spec_in_shard(t, s, &o);
        if (n == 0) continue;
        float wd = (c->decay_all || s->decay) ? c->weight_decay : 0.0f;
        t->k->adamw(t->master + o, t->gshard + o, t->mshard + o, t->vshard + o, n, lr, c->beta1, c->beta2, c->eps, wd,
                    step + 1, grad_scale);
    }
}

/* Outside a step (eval, sample, checkpoint, dump): all-gather every chunk
 * into a temporary full-size array that the model reads with the chunk
 * hooks idle; free_full_params gives it back. */
static void gather_params(Trainer *t) {
    Model *m = &t->model;
    if (!t->full) t->full = t->k->alloc(m->n_params * sizeof(float));
    for (int c = 0; c < m->n_chunks; c++) {
        dist_shard_allgather_f32(&t->dist, t->master + t->shard_off[c], t->full + m->chunk_offset[c], shard_len(t, c));
        m->chunk_params[c] = t->full + m->chunk_offset[c];
    }
    m->params = t->full;
}

static void free_full_params(Trainer *t) {
    Model *m = &t->model;
    if (!t->full) return;
    t->k->free(t->full);
    t->full = m->params = NULL;
    for (int c = 0; c < m->n_chunks; c++) m->chunk_params[c] = NULL;
}

/* Pool slot class of chunk c: [*lo, *hi) of the slot arrays (0 embeddings,
 * 1 final chunk, 2.. layers). */
static void slot_range(const Trainer *t, int c, int n_slots, int *lo, int *hi) {
    int last = t->model.n_chunks - 1;
    *lo = c == 0 ? 0 : c == last ? 1 : 2;
    *hi = c == 0 ? 1 : c == last ? 2 : n_slots;
}

/* Floats of pool slot i: the size of the chunk class it serves. */
static size_t slot_floats(const Trainer *t, int i) {
    const Model *m = &t->model;
    return m->chunk_size[i == 0 ? 0 : i == 1 ? m->n_chunks - 1 : 1];
}

static int slot_take(const Trainer *t, int *owner, int n_slots, int c) {
    int lo, hi;
    slot_range(t, c, n_slots, &lo, &hi);
    for (int i = lo; i < hi; i++)
        if (owner[i] < 0) { owner[i] = c; return i; }
    return -1;
}

/* Start gathering chunk c's weights into a pooled buffer (nothing when it
 * is gathered or on its way, or c is out of range). */
static void chunk_fetch(Trainer *t, int c) {
    Model *m = &t->model;
    if (c < 0 || c >= m->n_chunks || t->pslot[c] >= 0) return;
    int i = slot_take(t, t->powner, t->n_pslots, c);
    if (i < 0) die(EXIT_INTERNAL, "sharded step: no free working-weight buffer for chunk %d", c);
    t->pslot[c] = i;
    m->chunk_params[c] = t->pbuf[i];
    t->ag_req[c] = dist_shard_iallgather_f32(&t->dist, t->master + t->shard_off[c], t->pbuf[i], shard_len(t, c));
}

static void chunk_ready(Trainer *t, int c) {
    chunk_fetch(t, c);
    dist_wait(&t->dist, t->ag_req[c]);
    t->ag_req[c] = -1;
}

static void chunk_release(Trainer *t, int c) {
    if (t->pslot[c] < 0) return;
    dist_wait(&t->dist, t->ag_req[c]);
    t->ag_req[c] = -1;
    t->powner[t->pslot[c]] = -1;
    t->pslot[c] = -1;
    t->model.chunk_params[c] = NULL;
}

/* Wait for chunk c's gradient reduce-scatter (if any), fold a staged one
 * into the shard and give its gradient buffer back. */
static void rs_finish(Trainer *t, int c) {
    if (!t->rs_state[c]) return;
    dist_wait(&t->dist, t->rs_req[c]);
    t->rs_req[c] = -1;
    if (t->rs_state[c] == 2) {
        size_t o = t->shard_off[c];
        t->k->add(t->gshard + o, t->gshard + o, t->gbuf[t->gslot[c]], shard_len(t, c));
    }
    t->rs_state[c] = 0;
    t->gowner[t->gslot[c]] = -1;
    t->gslot[c] = -1;
}

static void rs_finish_all(Trainer *t) {
    for (int c = t->model.n_chunks - 1; c >= 0; c--) rs_finish(t, c);
}

/* A zeroed gradient buffer for chunk c; when its class is all taken by
 * reduce-scatters in flight, wait for them (highest chunk first: the oldest
 * of a backward). */
static void grads_take(Trainer *t, int c) {
    Model *m = &t->model;
    if (t->gslot[c] >= 0) return;
    int i;
    while ((i = slot_take(t, t->gowner, t->n_gslots, c)) < 0) {
        int lo, hi, o = -1;
        slot_range(t, c, t->n_gslots, &lo, &hi);
        for (int j = lo; j < hi; j++)
            if (t->gowner[j] >= 0 && t->rs_state[t->gowner[j]] && t->gowner[j] > o) o = t->gowner[j];
        if (o < 0) die(EXIT_INTERNAL, "sharded step: no free gradient buffer for chunk %d", c);
        rs_finish(t, o);
    }
    t->gslot[c] = i;
    m->chunk_grads[c] = t->gbuf[i];
    t->k->zero(t->gbuf[i], m->chunk_size[c] * sizeof(float));
}

/* Chunk c's backward is done: reduce-scatter its gradient (sum over the
 * shard group) into the local shard: the first micro-batch straight into
 * gshard, later ones in place (the result lands at the start of the
 * gradient buffer) and added to gshard at the wait. */
static void rs_start(Trainer *t, int c) {
    float *g = t->gbuf[t->gslot[c]];
    t->rs_state[c] = t->micro > 0 ? 2 : 1;
    t->rs_req[c] = dist_shard_ireduce_scatter_f32(&t->dist, g, t->micro > 0 ? g : t->gshard + t->shard_off[c], shard_len(t, c));
    t->model.chunk_grads[c] = NULL;
}

/* Let the collectives in flight progress (MPI moves non-blocking
 * collectives only inside MPI calls). */
static void comm_progress(Trainer *t) {
    for (int c = 0; c < t->model.n_chunks; c++) {
        if (t->ag_req[c] >= 0) dist_test(&t->dist, t->ag_req[c]);
        if (t->rs_req[c] >= 0) dist_test(&t->dist, t->rs_req[c]);
    }
}

/* The model's chunk hook under sharding (FSDP): gather a chunk before its
 * forward and backward, prefetching the next one in order (forward c+1,
 * backward c-1); free it after its forward when resharding (the final
 * chunk, and tied chunk 0 inside it, stay for the backward that follows at
 * once) and after its backward always; reduce-scatter its gradients as soon
 * as its backward is done. Idle outside a step (t->full is gathered). */
static void chunk_hook(void *ctx, int c, int ev) {
    Trainer *t = ctx;
    if (!t->in_step) return;
    int last = t->model.n_chunks - 1, tied = t->model.cfg.tie_embeddings;
    switch (ev) {
    case CHUNK_PRE_FORWARD:
        chunk_ready(t, c);
        if (c == last) t->head_fwd = 1;
        if (!t->head_fwd) {
            chunk_fetch(t, c + 1);
            if (c + 1 == last && tied) chunk_fetch(t, 0);
        }
        break;
    case CHUNK_POST_FORWARD:
        if (t->reshard && !t->head_fwd) chunk_release(t, c);
        break;
    case CHUNK_PRE_BACKWARD:
        t->head_fwd = 0;
        chunk_ready(t, c);
        grads_take(t, c);
        if (c > 0) chunk_fetch(t, c - 1);
        break;
    case CHUNK_POST_BACKWARD:
        chunk_release(t, c);
        rs_start(t, c);
        break;
    default: die(EXIT_INTERNAL, "chunk hook: unknown event %d", ev);
    }
    comm_progress(t);
}

/* After the last micro-batch: the local gradient shard (every reduce-scatter
 * is complete) summed over the replicate group. */
static void reduce_grads(Trainer *t, int poison) {
    rs_finish_all(t);
    if (poison) { float nan = NAN; t->k->from_host(t->gshard, &nan, sizeof nan); } /* LLMTRAIN_FAULT kind=nan */
    dist_replicate_allreduce_sum_f32(&t->dist, t->gshard, t->n_shard);
}

/* Sharded: copy this rank's shard of the initial weights into the master
 * shards, free the model's full params and grads and set up the chunk
 * pools: params for the embeddings, the final chunk and 2 layers (all
 * layers without resharding, which keeps every chunk from its forward to its
 * backward), grads for the embeddings, the final chunk and 2 layers. */
static void setup_shards(Trainer *t) {
    Model *m = &t->model;
    const Kernels *k = t->k;
    t->shard_off = calloc_check((size_t)m->n_chunks, sizeof(size_t));
    t->n_shard = 0;
    for (int c = 0; c < m->n_chunks; c++) { t->shard_off[c] = t->n_shard; t->n_shard += shard_len(t, c); }
    if (!t->sharded) return;
    size_t bytes = t->n_shard * sizeof(float);
    t->master = k->alloc(bytes);
    t->gshard = k->alloc(bytes);
    t->mshard = k->alloc(bytes);
    t->vshard = k->alloc(bytes);
    for (int c = 0; c < m->n_chunks; c++)
        k->copy(t->master + t->shard_off[c], m->params + m->chunk_offset[c] + (size_t)t->dist.shard_index * shard_len(t, c),
                shard_len(t, c) * sizeof(float));
    k->free(m->params);
    k->free(m->grads);
    m->params = m->grads = NULL;
    int L = m->cfg.n_layer, n = m->n_chunks;
    for (int c = 0; c < n; c++) m->chunk_params[c] = m->chunk_grads[c] = NULL;
    t->n_pslots = 2 + (t->reshard && L > 2 ? 2 : L);
    t->n_gslots = 2 + (L > 2 ? 2 : L);
    t->pbuf = calloc_check((size_t)t->n_pslots, sizeof(float *));
    t->gbuf = calloc_check((size_t)t->n_gslots, sizeof(float *));
    t->powner = malloc_check((size_t)t->n_pslots * sizeof(int));
    t->gowner = malloc_check((size_t)t->n_gslots * sizeof(int));
    for (int i = 0; i < t->n_pslots; i++) { t->pbuf[i] = k->alloc(slot_floats(t, i) * sizeof(float)); t->powner[i] = -1; }
    for (int i = 0; i < t->n_gslots; i++) { t->gbuf[i] = k->alloc(slot_floats(t, i) * sizeof(float)); t->gowner[i] = -1; }
    int *st = malloc_check(5 * (size_t)n * sizeof(int));
    t->pslot = st; t->gslot = st + n; t->ag_req = st + 2 * n; t->rs_req = st + 3 * n; t->rs_state = st + 4 * n;
    for (int i = 0; i < 4 * n; i++) st[i] = -1;
    for (int i = 4 * n; i < 5 * n; i++) st[i] = 0;
    m->comm.hook_ctx = t;
    m->comm.chunk = chunk_hook;
}

/* Bytes of the pooled working weights and gradient buffers. */
static double pool_bytes(const Trainer *t, int grads) {
    double b = 0;
    for (int i = 0; i < (grads ? t->n_gslots : t->n_pslots); i++) b += (double)slot_floats(t, i) * sizeof(float);
    return b;
}

/* Gather the shard group's AdamW moments into full-size m and v at its shard
 * index 0 (fm, fv NULL elsewhere). */
static void gather_moments(Trainer *t, float *fm, float *fv) {
    const Model *m = &t->model;
    for (int c = 0; c < m->n_chunks; c++) {
        size_t len = shard_len(t, c);
        dist_shard_gather_f32(&t->dist, t->mshard + t->shard_off[c], fm ? fm + m->chunk_offset[c] : NULL, len);
        dist_shard_gather_f32(&t->dist, t->vshard + t->shard_off[c], fv ? fv + m->chunk_offset[c] : NULL, len);
    }
}

/* Checkpoint: rank 0 writes; with sharded optimizer state the shard group of
 * rank 0 first gathers m and v into full-size buffers there (all ranks call
 * this; the working params are already gathered). */
static void save_checkpoint_tp(Trainer *t, const TrainState *st);

static void save_checkpoint(Trainer *t, const TrainState *st) {
    Model *m = &t->model;
    float *fm = NULL, *fv = NULL;
    if (t->dist.tp > 1) { save_checkpoint_tp(t, st); return; }
    if (t->sharded) {
        if (t->dist.shard_group != 0) return;
        if (is_root(t)) { fm = t->k->alloc(m->n_params * sizeof(float)); fv = t->k->alloc(m->n_params * sizeof(float)); }
        gather_moments(t, fm, fv);
        m->m = fm;
        m->v = fv;
    }
    if (is_root(t)) {
        ckpt_save(m, &t->cfg, st, t->cfg.ckpt_dir);
        printf("checkpoint: %s/step_%08d\n", t->cfg.ckpt_dir, st->step);
        ckpt_prune(t->cfg.ckpt_dir, t->cfg.ckpt_keep_last); /* only after the new one is complete */
    }
    if (t->sharded) {
        if (fm) t->k->free(fm);
        if (fv) t->k->free(fv);
        m->m = m->v = NULL;
    }
}

/* Tensor parallel: the checkpoint is layout-independent, exactly what a
 * tp = 1 run writes. Each TP rank's shard group 0 gathers its m and v (as
 * above) to its data-parallel rank 0; the TP group of data-parallel rank 0
 * gathers the local params, m and v to rank 0, which assembles the GLOBAL
 * tensors into a tp = 1 model and saves that. */
static void save_checkpoint_tp(Trainer *t, const TrainState *st) {
    Model *m = &t->model;
    const Kernels *k = t->k;
    size_t n = m->n_params, bytes = n * sizeof(float);
    if (t->dist.shard_group != 0) return;
    float *fm = m->m, *fv = m->v;
    if (t->sharded) {
        fm = t->dist.shard_index == 0 ? k->alloc(bytes) : NULL;
        fv = t->dist.shard_index == 0 ? k->alloc(bytes) : NULL;
        gather_moments(t, fm, fv);
    }
    if (t->dist.dp_rank == 0) {
        int tp = t->dist.tp;
        float *all[3] = {NULL, NULL, NULL}, *src[3] = {m->params, fm, fv};
        for (int a = 0; a < 3; a++) {
            if (is_root(t)) all[a] = malloc_check((size_t)tp * bytes);
            dist_tp_gather_f32(&t->dist, src[a], all[a], n);
        }
        if (is_root(t)) {
            Model g;
            model_build_ex(&g, &m->cfg, k, 1, 1, 1, 1);
            float *dst[3] = {g.params, g.m, g.v};
            Model view = *m;
            int differ = 0; /* replicated tensors must agree on every TP rank */
            for (int r = 0; r < tp; r++) {
                view.tp_rank = r;
                for (int i = 0; i < m->n_specs; i++) {
                    const ParamSpec *s = &m->specs[i];
                    if (s->tp_axis < 0 && r > 0 &&
                        memcmp(all[0] + (size_t)r * n + s->offset, all[0] + s->offset, s->numel * sizeof(float)) != 0) {
                        fprintf(stderr, "llmtrain: checkpoint: replicated tensor %s differs between TP ranks 0 and %d\n", s->name, r);
                        differ = 1;
                    }
                    const ParamSpec *gs = model_find(&g, s->name);
                    if (!gs) die(EXIT_INTERNAL, "checkpoint: %s missing from the global layout", s->name);
                    for (int a = 0; a < 3; a++)
                        model_tp_copy(&view, s, dst[a] + gs->offset, all[a] + (size_t)r * n + s->offset, 1);
                }
            }
            ckpt_save(&g, &t->cfg, st, t->cfg.ckpt_dir);
            printf("checkpoint: %s/step_%08d (assembled from %d TP ranks; replicated tensors %s)\n", t->cfg.ckpt_dir, st->step, tp,
                   differ ? "DIFFER" : "identical");
            ckpt_prune(t->cfg.ckpt_dir, t->cfg.ckpt_keep_last);
            model_free(&g);
            for (int a = 0; a < 3; a++) free(all[a]);
        }
    }
    if (t->sharded) {
        if (fm) k->free(fm);
        if (fv) k->free(fv);
    }
}

static void adamw_step(Trainer *t, float lr, float grad_scale, int step) {
    const Config *c = &t->cfg;
    Model *m = &t->model;
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        float wd = (c->decay_all || s->decay) ? c->weight_decay : 0.0f;
        t->k->adamw(m->params + s->offset, m->grads + s->offset, m->m + s->offset, m->v + s->offset,
                    s->numel, lr, c->beta1, c->beta2, c->eps, wd, step + 1, grad_scale);
    }
}

/* ------------------------------------------------------------------ */
/* data                                                                */

/* Fill the host batch with micro-batch j of this rank for step `step`:
 * global sequence i of step k is k*G + i; rank r owns i in [r*G/dp, (r+1)*G/dp). */
static void load_batch(Trainer *t, const DataSet *ds, uint64_t first_seq) {
    int B = t->model.B, T = t->model.T;
    for (int b = 0; b < B; b++) dataset_sequence(ds, first_seq + (uint64_t)b, t->tok + (size_t)b * T, t->tgt + (size_t)b * T);
}

static uint64_t micro_first_seq(const Trainer *t, int step, int j) {
    uint64_t G = (uint64_t)t->cfg.global_batch;
    return (uint64_t)step * G + (uint64_t)t->dist.dp_rank * (G / (uint64_t)t->dist.dp) + (uint64_t)j * (uint64_t)t->model.B;
}

/* ------------------------------------------------------------------ */
/* evaluation and sampling                                             */

static double eval_loss(Trainer *t) {
    double sum[2] = {0, 0};
    /* the same eval.batches micro-batches whatever the layout: dp rank r takes r, r+dp, ... */
    for (int j = t->dist.dp_rank; j < t->cfg.eval_batches; j += t->dist.dp) {
        uint64_t first = (uint64_t)j * (uint64_t)t->model.B;
        load_batch(t, &t->val, first);
        sum[0] += model_forward(&t->model, t->tok, t->tgt);
        sum[1] += 1;
    }
    dist_allreduce_sum_f64(&t->dist, sum, 2);
    return sum[1] > 0 ? sum[0] / sum[1] : NAN;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The next token from a row of logits: argmax at temperature 0, else a
 * draw from softmax(row / temperature). */
static int pick_token(Trainer *t, const float *row, int V) {
    float temp = t->cfg.sample_temperature;
    int next = 0;
    if (temp <= 0) {
        for (int v = 1; v < V; v++) if (row[v] > row[next]) next = v;
        return next;
    }
    float mx = row[0];
    for (int v = 1; v < V; v++) if (row[v] > mx) mx = row[v];
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((row[v] - mx) / temp);
    double u = (xorshift(&t->sample_rng) >> 11) * 0x1.0p-53 * z, acc = 0;
    for (next = 0; next < V - 1; next++) {
        acc += exp((row[next] - mx) / temp);
        if (acc >= u) break;
    }
    return next;
}

/* Generate sample_tokens tokens after a short prompt taken from the data,
 * and print them (rank 0). Uses B = 1 forwards over the growing context.
 * Tensor parallel: the TP group of data-parallel rank 0 runs the forwards;
 * rank 0 gathers the last row's vocabulary slices, picks, and shares it. */
static void print_sample(Trainer *t) {
    const Config *c = &t->cfg;
    Model *m = &t->model;
    int T = m->T, V = m->cfg.vocab_size, tp = t->dist.tp;
    if (c->sample_tokens <= 0 || t->dist.dp_rank != 0) return;
    const DataSet *ds = t->have_val ? &t->val : &t->train;
    int prompt = T < 16 ? (T > 1 ? T / 2 : 1) : 8;
    int total = prompt + c->sample_tokens;
    int *ctx = malloc_check((size_t)total * sizeof(int));
    dataset_sequence(ds, 0, t->tok, t->tgt);
    memcpy(ctx, t->tok, (size_t)prompt * sizeof(int));
    float *row = malloc_check((size_t)V * sizeof(float));
    float *mine = tp > 1 ? malloc_check((size_t)m->V * sizeof(float)) : NULL; /* this rank's vocabulary slice */
    for (int n = prompt; n < total; n++) {
        int len = n < T ? n : T;
        model_forward_bt(m, ctx + (n - len), NULL, 1, len);
        const float *last = m->logits + (size_t)(len - 1) * m->V;
        if (tp > 1) {
            t->k->to_host(mine, last, (size_t)m->V * sizeof(float));
            dist_tp_gather_f32(&t->dist, mine, is_root(t) ? row : NULL, (size_t)m->V);
        } else {
            t->k->to_host(row, last, (size_t)V * sizeof(float));
        }
        int next = is_root(t) ? pick_token(t, row, V) : 0;
        if (tp > 1) { /* share the choice: only rank 0 contributes */
            float f = (float)next;
            dist_tp_allreduce_f32(&t->dist, &f, 1, 0);
            next = (int)f;
        }
        ctx[n] = next;
    }
    if (is_root(t)) {
        printf("--- sample ---\n");
        for (int n = 0; n < total; n++) {
            if (n == prompt) printf("%s", t->have_vocab ? "" : "| ");
            if (t->have_vocab) vocab_print(&t->vocab, ctx[n], stdout);
            else printf("%d ", ctx[n]);
        }
        printf("\n--------------\n");
        fflush(stdout);
    }
    free(mine);
    free(ctx);
    free(row);
}

/* ------------------------------------------------------------------ */
/* logging                                                             */

static double peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long x = (long)(s + 0.5);
    snprintf(buf, n, "%ld:%02ld:%02ld", x / 3600, (x / 60) % 60, x % 60);
}

static void json_num(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

typedef struct StepStats {
    int step;          /* 0-based */
    double loss, lr, norm, dt, val_loss;
    int clipped, skipped;
    double comm_ag, comm_rs, comm_ar, comm_tp; /* bus bytes of this step per collective kind */
} StepStats;

static void log_step(Trainer *t, const StepStats *s) {
    const Config *c = &t->cfg;
    double tokens = (double)c->global_batch * c->seq_len;
    double tps = tokens / s->dt;
    double mfu = t->peak_gflops > 0 ? t->flops_per_token * tps / (t->peak_gflops * 1e9) / t->dist.world : NAN;
    double mem = peak_rss_bytes();
    if (s->step > 0 || c->steps == 1) { t->train_time += s->dt; t->timed_steps++; }
    double avg = t->timed_steps ? t->train_time / t->timed_steps : s->dt;
    char eta[32];
    fmt_duration(eta, sizeof eta, avg * (c->steps - s->step - 1));
    if (!is_root(t)) return;
    if ((s->step + 1) % c->log_every == 0 || s->step + 1 == c->steps || s->skipped) {
        char comm[48] = ""; /* a world of one does not communicate */
        if (t->dist.world > 1)
            snprintf(comm, sizeof comm, " | comm %.2f MB", (s->comm_ag + s->comm_rs + s->comm_ar + s->comm_tp) / 1e6);
        printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f%s | %.0f tok/s | MFU %.1f%% | mem %.2f GiB%s | %.0f ms | ETA %s%s\n",
               s->step + 1, c->steps, s->loss, s->lr, s->norm, s->clipped ? "*" : "", tps, 100 * mfu,
               mem / (1 << 30), comm, 1000 * s->dt, eta, s->skipped ? " | SKIPPED (non-finite)" : "");
        if (isfinite(s->val_loss)) printf("step %5d/%d | val_loss %.4f\n", s->step + 1, c->steps, s->val_loss);
        fflush(stdout);
    }
    FILE *f = t->metrics;
    fprintf(f, "{\"step\":%d", s->step + 1);
    json_num(f, "loss", s->loss);
    json_num(f, "lr", s->lr);
    json_num(f, "grad_norm", s->norm);
    json_num(f, "tokens_per_s", tps);
    json_num(f, "mfu", mfu);
    json_num(f, "mem_bytes", mem);
    json_num(f, "step_ms", 1000 * s->dt);
    fprintf(f, ",\"clipped\":%s,\"skipped\":%s,\"nonfinite_total\":%d", s->clipped ? "true" : "false",
            s->skipped ? "true" : "false", t->nonfinite_total);
    if (isfinite(s->val_loss)) json_num(f, "val_loss", s->val_loss);
    fprintf(f, ",\"comm_bytes\":{\"allgather\":%.0f,\"reduce_scatter\":%.0f,\"allreduce\":%.0f,\"tp_allreduce\":%.0f}",
            s->comm_ag, s->comm_rs, s->comm_ar, s->comm_tp);
    fprintf(f, "}\n");
    fflush(f);
}

/* ------------------------------------------------------------------ */
/* debug dump (tests compare it against PyTorch)                       */

static void dump_flat(Trainer *t, const float *flat, const char *sub) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", t->cfg.debug_dump, sub);
    t->k->to_host(t->host_flat, flat, t->model.n_params * sizeof(float));
    hf_export(&t->model, t->host_flat, dir);
}

static void dump_logits(Trainer *t, double loss) {
    Model *m = &t->model;
    size_t n = (size_t)m->B * m->T * m->cfg.vocab_size;
    float *logits = malloc_check(n * sizeof(float));
    load_batch(t, &t->train, micro_first_seq(t, 0, 0));
    model_forward(m, t->tok, NULL);
    t->k->to_host(logits, m->logits, n * sizeof(float));
    float lossf = (float)loss;
    StWriter w = {0};
    int64_t shape[3] = {m->B, m->T, m->cfg.vocab_size}, one = 1;
    st_writer_add(&w, "logits", 3, shape, logits);
    st_writer_add(&w, "loss", 1, &one, &lossf);
    char path[1200];
    snprintf(path, sizeof path, "%s/logits.safetensors", t->cfg.debug_dump);
    st_writer_write(&w, path, NULL);
    st_writer_free(&w);
    free(logits);
}

/* ------------------------------------------------------------------ */
/* one step                                                            */

/* Gradient sum of squares with tensor parallelism, each parameter counted
 * once: split tensors on every TP rank, replicated ones on tp_rank 0 only,
 * then summed over the TP group. */
static double tp_sumsq(Trainer *t) {
    const Model *m = &t->model;
    double sq = 0;
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        if (s->tp_axis >= 0 || t->dist.tp_rank == 0) sq += t->k->sumsq(m->grads + s->offset, s->numel);
    }
    dist_tp_allreduce_sum_f64(&t->dist, &sq, 1);
    return sq;
}

/* The same over the local gradient shard (summed over the TP group by the caller). */
static double tp_sumsq_sharded(Trainer *t) {
    const Model *m = &t->model;
    double sq = 0;
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        if (s->tp_axis < 0 && t->dist.tp_rank != 0) continue;
        size_t o, n = spec_in_shard(t, s, &o);
        if (n) sq += t->k->sumsq(t->gshard + o, n);
    }
    return sq;
}

static StepStats train_step(Trainer *t, int step) {
    Config *c = &t->cfg;
    Model *m = &t->model;
    const Kernels *k = t->k;
    StepStats s = {.step = step, .val_loss = NAN};
    double t0 = now_s();
    dist_comm_reset(&t->dist);
    /* debug dump: sharded, every rank takes part in gathering the weights */
    int dump = c->debug_dump[0] && step == 0 && (is_root(t) || t->sharded);
    if (dump && t->sharded) gather_params(t);
    if (dump && is_root(t)) dump_flat(t, m->params, "params0");
    if (dump) free_full_params(t);

    if (!t->sharded) k->zero(m->grads, m->n_params * sizeof(float));
    double loss_sum = 0;
    float loss_scale = 1.0f / ((float)c->global_batch * (float)c->seq_len);
    /* sharded: the chunk hooks gather each chunk before its forward and
     * backward and reduce-scatter its gradients right after its backward */
    t->in_step = 1;
    for (int j = 0; j < t->accum; j++) {
        t->micro = j;
        dist_phase(&t->dist, step + 1, "forward");
        load_batch(t, &t->train, micro_first_seq(t, step, j));
        loss_sum += model_forward(m, t->tok, t->tgt);
        dist_phase(&t->dist, step + 1, "backward");
        model_backward(m, loss_scale);
        if (t->sharded && j + 1 < t->accum) rs_finish_all(t); /* the next micro-batch adds into gshard again */
    }
    t->in_step = 0;
    for (int ch = 0; t->sharded && ch < m->n_chunks; ch++)
        if (t->pslot[ch] >= 0 || (t->gslot[ch] >= 0 && !t->rs_state[ch]))
            die(EXIT_INTERNAL, "sharded step: chunk %d still gathered after the backward", ch);
    int poison = dist_fault_nan(&t->dist, step + 1); /* test hook */
    if (poison && !t->sharded) { float nan = NAN; k->from_host(m->grads, &nan, sizeof nan); }
    /* gradients of the mean loss: each rank holds its share, the sum is the mean */
    double red[2] = {loss_sum / t->accum, 0};
    if (t->sharded) {
        dist_phase(&t->dist, step + 1, "reduce_scatter");
        reduce_grads(t, poison);
        /* replicas hold identical shards: the norm sums over the shard group only */
        double sq = t->dist.tp > 1 ? tp_sumsq_sharded(t) : k->sumsq(t->gshard, t->n_shard);
        dist_shard_allreduce_sum_f64(&t->dist, &sq, 1);
        dist_tp_allreduce_sum_f64(&t->dist, &sq, 1);
        dist_allreduce_sum_f64(&t->dist, red, 1);
        red[1] = sq;
    } else {
        dist_phase(&t->dist, step + 1, "allreduce");
        dist_allreduce_sum_f32(&t->dist, m->grads, m->n_params);
        red[1] = t->dist.tp > 1 ? tp_sumsq(t) : k->sumsq(m->grads, m->n_params);
        dist_allreduce_sum_f64(&t->dist, red, 1);
    }
    /* every TP rank of a data-parallel slot holds the same loss */
    s.loss = red[0] / t->dist.world;
    s.norm = sqrt(red[1]);
    s.lr = lr_at(c, step);
    if (dump) {
        if (t->sharded) gather_params(t);
        if (is_root(t)) dump_logits(t, s.loss);
        free_full_params(t);
        if (t->sharded) { /* the summed gradient, gathered from the shards */
            float *g = k->alloc(m->n_params * sizeof(float));
            for (int ch = 0; ch < m->n_chunks; ch++)
                dist_shard_allgather_f32(&t->dist, t->gshard + t->shard_off[ch], g + m->chunk_offset[ch], shard_len(t, ch));
            if (is_root(t)) dump_flat(t, g, "grads");
            k->free(g);
        } else {
            dump_flat(t, m->grads, "grads");
        }
    }

    if (!isfinite(s.loss) || !isfinite(s.norm)) {
        s.skipped = 1;
        t->nonfinite_run++;
        t->nonfinite_total++;
    } else {
        t->nonfinite_run = 0;
        float scale = 1.0f;
        if (c->grad_clip > 0 && s.norm > c->grad_clip) {
            scale = (float)(c->grad_clip / (s.norm + 1e-6));
            s.clipped = 1;
        }
        dist_phase(&t->dist, step + 1, "optimizer");
        if (t->sharded) adamw_step_sharded(t, (float)s.lr, scale, step);
        else adamw_step(t, (float)s.lr, scale, step);
    }
    s.comm_ag = t->dist.bytes_allgather;
    s.comm_rs = t->dist.bytes_reduce_scatter;
    s.comm_ar = t->dist.bytes_allreduce;
    s.comm_tp = t->dist.bytes_tp_allreduce;
    s.dt = now_s() - t0;
    return s;
}

/* ------------------------------------------------------------------ */
/* setup                                                               */

static void check_layout(Trainer *t) {
    Config *c = &t->cfg;
    Dist *d = &t->dist;
    const ModelConfig *mc = &c->model;
    if (d->world % c->tp != 0)
        die(EXIT_USAGE, "%s: parallel.tensor %d does not divide the %d ranks", c->path, c->tp, d->world);
    if (mc->n_kv_head % c->tp != 0 || mc->n_head % c->tp != 0)
        die(EXIT_USAGE, "%s: model.n_kv_head %d (n_head %d) is not divisible by parallel.tensor %d", c->path, mc->n_kv_head,
            mc->n_head, c->tp);
    if (mc->ffn_hidden % c->tp != 0)
        die(EXIT_USAGE, "%s: model.ffn_hidden %d is not divisible by parallel.tensor %d", c->path, mc->ffn_hidden, c->tp);
    if (mc->vocab_size % c->tp != 0)
        die(EXIT_USAGE, "%s: model.vocab_size %d is not divisible by parallel.tensor %d; pad the vocabulary", c->path,
            mc->vocab_size, c->tp);
    if (c->tp > 1 && c->debug_dump[0])
        die(EXIT_USAGE, "%s: debug.dump is not available with parallel.tensor %d (expected 1)", c->path, c->tp);
    dist_set_tp(d, c->tp);
    if (strcmp(c->strategy, "FULL_SHARD") == 0 || strcmp(c->strategy, "SHARD_GRAD_OP") == 0) {
        t->S = d->dp;
    } else if (strcmp(c->strategy, "NO_SHARD") == 0) {
        t->S = 1;
    } else if (strcmp(c->strategy, "HYBRID_SHARD") == 0 || strcmp(c->strategy, "HYBRID_SHARD_ZERO2") == 0) {
        t->S = c->shard_degree > 0 ? c->shard_degree : d->dp;
        if (d->dp % t->S != 0)
            die(EXIT_USAGE, "%s: parallel.shard_degree %d does not divide the %d data-parallel ranks (parallel.strategy %s)",
                c->path, c->shard_degree, d->dp, c->strategy);
    } else {
        die(EXIT_USAGE, "%s: parallel.strategy \"%s\": expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2",
            c->path, c->strategy);
    }
    t->sharded = t->S > 1;
    /* parallel.reshard_after_forward: auto (0) = PyTorch's default per strategy, 1 true, 2 false */
    t->reshard = c->reshard_after_forward == 0 ? strcmp(c->strategy, "FULL_SHARD") == 0 || strcmp(c->strategy, "HYBRID_SHARD") == 0
                                               : c->reshard_after_forward == 1;
    if (c->global_batch == 0) c->global_batch = c->micro_batch * d->dp;
    if (c->global_batch % (c->micro_batch * d->dp) != 0)
        die(EXIT_USAGE, "%s: train.global_batch %d is not divisible by train.micro_batch %d x data-parallel ranks %d",
            c->path, c->global_batch, c->micro_batch, d->dp);
    t->accum = c->global_batch / (c->micro_batch * d->dp);
}

static void select_backend(Trainer *t) {
    const char *dev = t->cfg.device;
    if (strcmp(dev, "cuda") == 0)
        die(EXIT_USAGE, "%s: train.device \"cuda\": this binary was built without the CUDA backend (use \"cpu\" or \"auto\")", t->cfg.path);
    t->k = kernels_cpu();
}

static void open_metrics(Trainer *t) {
    if (!is_root(t)) return;
    if (mkdir_p(t->cfg.log_dir) != 0) die(EXIT_IO, "log.dir: cannot create %s (%s)", t->cfg.log_dir, strerror(errno));
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->cfg.log_dir);
    t->metrics = fopen(path, "w");
    if (!t->metrics) die(EXIT_IO, "%s: cannot open for writing (%s)", path, strerror(errno));
}

static void print_header(Trainer *t) {
    if (!is_root(t)) return;
    const Config *c = &t->cfg;
    const ModelConfig *mc = &t->model.cfg;
    printf("llmtrain %s | %s | backend %s, %d threads/rank | %s\n", LLMTRAIN_VERSION, c->path, t->k->name, t->threads,
           kernels_cpu_blas_info());
    printf("model %s: %d layers, %d embd, %d heads (%d kv), ffn %d, vocab %d, %.2fM parameters%s\n",
           mc->arch == ARCH_GPT2 ? "gpt2" : "llama", mc->n_layer, mc->n_embd, mc->n_head, mc->n_kv_head,
           mc->ffn_hidden, mc->vocab_size, t->model.n_real_params / 1e6, mc->tie_embeddings ? " (tied embeddings)" : "");
    printf("batch: %d seqs x %d tokens = %d tokens/step; micro %d x accum %d x dp %d | world %d\n",
           c->global_batch, c->seq_len, c->global_batch * c->seq_len, c->micro_batch, t->accum, t->dist.dp, t->dist.world);
    printf("data: %s (%llu tokens)%s | peak for MFU %.1f GFLOP/s (%s)\n", c->data_train, (unsigned long long)t->train.n_tokens,
           t->have_val ? ", val on" : "", t->peak_gflops, c->peak_gflops > 0 ? "log.peak_gflops" : "measured sgemm");
    fflush(stdout);
}

/* Rank 0 prints the data-parallel layout and every rank's memory for
 * working parameters, fp32 master weights, gradients and optimizer state. */
static void print_layout(Trainer *t) {
    Dist *d = &t->dist;
    const Model *m = &t->model;
    double full = (double)m->n_params * sizeof(float), shard = (double)t->n_shard * sizeof(float);
    double acts = (double)m->acts_floats * sizeof(float) + 2.0 * t->cfg.micro_batch * t->cfg.seq_len * sizeof(int);
    /* sharded: working weights and gradients are the chunk pools (setup_shards) */
    double mine[5] = {t->sharded ? pool_bytes(t, 0) : full, t->sharded ? shard : full,
                      t->sharded ? pool_bytes(t, 1) + shard : full, 2 * (t->sharded ? shard : full), acts};
    double *all = is_root(t) ? malloc_check((size_t)d->world * 5 * sizeof(double)) : NULL;
    dist_gather_f64(d, mine, all, 5);
    if (!is_root(t)) return;
    int S = d->shard_size, R = d->replicate_size;
    printf("parallel: strategy %s | shard groups of %d x %d replicas | %s\n", t->cfg.strategy, S, R,
           t->sharded ? (t->reshard ? "sharded per layer chunk; gathered before forward and again before backward (reshard_after_forward)"
                                    : "sharded per layer chunk; gathered before forward, kept until backward (no reshard_after_forward)")
                      : "replicated");
    int P = d->tp;
    if (P > 1) {
        printf("tensor parallel: %d ranks per TP group (tp innermost); heads, ffn and vocabulary split %d ways\n", P, P);
        for (int g = 0; g < d->dp; g++) {
            printf("  TP group %d: ranks", g);
            for (int i = 0; i < P; i++) printf(" %d", g * P + i);
            printf("\n");
        }
    }
    for (int tr = 0; tr < P; tr++) {
        for (int g = 0; g < R; g++) {
            if (P > 1) printf("  tp_rank %d", tr);
            printf("  shard group %d: ranks", g);
            for (int i = 0; i < S; i++) printf(" %d", (g * S + i) * P + tr);
            printf("\n");
        }
        for (int i = 0; i < S; i++) {
            if (P > 1) printf("  tp_rank %d", tr);
            printf("  replicate group %d: ranks", i);
            for (int g = 0; g < R; g++) printf(" %d", (g * S + i) * P + tr);
            printf("\n");
        }
    }
    for (int r = 0; r < d->world; r++) {
        const double *x = all + 5 * r;
        printf("  rank %d: params_bytes %.0f master_bytes %.0f grads_bytes %.0f optimizer_state_bytes %.0f activations_bytes %.0f\n", r, x[0], x[1],
               x[2], x[3], x[4]);
    }
    fflush(stdout);
    free(all);
}

static void tp_allreduce_cb(void *ctx, float *x, size_t n, int max) { dist_tp_allreduce_f32(ctx, x, n, max); }

static int train(int argc, char **argv) {
    static Trainer tr;
    Trainer *t = &tr;
    dist_init(&t->dist, &argc, &argv);
    const char *job = NULL;
    char **sets = malloc_check((size_t)argc * sizeof(char *));
    int n_set = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0) {
            if (i + 1 >= argc) die(EXIT_USAGE, "--set: expected key=value after it");
            sets[n_set++] = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            sets[n_set++] = argv[i] + 6;
        } else if (argv[i][0] == '-') {
            die(EXIT_USAGE, "unknown option '%s' (see llmtrain --help)", argv[i]);
        } else if (!job) {
            job = argv[i];
        } else {
            die(EXIT_USAGE, "unexpected argument '%s': one job file only", argv[i]);
        }
    }
    if (!job) die(EXIT_USAGE, "no job file given (usage: llmtrain job.json [--set key=value ...])");
    Config *c = &t->cfg;
    config_load(c, job, n_set, sets);
    free(sets);
    dist_watchdog_start(&t->dist, c->timeout_s);
    if (c->init_from[0]) {
        ModelConfig hf;
        hf_read_config(c->init_from, &hf);
        config_take_model(c, &hf, c->init_from);
    }
    config_freeze_model(c);
    check_layout(t);
    select_backend(t);
    t->threads = kernels_cpu_set_threads(0, t->dist.local_size);

    /* data first: a bad path should fail before minutes of setup */
    dataset_open(&t->train, c->data_train, "data.train", c->model.vocab_size, c->seq_len, c->data_shuffle, c->seed);
    if (c->data_val[0]) {
        dataset_open(&t->val, c->data_val, "data.val", c->model.vocab_size, c->seq_len, 0, c->seed);
        t->have_val = 1;
    }
    if (c->data_vocab[0]) { vocab_load(&t->vocab, c->data_vocab); t->have_vocab = 1; }

    dist_setup_groups(&t->dist, t->S);
    model_build_tp(&t->model, &c->model, t->k, c->micro_batch, c->seq_len, t->S, !t->sharded, t->dist.tp, t->dist.tp_rank);
    t->model.comm = (ModelComm){&t->dist, tp_allreduce_cb, NULL, NULL};
    if (c->init_from[0] && t->dist.tp > 1)
        die(EXIT_USAGE, "%s: init.from is not available with parallel.tensor %d yet (expected 1)", c->path, t->dist.tp);
    if (c->init_from[0]) hf_load_weights(&t->model, c->init_from);
    else model_init_random(&t->model, c->init_std, c->seed);
    setup_shards(t);
    t->tok = malloc_check((size_t)c->micro_batch * c->seq_len * sizeof(int));
    t->tgt = malloc_check((size_t)c->micro_batch * c->seq_len * sizeof(int));
    t->host_flat = malloc_check(t->model.n_params * sizeof(float));
    t->flops_per_token = model_flops_per_token(&c->model, c->seq_len);
    t->peak_gflops = c->peak_gflops > 0 ? c->peak_gflops : kernels_cpu_sgemm_peak_gflops();
    t->sample_rng = c->seed * 2654435761ull + 88172645463325252ull;
    open_metrics(t);
    print_header(t);
    print_layout(t);
    if (c->health_check && !dist_health_check(&t->dist, (size_t)1 << 20, c->min_bus_gbps)) {
        dist_finalize(&t->dist);
        exit(EXIT_SLOW_FABRIC);
    }

    TrainState st = {0};
    for (int step = 0; step < c->steps; step++) {
        dist_phase(&t->dist, step + 1, "forward");
        dist_fault_point(&t->dist, step + 1);
        StepStats s = train_step(t, step);
        int last = step + 1 == c->steps;
        int eval = (c->eval_every > 0 && (step + 1) % c->eval_every == 0) || last;
        int save = (c->ckpt_every > 0 && (step + 1) % c->ckpt_every == 0) || last;
        /* sharded: the update lives in the master shards; gather the full
         * weights before anything reads them outside a step */
        if (t->sharded && (eval || save)) { dist_phase(&t->dist, step + 1, "allgather"); gather_params(t); }
        if (eval) dist_phase(&t->dist, step + 1, "eval");
        if (eval && t->have_val && c->eval_batches > 0) s.val_loss = eval_loss(t);
        log_step(t, &s);
        if (eval) print_sample(t);
        if (t->nonfinite_run >= c->max_nonfinite_steps) {
            if (is_root(t)) fprintf(stderr, "llmtrain: %d consecutive steps with non-finite loss or gradients (step %d); exiting\n",
                                    t->nonfinite_run, step + 1);
            dist_abort(&t->dist, EXIT_NONFINITE);
        }
        st.step = step + 1;
        st.seq_cursor = (uint64_t)(step + 1) * (uint64_t)c->global_batch;
        if (save) {
            dist_phase(&t->dist, step + 1, "checkpoint");
            save_checkpoint(t, &st);
        }
        free_full_params(t);
    }
    if (t->metrics) fclose_check(t->metrics, "metrics.jsonl");
    dist_phase(&t->dist, c->steps, "finalize");
    dist_finalize(&t->dist);
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* export                                                              */

static int cmd_export(int argc, char **argv) {
    if (argc != 2) die(EXIT_USAGE, "usage: llmtrain export CHECKPOINT_DIR OUT_DIR");
    char step_dir[2048];
    if (ckpt_resolve(argv[0], step_dir, sizeof step_dir) != 0)
        die(EXIT_USAGE, "export: %s: no complete checkpoint found (expected a step folder with state.json, or a root holding step_* folders)", argv[0]);
    TrainState st;
    char *json = ckpt_read_state(step_dir, &st);
    Config c;
    config_load_string(&c, json, step_dir);
    free(json);
    Model m;
    model_build(&m, &c.model, kernels_cpu(), 1, 1, 1);
    ckpt_load_params(&m, step_dir);
    float *host = malloc_check(m.n_params * sizeof(float));
    m.k->to_host(host, m.params, m.n_params * sizeof(float));
    hf_export(&m, host, argv[1]);
    printf("exported %s (step %d) -> %s\n", step_dir, st.step, argv[1]);
    free(host);
    model_free(&m);
    config_free(&c);
    return EXIT_OK;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: llmtrain JOB.json [--set key=value ...]   train (mpirun -np N for several ranks)\n"
            "       llmtrain export CHECKPOINT_DIR OUT_DIR    write a Hugging Face folder\n"
            "       llmtrain keys                             list every config key with its default\n"
            "       llmtrain --version\n");
}

int main(int argc, char **argv) {
    kernels_cpu_select_blas_core(argv);
    if (argc < 2) { usage(stderr); return EXIT_USAGE; }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) { usage(stdout); return EXIT_OK; }
    if (strcmp(argv[1], "--version") == 0) { printf("llmtrain %s\n", LLMTRAIN_VERSION); return EXIT_OK; }
    if (strcmp(argv[1], "keys") == 0) { config_print_keys(); return EXIT_OK; }
    if (strcmp(argv[1], "export") == 0) return cmd_export(argc - 2, argv + 2);
    return train(argc, argv);
}
