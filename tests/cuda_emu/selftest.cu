/* tests/cuda_emu/selftest.cu — the emulator's own checks (selftest.sh runs
 * each mode): what must work works, and what the hardware would get wrong
 * or refuse fails here too. Built from this .cu through cu2cpp.py, like
 * kernels.cu. Usage: selftest MODE; prints "ok ..." or "FAIL ...", exit 0/1,
 * except the modes that must end the process with the emulator's error. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

__global__ void shfl_k(float *out, int live) {
    int lane = threadIdx.x & 31;
    if (lane >= live) return;
    float v = (float)lane;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    out[threadIdx.x] = v;
}

template <int N> __global__ void smem_k(float *out) {
    extern __shared__ __align__(16) float dyn[];
    __shared__ float stat[N];
    int t = threadIdx.x;
    dyn[t] = (float)t;
    stat[t % N] = 1.0f;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = dyn[blockDim.x - 1 - t] + stat[0] + (float)blockIdx.x * 1000.0f;
}

__global__ void diverge_k(float *out) {
    float v = 1.0f;
    if ((threadIdx.x & 31) < 16) __syncthreads();
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

namespace wm = nvcuda::wmma;
__global__ void wmma_k(float *d, const float *a, const float *b, int poison) {
    wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, wm::row_major> fa;
    wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, wm::row_major> fb;
    wm::fragment<wm::accumulator, 16, 16, 8, float> acc;
    wm::fill_fragment(acc, 0.0f);
    wm::load_matrix_sync(fa, a + (poison == 2), 8);
    wm::load_matrix_sync(fb, b, 16);
    if (poison == 1 && threadIdx.x == 3) fa.x[0] += 1.0f; /* a lane-dependent change: assumes a layout */
    wm::mma_sync(acc, fa, fb, acc);
    wm::store_matrix_sync(d, acc, 16, wm::mem_row_major);
}

/* one m16n8k16 bf16 product through the emulator's mma.sync, with the
 * fragments formed element by element from the PTX ISA's formulas (groupID
 * g = lane >> 2, t = lane % 4; A element i of 8: row g for i in {0,1,4,5}
 * else g + 8, column 2t + (i & 1) (+ 8 for i >= 4); B element i of 4: row
 * 2t + (i & 1) (+ 8 for i >= 2), column g; C element i of 4: row g (+ 8 for
 * i >= 2), column 2t + (i & 1)); two elements a word, the lower index in
 * the low half. live < 32: the other lanes exit first (the emulator must
 * refuse). a [16][16], b [16][8], d [16][8], row-major, values exact in bf16 */
static unsigned bf16_bits(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u >> 16;
}
__global__ void mma_bf16_k(float *d, const float *a, const float *b, int live) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (lane >= live) return;
    unsigned ea[8], eb[4];
    for (int i = 0; i < 8; i++) {
        const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        ea[i] = bf16_bits(a[row * 16 + col]);
    }
    for (int i = 0; i < 4; i++) eb[i] = bf16_bits(b[(2 * t + (i & 1) + (i >= 2 ? 8 : 0)) * 8 + g]);
    uint32_t fa[4], fb[2];
    for (int r = 0; r < 4; r++) fa[r] = ea[2 * r] | ea[2 * r + 1] << 16;
    for (int r = 0; r < 2; r++) fb[r] = eb[2 * r] | eb[2 * r + 1] << 16;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ::emu::mma_bf16_m16n8k16(c, fa, fb);
    for (int i = 0; i < 4; i++) d[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = c[i];
}

/* ldmatrix.x4 (trans = 0 / 1) from a [32][16] b16 array in shared memory
 * (rows of 32 bytes): lane l addresses row l of the array at column
 * col0 (matrix l / 8, its row l % 8); out[lane * 4 + j] = the lane's word of
 * matrix j. col0 = 1 misaligns every row address (the emulator must refuse) */
