/* kernels/attention_part.cuh — context parallelism's attention parts (kernels.h attention_part_forward/backward: a segment of queries against a segment of keys, merged by the log-sum-exp) and copy_2d.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own.
 *
 * Under compute dtype bf16 on sm_80 and newer, head dims 32, 64 and 128
 * take the whole-sequence attention's bf16 tensor-core kernels
 * (attention_flash_bf16.cuh, FbSeg: where the segments lie, and the merge);
 * everything else the kernels of this file:
 * flash-style, fp32 FMA in shared-memory tiles, no T x T scratch. The [a]
 * operands (qkv, kv, out, dout, dqkv) are read and written as T (float, or
 * __nv_bfloat16 under compute dtype bf16) and widened to fp32 in shared
 * memory; lse and dkv are fp32. A block of AP_THREADS = 128 threads is 32
 * rows x 4 threads: thread (r, c) = (tid / 4, tid % 4) owns row r of the
 * tile, and of a score tile the columns c, c + 4, ..., of a head-dim-wide
 * accumulator the columns c, c + 4, ... (ND of them: hd <= 4 ND). A row's 4
 * threads are 4 consecutive lanes, so its maxima and sums are 2 shuffles.
 * Shared tiles are [rows][hd + 1] (the pad puts a tile's rows in different
 * banks).
 *
 *   forward: one block per (query tile, head, b): the key tiles up to the
 *            tile's last query, online softmax (running max m and sum l);
 *            then merged with what out and lse hold.
 *   dQ:      one block per (query tile, head, b) over the key tiles: P =
 *            e^(s - lse), dS = P (dO.V - D) scale with D = dO.O, dQ += dS K,
 *            added into dqkv's q columns.
 *   dK, dV:  one block per (key tile, kv head, b) over the group's query
 *            heads and the query tiles from the key tile's first position:
 *            dV += P^T dO, dK += dS^T Q, added into dkv.
 * Each output element has one owner thread: no atomics, the same bits run
 * to run. */

#define AP_THREADS 128
#define AP_ROWS 32 /* query rows (key rows in the dK/dV kernel) of a block's tile */
#define AP_KEYS 32 /* keys (queries) of a shared tile */

/* The arguments every part kernel takes: the shapes and where the segments lie. */
typedef struct ApShape {
    int qrow, q0, nq, krow, k0, nk, Tq, Tk, nh, nkv, hd;
    float scale;
} ApShape;

/* Whether the query at sequence position p (document start qs) sees the
 * key at sequence position kp. */
__device__ __forceinline__ bool ap_sees(int p, int qs, int kp) { return kp <= p && kp >= qs; }

/* rows [0, n) (n <= AP_ROWS or AP_KEYS) of hd columns of a row-major T
 * array at src, rows `pitch` elements apart, widened into the shared tile
 * dst [rows][hd + 1]; rows past n are zero */
template <typename T>
__device__ __forceinline__ void ap_load(float *dst, const T *src, size_t pitch, int n, int rows, int hd, int tid) {
    for (int i = tid; i < rows * hd; i += AP_THREADS) {
        int r = i / hd, d = i % hd;
        dst[r * (hd + 1) + d] = r < n ? act_ld(src, (size_t)r * pitch + d) : 0.0f;
    }
}

/* the sum over a row's 4 threads (lanes 4k .. 4k + 3) */
__device__ __forceinline__ float ap_row_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}
__device__ __forceinline__ float ap_row_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

/* shared floats of each kernel: the forward's Q, K, V tiles and P tile;
 * dQ's Q, dO, K, V tiles and dS tile; dK/dV's K, V, Q, dO tiles, P and dS
 * tiles and the query tile's lse, D and document starts */
static size_t ap_fwd_floats(int hd) { return (size_t)(AP_ROWS + 2 * AP_KEYS) * (hd + 1) + (size_t)AP_ROWS * (AP_KEYS + 1); }
static size_t ap_dq_floats(int hd) { return (size_t)(2 * AP_ROWS + 2 * AP_KEYS) * (hd + 1) + (size_t)AP_ROWS * (AP_KEYS + 1); }
static size_t ap_dkv_floats(int hd) {
    return (size_t)(2 * AP_ROWS + 2 * AP_KEYS) * (hd + 1) + 2 * (size_t)AP_ROWS * (AP_KEYS + 1) + 3 * AP_KEYS;
}

