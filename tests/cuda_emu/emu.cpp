/* tests/cuda_emu/emu.cpp — the host emulation of CUDA (see emu.h): runtime,
 * the fiber scheduler that runs a block's threads, cuBLASLt.
 *
 * Environment:
 *   LLMTRAIN_CUDA_EMU_DEVICES  devices the emulated node has (default 1; 0: none)
 *   CUDA_VISIBLE_DEVICES       as CUDA reads it: the node's devices this process
 *                              sees, by index, in that order, up to the first
 *                              one that does not exist; each device's UUID
 *                              (cudaDeviceProp.uuid) names its index on the node
 *   LLMTRAIN_CUDA_EMU_MEM_MIB  device memory (default 81920 MiB): cudaMalloc
 *                              past it is cudaErrorMemoryAllocation */
#include "include/cublasLt.h"
#include "include/cuda_fp8.h"
#include "emu.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

float __fadd_rn(float a, float b) { return a + b; }
float __fsub_rn(float a, float b) { return a - b; }

// ----------------------------------------------------------------------------
// fibers: an x86-64 context switch (the callee-saved registers on the old
// stack, then the new stack pointer; MXCSR and the x87 control word are the
// same in every fiber, as kernels do not change them)

extern "C" void emu_switch(void **save_sp, void *to_sp);
__asm__(".text\n"
        ".globl emu_switch\n"
        ".type emu_switch,@function\n"
        "emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n");

static void die_emu(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die_emu(int code, const char *fmt, ...) {
    /* blocks run on several threads: the first to fail speaks and exits,
     * any other waits for the exit */
    static std::atomic<int> dying{0};
    if (dying.exchange(1))
        for (;;) pause();
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "llmtrain: CUDA emulator: %s\n", buf);
    fflush(stderr);
    exit(code);
}

namespace emu {

/* Each OS thread that runs blocks has its own fibers, warps, block state,
 * scheduler stack and shared memory; the launch's kernel, arguments and
 * shape are everyone's (set before the threads start, read only). */
thread_local Fiber *cur;
thread_local uint3 block_idx;
dim3 block_dim, grid_dim;

static const size_t STACK_BYTES = 64 * 1024;
static thread_local std::vector<Fiber> fibers;
static thread_local void *sched_sp;
static void (*run_fn)(void *);
static void *run_ctx;
static const char *run_name;
static size_t run_smem;
static thread_local char *smem_buf;
static thread_local size_t smem_cap;
static thread_local unsigned long long events; /* barrier arrivals and exits: progress */

struct Warp {
    int alive, arrived;
    unsigned gen;
    uint64_t val[2][32];
    unsigned round[2][32];
    unsigned mma_round;
    float a[16 * 16], b[16 * 16], c[16 * 16], d[16 * 16];
    uint32_t fa[32][4], fb[32][2]; /* mma.sync's fragments, by lane */
    const uint16_t *rows[32];      /* ldmatrix's row addresses, by lane */
};
static thread_local std::vector<Warp> warps;
static thread_local struct {
    int alive, arrived;
    unsigned gen;
} blk;

static void yield() { emu_switch(&cur->sp, sched_sp); }

static void release_warp(Warp &w) {
    w.arrived = 0;
    w.gen++;
}

void warp_barrier() {
    Warp &w = warps[cur->warp];
    unsigned g = w.gen;
    events++;
    if (++w.arrived == w.alive) release_warp(w);
    else
        while (w.gen == g) yield();
}

static void release_block() {
    blk.arrived = 0;
    blk.gen++;
}

void syncthreads() {
    unsigned g = blk.gen;
    events++;
    if (++blk.arrived == blk.alive) release_block();
    else
        while (blk.gen == g) yield();
}

/* Two slots per lane, by the parity of the round: a lane may write round
 * r + 1's value while others still read round r's, and cannot reach round
 * r + 2 before every lane has passed round r + 1's barrier, so one barrier
 * per shuffle is enough. */
uint64_t exchange(uint64_t mine, int src, int *valid) {
    Warp &w = warps[cur->warp];
    unsigned r = ++cur->shfl_round, par = r & 1;
    w.val[par][cur->lane] = mine;
    w.round[par][cur->lane] = r;
    warp_barrier();
    uint64_t v = 0;
    *valid = src >= 0 && src < 32 && w.round[par][src] == r;
    if (*valid) v = w.val[par][src];
    return v;
}

void mma(float *d, const float *a, const float *b, const float *c, int m, int n, int k) {
    Warp &w = warps[cur->warp];
    unsigned r = ++cur->mma_round;
    if (m * k > 256 || k * n > 256 || m * n > 256) trap("wmma tile larger than the emulator's 16 x 16");
    if (w.mma_round != r) { /* the first lane here this round */
        w.mma_round = r;
        memcpy(w.a, a, sizeof(float) * m * k);
        memcpy(w.b, b, sizeof(float) * k * n);
        memcpy(w.c, c, sizeof(float) * m * n);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float s = c[i * n + j];
                for (int p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
                w.d[i * n + j] = s;
            }
    } else if (memcmp(w.a, a, sizeof(float) * m * k) || memcmp(w.b, b, sizeof(float) * k * n) ||
               memcmp(w.c, c, sizeof(float) * m * n)) {
        trap("wmma::mma_sync operands differ between the lanes of a warp (code that assumes a fragment layout)");
    }
    memcpy(d, w.d, sizeof(float) * m * n);
}

static float bf16_half(uint32_t word, int hi) { return __uint_as_float(hi ? word & 0xffff0000u : word << 16); }

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with PTX's fragment
 * layouts: lane = 4 g + t; A (16 x 16) a0 = row g, columns 2t and 2t+1
 * (the lower column in the low 16 bits), a1 = row g + 8, a2 = row g,
 * columns 2t+8 and 2t+9, a3 = row g + 8 likewise; B (16 x 8) b0 = rows 2t
 * and 2t+1 of column g, b1 = rows 2t+8 and 2t+9; C/D c0, c1 = row g,
 * columns 2t and 2t+1, c2, c3 = row g + 8. Every lane publishes its
 * fragments, then computes its own four outputs in fp32. */
void mma_bf16_m16n8k16(float *d, const uint32_t *a, const uint32_t *b) {
    Warp &w = warps[cur->warp];
    memcpy(w.fa[cur->lane], a, sizeof w.fa[0]);
    memcpy(w.fb[cur->lane], b, sizeof w.fb[0]);
    warp_barrier(); /* every lane has arrived or exited */
    if (w.alive != 32) trap("mma.sync with fewer than 32 live lanes in the warp");
    const int g = cur->lane >> 2, t = cur->lane & 3;
    float out[4];
    for (int e = 0; e < 4; e++) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) {
            const float av = bf16_half(w.fa[4 * (row & 7) + (k & 7) / 2][(row >= 8) + 2 * (k >= 8)], k & 1);
            const float bv = bf16_half(w.fb[4 * col + (k & 7) / 2][k >= 8], k & 1);
            s += av * bv;
        }
        out[e] = s;
    }
    warp_barrier(); /* every lane has read the others' fragments */
    memcpy(d, out, sizeof out);
}

/* ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16: lanes 8j .. 8j + 7
 * give the addresses of rows 0..7 of matrix j (16 bytes each, 16-byte
 * aligned); lane l = 4 g + t receives word j = row g, elements 2t and 2t+1
 * of matrix j, or with .trans rows 2t and 2t+1 of column g (the transpose) */
void ldmatrix(uint32_t *out, int n, int trans, const void *row) {
    Warp &w = warps[cur->warp];
    w.rows[cur->lane] = (const uint16_t *)row;
    warp_barrier();
    if (w.alive != 32) trap("ldmatrix with fewer than 32 live lanes in the warp");
    const int g = cur->lane >> 2, t = cur->lane & 3;
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < 8; i++)
            if ((uintptr_t)w.rows[8 * j + i] % 16 != 0) trap("ldmatrix row address not 16-byte aligned");
        uint16_t lo, hi;
        if (trans) {
            lo = w.rows[8 * j + 2 * t][g];
            hi = w.rows[8 * j + 2 * t + 1][g];
        } else {
            lo = w.rows[8 * j + g][2 * t];
            hi = w.rows[8 * j + g][2 * t + 1];
        }
        out[j] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    warp_barrier(); /* every lane has read the others' addresses */
}

void trap(const char *why) {
    die_emu(70, "kernel %s: block (%u,%u,%u) thread (%u,%u,%u): %s", run_name, block_idx.x, block_idx.y, block_idx.z,
            cur ? cur->tid.x : 0, cur ? cur->tid.y : 0, cur ? cur->tid.z : 0, why);
}

void *dyn_smem() { return smem_buf; }

static void fiber_entry() {
    Fiber *f = cur;
    run_fn(run_ctx);
    f->done = 1;
    events++;
    Warp &w = warps[f->warp];
    w.alive--;
    /* its stamps stay: lanes still reading its last shuffle need them, and
     * no later round can match them */
    if (w.arrived && w.arrived == w.alive) release_warp(w);
    blk.alive--;
    if (blk.arrived && blk.arrived == blk.alive) release_block();
    void *dead;
    emu_switch(&dead, sched_sp);
    abort(); /* never resumed */
}

