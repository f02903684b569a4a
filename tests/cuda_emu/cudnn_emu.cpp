/* tests/cuda_emu/cudnn_emu.cpp — the host emulation of cuDNN 9's backend
 * (graph) API, for kernels.cu on a machine without a GPU (see
 * include/cudnn.h for the names and the environment controls).
 *
 * What it is: a general interpreter of an operation graph, not an attention
 * special case. Descriptors are checked the way the library checks them
 * (an unset required attribute, a reference to a descriptor that is not
 * finalized, shapes an operation cannot take: an error at finalize; a
 * non-virtual uid missing from the variant pack, a null or misaligned
 * pointer: an error at execute), and cudnnBackendExecute runs the graph's
 * operations in dependency order on the host in fp32:
 *   - tensors: non-virtual ones are read and written in (emulated device)
 *     memory through their strides, by-value ones are read through the host
 *     pointer the variant pack gives, virtual ones live in host scratch as
 *     dense fp32 arrays (their strides only matter to RESHAPE). Every value
 *     written is rounded to the tensor's data type (bf16 and half to nearest
 *     even, integers truncated, booleans 0/1).
 *   - MATMUL over the last two dims, batch dims broadcast: an operand's
 *     batch extent must divide the output's and output index i reads operand
 *     index i / (out / operand) (1 = broadcast, GQA heads = groups).
 *   - POINTWISE with every operand of the output's rank (cuDNN 9.14 declines
 *     others), broadcasting size-1 dims: ADD SUB MUL DIV MIN MAX EXP LOG NEG
 *     ABS SQRT RSQRT RECIPROCAL IDENTITY TANH SIGMOID CMP_* LOGICAL_*
 *     GEN_INDEX (Y = the index along AXIS) and BINARY_SELECT (Y = T ? X : B);
 *     y = op(alpha1 x, alpha2 b).
 *   - REDUCTION over the dims where the output is smaller (its extent must
 *     divide the input's; input index i goes to i / (in / out)).
 *   - RESHAPE: Y is X's memory reinterpreted through Y's dims and strides
 *     (so a stride swap is a transpose); X's and Y's element offsets must
 *     be the same set.
 * Heuristics return exactly one engine config for a graph the interpreter
 * can run, none for one it cannot (or under LLMTRAIN_EMU_CUDNN=unsupported);
 * the plan asks for a small workspace, which execute scribbles over.
 * What it is not: a model of which graphs the real library fuses, of its
 * speed, or of its exact rounding (fp32 accumulation in a fixed order). */
#include "include/cudnn.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

struct cudnnContext {
    cudaStream_t stream;
};

namespace {

constexpr int64_t kWorkspaceBytes = 4096;  // what every plan asks for
constexpr int kMaxDims = 8;

std::mutex g_mu;
std::set<void *> g_live;          // descriptors
std::set<cudnnHandle_t> g_handles;
thread_local std::string g_last;  // cudnnGetLastErrorString

cudnnStatus_t err(cudnnStatus_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudnnStatus_t err(cudnnStatus_t st, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_last = std::string("cuDNN emulator: ") + buf;
    if (getenv("LLMTRAIN_EMU_CUDNN_TRACE")) fprintf(stderr, "llmtrain: %s -> %d\n", g_last.c_str(), (int)st);
    return st;
}

std::string env_mode() {
    const char *e = getenv("LLMTRAIN_EMU_CUDNN");
    return e ? e : "";
}

// ---------------------------------------------------------------- values

float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) {  // inf stays, NaN stays NaN
        if (u & 0x007fffffu) u |= 0x00400000u;
        u &= 0xffff0000u;
    } else {
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    }
    float r;
    memcpy(&r, &u, 4);
    return r;
}
float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}
uint16_t float_to_bf16(float f) {
    float r = bf16_round(f);
    uint32_t u;
    memcpy(&u, &r, 4);
    return (uint16_t)(u >> 16);
}
float half_to_float(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}
uint16_t float_to_half(float f) {
    uint16_t s = std::signbit(f) ? 0x8000 : 0;
    float a = fabsf(f);
    if (std::isnan(f)) return 0x7e00;
    if (a >= 65520.0f) return s | 0x7c00;  // rounds to inf
    if (a < ldexpf(1.0f, -14)) {           // subnormal: multiples of 2^-24, ties to even
        float q = nearbyintf(ldexpf(a, 24));
        return s | (uint16_t)q;
    }
    int e;
    float fr = frexpf(a, &e);                      // a = fr * 2^e, fr in [0.5, 1)
    float q = nearbyintf(ldexpf(fr, 11));          // 11 significant bits
    if (q >= 2048.0f) { q = 1024.0f; e++; }
    if (e + 14 >= 31) return s | 0x7c00;
    return s | (uint16_t)((e + 14) << 10) | (uint16_t)((int)q - 1024);
}
float half_round(float f) { return half_to_float(float_to_half(f)); }

bool dtype_known(int t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: case CUDNN_DATA_DOUBLE: case CUDNN_DATA_HALF: case CUDNN_DATA_INT8:
    case CUDNN_DATA_INT32: case CUDNN_DATA_UINT8: case CUDNN_DATA_BFLOAT16: case CUDNN_DATA_INT64:
    case CUDNN_DATA_BOOLEAN: return true;
    default: return false;
    }
}
size_t dtype_size(int t) {
    switch (t) {
    case CUDNN_DATA_DOUBLE: case CUDNN_DATA_INT64: return 8;
    case CUDNN_DATA_HALF: case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: case CUDNN_DATA_BOOLEAN: return 1;
    default: return 4;
    }
}
const char *dtype_name(int t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: return "FLOAT";
    case CUDNN_DATA_DOUBLE: return "DOUBLE";
    case CUDNN_DATA_HALF: return "HALF";
    case CUDNN_DATA_INT8: return "INT8";
    case CUDNN_DATA_INT32: return "INT32";
    case CUDNN_DATA_UINT8: return "UINT8";
    case CUDNN_DATA_BFLOAT16: return "BFLOAT16";
    case CUDNN_DATA_INT64: return "INT64";
    case CUDNN_DATA_BOOLEAN: return "BOOLEAN";
    default: return "?";
    }
}
// the value a tensor of type t holds once v is written to it
float round_to(int t, float v) {
    switch (t) {
    case CUDNN_DATA_BFLOAT16: return bf16_round(v);
    case CUDNN_DATA_HALF: return half_round(v);
    case CUDNN_DATA_BOOLEAN: return v != 0.0f ? 1.0f : 0.0f;
    case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: case CUDNN_DATA_INT32: case CUDNN_DATA_INT64:
        return std::isfinite(v) ? truncf(v) : 0.0f;
    default: return v;
    }
}
float load_elem(int t, const void *p) {
    switch (t) {
    case CUDNN_DATA_FLOAT: { float v; memcpy(&v, p, 4); return v; }
    case CUDNN_DATA_DOUBLE: { double v; memcpy(&v, p, 8); return (float)v; }
    case CUDNN_DATA_HALF: { uint16_t v; memcpy(&v, p, 2); return half_to_float(v); }
    case CUDNN_DATA_BFLOAT16: { uint16_t v; memcpy(&v, p, 2); return bf16_to_float(v); }
    case CUDNN_DATA_INT8: return (float)*(const int8_t *)p;
    case CUDNN_DATA_UINT8: return (float)*(const uint8_t *)p;
    case CUDNN_DATA_BOOLEAN: return *(const uint8_t *)p ? 1.0f : 0.0f;
    case CUDNN_DATA_INT32: { int32_t v; memcpy(&v, p, 4); return (float)v; }
    case CUDNN_DATA_INT64: { int64_t v; memcpy(&v, p, 8); return (float)v; }
    default: return 0.0f;
    }
}
void store_elem(int t, void *p, float v) {
    v = round_to(t, v);
    switch (t) {
    case CUDNN_DATA_FLOAT: memcpy(p, &v, 4); break;
    case CUDNN_DATA_DOUBLE: { double d = v; memcpy(p, &d, 8); break; }
    case CUDNN_DATA_HALF: { uint16_t h = float_to_half(v); memcpy(p, &h, 2); break; }
    case CUDNN_DATA_BFLOAT16: { uint16_t h = float_to_bf16(v); memcpy(p, &h, 2); break; }
    case CUDNN_DATA_INT8: *(int8_t *)p = (int8_t)v; break;
    case CUDNN_DATA_UINT8: case CUDNN_DATA_BOOLEAN: *(uint8_t *)p = (uint8_t)v; break;
    case CUDNN_DATA_INT32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
    case CUDNN_DATA_INT64: { int64_t i = (int64_t)v; memcpy(p, &i, 8); break; }
    default: break;
    }
}

