/* kernels/adamw.cuh — AdamW: torch.optim.AdamW operation for operation over flat ranges, fp32 master weights, bf16 copies with stochastic rounding.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

// ----------------------------------------------------------------------------
// AdamW: torch.optim.AdamW (single-tensor path), operation for operation,
// over one range or (adamw_multi) several ranges of the same flat arrays in
// one launch

typedef struct {
    size_t offset, n, start; /* start: elements of all earlier ranges */
    float wd;                /* the kernel forms 1 - lr * wd as adamw does */
    int norm;                /* counts in the sum of squares */
} DevRange;

/* the constants of one step (AdamConsts and the hyperparameters) */
typedef struct {
    float beta1, beta2, ob1, ob2, eps, step_size, bc2_sqrt, grad_scale;
} AdamK;

/* one element, as torch's single-tensor AdamW. The sums are __fadd_rn /
 * __fsub_rn, never fused with a product into a multiply-add: nvcc fused
 * p * decay - step into one differently in adamw_k and adamw_multi_k (on an
 * H200, 22,857 of 100,003 weights a bit apart between the two kernels), and
 * every kernel here must give the same bits for the same element. */
__device__ __forceinline__ void adamw_one(float &p, float g, float &m, float &v, float decay, const AdamK &k) {
    const float gi = g * k.grad_scale;
    m = __fadd_rn(k.beta1 * m, k.ob1 * gi);
    v = __fadd_rn(k.beta2 * v, k.ob2 * gi * gi);
    p = __fsub_rn(p * decay, k.step_size * (m / (sqrtf(v) / k.bc2_sqrt + k.eps)));
}

/* element i; returns its new weight */
__device__ __forceinline__ float adamw_elem(float *p, const float *g, float *m, float *v, size_t i, float decay,
                                            const AdamK &k) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, g[i], mi, vi, decay, k);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    return pi;
}

/* four elements from i (a multiple of 4, the arrays 16-byte aligned) with
 * 16-byte loads and stores: adamw_one on each, the same bits as adamw_elem.
 * (The element-at-a-time kernels ran the Llama 1B shape's 1.24 B parameters,
 * 28 bytes each, at 3.15 TB/s on an H200.) */
__device__ __forceinline__ float4 adamw_elem4(float *p, const float *g, float *m, float *v, size_t i, float decay,
                                              const AdamK &k) {
    float4 p4 = *(float4 *)(void *)(p + i), m4 = *(float4 *)(void *)(m + i), v4 = *(float4 *)(void *)(v + i);
    const float4 g4 = *(const float4 *)(const void *)(g + i);
    adamw_one(p4.x, g4.x, m4.x, v4.x, decay, k);
    adamw_one(p4.y, g4.y, m4.y, v4.y, decay, k);
    adamw_one(p4.z, g4.z, m4.z, v4.z, decay, k);
    adamw_one(p4.w, g4.w, m4.w, v4.w, decay, k);
    *(float4 *)(void *)(m + i) = m4;
    *(float4 *)(void *)(v + i) = v4;
    *(float4 *)(void *)(p + i) = p4;
    return p4;
}

/* vec (p, g, m, v 16-byte aligned): thread-groups of 4 elements, then the
 * n % 4 tail one at a time */
__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float decay, AdamK k, int vec) {
    if (vec) {
        GRID_STRIDE(q, n / 4) adamw_elem4(p, g, m, v, 4 * q, decay, k);
        const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < n % 4) adamw_elem(p, g, m, v, n / 4 * 4 + t, decay, k);
    } else {
        GRID_STRIDE(i, n) adamw_elem(p, g, m, v, i, decay, k);
    }
}