static void fiber_start(Fiber *f) {
    if (!f->stack) {
        void *p = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) die_emu(3, "cannot map a fiber stack: %s", strerror(errno));
        if (mprotect(p, 4096, PROT_NONE) != 0) die_emu(3, "cannot protect a fiber stack's guard page: %s", strerror(errno));
        f->stack = (char *)p;
    }
    uintptr_t top = ((uintptr_t)f->stack + STACK_BYTES) & ~(uintptr_t)15;
    uint64_t *slot = (uint64_t *)(top - 16); /* the return address: 16-byte aligned */
    uint64_t *sp = slot - 6;                 /* r15 r14 r13 r12 rbx rbp */
    for (int i = 0; i < 6; i++) sp[i] = 0;
    *slot = (uint64_t)(uintptr_t)&fiber_entry;
    f->sp = sp;
    f->started = 1;
}

static void run_block(int nthreads) {
    blk.alive = nthreads;
    blk.arrived = 0;
    int nw = (nthreads + 31) / 32;
    for (int w = 0; w < nw; w++) {
        Warp &wp = warps[w];
        wp.alive = std::min(32, nthreads - 32 * w);
        wp.arrived = 0;
        memset(wp.round, 0, sizeof wp.round);
        wp.mma_round = 0;
    }
    for (int i = 0; i < nthreads; i++) {
        Fiber &f = fibers[i];
        f.done = f.started = 0;
        f.shfl_round = f.mma_round = 0;
        f.lane = i & 31;
        f.warp = i >> 5;
        f.tid.x = i % block_dim.x;
        f.tid.y = (i / block_dim.x) % block_dim.y;
        f.tid.z = i / (block_dim.x * block_dim.y);
    }
    int left = nthreads;
    while (left > 0) {
        unsigned long long before = events;
        int started_any = 0;
        for (int i = 0; i < nthreads; i++) {
            Fiber &f = fibers[i];
            if (f.done) continue;
            if (!f.started) {
                fiber_start(&f);
                started_any = 1;
            }
            cur = &f;
            emu_switch(&sched_sp, f.sp);
            if (f.done) left--;
        }
        cur = NULL;
        if (left > 0 && events == before && !started_any) {
            int at_block = blk.arrived, first = -1;
            for (int i = 0; i < nthreads && first < 0; i++)
                if (!fibers[i].done) first = i;
            die_emu(70,
                    "kernel %s: block (%u,%u,%u) deadlocks: %d threads live, %d waiting at __syncthreads, the rest at a "
                    "warp-wide operation (first live thread %d): a barrier not every thread reaches",
                    run_name, block_idx.x, block_idx.y, block_idx.z, blk.alive, at_block, first);
        }
    }
}

static cudaError_t last_error = cudaSuccess;

static struct {
    const void *f;
    int max_dyn;
} func_attr[256];
static int n_func_attr;

static int dyn_limit(const void *kernel) {
    for (int i = 0; i < n_func_attr; i++)
        if (func_attr[i].f == kernel) return func_attr[i].max_dyn;
    return 48 * 1024;
}

/* This thread's share of the launch: blocks by the next index no thread has
 * taken (x fastest, as the hardware numbers them), each in full. */
static std::atomic<unsigned long> next_block;
static void run_blocks(unsigned long nblocks, int nthreads) {
    if (fibers.size() < (size_t)nthreads) fibers.resize(nthreads, Fiber{});
    if (warps.size() < (size_t)(nthreads + 31) / 32) warps.resize((nthreads + 31) / 32, Warp{});
    /* dynamic shared memory: exactly run_smem bytes from a 16-byte (not
     * 128-byte) aligned address */
    if (run_smem + 16 > smem_cap) {
        free(smem_buf ? smem_buf - 16 : NULL);
        char *p = (char *)aligned_alloc(128, (run_smem + 16 + 127) / 128 * 128);
        if (!p) die_emu(3, "out of host memory for shared memory");
        smem_buf = p + 16;
        smem_cap = (run_smem + 16 + 127) / 128 * 128;
    }
    for (unsigned long b; (b = next_block.fetch_add(1)) < nblocks;) {
        block_idx = uint3{(unsigned)(b % grid_dim.x), (unsigned)(b / grid_dim.x % grid_dim.y),
                          (unsigned)(b / ((unsigned long)grid_dim.x * grid_dim.y))};
        if (run_smem) memset(smem_buf, 0xFF, run_smem); /* garbage, as the hardware's (NaN floats) */
        run_block(nthreads);
    }
}

