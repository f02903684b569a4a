/* kernels/offload.cuh — activation offload (page-locked host memory, a copy stream) and step timing with events (log.profile_steps).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

// ----------------------------------------------------------------------------
// activation offload: page-locked host memory and a copy stream

/* The copy stream is non-blocking, so it does not synchronise with the legacy
 * default stream the kernels run on; order between the two is by events
 * only. Marks are a ring of events: a mark is waited for within a few layers
 * of its recording, long before the ring comes round again. */
#define OFF_MARKS 1024
static cudaStream_t off_stream;
static cudaEvent_t off_after_compute, off_marks[OFF_MARKS];
static int off_next;

static void off_init(void) {
    if (off_stream) return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&off_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&off_after_compute, cudaEventDisableTiming));
    for (int i = 0; i < OFF_MARKS; i++) CUDA_CHECK(cudaEventCreateWithFlags(&off_marks[i], cudaEventDisableTiming));
}

static void *cu_host_alloc(size_t bytes) {
    void *p = NULL;
    size_t sz = bytes ? bytes : 256;
    cudaError_t e = cudaHostAlloc(&p, sz, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation)
        die(EXIT_IO, "out of page-locked host memory allocating %.2f GiB for activation offload", sz / 1073741824.0);
    CUDA_CHECK(e);
    memset(p, 0, sz);
    return p;
}

static void cu_host_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

static void cu_offload_copy(void *host, void *dev, size_t bytes, int to_host) {
    if (!bytes) return;
    off_init();
    CUDA_CHECK(cudaEventRecord(off_after_compute, 0));
    CUDA_CHECK(cudaStreamWaitEvent(off_stream, off_after_compute, 0));
    if (to_host) CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, off_stream));
    else CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, off_stream));
    launch_check_("offload copy", __FILE__, __LINE__);
}

static int cu_offload_mark(void) {
    off_init();
    int id = off_next;
    off_next = (off_next + 1) % OFF_MARKS;
    CUDA_CHECK(cudaEventRecord(off_marks[id], off_stream));
    return id;
}

static void cu_offload_wait(int mark) {
    if (mark < 0 || mark >= OFF_MARKS) die(EXIT_INTERNAL, "offload_wait: mark %d out of range", mark);
    CUDA_CHECK(cudaStreamWaitEvent(0, off_marks[mark], 0));
}

// ----------------------------------------------------------------------------
// timing (log.profile_steps): events on the compute stream, each created at
// its slot's first mark and kept (host objects; no device memory)

static cudaEvent_t timer_ev[KERNEL_TIMER_SLOTS];

static void cu_timer_mark(int slot) {
    if (slot < 0 || slot >= KERNEL_TIMER_SLOTS) die(EXIT_INTERNAL, "timer_mark: slot %d out of range", slot);
    if (!timer_ev[slot]) CUDA_CHECK(cudaEventCreateWithFlags(&timer_ev[slot], cudaEventDefault));
    CUDA_CHECK(cudaEventRecord(timer_ev[slot], 0));
}

static void cu_timer_read(int n, double *ms) {
    if (n < 1 || n > KERNEL_TIMER_SLOTS || !timer_ev[n - 1]) die(EXIT_INTERNAL, "timer_read: %d slots", n);
    host_wait(); /* multi-rank: a hung collective is the watchdog's, not a wait in the driver */
    CUDA_CHECK(cudaEventSynchronize(timer_ev[n - 1])); /* the last mark: the stream runs in order */
    ms[0] = 0.0;
    for (int i = 1; i < n; i++) {
        float f = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&f, timer_ev[0], timer_ev[i]));
        ms[i] = f;
    }
}
