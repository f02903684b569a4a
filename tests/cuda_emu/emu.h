/* tests/cuda_emu/emu.h — a host emulation of the part of CUDA that
 * kernels.cu, dist_nccl.c and tests/test_gpu.c use, so that the CUDA
 * backend's own source runs on a machine without a GPU (make test).
 *
 * What it is:
 *   - "Device" memory is host memory (256-byte aligned, counted against an
 *     emulated capacity); every stream runs at once, in issue order, so
 *     events and waits are always complete.
 *   - A kernel launch runs its blocks on a few OS threads at once (each
 *     takes the next block not yet run; LLMTRAIN_CUDA_EMU_THREADS, default
 *     the host's processors up to 8; 1 runs them one after another on the
 *     caller's thread); the threads of a block are fibers (one stack each)
 *     on one OS thread, switched only at __syncthreads, warp shuffles and
 *     the wmma and mma.sync operations, which are barriers over the block
 *     or the warp. So blocks that wrote each other's outputs, or read what
 *     another block of the same launch writes, would give results that
 *     depend on the threads' timing, as on the hardware. __shared__
 *     variables are thread-local function statics (one block at a time on
 *     each OS thread), dynamic shared memory is a buffer of exactly the
 *     bytes the launch asked for, 16-byte aligned and deliberately not
 *     128-byte aligned.
 *   - It is strict where the hardware is: a launch over 1024 threads, a grid
 *     beyond its limits or more dynamic shared memory than the kernel was
 *     allowed (48 KB unless cudaFuncSetAttribute raised it, at most the
 *     device's opt-in limit) fails the launch (cudaGetLastError); threads of
 *     a block waiting at different barriers (a divergent __syncthreads or a
 *     shuffle some lanes never reach) end the process with one line; a
 *     shuffle that reads a lane which has exited yields NaN.
 *   - wmma fragments hold the whole tile in every lane (the layout is the
 *     emulator's, as the kernels may not assume one), TF32 rounding is
 *     cvt.rna's (nearest, ties away), products accumulate in fp32. Tile
 *     pointers must be 32-byte aligned with a leading dimension of a
 *     multiple of 4 floats, TF32 operands must have been rounded, and every
 *     lane must bring the same operands to mma_sync (else the code assumed
 *     a fragment layout): each is one line and exit 70.
 *   - mma.sync.m16n8k16 bf16 (emu::mma_bf16_m16n8k16, which kernels.cu
 *     calls where the device build has the PTX instruction): each lane
 *     brings its own fragments in the PTX ISA's layouts, the warp's are
 *     assembled into the 16 x 16 and 16 x 8 operands (a warp barrier), and
 *     each lane gets its own four accumulators, summed in fp32; a warp with
 *     exited lanes is an error (one line, exit 70).
 *   - ldmatrix.m8n8.x1/x2/x4 (.trans) b16 (emu::ldmatrix) likewise: the
 *     lanes' row addresses are gathered, each lane gets its words in the
 *     PTX layout; a row address not 16-byte aligned is an error.
 *   - cuBLASLt: descriptors, layouts, preferences and a heuristic that
 *     records the alignments asked for; cublasLtMatmul checks the operands
 *     against them (a plan reused for a less aligned pointer is an error),
 *     computes in fp32 (inputs rounded to TF32 under
 *     CUBLAS_COMPUTE_32F_FAST_TF32, bf16 inputs widened) with the BIAS and
 *     GELU_AUX(_BIAS) and DGELU epilogues, batched and strided; FP8 A and
 *     B (E4M3 / E5M2, as Hopper takes them: the "TN" layout, 16-byte
 *     operands, scalar scales, no epilogue) dequantized (a code's value
 *     times its scale pointer's, in fp32) and multiplied in fp32, the CPU
 *     reference's arithmetic. The FP8 casts of cuda_fp8.h (include/) round
 *     to nearest even and saturate as fp8.h specifies, written apart from
 *     fp8.c. LLMTRAIN_CUDA_EMU_CC=8.0 (say) reports another compute
 *     capability than the default 9.0.
 *   - CUB's DeviceRadixSort::SortKeys over the bits asked for.
 *   - cuDNN's backend (graph) API (include/cudnn.h, cudnn_emu.cpp): the
 *     descriptors checked as the library checks them, and an interpreter
 *     that runs an operation graph (matmul, pointwise, reduction, reshape)
 *     on the host in fp32, rounding to each tensor's type.
 * What it is not: a timing model, a race detector or a memory checker
 * between host and device pointers.
 *
 * The device side (C++ only) is below the C part, which dist_nccl.c (C)
 * includes through cuda_runtime.h. */
