/* model.h — GPT-2 and Llama as one flat parameter array carved by a
 * layout table, and the forward/backward passes over it (orchestration
 * only: every element-wise or matrix operation is a call into kernels.h). */
#ifndef LLMTRAIN_MODEL_H
#define LLMTRAIN_MODEL_H
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "kernels.h"

/* What a tensor is, so code can find it without string compares. */
typedef enum {
    P_WTE, P_WPE,                     /* chunk 0: embeddings */
    P_LN1_W, P_LN1_B,                 /* per layer */
    P_QKV_W, P_QKV_B,                 /* fused [ (nh+2nkv)*hd, C ] rows q|k|v */
    P_ATTN_OUT_W, P_ATTN_OUT_B,       /* [C, nh*hd] */
    P_Q_NORM_W, P_K_NORM_W,           /* [hd] QK-norm (model.qk_norm), shared by the heads, replicated under tp */
    P_LN2_W, P_LN2_B,
    P_FC_W, P_FC_B,                   /* GPT-2 c_fc [4C, C]; Llama fused gate|up [2F, C] */
    P_PROJ_W, P_PROJ_B,               /* [C, F] */
    P_LNF_W, P_LNF_B,                 /* last chunk: final norm, untied lm_head */
    P_LM_HEAD,                        /* [V, C], only when untied */
    /* a mixture-of-experts layer's MLP (moe.c), instead of FC and PROJ */
    P_ROUTER_W,                       /* [E, C] */
    P_EXP_FC_W,                       /* [E * 2Fe, C]: expert e's gate|up at rows e * 2Fe */
    P_EXP_PROJ_W,                     /* [E * C, Fe]: expert e's down projection at rows e * C */
    P_SH_FC_W, P_SH_PROJ_W,           /* shared experts: [2Fs, C], [C, Fs] */
    P_NKINDS
} ParamKind;

/* One named tensor of the layout table. The same table drives init,
 * optimizer decay, sharding, checkpoints and Hugging Face import/export. */
typedef struct ParamSpec {
    char name[64];     /* internal name, e.g. "layers.3.attn.qkv.weight" */
    ParamKind kind;
    int layer;         /* transformer layer, or -1 */
    int chunk;         /* 0 = embeddings, 1..L = layers, L+1 = final */
    int ndim;
    int shape[2];      /* [rows, cols] (1-D: shape[0]) */
    size_t offset;     /* in floats, into the flat arrays */
    size_t numel;
    int tp_axis;       /* tensor-parallel split axis: -1 replicated, 0 rows, 1 cols */
    int nparts;        /* fused tensors: row blocks split separately by tp (qkv: 3, gate|up: 2) */
    int decay;         /* weight decay applies under decay_all = false (2-D tensors) */
} ParamSpec;

/* Pointers to one layer's tensors inside some flat array (params or grads). */
typedef struct LayerPtrs {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attn_out_w, *attn_out_b;
    float *q_norm_w, *k_norm_w;         /* NULL without model.qk_norm */
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *proj_w, *proj_b;
    float *router_w, *exp_fc_w, *exp_proj_w, *sh_fc_w, *sh_proj_w; /* MoE layers (NULL else) */
} LayerPtrs;

typedef struct ModelPtrs {
    float *wte, *wpe, *lnf_w, *lnf_b, *lm_head; /* lm_head == wte when tied */
    LayerPtrs *layers;                           /* [n_layer] */
} ModelPtrs;

/* Saved activations of one layer (NULL where an arch has no such tensor).
 * ln1, atty, ln2 and fch_act are [a] buffers (kernels.h): act_bytes an
 * element, never read here. Under sequence parallelism (Model.tp.sp) ln1,
 * res2, ln2, res3 and the norms' statistics hold this rank's S rows. */
