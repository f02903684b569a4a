/* kernels/attention_cudnn.cuh — attention through cuDNN's fused flash attention (graph API; the default under compute dtype bf16).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

// ----------------------------------------------------------------------------
// attention through cuDNN (train.attention_kernel cudnn; the default under
// compute dtype bf16): cuDNN's fused flash attention on bf16 qkv
//
// The graphs are cuDNN's "composite" scaled-dot-product attention, built
// through the backend API (plain C; the C++ frontend is not a dependency):
// the operations the frontend's SDPA node lowers to for cuDNN 9, which the
// library's fused attention engines recognise as one kernel.
//   forward:  S = Q K^T * scale, causal (row >= column, else -inf),
//             Stats = max + log(sum exp(S - max)), O = (exp(S - max) / sum) V
//   backward: P = exp(S - Stats) (recomputed), dV = P^T dO,
//             dS = P * (dO V^T - rowsum(dO * O)) * scale, dQ = dS K, dK = dS^T Q
// Q, K and V are views by strides of qkv ([B, T, (nh + 2 nkv) hd]) itself
// when it is [a] bf16, else of one bf16 copy of it; GQA through K and V
// having nkv heads; O and dO are out and dout themselves when they are [a]
// bf16 (else bf16 copies); Stats is lse ([B, nh, T], natural log), so the
// forward and backward interoperate with the other paths' lse. dQ, dK and dV
// land in dqkv itself when it is [a] bf16, else in a bf16 copy widened into
// it (overwritten, kernels.h).
// A plan per shape is built at first use and kept (at most DN_PLANS: a
// training run has two, for its forward and backward, and sampling one per
// context length; past them the fused kernels, with one line); a
// shape cuDNN declines (no engine, or one needing more than DN_WS_CAP of
// workspace) is remembered and takes the fused kernels, with one line on
// stderr; so does every shape when the library cannot start.

#define DN_PLANS 32
#define DN_WS_CAP ((int64_t)CUDA_DN_WS_CAP)

/* the tensors the caller binds at execution, by unique id */
enum {
    DN_Q = 1, DN_K, DN_V, DN_O, DN_STATS, DN_DO, DN_DQ, DN_DK, DN_DV, DN_SCALE, DN_NEG_INF, DN_ONE,
    DN_SOFTMAX_SUM, DN_DQ_ACCUM, DN_VIRTUAL0 = 100
};

typedef struct {
    int bwd, B, T, nh, nkv, hd;
    int ok; /* 1 planned, -1 declined */
    cudnnBackendDescriptor_t plan;
    int64_t ws;
} DnPlan;

static struct {
    int state; /* 0 not tried, 1 handle ready, -1 unavailable */
    cudnnHandle_t h;
    DnPlan plans[DN_PLANS];
    int n;
    long calls;
} DN;

static Scratch sc_dn_qkv, sc_dn_o, sc_dn_do, sc_dn_dqkv, sc_dn_ws, sc_dn_sum, sc_dn_dq;

extern "C" long kernels_cuda_cudnn_attention_calls(void) { return DN.calls; }

/* Builder state: the first failing call is kept (and what it was), and
 * every descriptor created, to destroy them when a build fails. */
typedef struct {
    cudnnStatus_t err;
    const char *what;
    int line;
    cudnnBackendDescriptor_t made[160];
    int n_made;
    cudnnBackendDescriptor_t ops[48];
    int n_ops;
    int64_t next_virtual;
} DnBuild;

static void dn_note(DnBuild *b, cudnnStatus_t s, const char *what, int line) {
    if (s != CUDNN_STATUS_SUCCESS && b->err == CUDNN_STATUS_SUCCESS) {
        b->err = s;
        b->what = what;
        b->line = line;
    }
}
#define DN_CALL(b, x) dn_note((b), (x), #x, __LINE__)

