/* config.c — the job config. One table (KEYS) names every key with its
 * type, default, range and meaning; parsing, defaults, --set overrides,
 * unknown-key errors and `llmtrain keys` are all driven by it, so a key is
 * declared in exactly one place. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "config.h"
#include "fp8.h"
#include "kernels.h"
#include "model.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* K_SET: some of the names in choices, as a JSON array of strings or one
 * string of them separated by spaces or commas; stored as an int with bit i
 * set for the i-th choice (at least one) */
typedef enum { K_INT, K_U64, K_FLOAT, K_DOUBLE, K_BOOL, K_STR, K_ENUM, K_SET } KeyType;

typedef struct Key {
    const char *path;     /* "section.name" */
    KeyType type;
    size_t off;           /* offsetof(Config, field) */
    size_t size;          /* K_STR: buffer size */
    const char *def;      /* default, as JSON text */
    double lo, hi;        /* numeric range, inclusive */
    const char *choices;  /* K_ENUM: "a|b|c" (stored as index for int fields, else string); K_SET: the names */
    const char *doc;
} Key;

#define OFF(f) offsetof(Config, f)
#define STR(f) OFF(f), sizeof(((Config *)0)->f)
#define BIG 2147483647.0

static const Key KEYS[] = {
    {"description", K_STR, STR(description), "\"\"", 0, 0, NULL, "free text saying what the job is for (printed by `llmtrain check`; training ignores it)"},
    /* model */
    {"model.arch", K_ENUM, OFF(model.arch), 0, "\"gpt2\"", 0, 0, "gpt2|llama", "model family: GPT-2 (LayerNorm, GELU, learned positions, biases, tied embeddings) or Llama (RMSNorm, RoPE, SwiGLU, GQA)"},
    {"model.n_layer", K_INT, OFF(model.n_layer), 0, "12", 1, 4096, NULL, "transformer layers"},
    {"model.n_embd", K_INT, OFF(model.n_embd), 0, "768", 1, 1 << 20, NULL, "model width"},
    {"model.n_head", K_INT, OFF(model.n_head), 0, "12", 1, 4096, NULL, "attention heads (must divide n_embd unless head_dim is set)"},
    {"model.n_kv_head", K_INT, OFF(model.n_kv_head), 0, "0", 0, 4096, NULL, "key/value heads for grouped-query attention (0 = n_head; must divide n_head; GPT-2: n_head)"},
    {"model.head_dim", K_INT, OFF(model.head_dim), 0, "0", 0, 65536, NULL, "channels of one attention head (0 = n_embd/n_head, which n_head must then divide; Llama: any even value, as Qwen3's 128 at n_embd 1024 and 16 heads; GPT-2: n_embd/n_head)"},
    {"model.qk_norm", K_BOOL, OFF(model.qk_norm), 0, "false", 0, 0, NULL, "Llama: an RMSNorm (eps norm_eps) over each query head and each key head after the QKV product, before RoPE, its weight of head_dim shared by the heads (Qwen3's q_norm and k_norm); GPT-2: false"},
    {"model.ffn_hidden", K_INT, OFF(model.ffn_hidden), 0, "0", 0, 1 << 24, NULL, "MLP width (0 = GPT-2: 4*n_embd; Llama: ffn_multiple_of * ceil(8*n_embd/3 / ffn_multiple_of))"},
    {"model.ffn_multiple_of", K_INT, OFF(model.ffn_multiple_of), 0, "256", 1, 1 << 20, NULL, "Llama's rounding for the default ffn_hidden"},
    {"model.vocab_size", K_INT, OFF(model.vocab_size), 0, "50257", 2, BIG, NULL, "vocabulary size; every token id must be below it"},
    {"model.max_seq_len", K_INT, OFF(model.max_seq_len), 0, "1024", 1, 1 << 24, NULL, "longest sequence (GPT-2: rows of the position table)"},
    {"model.norm_eps", K_FLOAT, OFF(model.norm_eps), 0, "1e-5", 0, 1, NULL, "LayerNorm / RMSNorm epsilon"},
    {"model.rope_theta", K_FLOAT, OFF(model.rope_theta), 0, "10000", 1, 1e12, NULL, "RoPE base (Llama)"},
    {"model.rope_scaling", K_ENUM, OFF(model.rope_scaling), 0, "\"none\"", 0, 0, "none|llama3|linear|yarn", "RoPE frequency scaling (Llama): none; llama3, Llama 3.1's and 3.2's (Hugging Face rope_type \"llama3\"); linear, position interpolation (Megatron's --rotary-seq-len-interpolation-factor); or yarn, YaRN. Formulas in the notes below; each rope_* key after this one says which scalings read it"},
    {"model.rope_scaling_factor", K_FLOAT, OFF(model.rope_scaling_factor), 0, "8", 1, 1e6, NULL, "rope_scaling llama3: the low frequencies' divisor (Llama 3.1: 8, Llama 3.2: 32); linear: every frequency's (positions interpolated by this factor); yarn: the slow frequencies' divisor (the context to train at over the original); a linear or yarn job must set it"},
    {"model.rope_low_freq_factor", K_FLOAT, OFF(model.rope_low_freq_factor), 0, "1", 0, 1e6, NULL, "rope_scaling llama3: wavelengths above rope_original_max_seq_len / this are scaled"},
    {"model.rope_high_freq_factor", K_FLOAT, OFF(model.rope_high_freq_factor), 0, "4", 0, 1e6, NULL, "rope_scaling llama3: wavelengths below rope_original_max_seq_len / this are kept (must exceed rope_low_freq_factor)"},
    {"model.rope_original_max_seq_len", K_INT, OFF(model.rope_original_max_seq_len), 0, "8192", 1, 1 << 24, NULL, "rope_scaling llama3 and yarn: the context length the frequencies were trained for (a yarn job must set it)"},
    {"model.rope_beta_fast", K_FLOAT, OFF(model.rope_beta_fast), 0, "32", 1e-3, 1e6, NULL, "rope_scaling yarn: frequencies turning more than this many times over rope_original_max_seq_len are kept (must exceed rope_beta_slow)"},
    {"model.rope_beta_slow", K_FLOAT, OFF(model.rope_beta_slow), 0, "1", 1e-3, 1e6, NULL, "rope_scaling yarn: frequencies turning fewer than this many times over rope_original_max_seq_len are divided by rope_scaling_factor"},
    {"model.rope_attention_factor", K_FLOAT, OFF(model.rope_attention_factor), 0, "0", 0, 1e6, NULL, "rope_scaling yarn: the factor on RoPE's cos and sin, so on the attention logits squared (0 = YaRN's 0.1 ln(rope_scaling_factor) + 1)"},
    {"model.rope_truncate", K_BOOL, OFF(model.rope_truncate), 0, "true", 0, 0, NULL, "rope_scaling yarn: round the ramp's ends to whole frequency indices (Hugging Face's truncate; false for gpt-oss)"},
    {"model.tie_embeddings", K_BOOL, OFF(model.tie_embeddings), 0, "false", 0, 0, NULL, "share the token embedding with the LM head (GPT-2: always true)"},
    {"model.moe_experts", K_INT, OFF(model.moe_experts), 0, "0", 0, 65536, NULL, "routed experts of a mixture-of-experts MLP (0 = dense; Llama arch only; docs/moe.md)"},
    {"model.moe_top_k", K_INT, OFF(model.moe_top_k), 0, "2", 1, 65536, NULL, "experts each token is routed to (at most moe_experts)"},
    {"model.moe_ffn_hidden", K_INT, OFF(model.moe_ffn_hidden), 0, "0", 0, 1 << 24, NULL, "each expert's SwiGLU width (0 = ffn_hidden)"},
    {"model.moe_shared_experts", K_INT, OFF(model.moe_shared_experts), 0, "0", 0, 1024, NULL, "always-on experts every token passes through beside its routed ones (DeepSeek, Qwen2-MoE), one SwiGLU of moe_shared_experts * moe_ffn_hidden"},
    {"model.moe_norm_topk", K_BOOL, OFF(model.moe_norm_topk), 0, "true", 0, 0, NULL, "divide a token's top-k router probabilities by their sum (Mixtral: true; Qwen3-MoE's norm_topk_prob)"},
    {"model.moe_layer_freq", K_INT, OFF(model.moe_layer_freq), 0, "1", 1, 4096, NULL, "a layer l is MoE when (l + 1) % moe_layer_freq == 0 (Qwen's decoder_sparse_step); the others are dense with ffn_hidden"},
    {"model.moe_dense_layers", K_STR, STR(model.moe_dense_layers), "\"\"", 0, 0, NULL, "layers kept dense whatever moe_layer_freq says, as \"0,1\" (Qwen's mlp_only_layers; DeepSeek's first dense layers)"},
    /* init */
    {"init.from", K_STR, STR(init_from), "\"\"", 0, 0, NULL, "weights to start from: a Hugging Face folder (config.json + model.safetensors or its shards, F32, BF16 or F16) or an llmtrain checkpoint (a step folder or a checkpoint.dir: its weights only, new optimizer state, step 0); the model section then comes from it"},
    {"init.std", K_FLOAT, OFF(init_std), 0, "0.02", 0, 10, NULL, "std of the normal init; residual output projections use std/sqrt(2*n_layer)"},
    {"init.seed", K_U64, OFF(seed), 0, "1337", 0, 9007199254740991.0, NULL, "seed of the init and of data shuffling (at most 2^53 - 1: a JSON number above it is not an exact integer)"},
    /* data */
    {"data.train", K_STR, STR(data_train), "\"\"", 0, 0, NULL, "training data: token shards as a path or a glob (llm.c format, uint16 or uint32 tokens) or Megatron indexed datasets (a prefix, or its .bin or .idx; see Data), or a blend of them as weight-path pairs, \"0.7 web/*.bin 0.3 code/*.bin\" (see Data)"},
    {"data.val", K_STR, STR(data_val), "\"\"", 0, 0, NULL, "validation token shards, a path, glob or blend as data.train (empty: no validation loss)"},
    {"data.vocab", K_STR, STR(data_vocab), "\"\"", 0, 0, NULL, "token-to-bytes table for printing samples (llm.c tokenizer format; empty: print ids)"},
    {"data.tokenizer", K_STR, STR(data_tokenizer), "\"\"", 0, 0, NULL, "folder of the Hugging Face tokenizer the shards were made with (tokenizer.json, tokenizer_config.json, ...): checkpoints record its files for llmtrain export to copy (empty: init.from's, if it has any)"},
    {"data.shuffle", K_BOOL, OFF(data_shuffle), 0, "false", 0, 0, NULL, "visit sequences in a seeded random order per epoch instead of in file order"},
    {"data.eod_token", K_INT, OFF(eod_token), 0, "-1", -1, BIG, NULL, "the token that ends each document in the shards (GPT-2's endoftext is 50256, Llama 3's end_of_text 128001; -1 = none; must be below model.vocab_size): the document boundaries of train.attention_mask block_causal, train.eod_mask_loss and train.reset_position_ids; -1 with Megatron indexed datasets (named by prefix or .idx): their document index gives the boundaries"},
    /* train */
    {"train.steps", K_INT, OFF(steps), 0, "100", 0, BIG, NULL, "optimizer steps"},
    {"train.seq_len", K_INT, OFF(seq_len), 0, "0", 0, 1 << 24, NULL, "sequence length T (0 = model.max_seq_len)"},
    {"train.micro_batch", K_INT, OFF(micro_batch), 0, "4", 1, 1 << 20, NULL, "sequences per forward pass on one rank"},
    {"train.global_batch", K_INT, OFF(global_batch), 0, "0", 0, BIG, NULL, "sequences per optimizer step over all ranks (0 = micro_batch * dp); accumulation = global / (micro * dp)"},
    {"train.rampup_start_batch", K_INT, OFF(rampup_start), 0, "0", 0, BIG, NULL, "batch-size ramp-up (Megatron's --rampup-batch-size, first value): the global batch of the first steps, raised by rampup_batch_increment in equal stages until global_batch is reached after rampup_samples sequences (0 = no ramp; a multiple of micro_batch x dp below global_batch; see the notes below)"},
    {"train.rampup_batch_increment", K_INT, OFF(rampup_increment), 0, "0", 0, BIG, NULL, "batch-size ramp-up: sequences added at each stage (a multiple of micro_batch x dp that divides global_batch - rampup_start_batch)"},
    {"train.rampup_samples", K_INT, OFF(rampup_samples), 0, "0", 0, BIG, NULL, "batch-size ramp-up: sequences consumed over which the batch grows from rampup_start_batch to global_batch (the stages are equal shares of it)"},
    {"train.moe_aux_loss_coef", K_FLOAT, OFF(moe_aux_loss_coef), 0, "-1", -1, 1e6, NULL, "the load-balancing loss's coefficient, E * sum_e f_e P_e averaged over MoE layers (-1 = the imported config's router_aux_loss_coef, else 0.01; 0 = off; docs/moe.md)"},
    {"train.moe_z_loss_coef", K_FLOAT, OFF(moe_z_loss_coef), 0, "0", 0, 1e6, NULL, "the router z-loss's coefficient: mean over tokens of logsumexp(router logits)^2, averaged over MoE layers (0 = off)"},
    {"train.moe_capacity_factor", K_FLOAT, OFF(moe_capacity_factor), 0, "0", 0, 1e6, NULL, "each expert takes at most ceil(factor * tokens * top_k / experts) of a micro-batch's choices, first come first served, and drops the rest (counted; 0 = dropless)"},
    {"train.moe_bias_update_rate", K_FLOAT, OFF(moe_bias_rate), 0, "0", 0, 1e3, NULL, "aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to the router probabilities for the top-k choice only, moved after each step by this rate towards equal load, b_e += rate * sign(mean load - load_e) (0 = off; DeepSeek-V3: 0.001; saved with checkpoints)"},
    {"train.activation_checkpointing", K_ENUM, OFF(act_ckpt), 0, "\"none\"", 0, 0, ACT_CKPT_MODES, "recompute activations in the backward instead of keeping them: selective = what train.recompute_modules names, full = everything but each layer's output (one more forward per layer); the last layer is not recomputed (see the notes below)"},
    {"train.recompute_modules", K_SET, OFF(recompute_modules), 0, "[\"attention\"]", 0, 0, RECOMPUTE_MODULES, "activation_checkpointing selective: which saved activations of each layer the backward recomputes (Megatron's --recompute-modules): attention (its output and log-sum-exp), norm (both norms' outputs and statistics), mlp_act (the MLP's activation output); see the notes below"},
    {"train.activation_offload", K_BOOL, OFF(act_offload), 0, "false", 0, 0, NULL, "keep each layer's saved activations in host memory between its forward and its backward, the copies overlapping compute; the device holds 3 layers'; with activation_checkpointing full only the layer inputs move, as SMP's activation offloading (see the notes below)"},
    {"train.lm_head_chunk", K_INT, OFF(lm_head_chunk), 0, "0", 0, 1 << 30, NULL, "token rows the LM head and the cross-entropy process at a time, so logits exist for this many tokens only (nothing is recomputed); 0 = the whole micro-batch while its logits take at most 2 GiB per rank, else the fewest equal chunks (a multiple of 64 rows) that do"},
    {"train.param_dtype", K_ENUM, OFF(param_dtype), 0, "\"fp32\"", 0, 0, "fp32|bf16", "the working copy of the weights that forward and backward read: fp32, or rounded to bf16 precision from the fp32 master weights after every step (gradients, master weights and AdamW moments stay fp32; sharded, the weight all-gathers move bf16 words, half the bytes)"},
    {"train.compute_dtype", K_STR, STR(compute_dtype), "\"bf16\"", 0, 0, "bf16|tf32|fp32|fp8", "the CUDA backend's matrix products and the activations only they read: bf16 (fp32 accumulation; those activations and the logits bf16; norms, softmax, loss fp32), tf32 (TF32 tensor cores) or fp32 (none), all fp32 on the CPU; fp8: the layers' linears in FP8 (CUDA: sm_89+, rowwise and blockwise sm_90; docs/fp8.md)"},
    {"train.fp8_recipe", K_ENUM, OFF(fp8_recipe), 0, "\"tensorwise\"", 0, 0, FP8_RECIPES, "compute_dtype fp8: what each FP8 scale covers: tensorwise (a tensor), blockwise (1 x 128 blocks of activations and gradients along the product's contraction, 128 x 128 tiles of weights: DeepSeek-V3's) or rowwise (a row of each operand as read); the backends, GPUs and tp / cp: docs/fp8.md"},
    {"train.attention_mask", K_ENUM, OFF(attention_mask), 0, "\"causal\"", 0, 0, "causal|block_causal", "which earlier tokens a token attends to: causal (all of its sequence's) or block_causal (its own document's only, documents ending at data.eod_token: Llama 3's document masking); positions still count from the row's start unless train.reset_position_ids is set"},
    {"train.eod_mask_loss", K_BOOL, OFF(eod_mask_loss), 0, "false", 0, 0, NULL, "no loss on the prediction that follows data.eod_token (the next document's first token, which nothing before it predicts; Megatron's --eod-mask-loss); the step's loss and gradients are the mean over the targets that remain in the whole global batch, whatever its split into micro-batches and ranks"},
    {"train.reset_position_ids", K_BOOL, OFF(reset_position_ids), 0, "false", 0, 0, NULL, "positions count from each document's first token (the one after data.eod_token, or the row's first) instead of from the row's start: GPT-2's learned position rows and Llama's RoPE angles (Megatron's --reset-position-ids)"},
    {"train.attention_kernel", K_STR, STR(attention_kernel), "\"auto\"", 0, 0, "auto|cudnn|flash|gemm", "the CUDA backend's attention: cudnn (cuDNN's fused attention; shapes it declines take flash), flash (llmtrain's fused kernels, head dims 32/64/128; others take gemm), gemm (cuBLASLt GEMMs and softmax kernels) or auto (cudnn under compute_dtype bf16, else flash); the CPU backend has one attention"},
    {"train.device", K_STR, STR(device), "\"auto\"", 0, 0, "auto|cpu|cuda", "compute backend: auto (CUDA when every rank has a GPU of its own, else CPU), cpu or cuda (rank r takes device local_rank % GPUs)"},
    {"train.instance", K_STR, STR(instance), "\"\"", 0, 0, NULL, "the instance type the job is laid out for (ml.p4d.24xlarge, ml.p5.48xlarge...; docs/layouts.md has the table): `llmtrain check` fits the job to its GPU memory and fails a job that does not fit (training does not read it)"},
    {"train.gpu_mem", K_STR, STR(gpu_mem), "\"\"", 0, 0, NULL, "a GPU's memory for `llmtrain check` to fit the job to, as 40GiB, 80GB or 81559MiB (in place of train.instance's; training does not read it)"},
    /* optim */
    {"optim.lr", K_FLOAT, OFF(lr), 0, "6e-4", 0, 10, NULL, "peak learning rate"},
    {"optim.min_lr", K_FLOAT, OFF(min_lr), 0, "0", 0, 10, NULL, "learning rate at the end of the decay (inverse_sqrt: its floor; constant: unused)"},
    {"optim.warmup_steps", K_INT, OFF(warmup_steps), 0, "0", 0, BIG, NULL, "linear warmup steps"},
    {"optim.decay_steps", K_INT, OFF(decay_steps), 0, "0", 0, BIG, NULL, "step at which the decay reaches min_lr (0 = train.steps; constant and inverse_sqrt: unused)"},
    {"optim.lr_decay_style", K_ENUM, OFF(lr_decay_style), 0, "\"cosine\"", 0, 0, LR_STYLES, "the LR after the warmup (Megatron's --lr-decay-style): cosine or linear from lr to min_lr at decay_steps; constant; inverse_sqrt; wsd (warmup-stable-decay), lr until the last wsd_decay_steps before decay_steps, then down to min_lr (formulas under Exact semantics)"},
    {"optim.wsd_decay_steps", K_INT, OFF(wsd_decay_steps), 0, "0", 0, BIG, NULL, "lr_decay_style wsd: steps of the final decay, which ends at decay_steps (Megatron's --lr-wsd-decay-iters; required, at most decay_steps - warmup_steps)"},
    {"optim.wsd_decay_style", K_ENUM, OFF(wsd_decay_style), 0, "\"linear\"", 0, 0, WSD_STYLES, "lr_decay_style wsd: the final decay's shape, from lr to min_lr: linear, cosine, exponential (2 * 0.5^q - 1 of the way) or minus_sqrt (1 - sqrt(q)), q the fraction of the decay done (Megatron's --lr-wsd-decay-style)"},
    {"optim.override_schedule", K_BOOL, OFF(override_schedule), 0, "false", 0, 0, NULL, "on resume, take this job's LR and batch schedule where it differs from the one the checkpoint was trained with (Megatron's --override-opt_param-scheduler), and say so in the header; false: such a difference is exit 2 naming the key, its old and new value (extending train.steps where it ends the decay is one; the keys compared: docs/checkpoints.md, A changed schedule)"},
    {"optim.weight_decay", K_FLOAT, OFF(weight_decay), 0, "0.1", 0, 10, NULL, "AdamW decoupled weight decay"},
    {"optim.decay_all", K_BOOL, OFF(decay_all), 0, "false", 0, 0, NULL, "decay every parameter (Llama 2 recipe) instead of 2-D weights only"},
    {"optim.beta1", K_FLOAT, OFF(beta1), 0, "0.9", 0, 0.999999, NULL, "AdamW beta1"},
    {"optim.beta2", K_FLOAT, OFF(beta2), 0, "0.95", 0, 0.999999, NULL, "AdamW beta2"},
    {"optim.eps", K_FLOAT, OFF(eps), 0, "1e-8", 0, 1, NULL, "AdamW epsilon"},
    {"optim.stochastic_rounding", K_BOOL, OFF(stochastic_rounding), 0, "false", 0, 0, NULL, "with train.param_dtype bf16: round the master weights to the working copy stochastically (unbiased; the draws are a fixed function of init.seed, the step and the element) instead of to nearest"},
    {"optim.grad_clip", K_FLOAT, OFF(grad_clip), 0, "1.0", 0, 1e30, NULL, "clip the global gradient norm to this (0 = off)"},
    {"optim.max_nonfinite_steps", K_INT, OFF(max_nonfinite_steps), 0, "5", 1, BIG, NULL, "consecutive steps with non-finite loss or gradients before the job exits with code 4"},
    /* eval */
    {"eval.every_steps", K_INT, OFF(eval_every), 0, "0", 0, BIG, NULL, "validation loss and a sample every this many steps, and at the end (0 = only at the end); nothing runs when there is no validation data (or `eval.batches` 0) and `eval.sample_tokens` is 0"},
    {"eval.batches", K_INT, OFF(eval_batches), 0, "4", 0, BIG, NULL, "micro-batches of validation data per evaluation, in total (split across data-parallel ranks, so the value does not depend on the layout)"},
    {"eval.sample_tokens", K_INT, OFF(sample_tokens), 0, "64", 0, 1 << 20, NULL, "tokens to generate for the printed sample (0 = none)"},
    {"eval.temperature", K_FLOAT, OFF(sample_temperature), 0, "1.0", 0, 100, NULL, "sampling temperature (0 = greedy)"},
    /* log */
    {"log.dir", K_STR, STR(log_dir), "\"\"", 0, 0, NULL, "where metrics.jsonl goes (empty: runs/<job file name>)"},
    {"log.tensorboard_dir", K_STR, STR(tensorboard_dir), "\"\"", 0, 0, NULL, "folder for a TensorBoard event file of the step lines' scalars (train/, perf/, memory/, val/ tags; rank 0 writes events.out.tfevents.<unix seconds>.<host>.<pid>, a new file per start; view with tensorboard --logdir; empty: off; see TensorBoard)"},
    {"log.every_steps", K_INT, OFF(log_every), 0, "1", 1, BIG, NULL, "print a step line every this many steps"},
    {"log.profile_steps", K_INT, OFF(profile_steps), 0, "0", 0, BIG, NULL, "time every kernel-table call of this many training steps (from the run's second) on the backend's own clock, then print where the time went per entry (products' and attention's TFLOP/s, memory-bound entries' GB/s) and write <log.dir>/profile.json (0 = off; see Profiling)"},
    {"log.param_norm", K_BOOL, OFF(log_param_norm), 0, "true", 0, 0, NULL, "log the L2 norm of the fp32 master weights after every step (pnorm on the step line, param_norm in metrics.jsonl), as the Llama 2 recipe monitors it and Megatron's --log-params-norm; AdamW sums it as it writes the weights, plus one all-reduce of one number a step"},
    {"log.peak_gflops", K_DOUBLE, OFF(peak_gflops), 0, "0", 0, 1e12, NULL, "peak GFLOP/s used for MFU (0 = measure sgemm on the CPU)"},
    {"log.peak_gbs", K_DOUBLE, OFF(peak_gbs), 0, "0", 0, 1e12, NULL, "peak memory bandwidth in GB/s that log.profile_steps' table holds the memory-bound entries against (0 = on CUDA the device's, from its memory clock and bus width; on the CPU none)"},
    /* checkpoint */
    {"checkpoint.dir", K_STR, STR(ckpt_dir), "\"\"", 0, 0, NULL, "checkpoint root, one folder per step (empty: <log.dir>/checkpoints)"},
    {"checkpoint.every_steps", K_INT, OFF(ckpt_every), 0, "0", 0, BIG, NULL, "write a checkpoint every this many steps (0 = only at the end)"},
    {"checkpoint.keep_last", K_INT, OFF(ckpt_keep_last), 0, "0", 0, BIG, NULL, "keep only the newest this many checkpoints (0 = keep all); the oldest goes only after a newer one is complete, or, on a full disk, to make room for it"},
    {"checkpoint.every_minutes", K_DOUBLE, OFF(ckpt_every_minutes), 0, "0", 0, 1e9, NULL, "also write a checkpoint when this many minutes have passed since the last one (0 = off)"},
    {"checkpoint.lock_wait_s", K_DOUBLE, OFF(ckpt_lock_wait_s), 0, "60", 0, 86400, NULL, "how long a job waits for another job that holds checkpoint.dir or durable_dir (a stopping job writing its last checkpoint) before it exits 2 naming the holder"},
    {"checkpoint.async", K_BOOL, OFF(ckpt_async), 0, "true", 0, 0, NULL, "write in a background thread; training blocks only while the state is copied to host memory"},
    {"checkpoint.durable_dir", K_STR, STR(ckpt_durable_dir), "\"\"", 0, 0, NULL, "second copy of every checkpoint, made in the background after the local one is complete (SageMaker: /opt/ml/checkpoints; empty = none)"},
    {"checkpoint.resume", K_STR, STR(ckpt_resume), "\"auto\"", 0, 0, NULL, "auto: newest complete checkpoint in checkpoint.dir, else in durable_dir (exit 2 when every one there fails verification); none: start at step 0; or a checkpoint folder / root to resume from"},
    /* parallel */
    {"parallel.tensor", K_INT, OFF(tp), 0, "1", 1, 1024, NULL, "tensor-parallel degree (Megatron-style, tp innermost; must divide the ranks, n_kv_head, ffn_hidden and vocab_size)"},
    {"parallel.sequence_parallel", K_BOOL, OFF(seq_parallel), 0, "false", 0, 0, NULL, "Megatron's sequence parallelism (needs parallel.tensor > 1): the residual stream and the norms are split over the TP group by rows, its all-reduces become all-gathers and reduce-scatters; those activations take 1/tp of the memory, same results up to the norms' weight-gradient sum order"},
    {"parallel.context", K_INT, OFF(cp), 0, "1", 1, 1024, NULL, "context-parallel degree cp: each sequence is cut into 2 cp chunks, context rank r holding chunks r and 2cp-1-r, attention runs over the cp ranks (world = tp x cp x dp, tp innermost, then cp; seq_len divisible by 2 cp; gradients and sharding over dp x cp); CPU and CUDA"},
    {"parallel.expert", K_INT, OFF(ep), 0, "1", 1, 1024, NULL, "expert-parallel degree ep: the data-parallel x context ranks of one tp_rank split into expert groups of ep consecutive indices (innermost, so a group stays inside a node), whose ranks exchange tokens by all-to-all; must divide dp x cp"},
    {"parallel.context_mode", K_ENUM, OFF(cp_mode), 0, "\"ring\"", 0, 0, "ring|all_gather", "how attention reaches the other context ranks' keys and values (parallel.context > 1): ring, each rank's key/value block passed round the group, then their gradients in the backward; all_gather, every block gathered at once and their gradients reduce-scattered (cp blocks held)"},
    {"parallel.strategy", K_STR, STR(strategy), "\"NO_SHARD\"", 0, 0, "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD|HYBRID_SHARD_ZERO2", "data-parallel sharding strategy (PyTorch FSDP names)"},
    {"parallel.shard_degree", K_INT, OFF(shard_degree), 0, "0", 0, 1 << 20, NULL, "ranks per shard group for the hybrid strategies (0 = all data-parallel ranks)"},
    {"parallel.reshard_after_forward", K_ENUM, OFF(reshard_after_forward), 0, "\"auto\"", 0, 0, "auto|true|false", "sharded strategies: free each layer chunk's gathered weights after its forward and gather them again for its backward (auto = true for FULL_SHARD and HYBRID_SHARD, false for SHARD_GRAD_OP and HYBRID_SHARD_ZERO2; a JSON boolean works too)"},
    {"parallel.timeout_s", K_DOUBLE, OFF(timeout_s), 0, "600", 0, 1e9, NULL, "a step or collective slower than this ends the job (exit 5)"},
    {"parallel.health_check", K_BOOL, OFF(health_check), 0, "true", 0, 0, NULL, "time an all-reduce on every process group at start and print its bus bandwidth"},
    {"parallel.min_bus_gbps", K_DOUBLE, OFF(min_bus_gbps), 0, "0", 0, 1e6, NULL, "fail at start (exit 7) when any group's measured all-reduce bus bandwidth is below this (GB/s)"},
    /* debug */
    {"debug.dump", K_STR, STR(debug_dump), "\"\"", 0, 0, NULL, "tests: write step-0 logits, loss, initial weights and gradients to this folder"},
};
#define NKEYS (int)(sizeof KEYS / sizeof KEYS[0])