template <typename T, int ND>
__global__ void __launch_bounds__(AP_THREADS)
    att_part_fwd_k(T *out, float *lse, const T *qkv, const T *kv, const int *qstart, ApShape a, int merge) {
    float *sm = fl_smem();
    const int hd = a.hd, LD = hd + 1, tid = threadIdx.x, r = tid / 4, c = tid % 4;
    const int t0 = blockIdx.x * AP_ROWS, h = blockIdx.y, b = blockIdx.z, kh = h / (a.nh / a.nkv);
    const int S = (a.nh + 2 * a.nkv) * hd, KS = 2 * a.nkv * hd, OS = a.nh * hd;
    float *Qs = sm, *Ks = Qs + AP_ROWS * LD, *Vs = Ks + AP_KEYS * LD, *Ps = Vs + AP_KEYS * LD;
    const int nrows = min(AP_ROWS, a.nq - t0), t = t0 + r, live = r < nrows;
    const size_t row = (size_t)b * a.Tq + a.qrow + t, krow0 = (size_t)b * a.Tk + a.krow;
    float *L = lse + ((size_t)b * a.nh + h) * a.Tq + a.qrow + t;
    const float old = live && merge ? *L : -INFINITY; /* every thread of the row reads it before the barrier, one writes it at the end */
    ap_load(Qs, qkv + ((size_t)b * a.Tq + a.qrow + t0) * S + (size_t)h * hd, (size_t)S, nrows, AP_ROWS, hd, tid);
    const int p = a.q0 + t, qs = live && qstart ? qstart[row] : 0;
    const int kend = min(a.nk, a.q0 + t0 + nrows - a.k0); /* keys past the tile's last query are all masked */
    float acc[ND], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int i = 0; i < ND; i++) acc[i] = 0.0f;
    __syncthreads();
    for (int j0 = 0; j0 < kend; j0 += AP_KEYS) {
        const int nk = min(AP_KEYS, kend - j0);
        ap_load(Ks, kv + (krow0 + j0) * KS + (size_t)kh * hd, (size_t)KS, nk, AP_KEYS, hd, tid);
        ap_load(Vs, kv + (krow0 + j0) * KS + (size_t)(a.nkv + kh) * hd, (size_t)KS, nk, AP_KEYS, hd, tid);
        __syncthreads();
        float s[AP_KEYS / 4], mt = -INFINITY;
#pragma unroll
        for (int i = 0; i < AP_KEYS / 4; i++) {
            const int j = c + 4 * i;
            float v = -INFINITY;
            if (live && j < nk && ap_sees(p, qs, a.k0 + j0 + j)) {
                float dot = 0.0f;
                for (int d = 0; d < hd; d++) dot += Qs[r * LD + d] * Ks[j * LD + d];
                v = dot * a.scale;
            }
            s[i] = v;
            mt = fmaxf(mt, v);
        }
        mt = ap_row_max(mt);
        const float mn = fmaxf(m, mt);
        /* a row that has seen no key yet keeps m = -inf, l = 0 */
        const float f = mn == -INFINITY ? 1.0f : expf(m - mn);
        float ls = 0.0f;
#pragma unroll
        for (int i = 0; i < AP_KEYS / 4; i++) {
            const float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - mn);
            Ps[r * (AP_KEYS + 1) + c + 4 * i] = e;
            ls += e;
        }
        l = l * f + ap_row_sum(ls);
        m = mn;
        __syncthreads(); /* the row's P from its 4 threads */