static cudnnBackendDescriptor_t dn_new(DnBuild *b, cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    if (b->err != CUDNN_STATUS_SUCCESS) return NULL;
    if (b->n_made == (int)(sizeof b->made / sizeof b->made[0])) {
        dn_note(b, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors", __LINE__);
        return NULL;
    }
    DN_CALL(b, cudnnBackendCreateDescriptor(type, &d));
    if (b->err == CUDNN_STATUS_SUCCESS) b->made[b->n_made++] = d;
    return d;
}

static void dn_set(DnBuild *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                   int64_t n, const void *v) {
    if (b->err == CUDNN_STATUS_SUCCESS) DN_CALL(b, cudnnBackendSetAttribute(d, a, t, n, v));
}

static void dn_fin(DnBuild *b, cudnnBackendDescriptor_t d) {
    if (b->err == CUDNN_STATUS_SUCCESS) DN_CALL(b, cudnnBackendFinalize(d));
}

static void dn_free(DnBuild *b) {
    for (int i = b->n_made - 1; i >= 0; i--) (void)cudnnBackendDestroyDescriptor(b->made[i]);
    b->n_made = 0;
}

/* a tensor of rank nd (4, or 1 for a scalar); uid 0 = virtual (an
 * intermediate the engine keeps) */
static cudnnBackendDescriptor_t dn_tensor_nd(DnBuild *b, int64_t uid, cudnnDataType_t dt, int nd, const int64_t *dims,
                                             const int64_t *strides, int by_value) {
    const int64_t align = 16;
    const bool virt = uid == 0, byv = by_value != 0;
    if (virt) uid = b->next_virtual++;
    cudnnBackendDescriptor_t t = dn_new(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    dn_set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    dn_set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims);
    dn_set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, strides);
    dn_set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    dn_set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (virt) dn_set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    dn_set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byv);
    dn_fin(b, t);
    return t;
}

static cudnnBackendDescriptor_t dn_tensor(DnBuild *b, int64_t uid, cudnnDataType_t dt, int64_t d0, int64_t d1,
                                          int64_t d2, int64_t d3, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    const int64_t dims[4] = {d0, d1, d2, d3}, strides[4] = {s0, s1, s2, s3};
    return dn_tensor_nd(b, uid, dt, 4, dims, strides, 0);
}

/* a virtual fp32 tensor with dense strides */
static cudnnBackendDescriptor_t dn_virt(DnBuild *b, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return dn_tensor(b, 0, CUDNN_DATA_FLOAT, d0, d1, d2, d3, d1 * d2 * d3, d2 * d3, d3, 1);
}

/* a one-element fp32 tensor passed by value (its host address is bound at
 * execution), [1, 1, 1, 1]: cuDNN's pointwise operations want every operand
 * of the output's rank (9.14 on an H200 declined a rank-1 scalar: "xDesc.getNbDims()
 * != bDesc.getNbDims()") */
static cudnnBackendDescriptor_t dn_scalar(DnBuild *b, int64_t uid) {
    const int64_t ones[4] = {1, 1, 1, 1};
    return dn_tensor_nd(b, uid, CUDNN_DATA_FLOAT, 4, ones, ones, 1);
}

/* an operation of this type with its ports (attribute, descriptor; a NULL
 * descriptor is left unset), finalized and added to the graph's list */