static const char *type_name(KeyType t) {
    switch (t) {
    case K_INT: case K_U64: return "integer";
    case K_FLOAT: case K_DOUBLE: return "number";
    case K_BOOL: return "boolean";
    case K_SET: return "list of names";
    default: return "string";
    }
}

/* "a number", "an integer" */
static const char *type_article(KeyType t) { return t == K_INT || t == K_U64 ? "an" : "a"; }

static const Key *find_key(const char *path) {
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].path, path) == 0) return &KEYS[i];
    return NULL;
}

static int is_section(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < NKEYS; i++)
        if (strncmp(KEYS[i].path, path, n) == 0 && KEYS[i].path[n] == '.') return 1;
    return 0;
}

/* an unknown key, with the closest known one as "did you mean" */
static void die_unknown(const char *origin, const char *path) {
    const char *best = NULL;
    int bestd = 4;
    for (int i = 0; i < NKEYS; i++) {
        int dd = edit_distance(path, KEYS[i].path);
        if (dd < bestd) { bestd = dd; best = KEYS[i].path; }
    }
    if (best) die(EXIT_USAGE, "%s: unknown key '%s' (did you mean '%s'?)", origin, path, best);
    die(EXIT_USAGE, "%s: unknown key '%s' (see `llmtrain keys`)", origin, path);
}