// ---------------------------------------------------------------- descriptors

struct Attr {
    int type = 0;
    int64_t count = 0;
    std::vector<unsigned char> bytes;
};

struct Tensor {
    int64_t uid = 0;
    int dtype = 0;
    std::vector<int64_t> dims, strides;
    int64_t align = 0;
    bool is_virtual = false, by_value = false;
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : dims) n *= d;
        return n;
    }
    bool same(const Tensor &o) const {
        return uid == o.uid && dtype == o.dtype && dims == o.dims && strides == o.strides &&
               is_virtual == o.is_virtual && by_value == o.by_value;
    }
};

enum OpKind { OP_POINTWISE, OP_MATMUL, OP_REDUCTION, OP_RESHAPE };

struct Op {
    OpKind kind = OP_POINTWISE;
    int mode = 0;        // pointwise mode / reduction operator
    int prec = 0;        // math precision / compute type
    int64_t axis = -1;   // GEN_INDEX
    float alpha1 = 1.0f, alpha2 = 1.0f;
    std::vector<Tensor> in;  // POINTWISE x[, b[, t]]; MATMUL a, b; REDUCTION x; RESHAPE x
    Tensor out;
};

struct Graph {
    std::vector<Tensor> tensors;      // one per uid
    std::map<int64_t, size_t> index;  // uid -> tensors[]
    std::vector<Op> ops;              // in dependency order
    bool runnable = true;
    std::string why_not;
};

struct Desc {
    cudnnBackendDescriptorType_t type;
    bool finalized = false;
    std::map<int, Attr> attrs;
    // what finalize derived (copies: the referenced descriptors may go away)
    Tensor tensor;                  // TENSOR
    Op op;                          // operations (and the sub-descriptors' fields)
    std::shared_ptr<Graph> graph;   // OPERATIONGRAPH, ENGINEHEUR, ENGINE, ENGINECFG, EXECUTION_PLAN
    int64_t workspace = 0;          // ENGINECFG, EXECUTION_PLAN
    std::vector<int64_t> vp_uids;   // VARIANT_PACK
    std::vector<void *> vp_ptrs;
    void *vp_ws = nullptr;
};

Desc *live_desc(void *p) {
    if (!p || !g_live.count(p)) return nullptr;
    return (Desc *)p;
}

size_t elem_size(int type) {
    switch (type) {
    case CUDNN_TYPE_HANDLE: case CUDNN_TYPE_VOID_PTR: case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void *);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: case CUDNN_TYPE_DOUBLE: return 8;
    case CUDNN_TYPE_FLOAT: case CUDNN_TYPE_INT32: return 4;
    case CUDNN_TYPE_DATA_TYPE: return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_HEUR_MODE: return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_POINTWISE_MODE: return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE: return sizeof(cudnnReduceTensorOp_t);
    case CUDNN_TYPE_NAN_PROPOGATION: return sizeof(cudnnNanPropagation_t);
    default: return 0;
    }
}

// which attributes a descriptor type takes: its type(s), most elements, and
// for descriptor-valued ones the descriptor type each element must be
struct Schema {
    int type, alt_type;
    int64_t max_count;
    int desc_type;  // -1: any / not a descriptor
};
bool schema(cudnnBackendDescriptorType_t dt, int name, Schema *s) {
    auto put = [s](int type, int64_t max, int desc = -1, int alt = -1) {
        *s = Schema{type, alt, max, desc};
        return true;
    };
    switch (dt) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: case CUDNN_ATTR_TENSOR_UNIQUE_ID:
        case CUDNN_ATTR_TENSOR_VECTOR_COUNT: case CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION:
            return put(CUDNN_TYPE_INT64, 1);
        case CUDNN_ATTR_TENSOR_DATA_TYPE: return put(CUDNN_TYPE_DATA_TYPE, 1);
        case CUDNN_ATTR_TENSOR_DIMENSIONS: case CUDNN_ATTR_TENSOR_STRIDES: return put(CUDNN_TYPE_INT64, kMaxDims);
        case CUDNN_ATTR_TENSOR_IS_VIRTUAL: case CUDNN_ATTR_TENSOR_IS_BY_VALUE: return put(CUDNN_TYPE_BOOLEAN, 1);
        }
        return false;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_POINTWISE_MODE: return put(CUDNN_TYPE_POINTWISE_MODE, 1);
        case CUDNN_ATTR_POINTWISE_MATH_PREC: return put(CUDNN_TYPE_DATA_TYPE, 1);
        case CUDNN_ATTR_POINTWISE_AXIS: return put(CUDNN_TYPE_INT64, 1);
        }
        return false;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_MATMUL_COMP_TYPE: return put(CUDNN_TYPE_DATA_TYPE, 1);
        case CUDNN_ATTR_MATMUL_PADDING_VALUE: return put(CUDNN_TYPE_DOUBLE, 1);
        }
        return false;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_REDUCTION_OPERATOR: return put(CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1);
        case CUDNN_ATTR_REDUCTION_COMP_TYPE: return put(CUDNN_TYPE_DATA_TYPE, 1);
        case CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC: return put(CUDNN_TYPE_BOOLEAN, 1);
        }
        return false;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_POINTWISE_XDESC: case CUDNN_ATTR_OPERATION_POINTWISE_BDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_YDESC: case CUDNN_ATTR_OPERATION_POINTWISE_TDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_DXDESC: case CUDNN_ATTR_OPERATION_POINTWISE_DYDESC:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1: case CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2:
            return put(CUDNN_TYPE_FLOAT, 1, -1, CUDNN_TYPE_DOUBLE);
        }
        return false;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_OPERATION_MATMUL_ADESC: case CUDNN_ATTR_OPERATION_MATMUL_BDESC:
        case CUDNN_ATTR_OPERATION_MATMUL_CDESC:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_MATMUL_DESC:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        }
        return false;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_OPERATION_REDUCTION_XDESC: case CUDNN_ATTR_OPERATION_REDUCTION_YDESC:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_REDUCTION_DESC:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        }
        return false;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_OPERATION_RESHAPE_XDESC: case CUDNN_ATTR_OPERATION_RESHAPE_YDESC:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        }
        return false;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_OPERATIONGRAPH_HANDLE: return put(CUDNN_TYPE_HANDLE, 1);
        case CUDNN_ATTR_OPERATIONGRAPH_OPS: return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1 << 20);
        }
        return false;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_ENGINEHEUR_MODE: return put(CUDNN_TYPE_HEUR_MODE, 1);
        case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        case CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET: return put(CUDNN_TYPE_INT32, 1);
        }
        return false;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        case CUDNN_ATTR_ENGINE_GLOBAL_INDEX: return put(CUDNN_TYPE_INT64, 1);
        }
        return false;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_ENGINECFG_ENGINE: return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES: return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1 << 10);
        }
        return false;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_EXECUTION_PLAN_HANDLE: return put(CUDNN_TYPE_HANDLE, 1);
        case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
            return put(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        }
        return false;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        switch (name) {
        case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: return put(CUDNN_TYPE_INT64, 1 << 20);
        case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: return put(CUDNN_TYPE_VOID_PTR, 1 << 20);
        case CUDNN_ATTR_VARIANT_PACK_WORKSPACE: return put(CUDNN_TYPE_VOID_PTR, 1);
        }
        return false;
    default: return false;
    }
}