typedef struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd;   /* [N,C], [N], [N] */
    float *qkv;                         /* [N, QKV] after rope; under model.qk_norm the product as it is */
    float *qkn;                         /* model.qk_norm (else NULL): [N, QKV] [a], qkv's q and k heads
                                         * normalized, then rope, and its v heads: attention's input */
    float *qk_rstd;                     /* model.qk_norm: [N, nh + nkv] each q and k head's 1/rms */
    float *atty;                        /* [N, nh*hd] */
    float *lse;                         /* [B, nh, T] attention log-sum-exp */
    float *res2;                        /* [N,C] residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch;                         /* [N, F] (gpt2) or [N, 2F] (llama) */
    float *fch_act;                     /* [N, F] after gelu / swiglu */
    float *res3;                        /* [N,C] layer output */
    /* a mixture-of-experts layer's (moe.c; every layer has them when any
     * layer is MoE). N here is all of the micro-batch's rows (under
     * sequence parallelism too); Nk = N * top_k rows of the experts */
    float *probs, *mlse, *wts;          /* [N, E] router softmax, [N] its logits' log-sum-exp, [N, k] the top-k weights */
    int *idx, *slot, *src;              /* [N, k] chosen experts, their rows in the permuted buffer (-1: dropped); [Nk] each row's token */
    float *xh, *xact;                   /* [Nk, 2Fe] [a] the experts' gate|up, [Nk, Fe] [a] after SwiGLU */
    float *yp;                          /* [Nk, C] the experts' outputs (fp32) */
    float *sh_h, *sh_act;               /* shared experts: [N, 2Fs] [a], [N, Fs] [a] */
    float *xr;                          /* expert parallelism: [R, C] [a] the rows this rank's experts received */
} LayerActs;

/* Events of chunk hooks: chunk c's parameters are read between PRE and POST
 * of a forward or a backward; its gradients are written between PRE and
 * POST of a backward. */
enum { CHUNK_PRE_FORWARD, CHUNK_POST_FORWARD, CHUNK_PRE_BACKWARD, CHUNK_POST_BACKWARD };

/* Collectives the model needs, supplied by the trainer (model.c stays free
 * of MPI). allreduce: in place over the TP group, sum (max = 0) or
 * elementwise max (max = 1); unused when tp == 1. Under sequence
 * parallelism (ModelMem.seq_parallel) also, over the TP group: allgather,
 * every member's n elements of es bytes (4: float32, 2: bf16 words) into
 * recv[tp * n] in member order; reduce_scatter, the members' send[tp * n]
 * summed, block tp_rank into recv[n]. chunk (NULL: none): called
 * around each chunk's use, in order: forward 0 (embeddings), 1..L (layers),
 * L+1 (final norm and LM head; with tied embeddings chunk 0 is used again
 * inside it: PRE/POST_FORWARD 0 around the LM head, and PRE_BACKWARD 0 right
 * after PRE_BACKWARD L+1, its POST_BACKWARD coming once, after the embedding
 * backward); backward L+1, L..1, 0. After a PRE event the model takes chunk
 * c's tensor pointers from chunk_params[c] / chunk_grads[c], which the hook
 * may have moved (sharded training keeps them in a small pool).
 * grads_done (NULL: none): called at every CHUNK_POST_BACKWARD (after chunk,
 * when both are set): chunk c's gradients for this backward are all
 * written, and no later work of this backward touches them (the
 * unsharded trainer starts their data-parallel all-reduce there); it may
 * not move the chunk's pointers.
 * cp_shift (context parallelism, Model.cp.size > 1): over the context group,
 * start sending `bytes` of backend memory to the next member of the ring
 * and receiving as many from the previous one into recv (cp.c's ring); it
 * returns a handle for cp_wait, after which the backend's later work sees
 * recv (a device communicator overlaps the transfer with the work queued
 * between the two, MPI's with the host's); recv may not be touched in
 * between, send only read. cp_allgather, every member's `bytes` into
 * recv[cp * bytes] in member order; cp_reduce_scatter, the members'
 * send[cp * n] floats summed, block cp_rank into recv[n]
 * (parallel.context_mode all_gather). cp_allreduce_max, n floats of
 * backend memory, max in place over the context group (FP8 amaxes). */