/* Reject keys the table does not know, objects where a value belongs, a
 * key twice in one object (JSON parsers keep one of them: which is theirs
 * to pick) and dotted names (only --set takes those; in the file a key
 * is nested, and lookup would never find a dotted one). */
static void check_known(const cJSON *obj, const char *prefix, const char *origin) {
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[256];
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", it->string);
        for (const cJSON *before = obj->child; before != it; before = before->next)
            if (strcmp(before->string, it->string) == 0)
                die(EXIT_USAGE, "%s: duplicate key '%s' (expected each key once)", origin, path);
        if (strchr(it->string, '.'))
            die(EXIT_USAGE, "%s: key '%s': a dotted name is for --set (expected it nested: {\"%.*s\": {\"%s\": ...}})", origin,
                path, (int)(strchr(it->string, '.') - it->string), it->string, strchr(it->string, '.') + 1);
        if (cJSON_IsObject(it)) {
            const Key *k = find_key(path);
            if (k) die(EXIT_USAGE, "%s: %s: expected %s %s, got an object", origin, path, type_article(k->type), type_name(k->type));
            if (!is_section(path)) die_unknown(origin, path);
            check_known(it, path, origin);
        } else if (!find_key(path)) {
            if (is_section(path)) die(EXIT_USAGE, "%s: %s: expected an object of keys", origin, path);
            die_unknown(origin, path);
        }
    }
}

static const cJSON *lookup(const cJSON *root, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *node = root;
    for (char *save = NULL, *tok = strtok_r(buf, ".", &save); tok; tok = strtok_r(NULL, ".", &save)) {
        if (!cJSON_IsObject(node)) return NULL;
        node = cJSON_GetObjectItemCaseSensitive(node, tok);
        if (!node) return NULL;
    }
    return node;
}

static int enum_index(const char *choices, const char *s) {
    int idx = 0;
    const char *p = choices;
    size_t n = strlen(s);
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, s, n) == 0) return idx;
        if (!bar) break;
        p = bar + 1;
        idx++;
    }
    return -1;
}

/* K_SET names other tools spell their own way: Megatron's --recompute-modules
 * core_attn and layernorm are train.recompute_modules' attention and norm
 * (its mlp recomputes the whole MLP, products too: no alias) */
static const struct { const char *path, *alias, *name; } set_aliases[] = {
    {"train.recompute_modules", "core_attn", "attention"},
    {"train.recompute_modules", "layernorm", "norm"},
};

/* K_SET: the bit of one name or alias (die when choices lacks it) */
static int set_bit(const Key *k, const char *name, const char *got, const char *origin) {
    for (size_t i = 0; i < sizeof set_aliases / sizeof set_aliases[0]; i++)
        if (!strcmp(k->path, set_aliases[i].path) && !strcmp(name, set_aliases[i].alias)) name = set_aliases[i].name;
    int idx = enum_index(k->choices, name);
    if (idx < 0) die(EXIT_USAGE, "%s: %s: \"%s\" is not one of %s (got %s)", origin, k->path, name, k->choices, got);
    return 1 << idx;
}