/* The helper threads: started at the first launch of two blocks or more,
 * never stopped (a process may exit with them waiting), so a pool that is
 * never freed. */
struct Pool {
    std::mutex mu;
    std::condition_variable go, idle;
    unsigned long gen = 0, nblocks = 0;
    int nthreads = 0, busy = 0, helpers = 0;
};
static Pool *pool;

/* seen: the launch number when it started, so that it waits for the next */
static void helper_main(unsigned long seen) {
    for (;;) {
        unsigned long nblocks;
        int nthreads;
        {
            std::unique_lock<std::mutex> l(pool->mu);
            pool->go.wait(l, [&] { return pool->gen != seen; });
            seen = pool->gen;
            nblocks = pool->nblocks;
            nthreads = pool->nthreads;
        }
        run_blocks(nblocks, nthreads);
        std::lock_guard<std::mutex> l(pool->mu);
        if (--pool->busy == 0) pool->idle.notify_one();
    }
}

static int threads_wanted() {
    static int n = 0;
    if (n) return n;
    const char *e = getenv("LLMTRAIN_CUDA_EMU_THREADS");
    cpu_set_t cpus; /* the processors this process may run on */
    long v = e && *e ? strtol(e, NULL, 10) : sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    n = v < 1 ? 1 : v > 8 ? 8 : (int)v;
    return n;
}

static void launch_blocks(unsigned long nblocks, int nthreads) {
    next_block.store(0);
    int helpers = (int)std::min<unsigned long>(nblocks, (unsigned long)threads_wanted()) - 1;
    if (helpers <= 0) {
        run_blocks(nblocks, nthreads);
        return;
    }
    if (!pool) pool = new Pool;
    {
        std::lock_guard<std::mutex> l(pool->mu);
        for (; pool->helpers < helpers; pool->helpers++) std::thread(helper_main, pool->gen).detach();
        pool->nblocks = nblocks;
        pool->nthreads = nthreads;
        pool->busy = pool->helpers;
        pool->gen++;
    }
    pool->go.notify_all();
    run_blocks(nblocks, nthreads);
    std::unique_lock<std::mutex> l(pool->mu);
    pool->idle.wait(l, [] { return pool->busy == 0; });
}

void execute(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem, void (*fn)(void *), void *ctx) {
    size_t nthreads = (size_t)block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "llmtrain: CUDA emulator: launch of %s with grid (%u,%u,%u) block (%u,%u,%u): invalid configuration\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (smem > (size_t)dyn_limit(kernel)) {
        fprintf(stderr, "llmtrain: CUDA emulator: launch of %s asks for %zu bytes of dynamic shared memory, the kernel "
                "is allowed %d (cudaFuncSetAttribute)\n", name, smem, dyn_limit(kernel));
        last_error = cudaErrorInvalidValue;
        return;
    }
    run_fn = fn;
    run_ctx = ctx;
    run_name = name;
    run_smem = smem;
    grid_dim = grid;
    block_dim = block;
    launch_blocks((unsigned long)grid.x * grid.y * grid.z, (int)nthreads);
}

} // namespace emu

// ----------------------------------------------------------------------------
// runtime

static int node_dev[64]; /* visible device i is the node's device node_dev[i] */

static int n_devices(void) {
    static int n = -1;
    if (n < 0) {
        const char *e = getenv("LLMTRAIN_CUDA_EMU_DEVICES");
        int node = e && *e ? atoi(e) : 1;
        if (node < 0) node = 0;
        if (node > 64) node = 64;
        const char *v = getenv("CUDA_VISIBLE_DEVICES");
        n = 0;
        if (!v) {
            for (; n < node; n++) node_dev[n] = n;
        } else {
            for (const char *p = v; n < 64;) {
                char *end;
                long i = strtol(p, &end, 10);
                if (end == p || i < 0 || i >= node) break;
                node_dev[n++] = (int)i;
                if (*end != ',') break;
                p = end + 1;
            }
        }
    }
    return n;
}

static size_t mem_capacity(void) {
    const char *e = getenv("LLMTRAIN_CUDA_EMU_MEM_MIB");
    size_t mib = e && *e ? (size_t)strtoull(e, NULL, 10) : 81920;
    return mib << 20;
}

static int cur_dev;
static size_t mem_used;
static std::vector<std::pair<void *, size_t>> allocs;

template <typename T> static int get_attr(T *dst, const void *buf, size_t n) {
    if (n != sizeof(T)) return 0;
    memcpy(dst, buf, sizeof(T));
    return 1;
}

static cudaError_t set_err(cudaError_t e) {
    if (e != cudaSuccess) emu::last_error = e;
    return e;
}

