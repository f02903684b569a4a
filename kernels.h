/* kernels.h — the compute interface every backend implements.
 *
 * model.c calls only these functions (through a Kernels table), so a new
 * backend (kernels.cu) plugs in without touching the model. Pointers are
 * backend memory (host for CPU, device for CUDA). Shapes are row-major.
 *
 * Conventions, the same for every kernel:
 *   - N = number of token rows (B*T), C = channels, OC = output channels.
 *   - Linear weights are stored [OC, C] (out, in), as torch.nn.Linear.
 *   - Forward kernels OVERWRITE their outputs.
 *   - Backward kernels ADD into every gradient output (dinp, dweight, dbias):
 *     callers zero a buffer that must start empty (a gradient buffer:
 *     grads_fresh, then grads_settle before it is read). This is what makes
 *     gradient accumulation across micro-batches and the residual stream free.
 *     The exceptions are the in-place kernels, marked "in place", and the
 *     input gradients of the matrix products and of attention
 *     (the matmul_backward family's dinp, attention_backward's dqkv,
 *     marked OVERWRITTEN): every caller wanted them alone, and an
 *     added-into one cost a zeroing pass and a read of it.
 *   - Any gradient output may be NULL, meaning "not needed".
 */
#ifndef LLMTRAIN_KERNELS_H
#define LLMTRAIN_KERNELS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* One range of the flat parameter arrays for adamw_multi: elements
 * [offset, offset + n), weight decay wd (0 for ranges not decayed); norm:
 * its updated weights count in adamw_multi's sum of squares. */
typedef struct AdamWRange {
    size_t offset, n;
    float wd;
    int norm;
} AdamWRange;

/* A cross-entropy target that asks for no loss (PyTorch's ignore_index):
 * the prediction after an end-of-document token under train.eod_mask_loss. */
#define CE_NO_TARGET (-1)

/* RoPE's frequencies: inv_freq[i] = theta^(-2i/hd) for i < hd/2; under
 * scaling ROPE_LINEAR each divided by factor (position interpolation:
 * Hugging Face's rope_type "linear", Megatron's
 * --rotary-seq-len-interpolation-factor); under ROPE_LLAMA3 Llama 3.1's
 * rescaling of them (Hugging Face's
 * rope_type "llama3"): with wavelength w = 2 pi / inv_freq and the
 * wavelengths L = original_max_seq_len / low_freq_factor and
 * H = original_max_seq_len / high_freq_factor, a frequency with w < H (a
 * short wavelength) is kept, one with w > L is divided by factor, and
 * between them s = (original_max_seq_len / w - low_freq_factor) /
 * (high_freq_factor - low_freq_factor) blends the two:
 * (1 - s) inv_freq / factor + s inv_freq.
 * Under ROPE_YARN, YaRN's (Peng et al. 2023; Hugging Face's rope_type
 * "yarn"): with d(r) = hd ln(original_max_seq_len / (2 pi r)) / (2 ln theta),
 * the index at which a frequency turns r times over the original context,
 * lo = d(beta_fast) and hi = d(beta_slow) (rounded down and up unless
 * !truncate, then clamped to [0, hd - 1]; hi = lo + 0.001 where they meet),
 * and the ramp s = clamp((i - lo) / (hi - lo), 0, 1): inv_freq / factor s +
 * inv_freq (1 - s), so the fast frequencies (i <= lo) are kept and the slow
 * ones (i >= hi) divided by factor. YaRN also scales cos and sin by
 * rope_mscale: attention_factor, or where that is 0 its default
 * 0.1 ln(factor) + 1 (which scales the attention logits by its square). */
enum { ROPE_NONE = 0, ROPE_LLAMA3 = 1, ROPE_LINEAR = 2, ROPE_YARN = 3 }; /* model.rope_scaling's none|llama3|linear|yarn */
typedef struct Rope {
    float theta;
    int scaling; /* ROPE_NONE | ROPE_LLAMA3 | ROPE_LINEAR | ROPE_YARN */
    float factor, low_freq_factor, high_freq_factor;
    int original_max_seq_len;
    float beta_fast, beta_slow, attention_factor; /* ROPE_YARN's */
    int truncate;                                 /* ROPE_YARN's: round lo down and hi up */
} Rope;

/* The one definition of the frequencies, for both backends (in double: an
 * angle pos * inv_freq reaches thousands of radians). */