/* Store one JSON value into the Config field of key k, checking type and range. */
static void store(Config *cfg, const Key *k, const cJSON *v, const char *origin) {
    char *field = (char *)cfg + k->off;
    char *shown = cJSON_PrintUnformatted(v);
    char got[96];
    snprintf(got, sizeof got, "%s", shown ? shown : "?");
    free(shown);
    if (k->type == K_ENUM && cJSON_IsBool(v) && enum_index(k->choices, "true") >= 0) { /* auto|true|false takes a boolean too */
        *(int *)field = enum_index(k->choices, cJSON_IsTrue(v) ? "true" : "false");
        return;
    }
    if (k->type == K_SET) {
        int set = 0;
        if (cJSON_IsString(v)) { /* "a b", "a,b" */
            char buf[256], *save = NULL;
            snprintf(buf, sizeof buf, "%s", v->valuestring);
            for (char *tok = strtok_r(buf, " ,\t", &save); tok; tok = strtok_r(NULL, " ,\t", &save))
                set |= set_bit(k, tok, got, origin);
        } else if (cJSON_IsArray(v)) {
            for (const cJSON *it = v->child; it; it = it->next) {
                if (!cJSON_IsString(it))
                    die(EXIT_USAGE, "%s: %s: expected a list of strings (names from %s), got %s", origin, k->path, k->choices, got);
                set |= set_bit(k, it->valuestring, got, origin);
            }
        } else {
            die(EXIT_USAGE, "%s: %s: expected a list of names from %s, got %s", origin, k->path, k->choices, got);
        }
        if (!set) die(EXIT_USAGE, "%s: %s: expected at least one of %s, got %s", origin, k->path, k->choices, got);
        *(int *)field = set;
        return;
    }
    if (k->type == K_STR || k->type == K_ENUM) {
        if (!cJSON_IsString(v)) die(EXIT_USAGE, "%s: %s: expected a string, got %s", origin, k->path, got);
        const char *s = v->valuestring;
        int idx = k->choices ? enum_index(k->choices, s) : 0;
        if (idx < 0) die(EXIT_USAGE, "%s: %s: expected one of %s, got \"%s\"", origin, k->path, k->choices, s);
        if (k->type == K_ENUM) { *(int *)field = idx; return; }
        if (strlen(s) >= k->size) die(EXIT_USAGE, "%s: %s: string longer than %zu bytes", origin, k->path, k->size - 1);
        memcpy(field, s, strlen(s) + 1);
        return;
    }
    if (k->type == K_BOOL) {
        if (!cJSON_IsBool(v)) die(EXIT_USAGE, "%s: %s: expected true or false, got %s", origin, k->path, got);
        *(int *)field = cJSON_IsTrue(v);
        return;
    }
    if (!cJSON_IsNumber(v)) die(EXIT_USAGE, "%s: %s: expected %s %s, got %s", origin, k->path, type_article(k->type), type_name(k->type), got);
    double x = v->valuedouble;
    if (!isfinite(x)) die(EXIT_USAGE, "%s: %s: expected a finite number, got %s", origin, k->path, got);
    if ((k->type == K_INT || k->type == K_U64) && x != floor(x))
        die(EXIT_USAGE, "%s: %s: expected an integer, got %s", origin, k->path, got);
    if (x < k->lo || x > k->hi) { /* an integer's bounds whole (1048576, not 1.04858e+06), and its value unless huge */
        int whole = k->type == K_INT || k->type == K_U64;
        if (whole && fabs(x) < 1e18) snprintf(got, sizeof got, "%.0f", x);
        die(EXIT_USAGE, whole ? "%s: %s: expected a value in [%.0f, %.0f], got %s" : "%s: %s: expected a value in [%g, %g], got %s",
            origin, k->path, k->lo, k->hi, got);
    }
    switch (k->type) {
    case K_INT: *(int *)field = (int)x; break;
    case K_U64: *(uint64_t *)field = (uint64_t)x; break;
    case K_FLOAT: *(float *)field = (float)x; break;
    case K_DOUBLE: *(double *)field = x; break;
    default: break;
    }
}

/* Apply "a.b=value": the value is JSON when it parses whole, else a plain
 * string (so "5abc" is not 5, and a blend "1 a.bin 2 b.bin" is a string). */
static void apply_set(cJSON *root, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg) die(EXIT_USAGE, "--set %s: expected key=value", arg);
    char path[256];
    size_t n = (size_t)(eq - arg);
    if (n >= sizeof path) die(EXIT_USAGE, "--set %s: key too long", arg);
    memcpy(path, arg, n);
    path[n] = '\0';
    if (!find_key(path)) die_unknown("--set", path);
    cJSON *val = cJSON_ParseWithOpts(eq + 1, NULL, 1);
    if (!val) val = cJSON_CreateString(eq + 1);
    cJSON *node = root;
    char *save = NULL;
    char *tok = strtok_r(path, ".", &save);
    for (;;) {
        char *next = strtok_r(NULL, ".", &save);
        if (!next) {
            if (cJSON_GetObjectItemCaseSensitive(node, tok)) cJSON_ReplaceItemInObjectCaseSensitive(node, tok, val);
            else cJSON_AddItemToObject(node, tok, val);
            return;
        }
        cJSON *child = cJSON_GetObjectItemCaseSensitive(node, tok);
        if (!child) child = cJSON_AddObjectToObject(node, tok);
        else if (!cJSON_IsObject(child)) die(EXIT_USAGE, "--set %s: %s is not a section", arg, tok);
        node = child;
        tok = next;
    }
}

void config_key_range(const char *path, double *lo, double *hi) {
    const Key *k = find_key(path);
    if (!k) die(EXIT_INTERNAL, "config_key_range: no key %s", path);
    *lo = k->lo;
    *hi = k->hi;
}

static void set_defaults(Config *cfg);

void config_model_defaults(ModelConfig *m) {
    Config tmp;
    memset(&tmp, 0, sizeof tmp);
    set_defaults(&tmp);
    *m = tmp.model;
}

/* A job's RoPE scaling numbers do something only with the scalings that
 * read them (a bit per ROPE_* kind): one set (not its default) without
 * them is an error, not silently unused. */
static const char *rope_scaling_name(int s) {
    static const char *names[] = {"none", "llama3", "linear", "yarn"};
    return names[s];
}

static void rope_scaling_unused(const ModelConfig *m, const char *where) {
    ModelConfig d;
    config_model_defaults(&d);
    enum { L3 = 1 << ROPE_LLAMA3, LIN = 1 << ROPE_LINEAR, YA = 1 << ROPE_YARN };
    const struct { const char *key; int set, readers; } keys[] = {
        {"rope_scaling_factor", m->rope_scaling_factor != d.rope_scaling_factor, L3 | LIN | YA},
        {"rope_low_freq_factor", m->rope_low_freq_factor != d.rope_low_freq_factor, L3},
        {"rope_high_freq_factor", m->rope_high_freq_factor != d.rope_high_freq_factor, L3},
        {"rope_original_max_seq_len", m->rope_original_max_seq_len != d.rope_original_max_seq_len, L3 | YA},
        {"rope_beta_fast", m->rope_beta_fast != d.rope_beta_fast, YA},
        {"rope_beta_slow", m->rope_beta_slow != d.rope_beta_slow, YA},
        {"rope_attention_factor", m->rope_attention_factor != d.rope_attention_factor, YA},
        {"rope_truncate", m->rope_truncate != d.rope_truncate, YA},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (!keys[i].set || (keys[i].readers >> m->rope_scaling & 1)) continue;
        char readers[64] = ""; /* "a", "a" or "b", "a", "b" or "c" */
        int left = __builtin_popcount((unsigned)keys[i].readers);
        for (int s = ROPE_LLAMA3; s <= ROPE_YARN; s++)
            if (keys[i].readers >> s & 1)
                snprintf(readers + strlen(readers), sizeof readers - strlen(readers), "%s\"%s\"",
                         !readers[0] ? "" : --left == 1 ? " or " : ", ", rope_scaling_name(s));
        die(EXIT_USAGE, "%s: model.%s is set but model.rope_scaling is \"%s\" (it applies only with %s)", where,
            keys[i].key, rope_scaling_name(m->rope_scaling), readers);
    }
}

static void moe_config_finish(ModelConfig *m, const char *where);

void model_config_finish(ModelConfig *m, const char *where) {
    if (m->rope_scaling && m->arch == ARCH_GPT2)
        die(EXIT_USAGE, "%s: model.rope_scaling \"%s\": GPT-2 has no RoPE (expected \"none\")", where,
            rope_scaling_name(m->rope_scaling));
    if (m->rope_scaling == ROPE_YARN && !(m->rope_beta_fast > m->rope_beta_slow))
        die(EXIT_USAGE, "%s: model.rope_beta_fast %g must exceed model.rope_beta_slow %g", where, m->rope_beta_fast,
            m->rope_beta_slow);
    if (m->rope_scaling == ROPE_LLAMA3) {
        if (!(m->rope_high_freq_factor > m->rope_low_freq_factor))
            die(EXIT_USAGE, "%s: model.rope_high_freq_factor %g must exceed model.rope_low_freq_factor %g", where,
                m->rope_high_freq_factor, m->rope_low_freq_factor);
    }
    if (m->head_dim == 0 && m->n_embd % m->n_head != 0)
        die(EXIT_USAGE, "%s: model.n_head %d does not divide model.n_embd %d (expected a divisor, or model.head_dim set)", where,
            m->n_head, m->n_embd);
    if (m->head_dim == 0) m->head_dim = m->n_embd / m->n_head;
    if (m->arch == ARCH_GPT2) {
        if (m->head_dim * m->n_head != m->n_embd)
            die(EXIT_USAGE, "%s: model.head_dim %d: GPT-2's heads split n_embd (expected n_embd/n_head, or 0)", where,
                m->head_dim);
        if (m->qk_norm) die(EXIT_USAGE, "%s: model.qk_norm true: GPT-2 has no QK-norm (expected false, or model.arch \"llama\")", where);
        if (m->n_kv_head != 0 && m->n_kv_head != m->n_head)
            die(EXIT_USAGE, "%s: model.n_kv_head %d: GPT-2 has no grouped-query attention (expected %d or 0)", where, m->n_kv_head, m->n_head);
        m->n_kv_head = m->n_head;
        if (m->ffn_hidden != 0 && m->ffn_hidden != 4 * m->n_embd)
            die(EXIT_USAGE, "%s: model.ffn_hidden %d: GPT-2's MLP is 4*n_embd = %d", where, m->ffn_hidden, 4 * m->n_embd);
        m->ffn_hidden = 4 * m->n_embd;
        m->tie_embeddings = 1;
    } else {
        if (m->n_kv_head == 0) m->n_kv_head = m->n_head;
        if (m->n_head % m->n_kv_head != 0)
            die(EXIT_USAGE, "%s: model.n_kv_head %d does not divide model.n_head %d", where, m->n_kv_head, m->n_head);
        if (m->head_dim % 2 != 0)
            die(EXIT_USAGE, "%s: model.head_dim %d (the head dimension) must be even for RoPE", where, m->head_dim);
        if (m->ffn_hidden == 0) {
            long h = (long)(8.0 * m->n_embd / 3.0);
            long mo = m->ffn_multiple_of > 0 ? m->ffn_multiple_of : 256;
            m->ffn_hidden = (int)(mo * ((h + mo - 1) / mo));
        }
    }
    moe_config_finish(m, where);
}

/* Whether moe_dense_layers is a list of layer indices below n_layer; else
 * 0 with *bad the offset of the first entry that is not */