__global__ void ldsm_k(unsigned *out, int trans, int col0) {
    __shared__ __align__(16) uint16_t tile[32][16];
    const int lane = threadIdx.x & 31;
    for (int c = 0; c < 16; c++) tile[lane][c] = (uint16_t)(lane * 16 + c);
    __syncthreads();
    uint32_t r[4];
    ::emu::ldmatrix(r, 4, trans, &tile[lane][col0]);
    for (int j = 0; j < 4; j++) out[lane * 4 + j] = r[j];
}

/* Blocks at once: each block fills its __shared__ array with its own
 * values, passes a barrier and shuffles, and reads them back reversed; a
 * block sharing the array with one run at the same time on another thread
 * would read the other's. Each block also records the OS thread it ran on
 * (the emulator's own business: this file is never built by nvcc). */
__global__ void blocks_k(float *out, unsigned long *who) {
    __shared__ float s[256];
    int t = threadIdx.x;
    s[t] = (float)(blockIdx.x * 1000 + t);
    __syncthreads();
    float v = s[255 - t];
    for (int o = 16; o > 0; o >>= 1) v += 0.0f * __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    s[t] = -1.0f; /* the next block on this thread must not see these */
    out[blockIdx.x * 256 + t] = v;
    if (t == 0) who[blockIdx.x] = (unsigned long)pthread_self();
}

/* many blocks, one of them (37) with a barrier half its warp never reaches */
__global__ void diverge_many_k(float *out) {
    float v = 1.0f;
    if (blockIdx.x == 37 && (threadIdx.x & 31) < 16) __syncthreads();
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[blockIdx.x * 32 + threadIdx.x] = v;
}