static void dn_op(DnBuild *b, cudnnBackendDescriptorType_t type, int n, const cudnnBackendAttributeName_t *ports,
                  const cudnnBackendDescriptor_t *descs) {
    cudnnBackendDescriptor_t op = dn_new(b, type);
    for (int i = 0; i < n; i++)
        if (descs[i]) dn_set(b, op, ports[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &descs[i]);
    dn_fin(b, op);
    if (b->err != CUDNN_STATUS_SUCCESS) return;
    if (b->n_ops == (int)(sizeof b->ops / sizeof b->ops[0])) {
        dn_note(b, CUDNN_STATUS_INTERNAL_ERROR, "too many operations", __LINE__);
        return;
    }
    b->ops[b->n_ops++] = op;
}

/* a finalized descriptor of an operation's parameters: one data type
 * attribute (the precision) and optionally a second attribute */
static cudnnBackendDescriptor_t dn_params(DnBuild *b, cudnnBackendDescriptorType_t type,
                                          cudnnBackendAttributeName_t prec_attr, cudnnDataType_t prec,
                                          cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t attr_type,
                                          const void *value) {
    cudnnBackendDescriptor_t d = dn_new(b, type);
    if (value) dn_set(b, d, attr, attr_type, 1, value);
    dn_set(b, d, prec_attr, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    dn_fin(b, d);
    return d;
}

/* y = mode(x[, b2][, t]) in fp32 (comparisons: boolean); GEN_INDEX takes an
 * axis (else pass -1) */
static void dn_pw(DnBuild *b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b2,
                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
    const cudnnDataType_t prec = mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = dn_new(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    dn_set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    dn_set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) dn_set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    dn_fin(b, pw);
    const cudnnBackendAttributeName_t ports[] = {
        CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
        CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC};
    const cudnnBackendDescriptor_t descs[] = {pw, x, b2, t, y};
    dn_op(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 5, ports, descs);
}

/* y = reduce(x) over the dimensions where y is 1 */
static void dn_reduce(DnBuild *b, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnBackendAttributeName_t ports[] = {CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                                 CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                                 CUDNN_ATTR_OPERATION_REDUCTION_DESC};
    const cudnnBackendDescriptor_t descs[] = {
        x, y,
        dn_params(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT,
                  CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &red)};
    dn_op(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 3, ports, descs);
}

/* c = a b, batched over the first two dimensions (fp32 accumulation) */
static void dn_matmul(DnBuild *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm, cudnnBackendDescriptor_t c) {
    const cudnnBackendAttributeName_t ports[] = {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                                 CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC};
    const cudnnBackendDescriptor_t descs[] = {
        a, bm, c,
        dn_params(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT,
                  CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, NULL)};
    dn_op(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 4, ports, descs);
}

/* y: the elements of x seen through y's dimensions and strides */
static void dn_reshape(DnBuild *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnBackendAttributeName_t ports[] = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC};
    const cudnnBackendDescriptor_t descs[] = {x, y};
    dn_op(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 2, ports, descs);
}

/* s (fp32 [B, nh, T, T]) with the causal mask: -inf above the diagonal */
static cudnnBackendDescriptor_t dn_causal(DnBuild *b, cudnnBackendDescriptor_t s, int64_t B, int64_t nh, int64_t T) {
    const int64_t sh = T * T, sb = nh * sh;
    cudnnBackendDescriptor_t row = dn_tensor(b, 0, CUDNN_DATA_INT32, B, nh, T, T, sb, sh, T, 1);
    cudnnBackendDescriptor_t col = dn_tensor(b, 0, CUDNN_DATA_INT32, B, nh, T, T, sb, sh, T, 1);
    cudnnBackendDescriptor_t keep = dn_tensor(b, 0, CUDNN_DATA_BOOLEAN, B, nh, T, T, sb, sh, T, 1);
    cudnnBackendDescriptor_t ninf = dn_scalar(b, DN_NEG_INF), out = dn_virt(b, B, nh, T, T);
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, row, 2);
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, col, 3);
    dn_pw(b, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, -1);
    dn_pw(b, CUDNN_POINTWISE_BINARY_SELECT, s, ninf, keep, out, -1);
    return out;
}

/* the plan of a finished operation list: the heuristics' engine configs in
 * their order, the first that finalizes with workspace within DN_WS_CAP */
static cudnnBackendDescriptor_t dn_plan(DnBuild *b, int64_t *ws) {
    if (b->err != CUDNN_STATUS_SUCCESS) return NULL;
    cudnnBackendDescriptor_t graph = dn_new(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    dn_set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &DN.h);
    dn_set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->n_ops, b->ops);
    dn_fin(b, graph);
    const cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = dn_new(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    dn_set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    dn_set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    dn_fin(b, heur);
    int64_t n = 0;
    if (b->err == CUDNN_STATUS_SUCCESS)
        DN_CALL(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                            NULL));
    if (n > 8) n = 8;
    cudnnBackendDescriptor_t cfg[8];
    for (int64_t i = 0; i < n; i++) cfg[i] = dn_new(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (n > 0 && b->err == CUDNN_STATUS_SUCCESS)
        DN_CALL(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got,
                                            cfg));
    if (b->err != CUDNN_STATUS_SUCCESS) return NULL;
    for (int64_t i = 0; i < got; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
            continue;
        int64_t w = 0, cnt = 0;
        if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &DN.h) ==
                CUDNN_STATUS_SUCCESS &&
            cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &cfg[i]) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &w) ==
                CUDNN_STATUS_SUCCESS &&
            w >= 0 && w <= DN_WS_CAP) {
            *ws = w;
            return plan;
        }
        (void)cudnnBackendDestroyDescriptor(plan);
    }
    dn_note(b, CUDNN_STATUS_NOT_SUPPORTED,
            got ? "no engine configuration finalized within the workspace cap" : "the heuristics offered no engine",
            __LINE__);
    return NULL;
}

/* strides of Q, K and V (views of qkv, [B, T, S]) and of O / dO ([B, T, OS]) */
#define DN_QKV_STRIDES(T, S, hd) (int64_t)(T) * (S), (int64_t)(hd), (int64_t)(S), 1
#define DN_KT_STRIDES(T, S, hd) (int64_t)(T) * (S), (int64_t)(hd), 1, (int64_t)(S)