static int moe_dense_valid(const ModelConfig *m, int *bad) {
    const char *p = m->moe_dense_layers, *at = p;
    long v;
    int r;
    for (; (r = moe_dense_next(&p, &v)) != 0; at = p) {
        while (*at == ' ' || *at == ',') at++;
        if (r < 0 || v < 0 || v >= m->n_layer) { *bad = (int)((r < 0 ? p : at) - m->moe_dense_layers); return 0; }
    }
    return 1;
}

float config_moe_aux_coef(const Config *c) {
    if (c->moe_aux_loss_coef >= 0) return c->moe_aux_loss_coef;
    return c->model.router_aux_set ? c->model.router_aux_loss_coef : 0.01f;
}

/* The mixture-of-experts keys' rules (model_config_finish). */
static void moe_config_finish(ModelConfig *m, const char *where) {
    if (m->moe_experts == 0) {
        static const char *const keys[] = {"moe_shared_experts", "moe_ffn_hidden"};
        int set[] = {m->moe_shared_experts, m->moe_ffn_hidden};
        for (int i = 0; i < 2; i++)
            if (set[i])
                die(EXIT_USAGE, "%s: model.%s %d is set but model.moe_experts is 0 (it applies only to a mixture of experts; "
                    "expected it unset, or model.moe_experts >= 2)", where, keys[i], set[i]);
        if (m->moe_dense_layers[0])
            die(EXIT_USAGE, "%s: model.moe_dense_layers \"%s\" is set but model.moe_experts is 0 (it applies only to a mixture of "
                "experts; expected it unset, or model.moe_experts >= 2)", where, m->moe_dense_layers);
        return;
    }
    if (m->arch != ARCH_LLAMA)
        die(EXIT_USAGE, "%s: model.moe_experts %d: mixture of experts needs model.arch \"llama\" (SwiGLU experts), not \"gpt2\"", where,
            m->moe_experts);
    if (m->moe_experts < 2) die(EXIT_USAGE, "%s: model.moe_experts %d: a mixture needs at least 2 experts (0 = dense)", where, m->moe_experts);
    if (m->moe_top_k > m->moe_experts)
        die(EXIT_USAGE, "%s: model.moe_top_k %d exceeds model.moe_experts %d (a token cannot choose more experts than there are)",
            where, m->moe_top_k, m->moe_experts);
    if (m->moe_ffn_hidden == 0) m->moe_ffn_hidden = m->ffn_hidden;
    int bad = 0;
    if (!moe_dense_valid(m, &bad))
        die(EXIT_USAGE, "%s: model.moe_dense_layers \"%s\": at character %d: expected layer indices below n_layer %d, as \"0,1\"",
            where, m->moe_dense_layers, bad + 1, m->n_layer);
    if (moe_layer_count(m) == 0)
        die(EXIT_USAGE, "%s: model.moe_experts %d but no layer is MoE (moe_layer_freq %d, moe_dense_layers \"%s\" over %d layers)",
            where, m->moe_experts, m->moe_layer_freq, m->moe_dense_layers, m->n_layer);
}

static void set_defaults(Config *cfg) {
    for (int i = 0; i < NKEYS; i++) {
        cJSON *v = cJSON_Parse(KEYS[i].def);
        store(cfg, &KEYS[i], v, "default");
        cJSON_Delete(v);
    }
}

/* The wsd keys apply only with lr_decay_style wsd, which needs a decay that
 * fits after the warmup. */
static void lr_schedule_check(const Config *cfg, const char *where, int decay_set) {
    char name[32];
    const char *style = config_enum_name(LR_STYLES, cfg->lr_decay_style, name, sizeof name);
    /* a warmup longer than the run, or than a decay that ends at train.steps */
    int decays = cfg->lr_decay_style != LR_CONSTANT && cfg->lr_decay_style != LR_INVERSE_SQRT;
    if (decays && !decay_set && cfg->warmup_steps > cfg->decay_steps)
        die(EXIT_USAGE, "%s: optim.warmup_steps %d exceeds train.steps %d, where the %s decay ends (optim.decay_steps 0): it would "
            "end before the warmup does (to run part of a longer schedule, set optim.decay_steps to its end)", where,
            cfg->warmup_steps, cfg->steps, style);
    if (!decays && cfg->warmup_steps > cfg->steps)
        die(EXIT_USAGE, "%s: optim.warmup_steps %d exceeds train.steps %d (the run would end before the warmup does)", where,
            cfg->warmup_steps, cfg->steps);
    if (cfg->lr_decay_style != LR_WSD) {
        const char *set = cfg->wsd_decay_steps ? "wsd_decay_steps" : cfg->wsd_decay_style != WSD_LINEAR ? "wsd_decay_style" : NULL;
        if (set)
            die(EXIT_USAGE, "%s: optim.%s is set but optim.lr_decay_style is \"%s\" (it applies only with \"wsd\")", where, set,
                style);
        /* a decay that ends before the warmup does (one set, not train.steps': a short run of a long schedule is fine) */
        if ((cfg->lr_decay_style == LR_COSINE || cfg->lr_decay_style == LR_LINEAR) && decay_set &&
            cfg->decay_steps < cfg->warmup_steps)
            die(EXIT_USAGE, "%s: optim.decay_steps %d is below optim.warmup_steps %d (the %s decay would end before the warmup "
                "does)", where, cfg->decay_steps, cfg->warmup_steps, style);
        return;
    }
    if (cfg->wsd_decay_steps == 0)
        die(EXIT_USAGE, "%s: optim.lr_decay_style \"wsd\" needs optim.wsd_decay_steps > 0 (the steps of the final decay; got 0)", where);
    if (cfg->wsd_decay_steps > cfg->decay_steps - cfg->warmup_steps)
        die(EXIT_USAGE, "%s: optim.wsd_decay_steps %d exceeds optim.decay_steps %d - optim.warmup_steps %d (the decay would begin "
            "before the warmup ends)", where, cfg->wsd_decay_steps, cfg->decay_steps, cfg->warmup_steps);
}

/* The ramp keys go together: a start batch, a step and a length. Their
 * divisibility by micro_batch x dp is checked with the layout. */
static void rampup_check(const Config *cfg, const char *where) {
    if (cfg->rampup_start == 0) {
        const char *set = cfg->rampup_increment ? "rampup_batch_increment" : cfg->rampup_samples ? "rampup_samples" : NULL;
        if (set)
            die(EXIT_USAGE, "%s: train.%s is set but train.rampup_start_batch is 0 (it applies only with a batch-size ramp-up)",
                where, set);
        return;
    }
    if (cfg->rampup_increment == 0 || cfg->rampup_samples == 0)
        die(EXIT_USAGE, "%s: train.rampup_start_batch %d needs train.%s > 0 (got 0)", where, cfg->rampup_start,
            cfg->rampup_increment == 0 ? "rampup_batch_increment" : "rampup_samples");
}

/* A micro-batch's tokens (micro_batch x seq_len, the activations' rows)
 * are an int, which the LM head's 64-row rounding and sequence
 * parallelism's padding to a multiple of parallel.tensor add to: at most
 * 2^30 leaves them room. from: where seq_len came from, for the message. */
#define MAX_MICRO_TOKENS (1LL << 30)
static void micro_tokens_check(const Config *cfg, const char *where, const char *from) {
    long long n = (long long)cfg->micro_batch * cfg->seq_len;
    if (n > MAX_MICRO_TOKENS)
        die(EXIT_USAGE, "%s: train.micro_batch %d x train.seq_len %d%s = %lld tokens a micro-batch exceeds %lld (2^30)", where,
            cfg->micro_batch, cfg->seq_len, from, n, MAX_MICRO_TOKENS);
}

/* Whether every path of a data pattern (a blend's too) names a Megatron
 * indexed dataset by its form alone: ending in .idx, or a prefix (no dot
 * in its last component). A .bin may be an llm.c shard, so it does not. */
static int names_indexed(const char *pattern) {
    int paths = 0;
    for (const char *w = pattern; *w;) {
        while (*w == ' ' || *w == '\t') w++;
        const char *e = w;
        while (*e && *e != ' ' && *e != '\t') e++;
        if (e == w) break;
        char *end;
        strtod(w, &end);
        if (end != e) { /* not a blend's weight */
            const char *slash = w, *dot = NULL;
            for (const char *q = w; q < e; q++) {
                if (*q == '/') slash = q + 1;
                if (*q == '.') dot = q;
            }
            int idx = e - w >= 4 && strncmp(e - 4, ".idx", 4) == 0;
            if (!idx && dot && dot >= slash) return 0;
            paths++;
        }
        w = e;
    }
    return paths > 0;
}