typedef struct ModelComm {
    void *ctx;
    void (*allreduce)(void *ctx, float *x, size_t n, int max);
    void (*allgather)(void *ctx, const void *send, void *recv, size_t n, int es);
    void (*reduce_scatter)(void *ctx, const float *send, float *recv, size_t n);
    void *hook_ctx;
    void (*chunk)(void *hook_ctx, int chunk, int event);
    void (*grads_done)(void *hook_ctx, int chunk);
    int (*cp_shift)(void *ctx, const void *send, void *recv, size_t bytes);
    void (*cp_wait)(void *ctx, int h);
    void (*cp_allgather)(void *ctx, const void *send, void *recv, size_t bytes);
    void (*cp_reduce_scatter)(void *ctx, const float *send, float *recv, size_t n);
    void (*cp_allreduce_max)(void *ctx, float *x, size_t n);
    /* mb_allreduce (mixture of experts): n doubles of host memory, summed
     * in place over the ranks that hold parts of one micro-batch (the
     * context group); NULL when one rank holds it all */
    void (*mb_allreduce)(void *ctx, double *x, size_t n);
    /* expert parallelism (Model.moe.ep > 1), over the expert group:
     * ep_alltoallv moves bytes of backend memory, member j getting scount[j]
     * bytes from send + sdispl[j] and this rank rcount[i] from member i at
     * recv + rdispl[i]; ep_counts, one size_t of host memory to and from
     * each member (recv[i] = member i's send[this rank]) */
    void (*ep_alltoallv)(void *ctx, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                         const size_t *rcount, const size_t *rdispl);
    void (*ep_counts)(void *ctx, const size_t *send, size_t *recv);
} ModelComm;

/* Activation checkpointing (train.activation_checkpointing): which saved
 * activations the backward recomputes instead of keeping per layer. */
enum { ACT_NONE = 0, ACT_SELECTIVE = 1 /* what ModelMem.recompute names */, ACT_FULL = 2 /* all but each layer's output */ };
/* Under ACT_SELECTIVE, what the backward recomputes of each layer
 * (train.recompute_modules, bit i the i-th of RECOMPUTE_MODULES, config.h):
 * the attention output and its log-sum-exp; both norms' outputs and
 * statistics; the MLP activation's output. RC_LAYER: everything of a layer
 * but its output (ACT_FULL). Each recompute repeats the forward's kernel on
 * the forward's inputs, so the backward sees the forward's values bit for
 * bit. */
enum { RC_ATTENTION = 1, RC_NORM = 2, RC_MLP_ACT = 4, RC_LAYER = 8 };

/* What the activations keep: train.activation_checkpointing, and
 * train.lm_head_chunk, the token rows the LM head and the cross-entropy
 * process at a time (0: model_head_rows_auto), so that logits exist for
 * head_rows rows only (a training forward runs each chunk's backward right
 * after its forward: nothing is recomputed). */
typedef struct ModelMem {
    int act_ckpt;
    int head_rows;
    int offload; /* train.activation_offload: layers' kept activations in host memory */
    int act_bytes; /* bytes per element of the [a] activations (kernels.h; 0: 4); model_build_tp takes the backend's */
    int seq_parallel; /* parallel.sequence_parallel (with tp > 1): see Model.tp.sp */
    int recompute; /* ACT_SELECTIVE: RC_ATTENTION | RC_NORM | RC_MLP_ACT (0: RC_ATTENTION) */
    int ep, ep_rank; /* parallel.expert (0: 1) and this rank's place in its expert group (Model.moe) */
    float capacity;  /* train.moe_capacity_factor: the experts' rows are sized by it (0: dropless) */
} ModelMem;

/* Activation offload: device buffers for this many layers (slots); layer l
 * uses slot l % OFFLOAD_SLOTS: the one being computed, the one before it
 * (its input) and one in flight to or from the host. */
#define OFFLOAD_SLOTS 3

/* Tensor parallelism and Megatron's sequence parallelism (Model.tp): the
 * rank's place in the TP group, its vocabulary slice and what the split
 * activations need. */
