/* kernels.cu — the CUDA backend of kernels.h (fp32 storage; under
 * train.compute_dtype bf16, the default, the [a] activations, which only
 * products read, are bf16).
 *
 * Every pointer is device memory; all work goes to the legacy default stream
 * in issue order, so the kernels.h contract (forward overwrites, backward adds,
 * calls see each other's results) holds without extra synchronisation.
 * to_host and the reductions that return a number synchronise (by polling
 * when a communication library set a host-wait hook: host_wait below).
 *
 * Matrix products: cuBLASLt. Under compute dtype bf16 (matmul_mode below)
 * the linear layers' GEMMs multiply bf16 operands with fp32 accumulation,
 * the [a] activations stored as bf16 by the kernels that write them; under
 * tf32, CUBLAS_COMPUTE_32F_FAST_TF32 — fp32 in and out, tensor cores read
 * the inputs rounded to TF32 (10-bit mantissa) and accumulate in fp32, no
 * conversion pass and no scratch copy, at half the bf16 tensor rate; under
 * fp32, plain fp32 without tensor cores.
 *
 * Attention: cuDNN's fused attention (the default under bf16, where it
 * reads the bf16 [a] qkv and out as they are), fused flash-style kernels
 * (tiles of queries x keys in shared memory and registers, online softmax,
 * no T x T scratch; TF32 tensor cores through wmma, fp32 FMA under compute
 * dtype fp32, bf16 tensor cores through mma.sync with the scores in
 * registers under bf16; head dims 32,
 * 64, 128): see the "attention, fused" section and the bf16 region after
 * it. Other head dims, and every shape under train.attention_kernel gemm,
 * take strided-batched
 * cuBLASLt GEMMs on the full T x T square (the masked half is computed and
 * thrown away), one query head at a time, with hand-written causal softmax
 * and softmax-backward kernels; the probabilities live in a [B, T, T]
 * scratch: the forward saves each row's log-sum-exp, the backward recomputes
 * them. On an H100 the fused kernels were 6% faster for the Llama 3.2 1B
 * shape at T=4096 and level with the GEMMs for GPT-2 124M at T=1024.
 * Context parallelism's attention parts (a segment of queries against a
 * segment of keys, merged by the log-sum-exp; the bf16 tensor-core kernels
 * above under bf16, else fp32 tiles) and copy_2d:
 * kernels/attention_part.cuh.
 *
 * Mixture of experts (moe.c): the router's softmax and top-k a warp a
 * token, the rows permuted to the experts and their outputs combined back
 * in the CPU's order, so the same bits: kernels/moe.cuh. The experts'
 * products are the GEMMs above, one an expert.
 *
 * Everything that needs scratch memory (cuBLASLt workspace, reduction
 * partials, attention's P and dP blocks, column-sum partials, AdamW
 * range tables, the embedding backward's sort keys) allocates at first use
 * and only grows, so steady-state steps never allocate. Every CUDA and
 * cuBLASLt call is checked: a failure prints one line with file:line and
 * exits (70; 3 for out of memory). */
#include <cub/device/device_radix_sort.cuh>
#include <cublasLt.h>
#include <cudnn.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels.h"
#include "kernels_cuda_sizes.h"
#include "util.h"
}

// ----------------------------------------------------------------------------
// the parts, one concern each (kernels/*.cuh), in dependency order
#include "kernels/common.cuh"
#include "kernels/norm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/fp8.cuh"
#include "kernels/attention_gemm.cuh"
#include "kernels/attention_flash.cuh"
#include "kernels/attention_flash_bf16.cuh"
#include "kernels/attention.cuh"
#include "kernels/attention_cudnn.cuh"
#include "kernels/attention_part.cuh"
#include "kernels/pointwise.cuh"
#include "kernels/moe.cuh"
#include "kernels/loss.cuh"
#include "kernels/reduce.cuh"
#include "kernels/adamw.cuh"
#include "kernels/offload.cuh"

// ----------------------------------------------------------------------------
// the table, device selection, probe and peak