#pragma unroll
        for (int i = 0; i < ND; i++) {
            const int d = c + 4 * i;
            if (d < hd) {
                float v = acc[i] * f;
                for (int j = 0; j < nk; j++) v += Ps[r * (AP_KEYS + 1) + j] * Vs[j * LD + d];
                acc[i] = v;
            }
        }
        __syncthreads(); /* the tiles' readers are done */
    }
    if (!live) return;
    /* lse' = log(e^old + e^part); out' = out e^(old - lse') + acc e^(m - lse') */
    const float part = l > 0.0f ? m + logf(l) : -INFINITY;
    float nw = old;
    if (part != -INFINITY)
        nw = old == -INFINITY ? part : old > part ? old + log1pf(expf(part - old)) : part + log1pf(expf(old - part));
    T *o = out + row * OS + (size_t)h * hd;
    const float fo = old == -INFINITY ? 0.0f : expf(old - nw), fa = part == -INFINITY ? 0.0f : expf(m - nw);
#pragma unroll
    for (int i = 0; i < ND; i++) {
        const int d = c + 4 * i;
        if (d < hd) act_st(o, (size_t)d, (fo != 0.0f ? act_ld(o, (size_t)d) * fo : 0.0f) + acc[i] * fa);
    }
    if (c == 0) *L = nw;
}

template <typename T, int ND>
__global__ void __launch_bounds__(AP_THREADS)
    att_part_dq_k(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, const T *kv, const int *qstart,
                  ApShape a) {
    float *sm = fl_smem();
    const int hd = a.hd, LD = hd + 1, tid = threadIdx.x, r = tid / 4, c = tid % 4;
    const int t0 = blockIdx.x * AP_ROWS, h = blockIdx.y, b = blockIdx.z, kh = h / (a.nh / a.nkv);
    const int S = (a.nh + 2 * a.nkv) * hd, KS = 2 * a.nkv * hd, OS = a.nh * hd;
    float *Qs = sm, *dOs = Qs + AP_ROWS * LD, *Ks = dOs + AP_ROWS * LD, *Vs = Ks + AP_KEYS * LD, *dSs = Vs + AP_KEYS * LD;
    const int nrows = min(AP_ROWS, a.nq - t0), t = t0 + r, live = r < nrows;
    const size_t row = (size_t)b * a.Tq + a.qrow + t, row0 = (size_t)b * a.Tq + a.qrow + t0, krow0 = (size_t)b * a.Tk + a.krow;
    ap_load(Qs, qkv + row0 * S + (size_t)h * hd, (size_t)S, nrows, AP_ROWS, hd, tid);
    ap_load(dOs, dout + row0 * OS + (size_t)h * hd, (size_t)OS, nrows, AP_ROWS, hd, tid);
    const int p = a.q0 + t, qs = live && qstart ? qstart[row] : 0;
    const float lr = live ? lse[((size_t)b * a.nh + h) * a.Tq + a.qrow + t] : -INFINITY;
    __syncthreads();
    float D = 0.0f; /* dO . O of the final output */
#pragma unroll
    for (int i = 0; i < ND; i++) {
        const int d = c + 4 * i;
        if (live && d < hd) D += dOs[r * LD + d] * act_ld(out, row * OS + (size_t)h * hd + d);
    }
    D = ap_row_sum(D);
    const int kend = min(a.nk, a.q0 + t0 + nrows - a.k0);
    float dq[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) dq[i] = 0.0f;
    for (int j0 = 0; j0 < kend; j0 += AP_KEYS) {
        const int nk = min(AP_KEYS, kend - j0);
        ap_load(Ks, kv + (krow0 + j0) * KS + (size_t)kh * hd, (size_t)KS, nk, AP_KEYS, hd, tid);
        ap_load(Vs, kv + (krow0 + j0) * KS + (size_t)(a.nkv + kh) * hd, (size_t)KS, nk, AP_KEYS, hd, tid);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < AP_KEYS / 4; i++) {
            const int j = c + 4 * i;
            float ds = 0.0f;
            if (live && lr != -INFINITY && j < nk && ap_sees(p, qs, a.k0 + j0 + j)) {
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < hd; d++) {
                    s += Qs[r * LD + d] * Ks[j * LD + d];
                    dp += dOs[r * LD + d] * Vs[j * LD + d];
                }
                const float P = expf(s * a.scale - lr);
                ds = P * (dp - D) * a.scale;
            }
            dSs[r * (AP_KEYS + 1) + j] = ds;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ND; i++) {
            const int d = c + 4 * i;
            if (d < hd) {
                float v = dq[i];
                for (int j = 0; j < nk; j++) v += dSs[r * (AP_KEYS + 1) + j] * Ks[j * LD + d];
                dq[i] = v;
            }
        }
        __syncthreads();
    }
    if (!live) return;
    T *g = dqkv + row * S + (size_t)h * hd;