/* the last range with start <= i */
__device__ __forceinline__ int adam_range(const DevRange *r, int nr, size_t i) {
    int lo = 0, hi = nr - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (r[mid].start <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Thread-groups of 4 of the ranges' concatenated elements (total of them):
 * a group inside one range whose array index is a multiple of 4 (vec: the
 * arrays 16-byte aligned) in one adamw_elem4, any other (across a range's
 * end, or a range not starting on a multiple of 4) one element at a time.
 * w16 (not NULL): the bf16 copy of p (to nearest even, as to_bf16), each
 * updated weight's written too. partial (not NULL): the block's sum of
 * squares of the updated weights of the norm ranges, in double, at
 * partial[blockIdx.x] (a grid fixed by the device, so the same bits every
 * run). */
__global__ void adamw_multi_k(float *p, const float *g, float *m, float *v, const DevRange *r, int nr, size_t total,
                              float lr, AdamK k, int vec, __nv_bfloat16 *w16, double *partial) {
    double s = 0.0;
    GRID_STRIDE(q, (total + 3) / 4) {
        const size_t i0 = 4 * q;
        const int a = adam_range(r, nr, i0);
        const size_t j0 = r[a].offset + (i0 - r[a].start);
        if (vec && i0 + 4 <= r[a].start + r[a].n && j0 % 4 == 0) {
            const float4 u = adamw_elem4(p, g, m, v, j0, (float)(1.0 - (double)lr * r[a].wd), k);
            if (w16) *(uint2 *)(void *)(w16 + j0) = make_uint2(fb_pack(u.x, u.y), fb_pack(u.z, u.w));
            if (partial && r[a].norm)
                s += ((double)u.x * u.x + (double)u.y * u.y) + ((double)u.z * u.z + (double)u.w * u.w);
            continue;
        }
        for (size_t i = i0; i < i0 + 4 && i < total; i++) {
            const int b = adam_range(r, nr, i);
            const size_t j = r[b].offset + (i - r[b].start);
            const float u = adamw_elem(p, g, m, v, j, (float)(1.0 - (double)lr * r[b].wd), k);
            if (w16) w16[j] = __float2bfloat16_rn(u);
            if (partial && r[b].norm) s += (double)u * u;
        }
    }
    if (partial) { /* the same for every thread of the block */
        s = block_sum(s);
        if (threadIdx.x == 0) partial[blockIdx.x] = s;
    }
}

typedef struct { float step_size, bc2_sqrt, ob1, ob2; } AdamConsts;

static AdamConsts adam_consts(float lr, float beta1, float beta2, int t) {
    double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    AdamConsts c;
    c.step_size = (float)((double)lr / bc1);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.ob1 = (float)(1.0 - (double)beta1);
    c.ob2 = (float)(1.0 - (double)beta2);
    return c;
}

static AdamK adam_k(AdamConsts c, float beta1, float beta2, float eps, float grad_scale) {
    AdamK k;
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.ob1 = c.ob1;
    k.ob2 = c.ob2;
    k.eps = eps;
    k.step_size = c.step_size;
    k.bc2_sqrt = c.bc2_sqrt;
    k.grad_scale = grad_scale;
    return k;
}

static void cu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, int t, float grad_scale) {
    if (!n) return;
    AdamConsts c = adam_consts(lr, beta1, beta2, t);
    float decay = (float)(1.0 - (double)lr * wd);
    const AdamK k = adam_k(c, beta1, beta2, eps, grad_scale);
    const int vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
    adamw_k<<<grid_for(vec ? (n + 3) / 4 : n, 256), 256>>>(p, g, m, v, n, decay, k, vec);
    LAUNCH_CHECK();
}

/* The weight cache's flat bf16 copy for an AdamW over p with the k ranges
 * r (see the weight cache): NULL unless p starts a declared range that holds
 * every range and products have copied weights inside it; made the first
 * time (the entries' own copies freed first, so the two never sit side by
 * side), its entries views of it. */
static __nv_bfloat16 *wc_flat_for(const float *p, const DevRange *r, int k) {
    if (!wc_enabled()) return NULL;
    size_t n = 0, end = 0;
    for (int i = 0; i < wc_nr && !n; i++)
        if (wc_range[i].p == p) n = wc_range[i].n;
    for (int i = 0; i < k; i++) end = r[i].offset + r[i].n > end ? r[i].offset + r[i].n : end;
    int copied = 0;
    for (int i = 0; i < wc_n && !copied; i++) copied = inside(wc[i].w, wc[i].n, p, n);
    if (!n || end > n || !copied) return NULL;
    if (wc_flat.bf && (wc_flat.p != p || wc_flat.n != n)) wc_flat_drop();
    const int make = !wc_flat.bf;
    wc_flat.p = p;
    wc_flat.n = n;
    for (int i = 0; i < wc_n; i++) {
        WcEntry *e = &wc[i];
        if (e->view || !flat_view_ok(e->w, e->n)) continue;
        dev_free(e->bf, e->n * sizeof(__nv_bfloat16));
        wc_bytes -= e->n * sizeof(__nv_bfloat16);
        e->bf = NULL;
        e->view = 1;
        e->current = 0;
    }
    if (make) {
        DEV_MALLOC(&wc_flat.bf, n * sizeof(__nv_bfloat16));
        wc_bytes += n * sizeof(__nv_bfloat16);
    }
    for (int i = 0; i < wc_n; i++)
        if (wc[i].view && !wc[i].bf) wc[i].bf = wc_flat.bf + (wc[i].w - p);
    return wc_flat.bf;
}

/* After the AdamW that wrote the flat copy: a view its ranges cover (they
 * do not overlap) is current (the rest of the copy is as it was, as are the
 * weights there); a copy of its own that shares a weight with a range is
 * stale */
static void wc_flat_written(const DevRange *r, int k) {
    for (int i = 0; i < wc_n; i++) {
        WcEntry *e = &wc[i];
        size_t covered = 0;
        for (int j = 0; j < k; j++) {
            const float *a = wc_flat.p + r[j].offset, *lo = a > e->w ? a : e->w;
            const float *hi = a + r[j].n < e->w + e->n ? a + r[j].n : e->w + e->n;
            covered += hi > lo ? (size_t)(hi - lo) : 0;
        }
        if (e->view && covered == e->n) e->current = 1;
        if (!e->view && covered) e->current = 0;
    }
}

static Scratch sc_adam_red;

/* The range table goes to the device only when it changes (the trainer's is
 * built once), so a step makes no synchronous upload. */
static int cu_adamw_multi(float *p, const float *g, float *m, float *v, const AdamWRange *ranges, int nr, float lr,
                       float beta1, float beta2, float eps, int t, float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    if (nr <= 0) return 0;
    static DevRange *host, *sent;
    static int host_cap, n_sent = -1;
    static void *sent_to;
    if (nr > host_cap) {
        free(host);
        free(sent);
        host = (DevRange *)malloc_check((size_t)nr * sizeof *host);
        sent = (DevRange *)malloc_check((size_t)nr * sizeof *sent);
        host_cap = nr;
        n_sent = -1;
    }
    size_t total = 0;
    int k = 0;
    for (int i = 0; i < nr; i++) {
        if (!ranges[i].n) continue;
        memset(&host[k], 0, sizeof host[k]); /* padding too: the table is compared bytewise */
        host[k].offset = ranges[i].offset;
        host[k].n = ranges[i].n;
        host[k].start = total;
        host[k].wd = ranges[i].wd;
        host[k].norm = ranges[i].norm != 0;
        total += ranges[i].n;
        k++;
    }
    if (!total) return 0;
    DevRange *dev = (DevRange *)scratch_get(&sc_adam, (size_t)k * sizeof *dev);
    if (k != n_sent || (void *)dev != sent_to || memcmp(host, sent, (size_t)k * sizeof *host) != 0) {
        cu_from_host(dev, host, (size_t)k * sizeof *dev);
        memcpy(sent, host, (size_t)k * sizeof *host);
        n_sent = k;
        sent_to = dev;
    }
    AdamConsts c = adam_consts(lr, beta1, beta2, t);
    const int vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
    __nv_bfloat16 *w16 = wc_flat_for(p, host, k);
    unsigned grid = grid_for((total + 3) / 4, 256);
    double *partial = NULL;
    if (sumsq) { /* as many blocks as the device holds at once (one wave), a partial each */
        const unsigned fill = (unsigned)resident_blocks(256);
        grid = grid < fill ? grid : fill;
        partial = (double *)scratch_get(&sc_adam_red, (size_t)grid * sizeof(double));
    }
    adamw_multi_k<<<grid, 256>>>(p, g, m, v, dev, k, total, lr, adam_k(c, beta1, beta2, eps, grad_scale), vec, w16,
                                 partial);
    LAUNCH_CHECK();
    if (w16) wc_flat_written(host, k);
    for (int j = 0; j < k; j++) f8_stale(p + host[j].offset, host[j].n * sizeof(float)); /* FP8 copies: made anew */
    if (sumsq) {
        reduce_final_k<<<1, RED_THREADS>>>(partial, (int)grid, G.red_out);
        LAUNCH_CHECK();
        cu_to_host(sumsq, G.red_out, sizeof *sumsq);
    }
    return w16 != NULL;
}