typedef struct ModelTP {
    /* the size ranks each hold nh = n_head/size query heads, nkv = n_kv_head/size
     * kv heads, F = ffn_hidden/size hidden units and the vocabulary rows
     * [v0, v0 + V) of V = vocab_size/size (Model's; size 1: the full model) */
    int size, rank, v0;
    /* Megatron's sequence parallelism (size > 1): the residual stream, the
     * norms and their outputs hold only this rank's S = ceil(N / size) of the
     * N rows, rows [rank * S, +S) (the last rank's beyond N are zero
     * padding). A norm's output is all-gathered into sp_gath before the
     * column-parallel product that reads it (again in the backward, for the
     * weight gradient), and a row-parallel product's partial sums are
     * reduce-scattered instead of all-reduced; the backward mirrors it. The
     * norms' weight gradients, partial over the rows, are all-reduced. */
    int sp, S;                /* S: rows per rank at the built B x T (N when sp is 0) */
    float *ce_max, *ce_sum;   /* [R], [2R] vocab-parallel cross-entropy pieces (size > 1) */
    /* sequence parallelism (NULL without): Np = size * S rows */
    float *sp_gath;           /* [Np, C] [a]: a norm's output all-gathered */
    float *sp_dgath;          /* [Np, C]: d(residual stream) all-gathered */
    float *sp_part;           /* [S, C]: a reduce-scatter's rows */
    float *sp_lnf;            /* [S, C] [a]: the final norm's own rows */
    float *sp_dnorm;          /* [2C]: a norm's weight (and bias) gradient over this rank's rows */
    float *qk_dnorm;          /* [2 hd] (model.qk_norm): the QK-norm weights' gradient over this rank's heads */
} ModelTP;

/* Context parallelism (Model.cp; cp_setup, cp.c; size 1: off): the model's
 * T rows of a sequence are chunks rank and 2 size - 1 - rank of the
 * sequence's 2 size chunks of T/2 tokens; positions (pos), qstart and
 * attention are the sequence's (cp_pos) */
typedef struct ModelCP {
    int size, rank, mode;     /* mode: CP_RING | CP_ALL_GATHER (cp.h) */
    float *ring[2];           /* ring: two buffers of a k|v block [B*T, 2 nkv hd] and its gradient after it
                               * ([1] then a gradient's part, the backward's);
                               * all_gather: [0] the own block and its gradient, [1] every block, then every gradient */
    const int *doc0;          /* set by the caller before a forward when eod_token >= 0: [N] host memory,
                               * each token's document's first position in its whole sequence */
} ModelCP;

/* Activation offload (Model.offload; train.activation_offload). */
typedef struct ModelOffload {
    int on;                   /* activation offload on (and n_layer > OFFLOAD_SLOTS) */
    float *host;              /* host copy of every layer's kept activations [n_layer][layer_floats] */
    size_t layer_floats, floats;
    int slot_layer[OFFLOAD_SLOTS]; /* the layer whose activations a slot holds (-1: none) */
    int slot_out[OFFLOAD_SLOTS];   /* offload_mark of the slot's store to the host not yet waited for (-1: none) */
    int slot_in[OFFLOAD_SLOTS];    /* ... of its load from the host not yet waited for (-1: none) */
} ModelOffload;