static void dn_build_forward(DnBuild *b, int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd) {
    const int64_t S = (nh + 2 * nkv) * hd, OS = nh * hd;
    cudnnBackendDescriptor_t q = dn_tensor(b, DN_Q, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t kt = dn_tensor(b, DN_K, CUDNN_DATA_BFLOAT16, B, nkv, hd, T, DN_KT_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t v = dn_tensor(b, DN_V, CUDNN_DATA_BFLOAT16, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t o = dn_tensor(b, DN_O, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, OS, hd));
    cudnnBackendDescriptor_t stats = dn_tensor(b, DN_STATS, CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    cudnnBackendDescriptor_t scale = dn_scalar(b, DN_SCALE);
    cudnnBackendDescriptor_t s = dn_virt(b, B, nh, T, T), ss = dn_virt(b, B, nh, T, T);
    dn_matmul(b, q, kt, s);
    dn_pw(b, CUDNN_POINTWISE_MUL, s, scale, NULL, ss, -1);
    cudnnBackendDescriptor_t sm = dn_causal(b, ss, B, nh, T);
    /* softmax with its statistics */
    cudnnBackendDescriptor_t mx = dn_virt(b, B, nh, T, 1), sub = dn_virt(b, B, nh, T, T), e = dn_virt(b, B, nh, T, T);
    cudnnBackendDescriptor_t sum = dn_virt(b, B, nh, T, 1), lg = dn_virt(b, B, nh, T, 1);
    cudnnBackendDescriptor_t p = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, T, nh * T * T, T * T, T, 1);
    dn_reduce(b, CUDNN_REDUCE_TENSOR_MAX, sm, mx);
    dn_pw(b, CUDNN_POINTWISE_SUB, sm, mx, NULL, sub, -1);
    dn_pw(b, CUDNN_POINTWISE_EXP, sub, NULL, NULL, e, -1);
    dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    dn_pw(b, CUDNN_POINTWISE_LOG, sum, NULL, NULL, lg, -1);
    dn_pw(b, CUDNN_POINTWISE_ADD, mx, lg, NULL, stats, -1);
    dn_pw(b, CUDNN_POINTWISE_DIV, e, sum, NULL, p, -1);
    dn_matmul(b, p, v, o);
}

static void dn_build_backward(DnBuild *b, int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd) {
    const int64_t S = (nh + 2 * nkv) * hd, OS = nh * hd, TT = T * T;
    cudnnBackendDescriptor_t q = dn_tensor(b, DN_Q, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t kt = dn_tensor(b, DN_K, CUDNN_DATA_BFLOAT16, B, nkv, hd, T, DN_KT_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t vt = dn_tensor(b, DN_V, CUDNN_DATA_BFLOAT16, B, nkv, hd, T, DN_KT_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t o = dn_tensor(b, DN_O, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, OS, hd));
    cudnnBackendDescriptor_t d_o = dn_tensor(b, DN_DO, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, OS, hd));
    cudnnBackendDescriptor_t stats = dn_tensor(b, DN_STATS, CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    cudnnBackendDescriptor_t dq = dn_tensor(b, DN_DQ, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t dk = dn_tensor(b, DN_DK, CUDNN_DATA_BFLOAT16, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t dv = dn_tensor(b, DN_DV, CUDNN_DATA_BFLOAT16, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t scale = dn_scalar(b, DN_SCALE), one = dn_scalar(b, DN_ONE);
    /* rowsum(dO * O), kept in memory the caller provides */
    cudnnBackendDescriptor_t doo = dn_tensor(b, 0, CUDNN_DATA_FLOAT, B, nh, T, hd, nh * T * hd, T * hd, nh * hd, 1);
    cudnnBackendDescriptor_t rs = dn_virt(b, B, nh, T, 1);
    cudnnBackendDescriptor_t ssum = dn_tensor(b, DN_SOFTMAX_SUM, CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    dn_pw(b, CUDNN_POINTWISE_MUL, d_o, o, NULL, doo, -1);
    dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, doo, rs);
    dn_pw(b, CUDNN_POINTWISE_MUL, rs, one, NULL, ssum, -1);
    /* P = exp(S * scale - Stats), causal */
    cudnnBackendDescriptor_t s = dn_virt(b, B, nh, T, T), ss = dn_virt(b, B, nh, T, T), sub = dn_virt(b, B, nh, T, T);
    dn_matmul(b, q, kt, s);
    dn_pw(b, CUDNN_POINTWISE_MUL, s, scale, NULL, ss, -1);
    dn_pw(b, CUDNN_POINTWISE_SUB, ss, stats, NULL, sub, -1);
    cudnnBackendDescriptor_t sm = dn_causal(b, sub, B, nh, T), p = dn_virt(b, B, nh, T, T);
    dn_pw(b, CUDNN_POINTWISE_EXP, sm, NULL, NULL, p, -1);
    /* dV = P^T dO (per query head, summed over a kv head's group) */
    cudnnBackendDescriptor_t pt = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, T, nh * TT, TT, 1, T);
    dn_reshape(b, p, pt);
    if (nh == nkv) {
        dn_matmul(b, pt, d_o, dv);
    } else {
        cudnnBackendDescriptor_t dvh = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
        dn_matmul(b, pt, d_o, dvh);
        dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, dvh, dv);
    }
    /* dS = P * (dO V^T - rowsum) * scale */
    cudnnBackendDescriptor_t dp = dn_virt(b, B, nh, T, T), dps = dn_virt(b, B, nh, T, T), dpp = dn_virt(b, B, nh, T, T);
    cudnnBackendDescriptor_t ds = dn_virt(b, B, nh, T, T);
    dn_matmul(b, d_o, vt, dp);
    dn_pw(b, CUDNN_POINTWISE_SUB, dp, ssum, NULL, dps, -1);
    dn_pw(b, CUDNN_POINTWISE_MUL, dps, p, NULL, dpp, -1);
    dn_pw(b, CUDNN_POINTWISE_MUL, dpp, scale, NULL, ds, -1);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, T, nh * TT, TT, 1, T);
    dn_reshape(b, ds, dst);
    if (nh == nkv) {
        dn_matmul(b, dst, q, dk);
    } else {
        cudnnBackendDescriptor_t dkh = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
        dn_matmul(b, dst, q, dkh);
        dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, dkh, dk);
    }
    /* dQ = dS K, accumulated in fp32 memory the caller provides */
    cudnnBackendDescriptor_t k = dn_tensor(b, 0, CUDNN_DATA_FLOAT, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    dn_reshape(b, kt, k);
    cudnnBackendDescriptor_t dqa =
        dn_tensor(b, DN_DQ_ACCUM, CUDNN_DATA_FLOAT, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
    dn_matmul(b, ds, k, dqa);
    dn_pw(b, CUDNN_POINTWISE_IDENTITY, dqa, NULL, NULL, dq, -1);
}

/* cuDNN's handle on the backend's stream, once; NULL when the library
 * cannot start here (then every shape takes the fused kernels) */
static cudnnHandle_t dn_handle(void) {
    if (DN.state == 0) {
        cudnnStatus_t s = cudnnCreate(&DN.h);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(DN.h, 0);
        DN.state = s == CUDNN_STATUS_SUCCESS ? 1 : -1;
        if (DN.state < 0)
            warnf("cuDNN %zu did not start (%s): attention takes the fused kernels", (size_t)cudnnGetVersion(),
                  cudnnGetErrorString(s));
    }
    return DN.state > 0 ? DN.h : NULL;
}

/* The plan for this shape, built at first use; NULL when cuDNN declined it
 * (then or before). Head dims cuDNN's fused attention takes: multiples of 8
 * up to 128. */
static DnPlan *dn_get(int bwd, int B, int T, int nh, int nkv, int hd) {
    if (!cuda_cudnn_head_dim(hd) || !dn_handle()) return NULL;
    for (int i = 0; i < DN.n; i++) {
        DnPlan *p = &DN.plans[i];
        if (p->bwd == bwd && p->B == B && p->T == T && p->nh == nh && p->nkv == nkv && p->hd == hd)
            return p->ok > 0 ? p : NULL;
    }
    if (DN.n == DN_PLANS) { /* more shapes than a training run has (sampling's growing contexts) */
        static int said;
        if (!said++) warnf("cuDNN attention: %d shapes planned; further shapes take the fused kernels", DN_PLANS);
        return NULL;
    }
    DnPlan *p = &DN.plans[DN.n++];
    memset(p, 0, sizeof *p);
    p->bwd = bwd, p->B = B, p->T = T, p->nh = nh, p->nkv = nkv, p->hd = hd;
    DnBuild b;
    memset(&b, 0, sizeof b);
    b.next_virtual = DN_VIRTUAL0;
    if (bwd) dn_build_backward(&b, B, T, nh, nkv, hd);
    else dn_build_forward(&b, B, T, nh, nkv, hd);
    p->plan = dn_plan(&b, &p->ws);
    /* a plan's descriptors (its engine configuration, the graph, the
     * tensors) stay alive as long as the plan, which is the process */
    if (!p->plan) dn_free(&b);
    p->ok = p->plan ? 1 : -1;
    if (!p->plan) {
        char msg[256] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        warnf("cuDNN %zu declined attention %s B%d T%d heads %d/%d hd %d (%s: %s%s%s): the fused kernels take it",
              (size_t)cudnnGetVersion(), bwd ? "backward" : "forward", B, T, nh, nkv, hd,
              cudnnGetErrorString(b.err), b.what ? b.what : "?", msg[0] ? "; " : "", msg);
    }
    return p->plan ? p : NULL;
}

static void dn_execute(DnPlan *p, int n, const int64_t *uids, void **ptrs) {
    void *ws = p->ws ? scratch_get(&sc_dn_ws, (size_t)p->ws) : NULL;
    DnBuild b;
    memset(&b, 0, sizeof b);
    cudnnBackendDescriptor_t vp = dn_new(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    dn_set(&b, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    dn_set(&b, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    dn_set(&b, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    dn_fin(&b, vp);
    if (b.err == CUDNN_STATUS_SUCCESS) DN_CALL(&b, cudnnBackendExecute(DN.h, p->plan, vp));
    dn_free(&b);
    if (b.err != CUDNN_STATUS_SUCCESS) {
        char msg[256] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        die(EXIT_INTERNAL, "cuDNN error at %s:%d: %s (%s)%s%s", __FILE__, b.line, cudnnGetErrorString(b.err), b.what,
            msg[0] ? ": " : "", msg);
    }
    LAUNCH_CHECK();
}

/* qkv as cuDNN reads it: the [a] buffer itself under act_bf16(), else a
 * bf16 copy */
static const __nv_bfloat16 *dn_qkv16(const float *qkv, size_t nq) {
    return act_bf16() ? CACT16(qkv) : (const __nv_bfloat16 *)bf16_copy(&sc_dn_qkv, qkv, nq);
}

/* The forward through cuDNN when it takes the shape; else 0 and nothing ran.
 * qkv and out are [a]: under act_bf16() cuDNN reads and writes them as they
 * are, else it reads a bf16 copy and writes a bf16 scratch, widened. */
static int dn_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0) return 0;
    DnPlan *p = dn_get(0, B, T, nh, nkv, hd);
    if (!p) return 0;
    const int S = (nh + 2 * nkv) * hd;
    const size_t nq = (size_t)B * T * S, no = (size_t)B * T * nh * hd;
    const __nv_bfloat16 *q16 = dn_qkv16(qkv, nq);
    void *o16 = act_bf16() ? (void *)out : scratch_get(&sc_dn_o, no * sizeof(__nv_bfloat16));
    float scale = 1.0f / sqrtf((float)hd), ninf = -INFINITY;
    const int64_t uids[] = {DN_Q, DN_K, DN_V, DN_O, DN_STATS, DN_SCALE, DN_NEG_INF};
    void *ptrs[] = {(void *)q16, (void *)(q16 + (size_t)nh * hd), (void *)(q16 + (size_t)(nh + nkv) * hd), o16,
                    (void *)lse, &scale, &ninf};
    dn_execute(p, 7, uids, ptrs);
    if (o16 != (void *)out) to_f32(out, o16, no);
    return 1;
}

static int dn_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                                 int B, int T, int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0) return 0;
    DnPlan *p = dn_get(1, B, T, nh, nkv, hd);
    if (!p) return 0;
    const int S = (nh + 2 * nkv) * hd;
    const size_t nq = (size_t)B * T * S, no = (size_t)B * T * nh * hd, rows = (size_t)B * nh * T;
    const __nv_bfloat16 *q16 = dn_qkv16(qkv, nq);
    const void *o16 = act_bf16() ? (const void *)out : bf16_copy(&sc_dn_o, out, no);
    const void *do16 = act_bf16() ? (const void *)dout : bf16_copy(&sc_dn_do, dout, no);
    /* dqkv is [a]: under bf16 cuDNN writes it in place */
    __nv_bfloat16 *dq16 =
        act_bf16() ? ACT16(dqkv) : (__nv_bfloat16 *)scratch_get(&sc_dn_dqkv, nq * sizeof(__nv_bfloat16));
    float *ssum = (float *)scratch_get(&sc_dn_sum, rows * sizeof(float));
    float *dqa = (float *)scratch_get(&sc_dn_dq, no * sizeof(float));
    /* cuDNN's frontend leaves this accumulator to the library from 9.6 on;
     * zeroed anyway (one pass of B*nh*T*hd floats) until a GPU run shows
     * the library overwrites it */
    cu_zero(dqa, no * sizeof(float));
    float scale = 1.0f / sqrtf((float)hd), ninf = -INFINITY, one = 1.0f;
    const int64_t uids[] = {DN_Q, DN_K, DN_V, DN_O, DN_DO, DN_STATS, DN_DQ, DN_DK, DN_DV,
                            DN_SCALE, DN_NEG_INF, DN_ONE, DN_SOFTMAX_SUM, DN_DQ_ACCUM};
    const size_t ko = (size_t)nh * hd, vo = (size_t)(nh + nkv) * hd;
    void *ptrs[] = {(void *)q16, (void *)(q16 + ko), (void *)(q16 + vo), (void *)o16, (void *)do16, (void *)lse,
                    (void *)dq16, (void *)(dq16 + ko), (void *)(dq16 + vo), &scale, &ninf, &one, (void *)ssum,
                    (void *)dqa};
    dn_execute(p, 14, uids, ptrs);
    if (!act_bf16()) to_f32(dqkv, dq16, nq); /* overwritten */
    return 1;
}

/* the attention output's and input's fp32 copies where out and qkv are [a]
 * bf16 but the kernels that run write or read fp32 (the GEMM path, the
 * TF32 / fp32 fused kernels) */
static Scratch sc_att32, sc_att_qkv32;

static void attention_forward_gemm(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh,
                                   int nkv, int hd) {
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *P = (float *)scratch_get(&sc_attp, (size_t)B * T * T * sizeof(float));
    for (int h = 0; h < nh; h++) {
        AttPass a = att_pass(h, B, T, nh, nkv, hd);
        /* P = softmax(scale * Q K^T) over the full square, then P V */
        rm_gemm(0, 1, T, T, hd, scale, qkv + a.q, S, a.sqkv, qkv + a.k, S, a.sqkv, 0.0f, P, T, a.sp, a.count, NULL);
        causal_softmax_lse_k<<<(unsigned)((size_t)B * T), row_threads(T)>>>(P, lse, qstart, T, nh, h);
        LAUNCH_CHECK();
        rm_gemm(0, 0, T, hd, T, 1.0f, P, T, a.sp, qkv + a.v, S, a.sqkv, 0.0f, out + a.o, OS, a.so, a.count, NULL);
    }
}

/* qkv and out are [a]: under bf16 cuDNN and the bf16 fused kernels read
 * and write them as bf16; any other path reads an fp32 copy of qkv and
 * writes fp32 into sc_att32, converted after. cuDNN's graphs are causal
 * only: a block-causal mask (qstart) takes the fused kernels. */
static void cu_attention_forward(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh,
                              int nkv, int hd) {
    check_heads(nh, nkv);
    const int mode = attention_mode(), flash = mode != ATT_GEMM;
    if (mode == ATT_CUDNN && !qstart && dn_attention_forward(out, lse, qkv, B, T, nh, nkv, hd)) {
        DN.calls++;
        return;
    }
    if (flash && fl_bf16() && flash_attention_forward(out, lse, qkv, qstart, B, T, nh, nkv, hd)) {
        flash_calls++;
        return;
    }
    const size_t n = (size_t)B * T * nh * hd, nq = (size_t)B * T * (nh + 2 * nkv) * hd;
    float *o = act_bf16() ? (float *)scratch_get(&sc_att32, n * sizeof(float)) : out;
    const float *q = act_bf16() ? f32_copy(&sc_att_qkv32, qkv, nq) : qkv;
    if (flash && !fl_bf16() && flash_attention_forward(o, lse, q, qstart, B, T, nh, nkv, hd)) flash_calls++;
    else attention_forward_gemm(o, lse, q, qstart, B, T, nh, nkv, hd);
    if (o != out) to_bf16(out, o, n);
}

static void attention_backward_gemm(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, const int *qstart, int B, int T, int nh, int nkv, int hd) {
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *P = (float *)scratch_get(&sc_attp, (size_t)B * T * T * sizeof(float));
    float *dS = (float *)scratch_get(&sc_att, (size_t)B * T * T * sizeof(float));
    /* passes run one after another on the stream, so the query heads of one
     * kv head add into its dK and dV in turn (from zero: dqkv is
     * overwritten), and the scratch is reused */
    cu_zero(dqkv, (size_t)B * T * S * sizeof(float));
    for (int h = 0; h < nh; h++) {
        AttPass a = att_pass(h, B, T, nh, nkv, hd);
        const float *dO = dout + a.o;
        rm_gemm(0, 1, T, T, hd, scale, qkv + a.q, S, a.sqkv, qkv + a.k, S, a.sqkv, 0.0f, P, T, a.sp, a.count, NULL);
        causal_exp_lse_k<<<(unsigned)((size_t)B * T), row_threads(T)>>>(P, lse, qstart, T, nh, h);
        LAUNCH_CHECK();
        /* dP = dO V^T; dV += P^T dO */
        rm_gemm(0, 1, T, T, hd, 1.0f, dO, OS, a.so, qkv + a.v, S, a.sqkv, 0.0f, dS, T, a.sp, a.count, NULL);
        rm_gemm(1, 0, T, hd, T, 1.0f, P, T, a.sp, dO, OS, a.so, 1.0f, dqkv + a.v, S, a.sqkv, a.count, NULL);
        causal_softmax_bwd_k<<<(unsigned)((size_t)a.count * T), row_threads(T)>>>(dS, P, out, dout, a.so, OS, a.o, hd,
                                                                                 T, scale);
        LAUNCH_CHECK();
        /* dQ += dS K; dK += dS^T Q */
        rm_gemm(0, 0, T, hd, T, 1.0f, dS, T, a.sp, qkv + a.k, S, a.sqkv, 1.0f, dqkv + a.q, S, a.sqkv, a.count, NULL);
        rm_gemm(1, 0, T, hd, T, 1.0f, dS, T, a.sp, qkv + a.q, S, a.sqkv, 1.0f, dqkv + a.k, S, a.sqkv, a.count, NULL);
    }
}

/* dqkv's and dout's fp32 forms where they are [a] bf16 but the kernels
 * that run write or read fp32 (the GEMM path, the TF32 / fp32 fused
 * kernels) */
static Scratch sc_att_dqkv, sc_att_do32;

/* qkv, out, dout and dqkv are [a]: cuDNN and the bf16 fused kernels read
 * qkv, out and dout and write dqkv as bf16; any other path under bf16 reads
 * fp32 copies of qkv, out and dout and writes fp32 scratch, rounded into
 * dqkv after */
static void cu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               const int *qstart, int B, int T, int nh, int nkv, int hd) {
    if (!dqkv) return;
    check_heads(nh, nkv);
    const int mode = attention_mode(), flash = mode != ATT_GEMM;
    if (mode == ATT_CUDNN && !qstart && dn_attention_backward(dqkv, dout, qkv, out, lse, B, T, nh, nkv, hd)) {
        DN.calls++;
        return;
    }
    if (flash && fl_bf16() && flash_attention_backward(dqkv, dout, qkv, out, lse, qstart, B, T, nh, nkv, hd)) {
        flash_calls++;
        return;
    }
    const float *o = out, *q = qkv, *dO = dout;
    float *dq = dqkv;
    const size_t nq = (size_t)B * T * (nh + 2 * nkv) * hd;
    if (act_bf16()) {
        const size_t n = (size_t)B * T * nh * hd;
        o = f32_copy(&sc_att32, out, n);
        dO = f32_copy(&sc_att_do32, dout, n);
        q = f32_copy(&sc_att_qkv32, qkv, nq);
        dq = (float *)scratch_get(&sc_att_dqkv, nq * sizeof(float));
    }
    if (flash && !fl_bf16() && flash_attention_backward(dq, dO, q, o, lse, qstart, B, T, nh, nkv, hd)) flash_calls++;
    else attention_backward_gemm(dq, dO, q, o, lse, qstart, B, T, nh, nkv, hd);
    if (dq != dqkv) to_bf16(dqkv, dq, nq);
}

/* calls of the pointwise kernels' 16-byte form (PW_E): RoPE's, SwiGLU's */
static long vec_pointwise_calls;
extern "C" long kernels_cuda_vec_pointwise_calls(void) { return vec_pointwise_calls; }
