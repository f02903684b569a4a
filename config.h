/* config.h — the JSON job config: one schema table gives every key its
 * type, default, range and documentation; parsing, --set overrides,
 * unknown-key detection and `llmtrain keys` all come from that table. */
#ifndef LLMTRAIN_CONFIG_H
#define LLMTRAIN_CONFIG_H
#include <stddef.h>
#include <stdint.h>

enum { ARCH_GPT2 = 0, ARCH_LLAMA = 1 };

typedef struct ModelConfig {
    int arch;            /* ARCH_GPT2 | ARCH_LLAMA */
    int n_layer;
    int n_embd;
    int n_head;
    int n_kv_head;       /* GQA; == n_head for GPT-2 */
    int head_dim;        /* channels a head (model_config_finish: 0 -> n_embd / n_head) */
    int qk_norm;         /* Llama: RMSNorm of each q and k head before RoPE (Qwen3) */
    int ffn_hidden;      /* GPT-2: 4*n_embd; Llama: per Llama's rule unless set */
    int ffn_multiple_of; /* Llama's rule rounds ffn_hidden up to this */
    int vocab_size;
    int max_seq_len;
    float norm_eps;
    float rope_theta;
    int rope_scaling;    /* index of none|llama3|linear|yarn: ROPE_NONE | ROPE_LLAMA3 | ROPE_LINEAR | ROPE_YARN (kernels.h) */
    float rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_seq_len;
    float rope_beta_fast, rope_beta_slow, rope_attention_factor; /* yarn's */
    int rope_truncate;                                           /* yarn's */
    int tie_embeddings;  /* GPT-2 always tied */
    /* mixture of experts (moe.c; docs/moe.md): Llama's MLP replaced, in the
     * layers moe_layer() names, by moe_experts routed SwiGLU experts of
     * moe_ffn_hidden, moe_top_k a token, plus moe_shared_experts always-on
     * ones (one SwiGLU of moe_shared_experts * moe_ffn_hidden) */
    int moe_experts;     /* 0: a dense model */
    int moe_top_k;
    int moe_ffn_hidden;  /* 0 resolved: ffn_hidden */
    int moe_shared_experts;
    int moe_norm_topk;   /* the k weights divided by their sum (Mixtral; Qwen3-MoE's norm_topk_prob) */
    int moe_layer_freq;  /* MoE where (layer + 1) % moe_layer_freq == 0 (Qwen's decoder_sparse_step) */
    char moe_dense_layers[256]; /* ... but these layers, "0,1" (Qwen's mlp_only_layers) */
    int router_aux_set;  /* an imported config said router_aux_loss_coef (not a key) */
    float router_aux_loss_coef;
} ModelConfig;

/* The next layer index of a moe_dense_layers list ("0,1 5"), from *p
 * (moe.c): 1 with it in *v and *p past it, 0 at the list's end, -1 with *p
 * at what is not an index, or at what follows one but is no separator. */
int moe_dense_next(const char **p, long *v);
/* Whether layer l's MLP is a mixture of experts (moe.c). */
int moe_layer(const ModelConfig *m, int l);
/* MoE layers of the model. */
int moe_layer_count(const ModelConfig *m);

/* optim.lr_decay_style and optim.wsd_decay_style: the choices, in the order
 * of their int values */
#define LR_STYLES "cosine|linear|constant|inverse_sqrt|wsd"
enum { LR_COSINE, LR_LINEAR, LR_CONSTANT, LR_INVERSE_SQRT, LR_WSD };
#define WSD_STYLES "linear|cosine|exponential|minus_sqrt"
/* train.activation_checkpointing's modes (ACT_* in model.h, by index) and
 * train.recompute_modules' names (RC_* in model.h: bit i the i-th) */
#define ACT_CKPT_MODES "none|selective|full"
#define RECOMPUTE_MODULES "attention|norm|mlp_act"
enum { WSD_LINEAR, WSD_COSINE, WSD_EXPONENTIAL, WSD_MINUS_SQRT };
/* train.attention_mask, by index of "causal|block_causal" */
enum { ATT_MASK_CAUSAL, ATT_MASK_BLOCK_CAUSAL };