extern "C" {

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return emu::last_error; }

cudaError_t cudaGetDeviceCount(int *n) {
    *n = n_devices();
    return *n ? cudaSuccess : set_err(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int dev) {
    if (dev < 0 || dev >= n_devices()) return set_err(n_devices() ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    cur_dev = dev;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev) {
    *dev = cur_dev;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev < 0 || dev >= n_devices()) return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation of CUDA (tests/cuda_emu), shaped as sm_90");
    p->totalGlobalMem = mem_capacity();
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->multiProcessorCount = 132;
    p->major = 9;
    p->minor = 0;
    /* LLMTRAIN_CUDA_EMU_CC=8.0 and the like: another compute capability
     * (tests of what needs a newer GPU) */
    const char *cc = getenv("LLMTRAIN_CUDA_EMU_CC");
    if (cc && *cc && sscanf(cc, "%d.%d", &p->major, &p->minor) != 2) {
        fprintf(stderr, "llmtrain: CUDA emulator: LLMTRAIN_CUDA_EMU_CC=%s: expected MAJOR.MINOR\n", cc);
        exit(70);
    }
    p->maxThreadsPerBlock = 1024;
    p->warpSize = 32;
    memcpy(p->uuid.bytes, "emu-cuda-device", 15);
    p->uuid.bytes[15] = (char)node_dev[dev];
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
    if (dev < 0 || dev >= n_devices()) return set_err(cudaErrorInvalidDevice);
    /* an H100 SXM's: 1980 MHz, HBM3 at 2619 MHz on 5120 bits */
    switch (a) {
    case cudaDevAttrClockRate: *v = 1980000; return cudaSuccess;
    case cudaDevAttrMemoryClockRate: *v = 2619000; return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth: *v = 5120; return cudaSuccess;
    }
    return set_err(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = NULL;
    size_t sz = (bytes + 255) / 256 * 256;
    if (!sz) sz = 256;
    if (mem_used + sz > mem_capacity()) return set_err(cudaErrorMemoryAllocation);
    void *q = aligned_alloc(256, sz);
    if (!q) return set_err(cudaErrorMemoryAllocation);
    memset(q, 0xFF, sz); /* cudaMalloc's memory is not zeroed: NaN until written */
    mem_used += sz;
    allocs.push_back({q, sz});
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    for (size_t i = 0; i < allocs.size(); i++)
        if (allocs[i].first == p) {
            mem_used -= allocs[i].second;
            allocs[i] = allocs.back();
            allocs.pop_back();
            free(p);
            return cudaSuccess;
        }
    return set_err(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    *total_b = mem_capacity();
    *free_b = *total_b - mem_used;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : set_err(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    memset(p, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    (void)s;
    memset(p, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    (void)kind;
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)s;
    return cudaMemcpy(dst, src, bytes, kind);
}

/* the runtime's rule: a width wider than either pitch is an error */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)kind;
    (void)s;
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

struct EmuStream {
    int dummy;
};
struct EmuEvent {
    unsigned flags;
    int recorded;
    double t; /* host seconds at the last record: the emulation runs each launch before it returns */
};

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = (cudaStream_t)calloc(1, sizeof(EmuStream));
    return cudaSuccess;
}
/* as the H100's and H200's CUDA 12-13 report: 0 the lowest priority, -5 the highest */
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}
/* every launch runs before it returns: a priority changes nothing here (CUDA
 * clamps one outside the range) */
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
    (void)priority;
    return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)s;
    (void)flags;
    return e ? cudaSuccess : set_err(cudaErrorInvalidValue);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = (cudaEvent_t)calloc(1, sizeof(EmuEvent));
    (*e)->flags = flags;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    if (!e) return set_err(cudaErrorInvalidValue);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    e->recorded = 1;
    return cudaSuccess;
}
/* as CUDA: both events recorded, neither created with cudaEventDisableTiming */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms || !a || !b) return set_err(cudaErrorInvalidValue);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return set_err(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return set_err(cudaErrorInvalidResourceHandle);
    *ms = (float)(1000.0 * (b->t - a->t));
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : set_err(cudaErrorInvalidValue); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }

cudaError_t emu_func_set_attribute(const void *f, enum cudaFuncAttribute a, int v) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > 227 * 1024) return set_err(cudaErrorInvalidValue);
    for (int i = 0; i < emu::n_func_attr; i++)
        if (emu::func_attr[i].f == f) {
            emu::func_attr[i].max_dyn = v;
            return cudaSuccess;
        }
    if (emu::n_func_attr == 256) return set_err(cudaErrorInvalidValue);
    emu::func_attr[emu::n_func_attr].f = f;
    emu::func_attr[emu::n_func_attr++].max_dyn = v;
    return cudaSuccess;
}