#ifdef __CUDACC__
#define ROPE_HOST_DEVICE __host__ __device__
#else
#define ROPE_HOST_DEVICE
#endif
static inline ROPE_HOST_DEVICE double rope_inv_freq(const Rope *r, int i, int hd) {
    double f = pow((double)r->theta, -2.0 * i / hd);
    if (r->scaling == ROPE_LINEAR) return f / r->factor;
    if (r->scaling == ROPE_YARN) {
        double orig = (double)r->original_max_seq_len, two_ln_theta = 2.0 * log((double)r->theta);
        double lo = hd * log(orig / (6.283185307179586 * r->beta_fast)) / two_ln_theta;
        double hi = hd * log(orig / (6.283185307179586 * r->beta_slow)) / two_ln_theta;
        if (r->truncate) lo = floor(lo), hi = ceil(hi);
        lo = lo > 0 ? lo : 0;
        hi = hi < hd - 1 ? hi : hd - 1;
        if (lo == hi) hi += 0.001;
        double s = (i - lo) / (hi - lo);
        s = s < 0 ? 0 : s > 1 ? 1 : s;
        return f / r->factor * s + f * (1.0 - s);
    }
    if (r->scaling != ROPE_LLAMA3) return f;
    double w = 6.283185307179586 / f, orig = (double)r->original_max_seq_len;
    if (w < orig / r->high_freq_factor) return f;
    if (w > orig / r->low_freq_factor) return f / r->factor;
    double s = (orig / w - r->low_freq_factor) / ((double)r->high_freq_factor - r->low_freq_factor);
    return (1.0 - s) * f / r->factor + s * f;
}

/* The factor on cos and sin: YaRN's attention factor (1 otherwise). */
static inline ROPE_HOST_DEVICE double rope_mscale(const Rope *r) {
    if (r->scaling != ROPE_YARN) return 1.0;
    if (r->attention_factor > 0) return r->attention_factor;
    return r->factor <= 1 ? 1.0 : 0.1 * log((double)r->factor) + 1.0;
}

/* What a backend's FP8 products need room for (Kernels.fp8_setup), in
 * floats: the largest activation or output-gradient operand of a layer's
 * linear products (rows x width) and the largest weight; the weights of
 * those products together and how many there are; the largest dimension
 * of any of their operands. */
/* Kernels.fp8_scope's on under tensor parallelism: which linear follows */
enum { FP8_COLUMN = 2, FP8_ROW = 3 };
typedef struct Fp8Sizes {
    size_t act_floats, weight_max, weight_floats;
    int n_weights, max_dim;
} Fp8Sizes;

typedef struct Kernels {
    const char *name; /* "cpu", "cuda" */
    /* Bytes per element of the [a] buffers: the activations that only
     * matrix products (and attention's backward) read: the norms' outputs,
     * attention's output, the MLP activation's output, SwiGLU's input (the
     * up-projection's output, which only SwiGLU's forward and backward
     * read); the LM head's logits, with the probabilities or gradients the
     * cross-entropy leaves in them (which only the LM head's backward
     * reads); attention's input qkv (the qkv projection's output, which only
     * RoPE and attention read), its output's gradient and its input's
     * gradient d(qkv). 4 (fp32) on the CPU
     * and on CUDA under compute dtype tf32 or fp32; 2 (bf16, rounded to
     * nearest even) on CUDA under bf16 (the default; see
     * kernels_cuda_set_compute_dtype), so that its bf16 GEMMs read them with
     * no conversion pass and they take half the memory. They are still
     * passed as float *: the caller never reads their elements, and sizes
     * and offsets them by act_bytes. Arguments marked [a] below. */
    int act_bytes;

    /* the ops, each a member: kernels_ops.h */
#define KERNEL_OP(ret, name, params, args) ret(*name) params;
#define KERNEL_OP_RET(ret, name, params, args) ret(*name) params;
#define KERNEL_CTL(ret, name, params, args) ret(*name) params;
#include "kernels_ops.h"
#undef KERNEL_OP
#undef KERNEL_OP_RET
#undef KERNEL_CTL
} Kernels;

#define KERNEL_TIMER_SLOTS 8192

/* Shared by the backends so that they round to the same bits. */
#ifdef __CUDACC__
#define KERNELS_HD __host__ __device__
#else
#define KERNELS_HD
#endif
/* splitmix64's finaliser of z + golden ratio: a well-mixed 64-bit hash. */
static inline KERNELS_HD uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* The fp32 bit pattern u rounded to bf16 precision: to nearest even (seed
 * 0), or up with probability (low 16 bits) / 2^16 from the 16 random bits of
 * (seed, idx). NaN stays (quiet) NaN, infinities stay. */