typedef struct Config {
    char path[1024];     /* job file, for messages */
    char description[512]; /* free text (`llmtrain check` prints it) */
    ModelConfig model;
    /* init */
    char init_from[1024];
    float init_std;
    uint64_t seed;
    /* data */
    char data_train[1024];
    char data_val[1024];
    char data_vocab[1024];
    char data_tokenizer[1024]; /* data.tokenizer: the HF tokenizer folder the shards came from (export copies its files) */
    int data_shuffle;
    int eod_token;       /* data.eod_token: the token that ends a document (-1: none) */
    /* train */
    int steps;
    int seq_len;
    int micro_batch;
    int global_batch;
    int rampup_start;     /* train.rampup_start_batch: the first steps' global batch (0: no ramp) */
    int rampup_increment; /* train.rampup_batch_increment */
    int rampup_samples;   /* train.rampup_samples: sequences over which the batch reaches global_batch */
    char device[16];
    char instance[64];   /* train.instance: what `llmtrain check` fits the job to (fit.c) */
    char gpu_mem[32];    /* train.gpu_mem: a GPU's memory, "40GiB" (fit.c) */
    int act_ckpt;        /* ACT_NONE | ACT_SELECTIVE | ACT_FULL (model.h), by index of none|selective|full */
    int recompute_modules; /* train.recompute_modules: RC_ATTENTION | RC_NORM | RC_MLP_ACT (model.h) */
    int lm_head_chunk;   /* token rows of the LM head + cross-entropy at a time (0: the micro-batch) */
    int act_offload;     /* train.activation_offload */
    int param_dtype;     /* 0 fp32, 1 bf16: precision of the working weights (master stays fp32) */
    char compute_dtype[8];    /* bf16|tf32|fp32|fp8: the CUDA backend's products and [a] buffers; fp8 the layers' linears */
    int fp8_recipe;           /* train.fp8_recipe: FP8_TENSORWISE | FP8_BLOCKWISE | FP8_ROWWISE (fp8.h), by index */
    int attention_mask;       /* ATT_MASK_CAUSAL | ATT_MASK_BLOCK_CAUSAL, by index of causal|block_causal */
    int eod_mask_loss;        /* train.eod_mask_loss: no loss on the prediction after data.eod_token */
    int reset_position_ids;   /* train.reset_position_ids: positions count from each document's first token */
    float moe_aux_loss_coef;  /* train.moe_aux_loss_coef (-1: the imported config's, else 0.01; config_moe_aux_coef) */
    float moe_z_loss_coef;    /* train.moe_z_loss_coef */
    float moe_capacity_factor; /* train.moe_capacity_factor (0: dropless) */
    float moe_bias_rate;      /* train.moe_bias_update_rate: aux-loss-free balancing (0: off) */
    char attention_kernel[8]; /* auto|cudnn|flash|gemm: the CUDA backend's attention */
    /* optim */
    float lr, min_lr;
    int warmup_steps, decay_steps;
    int lr_decay_style;  /* index of LR_STYLES: LR_COSINE ... LR_WSD */
    int wsd_decay_steps; /* wsd: length of the final decay */
    int wsd_decay_style; /* index of WSD_STYLES: WSD_LINEAR ... WSD_MINUS_SQRT */
    int override_schedule; /* optim.override_schedule: on resume, this job's schedule where the checkpoint's differs */
    float weight_decay;
    int decay_all;
    int stochastic_rounding; /* bf16 working weights rounded stochastically */
    float beta1, beta2, eps;
    float grad_clip;
    int max_nonfinite_steps;
    /* eval */
    int eval_every, eval_batches, sample_tokens;
    float sample_temperature;
    /* log */
    char log_dir[1024];
    char tensorboard_dir[1024]; /* log.tensorboard_dir: TensorBoard event files (tboard.c); "": off */
    int log_every;
    double peak_gflops;  /* 0: measure (CPU) / detect (GPU) */
    double peak_gbs;     /* log.peak_gbs: 0: the GPU's memory bandwidth (none on the CPU) */
    int profile_steps;   /* log.profile_steps: time the kernel table over this many steps (profile.c) */
    int log_param_norm;  /* log.param_norm: the master weights' L2 norm after every step */
    /* checkpoint */
    char ckpt_dir[1024];
    int ckpt_every;
    int ckpt_keep_last;
    double ckpt_every_minutes;
    double ckpt_lock_wait_s;
    int ckpt_async;
    char ckpt_durable_dir[1024];
    char ckpt_resume[1024];
    /* parallel */
    int tp;
    int cp; /* parallel.context: context-parallel degree (cp.c) */
    int ep; /* parallel.expert: expert-parallel degree (the all-to-all group, parallel.h) */
    int cp_mode; /* parallel.context_mode: CP_RING | CP_ALL_GATHER (cp.h), by index of ring|all_gather */
    int seq_parallel; /* parallel.sequence_parallel (needs tp > 1) */
    char strategy[32];
    int shard_degree;
    int reshard_after_forward; /* 0 auto (true for FULL_SHARD / HYBRID_SHARD), 1 true, 2 false */
    double timeout_s;
    double min_bus_gbps;
    int health_check;
    /* debug */
    char debug_dump[1024]; /* write step-0 logits, loss and grads here (tests) */

    char *json_text;     /* the effective config (after --set), for checkpoints */
    char *origin_json;   /* what export needs that the job does not say (init.h's origin record), for checkpoints; NULL: none */
} Config;

/* train.moe_aux_loss_coef resolved: the job's, else the imported config's,
 * else 0.01. */
float config_moe_aux_coef(const Config *c);

/* Parse job file + overrides ("a.b=value"; value parsed as JSON, else a
 * string). On any error: one line on stderr and exit(EXIT_USAGE). */
void config_load(Config *cfg, const char *path, int n_set, char **sets);
/* A checkpoint's stored config (JSON text): its model section only, read
 * and checked as a job's; the other keys keep their defaults (the job as it
 * was written, which a later binary may not take, does not make the
 * checkpoint unreadable). */