/* Mixture of experts (Model.moe; moe.c). */
typedef struct ModelMoE {
    int on;                   /* some layer is MoE */
    int E, k, F, Fs;          /* experts, top-k, an expert's width, the shared experts' (0: none) */
    int n_layers, first;      /* MoE layers, and the first */
    /* expert parallelism (parallel.expert): the expert group's ep ranks each
     * compute El = E / ep experts, [ep_rank El, +El), on the rows the group's
     * members send them (ModelComm.ep_alltoallv); R rows at most: ep N k
     * (every member's every choice: the dropless bound), or under a capacity
     * c the E ceil(c N k / E) its experts can take, if fewer. Every rank
     * still holds every expert's weights (their gradients are reduced as
     * their layer's) */
    int ep, ep_rank, El;
    size_t R;
    int *rc;                  /* [n_layer][ep][El] host: rows received from member i for local expert q */
    size_t *a2a;              /* [4 ep] host: send counts, send offsets, receive counts, receive offsets (bytes) */
    float *ybuf, *dxr;        /* [R, C] fp32: the received rows' expert outputs (then their gradients), d(received rows) */
    int norm_topk;
    /* set by the caller (moe_set_losses; model_build_tp: 0, 0, 0 and 1) */
    float capacity_factor, aux_coef, z_coef;
    float aux_scale;          /* this micro-batch's balance losses' weight in the step's loss */
    float bias_rate;          /* aux-loss-free balancing (0: off): moe_bias_update after each step */
    float *bias, *bias_dev;   /* [n_layer][E] host and backend: the biases the top-k choice adds (zeros at first) */
    double *step_counts;      /* [n_layer][E] host: choices routed to each expert by the training forwards since moe_stats_reset */
    int recomputing;          /* set inside a backward's recompute: no statistics, same routing */
    int *counts;              /* [n_layer][E] host: choices routed to each expert by the layer's last forward */
    int *kept;                /* [n_layer][E] host: rows each expert computed (counts within the capacity) */
    int *idx_host, *src_host, *slot_host; /* [N k] host scratch */
    int *fill;                /* [2E] host scratch: each expert's next row and first row (the routing's layout) */
    double *stats;            /* [2E] host: a layer's counts and summed probabilities (all-reduced over cp) */
    double *f;                /* [n_layer][E] host: each layer's share of the micro-batch's choices per expert */
    float *psum_host;         /* [E] host */
    /* backend scratch */
    float *logits, *dlogits;  /* [N, E] */
    float *xp;                /* [Nk, C] [a]: the tokens' rows for their experts */
    float *dxp, *dyp;         /* [Nk, C] (fp32) */
    float *dh;                /* [max(Nk 2Fe, N 2Fs)] [a] */
    float *dwts;              /* [N, k] */
    float *dprob, *psum;      /* [E] */
    /* statistics of the training forwards since moe_stats_reset */
    double aux_sum, z_sum;    /* the balance losses' values (each averaged over MoE layers), summed over forwards */
    long forwards;
    long dropped, routed;     /* choices dropped by the capacity, and all of them */
    double *load;             /* [n_layer]: max over mean of each forward's expert counts, summed over forwards */
} ModelMoE;

/* FP8 linears (Model.fp8; train.compute_dtype fp8). */
typedef struct ModelFP8 {
    int on;                   /* the layers' linear products in FP8 (model_fp8) */
} ModelFP8;