static inline KERNELS_HD uint32_t round_bf16_word(uint32_t u, uint64_t seed, uint64_t idx) {
    if ((u & 0x7f800000u) == 0x7f800000u) return (u & 0x007fffffu) ? (u | 0x00400000u) & 0xffff0000u : u;
    uint32_t add = seed ? (uint32_t)(splitmix64(seed ^ splitmix64(idx)) & 0xffffu) : 0x7fffu + ((u >> 16) & 1u);
    return (u + add) & 0xffff0000u;
}

/* The CPU backend (kernels_cpu.c). Always available. */
const Kernels *kernels_cpu(void);
/* Threads for the CPU kernels (OpenMP). n <= 0: cores / ranks on this
 * node, unless OMP_NUM_THREADS is set. Returns the count in use. */
int kernels_cpu_set_threads(int n, int ranks_on_node);
/* The CPU's FP8 weight copies (Kernels.fp8_setup) made so far, and in
 * *hits (may be NULL) how many products found one already made; for tests. */
long kernels_cpu_fp8_weight_copies(long *hits);
/* Name of the BLAS core in use, e.g. "OpenBLAS 0.3.21 SkylakeX (2 threads)". */
const char *kernels_cpu_blas_info(void);
/* Call first thing in main(): when OpenBLAS would not recognise this CPU and
 * fall back to a slow kernel, pick the right core type and re-exec. */
void kernels_cpu_select_blas_core(char **argv);
/* Measured single-precision GEMM throughput of this machine (GFLOP/s),
 * from a short timed sgemm; used as the CPU peak for MFU. The first call
 * measures; later ones return it, or with again != 0 measure anew. */
double kernels_cpu_sgemm_peak_gflops(int again);

/* The CUDA backend's scratch memory beside the layout's buffers for one
 * rank's shape (kernels_cuda_sizes.c, from the sizes kernels.cu allocates
 * by): in every build, so `llmtrain check` sizes a CUDA run anywhere. The
 * widths are the rank's local (TP) ones. */
typedef struct CudaScratchShape {
    int B, T, C;                        /* micro-batch, sequence length, width */
    int nh, hd, qkv_dim, fc_dim, F, V;  /* heads, head dim, qkv and up-projection widths, SwiGLU hidden, vocab */
    size_t n_params;                    /* the local flat array */
    int gpt2, bf16;                     /* GPT-2 (else Llama); compute dtype bf16 */
    int qk_norm;                        /* model.qk_norm */
    const char *attention;              /* train.attention_kernel */
    int weight_copies;                  /* layers whose weights' bf16 copies are kept (sharded: the pool's slots - 2) */
    int sharded, off_grid;              /* sharded weights; a 2-D weight off the 8-float grid */
    int cp;                             /* parallel.context (T is then the rank's seq_len / cp): > 1, the attention
                                         * parts run instead of the whole-sequence attention, with no scratch */
    const Fp8Sizes *fp8;                /* train.compute_dtype fp8: the FP8 buffers' sizes (model_fp8_sizes); else NULL */
    int fp8_recipe;                     /* with fp8: train.fp8_recipe (fp8.h FP8_TENSORWISE, ...) */
} CudaScratchShape;
double kernels_cuda_scratch_bytes(const CudaScratchShape *s);

/* The CUDA backend (kernels.cu), defined only in CUDA builds (the build
 * defines LLMTRAIN_CUDA). Nothing touches the CUDA driver before
 * kernels_cuda_available() or kernels_cuda() is called, so CPU runs of a
 * CUDA build work on machines without a GPU or driver. */
#ifdef LLMTRAIN_CUDA
/* CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 with
 * the reason in why when there are none or no driver. */
int kernels_cuda_device_count(char *why, size_t n);
/* The device kernels_cuda() initialises (default 0; call before it). */
void kernels_cuda_set_device(int dev);
/* 1 when the chosen device is usable; else 0 and the reason in why. */
int kernels_cuda_available(char *why, size_t n);
/* The chosen device's UUID as nvidia-smi prints it ("GPU-8c1f...-..."),
 * the same in every process whatever CUDA_VISIBLE_DEVICES maps it to (a
 * device query, asked before kernels_cuda_available): 0, or -1 when it
 * cannot be read. */