#pragma unroll
    for (int i = 0; i < ND; i++) {
        const int d = c + 4 * i;
        if (d < hd) act_st(g, (size_t)d, act_ld(g, (size_t)d) + dq[i]);
    }
}

template <typename T, int ND>
__global__ void __launch_bounds__(AP_THREADS)
    att_part_dkv_k(float *dkv, const T *dout, const T *qkv, const T *out, const float *lse, const T *kv, const int *qstart,
                   ApShape a) {
    float *sm = fl_smem();
    const int hd = a.hd, LD = hd + 1, tid = threadIdx.x, j = tid / 4, c = tid % 4;
    const int j0 = blockIdx.x * AP_ROWS, kh = blockIdx.y, b = blockIdx.z, group = a.nh / a.nkv;
    const int S = (a.nh + 2 * a.nkv) * hd, KS = 2 * a.nkv * hd, OS = a.nh * hd, PL = AP_KEYS + 1;
    float *Ks = sm, *Vs = Ks + AP_ROWS * LD, *Qs = Vs + AP_ROWS * LD, *dOs = Qs + AP_KEYS * LD;
    float *Ps = dOs + AP_KEYS * LD, *dSs = Ps + AP_ROWS * PL, *Ls = dSs + AP_ROWS * PL, *Ds = Ls + AP_KEYS;
    int *QSs = (int *)(Ds + AP_KEYS);
    const int nkeys = min(AP_ROWS, a.nk - j0), live = j < nkeys, kp = a.k0 + j0 + j;
    const size_t krow0 = (size_t)b * a.Tk + a.krow + j0;
    ap_load(Ks, kv + krow0 * KS + (size_t)kh * hd, (size_t)KS, nkeys, AP_ROWS, hd, tid);
    ap_load(Vs, kv + krow0 * KS + (size_t)(a.nkv + kh) * hd, (size_t)KS, nkeys, AP_ROWS, hd, tid);
    float dk[ND], dv[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) dk[i] = dv[i] = 0.0f;
    /* queries before the tile's first key see none of it */
    const int tstart = max(0, a.k0 + j0 - a.q0);
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        for (int t0 = tstart; t0 < a.nq; t0 += AP_KEYS) {
            const int nt = min(AP_KEYS, a.nq - t0);
            const size_t row0 = (size_t)b * a.Tq + a.qrow + t0;
            __syncthreads(); /* the last tiles' readers are done */
            ap_load(Qs, qkv + row0 * S + (size_t)h * hd, (size_t)S, nt, AP_KEYS, hd, tid);
            ap_load(dOs, dout + row0 * OS + (size_t)h * hd, (size_t)OS, nt, AP_KEYS, hd, tid);
            __syncthreads();
            { /* the query tile's D = dO . O, lse and document starts: query row tid / 4 */
                const int q = tid / 4;
                float D = 0.0f;
#pragma unroll
                for (int i = 0; i < ND; i++) {
                    const int d = c + 4 * i;
                    if (q < nt && d < hd) D += dOs[q * LD + d] * act_ld(out, (row0 + q) * OS + (size_t)h * hd + d);
                }
                D = ap_row_sum(D);
                if (c == 0) {
                    Ds[q] = D;
                    Ls[q] = q < nt ? lse[((size_t)b * a.nh + h) * a.Tq + a.qrow + t0 + q] : -INFINITY;
                    QSs[q] = q < nt && qstart ? qstart[row0 + q] : 0;
                }
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < AP_KEYS / 4; i++) {
                const int q = c + 4 * i;
                float P = 0.0f, ds = 0.0f;
                if (live && q < nt && Ls[q] != -INFINITY && ap_sees(a.q0 + t0 + q, QSs[q], kp)) {
                    float s = 0.0f, dp = 0.0f;
                    for (int d = 0; d < hd; d++) {
                        s += Ks[j * LD + d] * Qs[q * LD + d];
                        dp += Vs[j * LD + d] * dOs[q * LD + d];
                    }
                    P = expf(s * a.scale - Ls[q]);
                    ds = P * (dp - Ds[q]) * a.scale;
                }
                Ps[j * PL + q] = P;
                dSs[j * PL + q] = ds;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < ND; i++) {
                const int d = c + 4 * i;
                if (d < hd) {
                    float v = dv[i], k = dk[i];
                    for (int q = 0; q < nt; q++) {
                        v += Ps[j * PL + q] * dOs[q * LD + d];
                        k += dSs[j * PL + q] * Qs[q * LD + d];
                    }
                    dv[i] = v;
                    dk[i] = k;
                }
            }
        }
    }
    if (!live) return;
    float *gk = dkv + (krow0 + j) * KS + (size_t)kh * hd, *gv = dkv + (krow0 + j) * KS + (size_t)(a.nkv + kh) * hd;