/* Fill values that default to other values, and check cross-key rules. */
static void finish(Config *cfg, const char *origin, const cJSON *root) {
    rope_scaling_unused(&cfg->model, origin);
    model_config_finish(&cfg->model, origin);
    if ((cfg->model.rope_scaling == ROPE_LINEAR || cfg->model.rope_scaling == ROPE_YARN) && root &&
        !lookup(root, "model.rope_scaling_factor"))
        die(EXIT_USAGE, "%s: model.rope_scaling \"%s\" needs model.rope_scaling_factor (the %s factor: the "
            "context to train at over the one the model was trained at; its default is llama3's)", origin,
            rope_scaling_name(cfg->model.rope_scaling), cfg->model.rope_scaling == ROPE_LINEAR ? "interpolation" : "extension");
    if (cfg->model.rope_scaling == ROPE_YARN && root && !lookup(root, "model.rope_original_max_seq_len"))
        die(EXIT_USAGE, "%s: model.rope_scaling \"yarn\" needs model.rope_original_max_seq_len (the context the model was "
            "trained at; its default is llama3's)", origin);
    if (cfg->seq_len == 0) cfg->seq_len = cfg->model.max_seq_len;
    if (cfg->seq_len > cfg->model.max_seq_len)
        die(EXIT_USAGE, "%s: train.seq_len %d exceeds model.max_seq_len %d", origin, cfg->seq_len, cfg->model.max_seq_len);
    micro_tokens_check(cfg, origin, "");
    int decay_set = cfg->decay_steps != 0; /* not train.steps' */
    if (cfg->decay_steps == 0) cfg->decay_steps = cfg->steps;
    if (cfg->stochastic_rounding && cfg->param_dtype != 1)
        die(EXIT_USAGE, "%s: optim.stochastic_rounding needs train.param_dtype \"bf16\" (it rounds the bf16 working weights)", origin);
    if (cfg->min_lr > cfg->lr) die(EXIT_USAGE, "%s: optim.min_lr %g exceeds optim.lr %g", origin, cfg->min_lr, cfg->lr);
    lr_schedule_check(cfg, origin, decay_set);
    if (!cfg->ckpt_resume[0])
        die(EXIT_USAGE, "%s: checkpoint.resume: expected auto, none or a checkpoint folder or root, got \"\"", origin);
    rampup_check(cfg, origin);
    if (cfg->act_ckpt != ACT_SELECTIVE && root && lookup(root, "train.recompute_modules")) {
        char name[32];
        die(EXIT_USAGE, "%s: train.recompute_modules is set but train.activation_checkpointing is \"%s\" (it applies only with "
            "\"selective\")", origin, config_enum_name(ACT_CKPT_MODES, cfg->act_ckpt, name, sizeof name));
    }
    if (strcmp(cfg->compute_dtype, "fp8") != 0 && root && lookup(root, "train.fp8_recipe"))
        die(EXIT_USAGE, "%s: train.fp8_recipe is set but train.compute_dtype is \"%s\" (it applies only with \"fp8\")", origin,
            cfg->compute_dtype);
    /* without an end token the documents come from an indexed dataset's
     * index: named by its prefix or .idx, it is checked when opened */
    int indexed = names_indexed(cfg->data_train) && (!cfg->data_val[0] || names_indexed(cfg->data_val));
    const char *needs = "needs data.eod_token (the token that ends a document; got -1), or data.train and data.val "
                        "naming Megatron indexed datasets by prefix or .idx";
    if (cfg->attention_mask == ATT_MASK_BLOCK_CAUSAL && cfg->eod_token < 0 && !indexed)
        die(EXIT_USAGE, "%s: train.attention_mask \"block_causal\" %s", origin, needs);
    if (cfg->eod_mask_loss && cfg->eod_token < 0 && !indexed)
        die(EXIT_USAGE, "%s: train.eod_mask_loss %s", origin, needs);
    if (cfg->reset_position_ids && cfg->eod_token < 0 && !indexed)
        die(EXIT_USAGE, "%s: train.reset_position_ids %s", origin, needs);
    if (cfg->attention_mask != ATT_MASK_BLOCK_CAUSAL && !cfg->eod_mask_loss && !cfg->reset_position_ids && cfg->eod_token >= 0)
        die(EXIT_USAGE,
            "%s: data.eod_token is set but unused (it applies with train.attention_mask \"block_causal\", train.eod_mask_loss "
            "true or train.reset_position_ids true; got \"causal\", false and false)",
            origin);
    /* keys that cannot apply to the job as written are errors, not silently unused */
    const cJSON *tie = root ? lookup(root, "model.tie_embeddings") : NULL;
    if (cfg->model.arch == ARCH_GPT2 && !cfg->init_from[0] && cJSON_IsFalse(tie)) /* init.from: its config.json decides */
        die(EXIT_USAGE, "%s: model.tie_embeddings false: GPT-2's token embedding is always the LM head (expected true or unset, "
            "or model.arch \"llama\")", origin);
    if (cfg->shard_degree != 0 && strncmp(cfg->strategy, "HYBRID_SHARD", 12) != 0)
        die(EXIT_USAGE, "%s: parallel.shard_degree is set but parallel.strategy is \"%s\" (it applies only with HYBRID_SHARD or "
            "HYBRID_SHARD_ZERO2)", origin, cfg->strategy);
    if (cfg->min_bus_gbps > 0 && !cfg->health_check)
        die(EXIT_USAGE, "%s: parallel.min_bus_gbps is set but parallel.health_check is false (it applies only to the health "
            "check's measurement)", origin);
    if (cfg->global_batch != 0 && cfg->global_batch % cfg->micro_batch != 0)
        die(EXIT_USAGE, "%s: train.global_batch %d is not a multiple of train.micro_batch %d", origin, cfg->global_batch, cfg->micro_batch);
    if (!cfg->data_train[0] && !lookup(root, "data.train"))
        die(EXIT_USAGE, "%s: data.train: required (a path or glob of token shards)", origin);
    if (!cfg->log_dir[0]) {
        const char *base = strrchr(origin, '/');
        base = base ? base + 1 : origin;
        char name[256];
        snprintf(name, sizeof name, "%s", base);
        char *dot = strrchr(name, '.');
        if (dot && dot != name) *dot = '\0';
        snprintf(cfg->log_dir, sizeof cfg->log_dir, "runs/%s", name);
    }
    if (!cfg->ckpt_dir[0]) {
        if (strlen(cfg->log_dir) + 13 >= sizeof cfg->ckpt_dir) die(EXIT_USAGE, "%s: log.dir too long", origin);
        snprintf(cfg->ckpt_dir, sizeof cfg->ckpt_dir, "%.1000s/checkpoints", cfg->log_dir);
    }
}

/* The defaults, then root's values of the keys whose path starts with
 * `only` (NULL: every key), each checked alone */
static void load_values(Config *cfg, const cJSON *root, const char *origin, const char *only) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->path, sizeof cfg->path, "%s", origin);
    set_defaults(cfg);
    check_known(root, "", origin);
    for (int i = 0; i < NKEYS; i++) {
        const cJSON *v = !only || strncmp(KEYS[i].path, only, strlen(only)) == 0 ? lookup(root, KEYS[i].path) : NULL;
        if (v) store(cfg, &KEYS[i], v, origin);
    }
}

static void load_tree(Config *cfg, cJSON *root, const char *origin) {
    load_values(cfg, root, origin, NULL);
    finish(cfg, origin, root);
    cfg->json_text = cJSON_PrintUnformatted(root);
}

/* Where the JSON parser stopped, as line:column, for the error message. */
static void parse_position(const char *text, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *p = text; p < at && *p; p++) {
        if (*p == '\n') { (*line)++; *col = 1; } else (*col)++;
    }
}

/* A text that is no JSON at all, by its first line that is not blank or a
 * # comment: TOML (`[section]`, `key = value`) or YAML (`key: value`,
 * `- item`, `---`); its name and that line into why, *at that line. */
static int not_json(const char *text, const char *e, char *why, size_t n, const char **at) {
    for (const char *l = text; l < e;) {
        const char *eol = memchr(l, '\n', (size_t)(e - l));
        if (!eol) eol = e;
        while (l < eol && isspace((unsigned char)*l)) l++;
        const char *r = eol;
        while (r > l && isspace((unsigned char)r[-1])) r--;
        if (l == r || *l == '#') { l = eol + 1; continue; }
        const char *k = l;
        while (k < r && (isalnum((unsigned char)*k) || strchr("_-.\"'", *k))) k++;
        const char *v = k;
        while (v < r && (*v == ' ' || *v == '\t')) v++;
        const char *kind = NULL;
        if (*l == '[' && r[-1] == ']' && r - l > 2) kind = "TOML: a [section] header";
        else if (k > l && v < r && *v == '=') kind = "TOML: key = value";
        else if (r - l >= 3 && !strncmp(l, "---", 3)) kind = "YAML: a --- document start";
        else if (k > l && v < r && *v == ':' && (v + 1 == r || v[1] == ' ' || v[1] == '\t')) kind = "YAML: key: value";
        else if (*l == '-' && r - l > 1 && l[1] == ' ') kind = "YAML: a - list item";
        if (!kind) return 0;
        snprintf(why, n, "not JSON: this looks like %s (%.*s%s)", kind, (int)(r - l > 40 ? 40 : r - l), l, r - l > 40 ? "..." : "");
        *at = l;
        return 1;
    }
    return 0;
}

/* What in a job file's text is not strict JSON, at or before err (where
 * the parser stopped): a // or block comment, a # comment, a trailing comma,
 * a key without double quotes or a single-quoted string, outside strings;
 * or a text that is no JSON at all. Its name into why and *at its place;
 * 0 when none of these explains the error. */
static int json_mistake(const char *text, size_t len, const char *err, char *why, size_t n, const char **at) {
    const char *e = text + len, *p = text;
    while (p < e && isspace((unsigned char)*p)) p++;
    if (p < e && *p != '{' && not_json(text, e, why, n, at)) return 1;
    if (p == e) {
        snprintf(why, n, "not JSON: the file is empty");
        *at = text;
        return 1;
    }
    char stack[64]; /* the open brackets */
    int depth = 0;
    for (; p < e && p <= err; p++) {
        const char *what = NULL;
        if (*p == '"') { /* a string: to its closing quote */
            for (p++; p < e && *p != '"'; p++)
                if (*p == '\\' && p + 1 < e) p++;
            if (p >= e) break;
            continue;
        }
        const char *q = p + 1; /* the next token */
        while (q < e && isspace((unsigned char)*q)) q++;
        if ((*p == '{' || *p == '[') && depth < 64) stack[depth++] = *p;
        else if ((*p == '}' || *p == ']') && depth > 0) depth--;
        if (*p == '/' && p + 1 < e && p[1] == '/') what = "a // comment";
        else if (*p == '/' && p + 1 < e && p[1] == '*') what = "a /* */ comment";
        else if (*p == '#') what = "a # comment";
        else if (*p == '\'') what = "a single-quoted string (JSON strings take double quotes)";
        else if (*p == ',' && q < e && (*q == '}' || *q == ']')) what = *q == '}' ? "a trailing comma before '}'" : "a trailing comma before ']'";
        else if ((*p == '{' || (*p == ',' && depth > 0 && stack[depth - 1] == '{')) && q < e && (isalpha((unsigned char)*q) || *q == '_'))
            what = "a key without double quotes", p = q;
        if (what) {
            snprintf(why, n, "%s", what);
            *at = p;
            return 1;
        }
    }
    return 0;
}

void config_load(Config *cfg, const char *path, int n_set, char **sets) {
    size_t len;
    char *text = read_text_file(path, &len);
    if (!text) die(EXIT_USAGE, "%s: cannot read job file (%s)", path, read_text_why());
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int line, col;
    if (!root) { /* what was found, where */
        const char *at = cJSON_GetErrorPtr();
        char why[160];
        int named = json_mistake(text, len, at, why, sizeof why, &at);
        parse_position(text, at, &line, &col);
        int plain = named && strncmp(why, "not JSON", 8) == 0;
        die(EXIT_USAGE, "%s:%d:%d: %s%s%s (a job file is strict JSON: one object, no comments, no trailing commas)", path, line, col,
            plain ? "" : "malformed JSON", named && !plain ? ": " : "", named ? why : "");
    }
    while (end < text + len && isspace((unsigned char)*end)) end++;
    if (end < text + len) {
        parse_position(text, end, &line, &col);
        die(EXIT_USAGE, "%s:%d:%d: malformed JSON: text after the top-level object (expected one JSON object)", path, line, col);
    }
    if (!cJSON_IsObject(root)) die(EXIT_USAGE, "%s: expected a JSON object at the top level", path);
    for (int i = 0; i < n_set; i++) apply_set(root, sets[i]);
    load_tree(cfg, root, path);
    cJSON_Delete(root);
    free(text);
}

void config_load_string(Config *cfg, const char *json, const char *origin) {
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) die(EXIT_USAGE, "%s: malformed config JSON", origin);
    /* the model section alone: the rest is the job as it was written, which
     * this binary may no longer take (a key renamed or refused since) */
    cJSON *model = cJSON_DetachItemFromObjectCaseSensitive(root, "model");
    cJSON_Delete(root);
    root = cJSON_CreateObject();
    if (model) cJSON_AddItemToObject(root, "model", model);
    load_values(cfg, root, origin, "model.");
    rope_scaling_unused(&cfg->model, origin);
    model_config_finish(&cfg->model, origin);
    cfg->json_text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
}

/* True when the job file set this key explicitly (init.from conflicts). */
int config_fp8_recipe(const Config *cfg) { return strcmp(cfg->compute_dtype, "fp8") == 0 ? cfg->fp8_recipe : -1; }

int config_has_key(const Config *cfg, const char *path) {
    cJSON *root = cJSON_Parse(cfg->json_text);
    int has = root && lookup(root, path) != NULL;
    cJSON_Delete(root);
    return has;
}

void config_print_keys(void) {
    printf("| key | type | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < NKEYS; i++) {
        const Key *k = &KEYS[i];
        char t[160];
        snprintf(t, sizeof t, "%s%s", k->type == K_SET ? "list of " : "", k->choices ? k->choices : type_name(k->type));
        for (char *p = t; *p; p++) if (*p == '|') *p = '/'; /* keep the markdown table intact */
        printf("| `%s` | %s | `%s` | %s |\n", k->path, t, k->def, k->doc);
    }
}

