/* kernels/reduce.cuh — reductions returned to the host: deterministic sums and sums of squares (grid fixed by n, double partials).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

// ----------------------------------------------------------------------------
// reductions: deterministic (a grid fixed by n, red_grid; per-block
// partials in double, a fixed-order final sum), returned to the host

/* Each thread: four 16-byte loads in flight per round (x 16-byte aligned;
 * else the scalar loop), four double sums, then the n % 4 tail. The order is
 * fixed by the grid, so the same bits every run. (The scalar loop, one load
 * in flight a thread, read the Llama 1B shape's 4.9 GB of gradients at 1.3
 * TB/s on an H200.) */
template <int SQ> __device__ __forceinline__ double red_term(float v) {
    double d = v;
    return SQ ? d * d : d;
}
template <int SQ> __device__ __forceinline__ double red_term4(float4 v) {
    return red_term<SQ>(v.x) + red_term<SQ>(v.y) + red_term<SQ>(v.z) + red_term<SQ>(v.w);
}

template <int SQ> __global__ void reduce_partial_k(const float *x, size_t n, double *partial) {
    double s = 0.0;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if (((uintptr_t)x & 15) == 0) {
        const float4 *x4 = (const float4 *)x;
        const size_t n4 = n / 4;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        size_t i = tid;
        for (; i + 3 * stride < n4; i += 4 * stride) {
            const float4 a = x4[i], b = x4[i + stride], c = x4[i + 2 * stride], d = x4[i + 3 * stride];
            s0 += red_term4<SQ>(a);
            s1 += red_term4<SQ>(b);
            s2 += red_term4<SQ>(c);
            s3 += red_term4<SQ>(d);
        }
        for (; i < n4; i += stride) s0 += red_term4<SQ>(x4[i]);
        if (tid < n - n4 * 4) s0 += red_term<SQ>(x[n4 * 4 + tid]);
        s = (s0 + s1) + (s2 + s3);
    } else {
        GRID_STRIDE(i, n) s += red_term<SQ>(x[i]);
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void reduce_final_k(const double *partial, int n, double *out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = s;
}

static double reduce(const float *x, size_t n, int sq) {
    if (!n) return 0.0;
    const unsigned grid = red_grid(n);
    if (sq) reduce_partial_k<1><<<grid, RED_THREADS>>>(x, n, G.red_partial);
    else reduce_partial_k<0><<<grid, RED_THREADS>>>(x, n, G.red_partial);
    LAUNCH_CHECK();
    reduce_final_k<<<1, RED_THREADS>>>(G.red_partial, (int)grid, G.red_out);
    LAUNCH_CHECK();
    double h = 0.0;
    cu_to_host(&h, G.red_out, sizeof h);
    return h;
}

static double cu_sumsq(const float *x, size_t n) { return reduce(x, n, 1); }

/* sumsq beside the compute: the same two kernels and grid on a
 * non-blocking stream of the lowest priority (the compute stream's pending
 * blocks go first wherever an SM frees; a side block already running is
 * not preempted, but red_grid keeps each one's work to 64 KB), ordered
 * after the compute queued so far by an event; its sums run in turn there,
 * so one partial buffer serves them all. The take
 * makes the compute stream wait for them, then copies through the host
 * wait (which polls collectives). */
static struct {
    cudaStream_t s;
    cudaEvent_t after_compute, done;
    double *partial; /* [RED_MAX_BLOCKS] */
} SIDE;

static void cu_sumsq_queue(const float *x, size_t n, double *dst) {
    CUDA_CHECK(cudaEventRecord(SIDE.after_compute, 0));
    CUDA_CHECK(cudaStreamWaitEvent(SIDE.s, SIDE.after_compute, 0));
    if (!n) {
        CUDA_CHECK(cudaMemsetAsync(dst, 0, sizeof *dst, SIDE.s));
        return;
    }
    const unsigned grid = red_grid(n);
    reduce_partial_k<1><<<grid, RED_THREADS, 0, SIDE.s>>>(x, n, SIDE.partial);
    LAUNCH_CHECK();
    reduce_final_k<<<1, RED_THREADS, 0, SIDE.s>>>(SIDE.partial, (int)grid, dst);
    LAUNCH_CHECK();
}

static void cu_sumsq_take(double *host, const double *dst, int n) {
    if (n <= 0) return;
    CUDA_CHECK(cudaEventRecord(SIDE.done, SIDE.s));
    CUDA_CHECK(cudaStreamWaitEvent(0, SIDE.done, 0));
    cu_to_host(host, dst, (size_t)n * sizeof *host);
}

static double cu_sum(const float *x, size_t n) { return reduce(x, n, 0); }