#ifndef LLMTRAIN_CUDA_EMU_H
#define LLMTRAIN_CUDA_EMU_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct EmuStream *cudaStream_t;
typedef struct EmuEvent *cudaEvent_t;
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
enum { cudaHostAllocDefault = 0 };
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaDeviceAttr { cudaDevAttrClockRate = 13, cudaDevAttrMemoryClockRate = 36, cudaDevAttrGlobalMemoryBusWidth = 37 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

typedef struct cudaUUID_t {
    char bytes[16];
} cudaUUID_t;

typedef struct cudaDeviceProp {
    char name[256];
    cudaUUID_t uuid;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int multiProcessorCount;
    int major, minor;
    int maxThreadsPerBlock;
    int warpSize;
} cudaDeviceProp;

typedef struct cudaFuncAttributes {
    int maxThreadsPerBlock;
    int maxDynamicSharedSizeBytes;
    int numRegs;
} cudaFuncAttributes;

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* emulator internals shared with the C++ side */
cudaError_t emu_func_set_attribute(const void *f, enum cudaFuncAttribute a, int v);
cudaError_t emu_func_get_attributes(cudaFuncAttributes *fa, const void *f);

#ifdef __cplusplus
} /* extern "C" */

// ----------------------------------------------------------------------------
// device side: C++ only

#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <math.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* a + b (a - b) rounded on its own, never fused into a multiply-add (CUDA's
 * promise): out of line in emu.cpp, where the host compiler cannot fuse it
 * with the caller's multiply */
float __fadd_rn(float a, float b);
float __fsub_rn(float a, float b);

struct __nv_bfloat16 {
    uint16_t x;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u = __float_as_uint(f);
    __nv_bfloat16 b;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) b.x = (uint16_t)((u >> 16) | 0x40u);
    else b.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return b;
}
static inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((uint32_t)b.x << 16); }

namespace emu {

struct Fiber {
    void *sp;
    char *stack;
    uint3 tid;
    int lane, warp, done, started;
    unsigned shfl_round; /* shuffles this thread has taken part in */
    unsigned mma_round;  /* wmma products likewise */
};

/* the fiber running and its block: each OS thread that runs blocks has its
 * own (the launch's shape is the same for all) */
extern thread_local Fiber *cur;
extern thread_local uint3 block_idx;
extern dim3 block_dim, grid_dim;

void syncthreads();
void warp_barrier();
[[noreturn]] void trap(const char *why);
void *dyn_smem();
/* d = a b + c for one warp's tiles (row-major, m x k times k x n): the first
 * lane of the warp to arrive computes, the others check that their operands
 * are the same (else the kernel assumed a fragment layout) and copy */
void mma(float *d, const float *a, const float *b, const float *c, int m, int n, int k);
/* d += a b for one warp's m16n8k16 bf16 fragments in PTX's layouts (each
 * lane its own: a[4], b[2] words of two bf16, d[4] floats) */
void mma_bf16_m16n8k16(float *d, const uint32_t *a, const uint32_t *b);
/* ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: n matrices, row =
 * this lane's row address (lanes 8j..8j+7 address matrix j's rows), out[n] */
void ldmatrix(uint32_t *out, int n, int trans, const void *row);
/* a shuffle's exchange: every live lane of the warp publishes 8 bytes, then
 * reads lane src's (valid = 0 when src has exited or does not exist) */
uint64_t exchange(uint64_t mine, int src, int *valid);

/* run the launch: fn(ctx) once per thread of every block */
void execute(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem, void (*fn)(void *), void *ctx);

template <typename T> T shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    int valid = 0;
    uint64_t r = exchange(bits, src, &valid);
    T out;
    if (!valid) {
        if (std::is_floating_point<T>::value) return (T)NAN;
        memset(&out, 0xA5, sizeof out);
        return out;
    }
    memcpy(&out, &r, sizeof out);
    return out;
}