#pragma unroll
    for (int i = 0; i < ND; i++) {
        const int d = c + 4 * i;
        if (d < hd) {
            gk[d] += dk[i];
            gv[d] += dv[i];
        }
    }
}

/* the accumulator width of a head dim (hd <= 4 ND); 0: over 128 */
static int ap_nd(int hd) { return hd <= 32 ? 8 : hd <= 64 ? 16 : hd <= 128 ? 32 : 0; }

static ApShape ap_shape(int qrow, int q0, int nq, int krow, int k0, int nk, int Tq, int Tk, int nh, int nkv, int hd) {
    if (nkv <= 0 || nh % nkv != 0) die(EXIT_INTERNAL, "attention parts: %d heads over %d kv heads", nh, nkv);
    if (!ap_nd(hd))
        die(EXIT_USAGE, "context parallelism on CUDA: head dim %d (the attention parts take head dims up to 128)", hd);
    return ApShape{qrow, q0, nq, krow, k0, nk, Tq, Tk, nh, nkv, hd, 1.0f / sqrtf((float)hd)};
}

/* one part kernel for T and the shape's accumulator width */
#define AP_LAUNCH(KERNEL, T, grid, smem, ...)                                                                   \
    do {                                                                                                    \
        switch (ap_nd(a.hd)) {                                                                              \
        case 8: launch_smem(KERNEL<T, 8>, grid, AP_THREADS, smem, __VA_ARGS__); break;                      \
        case 16: launch_smem(KERNEL<T, 16>, grid, AP_THREADS, smem, __VA_ARGS__); break;                    \
        default: launch_smem(KERNEL<T, 32>, grid, AP_THREADS, smem, __VA_ARGS__); break;                    \
        }                                                                                                   \
    } while (0)

/* The tensor-core parts: the whole sequence's bf16 mma.sync kernels
 * (attention_flash_bf16.cuh) on the segment pair, under compute dtype bf16
 * on sm_80 and newer, for head dims 32, 64 and 128 with 16-byte aligned
 * operands; 0 (nothing ran) otherwise, and the fp32 tiles above take the
 * call. part_tc_calls counts the calls they took (tests). */
static long part_tc_calls;
extern "C" long kernels_cuda_attention_part_tc_calls(void) { return part_tc_calls; }

static int ap_tc(int hd, const void *a, const void *b, const void *c) {
    return fl_bf16() && cuda_flash_head_dim(hd) && aligned16(a) && aligned16(b) && aligned16(c);
}

static FbSeg ap_seg(const float *kv, int qrow, int q0, int nq, int krow, int k0, int nk, int Tq, int Tk, int nkv, int hd,
                    int merge) {
    return FbSeg{CACT16(kv), (size_t)2 * nkv * hd, qrow, q0, nq, krow, k0, nk, Tq, Tk, merge};
}