static int report(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    float *d;
    cudaMalloc((void **)&d, 1 << 20);
    float h[1024];
    if (!strcmp(mode, "shuffle")) {
        shfl_k<<<1, 64>>>(d, 32);
        cudaMemcpy(h, d, 64 * sizeof(float), cudaMemcpyDeviceToHost);
        int ok = 1;
        for (int i = 0; i < 64; i++) ok &= h[i] == 496.0f;
        int bad = report(ok, "a butterfly sum of the lane ids is 496 in every lane of 2 warps");
        shfl_k<<<1, 32>>>(d, 20); /* lanes 20..31 exited: lanes reading them see NaN */
        cudaMemcpy(h, d, 20 * sizeof(float), cudaMemcpyDeviceToHost);
        int nans = 0;
        for (int i = 0; i < 20; i++) nans += isnan(h[i]) != 0;
        return bad | report(nans == 20, "a shuffle that reads exited lanes gives NaN (20 of 20 lanes read one)");
    }
    if (!strcmp(mode, "smem")) {
        size_t big = 64 * 1024;
        smem_k<32><<<2, 256, big>>>(d);
        int refused = cudaGetLastError() == cudaErrorInvalidValue;
        int bad = report(refused, "64 KB of dynamic shared memory without cudaFuncSetAttribute: the launch fails");
        cudaFuncSetAttribute(smem_k<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big);
        smem_k<32><<<2, 256, big>>>(d);
        int ok = cudaGetLastError() == cudaSuccess;
        cudaMemcpy(h, d, 512 * sizeof(float), cudaMemcpyDeviceToHost);
        for (int t = 0; t < 512; t++) ok &= h[t] == (float)(255 - t % 256) + 1.0f + (float)(t / 256) * 1000.0f;
        bad |= report(ok, "after cudaFuncSetAttribute it runs: dynamic and static shared memory shared by the block");
        smem_k<32><<<1, 2048>>>(d);
        bad |= report(cudaGetLastError() == cudaErrorInvalidConfiguration, "a block of 2048 threads fails to launch");
        return bad;
    }
    if (!strcmp(mode, "blocks")) { /* run with LLMTRAIN_CUDA_EMU_THREADS=4 */
        const int nb = 128;
        unsigned long *who, hw[128];
        float *hb = (float *)malloc(nb * 256 * sizeof(float));
        cudaMalloc((void **)&who, sizeof hw);
        blocks_k<<<2, 64>>>(d, who); /* 2 blocks of 64 start one helper thread, the next launch more */
        blocks_k<<<nb, 256>>>(d, who);
        cudaMemcpy(hb, d, nb * 256 * sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(hw, who, sizeof hw, cudaMemcpyDeviceToHost);
        int ok = 1, threads = 0;
        for (int i = 0; i < nb * 256; i++) ok &= hb[i] == (float)(i / 256 * 1000 + 255 - i % 256);
        for (int b = 0; b < nb; b++) {
            int seen = 0;
            for (int c = 0; c < b; c++) seen |= hw[c] == hw[b];
            threads += !seen;
        }
        char what[160];
        snprintf(what, sizeof what, "128 blocks on %d OS threads: every block read back only its own __shared__ values", threads);
        free(hb);
        return report(ok && threads > 1, what);
    }
    if (!strcmp(mode, "diverge-many")) { /* must end the process, from whichever thread ran block 37 */
        diverge_many_k<<<64, 32>>>(d);
        cudaDeviceSynchronize();
        return report(0, "a barrier half a warp of block 37 never reaches went unnoticed");
    }
    if (!strcmp(mode, "diverge")) { /* must end the process */
        diverge_k<<<1, 32>>>(d);
        cudaDeviceSynchronize();
        return report(0, "a barrier half a warp never reaches went unnoticed");
    }
    if (!strcmp(mode, "wmma") || !strcmp(mode, "wmma-poison") || !strcmp(mode, "wmma-misaligned")) {
        float a[16 * 8], b[8 * 16], ref[256];
        for (int i = 0; i < 128; i++) { a[i] = (float)(i % 7) - 3.0f; b[i] = (float)(i % 5) * 0.5f; }
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                float s = 0.0f;
                for (int k = 0; k < 8; k++) s += a[i * 8 + k] * b[k * 16 + j];
                ref[i * 16 + j] = s;
            }
        float *da = d + 1024, *db = d + 2048;
        cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
        wmma_k<<<1, 32>>>(d, da, db, !strcmp(mode, "wmma-poison") ? 1 : !strcmp(mode, "wmma") ? 0 : 2);
        cudaMemcpy(h, d, 256 * sizeof(float), cudaMemcpyDeviceToHost);
        return report(memcmp(h, ref, sizeof ref) == 0, "a 16x16x8 wmma product (small integers: exact in TF32)");
    }
    if (!strcmp(mode, "mma-bf16") || !strcmp(mode, "mma-bf16-partial")) {
        float a[16 * 16], b[16 * 8], ref[16 * 8];
        for (int i = 0; i < 256; i++) a[i] = (float)(i % 7) - 3.0f + (float)(i / 16) * 0.25f;
        for (int i = 0; i < 128; i++) b[i] = (float)(i % 5) * 0.5f - (float)(i % 3);
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                float s = 0.0f;
                for (int k = 0; k < 16; k++) s += a[i * 16 + k] * b[k * 8 + j];
                ref[i * 8 + j] = s;
            }
        float *da = d + 1024, *db = d + 2048;
        cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
        mma_bf16_k<<<1, 32>>>(d, da, db, !strcmp(mode, "mma-bf16") ? 32 : 16);
        cudaMemcpy(h, d, sizeof ref, cudaMemcpyDeviceToHost);
        return report(memcmp(h, ref, sizeof ref) == 0,
                      "a 16x8x16 mma.sync bf16 product, fragments in the PTX ISA's layouts (exact values)");
    }
    if (!strcmp(mode, "ldmatrix") || !strcmp(mode, "ldmatrix-misaligned")) {
        /* PTX: each lane holds row l / 4, elements 2(l % 4) and 2(l % 4) + 1
         * of each 8 x 8 matrix; with .trans the same of the transpose */
        unsigned *du = (unsigned *)d, got[128];
        int bad = 0;
        for (int trans = 0; trans < 2; trans++) {
            ldsm_k<<<1, 32>>>(du, trans, !strcmp(mode, "ldmatrix") ? 0 : 1);
            cudaMemcpy(got, du, sizeof got, cudaMemcpyDeviceToHost);
            int ok = 1;
            for (int l = 0; l < 32; l++)
                for (int j = 0; j < 4; j++) {
                    int r0 = trans ? 2 * (l % 4) : l / 4, c0 = trans ? l / 4 : 2 * (l % 4);
                    int r1 = trans ? r0 + 1 : r0, c1 = trans ? c0 : c0 + 1;
                    unsigned want = (unsigned)((8 * j + r0) * 16 + c0) | (unsigned)((8 * j + r1) * 16 + c1) << 16;
                    ok &= got[l * 4 + j] == want;
                }
            bad |= report(ok, trans ? "ldmatrix.x4.trans gives each lane its words of the transposed 8x8 matrices"
                                    : "ldmatrix.x4 gives each lane its words of four 8x8 matrices (PTX layout)");
        }
        return bad;
    }
    if (!strcmp(mode, "cublas-align")) {
        cublasLtHandle_t lt;
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t l;
        cublasLtMatmulPreference_t pref;
        cublasLtCreate(&lt);
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F);
        cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 16, 16, 16);
        cublasLtMatmulPreferenceCreate(&pref);
        uint32_t al = 16;
        for (int a = CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES; a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES; a++)
            cublasLtMatmulPreferenceSetAttribute(pref, (cublasLtMatmulPreferenceAttributes_t)a, &al, sizeof al);
        cublasLtMatmulHeuristicResult_t res;
        int n = 0;
        cublasLtMatmulAlgoGetHeuristic(lt, desc, l, l, l, l, pref, 1, &res, &n);
        float one = 1.0f, zero = 0.0f;
        cublasStatus_t s1 = cublasLtMatmul(lt, desc, &one, d, l, d + 512, l, &zero, d + 1024, l, d + 1024, l, &res.algo,
                                           NULL, 0, 0);
        cublasStatus_t s2 = cublasLtMatmul(lt, desc, &one, d + 1, l, d + 512, l, &zero, d + 1024, l, d + 1024, l,
                                           &res.algo, NULL, 0, 0);
        return report(n == 1 && s1 == CUBLAS_STATUS_SUCCESS && s2 == CUBLAS_STATUS_NOT_SUPPORTED,
                      "a cuBLASLt plan chosen for 16-byte operands refuses a 4-byte aligned one");
    }
    if (!strcmp(mode, "events")) { /* as CUDA: timing events only, both recorded, elapsed in order */
        cudaEvent_t a, b, nt, fresh;
        cudaEventCreateWithFlags(&a, cudaEventDefault);
        cudaEventCreateWithFlags(&b, cudaEventDefault);
        cudaEventCreateWithFlags(&nt, cudaEventDisableTiming);
        cudaEventCreateWithFlags(&fresh, cudaEventDefault);
        cudaEventRecord(a, 0);
        shfl_k<<<64, 64>>>(d, 32);
        cudaEventRecord(b, 0);
        cudaEventRecord(nt, 0);
        cudaEventSynchronize(b);
        float ms = -1.0f, x = 0.0f;
        int ok = cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0.0f;
        int bad = report(ok, "cudaEventElapsedTime between two recorded timing events: >= 0 ms");
        bad |= report(cudaEventElapsedTime(&x, a, nt) == cudaErrorInvalidResourceHandle,
                      "an event created with cudaEventDisableTiming: invalid resource handle");
        bad |= report(cudaEventElapsedTime(&x, a, fresh) == cudaErrorInvalidResourceHandle,
                      "an event never recorded: invalid resource handle");
        (void)cudaGetLastError();
        return bad;
    }
    fprintf(stderr, "selftest: unknown mode '%s'\n", mode);
    return 2;
}