/* not const: act_bytes follows the compute dtype, set by kernels_cuda() */
static Kernels cuda_kernels = {
    /* .name = */ "cuda",
    /* .act_bytes = */ 4,
/* the rest in the op list's order, op NAME's function cu_NAME */
#define KERNEL_OP(ret, name, params, args) cu_##name,
#define KERNEL_OP_RET(ret, name, params, args) cu_##name,
#define KERNEL_CTL(ret, name, params, args) cu_##name,
#include "kernels_ops.h"
#undef KERNEL_OP
#undef KERNEL_OP_RET
#undef KERNEL_CTL
};

/* No CUDA call happens before this, kernels_cuda_available or kernels_cuda:
 * a CPU run of a CUDA build never touches the driver. */
extern "C" int kernels_cuda_device_count(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        if (why && n) snprintf(why, n, "%s", cudaGetErrorString(e));
        (void)cudaGetLastError(); /* clear the probe's error */
        return 0;
    }
    if (count < 1 && why && n) snprintf(why, n, "no CUDA device found");
    return count;
}

extern "C" void kernels_cuda_set_device(int dev) {
    if (G.ready && dev != G.dev) die(EXIT_INTERNAL, "kernels_cuda_set_device(%d) after device %d was initialised", dev, G.dev);
    G.dev = dev;
}

extern "C" int kernels_cuda_device_uuid(char *out, size_t n) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, G.dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4],
             u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    return 0;
}

extern "C" int kernels_cuda_available(char *why, size_t n) {
    int count = kernels_cuda_device_count(why, n);
    if (count < 1) return 0;
    if (G.dev >= count) {
        if (why && n) snprintf(why, n, "device %d asked for, %d visible", G.dev, count);
        return 0;
    }
    /* a kernel image for this GPU (sm_80/sm_90 machine code, PTX for newer) */
    cudaFuncAttributes fa;
    cudaError_t e = cudaSetDevice(G.dev);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, add_k);
    if (e != cudaSuccess) {
        cudaDeviceProp prop;
        int ok = cudaGetDeviceProperties(&prop, G.dev) == cudaSuccess;
        if (why && n)
            snprintf(why, n, "device %d%s%s (compute capability %d.%d): %s", G.dev, ok ? ": " : "", ok ? prop.name : "",
                     ok ? prop.major : 0, ok ? prop.minor : 0, cudaGetErrorString(e));
        (void)cudaGetLastError(); /* clear the probe's error */
        return 0;
    }
    if (why && n) snprintf(why, n, "%d device%s", count, count == 1 ? "" : "s");
    return 1;
}

static void cuda_init(void) {
    if (G.ready) return;
    char why[256];
    if (!kernels_cuda_available(why, sizeof why)) die(EXIT_USAGE, "CUDA backend: no usable CUDA device (%s)", why);
    CUDA_CHECK(cudaSetDevice(G.dev));
    CUDA_CHECK(cudaGetDeviceProperties(&G.prop, G.dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&G.clock_khz, cudaDevAttrClockRate, G.dev));
    CUBLAS_CHECK(cublasLtCreate(&G.lt));
    G.ws_bytes = WORKSPACE_BYTES;
    DEV_MALLOC(&G.ws, G.ws_bytes);
    DEV_MALLOC(&G.red_partial, RED_MAX_BLOCKS * sizeof(double));
    DEV_MALLOC(&G.red_out, sizeof(double));
    DEV_MALLOC(&SIDE.partial, RED_MAX_BLOCKS * sizeof(double));
    int least, greatest; /* a larger number is a lower priority */
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&SIDE.s, cudaStreamNonBlocking, least));
    CUDA_CHECK(cudaEventCreateWithFlags(&SIDE.after_compute, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&SIDE.done, cudaEventDisableTiming));
    G.ready = 1;
}

extern "C" const Kernels *kernels_cuda(void) {
    cuda_init();
    mm_fixed = 1;
    cuda_kernels.act_bytes = act_bf16() ? 2 : 4;
    return &cuda_kernels;
}