void config_load_string(Config *cfg, const char *json, const char *origin);
/* Fill derived model values (n_kv_head, ffn_hidden defaults) and validate
 * the model shape; `where` names the source for messages. */
void model_config_finish(ModelConfig *m, const char *where);
/* The range a job may give the key at path (e.g. "model.rope_scaling_factor"),
 * for readers of other files that fill the same field. */
void config_key_range(const char *path, double *lo, double *hi);
/* Every model.* key's default (a model section of {}). */
void config_model_defaults(ModelConfig *m);
/* Print every key, its type, default and description (README table). */
void config_print_keys(void);
/* True when the job (after --set) names this key explicitly. */
/* train.fp8_recipe (FP8_TENSORWISE ...: fp8.h) under train.compute_dtype
 * fp8, else -1 */
int config_fp8_recipe(const Config *cfg);
int config_has_key(const Config *cfg, const char *path);
/* init.from: adopt the model section of a Hugging Face config (or an
 * llmtrain checkpoint's manifest), the file src; an explicit job value that
 * disagrees is an error naming the key and src. */
void config_take_model(Config *cfg, const ModelConfig *hf, const char *src);
/* Put the resolved model section into json_text (checkpoints rebuild the
 * model from it, without the job file or init.from). */
void config_freeze_model(Config *cfg);
/* The mixture-of-experts rules that need the model init.from gave (before
 * config_freeze_model): a train.moe_* or model.moe_* key set for a dense
 * model, FP8 with experts: exit 2 with one line. */
void config_moe_check(const Config *cfg);
/* The first model key on which a and b differ ("model.n_layer 4 vs 2" into
 * out); returns 0 when they describe the same model. */
int config_model_diff(const ModelConfig *a, const ModelConfig *b, char *out, size_t n);
/* Every key's resolved value (defaults, --set, init.from's model section)
 * but `description`, one "path=value" line each in the key table's order,
 * values as JSON text: two ranks whose texts are equal train the same job.
 * The caller frees. */
char *config_canonical(const Config *cfg);
/* Every key's resolved value (defaults, --set, init.from's model section)
 * as a job file: nested JSON in the key table's order, less the keys that
 * do not apply to this job (config_key_applies), so it loads back as the
 * same job. The caller frees. */
char *config_resolved_json(const Config *cfg);
/* Whether a key applies to the job as configured: a key the job would
 * refuse to be given (a wsd key under cosine, say) does not. */
int config_key_applies(const Config *cfg, const char *path);
/* The first line on which two config_canonical texts differ, into out:
 * "path is A <a_name>, B <b_name>" ("train.steps is 1000 on rank 3, 500
 * on rank 0"), or, where the texts name different keys (builds of another
 * key table), "the key table differs: path_a <a_name> where path_b
 * <b_name>"; returns 0 when the texts are equal. */
int config_canonical_diff(const char *a, const char *b, const char *a_name, const char *b_name, char *out, size_t n);
void config_free(Config *cfg);
/* The name of choice idx of an enum's "a|b|c" choices, into buf. */
const char *config_enum_name(const char *choices, int idx, char *buf, size_t n);
/* The learning rate of the update of 0-based step s (README, Exact semantics). */
double config_lr_at(const Config *c, int s);
/* One line saying what the schedule does ("warmup 10, cosine 0.003 -> 0.0003 over steps 10..100"). */
void config_lr_text(const Config *c, char *buf, size_t n);
/* The global batch of a step that begins after `consumed` sequences of
 * the run: train.global_batch, or under a ramp rampup_start_batch + k x
 * rampup_batch_increment, k = floor(consumed x stages / rampup_samples)
 * (Megatron's rule, in integers), global_batch once consumed reaches
 * rampup_samples. Needs global_batch resolved (layout_check). */
int config_batch_at(const Config *c, uint64_t consumed);
/* The data cursor (sequences consumed) before step `step` of a run whose
 * step step0 began at cursor0: each step takes config_batch_at(cursor). */
uint64_t config_cursor_at(const Config *c, int step0, uint64_t cursor0, int step);
/* The keys that shape the LR and batch schedule, resolved (decay_steps 0
 * as train.steps, global_batch 0 as micro_batch x dp), as a JSON object
 * nested as a job's ({"optim": {...}, "train": {...}}): what a checkpoint
 * records it was trained with. The caller frees. */
char *config_schedule_json(const Config *c);
/* How c's schedule differs from a checkpoint's: ckpt is a schedule object
 * (config_schedule_json) or, from a checkpoint written before those,
 * the job config it stored, read with this build's defaults for the keys
 * it leaves out. Only what shapes the LR of c's style is compared
 * (train.steps only where it ends the decay, global_batch only under a
 * ramp). Returns the number of keys that differ; the first as "key: old
 * -> new (why)" into first, all as "key: old -> new, ..." into all. */
int config_schedule_diff(const char *ckpt, const Config *c, const char *origin, char *first, size_t n1, char *all, size_t n2);

#endif