const char *dtype_of_desc(int t) {
    switch (t) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "POINTWISE";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "OPERATION_POINTWISE";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: return "MATMUL";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "OPERATION_MATMUL";
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: return "REDUCTION";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "OPERATION_REDUCTION";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "OPERATION_RESHAPE";
    default: return "?";
    }
}

// typed reads of a set attribute (the caller checked that it is set)
const Attr *get(const Desc *d, int name) {
    auto it = d->attrs.find(name);
    return it == d->attrs.end() ? nullptr : &it->second;
}
int64_t get_i64(const Desc *d, int name, int64_t dflt) {
    const Attr *a = get(d, name);
    if (!a) return dflt;
    int64_t v;
    memcpy(&v, a->bytes.data(), 8);
    return v;
}
int get_enum(const Desc *d, int name, int dflt) {
    const Attr *a = get(d, name);
    if (!a) return dflt;
    int v;
    memcpy(&v, a->bytes.data(), sizeof v);
    return v;
}
bool get_bool(const Desc *d, int name) {
    const Attr *a = get(d, name);
    return a && a->bytes[0] != 0;
}
float get_scalar(const Desc *d, int name, float dflt) {
    const Attr *a = get(d, name);
    if (!a) return dflt;
    if (a->type == CUDNN_TYPE_DOUBLE) {
        double v;
        memcpy(&v, a->bytes.data(), 8);
        return (float)v;
    }
    float v;
    memcpy(&v, a->bytes.data(), 4);
    return v;
}
std::vector<void *> get_ptrs(const Desc *d, int name) {
    const Attr *a = get(d, name);
    std::vector<void *> v;
    if (!a) return v;
    v.resize((size_t)a->count);
    memcpy(v.data(), a->bytes.data(), v.size() * sizeof(void *));
    return v;
}

// a referenced descriptor that must exist, be of type want and be finalized
cudnnStatus_t ref(const Desc *d, int name, const char *what, bool required, Desc **out) {
    *out = nullptr;
    const Attr *a = get(d, name);
    if (!a) {
        if (required) return err(CUDNN_STATUS_BAD_PARAM, "%s: required attribute %s (%d) is not set", dtype_of_desc(d->type), what, name);
        return CUDNN_STATUS_SUCCESS;
    }
    void *p;
    memcpy(&p, a->bytes.data(), sizeof p);
    Desc *r = live_desc(p);
    if (!r) return err(CUDNN_STATUS_BAD_PARAM, "%s: %s refers to a destroyed descriptor", dtype_of_desc(d->type), what);
    if (!r->finalized)
        return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "%s: %s (a %s descriptor) is not finalized", dtype_of_desc(d->type),
                   what, dtype_of_desc(r->type));
    *out = r;
    return CUDNN_STATUS_SUCCESS;
}