char *config_canonical(const Config *cfg) {
    Buf b = {0};
    for (int i = 0; i < NKEYS; i++) {
        const Key *k = &KEYS[i];
        if (strcmp(k->path, "description") == 0 || strcmp(k->path, "train.instance") == 0 || strcmp(k->path, "train.gpu_mem") == 0)
            continue; /* training ignores them */
        const char *field = (const char *)cfg + k->off;
        char name[64];
        buf_add(&b, "%s=", k->path);
        switch (k->type) {
        case K_INT: buf_add(&b, "%d", *(const int *)field); break;
        case K_BOOL: buf_add(&b, "%s", *(const int *)field ? "true" : "false"); break;
        case K_U64: buf_add(&b, "%llu", (unsigned long long)*(const uint64_t *)field); break;
        case K_FLOAT: buf_add(&b, "%.9g", (double)*(const float *)field); break;
        case K_DOUBLE: buf_add(&b, "%.17g", *(const double *)field); break;
        case K_STR: buf_json_string(&b, field); break;
        case K_ENUM: buf_json_string(&b, config_enum_name(k->choices, *(const int *)field, name, sizeof name)); break;
        case K_SET: {
            int bits = *(const int *)field, first = 1;
            buf_add(&b, "[");
            for (int j = 0; j < 31; j++) {
                if (!(bits >> j & 1)) continue;
                buf_add(&b, "%s", first ? "" : ",");
                buf_json_string(&b, config_enum_name(k->choices, j, name, sizeof name));
                first = 0;
            }
            buf_add(&b, "]");
            break;
        }
        }
        buf_add(&b, "\n");
    }
    return b.s;
}

/* The mixture-of-experts keys besides model.moe_experts itself. */
static int moe_only_key(const char *path) {
    return (strncmp(path, "model.moe_", 10) == 0 && strcmp(path, "model.moe_experts") != 0) || strncmp(path, "train.moe_", 10) == 0;
}

int config_key_applies(const Config *cfg, const char *path) {
    if (strcmp(path, "train.recompute_modules") == 0) return cfg->act_ckpt == ACT_SELECTIVE;
    if (strcmp(path, "train.fp8_recipe") == 0) return strcmp(cfg->compute_dtype, "fp8") == 0;
    if (moe_only_key(path)) return cfg->model.moe_experts > 0;
    return 1;
}

void config_moe_check(const Config *cfg) {
    if (cfg->model.moe_experts == 0) {
        cJSON *root = cJSON_Parse(cfg->json_text);
        for (int i = 0; root && i < NKEYS; i++) {
            const cJSON *v = moe_only_key(KEYS[i].path) ? lookup(root, KEYS[i].path) : NULL;
            if (!v) continue;
            char *text = cJSON_PrintUnformatted(v);
            die(EXIT_USAGE, "%s: %s %s is set but model.moe_experts is 0%s (it applies only to a mixture of experts; expected "
                "it unset, or model.moe_experts >= 2)", cfg->path, KEYS[i].path, text, cfg->init_from[0] ? " in init.from's model" : "");
        }
        cJSON_Delete(root);
        return;
    }
    if (strcmp(cfg->compute_dtype, "fp8") == 0)
        die(EXIT_USAGE, "%s: train.compute_dtype \"fp8\" with model.moe_experts %d: FP8 products inside the experts are not "
            "built yet (expected bf16, tf32 or fp32)", cfg->path, cfg->model.moe_experts);
}

/* Whether the job gave optim.decay_steps a value of its own (not 0). */
static int decay_given(const Config *cfg) {
    cJSON *root = cJSON_Parse(cfg->json_text);
    const cJSON *v = root ? lookup(root, "optim.decay_steps") : NULL;
    int given = cJSON_IsNumber(v) && v->valuedouble != 0;
    cJSON_Delete(root);
    return given;
}

/* The object at a key's section ("train" of "train.steps"), made on the
 * way; the key's last name into *leaf. */
static cJSON *section_of(cJSON *root, const char *path, const char **leaf) {
    cJSON *at = root;
    const char *p = path, *dot;
    while ((dot = strchr(p, '.')) != NULL) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(dot - p), p);
        cJSON *sub = cJSON_GetObjectItemCaseSensitive(at, name);
        if (!sub) sub = cJSON_AddObjectToObject(at, name);
        at = sub;
        p = dot + 1;
    }
    *leaf = p;
    return at;
}

char *config_resolved_json(const Config *cfg) {
    cJSON *root = cJSON_CreateObject();
    for (int i = 0; i < NKEYS; i++) {
        const Key *k = &KEYS[i];
        if (!config_key_applies(cfg, k->path)) continue;
        const char *field = (const char *)cfg + k->off, *leaf;
        cJSON *sec = section_of(root, k->path, &leaf), *v = NULL;
        char name[64];
        switch (k->type) {
        case K_INT: /* optim.decay_steps as the job gave it: 0 (train.steps') is not the same job as its value */
            v = cJSON_CreateNumber(strcmp(k->path, "optim.decay_steps") == 0 && !decay_given(cfg) ? 0 : *(const int *)field);
            break;
        case K_BOOL: v = cJSON_CreateBool(*(const int *)field); break;
        case K_U64: v = cJSON_CreateNumber((double)*(const uint64_t *)field); break;
        case K_FLOAT: v = cJSON_CreateNumber((double)*(const float *)field); break;
        case K_DOUBLE: v = cJSON_CreateNumber(*(const double *)field); break;
        case K_STR: v = cJSON_CreateString(field); break;
        case K_ENUM: v = cJSON_CreateString(config_enum_name(k->choices, *(const int *)field, name, sizeof name)); break;
        case K_SET:
            v = cJSON_CreateArray();
            for (int j = 0; j < 31; j++)
                if (*(const int *)field >> j & 1)
                    cJSON_AddItemToArray(v, cJSON_CreateString(config_enum_name(k->choices, j, name, sizeof name)));
            break;
        }
        cJSON_AddItemToObject(sec, leaf, v);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char *out = malloc_check(strlen(text) + 2);
    sprintf(out, "%s\n", text);
    free(text);
    return out;
}

/* a canonical line's key and value ("path=value"; a line without '=' is
 * all key, a text that ended is the key "(none)") */
static void canon_split(const char *line, size_t len, const char **key, int *klen, const char **val, size_t *vlen) {
    size_t k = strcspn(line, "=\n");
    if (k > len) k = len;
    *key = len ? line : "(none)";
    *klen = len ? (int)(k > 80 ? 80 : k) : 6;
    *val = k < len ? line + k + 1 : "";
    *vlen = k < len ? len - k - 1 : 0;
}

/* v's excerpt [from, from + 160) with "..." where it is cut */
static void excerpt(char *out, size_t n, const char *v, size_t vlen, size_t from) {
    size_t take = vlen > from ? vlen - from : 0;
    if (take > 160) take = 160;
    snprintf(out, n, "%s%.*s%s", from ? "..." : "", (int)take, v + from, from + take < vlen ? "..." : "");
}

int config_canonical_diff(const char *a, const char *b, const char *a_name, const char *b_name, char *out, size_t n) {
    while (*a || *b) {
        size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
        if (la != lb || memcmp(a, b, la) != 0) {
            const char *ka, *va, *kb, *vb;
            int kla, klb;
            size_t vla, vlb;
            canon_split(a, la, &ka, &kla, &va, &vla);
            canon_split(b, lb, &kb, &klb, &vb, &vlb);
            if (kla != klb || memcmp(ka, kb, (size_t)kla) != 0) {
                snprintf(out, n, "the key table differs: %.*s %s where %.*s %s", kla, ka, a_name, klb, kb, b_name);
            } else { /* long values: both from 60 bytes before the first that differs */
                size_t d = 0;
                while (d < vla && d < vlb && va[d] == vb[d]) d++;
                size_t from = vla > 160 || vlb > 160 ? (d > 60 ? d - 60 : 0) : 0;
                char xa[176], xb[176];
                excerpt(xa, sizeof xa, va, vla, from);
                excerpt(xb, sizeof xb, vb, vlb, from);
                snprintf(out, n, "%.*s is %s %s, %s %s", kla, ka, xa, a_name, xb, b_name);
            }
            return 1;
        }
        a += la + (a[la] == '\n');
        b += lb + (b[lb] == '\n');
    }
    return 0;
}

void config_free(Config *cfg) {
    free(cfg->json_text);
    cfg->json_text = NULL;
    free(cfg->origin_json);
    cfg->origin_json = NULL;
}

/* init.from: the model section comes from the Hugging Face config (or the
 * checkpoint's manifest), the file src; a value the job file also sets must
 * agree with it. */
void config_take_model(Config *cfg, const ModelConfig *hf, const char *src) {
    cJSON *root = cJSON_Parse(cfg->json_text);
    Config tmp = *cfg;
    tmp.model = *hf;
    for (int i = 0; i < NKEYS; i++) {
        const Key *k = &KEYS[i];
        if (strncmp(k->path, "model.", 6) != 0) continue;
        const cJSON *v = lookup(root, k->path);
        if (!v) continue;
        Config mine = *cfg;
        store(&mine, k, v, cfg->path);
        size_t sz = k->type == K_ENUM || k->type == K_INT || k->type == K_BOOL ? sizeof(int) : sizeof(float);
        const char *a = (char *)&mine + k->off, *b = (char *)&tmp + k->off;
        if (k->type == K_STR ? strcmp(a, b) != 0 : memcmp(a, b, sz) != 0) {
            char *s = cJSON_PrintUnformatted(v);
            die(EXIT_USAGE, "%s: %s = %s conflicts with init.from %s", cfg->path, k->path, s, src);
        }
    }
    cJSON_Delete(root);
    cfg->model = *hf;
    int hf_len = !config_has_key(cfg, "train.seq_len") || cfg->seq_len == 0;
    if (hf_len) cfg->seq_len = cfg->model.max_seq_len;
    if (cfg->seq_len > cfg->model.max_seq_len)
        die(EXIT_USAGE, "%s: train.seq_len %d exceeds the model's max_seq_len %d (from %s)", cfg->path, cfg->seq_len, cfg->model.max_seq_len, src);
    char from[64 + 2 * sizeof cfg->init_from];
    snprintf(from, sizeof from, " (the max_seq_len of init.from %s)", src);
    micro_tokens_check(cfg, cfg->path, hf_len ? from : "");
}

const char *config_enum_name(const char *choices, int idx, char *buf, size_t n) {
    const char *p = choices;
    for (int j = 0; j < idx && strchr(p, '|'); j++) p = strchr(p, '|') + 1;
    const char *bar = strchr(p, '|');
    snprintf(buf, n, "%.*s", (int)(bar ? bar - p : (long)strlen(p)), p);
    return buf;
}

/* Write the resolved model section (defaults and init.from filled in) into
 * the effective config text, so a checkpoint rebuilds the same model
 * without the job file or the init folder. */
void config_freeze_model(Config *cfg) {
    cJSON *root = cJSON_Parse(cfg->json_text);
    if (!root) die(EXIT_INTERNAL, "config_freeze_model: effective config does not parse");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "model");
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    for (int i = 0; i < NKEYS; i++) {
        const Key *k = &KEYS[i];
        if (strncmp(k->path, "model.", 6) != 0) continue;
        const char *name = k->path + 6;
        const char *field = (const char *)cfg + k->off;
        switch (k->type) {
        case K_ENUM: {
            char buf[32];
            cJSON_AddStringToObject(model, name, config_enum_name(k->choices, *(const int *)field, buf, sizeof buf));
            break;
        }
        case K_INT: cJSON_AddNumberToObject(model, name, *(const int *)field); break;
        case K_FLOAT: cJSON_AddNumberToObject(model, name, *(const float *)field); break;
        case K_BOOL: cJSON_AddBoolToObject(model, name, *(const int *)field); break;
        case K_STR: cJSON_AddStringToObject(model, name, field); break;
        default: die(EXIT_INTERNAL, "config_freeze_model: unexpected type of %s", k->path);
        }
    }
    /* the weights now come from the checkpoint, not the init folder */
    cJSON *init = cJSON_GetObjectItemCaseSensitive(root, "init");
    if (init) cJSON_DeleteItemFromObjectCaseSensitive(init, "from");
    free(cfg->json_text);
    cfg->json_text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
}

