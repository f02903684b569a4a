/* kernels_cuda_sizes.h — the CUDA backend's sizes that memory planning
 * depends on, in one place: kernels.cu's parts allocate and launch by
 * them, and kernels_cuda_sizes.c adds them up for `llmtrain check` (which
 * sizes a model on any machine, CUDA build or not). */
#ifndef LLMTRAIN_KERNELS_CUDA_SIZES_H
#define LLMTRAIN_KERNELS_CUDA_SIZES_H
#include <stddef.h>

#define CUDA_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's workspace */
#define CUDA_RED_MAX_BLOCKS 8192                /* partials of a deterministic reduction */
#define CUDA_NORM_BWD_MAX_BLOCKS 1024           /* the one-pass norm backward's row blocks */
#define CUDA_COLSUM_ROWS 256                    /* rows a column-sum block takes, */
#define CUDA_COLSUM_MAX_BLOCKS 128              /* ... up to this many blocks (then more rows each) */
#define CUDA_DN_WS_CAP ((long long)64 << 20)    /* the most workspace a cuDNN attention plan may take */
#define CUDA_WEIGHT_COPIES 4096                 /* bf16 weight copies kept (kernels.h weights_stable) */

#define CUDA_FP8_PARTS 1024                     /* partials of an FP8 amax */
#define CUDA_FP8_ALLOC_PAD 256                  /* bytes the FP8 buffers each take past their size */
#define CUDA_FP8_BLOCK 128                      /* fp8.h FP8_BLOCK: the blockwise recipe's block edge */
#define CUDA_FP8_INV 5                          /* scratch operands with inverse scales: x, x^T, dout, dout^T, a weight */

/* The FP8 products' device buffers (kernels/fp8.cuh fp8_setup), from
 * kernels.h Fp8Sizes: the codes of a scratch activation and output
 * gradient (each in both layouts) and of a weight, with room for leading
 * dimensions padded to 16; the scale groups of an operand of e elements
 * (largest dimension D: at most e / 128 + D 1 x 128 blocks, in cuBLASLt's
 * padded layouts e / 128 + D + 3 (e / 128 + 1)), once as scales and once
 * per scratch operand as inverse scales; the fp32 stage of a product before
 * its bias or unaligned output; the arena of the weights' kept copies (both
 * layouts), their scales and, unless tensorwise, their inverse scales in
 * both orientations (a weight R x K (R, K <= D, R K = w) takes at most
 * w / 16384 + 5 D / 128 + 5 (tiles) or R + K + 6 <= D + w / D + 6 (rows) a
 * layout). */
typedef struct CudaFp8Caps {
    size_t act, w, stage_floats, arena, n_copies; /* bytes, bytes, floats, bytes, copies */
    size_t groups, copy_groups;                   /* floats: an operand's scales; the copies' inverse scales (0: none) */
} CudaFp8Caps;
static inline CudaFp8Caps cuda_fp8_caps(size_t act_floats, size_t weight_max, size_t weight_floats, int n_weights,
                                        int max_dim, int grouped) {
    const size_t pad = 16 * (size_t)max_dim + 16, D = (size_t)max_dim + 16;
    CudaFp8Caps c;
    c.act = act_floats + pad;
    c.w = weight_max + pad;
    c.stage_floats = (act_floats > weight_max ? act_floats : weight_max) + 4 * (size_t)max_dim;
    c.arena = 2 * (weight_floats + (size_t)n_weights * (pad + 512));
    c.n_copies = (size_t)n_weights;
    c.groups = (c.act > c.w ? c.act : c.w) / CUDA_FP8_BLOCK + 4 * D + 64;
    c.copy_groups = grouped ? 2 * (weight_floats / CUDA_FP8_BLOCK + weight_floats / D + (size_t)n_weights * (D + 16)) : 0;
    return c;
}
/* Every byte fp8_setup allocates for caps c, in its order: x, xt, d, dt,
 * w, the scales and the inverse scales, the amax partials, the stage, the
 * arena, the copies' scales and inverse scales. */
static inline size_t cuda_fp8_bytes(const CudaFp8Caps *c) {
    const size_t sizes[] = {c->act, c->act, c->act, c->act, c->w, (1 + CUDA_FP8_INV) * c->groups * sizeof(float),
                            CUDA_FP8_PARTS * sizeof(unsigned), c->stage_floats * sizeof(float), c->arena,
                            2 * (c->n_copies + 1) * sizeof(float), c->copy_groups * sizeof(float)};
    size_t s = 0, n = sizeof sizes / sizeof *sizes - (c->copy_groups == 0);
    for (size_t i = 0; i < n; i++) s += sizes[i];
    return s + (n + CUDA_FP8_INV) * CUDA_FP8_ALLOC_PAD; /* the scales and each inverse scale an allocation */
}

/* A scratch buffer grows to a request plus an eighth, and never shrinks. */
static inline size_t cuda_scratch_grow(size_t bytes) { return bytes + bytes / 8; }
/* Head dims the fused (flash) attention kernels are built for. */
static inline int cuda_flash_head_dim(int hd) { return hd == 32 || hd == 64 || hd == 128; }
/* Head dims cuDNN's fused attention takes. */
static inline int cuda_cudnn_head_dim(int hd) { return hd % 8 == 0 && hd <= 128; }

#endif
