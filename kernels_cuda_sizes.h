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

/* A scratch buffer grows to a request plus an eighth, and never shrinks. */
static inline size_t cuda_scratch_grow(size_t bytes) { return bytes + bytes / 8; }
/* Head dims the fused (flash) attention kernels are built for. */
static inline int cuda_flash_head_dim(int hd) { return hd == 32 || hd == 64 || hd == 128; }
/* Head dims cuDNN's fused attention takes. */
static inline int cuda_cudnn_head_dim(int hd) { return hd % 8 == 0 && hd <= 128; }

#endif