int kernels_cuda_device_uuid(char *out, size_t n);
/* The matrix products' arithmetic and the [a] buffers' width
 * (train.compute_dtype): "bf16" (the default: bf16 operands, fp32
 * accumulation, [a] buffers bf16, act_bytes 2), "tf32" (fp32 storage, TF32
 * tensor cores) or "fp32" (plain fp32). Call before kernels_cuda(), which
 * fixes it. */
void kernels_cuda_set_compute_dtype(const char *dtype);
/* Initialises the chosen device (dies with exit 2 when there is none). */
const Kernels *kernels_cuda(void);
/* The stream every kernel runs on, as a cudaStream_t (the legacy default
 * stream): a communication library orders its work after it with events. */
void *kernels_cuda_stream(void);
/* With poll set, the backend's host waits (to_host, from_host, the
 * reductions that return a number) wait for the stream by querying it and
 * calling poll(ctx) between queries instead of blocking in the driver, so
 * that a communication library can check for asynchronous errors while the
 * stream waits on its collectives. NULL: block (the default). */
void kernels_cuda_set_host_wait(void (*poll)(void *ctx), void *ctx);
/* "device 0: NVIDIA H200, 132 SMs, cc 9.0, 139.8 GiB; matmuls ..." */
const char *kernels_cuda_device_info(void);
/* Dense bf16 tensor-core peak of the device in GFLOP/s, for MFU; *source
 * (optional) says where the figure comes from. */
double kernels_cuda_peak_gflops(const char **source);
/* The device's peak memory bandwidth in GB/s (2 transfers a memory clock x
 * the bus width), for log.profile_steps' memory-bound entries. */
double kernels_cuda_peak_gbs(void);
/* Device memory this backend holds now (*in_use) and at most so far (*peak),
 * in bytes: every alloc() (until its free()), the scratch buffers that only
 * grow, the cuBLASLt workspace. Not the CUDA context or library-internal
 * memory, so nvidia-smi shows more. Either pointer may be NULL. */
void kernels_cuda_mem_stats(size_t *in_use, size_t *peak);
/* How many matmul_gelu_forward calls so far ran as one cuBLASLt GEMM with
 * the GELU epilogue (the rest: GEMM, then the GELU kernel); for tests. */
long kernels_cuda_fused_gelu_calls(void);
/* How many matmul_gelu_backward calls so far ran their input-gradient GEMM
 * with the DGELU epilogue (the rest: GEMM, then an in-place kernel). */
long kernels_cuda_fused_dgelu_calls(void);
/* How many layernorm_backward / rmsnorm_backward calls so far computed the
 * input gradient and the weight (and bias) gradients in one pass over dout
 * and inp (the rest: three kernels, for a C too wide for shared memory) */
long kernels_cuda_fused_norm_bwd_calls(void);
/* Of those, how many took the float4 form (a width a multiple of 4, rows
 * 16-byte aligned; a block to a row): which 0 with a thread's columns in
 * registers (C up to 4096), 1 reading the row twice. */
long kernels_cuda_vec_norm_bwd_calls(int which);
/* How many crossentropy_forward / crossentropy_fused calls so far read and
 * wrote the logits 16 bytes at a time (V a multiple of 8 under bf16 [a], of
 * 4 under fp32, the logits 16-byte aligned); the rest: an element at a time */
long kernels_cuda_vec_ce_calls(void);
/* How many layernorm / rmsnorm forward calls (the residual add's too) so far
 * read and wrote 16 bytes at a time (C a multiple of 4, rows 16-byte
 * aligned); the rest: an element at a time */
long kernels_cuda_vec_norm_fwd_calls(void);
/* How many swiglu_forward / swiglu_backward calls (matmul_swiglu_backward's
 * too) and rope_forward / rope_backward calls so far took the pointwise
 * kernels' 16-byte form: 8 elements a thread (SwiGLU: F a multiple of 8;
 * RoPE: head_dim a multiple of 16; every operand 16-byte aligned); the
 * rest: an element at a time */
long kernels_cuda_vec_pointwise_calls(void);
/* How many moe_permute, moe_combine and moe_unpermute_add calls so far
 * moved 16 bytes a thread (permute: rows of a multiple of 16 bytes;
 * combine, unpermute_add: C a multiple of 4; every operand 16-byte
 * aligned); the rest: a word or an element at a time */
long kernels_cuda_moe_vec_calls(void);
/* The grid of the last sum / sumsq / sumsq_queue reduction: a block for
 * every 16384 elements, at most 8192 blocks (each block's work bounded, so
 * the side stream's never holds an SM long); for tests */