struct Launch {
    dim3 grid, block;
    size_t smem;
    Launch(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), smem(s) { (void)st; }
    template <typename... P, typename... A> void run(const char *name, void (*k)(P...), A &&...a) {
        typedef std::tuple<typename std::decay<P>::type...> Args;
        Args args(static_cast<typename std::decay<P>::type>(a)...);
        struct Ctx {
            void (*k)(P...);
            Args *args;
        } c = {k, &args};
        execute(name, (const void *)k, grid, block, smem,
                [](void *p) {
                    Ctx *cx = (Ctx *)p;
                    std::apply(cx->k, *cx->args);
                },
                &c);
    }
};

} // namespace emu

#define threadIdx (::emu::cur->tid)
#define blockIdx (::emu::block_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)

static inline void __syncthreads() { ::emu::syncthreads(); }
static inline void __trap() { ::emu::trap("__trap()"); }

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    (void)mask;
    return ::emu::shfl(v, ::emu::cur->lane ^ lane_mask);
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src) {
    (void)mask;
    return ::emu::shfl(v, src & 31);
}

template <typename T> static inline cudaError_t cudaFuncSetAttribute(T *f, enum cudaFuncAttribute a, int v) {
    return emu_func_set_attribute((const void *)f, a, v);
}
template <typename T> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *fa, T *f) {
    return emu_func_get_attributes(fa, (const void *)f);
}

// ----------------------------------------------------------------------------
// wmma: the m16n16k8 TF32 shapes. Every lane holds the whole tile, row-major
// [rows][cols]; loads, stores and products are warp barriers on both sides.

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
} // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct shape_of;
template <int M, int N, int K> struct shape_of<matrix_a, M, N, K> { enum { R = M, C = K }; };
template <int M, int N, int K> struct shape_of<matrix_b, M, N, K> { enum { R = K, C = N }; };
template <int M, int N, int K> struct shape_of<accumulator, M, N, K> { enum { R = M, C = N }; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    enum { rows = shape_of<Use, M, N, K>::R, cols = shape_of<Use, M, N, K>::C, num_elements = rows * cols };
    float x[num_elements];
};

static inline float __float_to_tf32(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u = (u + 0x1000u) & 0xffffe000u; /* nearest, ties away from zero (cvt.rna) */
    return __uint_as_float(u);
}

/* the hardware's rules for a tile in memory: a 256-bit aligned pointer, a
 * leading dimension that is a multiple of 16 bytes */
static inline void check_tile(const float *p, unsigned ldm) {
    if ((uintptr_t)p % 32 != 0) ::emu::trap("wmma tile pointer not 32-byte aligned");
    if (ldm % 4 != 0) ::emu::trap("wmma leading dimension not a multiple of 4 floats");
}

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const float *p, unsigned ldm) {
    typedef fragment<Use, M, N, K, T, L> F;
    check_tile(p, ldm);
    ::emu::warp_barrier();
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] = std::is_same<L, col_major>::value ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    ::emu::warp_barrier();
}

template <int M, int N, int K, typename T>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const float *p, unsigned ldm, layout_t l) {
    check_tile(p, ldm);
    ::emu::warp_barrier();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) f.x[r * N + c] = l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    ::emu::warp_barrier();
}

template <int M, int N, int K, typename T>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t l) {
    check_tile(p, ldm);
    ::emu::warp_barrier();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            float v = f.x[r * N + c];
            if (l == mem_col_major) p[(size_t)c * ldm + r] = v;
            else p[(size_t)r * ldm + c] = v;
        }
    ::emu::warp_barrier();
}

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float v) {
    for (int e = 0; e < fragment<Use, M, N, K, T, L>::num_elements; e++) f.x[e] = v;
}

template <int M, int N, int K, typename TA, typename LA, typename LB, typename TC>
static inline void mma_sync(fragment<accumulator, M, N, K, TC> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                            const fragment<matrix_b, M, N, K, TA, LB> &b, const fragment<accumulator, M, N, K, TC> &c) {
    if (std::is_same<TA, precision::tf32>::value) /* operands must come through __float_to_tf32 */
        for (int e = 0; e < M * K; e++)
            if ((__float_as_uint(a.x[e]) & 0x1fffu) || (__float_as_uint(b.x[e]) & 0x1fffu))
                ::emu::trap("wmma::mma_sync on a TF32 operand not rounded by __float_to_tf32");
    ::emu::warp_barrier();
    ::emu::mma(d.x, a.x, b.x, c.x, M, N, K);
}
} // namespace wmma
} // namespace nvcuda

#endif /* __cplusplus */
#endif