std::string shape_str(const std::vector<int64_t> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

// ---------------------------------------------------------------- finalize

bool pw_unary(int m) {
    switch (m) {
    case CUDNN_POINTWISE_EXP: case CUDNN_POINTWISE_LOG: case CUDNN_POINTWISE_NEG: case CUDNN_POINTWISE_ABS:
    case CUDNN_POINTWISE_SQRT: case CUDNN_POINTWISE_RSQRT: case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_RECIPROCAL: case CUDNN_POINTWISE_TANH_FWD: case CUDNN_POINTWISE_SIGMOID_FWD:
    case CUDNN_POINTWISE_LOGICAL_NOT: case CUDNN_POINTWISE_GEN_INDEX: return true;
    default: return false;
    }
}
bool pw_binary(int m) {
    switch (m) {
    case CUDNN_POINTWISE_ADD: case CUDNN_POINTWISE_SUB: case CUDNN_POINTWISE_MUL: case CUDNN_POINTWISE_DIV:
    case CUDNN_POINTWISE_MIN: case CUDNN_POINTWISE_MAX: case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ:
    case CUDNN_POINTWISE_CMP_GT: case CUDNN_POINTWISE_CMP_GE: case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE:
    case CUDNN_POINTWISE_LOGICAL_AND: case CUDNN_POINTWISE_LOGICAL_OR: return true;
    default: return false;
    }
}

// x broadcasts to y: right-aligned, each dim equal or 1 (extra leading dims of x must be 1)
bool broadcasts(const std::vector<int64_t> &x, const std::vector<int64_t> &y) {
    size_t rx = x.size(), ry = y.size();
    for (size_t i = 0; i < rx; i++) {
        int64_t xd = x[rx - 1 - i];
        if (i >= ry) {
            if (xd != 1) return false;
            continue;
        }
        int64_t yd = y[ry - 1 - i];
        if (xd != yd && xd != 1) return false;
    }
    return true;
}
bool divides(int64_t part, int64_t whole) { return part >= 1 && whole % part == 0; }

// the set of element offsets of t (for RESHAPE); false if two elements share one
bool offsets(const Tensor &t, std::vector<int64_t> *off) {
    off->clear();
    off->reserve((size_t)t.numel());
    std::vector<int64_t> idx(t.dims.size(), 0);
    for (int64_t n = 0; n < t.numel(); n++) {
        int64_t o = 0;
        for (size_t i = 0; i < idx.size(); i++) o += idx[i] * t.strides[i];
        off->push_back(o);
        for (size_t i = idx.size(); i-- > 0;) {
            if (++idx[i] < t.dims[i]) break;
            idx[i] = 0;
        }
    }
    std::vector<int64_t> s(*off);
    std::sort(s.begin(), s.end());
    return std::adjacent_find(s.begin(), s.end()) == s.end();
}

cudnnStatus_t finalize_tensor(Desc *d) {
    static const struct { int name; const char *what; } req[] = {
        {CUDNN_ATTR_TENSOR_DATA_TYPE, "CUDNN_ATTR_TENSOR_DATA_TYPE"},
        {CUDNN_ATTR_TENSOR_DIMENSIONS, "CUDNN_ATTR_TENSOR_DIMENSIONS"},
        {CUDNN_ATTR_TENSOR_STRIDES, "CUDNN_ATTR_TENSOR_STRIDES"},
        {CUDNN_ATTR_TENSOR_UNIQUE_ID, "CUDNN_ATTR_TENSOR_UNIQUE_ID"},
        {CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT"}};
    for (auto &r : req)
        if (!get(d, r.name)) return err(CUDNN_STATUS_BAD_PARAM, "TENSOR: required attribute %s is not set", r.what);
    Tensor &t = d->tensor;
    t.uid = get_i64(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
    t.dtype = get_enum(d, CUDNN_ATTR_TENSOR_DATA_TYPE, -1);
    t.align = get_i64(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
    t.is_virtual = get_bool(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
    t.by_value = get_bool(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
    const Attr *da = get(d, CUDNN_ATTR_TENSOR_DIMENSIONS), *sa = get(d, CUDNN_ATTR_TENSOR_STRIDES);
    if (da->count != sa->count)
        return err(CUDNN_STATUS_BAD_PARAM, "TENSOR uid %lld: %lld dimensions but %lld strides", (long long)t.uid,
                   (long long)da->count, (long long)sa->count);
    t.dims.assign((size_t)da->count, 0);
    t.strides.assign((size_t)sa->count, 0);
    memcpy(t.dims.data(), da->bytes.data(), t.dims.size() * 8);
    memcpy(t.strides.data(), sa->bytes.data(), t.strides.size() * 8);
    if (!dtype_known(t.dtype))
        return err(CUDNN_STATUS_BAD_PARAM, "TENSOR uid %lld: data type %d is not one the emulator knows", (long long)t.uid,
                   t.dtype);
    for (size_t i = 0; i < t.dims.size(); i++)
        if (t.dims[i] < 1 || t.strides[i] < 1)
            return err(CUDNN_STATUS_BAD_PARAM, "TENSOR uid %lld: dims %s strides %s (each must be >= 1)", (long long)t.uid,
                       shape_str(t.dims).c_str(), shape_str(t.strides).c_str());
    if (t.align < 1 || (t.align & (t.align - 1)))
        return err(CUDNN_STATUS_BAD_PARAM, "TENSOR uid %lld: byte alignment %lld is not a power of 2", (long long)t.uid,
                   (long long)t.align);
    if (t.is_virtual && t.by_value)
        return err(CUDNN_STATUS_BAD_PARAM, "TENSOR uid %lld: both virtual and by-value", (long long)t.uid);
    if (t.by_value && t.numel() != 1)
        return err(CUDNN_STATUS_BAD_PARAM, "TENSOR uid %lld: a by-value tensor must have one element, dims %s",
                   (long long)t.uid, shape_str(t.dims).c_str());
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_pointwise_desc(Desc *d) {
    if (!get(d, CUDNN_ATTR_POINTWISE_MODE)) return err(CUDNN_STATUS_BAD_PARAM, "POINTWISE: CUDNN_ATTR_POINTWISE_MODE is not set");
    if (!get(d, CUDNN_ATTR_POINTWISE_MATH_PREC))
        return err(CUDNN_STATUS_BAD_PARAM, "POINTWISE: CUDNN_ATTR_POINTWISE_MATH_PREC is not set");
    d->op.mode = get_enum(d, CUDNN_ATTR_POINTWISE_MODE, 0);
    d->op.prec = get_enum(d, CUDNN_ATTR_POINTWISE_MATH_PREC, 0);
    d->op.axis = get_i64(d, CUDNN_ATTR_POINTWISE_AXIS, -1);
    if (!dtype_known(d->op.prec)) return err(CUDNN_STATUS_BAD_PARAM, "POINTWISE: math precision %d is not a data type", d->op.prec);
    if (d->op.mode == CUDNN_POINTWISE_GEN_INDEX && !get(d, CUDNN_ATTR_POINTWISE_AXIS))
        return err(CUDNN_STATUS_BAD_PARAM, "POINTWISE GEN_INDEX: CUDNN_ATTR_POINTWISE_AXIS is not set");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op_pointwise(Desc *d) {
    Desc *pw, *x, *b, *t, *y, *dx, *dy;
    cudnnStatus_t st;
    if ((st = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, "PW_DESCRIPTOR", true, &pw)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "XDESC", true, &x)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, "YDESC", true, &y)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, "BDESC", false, &b)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, "TDESC", false, &t)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, "DXDESC", false, &dx)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, "DYDESC", false, &dy)))
        return st;
    Op &op = d->op;
    op = pw->op;
    op.kind = OP_POINTWISE;
    op.alpha1 = get_scalar(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0f);
    op.alpha2 = get_scalar(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0f);
    int m = op.mode;
    bool unary = pw_unary(m), binary = pw_binary(m), select = m == CUDNN_POINTWISE_BINARY_SELECT;
    if (dx || dy) return err(CUDNN_STATUS_NOT_SUPPORTED, "OPERATION_POINTWISE: backward activation modes are not emulated");
    if (!unary && !binary && !select)
        return err(CUDNN_STATUS_NOT_SUPPORTED, "OPERATION_POINTWISE: pointwise mode %d is not emulated", m);
    if ((binary || select) && !b)
        return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_POINTWISE: mode %d takes two inputs but BDESC is not set", m);
    if (select && !t)
        return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_POINTWISE: BINARY_SELECT needs TDESC (the predicate)");
    if (unary && (b || t))
        return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_POINTWISE: unary mode %d with BDESC or TDESC set", m);
    if (binary && t) return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_POINTWISE: binary mode %d with TDESC set", m);
    op.in.clear();
    op.in.push_back(x->tensor);
    if (b) op.in.push_back(b->tensor);
    if (t) op.in.push_back(t->tensor);
    op.out = y->tensor;
    for (size_t i = 0; i < op.in.size(); i++)
        if (op.in[i].dims.size() != op.out.dims.size()) // cuDNN 9.14: "xDesc.getNbDims() != bDesc.getNbDims()"
            return err(CUDNN_STATUS_BAD_PARAM,
                       "OPERATION_POINTWISE mode %d: input uid %lld has rank %zu, output uid %lld rank %zu (expected equal ranks)",
                       m, (long long)op.in[i].uid, op.in[i].dims.size(), (long long)op.out.uid, op.out.dims.size());
        else if (!broadcasts(op.in[i].dims, op.out.dims))
            return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_POINTWISE mode %d: input uid %lld dims %s do not broadcast to output uid %lld dims %s",
                       m, (long long)op.in[i].uid, shape_str(op.in[i].dims).c_str(), (long long)op.out.uid,
                       shape_str(op.out.dims).c_str());
    if (m == CUDNN_POINTWISE_GEN_INDEX && (op.axis < 0 || op.axis >= (int64_t)op.out.dims.size()))
        return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_POINTWISE GEN_INDEX: axis %lld outside the output's %zu dims",
                   (long long)op.axis, op.out.dims.size());
    if (op.out.by_value) return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_POINTWISE: output uid %lld is by-value", (long long)op.out.uid);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op_matmul(Desc *d) {
    Desc *a, *b, *c, *md;
    cudnnStatus_t st;
    if ((st = ref(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, "ADESC", true, &a)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, "BDESC", true, &b)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, "CDESC", true, &c)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, "DESC", true, &md)))
        return st;
    Op &op = d->op;
    op = Op();
    op.kind = OP_MATMUL;
    op.prec = md->op.prec;
    op.in = {a->tensor, b->tensor};
    op.out = c->tensor;
    const auto &A = a->tensor.dims, &B = b->tensor.dims, &C = c->tensor.dims;
    size_t r = C.size();
    bool ok = r >= 2 && A.size() == r && B.size() == r && A[r - 1] == B[r - 2] && C[r - 2] == A[r - 2] && C[r - 1] == B[r - 1];
    for (size_t i = 0; ok && i + 2 < r; i++) ok = divides(A[i], C[i]) && divides(B[i], C[i]);
    if (!ok)
        return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_MATMUL: A %s x B %s -> C %s is not a batched matmul (same rank, "
                   "[..,M,K] x [..,K,N] -> [..,M,N], operand batch dims dividing C's)",
                   shape_str(A).c_str(), shape_str(B).c_str(), shape_str(C).c_str());
    if (op.out.by_value) return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_MATMUL: output is by-value");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op_reduction(Desc *d) {
    Desc *x, *y, *rd;
    cudnnStatus_t st;
    if ((st = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, "XDESC", true, &x)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, "YDESC", true, &y)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, "DESC", true, &rd)))
        return st;
    Op &op = d->op;
    op = Op();
    op.kind = OP_REDUCTION;
    op.mode = rd->op.mode;
    op.prec = rd->op.prec;
    op.in = {x->tensor};
    op.out = y->tensor;
    const auto &X = x->tensor.dims, &Y = y->tensor.dims;
    bool ok = X.size() == Y.size();
    for (size_t i = 0; ok && i < X.size(); i++) ok = divides(Y[i], X[i]);
    if (!ok)
        return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_REDUCTION: X %s -> Y %s (same rank, each Y dim dividing X's)",
                   shape_str(X).c_str(), shape_str(Y).c_str());
    if (op.out.by_value) return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_REDUCTION: output is by-value");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op_reshape(Desc *d) {
    Desc *x, *y;
    cudnnStatus_t st;
    if ((st = ref(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, "XDESC", true, &x)) ||
        (st = ref(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, "YDESC", true, &y)))
        return st;
    Op &op = d->op;
    op = Op();
    op.kind = OP_RESHAPE;
    op.in = {x->tensor};
    op.out = y->tensor;
    std::vector<int64_t> ox, oy;
    bool ok = x->tensor.numel() == y->tensor.numel() && offsets(x->tensor, &ox) && offsets(y->tensor, &oy);
    if (ok) {
        std::sort(ox.begin(), ox.end());
        std::sort(oy.begin(), oy.end());
        ok = ox == oy;
    }
    if (!ok)
        return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_RESHAPE: X dims %s strides %s and Y dims %s strides %s do not cover "
                   "the same elements of memory",
                   shape_str(x->tensor.dims).c_str(), shape_str(x->tensor.strides).c_str(),
                   shape_str(y->tensor.dims).c_str(), shape_str(y->tensor.strides).c_str());
    if (op.out.by_value) return err(CUDNN_STATUS_BAD_PARAM, "OPERATION_RESHAPE: output is by-value");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_graph(Desc *d) {
    const Attr *h = get(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
    if (!h) return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: CUDNN_ATTR_OPERATIONGRAPH_HANDLE is not set");
    cudnnHandle_t handle;
    memcpy(&handle, h->bytes.data(), sizeof handle);
    if (!g_handles.count(handle)) return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: the handle is not one cudnnCreate made");
    std::vector<void *> ops = get_ptrs(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (ops.empty()) return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: CUDNN_ATTR_OPERATIONGRAPH_OPS is not set");
    auto g = std::make_shared<Graph>();
    std::vector<Op> given;
    for (size_t i = 0; i < ops.size(); i++) {
        Desc *o = live_desc(ops[i]);
        if (!o) return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: operation %zu is not a live descriptor", i);
        if (o->type != CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR && o->type != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR &&
            o->type != CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR && o->type != CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)
            return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: operation %zu is a %s descriptor", i, dtype_of_desc(o->type));
        if (!o->finalized) return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "OPERATIONGRAPH: operation %zu is not finalized", i);
        given.push_back(o->op);
    }
    // one tensor per uid
    auto add = [&](const Tensor &t) -> cudnnStatus_t {
        auto it = g->index.find(t.uid);
        if (it == g->index.end()) {
            g->index[t.uid] = g->tensors.size();
            g->tensors.push_back(t);
        } else if (!g->tensors[it->second].same(t)) {
            return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: two different tensors have uid %lld", (long long)t.uid);
        }
        return CUDNN_STATUS_SUCCESS;
    };
    cudnnStatus_t st;
    for (const Op &op : given) {
        for (const Tensor &t : op.in)
            if ((st = add(t))) return st;
        if ((st = add(op.out))) return st;
    }
    // producers, consumers, order
    size_t n = given.size();
    std::vector<int> producer(g->tensors.size(), -1);
    std::vector<int> readers(g->tensors.size(), 0);
    for (size_t i = 0; i < n; i++) {
        size_t o = g->index[given[i].out.uid];
        if (producer[o] >= 0)
            return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: tensor uid %lld is written by operations %d and %zu",
                       (long long)given[i].out.uid, producer[o], i);
        producer[o] = (int)i;
    }
    std::vector<std::vector<size_t>> deps(n);
    for (size_t i = 0; i < n; i++)
        for (const Tensor &t : given[i].in) {
            size_t k = g->index[t.uid];
            readers[k]++;
            if (producer[k] >= 0) deps[i].push_back((size_t)producer[k]);
            else if (t.is_virtual)
                return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: virtual tensor uid %lld is read but no operation writes it",
                           (long long)t.uid);
        }
    for (size_t k = 0; k < g->tensors.size(); k++)
        if (g->tensors[k].is_virtual && readers[k] == 0)
            return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: virtual tensor uid %lld is written but nothing reads it",
                       (long long)g->tensors[k].uid);
    std::vector<int> state(n, 0);  // 0 new, 1 in progress, 2 done
    std::vector<size_t> order;
    bool cycle = false;
    std::function<void(size_t)> visit = [&](size_t i) {
        if (state[i] == 2 || cycle) return;
        if (state[i] == 1) { cycle = true; return; }
        state[i] = 1;
        for (size_t j : deps[i]) visit(j);
        state[i] = 2;
        order.push_back(i);
    };
    for (size_t i = 0; i < n; i++) visit(i);
    if (cycle) return err(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: the operations form a cycle");
    for (size_t i : order) g->ops.push_back(given[i]);
    d->graph = g;
    return CUDNN_STATUS_SUCCESS;
}