cudaError_t emu_func_get_attributes(cudaFuncAttributes *fa, const void *f) {
    if (!f) return set_err(cudaErrorInvalidValue);
    if (n_devices() < 1) return set_err(cudaErrorNoDevice);
    memset(fa, 0, sizeof *fa);
    fa->maxThreadsPerBlock = 1024;
    fa->maxDynamicSharedSizeBytes = emu::dyn_limit(f);
    fa->numRegs = 32;
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// cuBLASLt

struct EmuLtHandle {
    int dummy;
};
struct EmuLtDesc {
    cublasComputeType_t compute;
    int ta, tb;
    uint32_t epilogue;
    const void *bias; /* the bias vector and the GELU aux matrix have D's type */
    void *aux;
    int64_t aux_ld;
    const float *scale[2]; /* FP8 A and B: their device fp32 scales (NULL: 1), laid out as scale_mode says */
    int32_t scale_mode[2];
    int8_t fast_accum;
};
struct EmuLtLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct EmuLtPref {
    uint64_t ws;
    uint32_t al[4];
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t)calloc(1, sizeof(EmuLtHandle));
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
size_t cublasLtGetVersion(void) { return 0; }
const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_EXECUTION_FAILED";
    }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (scale != CUDA_R_32F || (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32))
        return CUBLAS_STATUS_INVALID_VALUE;
    EmuLtDesc *p = (EmuLtDesc *)calloc(1, sizeof *p);
    p->compute = compute;
    p->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    *d = p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t n) {
    int32_t op;
    int ok = 0;
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = get_attr(&op, buf, n) && (op == 0 || op == 1); if (ok) d->ta = op; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = get_attr(&op, buf, n) && (op == 0 || op == 1); if (ok) d->tb = op; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        ok = get_attr(&d->epilogue, buf, n) &&
             (d->epilogue == CUBLASLT_EPILOGUE_DEFAULT || d->epilogue == CUBLASLT_EPILOGUE_BIAS ||
              d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
              d->epilogue == CUBLASLT_EPILOGUE_DGELU);
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = get_attr(&d->bias, buf, n); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = get_attr(&d->aux, buf, n); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = get_attr(&d->aux_ld, buf, n); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: ok = get_attr(&d->scale[0], buf, n); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: ok = get_attr(&d->scale[1], buf, n); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: ok = get_attr(&d->scale_mode[0], buf, n); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: ok = get_attr(&d->scale_mode[1], buf, n); break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: ok = get_attr(&d->fast_accum, buf, n); break;
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if ((type != CUDA_R_32F && type != CUDA_R_16BF && type != CUDA_R_8F_E4M3 && type != CUDA_R_8F_E5M2) ||
        ld < (int64_t)rows || ld < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    EmuLtLayout *p = (EmuLtLayout *)calloc(1, sizeof *p);
    p->type = type;
    p->rows = rows;
    p->cols = cols;
    p->ld = ld;
    p->batch = 1;
    *l = p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void *buf, size_t n) {
    int ok = a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT ? get_attr(&l->batch, buf, n) && l->batch >= 1
             : a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET ? get_attr(&l->stride, buf, n)
                                                                : 0;
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    EmuLtPref *q = (EmuLtPref *)calloc(1, sizeof *q);
    for (int i = 0; i < 4; i++) q->al[i] = 256;
    *p = q;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n) {
    int ok = 0;
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) ok = get_attr(&p->ws, buf, n);
    else if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        ok = get_attr(&p->al[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, n);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

static int is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

/* FP8 as Hopper's cuBLASLt takes it: A and B E4M3 or E5M2 (not both
 * E5M2), the "TN" layout (A transposed, B not: both K-major), fp32
 * compute, C and D bf16 or fp32, unbatched, each scale a scalar */
static int fp8_ok(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                  cublasLtMatrixLayout_t c) {
    return is_fp8(a->type) && is_fp8(b->type) && !(a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2) &&
           d->ta == 1 && d->tb == 0 && d->compute == CUBLAS_COMPUTE_32F && a->batch == 1 &&
           (c->type == CUDA_R_32F || c->type == CUDA_R_16BF);
}

/* op(A) is m x k, op(B) k x n, C and D m x n; C and D fp32, or both bf16
 * with bf16 A and B (the result rounded to nearest); or FP8 A and B
 * (fp8_ok) */
static int shapes_ok(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl) {
    uint64_t m = d->ta ? a->cols : a->rows, k = d->ta ? a->rows : a->cols;
    uint64_t kb = d->tb ? b->cols : b->rows, n = d->tb ? b->rows : b->cols;
    if (is_fp8(a->type) || is_fp8(b->type))
        return fp8_ok(d, a, b, c) && k == kb && c->rows == m && c->cols == n && dl->rows == m && dl->cols == n &&
               c->type == dl->type && b->batch == 1 && c->batch == 1 && dl->batch == 1;
    return k == kb && c->rows == m && c->cols == n && dl->rows == m && dl->cols == n && a->type == b->type &&
           c->type == dl->type && (c->type == CUDA_R_32F || (c->type == CUDA_R_16BF && a->type == CUDA_R_16BF)) &&
           a->batch == b->batch && a->batch == c->batch &&
           c->batch == dl->batch && (a->type == CUDA_R_32F || d->compute == CUBLAS_COMPUTE_32F);
}

static int aligned_to(const void *p, uint32_t al) { return al == 0 || (uintptr_t)p % al == 0; }

static int is_block_mode(int32_t m) {
    return m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || m == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

/* FP8 scale modes as cuBLASLt documents them for Hopper: both scalars
 * (sm_89 and newer); both outer vectors; or 128-element blocks along K
 * (VEC128_32F) and 128 x 128 tiles (BLK128x128_32F) in any pairing but
 * tiles with tiles, without fast accumulation. The vector and block modes
 * need sm_90 (Ada has tensorwide scaling only, Blackwell the MX formats). */
static int fp8_modes_ok(cublasLtMatmulDesc_t d) {
    const int32_t a = d->scale_mode[0], b = d->scale_mode[1];
    if (a == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && b == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) return 1;
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return 0;
    if (p.major != 9 || p.minor != 0) return 0;
    if (a == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F && b == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) return 1;
    return is_block_mode(a) && is_block_mode(b) &&
           !(a == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && b == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) &&
           !d->fast_accum;
}

/* The scale of element (i, p) of an FP8 operand whose op() has `outer`
 * rows i and k columns p (K the contraction), stored by its mode:
 *   SCALAR_32F      s[0];
 *   OUTER_VEC_32F   s[i], one a row;
 *   VEC128_32F      s[(p / 128) * ld + i], ld = outer rounded up to 4: a
 *                   scale a 128-element block of a row, the rows
 *                   contiguous for each block of K;
 *   BLK128x128_32F  s[(i / 128) * ld + p / 128], ld = ceil(k / 128)
 *                   rounded up to 4: a scale a 128 x 128 tile, K's blocks
 *                   contiguous. */
static float fp8_scale_at(const float *s, int32_t mode, uint64_t i, uint64_t p, uint64_t outer, uint64_t k) {
    if (!s) return 1.0f;
    switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return s[i];
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return s[(p / 128) * ((outer + 3) & ~(uint64_t)3) + i];
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return s[(i / 128) * (((k + 127) / 128 + 3) & ~(uint64_t)3) + p / 128];
    default: return s[0];
    }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int want,
                                              cublasLtMatmulHeuristicResult_t *res, int *nres) {
    *nres = 0;
    if (!h || want < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (!shapes_ok(d, a, b, c, dl)) return CUBLAS_STATUS_INVALID_VALUE;
    int gelu = d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
               d->epilogue == CUBLASLT_EPILOGUE_DGELU;
    /* the GELU_AUX and DGELU epilogues: aux ld a multiple of 8 and at
     * least m, a 16-byte aligned aux pointer, no batching */
    if (gelu && (d->aux_ld % 8 != 0 || d->aux_ld < (int64_t)c->rows || !aligned_to(d->aux, 16) || c->batch > 1))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* tensor-core (TF32) kernels want 16-byte operands; the plain fp32 ones
     * take 4 */
    uint32_t need = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? 16 : (a->type == CUDA_R_16BF ? 2 : 4);
    uint32_t need_c = c->type == CUDA_R_16BF ? 2 : 4;
    if (is_fp8(a->type)) { /* 16-byte operands and leading dimensions, scalar scales, no epilogue */
        need = need_c = 16;
        if (!fp8_modes_ok(d) || d->epilogue != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (p->al[0] < need || p->al[1] < need || p->al[2] < need_c || p->al[3] < need_c) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(res, 0, sizeof *res);
    for (int i = 0; i < 4; i++) res->algo.data[i] = p->al[i];
    res->algo.data[4] = 0x454d55; /* "EMU": an algorithm this heuristic returned */
    *nres = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float tf32(float f) { return nvcuda::wmma::__float_to_tf32(f); }

static float load_elem(const void *base, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    if (is_fp8(t)) return emu_fp8_to_float(((const uint8_t *)base)[i], t == CUDA_R_8F_E5M2 ? __NV_E5M2 : __NV_E4M3);
    return ((const float *)base)[i];
}

/* bf16 rounded to nearest even */
static void store_elem(void *base, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_16BF) ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(v);
    else ((float *)base)[i] = v;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s) {
    (void)ws;
    (void)ws_bytes;
    (void)s;
    if (!h || !algo || algo->data[4] != 0x454d55) return CUBLAS_STATUS_INVALID_VALUE;
    if (!shapes_ok(d, la, lb, lc, ld)) return CUBLAS_STATUS_INVALID_VALUE;
    const int es = la->type == CUDA_R_16BF ? 2 : is_fp8(la->type) ? 1 : 4;
    /* every address the product touches must have the alignment the
     * algorithm was chosen for */
    const void *ptrs[4] = {A, B, C, D};
    const int64_t lds[4] = {la->ld, lb->ld, lc->ld, ld->ld}, sts[4] = {la->stride, lb->stride, lc->stride, ld->stride};
    const int ces = lc->type == CUDA_R_16BF ? 2 : 4;
    const int esz[4] = {es, es, ces, ces};
    /* FP8: dequantized (the code's value times its scale, in fp32), then
     * the fp32 product as any other: the CPU reference's arithmetic */
    for (int i = 0; i < 4; i++) {
        uint32_t al = (uint32_t)algo->data[i];
        if (!aligned_to(ptrs[i], al) || (lds[i] * esz[i]) % al != 0 || (la->batch > 1 && (sts[i] * esz[i]) % al != 0)) {
            fprintf(stderr, "llmtrain: CUDA emulator: cublasLtMatmul: operand %c (%p, ld %lld) is not %u-byte aligned as "
                    "the algorithm was chosen for\n", "ABCD"[i], ptrs[i], (long long)lds[i], al);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    int gelu = d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    int dgelu = d->epilogue == CUBLASLT_EPILOGUE_DGELU;
    int bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if ((bias && !d->bias) || ((gelu || dgelu) && !d->aux)) return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const int tf = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && la->type == CUDA_R_32F;
    const uint64_t m = d->ta ? la->cols : la->rows, k = d->ta ? la->rows : la->cols, n = d->tb ? lb->rows : lb->cols;
    std::vector<float> at(m * k), bt(n * k);
    for (int32_t bi = 0; bi < la->batch; bi++) {
        /* op(A) by rows (at[i][p]) and op(B) by columns (bt[j][p]) */
        for (uint64_t i = 0; i < m; i++)
            for (uint64_t p = 0; p < k; p++) {
                size_t idx = (size_t)bi * la->stride + (d->ta ? p + i * la->ld : i + p * la->ld);
                float v = load_elem(A, la->type, idx);
                if (is_fp8(la->type)) v *= fp8_scale_at(d->scale[0], d->scale_mode[0], i, p, m, k);
                at[i * k + p] = tf ? tf32(v) : v;
            }
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t p = 0; p < k; p++) {
                size_t idx = (size_t)bi * lb->stride + (d->tb ? j + p * lb->ld : p + j * lb->ld);
                float v = load_elem(B, lb->type, idx);
                if (is_fp8(lb->type)) v *= fp8_scale_at(d->scale[1], d->scale_mode[1], j, p, n, k);
                bt[j * k + p] = tf ? tf32(v) : v;
            }
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                const float *x = &at[i * k], *y = &bt[j * k];
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                uint64_t p = 0;
                for (; p + 8 <= k; p += 8)
                    for (int u = 0; u < 8; u++) acc[u] += x[p + u] * y[p + u];
                float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
                for (; p < k; p++) sum += x[p] * y[p];
                float v = al * sum;
                size_t ci = (size_t)bi * lc->stride + i + j * lc->ld, di = (size_t)bi * ld->stride + i + j * ld->ld;
                if (be != 0.0f) v += be * load_elem(C, lc->type, ci);
                if (bias) v += load_elem(d->bias, ld->type, i);
                if (gelu) { /* aux keeps the GELU's input, rounded to D's type; the GELU is of the fp32 value */
                    store_elem(d->aux, ld->type, i + j * d->aux_ld, v);
                    float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
                    v = v / (1.0f + expf(-2.0f * u));
                }
                if (dgelu) { /* 0.5 x (1 + tanh u(x)), differentiated: in double, independently of kernels.cu */
                    double x = load_elem(d->aux, ld->type, i + j * d->aux_ld);
                    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
                    v = (float)(v * (0.5 * (1.0 + t) +
                                     0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)));
                }
                store_elem(D, ld->type, di, v);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
