/* shard.h — the sharding runtime: FSDP-style sharded data parallelism
 * (parallel.strategy FULL_SHARD, HYBRID_SHARD, SHARD_GRAD_OP) and the
 * gradient reduction of NO_SHARD, over the model's chunk hooks. It owns
 * the optimizer's state (the master weights or their shard, AdamW's
 * moments of the shard), the pooled working-weight and gradient buffers a
 * sharded step gathers into, the collectives in flight, and the gradient
 * norm's sums of squares. layout_check (layout.c) sets cfg, dist and
 * model and the layout's S, sharded and reshard, the trainer k before
 * shard_setup; train_step drives in_step, micro, step_accum and
 * chunks_done, the step's test hooks poison. */
#ifndef LLMTRAIN_SHARD_H
#define LLMTRAIN_SHARD_H
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "kernels.h"
#include "model.h"
#include "parallel.h"

typedef struct Sharding {
    const Config *cfg;         /* the trainer's: the job, */
    Dist *dist;                /* its process groups, */
    Model *model;              /* its model, */
    const Kernels *k;          /* and its backend */
    AdamWRange *opt_ranges;    /* what AdamW updates (shard_opt_ranges_build) */
    uint64_t *opt_elem0;       /* per range: (tensor index << 40) + its first element in the tensor */
    int n_opt_ranges;
    int weights_kept;          /* the last AdamW kept the backend's copies of the weights (Kernels.adamw_multi) */
    uint16_t *wshard;          /* train.param_dtype bf16, sharded: the working-weight shard as bf16 words, what the gathers send */
    /* sharded data parallel (parallel.strategy other than NO_SHARD with a
     * shard group of S > 1 ranks): the optimizer owns, per chunk, the slice
     * [chunk_offset + shard_index*len, +len) with len = chunk_size / S. */
    int S;                     /* shard group size (1: replicated) */
    int sharded;               /* S > 1 */
    int reshard;               /* parallel.reshard_after_forward: free a chunk's weights after its forward, re-gather for backward */
    size_t *shard_off;         /* [n_chunks] offset of chunk c's shard in the arrays below */
    size_t n_shard;            /* floats in the local shard (sum over chunks) */
    float *master, *gshard, *mshard, *vshard; /* [n_shard] fp32 master weights, grads, AdamW m, v (unsharded: master is
                                                 the full fp32 copy under bf16 working weights, else NULL) */
    /* Sharded: the model holds no full-size params or grads. A chunk's
     * working weights / gradients live in a pooled buffer while the chunk
     * hook has it gathered / accumulating; slots of class 0 (embeddings),
     * 1 (final chunk) and 2 (layers) serve only that class. */
    float **pbuf, **gbuf;      /* [n_pslots], [n_gslots] pooled working params / grads */
    int *powner, *gowner;      /* chunk holding each slot, -1: free */
    int n_pslots, n_gslots;
    int *pslot, *gslot;        /* [n_chunks] slot a chunk holds, -1: none */
    int *ag_req, *rs_req;      /* [n_chunks] non-blocking all-gather / reduce-scatter handle, -1: none */
    int *ag_unpack;            /* [n_chunks] 1: its bf16 gather (upper half of its slot) is to be widened when it is ready */
    int *rs_state;             /* [n_chunks] 0: no reduce-scatter; 1: one in flight into gshard, 2: in place (added at the wait) */
    int in_step, micro, head_fwd; /* inside a step's forward/backward; micro-batch; inside the final chunk's forward */
    int step_accum, poison;    /* this step's micro-batches; LLMTRAIN_FAULT kind=nan poisons its gradients */
    int chunks_done;           /* chunks whose gradients are final this step (ar_start) */
    int *ar_req;               /* [n_chunks] the all-reduce of chunk c's final gradients in flight, -1: none */
    /* the gradient norm's sums of squares, queued beside the backward as
     * each chunk's gradients (sharded: its shard) become final: a slot a
     * chunk, or under TP a slot a tensor (backend memory, zero-filled) */
    double *gsq_dev, *gsq_host;
    int n_gsq;
    int fwd_only;              /* eval / sample forwards: the hook gathers each chunk for its forward only */
    float *full;               /* outside a step: all weights gathered (debug.dump), else NULL */
    double full_peak;          /* bytes of full at its largest (0: never gathered; metrics params_peak_bytes) */
} Sharding;

/* Floats of this rank's shard of chunk c. */
size_t shard_len(const Sharding *sh, int c);
/* Sharded: copy this rank's shard of the initial weights into the master
 * shards, free the model's full params and grads, set up the chunk pools
 * and install the chunk hook; unsharded, the gradient hook that starts each
 * chunk's all-reduce. Both: the gradient norm's slots. */
void shard_setup(Sharding *sh);
/* train.param_dtype bf16: the fp32 master weights beside the working ones
 * (sharded: the bf16 words of the working shard). */
void shard_setup_bf16(Sharding *sh);
/* The optimizer's ranges, built once (one adamw_multi call a step). */
void shard_opt_ranges_build(Sharding *sh);
/* Round the master weights into the working copy after steps_done steps. */
void shard_refresh_working(Sharding *sh, int steps_done);
/* AdamW over what this rank owns; sumsq (not NULL): its part of the
 * updated master weights' sum of squares. Sets weights_kept. */
void shard_adamw_step(Sharding *sh, float lr, float grad_scale, int step, double *sumsq);
/* Outside a step (debug.dump): every chunk gathered into full; and back. */
void shard_gather_params(Sharding *sh);
void shard_free_full_params(Sharding *sh);
/* Pool slots of working weights and of gradients; bytes of either pool
 * (grads 0 / 1); bytes of the working weights the model reads (shard: the
 * fp32 shard's bytes). Need only cfg, model, sharded and reshard. */
void shard_pool_slots(const Sharding *sh, int *n_pslots, int *n_gslots);
double shard_pool_bytes(const Sharding *sh, int grads);
double shard_params_bytes(const Sharding *sh, double shard);
/* Where state kind k (0 weights, 1 exp_avg, 2 exp_avg_sq) of local flat
 * index lo of chunk c lives on this rank (lo lies in this rank's shard). */
float *shard_state_ptr(Sharding *sh, int k, int c, size_t lo);
/* Install loaded state as this rank's weights and optimizer state: the
 * host arrays hold what the rank owns, packed in chunk order (the whole
 * local model when replicated, its shard when sharded: n_shard floats,
 * exactly the layout of master / mshard / vshard). */
void shard_install_state(Sharding *sh, const float *p, const float *mm, const float *vv);
/* Wait for every chunk's reduce-scatter (between micro-batches). */
void shard_rs_finish_all(Sharding *sh);
/* After the last micro-batch's backward: wait for every chunk's gradient
 * all-reduce, in phase allreduce of step + 1. */
void shard_ar_wait_all(Sharding *sh, int step);
/* Sums of squares: the queued gradient slots, summed over the ranks; a
 * model-sized array at once; this rank's part summed over the ranks. */
double shard_sumsq_slots_take(Sharding *sh);
double shard_model_sumsq(Sharding *sh, const float *a);
double shard_model_sumsq_ranks(Sharding *sh, double sq);

#endif