// the config the heuristics (or an ENGINE of index 0) give: the graph and a workspace
void make_config(Desc *cfg, const std::shared_ptr<Graph> &g) {
    cfg->graph = g;
    cfg->workspace = kWorkspaceBytes;
    cfg->finalized = true;
}

cudnnStatus_t finalize(Desc *d) {
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalize_tensor(d);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return finalize_pointwise_desc(d);
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        if (!get(d, CUDNN_ATTR_MATMUL_COMP_TYPE)) return err(CUDNN_STATUS_BAD_PARAM, "MATMUL: CUDNN_ATTR_MATMUL_COMP_TYPE is not set");
        d->op.prec = get_enum(d, CUDNN_ATTR_MATMUL_COMP_TYPE, 0);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        if (!get(d, CUDNN_ATTR_REDUCTION_OPERATOR))
            return err(CUDNN_STATUS_BAD_PARAM, "REDUCTION: CUDNN_ATTR_REDUCTION_OPERATOR is not set");
        if (!get(d, CUDNN_ATTR_REDUCTION_COMP_TYPE))
            return err(CUDNN_STATUS_BAD_PARAM, "REDUCTION: CUDNN_ATTR_REDUCTION_COMP_TYPE is not set");
        d->op.mode = get_enum(d, CUDNN_ATTR_REDUCTION_OPERATOR, 0);
        d->op.prec = get_enum(d, CUDNN_ATTR_REDUCTION_COMP_TYPE, 0);
        if (d->op.mode < CUDNN_REDUCE_TENSOR_ADD || d->op.mode > CUDNN_REDUCE_TENSOR_NORM2)
            return err(CUDNN_STATUS_BAD_PARAM, "REDUCTION: operator %d", d->op.mode);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return finalize_op_pointwise(d);
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return finalize_op_matmul(d);
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return finalize_op_reduction(d);
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return finalize_op_reshape(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return finalize_graph(d);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        Desc *g;
        cudnnStatus_t st = ref(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, "OPERATION_GRAPH", true, &g);
        if (st) return st;
        if (!get(d, CUDNN_ATTR_ENGINEHEUR_MODE)) return err(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR: CUDNN_ATTR_ENGINEHEUR_MODE is not set");
        int mode = get_enum(d, CUDNN_ATTR_ENGINEHEUR_MODE, 0);
        if (mode < CUDNN_HEUR_MODE_INSTANT || mode > CUDNN_HEUR_MODE_A) return err(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR: mode %d", mode);
        d->graph = g->graph;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: {
        Desc *g;
        cudnnStatus_t st = ref(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, "OPERATION_GRAPH", true, &g);
        if (st) return st;
        if (!get(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX)) return err(CUDNN_STATUS_BAD_PARAM, "ENGINE: CUDNN_ATTR_ENGINE_GLOBAL_INDEX is not set");
        if (get_i64(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 0) != 0 || env_mode() == "unsupported")
            return err(CUDNN_STATUS_NOT_SUPPORTED, "ENGINE: the emulator has one engine, index 0");
        d->graph = g->graph;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: {
        Desc *e;
        cudnnStatus_t st = ref(d, CUDNN_ATTR_ENGINECFG_ENGINE, "ENGINE", true, &e);
        if (st) return st;
        make_config(d, e->graph);
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        const Attr *h = get(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
        if (!h) return err(CUDNN_STATUS_BAD_PARAM, "EXECUTION_PLAN: CUDNN_ATTR_EXECUTION_PLAN_HANDLE is not set");
        cudnnHandle_t handle;
        memcpy(&handle, h->bytes.data(), sizeof handle);
        if (!g_handles.count(handle)) return err(CUDNN_STATUS_BAD_PARAM, "EXECUTION_PLAN: the handle is not one cudnnCreate made");
        Desc *cfg;
        cudnnStatus_t st = ref(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, "ENGINE_CONFIG", true, &cfg);
        if (st) return st;
        if (env_mode() == "unsupported")
            return err(CUDNN_STATUS_NOT_SUPPORTED, "EXECUTION_PLAN: no engine (LLMTRAIN_EMU_CUDNN=unsupported)");
        if (!cfg->graph->runnable)
            return err(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, "EXECUTION_PLAN: %s", cfg->graph->why_not.c_str());
        d->graph = cfg->graph;
        d->workspace = cfg->workspace;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        const Attr *u = get(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), *p = get(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
        if (!u) return err(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS is not set");
        if (!p) return err(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS is not set");
        if (u->count != p->count)
            return err(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: %lld uids but %lld pointers", (long long)u->count, (long long)p->count);
        d->vp_uids.assign((size_t)u->count, 0);
        memcpy(d->vp_uids.data(), u->bytes.data(), d->vp_uids.size() * 8);
        d->vp_ptrs = get_ptrs(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
        std::vector<int64_t> s(d->vp_uids);
        std::sort(s.begin(), s.end());
        if (std::adjacent_find(s.begin(), s.end()) != s.end())
            return err(CUDNN_STATUS_BAD_PARAM, "VARIANT_PACK: a uid appears twice");
        std::vector<void *> ws = get_ptrs(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
        d->vp_ws = ws.empty() ? nullptr : ws[0];
        return CUDNN_STATUS_SUCCESS;
    }
    default: return err(CUDNN_STATUS_BAD_PARAM, "finalize of a %s descriptor", dtype_of_desc(d->type));
    }
}

// ---------------------------------------------------------------- execution

struct Dense {
    std::vector<int64_t> dims;
    std::vector<float> v;
};

// dense row-major strides of dims
std::vector<int64_t> dense_strides(const std::vector<int64_t> &dims) {
    std::vector<int64_t> s(dims.size(), 1);
    for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
    return s;
}

struct Run {
    const Graph *g;
    std::map<int64_t, void *> ptr;        // non-virtual uid -> memory (by-value: host)
    std::map<int64_t, Dense> scratch;     // virtual uid -> values

    Dense load(const Tensor &t) {
        if (t.is_virtual) return scratch.at(t.uid);
        Dense d;
        d.dims = t.dims;
        d.v.resize((size_t)t.numel());
        const char *base = (const char *)ptr.at(t.uid);
        size_t es = dtype_size(t.dtype);
        std::vector<int64_t> idx(t.dims.size(), 0);
        for (size_t n = 0; n < d.v.size(); n++) {
            int64_t o = 0;
            for (size_t i = 0; i < idx.size(); i++) o += idx[i] * t.strides[i];
            d.v[n] = load_elem(t.dtype, base + o * (int64_t)es);
            for (size_t i = idx.size(); i-- > 0;) {
                if (++idx[i] < t.dims[i]) break;
                idx[i] = 0;
            }
        }
        return d;
    }
    void store(const Tensor &t, Dense &&d) {
        if (t.is_virtual) {
            for (float &x : d.v) x = round_to(t.dtype, x);
            d.dims = t.dims;
            scratch[t.uid] = std::move(d);
            return;
        }
        char *base = (char *)ptr.at(t.uid);
        size_t es = dtype_size(t.dtype);
        std::vector<int64_t> idx(t.dims.size(), 0);
        for (size_t n = 0; n < d.v.size(); n++) {
            int64_t o = 0;
            for (size_t i = 0; i < idx.size(); i++) o += idx[i] * t.strides[i];
            store_elem(t.dtype, base + o * (int64_t)es, d.v[n]);
            for (size_t i = idx.size(); i-- > 0;) {
                if (++idx[i] < t.dims[i]) break;
                idx[i] = 0;
            }
        }
    }

    // the dense strides of x as seen from output dims y (0 where x broadcasts)
    static std::vector<int64_t> bcast_strides(const std::vector<int64_t> &x, const std::vector<int64_t> &y) {
        std::vector<int64_t> xs = dense_strides(x), s(y.size(), 0);
        size_t rx = x.size(), ry = y.size();
        for (size_t i = 0; i < rx && i < ry; i++) {
            size_t xi = rx - 1 - i, yi = ry - 1 - i;
            s[yi] = x[xi] == 1 ? 0 : xs[xi];
        }
        return s;
    }

    static float pw_apply(int m, float x, float b, float t) {
        switch (m) {
        case CUDNN_POINTWISE_ADD: return x + b;
        case CUDNN_POINTWISE_SUB: return x - b;
        case CUDNN_POINTWISE_MUL: return x * b;
        case CUDNN_POINTWISE_DIV: return x / b;
        case CUDNN_POINTWISE_MIN: return fminf(x, b);
        case CUDNN_POINTWISE_MAX: return fmaxf(x, b);
        case CUDNN_POINTWISE_EXP: return expf(x);
        case CUDNN_POINTWISE_LOG: return logf(x);
        case CUDNN_POINTWISE_NEG: return -x;
        case CUDNN_POINTWISE_ABS: return fabsf(x);
        case CUDNN_POINTWISE_SQRT: return sqrtf(x);
        case CUDNN_POINTWISE_RSQRT: return 1.0f / sqrtf(x);
        case CUDNN_POINTWISE_RECIPROCAL: return 1.0f / x;
        case CUDNN_POINTWISE_IDENTITY: return x;
        case CUDNN_POINTWISE_TANH_FWD: return tanhf(x);
        case CUDNN_POINTWISE_SIGMOID_FWD: return 1.0f / (1.0f + expf(-x));
        case CUDNN_POINTWISE_CMP_EQ: return x == b;
        case CUDNN_POINTWISE_CMP_NEQ: return x != b;
        case CUDNN_POINTWISE_CMP_GT: return x > b;
        case CUDNN_POINTWISE_CMP_GE: return x >= b;
        case CUDNN_POINTWISE_CMP_LT: return x < b;
        case CUDNN_POINTWISE_CMP_LE: return x <= b;
        case CUDNN_POINTWISE_LOGICAL_AND: return (x != 0.0f) && (b != 0.0f);
        case CUDNN_POINTWISE_LOGICAL_OR: return (x != 0.0f) || (b != 0.0f);
        case CUDNN_POINTWISE_LOGICAL_NOT: return x == 0.0f;
        case CUDNN_POINTWISE_BINARY_SELECT: return t != 0.0f ? x : b;
        default: return 0.0f;
        }
    }

    void pointwise(const Op &op) {
        const auto &Y = op.out.dims;
        size_t r = Y.size();
        Dense out;
        out.dims = Y;
        out.v.resize((size_t)op.out.numel());
        std::vector<int64_t> idx(r, 0);
        if (op.mode == CUDNN_POINTWISE_GEN_INDEX) {  // X gives only the shape
            for (size_t n = 0; n < out.v.size(); n++) {
                out.v[n] = (float)idx[(size_t)op.axis];
                for (size_t i = r; i-- > 0;) {
                    if (++idx[i] < Y[i]) break;
                    idx[i] = 0;
                }
            }
            store(op.out, std::move(out));
            return;
        }
        std::vector<Dense> in;
        std::vector<std::vector<int64_t>> st;
        for (const Tensor &t : op.in) {
            in.push_back(load(t));
            st.push_back(bcast_strides(t.dims, Y));
        }
        bool low = op.prec == CUDNN_DATA_HALF || op.prec == CUDNN_DATA_BFLOAT16;
        std::vector<int64_t> off(in.size(), 0);
        for (size_t n = 0; n < out.v.size(); n++) {
            float a[3] = {0, 0, 0};
            for (size_t k = 0; k < in.size(); k++) {
                a[k] = in[k].v[(size_t)off[k]];
                if (low) a[k] = round_to(op.prec, a[k]);
            }
            float x = op.alpha1 * a[0], b = in.size() > 1 ? op.alpha2 * a[1] : 0.0f;
            float y = pw_apply(op.mode, x, b, a[2]);
            out.v[n] = low ? round_to(op.prec, y) : y;
            for (size_t i = r; i-- > 0;) {
                for (size_t k = 0; k < in.size(); k++) off[k] += st[k][i];
                if (++idx[i] < Y[i]) break;
                for (size_t k = 0; k < in.size(); k++) off[k] -= st[k][i] * Y[i];
                idx[i] = 0;
            }
        }
        store(op.out, std::move(out));
    }

    void matmul(const Op &op) {
        Dense A = load(op.in[0]), B = load(op.in[1]);
        const auto &C = op.out.dims;
        size_t r = C.size();
        int64_t M = C[r - 2], N = C[r - 1], K = A.dims[r - 1];
        std::vector<int64_t> as = dense_strides(A.dims), bs = dense_strides(B.dims);
        Dense out;
        out.dims = C;
        out.v.assign((size_t)op.out.numel(), 0.0f);
        int64_t batches = 1;
        for (size_t i = 0; i + 2 < r; i++) batches *= C[i];
        std::vector<int64_t> bidx(r > 2 ? r - 2 : 0, 0);
        std::vector<float> row((size_t)N);
        for (int64_t bt = 0; bt < batches; bt++) {
            int64_t ao = 0, bo = 0;
            for (size_t i = 0; i < bidx.size(); i++) {
                ao += bidx[i] / (C[i] / A.dims[i]) * as[i];
                bo += bidx[i] / (C[i] / B.dims[i]) * bs[i];
            }
            float *co = out.v.data() + bt * M * N;
            for (int64_t m = 0; m < M; m++) {
                std::fill(row.begin(), row.end(), 0.0f);
                for (int64_t k = 0; k < K; k++) {
                    float a = A.v[(size_t)(ao + m * K + k)];
                    const float *bp = B.v.data() + bo + k * N;
                    for (int64_t n = 0; n < N; n++) row[(size_t)n] += a * bp[n];
                }
                std::copy(row.begin(), row.end(), co + m * N);
            }
            for (size_t i = bidx.size(); i-- > 0;) {
                if (++bidx[i] < C[i]) break;
                bidx[i] = 0;
            }
        }
        store(op.out, std::move(out));
    }

    void reduction(const Op &op) {
        Dense X = load(op.in[0]);
        const auto &Y = op.out.dims;
        size_t r = Y.size();
        std::vector<int64_t> ys = dense_strides(Y);
        float init = 0.0f;
        if (op.mode == CUDNN_REDUCE_TENSOR_MUL) init = 1.0f;
        if (op.mode == CUDNN_REDUCE_TENSOR_MIN) init = std::numeric_limits<float>::infinity();
        if (op.mode == CUDNN_REDUCE_TENSOR_MAX) init = -std::numeric_limits<float>::infinity();
        Dense out;
        out.dims = Y;
        out.v.assign((size_t)op.out.numel(), init);
        std::vector<int64_t> idx(r, 0);
        for (size_t n = 0; n < X.v.size(); n++) {
            int64_t o = 0;
            for (size_t i = 0; i < r; i++) o += idx[i] / (X.dims[i] / Y[i]) * ys[i];
            float &acc = out.v[(size_t)o], x = X.v[n];
            switch (op.mode) {
            case CUDNN_REDUCE_TENSOR_ADD: case CUDNN_REDUCE_TENSOR_AVG: acc += x; break;
            case CUDNN_REDUCE_TENSOR_MUL: acc *= x; break;
            case CUDNN_REDUCE_TENSOR_MIN: acc = fminf(acc, x); break;
            case CUDNN_REDUCE_TENSOR_MAX: acc = fmaxf(acc, x); break;
            case CUDNN_REDUCE_TENSOR_AMAX: acc = fmaxf(acc, fabsf(x)); break;
            case CUDNN_REDUCE_TENSOR_NORM1: acc += fabsf(x); break;
            case CUDNN_REDUCE_TENSOR_NORM2: acc += x * x; break;
            default: break;
            }
            for (size_t i = r; i-- > 0;) {
                if (++idx[i] < X.dims[i]) break;
                idx[i] = 0;
            }
        }
        float group = (float)(X.v.size() / out.v.size());
        if (op.mode == CUDNN_REDUCE_TENSOR_AVG)
            for (float &v : out.v) v /= group;
        if (op.mode == CUDNN_REDUCE_TENSOR_NORM2)
            for (float &v : out.v) v = sqrtf(v);
        store(op.out, std::move(out));
    }

    void reshape(const Op &op) {
        Dense X = load(op.in[0]);
        std::vector<int64_t> ox, oy;
        offsets(op.in[0], &ox);
        offsets(op.out, &oy);
        int64_t extent = 0;
        for (int64_t o : ox) extent = std::max(extent, o + 1);
        std::vector<float> mem((size_t)extent, 0.0f);
        for (size_t n = 0; n < ox.size(); n++) mem[(size_t)ox[n]] = X.v[n];
        Dense out;
        out.dims = op.out.dims;
        out.v.resize(oy.size());
        for (size_t n = 0; n < oy.size(); n++) out.v[n] = mem[(size_t)oy[n]];
        store(op.out, std::move(out));
    }

    void run() {
        for (const Op &op : g->ops) {
            switch (op.kind) {
            case OP_POINTWISE: pointwise(op); break;
            case OP_MATMUL: matmul(op); break;
            case OP_REDUCTION: reduction(op); break;
            case OP_RESHAPE: reshape(op); break;
            }
        }
    }
};

cudnnStatus_t execute(cudnnHandle_t handle, Desc *plan, Desc *vp) {
    if (!g_handles.count(handle)) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the handle is not one cudnnCreate made");
    if (!plan || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
        return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the plan is not an EXECUTION_PLAN descriptor");
    if (!vp || vp->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the variant pack is not a VARIANT_PACK descriptor");
    if (!plan->finalized) return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendExecute: the plan is not finalized");
    if (!vp->finalized) return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendExecute: the variant pack is not finalized");
    const Graph &g = *plan->graph;
    Run run;
    run.g = &g;
    std::map<int64_t, void *> given;
    for (size_t i = 0; i < vp->vp_uids.size(); i++) given[vp->vp_uids[i]] = vp->vp_ptrs[i];
    for (const Tensor &t : g.tensors) {
        if (t.is_virtual) continue;
        auto it = given.find(t.uid);
        if (it == given.end())
            return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: uid %lld (a non-virtual %s tensor %s) is not in the variant pack",
                       (long long)t.uid, dtype_name(t.dtype), shape_str(t.dims).c_str());
        if (!it->second)
            return err(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendExecute: uid %lld has a null pointer", (long long)t.uid);
        if (!t.by_value && (uintptr_t)it->second % (uintptr_t)t.align)
            return err(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                       "cudnnBackendExecute: uid %lld's pointer %p is not %lld-byte aligned as its descriptor says",
                       (long long)t.uid, it->second, (long long)t.align);
        run.ptr[t.uid] = it->second;
    }
    if (plan->workspace > 0) {
        if (!vp->vp_ws)
            return err(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendExecute: the plan needs %lld bytes of workspace, the "
                       "variant pack gives none", (long long)plan->workspace);
        memset(vp->vp_ws, 0xa5, (size_t)plan->workspace);  // the engine's scratch: whatever was there is gone
    }
    if (env_mode() == "exec-fails")
        return err(CUDNN_STATUS_EXECUTION_FAILED, "cudnnBackendExecute: failed (LLMTRAIN_EMU_CUDNN=exec-fails)");
    run.run();
    return CUDNN_STATUS_SUCCESS;
}

}  // namespace

// ---------------------------------------------------------------- the API

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char *cudnnGetErrorString(cudnnStatus_t s) {
    switch ((int)s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_UNKNOWN (emulator)";
    }
}

void cudnnGetLastErrorString(char *message, size_t max_size) {
    if (!message || !max_size) return;
    snprintf(message, max_size, "%s", g_last.c_str());
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!handle) return err(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnCreate: null handle pointer");
    if (env_mode() == "create-fails") return err(CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate: failed (LLMTRAIN_EMU_CUDNN=create-fails)");
    *handle = new cudnnContext{nullptr};
    g_handles.insert(*handle);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_handles.erase(handle)) return err(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: not a live handle");
    delete handle;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_handles.count(handle)) return err(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: not a live handle");
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *stream) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_handles.count(handle) || !stream) return err(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: bad arguments");
    *stream = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *desc) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!desc) return err(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendCreateDescriptor: null pointer");
    if (!strcmp(dtype_of_desc(type), "?"))
        return err(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendCreateDescriptor: descriptor type %d is not emulated", (int)type);
    Desc *d = new Desc();
    d->type = type;
    g_live.insert(d);
    *desc = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t desc) {
    std::lock_guard<std::mutex> lk(g_mu);
    Desc *d = live_desc(desc);
    if (!d) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: not a live descriptor");
    g_live.erase(d);
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void *elems) {
    std::lock_guard<std::mutex> lk(g_mu);
    Desc *d = live_desc(desc);
    if (!d) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: not a live descriptor");
    if (d->finalized)
        return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: %s descriptor is already finalized (attribute %d)",
                   dtype_of_desc(d->type), (int)name);
    Schema s;
    if (!schema(d->type, name, &s))
        return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: a %s descriptor has no attribute %d", dtype_of_desc(d->type),
                   (int)name);
    if ((int)type != s.type && (int)type != s.alt_type)
        return err(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "cudnnBackendSetAttribute: %s attribute %d takes type %d, not %d",
                   dtype_of_desc(d->type), (int)name, s.type, (int)type);
    if (count < 1 || count > s.max_count)
        return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: %s attribute %d: %lld elements (1..%lld)",
                   dtype_of_desc(d->type), (int)name, (long long)count, (long long)s.max_count);
    if (!elems) return err(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendSetAttribute: null elements");
    size_t es = elem_size(type);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        const void *const *p = (const void *const *)elems;
        for (int64_t i = 0; i < count; i++) {
            Desc *r = live_desc(const_cast<void *>(p[i]));
            if (!r) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: %s attribute %d: element %lld is not a live descriptor",
                               dtype_of_desc(d->type), (int)name, (long long)i);
            if (s.desc_type >= 0 && r->type != s.desc_type)
                return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: %s attribute %d wants a %s descriptor, got a %s one",
                           dtype_of_desc(d->type), (int)name, dtype_of_desc(s.desc_type), dtype_of_desc(r->type));
        }
    }
    Attr a;
    a.type = type;
    a.count = count;
    a.bytes.assign((const unsigned char *)elems, (const unsigned char *)elems + es * (size_t)count);
    d->attrs[name] = std::move(a);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                                       void *elems) {
    std::lock_guard<std::mutex> lk(g_mu);
    Desc *d = live_desc(desc);
    if (!d) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: not a live descriptor");
    if (requested < 0) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: negative count");
    if (requested > 0 && !elems) return err(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendGetAttribute: null elements");
    auto put_i64 = [&](int64_t v) -> cudnnStatus_t {
        if (type != CUDNN_TYPE_INT64) return err(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "cudnnBackendGetAttribute: attribute %d is INT64", (int)name);
        if (count) *count = 1;
        if (requested >= 1) memcpy(elems, &v, 8);
        return CUDNN_STATUS_SUCCESS;
    };
    if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (!d->finalized) return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "ENGINEHEUR results: the descriptor is not finalized");
        if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
            return err(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "ENGINEHEUR results are BACKEND_DESCRIPTORs");
        if (!count) return err(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "ENGINEHEUR results: null count");
        int64_t avail = (env_mode() == "unsupported" || !d->graph->runnable) ? 0 : 1;
        int64_t n = requested == 0 ? 0 : std::min(requested, avail);
        void **out = (void **)elems;
        for (int64_t i = 0; i < n; i++) {
            Desc *cfg = live_desc(out[i]);
            if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
                return err(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR results: element %lld is not an ENGINECFG descriptor", (long long)i);
            make_config(cfg, d->graph);
        }
        *count = requested == 0 ? avail : n;
        return CUDNN_STATUS_SUCCESS;
    }
    if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        if (!d->finalized) return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "EXECUTION_PLAN workspace size: not finalized");
        return put_i64(d->workspace);
    }
    if (d->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && name == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) {
        if (!d->finalized) return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "ENGINECFG workspace size: not finalized");
        return put_i64(d->workspace);
    }
    if (d->type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR && name == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) {
        if (!d->finalized) return err(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "OPERATIONGRAPH engine count: not finalized");
        return put_i64(d->graph->runnable && env_mode() != "unsupported" ? 1 : 0);
    }
    const Attr *a = get(d, name);
    if (!a) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: %s attribute %d is not set", dtype_of_desc(d->type), (int)name);
    if ((int)type != a->type)
        return err(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "cudnnBackendGetAttribute: %s attribute %d was set as type %d",
                   dtype_of_desc(d->type), (int)name, a->type);
    if (count) *count = a->count;
    int64_t n = std::min(requested, a->count);
    if (n > 0) memcpy(elems, a->bytes.data(), (size_t)n * elem_size(a->type));
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc) {
    std::lock_guard<std::mutex> lk(g_mu);
    Desc *d = live_desc(desc);
    if (!d) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: not a live descriptor");
    if (d->finalized) return err(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: %s descriptor is already finalized", dtype_of_desc(d->type));
    cudnnStatus_t st = finalize(d);
    if (st == CUDNN_STATUS_SUCCESS) d->finalized = true;
    return st;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t vp) {
    std::lock_guard<std::mutex> lk(g_mu);
    return execute(handle, live_desc(plan), live_desc(vp));
}

}  // extern "C"
