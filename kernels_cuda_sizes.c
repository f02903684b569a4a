/* kernels_cuda_sizes.c — the CUDA backend's scratch memory for a shape,
 * added up from the sizes kernels.cu's parts allocate by
 * (kernels_cuda_sizes.h). Built in every binary: `llmtrain check` sizes a
 * CUDA run on a machine without CUDA too. */
#include "kernels.h"
#include "fp8.h"
#include "kernels_cuda_sizes.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Beside the layout's buffers: the cuBLASLt workspace and the reduction
 * partials, then buffers that grow to the largest request plus an eighth:
 * attention's P and dS blocks of [B, T, T] floats (the GEMM path; the
 * fused one keeps D rows of [B, heads, T] instead), the column-sum partials
 * of the bias and norm gradients, the embedding backward's sort keys and
 * CUB's temporary storage (taken as N x 8 bytes + 1 MiB), and under compute
 * dtype bf16 the bf16 copies of GEMM operands: scratch for the output
 * gradients, and the weights' kept copies; under compute dtype fp8 the FP8
 * products' buffers (kernels_cuda_sizes.h). An upper bound, which
 * tests/gpu_tests.sh holds against the device's measured peak. */
double kernels_cuda_scratch_bytes(const CudaScratchShape *m) {
    const double B = m->B, T = m->T, N = B * T, C = m->C, grow = (double)cuda_scratch_grow(1 << 20) / (1 << 20);
    double s = (double)CUDA_WORKSPACE_BYTES + 2.0 * CUDA_RED_MAX_BLOCKS * 8 + 8; /* the reductions and the sum-of-squares queue */
    const char *att = m->attention;
    if (m->cp > 1) att = "parts"; /* context parallelism: no whole-sequence attention, no scratch for it */
    int flash = m->cp > 1 || (strcmp(att, "gemm") != 0 && cuda_flash_head_dim(m->hd));
    if (m->cp <= 1) s += grow * (flash ? N * m->nh * 4.0 : 2.0 * B * T * T * 4.0);
    /* attention's fp32 output and output gradient beside the bf16 ones, and
     * its fp32 qkv and d(qkv) beside the bf16 [a] ones */
    if (m->bf16 && !flash) s += grow * (2.0 * N * m->nh * m->hd * 4.0 + 2.0 * N * m->qkv_dim * 4.0);
    /* cuDNN's attention (train.attention_kernel cudnn, the default under
     * bf16): unless they are bf16 [a], bf16 copies of qkv, dqkv, out and dO;
     * the rows' dO.O sums, the fp32 dQ accumulator, the plan's workspace */
    int cudnn = m->cp > 1 ? 0 : strcmp(att, "auto") != 0 ? strcmp(att, "cudnn") == 0 : m->bf16;
    if (cudnn && cuda_cudnn_head_dim(m->hd)) {
        double S = m->qkv_dim, OS = (double)m->nh * m->hd;
        s += grow * ((m->bf16 ? 0.0 : 2.0 * N * (S + OS) * 2.0) + N * m->nh * 4.0 + N * OS * 4.0 + (double)CUDA_DN_WS_CAP);
    }
    /* the column sums' partials (bias gradients; the norms' weight
     * gradients where C is too wide for their one-pass backward), or those
     * of the one-pass norm backward */
    double rb = fmin((double)CUDA_COLSUM_MAX_BLOCKS, ceil(N / CUDA_COLSUM_ROWS)), widest = 2 * C;
    if (m->gpt2) widest = fmax(widest, fmax(m->fc_dim, m->qkv_dim));
    if (m->qk_norm) widest = fmax(widest, 16.0 * m->hd); /* QK-norm's two weight gradients, 8 partials a row block */
    double rbn = fmin((double)CUDA_NORM_BWD_MAX_BLOCKS, ceil(N / 8.0));
    rbn = ceil(N / ceil(N / rbn));
    s += grow * fmax(rb * widest, rbn * (m->gpt2 ? 2.0 : 1.0) * C) * 4.0;
    s += grow * (2.0 * ceil(N * 8.0 / 256.0) * 256.0 + N * 8.0 + 1048576.0);
    if (m->bf16) {
        /* bf16 scratch copies of a product's operands: a backward's output
         * gradient (N rows of a linear layer's outputs, C wide: the LM
         * head's, the qkv projection's and the MLP up-projection's are bf16
         * already, SwiGLU's made from a bf16 scratch of N x F), GPT-2's
         * up-projection bias for the GELU epilogue, and without the
         * weights' copies (kernels.h weights_stable; or past
         * CUDA_WEIGHT_COPIES of them) a weight matrix, at most the largest */
        double wmax = fmax((double)m->V * C, fmax(fmax(m->qkv_dim, m->fc_dim) * C, C * fmax(m->F, (double)m->nh * m->hd)));
        s += grow * 2.0 * N * C;
        if (m->gpt2) s += grow * 2.0 * m->fc_dim;
        else s += grow * 2.0 * N * m->F;
        /* the weights' copies, exactly their size: every layer's four and
         * the LM head, or sharded, those of the layers' pool slots; not
         * sharded, from the first AdamW on one flat copy of all the weights
         * (the copies of weights off its 8-float grid stay beside it) */
        const char *wc = getenv("LLMTRAIN_CUDA_WEIGHT_CACHE");
        if (!(wc && strcmp(wc, "0") == 0) && 4 * m->weight_copies + 1 <= CUDA_WEIGHT_COPIES) {
            double layer = (double)m->qkv_dim * C + C * m->nh * m->hd + (double)m->fc_dim * C + C * m->F;
            double own = 2.0 * (m->weight_copies * layer + (double)m->V * C);
            s += m->sharded ? own : fmax(own, 2.0 * (double)m->n_params + (m->off_grid ? own : 0.0));
        } else {
            s += grow * 2.0 * wmax;
        }
    }
    if (m->fp8) { /* allocated once, exactly (fp8_setup) */
        const CudaFp8Caps cap = cuda_fp8_caps(m->fp8->act_floats, m->fp8->weight_max, m->fp8->weight_floats,
                                              m->fp8->n_weights, m->fp8->max_dim, m->fp8_recipe != FP8_TENSORWISE);
        s += (double)cuda_fp8_bytes(&cap);
    }
    return s;
}
