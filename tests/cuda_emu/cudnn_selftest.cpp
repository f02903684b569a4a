/* tests/cuda_emu/cudnn_selftest.cpp — checks of the cuDNN emulator
 * (cudnn_emu.cpp) through the backend API alone: small graphs against a
 * direct computation, causal attention forward and backward (the graph
 * cudnn-frontend lowers to at cuDNN 9.19: matmul, scale, GEN_INDEX /
 * CMP_GE / BINARY_SELECT mask, max / sub / exp / sum / log / div softmax,
 * reshape-transposes, a GQA head reduction) against plain fp32 attention,
 * and the errors the library reports (unset attributes, an unfinalized
 * engine config, a missing uid, a misaligned pointer, no engine under
 * LLMTRAIN_EMU_CUDNN=unsupported). Prints "ok ..." / "FAIL ..." lines and
 * "N passed, M failed"; run by tests/cuda_emu/selftest.sh. */
#include "include/cudnn.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

static int g_pass, g_fail;
static void check(bool ok, const std::string &what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
    (ok ? g_pass : g_fail)++;
}

static float bf16r(float f) {  // round to nearest even bf16 (finite values)
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t to_bf16(float f) {
    float r = bf16r(f);
    uint32_t u;
    memcpy(&u, &r, 4);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f;
}

// device buffers: host memory with the emulated allocator's alignment
static void *dev(size_t bytes) {
    void *p = nullptr;
    if (posix_memalign(&p, 256, bytes ? bytes : 1)) abort();
    memset(p, 0, bytes);
    return p;
}

// a graph under construction; any failing call is remembered (first one)
struct B {
    cudnnHandle_t h = nullptr;
    std::vector<cudnnBackendDescriptor_t> made;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    std::string where;
    int64_t next_virtual = 1000;

    void call(cudnnStatus_t s, const char *w) {
        if (s != CUDNN_STATUS_SUCCESS && st == CUDNN_STATUS_SUCCESS) {
            char msg[512];
            cudnnGetLastErrorString(msg, sizeof msg);
            st = s;
            where = std::string(w) + ": " + cudnnGetErrorString(s) + " (" + msg + ")";
        }
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
        cudnnBackendDescriptor_t d = nullptr;
        call(cudnnBackendCreateDescriptor(t, &d), "create");
        made.push_back(d);
        return d;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t c,
             const void *v) {
        call(cudnnBackendSetAttribute(d, n, t, c, v), "set");
    }
    void fin(cudnnBackendDescriptor_t d) { call(cudnnBackendFinalize(d), "finalize"); }
    ~B() {
        for (auto d : made)
            if (d) cudnnBackendDestroyDescriptor(d);
    }
    // uid 0: virtual
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, std::vector<int64_t> dims, std::vector<int64_t> strides,
                                    bool by_value = false) {
        bool virt = uid == 0;
        if (virt) uid = next_virtual++;
        int64_t align = 16;
        cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)dims.size(), dims.data());
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)strides.size(), strides.data());
        set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
        if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
        fin(t);
        return t;
    }
    // packed strides
    static std::vector<int64_t> packed(const std::vector<int64_t> &d) {
        std::vector<int64_t> s(d.size(), 1);
        for (size_t i = d.size() - 1; i-- > 0;) s[i] = s[i + 1] * d[i + 1];
        return s;
    }
    cudnnBackendDescriptor_t virt(cudnnDataType_t dt, std::vector<int64_t> dims) { return tensor(0, dt, dims, packed(dims)); }
    cudnnBackendDescriptor_t scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true); }

    std::vector<cudnnBackendDescriptor_t> ops;
    void pw(cudnnPointwiseMode_t m, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
            cudnnBackendDescriptor_t y, int64_t axis = -1, cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
        cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        set(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m);
        set(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
        if (axis >= 0) set(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
        fin(p);
        cudnnBackendDescriptor_t o = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        set(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
        set(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        if (b) set(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
        if (t) set(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
        set(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        fin(o);
        ops.push_back(o);
    }
    void mm(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        cudnnBackendDescriptor_t m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        fin(m);
        cudnnBackendDescriptor_t o = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        set(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
        set(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
        set(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
        set(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
        fin(o);
        ops.push_back(o);
    }
    void red(cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op);
        set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        fin(r);
        cudnnBackendDescriptor_t o = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        set(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        set(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        set(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
        fin(o);
        ops.push_back(o);
    }
    void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t o = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        set(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        set(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        fin(o);
        ops.push_back(o);
    }
    // graph -> heuristics -> plan; returns the plan (null on failure) and its workspace
    cudnnBackendDescriptor_t plan(int64_t *ws, cudnnBackendDescriptor_t *graph_out = nullptr) {
        cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data());
        fin(g);
        if (graph_out) *graph_out = g;
        cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
        set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
        set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
        fin(heur);
        int64_t n = -1;
        call(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr), "heur count");
        if (st != CUDNN_STATUS_SUCCESS || n < 1) return nullptr;
        cudnnBackendDescriptor_t cfg = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        int64_t got = 0;
        call(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &cfg), "heur results");
        cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
        fin(p);
        int64_t cnt = 0;
        *ws = -1;
        call(cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, ws), "workspace");
        return st == CUDNN_STATUS_SUCCESS ? p : nullptr;
    }
    cudnnStatus_t exec(cudnnBackendDescriptor_t p, std::vector<int64_t> uids, std::vector<void *> ptrs, void *ws) {
        cudnnBackendDescriptor_t vp = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
        set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
        set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data());
        set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
        fin(vp);
        if (st != CUDNN_STATUS_SUCCESS) return st;
        return cudnnBackendExecute(h, p, vp);
    }
};

static double max_rel(const std::vector<float> &got, const std::vector<float> &want) {
    double m = 0, scale = 1e-6;
    for (float w : want) scale = std::max(scale, (double)fabsf(w));
    for (size_t i = 0; i < got.size(); i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (std::isnan(got[i]) != std::isnan(want[i]) || (std::isinf(want[i]) && got[i] != want[i])) return 1e30;
        if (std::isfinite(want[i])) m = std::max(m, d / scale);
    }
    return m;
}

// Y = bf16(exp(s * A.B)) and R = sum_n exp(s * A.B): A fp32 with transposed
// strides, B bf16 with half the heads (a group of 2 shares one), s by value
static void test_small(cudnnHandle_t h) {
    const int H = 4, HB = 2, M = 3, K = 5, N = 6;
    B b;
    b.h = h;
    auto A = b.tensor(1, CUDNN_DATA_FLOAT, {1, H, M, K}, {H * M * K, M * K, 1, M});  // stored [h][k][m]
    auto Bt = b.tensor(2, CUDNN_DATA_BFLOAT16, {1, HB, K, N}, B::packed({1, HB, K, N}));
    auto s = b.scalar(3);
    auto Y = b.tensor(4, CUDNN_DATA_BFLOAT16, {1, H, M, N}, B::packed({1, H, M, N}));
    auto R = b.tensor(5, CUDNN_DATA_FLOAT, {1, H, M, 1}, {H * M, M, 1, 1});
    auto c = b.virt(CUDNN_DATA_FLOAT, {1, H, M, N}), cs = b.virt(CUDNN_DATA_FLOAT, {1, H, M, N}),
         e = b.virt(CUDNN_DATA_FLOAT, {1, H, M, N});
    b.mm(A, Bt, c);
    b.pw(CUDNN_POINTWISE_MUL, c, s, nullptr, cs);
    b.pw(CUDNN_POINTWISE_EXP, cs, nullptr, nullptr, e);
    b.pw(CUDNN_POINTWISE_IDENTITY, e, nullptr, nullptr, Y);
    b.red(CUDNN_REDUCE_TENSOR_ADD, e, R);
    int64_t ws = 0;
    cudnnBackendDescriptor_t p = b.plan(&ws);
    check(p != nullptr, "small graph: graph, heuristics and plan finalize" + (p ? "" : " — " + b.where));
    if (!p) return;
    check(ws == 4096, "small graph: plan workspace size is queried (" + std::to_string(ws) + " bytes)");
    uint32_t seed = 1;
    float *a = (float *)dev(sizeof(float) * H * M * K);
    uint16_t *bb = (uint16_t *)dev(2 * HB * K * N);
    std::vector<float> av(H * M * K), bv(HB * K * N);
    for (int hh = 0; hh < H; hh++)
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) {
                float v = lcg(&seed);
                av[(hh * M + m) * K + k] = v;
                a[hh * M * K + k * M + m] = v;
            }
    for (int i = 0; i < HB * K * N; i++) {
        bb[i] = to_bf16(lcg(&seed));
        bv[i] = from_bf16(bb[i]);
    }
    float sv = 0.37f;
    uint16_t *y = (uint16_t *)dev(2 * H * M * N);
    float *r = (float *)dev(4 * H * M);
    void *w = dev((size_t)ws);
    cudnnStatus_t st = b.exec(p, {1, 2, 3, 4, 5}, {a, bb, &sv, y, r}, w);
    check(st == CUDNN_STATUS_SUCCESS, std::string("small graph: execute ") + cudnnGetErrorString(st));
    std::vector<float> ywant(H * M * N), ygot(H * M * N), rwant(H * M, 0.0f), rgot(H * M);
    for (int hh = 0; hh < H; hh++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                float acc = 0;
                for (int k = 0; k < K; k++) acc += av[(hh * M + m) * K + k] * bv[((hh / 2) * K + k) * N + n];
                float ev = expf(acc * sv);
                ywant[(hh * M + m) * N + n] = bf16r(ev);
                ygot[(hh * M + m) * N + n] = from_bf16(y[(hh * M + m) * N + n]);
                rwant[hh * M + m] += ev;
            }
    for (int i = 0; i < H * M; i++) rgot[i] = r[i];
    check(max_rel(ygot, ywant) == 0.0, "small graph: Y = bf16(exp(s * A.B)) with GQA-broadcast B and strided A, bitwise");
    check(max_rel(rgot, rwant) < 1e-6, "small graph: R = sum over the last dim of exp(s * A.B)");
    free(a); free(bb); free(y); free(r); free(w);
}

// GEN_INDEX / CMP_GE / BINARY_SELECT causal mask, MAX reduction and a
// RESHAPE that transposes by strides
static void test_mask_reshape(cudnnHandle_t h) {
    const int H = 2, S = 4;
    B b;
    b.h = h;
    std::vector<int64_t> d = {1, H, S, S};
    auto X = b.tensor(1, CUDNN_DATA_FLOAT, d, B::packed(d));
    auto ninf = b.scalar(2);
    auto row = b.tensor(0, CUDNN_DATA_INT32, d, B::packed(d)), col = b.tensor(0, CUDNN_DATA_INT32, d, B::packed(d));
    auto keep = b.tensor(0, CUDNN_DATA_BOOLEAN, d, B::packed(d));
    auto Z = b.virt(CUDNN_DATA_FLOAT, d);
    auto Mx = b.tensor(3, CUDNN_DATA_FLOAT, {1, H, S, 1}, {H * S, S, 1, 1});
    auto T = b.tensor(0, CUDNN_DATA_FLOAT, d, {H * S * S, S * S, 1, S});
    auto O = b.tensor(4, CUDNN_DATA_FLOAT, d, B::packed(d));
    b.pw(CUDNN_POINTWISE_GEN_INDEX, X, nullptr, nullptr, row, 2);
    b.pw(CUDNN_POINTWISE_GEN_INDEX, X, nullptr, nullptr, col, 3);
    b.pw(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, -1, CUDNN_DATA_BOOLEAN);
    b.pw(CUDNN_POINTWISE_BINARY_SELECT, X, ninf, keep, Z);
    b.red(CUDNN_REDUCE_TENSOR_MAX, Z, Mx);
    b.reshape(Z, T);
    b.pw(CUDNN_POINTWISE_IDENTITY, T, nullptr, nullptr, O);
    int64_t ws = 0;
    cudnnBackendDescriptor_t p = b.plan(&ws);
    check(p != nullptr, "mask/reshape graph: plan finalizes" + (p ? "" : " — " + b.where));
    if (!p) return;
    float *x = (float *)dev(4 * H * S * S), *mx = (float *)dev(4 * H * S), *o = (float *)dev(4 * H * S * S);
    uint32_t seed = 7;
    for (int i = 0; i < H * S * S; i++) x[i] = lcg(&seed);
    float ni = -std::numeric_limits<float>::infinity();
    void *w = dev((size_t)ws);
    cudnnStatus_t st = b.exec(p, {1, 2, 3, 4}, {x, &ni, mx, o}, w);
    check(st == CUDNN_STATUS_SUCCESS, std::string("mask/reshape graph: execute ") + cudnnGetErrorString(st));
    bool ok_o = true, ok_m = true;
    for (int hh = 0; hh < H; hh++)
        for (int i = 0; i < S; i++) {
            float m = ni;
            for (int j = 0; j < S; j++) {
                float z = i >= j ? x[(hh * S + i) * S + j] : ni;  // keep ? X : B
                m = std::max(m, z);
                if (o[(hh * S + j) * S + i] != z) ok_o = false;  // O = Z transposed
            }
            if (mx[hh * S + i] != m) ok_m = false;
        }
    check(ok_m, "mask/reshape graph: BINARY_SELECT keeps X where row >= col, -inf above the diagonal; MAX per row");
    check(ok_o, "mask/reshape graph: RESHAPE to swapped dims and strides is the transpose");
    free(x); free(mx); free(o); free(w);
}

// causal attention as cudnn-frontend lowers it for cuDNN 9.19 (composite
// forward with Stats, backward with softmax_sum and an fp32 dQ accumulator),
// GQA, against plain fp32 attention
static void test_attention(cudnnHandle_t h) {
    const int64_t b_ = 2, hq = 4, hk = 2, s = 5, d = 8;
    const float scale = 1.0f / sqrtf((float)d);
    enum { Q = 1, K, V, O, STATS, SCALE, NINF, DO, DQ, DK, DV, SSUM, DQACC, ONE };
    std::vector<int64_t> qd = {b_, hq, s, d}, kd = {b_, hk, s, d}, S_ = {b_, hq, s, s}, R_ = {b_, hq, s, 1};
    std::vector<int64_t> kts = {hk * s * d, s * d, 1, d};  // K as KT: [b,hk,d,s]
    // host data
    uint32_t seed = 42;
    size_t nq = (size_t)(b_ * hq * s * d), nk = (size_t)(b_ * hk * s * d);
    std::vector<uint16_t> hq_(nq), hk_(nk), hv_(nk), hdo(nq);
    for (auto &v : hq_) v = to_bf16(lcg(&seed));
    for (auto &v : hk_) v = to_bf16(lcg(&seed));
    for (auto &v : hv_) v = to_bf16(lcg(&seed));
    for (auto &v : hdo) v = to_bf16(lcg(&seed));
    auto up = [](const std::vector<uint16_t> &v) {
        uint16_t *p = (uint16_t *)dev(2 * v.size());
        memcpy(p, v.data(), 2 * v.size());
        return p;
    };
    uint16_t *q = up(hq_), *k = up(hk_), *v = up(hv_), *o = (uint16_t *)dev(2 * nq), *dO = up(hdo);
    float *stats = (float *)dev(4 * b_ * hq * s);
    float ni = -std::numeric_limits<float>::infinity(), one = 1.0f, sc = scale;

    // reference: fp32 attention on the bf16 inputs
    std::vector<float> P((size_t)(b_ * hq * s * s)), Oref(nq), LSE((size_t)(b_ * hq * s));
    auto Qf = [&](int64_t bi, int64_t h, int64_t i, int64_t c) { return from_bf16(hq_[((bi * hq + h) * s + i) * d + c]); };
    auto Kf = [&](int64_t bi, int64_t h, int64_t j, int64_t c) { return from_bf16(hk_[((bi * hk + h / (hq / hk)) * s + j) * d + c]); };
    auto Vf = [&](int64_t bi, int64_t h, int64_t j, int64_t c) { return from_bf16(hv_[((bi * hk + h / (hq / hk)) * s + j) * d + c]); };
    auto dOf = [&](int64_t bi, int64_t h, int64_t i, int64_t c) { return from_bf16(hdo[((bi * hq + h) * s + i) * d + c]); };
    for (int64_t bi = 0; bi < b_; bi++)
        for (int64_t hh = 0; hh < hq; hh++)
            for (int64_t i = 0; i < s; i++) {
                float sv[64], mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    float acc = 0;
                    for (int64_t c = 0; c < d; c++) acc += Qf(bi, hh, i, c) * Kf(bi, hh, j, c);
                    sv[j] = acc * scale;
                    mx = std::max(mx, sv[j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += expf(sv[j] - mx);
                LSE[(size_t)((bi * hq + hh) * s + i)] = mx + logf(sum);
                for (int64_t j = 0; j < s; j++) P[(size_t)(((bi * hq + hh) * s + i) * s + j)] = j <= i ? expf(sv[j] - mx) / sum : 0;
                for (int64_t c = 0; c < d; c++) {
                    float acc = 0;
                    for (int64_t j = 0; j <= i; j++) acc += P[(size_t)(((bi * hq + hh) * s + i) * s + j)] * Vf(bi, hh, j, c);
                    Oref[(size_t)(((bi * hq + hh) * s + i) * d + c)] = acc;
                }
            }

    {  // forward
        B g;
        g.h = h;
        auto tQ = g.tensor(Q, CUDNN_DATA_BFLOAT16, qd, B::packed(qd));
        auto tKT = g.tensor(K, CUDNN_DATA_BFLOAT16, {b_, hk, d, s}, kts);
        auto tV = g.tensor(V, CUDNN_DATA_BFLOAT16, kd, B::packed(kd));
        auto tO = g.tensor(O, CUDNN_DATA_BFLOAT16, qd, B::packed(qd));
        auto tStats = g.tensor(STATS, CUDNN_DATA_FLOAT, R_, {hq * s, s, 1, 1});
        auto tScale = g.scalar(SCALE), tNinf = g.scalar(NINF);
        auto s1 = g.virt(CUDNN_DATA_FLOAT, S_), s2 = g.virt(CUDNN_DATA_FLOAT, S_);
        auto row = g.virt(CUDNN_DATA_INT32, S_), col = g.virt(CUDNN_DATA_INT32, S_), keep = g.virt(CUDNN_DATA_BOOLEAN, S_);
        auto s3 = g.virt(CUDNN_DATA_FLOAT, S_), m = g.virt(CUDNN_DATA_FLOAT, R_), s4 = g.virt(CUDNN_DATA_FLOAT, S_);
        auto e = g.virt(CUDNN_DATA_FLOAT, S_), z = g.virt(CUDNN_DATA_FLOAT, R_), lz = g.virt(CUDNN_DATA_FLOAT, R_);
        auto P_ = g.virt(CUDNN_DATA_BFLOAT16, S_);
        g.mm(tQ, tKT, s1);
        g.pw(CUDNN_POINTWISE_MUL, s1, tScale, nullptr, s2);
        g.pw(CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, nullptr, row, 2);
        g.pw(CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, nullptr, col, 3);
        g.pw(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, -1, CUDNN_DATA_BOOLEAN);
        g.pw(CUDNN_POINTWISE_BINARY_SELECT, s2, tNinf, keep, s3);
        g.red(CUDNN_REDUCE_TENSOR_MAX, s3, m);
        g.pw(CUDNN_POINTWISE_SUB, s3, m, nullptr, s4);
        g.pw(CUDNN_POINTWISE_EXP, s4, nullptr, nullptr, e);
        g.red(CUDNN_REDUCE_TENSOR_ADD, e, z);
        g.pw(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, lz);
        g.pw(CUDNN_POINTWISE_ADD, m, lz, nullptr, tStats);
        g.pw(CUDNN_POINTWISE_DIV, e, z, nullptr, P_);
        g.mm(P_, tV, tO);
        int64_t ws = 0;
        cudnnBackendDescriptor_t p = g.plan(&ws);
        check(p != nullptr, "attention forward: plan finalizes" + (p ? "" : " — " + g.where));
        if (!p) return;
        void *w = dev((size_t)ws);
        cudnnStatus_t st = g.exec(p, {Q, K, V, O, STATS, SCALE, NINF}, {q, k, v, o, stats, &sc, &ni}, w);
        check(st == CUDNN_STATUS_SUCCESS, std::string("attention forward: execute ") + cudnnGetErrorString(st));
        free(w);
        std::vector<float> og(nq), sg(LSE.size());
        for (size_t i = 0; i < nq; i++) og[i] = from_bf16(o[i]);
        for (size_t i = 0; i < sg.size(); i++) sg[i] = stats[i];
        double eo = max_rel(og, Oref), es = max_rel(sg, LSE);
        char msg[160];
        snprintf(msg, sizeof msg, "attention forward (causal, GQA 4/2): O within bf16 of fp32 attention (%.2g), Stats = logsumexp (%.2g)", eo, es);
        check(eo < 2e-2 && es < 1e-5, msg);
    }

    // reference backward (fp32, from the reference P)
    std::vector<float> dQr(nq, 0), dKr(nk, 0), dVr(nk, 0);
    for (int64_t bi = 0; bi < b_; bi++)
        for (int64_t hh = 0; hh < hq; hh++) {
            int64_t kh = hh / (hq / hk);
            for (int64_t i = 0; i < s; i++) {
                float Di = 0;
                for (int64_t c = 0; c < d; c++) Di += dOf(bi, hh, i, c) * from_bf16(o[((bi * hq + hh) * s + i) * d + c]);
                for (int64_t j = 0; j < s; j++) {
                    float pij = P[(size_t)(((bi * hq + hh) * s + i) * s + j)], dp = 0;
                    for (int64_t c = 0; c < d; c++) dp += dOf(bi, hh, i, c) * Vf(bi, hh, j, c);
                    float ds = pij * (dp - Di) * scale;
                    for (int64_t c = 0; c < d; c++) {
                        dQr[(size_t)(((bi * hq + hh) * s + i) * d + c)] += ds * Kf(bi, hh, j, c);
                        dKr[(size_t)(((bi * hk + kh) * s + j) * d + c)] += ds * Qf(bi, hh, i, c);
                        dVr[(size_t)(((bi * hk + kh) * s + j) * d + c)] += pij * dOf(bi, hh, i, c);
                    }
                }
            }
        }
    {  // backward
        B g;
        g.h = h;
        auto tQ = g.tensor(Q, CUDNN_DATA_BFLOAT16, qd, B::packed(qd));
        auto tKT = g.tensor(K, CUDNN_DATA_BFLOAT16, {b_, hk, d, s}, kts);
        auto tVT = g.tensor(V, CUDNN_DATA_BFLOAT16, {b_, hk, d, s}, kts);
        auto tO = g.tensor(O, CUDNN_DATA_BFLOAT16, qd, B::packed(qd));
        auto tdO = g.tensor(DO, CUDNN_DATA_BFLOAT16, qd, B::packed(qd));
        auto tStats = g.tensor(STATS, CUDNN_DATA_FLOAT, R_, {hq * s, s, 1, 1});
        auto tdQ = g.tensor(DQ, CUDNN_DATA_BFLOAT16, qd, B::packed(qd));
        auto tdK = g.tensor(DK, CUDNN_DATA_BFLOAT16, kd, B::packed(kd));
        auto tdV = g.tensor(DV, CUDNN_DATA_BFLOAT16, kd, B::packed(kd));
        auto tSum = g.tensor(SSUM, CUDNN_DATA_FLOAT, R_, {hq * s, s, 1, 1});
        auto tAcc = g.tensor(DQACC, CUDNN_DATA_FLOAT, qd, B::packed(qd));
        auto tScale = g.scalar(SCALE), tNinf = g.scalar(NINF), tOne = g.scalar(ONE);
        auto t0 = g.tensor(0, CUDNN_DATA_FLOAT, qd, {hq * s * d, s * d, hq * d, 1});  // the frontend's odd strides
        auto t1 = g.virt(CUDNN_DATA_FLOAT, R_);
        auto sS = g.virt(CUDNN_DATA_FLOAT, S_), sSc = g.virt(CUDNN_DATA_FLOAT, S_), sSub = g.virt(CUDNN_DATA_FLOAT, S_);
        auto row = g.virt(CUDNN_DATA_INT32, S_), col = g.virt(CUDNN_DATA_INT32, S_), keep = g.virt(CUDNN_DATA_BOOLEAN, S_);
        auto sM = g.virt(CUDNN_DATA_FLOAT, S_), eS = g.virt(CUDNN_DATA_FLOAT, S_);
        std::vector<int64_t> Tst = {hq * s * s, s * s, 1, s};
        auto pT = g.tensor(0, CUDNN_DATA_BFLOAT16, S_, Tst);
        auto dVf = g.virt(CUDNN_DATA_BFLOAT16, qd);
        auto dP = g.virt(CUDNN_DATA_FLOAT, S_), t2 = g.virt(CUDNN_DATA_FLOAT, S_), t3 = g.virt(CUDNN_DATA_FLOAT, S_);
        auto dS = g.virt(CUDNN_DATA_FLOAT, S_);
        auto dST = g.tensor(0, CUDNN_DATA_BFLOAT16, S_, Tst);
        auto dKf = g.virt(CUDNN_DATA_BFLOAT16, qd);
        auto kk = g.tensor(0, CUDNN_DATA_FLOAT, kd, B::packed(kd));
        g.pw(CUDNN_POINTWISE_MUL, tdO, tO, nullptr, t0);
        g.red(CUDNN_REDUCE_TENSOR_ADD, t0, t1);
        g.pw(CUDNN_POINTWISE_MUL, t1, tOne, nullptr, tSum);
        g.mm(tQ, tKT, sS);
        g.pw(CUDNN_POINTWISE_MUL, sS, tScale, nullptr, sSc);
        g.pw(CUDNN_POINTWISE_SUB, sSc, tStats, nullptr, sSub);
        g.pw(CUDNN_POINTWISE_GEN_INDEX, sSub, nullptr, nullptr, row, 2);
        g.pw(CUDNN_POINTWISE_GEN_INDEX, sSub, nullptr, nullptr, col, 3);
        g.pw(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, -1, CUDNN_DATA_BOOLEAN);
        g.pw(CUDNN_POINTWISE_BINARY_SELECT, sSub, tNinf, keep, sM);
        g.pw(CUDNN_POINTWISE_EXP, sM, nullptr, nullptr, eS);
        g.reshape(eS, pT);
        g.mm(pT, tdO, dVf);
        g.red(CUDNN_REDUCE_TENSOR_ADD, dVf, tdV);
        g.mm(tdO, tVT, dP);
        g.pw(CUDNN_POINTWISE_SUB, dP, tSum, nullptr, t2);
        g.pw(CUDNN_POINTWISE_MUL, t2, eS, nullptr, t3);
        g.pw(CUDNN_POINTWISE_MUL, t3, tScale, nullptr, dS);
        g.reshape(dS, dST);
        g.mm(dST, tQ, dKf);
        g.red(CUDNN_REDUCE_TENSOR_ADD, dKf, tdK);
        g.reshape(tKT, kk);
        g.mm(dS, kk, tAcc);
        g.pw(CUDNN_POINTWISE_IDENTITY, tAcc, nullptr, nullptr, tdQ);
        int64_t ws = 0;
        cudnnBackendDescriptor_t p = g.plan(&ws);
        check(p != nullptr, "attention backward: plan finalizes" + (p ? "" : " — " + g.where));
        if (!p) return;
        uint16_t *dq = (uint16_t *)dev(2 * nq), *dk = (uint16_t *)dev(2 * nk), *dv = (uint16_t *)dev(2 * nk);
        float *ssum = (float *)dev(4 * b_ * hq * s), *acc = (float *)dev(4 * nq);
        void *w = dev((size_t)ws);
        cudnnStatus_t st = g.exec(p, {Q, K, V, O, DO, STATS, DQ, DK, DV, SSUM, DQACC, SCALE, NINF, ONE},
                                  {q, k, v, o, dO, stats, dq, dk, dv, ssum, acc, &sc, &ni, &one}, w);
        check(st == CUDNN_STATUS_SUCCESS, std::string("attention backward: execute ") + cudnnGetErrorString(st));
        std::vector<float> gq(nq), gk(nk), gv(nk);
        for (size_t i = 0; i < nq; i++) gq[i] = from_bf16(dq[i]);
        for (size_t i = 0; i < nk; i++) gk[i] = from_bf16(dk[i]), gv[i] = from_bf16(dv[i]);
        double e1 = max_rel(gq, dQr), e2 = max_rel(gk, dKr), e3 = max_rel(gv, dVr);
        char msg[200];
        snprintf(msg, sizeof msg, "attention backward (causal, GQA 4/2): dQ %.2g, dK %.2g, dV %.2g of fp32 gradients (bf16 P and dS)", e1, e2, e3);
        check(e1 < 3e-2 && e2 < 3e-2 && e3 < 3e-2, msg);
        free(dq); free(dk); free(dv); free(ssum); free(acc); free(w);
    }
    free(q); free(k); free(v); free(o); free(dO); free(stats);
}

static void test_errors(cudnnHandle_t h) {
    char msg[512];
    {  // a tensor without its uid
        cudnnBackendDescriptor_t t;
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
        int64_t dims[4] = {1, 1, 2, 2}, str[4] = {4, 4, 2, 1}, al = 16;
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &al);
        cudnnStatus_t st = cudnnBackendFinalize(t);
        cudnnGetLastErrorString(msg, sizeof msg);
        check(st == CUDNN_STATUS_BAD_PARAM && strstr(msg, "UNIQUE_ID"),
              std::string("a tensor without CUDNN_ATTR_TENSOR_UNIQUE_ID: finalize is BAD_PARAM (") + msg + ")");
        int64_t wrong = 3;
        st = cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT32, 1, &wrong);
        check(st != CUDNN_STATUS_SUCCESS, "an attribute set with the wrong type is refused");
        cudnnBackendDestroyDescriptor(t);
    }
    {  // pointwise descriptor without math precision
        cudnnBackendDescriptor_t p;
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &p);
        cudnnPointwiseMode_t m = CUDNN_POINTWISE_ADD;
        cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m);
        check(cudnnBackendFinalize(p) == CUDNN_STATUS_BAD_PARAM, "a pointwise descriptor without MATH_PREC: finalize is BAD_PARAM");
        cudnnBackendDestroyDescriptor(p);
    }
    {  // matmul shapes that do not chain
        B b;
        b.h = h;
        auto a = b.tensor(1, CUDNN_DATA_FLOAT, {1, 1, 2, 3}, {6, 6, 3, 1});
        auto c = b.tensor(2, CUDNN_DATA_FLOAT, {1, 1, 4, 2}, {8, 8, 2, 1});
        auto y = b.tensor(3, CUDNN_DATA_FLOAT, {1, 1, 2, 2}, {4, 4, 2, 1});
        b.mm(a, c, y);
        check(b.st == CUDNN_STATUS_BAD_PARAM, "a matmul [2,3] x [4,2]: operation finalize is BAD_PARAM");
    }
    {  // a virtual tensor nobody reads; then the working graph's runtime errors
        B b;
        b.h = h;
        auto x = b.tensor(1, CUDNN_DATA_FLOAT, {1, 1, 2, 2}, {4, 4, 2, 1});
        auto y = b.virt(CUDNN_DATA_FLOAT, {1, 1, 2, 2});
        b.pw(CUDNN_POINTWISE_EXP, x, nullptr, nullptr, y);
        int64_t ws;
        b.plan(&ws);
        check(b.st == CUDNN_STATUS_BAD_PARAM, "a graph whose virtual output nothing reads: graph finalize is BAD_PARAM");
    }
    B b;
    b.h = h;
    auto x = b.tensor(1, CUDNN_DATA_FLOAT, {1, 1, 2, 2}, {4, 4, 2, 1});
    auto y = b.tensor(2, CUDNN_DATA_FLOAT, {1, 1, 2, 2}, {4, 4, 2, 1});
    b.pw(CUDNN_POINTWISE_NEG, x, nullptr, nullptr, y);
    int64_t ws = 0;
    cudnnBackendDescriptor_t g = nullptr;
    cudnnBackendDescriptor_t p = b.plan(&ws, &g);
    check(p != nullptr, "a one-op graph plans" + (p ? "" : " — " + b.where));
    if (!p) return;
    {  // heuristics: count query, then unsupported
        cudnnBackendDescriptor_t heur;
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
        cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_FALLBACK;
        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
        cudnnBackendFinalize(heur);
        int64_t n = -1;
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr);
        check(n == 1, "heuristics: a count query (0 requested) reports exactly 1 engine config");
        cudnnBackendDescriptor_t cfg[2], plan;
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[0]);
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[1]);
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[0]);
        cudnnStatus_t st = cudnnBackendFinalize(plan);
        check(st == CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, std::string("a plan on an engine config not yet filled in: finalize is ") +
              cudnnGetErrorString(st));
        n = -1;
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 2, &n, cfg);
        check(n == 1, "heuristics: asking for 2 configs fills 1");
        cudnnBackendDestroyDescriptor(plan);
        setenv("LLMTRAIN_EMU_CUDNN", "unsupported", 1);
        n = -1;
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr);
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[0]);
        st = cudnnBackendFinalize(plan);
        check(n == 0 && st == CUDNN_STATUS_NOT_SUPPORTED,
              "LLMTRAIN_EMU_CUDNN=unsupported: no engine config, and a plan does not finalize (NOT_SUPPORTED)");
        cudnnHandle_t h2 = nullptr;
        setenv("LLMTRAIN_EMU_CUDNN", "create-fails", 1);
        check(cudnnCreate(&h2) == CUDNN_STATUS_NOT_INITIALIZED, "LLMTRAIN_EMU_CUDNN=create-fails: cudnnCreate fails");
        unsetenv("LLMTRAIN_EMU_CUDNN");
        cudnnBackendDestroyDescriptor(plan);
        cudnnBackendDestroyDescriptor(cfg[0]);
        cudnnBackendDestroyDescriptor(cfg[1]);
        cudnnBackendDestroyDescriptor(heur);
    }
    float *xm = (float *)dev(64), *ym = (float *)dev(64);
    void *w = dev((size_t)ws);
    cudnnStatus_t st = b.exec(p, {1}, {xm}, w);
    cudnnGetLastErrorString(msg, sizeof msg);
    check(st == CUDNN_STATUS_BAD_PARAM && strstr(msg, "uid 2"),
          std::string("a variant pack without the output's uid: execute is BAD_PARAM (") + msg + ")");
    st = b.exec(p, {1, 2}, {xm, (char *)ym + 4}, w);
    check(st == CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "a pointer off the tensor's 16-byte alignment: execute is BAD_PARAM_MISALIGNED_POINTER");
    st = b.exec(p, {1, 2}, {xm, ym}, nullptr);
    check(st != CUDNN_STATUS_SUCCESS, "no workspace for a plan that asks for one: execute fails");
    xm[0] = 1.5f;
    setenv("LLMTRAIN_EMU_CUDNN", "exec-fails", 1);
    st = b.exec(p, {1, 2}, {xm, ym}, w);
    unsetenv("LLMTRAIN_EMU_CUDNN");
    check(st == CUDNN_STATUS_EXECUTION_FAILED && ym[0] == 0.0f, "LLMTRAIN_EMU_CUDNN=exec-fails: execute fails, writes nothing");
    st = b.exec(p, {1, 2}, {xm, ym}, w);
    check(st == CUDNN_STATUS_SUCCESS && ym[0] == -1.5f, "the same plan then executes (y = -x)");
    free(xm); free(ym); free(w);
}

int main() {
    cudnnHandle_t h = nullptr;
    cudnnStatus_t st = cudnnCreate(&h);
    check(st == CUDNN_STATUS_SUCCESS && cudnnGetVersion() == CUDNN_VERSION, "cudnnCreate, cudnnGetVersion = CUDNN_VERSION");
    if (st != CUDNN_STATUS_SUCCESS) return 1;
    cudnnSetStream(h, nullptr);
    test_small(h);
    test_mask_reshape(h);
    test_attention(h);
    test_errors(h);
    cudnnDestroy(h);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