#define AP_TC_SWITCH(CALL)                                                                                      \
    switch (hd) {                                                                                               \
    case 32: ran = CALL(32); break;                                                                             \
    case 64: ran = CALL(64); break;                                                                             \
    default: ran = CALL(128); break;                                                                            \
    }

static void cu_attention_part_forward(float *out, float *lse, const float *qkv, int qrow, int q0, int nq, const float *kv,
                                   int krow, int k0, int nk, const int *qstart, int B, int Tq, int Tk, int nh, int nkv,
                                   int hd, int merge) {
    if (B <= 0 || nq <= 0) return;
    const ApShape a = ap_shape(qrow, q0, nq, krow, k0, nk, Tq, Tk, nh, nkv, hd);
    if (ap_tc(hd, qkv, kv, out)) {
        const FbSeg g = ap_seg(kv, qrow, q0, nq, krow, k0, nk, Tq, Tk, nkv, hd, merge);
        int ran;
#define AP_FWD(HD) fb_forward<HD>(out, lse, qkv, qstart, g, B, nh, nkv)
        AP_TC_SWITCH(AP_FWD)
#undef AP_FWD
        if (ran) {
            part_tc_calls++;
            return;
        }
    }
    const dim3 grid((unsigned)((nq + AP_ROWS - 1) / AP_ROWS), (unsigned)nh, (unsigned)B);
    const size_t smem = ap_fwd_floats(hd) * sizeof(float);
    if (act_bf16()) AP_LAUNCH(att_part_fwd_k, __nv_bfloat16, grid, smem, ACT16(out), lse, CACT16(qkv), CACT16(kv), qstart, a, merge);
    else AP_LAUNCH(att_part_fwd_k, float, grid, smem, out, lse, qkv, kv, qstart, a, merge);
}

static void cu_attention_part_backward(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, int qrow, int q0, int nq, const float *kv, int krow, int k0, int nk,
                                    const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd) {
    if (B <= 0 || nq <= 0 || nk <= 0) return;
    const ApShape a = ap_shape(qrow, q0, nq, krow, k0, nk, Tq, Tk, nh, nkv, hd);
    if (ap_tc(hd, qkv, kv, dout) && aligned16(out)) {
        const FbSeg g = ap_seg(kv, qrow, q0, nq, krow, k0, nk, Tq, Tk, nkv, hd, 1);
        int ran;
#define AP_BWD(HD) fb_backward<HD>(dqkv, dkv, dout, qkv, out, lse, qstart, g, B, nh, nkv)
        AP_TC_SWITCH(AP_BWD)
#undef AP_BWD
        if (ran) {
            part_tc_calls++;
            return;
        }
    }
    const dim3 gq((unsigned)((nq + AP_ROWS - 1) / AP_ROWS), (unsigned)nh, (unsigned)B);
    const dim3 gk((unsigned)((nk + AP_ROWS - 1) / AP_ROWS), (unsigned)nkv, (unsigned)B);
    const size_t sq = ap_dq_floats(hd) * sizeof(float), sk = ap_dkv_floats(hd) * sizeof(float);
    if (act_bf16()) {
        if (dqkv) AP_LAUNCH(att_part_dq_k, __nv_bfloat16, gq, sq, ACT16(dqkv), CACT16(dout), CACT16(qkv), CACT16(out), lse, CACT16(kv), qstart, a);
        if (dkv) AP_LAUNCH(att_part_dkv_k, __nv_bfloat16, gk, sk, dkv, CACT16(dout), CACT16(qkv), CACT16(out), lse, CACT16(kv), qstart, a);
    } else {
        if (dqkv) AP_LAUNCH(att_part_dq_k, float, gq, sq, dqkv, dout, qkv, out, lse, kv, qstart, a);
        if (dkv) AP_LAUNCH(att_part_dkv_k, float, gk, sk, dkv, dout, qkv, out, lse, kv, qstart, a);
    }
}

static void cu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    if (width && rows) CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, 0));
}