unsigned kernels_cuda_last_reduce_grid(void);
/* How many fp32 <-> bf16 conversions (the bf16 GEMMs' operand copies, the
 * weight cache's, unpack_bf16's) and pack_bf16 calls so far took the
 * 16-byte form (8 elements a thread up to the last whole 8, both pointers
 * 16-byte aligned); the rest: an element at a time */
long kernels_cuda_vec_convert_calls(void);
/* How many bias gradients so far were summed from an fp32 output gradient
 * in the same pass that wrote its bf16 copy for the backward's GEMMs (under
 * bf16; the rest: a conversion pass and a bias pass) */
long kernels_cuda_colsum_copy_calls(void);
/* How many times so far a product's backward converted an fp32 dout to
 * bf16 for its GEMMs (under bf16; with a bias gradient, in its pass:
 * colsum_copy_calls counts those too); a dout_a given converts nothing.
 * And how many norm backwards wrote their dinp_a in the pass that wrote
 * dinp (under bf16; the rest: a conversion after it). */
long kernels_cuda_dout_convert_calls(void);
long kernels_cuda_fused_dinp_a_calls(void);
/* How many weight, bias and norm-weight gradients so far were stored by
 * their first backward product or column sum in fresh gradient memory
 * (Kernels.grads_fresh) instead of added into zeroed memory; *regions: the
 * fresh ranges not yet settled (or freed); *zeroed_bytes: the bytes of
 * fresh memory zeroed so far (settled, or added into by an embedding's
 * backward). Either pointer may be NULL. For tests. */
long kernels_cuda_fresh_grad_stats(int *regions, size_t *zeroed_bytes);
/* The attention kernels (train.attention_kernel): "cudnn" (cuDNN's fused
 * attention on bf16 qkv, head dims 8..128 by 8; the shapes it declines
 * take "flash"), "flash" (fused kernels, head dims 32/64/128; other shapes
 * take the GEMMs), "gemm" (cuBLASLt GEMMs on the full T x T square) or
 * "auto" (the default: cudnn under compute dtype bf16, else flash). May
 * change between calls (tests). */
void kernels_cuda_set_attention(const char *mode);
/* How many attention_forward / attention_backward calls so far ran the
 * fused kernels (the rest took cuDNN or the GEMMs); for tests. */
long kernels_cuda_flash_attention_calls(void);
/* How many attention_part_forward / attention_part_backward calls so far
 * ran on the bf16 tensor-core kernels (the rest took the fp32 tiles); for
 * tests. */
long kernels_cuda_attention_part_tc_calls(void);
/* How many ran through cuDNN; for tests. */
long kernels_cuda_cudnn_attention_calls(void);
/* The bf16 weight copies of Kernels.weights_stable: products that found a
 * current copy (*hits), that made one (*made), and the device bytes the
 * copies hold now (*bytes); for tests. Any pointer may be NULL. The
 * environment variable LLMTRAIN_CUDA_WEIGHT_CACHE=0 turns the copies off
 * (every bf16 product converts its weights into scratch again). */
void kernels_cuda_weight_cache_stats(long *hits, long *made, size_t *bytes);
/* FP8 (train.compute_dtype fp8, kernels/fp8.cuh): the weights' FP8 copies
 * made so far (*made), the products that found one current (*hits), and
 * the products whose output went through the fp32 stage (a bias, or an
 * output cuBLASLt's FP8 kernels cannot write: *staged); for tests. Any
 * pointer may be NULL. */
void kernels_cuda_fp8_stats(long *made, long *hits, long *staged);
/* The tensorwise FP8 codes (E5M2 when e5m2, else E4M3) of the n device
 * values at x (bf16 words when x16) into host memory, and the scale in
 * *scale: the casts the products run, for tests (after fp8_setup). */
void kernels_cuda_fp8_codes(uint8_t *host, const float *x, int x16, size_t n, int e5m2, float *scale);
/* x [rows, cols] on the device (bf16 words when x16) quantized under
 * fp8_setup's recipe as an operand (a weight when weight) whose K is its
 * columns (kdim 1) or its rows (kdim 0): its codes as the product reads
 * them ([rows, pad16(cols)] or [cols, pad16(rows)]) into codes, and its
 * inverse scales in cuBLASLt's layout for the recipe's scale mode
 * (docs/fp8.md; padding 0) into inv, *n_inv of them; for tests. */
void kernels_cuda_fp8_quant(uint8_t *codes, float *inv, size_t *n_inv, const float *x, int x16, int rows, int cols,
                            int e5m2, int weight, int kdim);
#endif

#endif