typedef struct Model {
    ModelConfig cfg;
    int act_ckpt;             /* ACT_NONE | ACT_SELECTIVE | ACT_FULL */
    int recompute;            /* RC_* the backward recomputes: 0 (none), ModelMem.recompute (selective), RC_LAYER (full) */
    int head_rows;            /* LM head / cross-entropy rows at a time (ModelMem.head_rows, 0 resolved) */
    ModelOffload offload;
    int forward_only;         /* set by the caller around forwards no backward follows (no offload then) */
    float loss_scale;         /* set by the caller: the next backward's loss_scale. A forward with targets,
                               * not forward_only, with it set is a training forward: it runs the LM head's
                               * backward too, chunk by chunk (head_train in model.c); model_backward
                               * follows only such a forward, with the same loss_scale */
    float head_scale;         /* the loss_scale the last forward's LM-head backward took (0: none ran) */
    double loss_sum;          /* the last forward with targets: the sum of its losses (double) */
    long n_targets;           /* ... and how many of its targets ask for a loss (not CE_NO_TARGET) */
    int same_weights;         /* set by the caller: nothing wrote the weights since the last forward (the
                               * next micro-batch of a gradient accumulation), so backend copies derived
                               * from them (kernels.h weights_stable) still hold; the next forward clears it */
    int act_bytes;            /* bytes per element of the [a] buffers (kernels.h): ln1, atty, ln2, fch_act, lnf */
    ModelFP8 fp8;
    const Kernels *k;
    int B, T;                 /* micro-batch shape activations are sized for */
    int cur_B, cur_T;         /* shape of the last forward, which backward reuses */
    int hd, qkv_dim, fc_dim;  /* head dim, fused qkv rows, fc rows (F or 2F): LOCAL (per TP rank) */
    int nh, nkv, F, V;        /* LOCAL query and kv heads, hidden units, vocabulary rows (ModelTP) */
    ModelTP tp;               /* tensor and sequence parallelism */
    ModelComm comm;

    ParamSpec *specs;
    int n_specs;
    size_t n_params;          /* floats in the flat arrays (incl. chunk padding) */
    int n_chunks;
    size_t *chunk_offset, *chunk_size; /* [n_chunks] in floats */
    size_t n_real_params;     /* parameters a user counts (no padding) */

    float *params;            /* [n_params] backend memory (NULL when the trainer pools chunks) */
    float *grads;             /* [n_params] (likewise) */
    float *m, *v;             /* AdamW moments [n_params] */
    ModelPtrs p, g;           /* views of params and grads */
    /* where chunk c's working parameters / gradients start (default params /
     * grads + chunk_offset[c]); a chunk hook may repoint them (NULL: absent) */
    float **chunk_params, **chunk_grads;
    int *chunk_spec0;         /* [n_chunks + 1]: chunk c's specs are [chunk_spec0[c], chunk_spec0[c+1]) */

    /* activations (one allocation) */
    float *acts_mem;
    size_t acts_floats;
    float *encoded;           /* [N,C] embedding output = residual stream input */
    LayerActs *la;            /* [n_layer] */
    float *lnf, *lnf_mean, *lnf_rstd;   /* lnf is [a] */
    float *logits;            /* [R,V] [a] (local V; R = N, or head_rows) logits -> probs -> dlogits */
    int logits_row0;          /* after a forward without targets: logits holds rows [logits_row0, N) */
    int logits_end;           /* set by the caller (0: N): a forward without targets ends its rows there instead */
    float *losses;            /* [N] */
    /* backward scratch */
    float *dres;              /* [N,C] gradient of the residual stream */
    float *dres_a;            /* [N,C] [a]: dres as the norms' backward last wrote it, for the output
                               * projections' backward (dout_a); NULL under fp32 [a] and sequence parallelism */
    float *dbuf1;             /* [N, max(C, nh * hd)] */
    float *dbuf2;             /* [N, max(qkv_dim, fc_dim, C)] */
    float *dlnf;              /* [N,C] */
    int *tokens, *targets;    /* [N] backend memory */
    int eod_token;            /* set by the caller: the token that ends a document when documents matter
                               * (block_causal or reset_pos), -1 (model_build's) when they do not */
    const unsigned char *doc_ends; /* set by the caller for each forward, or NULL: host [N], 1 where a
                               * token ends its document (an indexed dataset's documents, used in
                               * place of eod_token) */
    int block_causal;         /* set by the caller: attention sees only the query's document
                               * (train.attention_mask block_causal; needs eod_token) */
    int reset_pos;            /* set by the caller: positions count from each document's first token
                               * (train.reset_position_ids; needs eod_token) */
    int *qstart;              /* [N] backend memory: each token's document's first position in its row
                               * (attention's qstart, kernels.h), computed from the tokens by every forward
                               * under block_causal */
    int *qstart_host;         /* [N] host memory: the same whenever eod_token >= 0 */
    int *pos;                 /* [N] backend memory: each token's position in its document (its row
                               * position less qstart; kernels.h's pos), computed by every forward under
                               * reset_pos */
    int *pos_host;            /* [N] host memory: the same whenever eod_token >= 0 */
    ModelCP cp;               /* context parallelism */
    ModelMoE moe;             /* mixture of experts */
} Model;

/* train.lm_head_chunk 0: the rows of N the LM head takes at a time so that
 * its logits ([rows, V] of act_bytes each; V this rank's vocabulary slice)
 * take at most HEAD_AUTO_BYTES: all N when they fit, else the fewest equal
 * chunks that do, rounded up to a multiple of 64 rows. */
#define HEAD_AUTO_BYTES ((size_t)2 << 30)
int model_head_rows_auto(int N, int V, int act_bytes);

/* Build the layout table and allocate params/grads/moments and activations
 * for micro-batch B x T. pad_multiple: every chunk is padded to a multiple
 * of it (sharding needs chunks divisible by the shard degree); 1 = none. */
void model_build(Model *m, const ModelConfig *cfg, const Kernels *k, int B, int T, int pad_multiple);
/* The same; alloc_moments = 0 leaves m and v NULL (a sharded optimizer
 * keeps its own state for the local shard only). */