int config_model_diff(const ModelConfig *a, const ModelConfig *b, char *out, size_t n) {
    Config ca, cb;
    memset(&ca, 0, sizeof ca);
    memset(&cb, 0, sizeof cb);
    ca.model = *a;
    cb.model = *b;
    for (int i = 0; i < NKEYS; i++) {
        const Key *k = &KEYS[i];
        if (strncmp(k->path, "model.", 6) != 0) continue;
        const char *fa = (const char *)&ca + k->off, *fb = (const char *)&cb + k->off;
        if (k->type == K_FLOAT) {
            float x = *(const float *)fa, y = *(const float *)fb;
            if (x != y) { snprintf(out, n, "%s %g vs %g", k->path, x, y); return 1; }
        } else if (k->type == K_STR) {
            if (strcmp(fa, fb)) { snprintf(out, n, "%s \"%s\" vs \"%s\"", k->path, fa, fb); return 1; }
        } else if (*(const int *)fa != *(const int *)fb) {
            char x[32], y[32];
            if (k->type == K_ENUM)
                snprintf(out, n, "%s %s vs %s", k->path, config_enum_name(k->choices, *(const int *)fa, x, sizeof x),
                         config_enum_name(k->choices, *(const int *)fb, y, sizeof y));
            else snprintf(out, n, "%s %d vs %d", k->path, *(const int *)fa, *(const int *)fb);
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* learning-rate schedule                                              */

double config_lr_at(const Config *c, int s) {
    double lr = c->lr, lo = c->min_lr;
    int W = c->warmup_steps, D = c->decay_steps;
    if (s < W) return lr * (double)(s + 1) / (double)W;
    switch (c->lr_decay_style) {
    case LR_CONSTANT: return lr;
    case LR_INVERSE_SQRT: { /* lr at the warmup's last step (s + 1 = W), then ~ 1/sqrt(s + 1) */
        double v = lr * sqrt((double)(W > 1 ? W : 1) / (double)(s + 1));
        return v > lo ? v : lo;
    }
    case LR_WSD: {
        int K = c->wsd_decay_steps, start = D - K; /* config: K >= 1, start >= W */
        if (s < start) return lr;
        double q = (double)(s - start) / (double)K, f;
        if (q > 1.0) q = 1.0;
        switch (c->wsd_decay_style) {
        case WSD_COSINE: f = 0.5 * (1.0 + cos(M_PI * q)); break;
        case WSD_EXPONENTIAL: f = 2.0 * pow(0.5, q) - 1.0; break;
        case WSD_MINUS_SQRT: f = 1.0 - sqrt(q); break;
        default: f = 1.0 - q; break; /* WSD_LINEAR */
        }
        return lo + (lr - lo) * f;
    }
    default: { /* LR_COSINE, LR_LINEAR */
        int span = D - W;
        double p = (double)(s - W) / (double)(span > 1 ? span : 1);
        if (p > 1.0) p = 1.0;
        double f = c->lr_decay_style == LR_LINEAR ? 1.0 - p : 0.5 * (1.0 + cos(M_PI * p));
        return lo + (lr - lo) * f;
    }
    }
}

void config_lr_text(const Config *c, char *buf, size_t n) {
    char w[48] = "", style[32];
    if (c->warmup_steps) snprintf(w, sizeof w, "warmup %d, ", c->warmup_steps);
    switch (c->lr_decay_style) {
    case LR_CONSTANT: snprintf(buf, n, "%sconstant %g", w, c->lr); break;
    case LR_INVERSE_SQRT: snprintf(buf, n, "%sinverse_sqrt from %g, floor %g", w, c->lr, c->min_lr); break;
    case LR_WSD:
        snprintf(buf, n, "%swsd %g, then %s -> %g over steps %d..%d", w, c->lr,
                 config_enum_name(WSD_STYLES, c->wsd_decay_style, style, sizeof style), c->min_lr,
                 c->decay_steps - c->wsd_decay_steps, c->decay_steps);
        break;
    default:
        snprintf(buf, n, "%s%s %g -> %g over steps %d..%d", w, config_enum_name(LR_STYLES, c->lr_decay_style, style, sizeof style),
                 c->lr, c->min_lr, c->warmup_steps, c->decay_steps);
        break;
    }
}

/* ------------------------------------------------------------------ */
/* batch-size ramp-up                                                  */

int config_batch_at(const Config *c, uint64_t consumed) {
    if (c->rampup_start == 0 || consumed >= (uint64_t)c->rampup_samples) return c->global_batch;
    uint64_t stages = (uint64_t)(c->global_batch - c->rampup_start) / (uint64_t)c->rampup_increment;
    uint64_t k = consumed * stages / (uint64_t)c->rampup_samples; /* < stages */
    return c->rampup_start + (int)k * c->rampup_increment;
}

uint64_t config_cursor_at(const Config *c, int step0, uint64_t cursor0, int step) {
    uint64_t cur = cursor0;
    for (int s = step0; s < step; s++) {
        int g = config_batch_at(c, cur);
        if (g == c->global_batch) return cur + (uint64_t)(step - s) * (uint64_t)g; /* the ramp is over */
        cur += (uint64_t)g;
    }
    return cur;
}

/* ------------------------------------------------------------------ */
/* the schedule a checkpoint was trained with                          */

/* What shapes the LR (config_lr_at) and the batch (config_batch_at), in
 * the order a difference is reported. */
static const char *const SCHEDULE_KEYS[] = {
    "optim.lr_decay_style", "optim.lr", "optim.min_lr", "optim.warmup_steps", "optim.decay_steps", "optim.wsd_decay_steps",
    "optim.wsd_decay_style", "train.rampup_start_batch", "train.rampup_batch_increment", "train.rampup_samples",
    "train.global_batch", "train.steps",
};
#define N_SCHEDULE_KEYS (int)(sizeof SCHEDULE_KEYS / sizeof SCHEDULE_KEYS[0])

/* key k's value in c as JSON (the types the schedule keys have) */
static cJSON *key_json(const Config *c, const Key *k) {
    const char *field = (const char *)c + k->off;
    char buf[32];
    switch (k->type) {
    case K_INT: return cJSON_CreateNumber(*(const int *)field);
    case K_FLOAT: { /* the shortest text that reads back as the same float (0.01, not 0.00999999977648258) */
        float x = *(const float *)field;
        for (int digits = 6;; digits++) {
            snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
            if (strtof(buf, NULL) == x || digits == 9) return cJSON_CreateRaw(buf);
        }
    }
    case K_ENUM: return cJSON_CreateString(config_enum_name(k->choices, *(const int *)field, buf, sizeof buf));
    default: die(EXIT_INTERNAL, "key_json: unexpected type of %s", k->path);
    }
}

/* key k's value in c as text ("0.01", "cosine") */
static void key_text(const Config *c, const Key *k, char *out, size_t n) {
    const char *field = (const char *)c + k->off;
    if (k->type == K_FLOAT) snprintf(out, n, "%g", (double)*(const float *)field);
    else if (k->type == K_ENUM) config_enum_name(k->choices, *(const int *)field, out, n);
    else snprintf(out, n, "%d", *(const int *)field);
}

char *config_schedule_json(const Config *c) {
    cJSON *root = cJSON_CreateObject();
    for (int i = 0; i < N_SCHEDULE_KEYS; i++) {
        const Key *k = find_key(SCHEDULE_KEYS[i]);
        char sec[16];
        snprintf(sec, sizeof sec, "%.*s", (int)(strchr(k->path, '.') - k->path), k->path);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(root, sec);
        if (!s) s = cJSON_AddObjectToObject(root, sec);
        cJSON_AddItemToObject(s, strchr(k->path, '.') + 1, key_json(c, k));
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* Whether key path shapes the schedule of style st: the decay's end only
 * where the style decays, min_lr where it is read, the wsd keys under
 * wsd; train.steps never itself (it moves the schedule only as the
 * decay's end, which optim.decay_steps 0 makes it). */
static int schedule_reads(const char *path, int st) {
    if (!strcmp(path, "optim.min_lr")) return st != LR_CONSTANT;
    if (!strcmp(path, "optim.decay_steps")) return st != LR_CONSTANT && st != LR_INVERSE_SQRT;
    if (!strncmp(path, "optim.wsd_", 10)) return st == LR_WSD;
    return strcmp(path, "train.steps") != 0;
}

int config_schedule_diff(const char *ckpt, const Config *c, const char *origin, char *first, size_t n1, char *all, size_t n2) {
    cJSON *root = cJSON_Parse(ckpt);
    if (!cJSON_IsObject(root)) die(EXIT_USAGE, "%s: malformed schedule JSON", origin);
    Config o;
    memset(&o, 0, sizeof o);
    set_defaults(&o);
    for (int i = 0; i < N_SCHEDULE_KEYS; i++) {
        const cJSON *v = lookup(root, SCHEDULE_KEYS[i]);
        if (v) store(&o, find_key(SCHEDULE_KEYS[i]), v, origin);
    }
    cJSON_Delete(root);
    if (o.decay_steps == 0) o.decay_steps = o.steps; /* a stored job config (a schedule object has it resolved) */
    cJSON *job = cJSON_Parse(c->json_text);
    const cJSON *d = job ? lookup(job, "optim.decay_steps") : NULL;
    int mine = d && cJSON_IsNumber(d) && d->valuedouble != 0; /* this job sets the decay's end */
    cJSON_Delete(job);
    int nd = 0;
    first[0] = all[0] = '\0';
    for (int i = 0; i < N_SCHEDULE_KEYS; i++) {
        const Key *k = find_key(SCHEDULE_KEYS[i]);
        if (!schedule_reads(k->path, o.lr_decay_style) && !schedule_reads(k->path, c->lr_decay_style)) continue;
        /* global_batch is the ramp's target: compared under a ramp, and not
         * from a stored job's 0 (micro_batch x dp of a layout it does not keep) */
        if (!strcmp(k->path, "train.global_batch") && (!(o.rampup_start || c->rampup_start) || !o.global_batch)) continue;
        const char *fo = (const char *)&o + k->off, *fc = (const char *)c + k->off;
        if (memcmp(fo, fc, k->type == K_FLOAT ? sizeof(float) : sizeof(int)) == 0) continue;
        char a[40], b[40], why[160] = "";
        key_text(&o, k, a, sizeof a);
        key_text(c, k, b, sizeof b);
        if (!strcmp(a, b)) { /* floats that %g rounds alike */
            snprintf(a, sizeof a, "%.9g", (double)*(const float *)fo);
            snprintf(b, sizeof b, "%.9g", (double)*(const float *)fc);
        }
        const char *name = k->path;
        if (!strcmp(name, "optim.decay_steps")) { /* the decay's end: the key this job sets it with */
            char style[32];
            config_enum_name(LR_STYLES, c->lr_decay_style, style, sizeof style);
            if (!mine && o.decay_steps == o.steps) {
                name = "train.steps";
                snprintf(why, sizeof why, " (where the %s decay ends, optim.decay_steps being 0; optim.decay_steps=%d keeps the "
                         "checkpoint's end)", style, o.decay_steps);
            } else {
                snprintf(why, sizeof why, " (where the %s decay ends%s)", style, mine ? "" : "; 0 in this job: train.steps");
            }
        }
        if (!nd) snprintf(first, n1, "%s: %s -> %s%s", name, a, b, why);
        size_t l = strlen(all);
        snprintf(all + l, n2 - l, "%s%s: %s -> %s", nd ? ", " : "", name, a, b);
        nd++;
    }
    return nd;
}