extern "C" void *kernels_cuda_stream(void) { return (void *)0; /* the legacy default stream */ }

extern "C" void kernels_cuda_set_host_wait(void (*poll)(void *ctx), void *ctx) {
    cuda_init();
    if (poll && !HW.ev) CUDA_CHECK(cudaEventCreateWithFlags(&HW.ev, cudaEventDisableTiming));
    HW.poll = poll;
    HW.ctx = ctx;
}

static const char *att_cudnn_info(void) {
    static char s[160];
    snprintf(s, sizeof s, "cudnn (cuDNN %zu fused attention on bf16 qkv, head dims 8..128 by 8; the fused kernels "
             "for shapes it declines; train.attention_kernel flash or gemm)", (size_t)cudnnGetVersion());
    return s;
}

extern "C" const char *kernels_cuda_device_info(void) {
    static char info[512];
    cuda_init();
    snprintf(info, sizeof info, "device %d: %.200s, %d SMs, cc %d.%d, %.1f GiB; matmuls %s (cuBLASLt %zu); attention %s",
             G.dev, G.prop.name, G.prop.multiProcessorCount, G.prop.major, G.prop.minor,
             (double)G.prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
             F8.wanted                  ? "FP8 layer linears, else bf16 (train.compute_dtype fp8)"
             : matmul_mode() == MM_BF16 ? "bf16 tensor cores (train.compute_dtype bf16)"
             : matmul_mode() == MM_FP32 ? "plain fp32 (train.compute_dtype fp32)"
                                        : "TF32 tensor cores (train.compute_dtype tf32)",
             cublasLtGetVersion(),
             attention_mode() == ATT_CUDNN ? att_cudnn_info()
             : attention_mode() != ATT_FLASH ? "gemm (cuBLASLt GEMMs + softmax kernels)"
             : fl_bf16() ? "flash (fused kernels, bf16 tensor cores through mma.sync, head dims 32/64/128; train.attention_kernel gemm for the GEMMs)"
             : fl_tensor_cores() ? "flash (fused kernels, TF32 tensor cores, head dims 32/64/128; train.attention_kernel gemm for the GEMMs)"
                                 : "flash (fused kernels, fp32 FMA, head dims 32/64/128; train.attention_kernel gemm for the GEMMs)");
    return info;
}

/* HBM and GDDR move two words a memory clock on each bus line: an H100 SXM
 * (2619 MHz, 5120 bits) gives its datasheet's 3.35 TB/s. */
extern "C" double kernels_cuda_peak_gbs(void) {
    cuda_init();
    int clk_khz = 0, bus_bits = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, G.dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, G.dev));
    return 2.0 * clk_khz * 1e3 * (bus_bits / 8.0) * 1e-9;
}

/* Dense bf16 tensor-core peak (GFLOP/s) of the device: the datasheet figure
 * for the parts named, else SMs x clock x bf16 FLOPs per SM per clock of the
 * architecture. */
extern "C" double kernels_cuda_peak_gflops(const char **source) {
    cuda_init();
    const char *nm = G.prop.name;
    const char *src = "bf16 dense peak of the detected GPU";
    double peak = 0.0;
    if (strstr(nm, "H100") || strstr(nm, "H200") || strstr(nm, "GH200")) {
        if (strstr(nm, "PCIe")) peak = 756e3;
        else if (strstr(nm, "NVL")) peak = 835e3; /* H100 NVL and H200 NVL */
        else peak = 989e3; /* SXM */
    } else if (strstr(nm, "A100")) {
        peak = 312e3;
    } else {
        int per_clk = G.prop.major >= 10 ? 8192 : G.prop.major == 9 ? 4096 : (G.prop.major == 8 && G.prop.minor == 0) ? 2048
                      : G.prop.major == 8 ? 512 : 256;
        peak = (double)G.prop.multiProcessorCount * (G.clock_khz * 1e3) * per_clk * 1e-9;
        src = "bf16 dense peak estimated from SMs x clock";
    }
    if (source) *source = src;
    return peak;
}