void model_build_ex(Model *m, const ModelConfig *cfg, const Kernels *k, int B, int T, int pad_multiple, int alloc_moments);
/* The same for tensor-parallel rank tp_rank of tp: specs carry LOCAL shapes.
 * Set m->comm before a forward when tp > 1. */
void model_build_tp(Model *m, const ModelConfig *cfg, const Kernels *k, int B, int T, int pad_multiple, int alloc_moments,
                    int tp, int tp_rank, ModelMem mem);
/* Only the layout table and the activation size (acts_floats): no backend
 * memory, so `llmtrain check` can size a 70B model. Free with model_free. */
void model_plan_tp(Model *m, const ModelConfig *cfg, int B, int T, int pad_multiple, int tp, int tp_rank, ModelMem mem);
/* train.compute_dtype fp8: from now on the layers' linear products (QKV,
 * attention out, MLP up and down; forward and both backward products) run
 * with FP8 operands under recipe FP8_TENSORWISE, FP8_BLOCKWISE or
 * FP8_ROWWISE (fp8.h; Kernels.fp8_setup allocates the backend's room
 * now); -1: nothing (not fp8). Call after model_build_tp. Exit 2 when the
 * backend has no FP8 products. */
void model_fp8(Model *m, int recipe);
/* The sizes model_fp8 hands the backend's fp8_setup for N tokens a
 * micro-batch: the layers' linears' operands (llmtrain check sizes the
 * CUDA backend's FP8 buffers by them). */
Fp8Sizes model_fp8_sizes(const Model *m, int N);
void model_free(Model *m);
/* Only the layout table (specs, chunks, TP geometry) of TP rank tp_rank of
 * tp: nothing allocated on the backend. Free with model_free. */
void model_layout(Model *m, const ModelConfig *cfg, int pad_multiple, int tp, int tp_rank);
/* Elements of the GLOBAL tensor behind spec s (numel * tp when split). */
size_t model_global_numel(const Model *m, const ParamSpec *s);
/* Copy between the GLOBAL tensor (host, model_global_numel floats, the
 * tp = 1 layout) and this rank's local slice (host, s->numel floats):
 * to_global = 0 takes the slice, 1 writes it into its place in global. */
void model_tp_copy(const Model *m, const ParamSpec *s, float *global, float *local, int to_global);
/* Random init: N(0, std), residual output projections std/sqrt(2*n_layer),
 * biases 0, norm weights 1. Deterministic in seed, independent of layout. */
void model_init_random(Model *m, float std, uint64_t seed);
/* Look up a tensor by internal name; NULL if absent. */
const ParamSpec *model_find(const Model *m, const char *name);
/* Forward over a micro-batch (tokens/targets are host arrays of B*T).
 * Returns the mean loss over its targets, those not CE_NO_TARGET (kernels.h;
 * NaN if none), and leaves their sum and count in loss_sum and n_targets
 * (targets may be NULL: no loss;
 * then m->logits holds the logits of the last rows [logits_row0, B*T): all
 * of them, or the last head_rows; with logits_end > 0, the rows up to
 * logits_end). */
float model_forward(Model *m, const int *tokens, const int *targets);
/* The same for a smaller B x T (sampling runs B = 1, growing T; under
 * context parallelism T is even, the rows per sequence of a shorter
 * sequence's chunks). */
float model_forward_bt(Model *m, const int *tokens, const int *targets, int B, int T);
/* Rows [row, row + n) of the logits a forward without targets left (row
 * counted from logits_row0; local V each) as floats in host memory: the
 * [a] buffer widened when it is bf16. */
void model_logits_to_host(const Model *m, int row, int n, float *dst);
/* Backward of the last forward, a training forward (m->loss_scale set:
 * its LM head's backward ran with it); grads += d(loss_scale * sum of
 * losses)/dparams. Use loss_scale = 1/(total targets of the step, those
 * not CE_NO_TARGET) for a mean loss. */
void model_backward(Model *m, float loss_scale);
/* Training FLOPs per token: 6*params(matmuls) + attention, as in the README. */
double model_flops_per_token(const ModelConfig *cfg, int T);

#endif
