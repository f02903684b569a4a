/* kernels/attention.cuh — which attention path runs: the fused forward's dispatch and train.attention_kernel's choice.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

/* The fused forward when it takes this shape (head dim 32, 64 or 128,
 * 16-byte aligned operands, B * heads and tiles within the grid limits);
 * else 0 and nothing ran. Tensor cores when fl_tensor_cores() says so. */
static int flash_attention_forward(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh,
                                   int nkv, int hd) {
    if (B <= 0 || T <= 0) return 1;
    if (!aligned16(qkv) || !aligned16(out) || (size_t)B * nh > 0x7fffffffu) return 0;
    const int tc = fl_tensor_cores();
    if (fl_bf16()) {
        const FbSeg g = fb_whole(qkv, T, nh, nkv, hd);
        switch (hd) {
        case 32: return fb_forward<32>(out, lse, qkv, qstart, g, B, nh, nkv);
        case 64: return fb_forward<64>(out, lse, qkv, qstart, g, B, nh, nkv);
        case 128: return fb_forward<128>(out, lse, qkv, qstart, g, B, nh, nkv);
        default: return 0;
        }
    }
#define FL_FWD(TC, HD) fl_forward<TC, HD>(out, lse, qkv, qstart, B, T, nh, nkv)
    switch (hd) {
    case 32: return tc ? FL_FWD(true, 32) : FL_FWD(false, 32);
    case 64: return tc ? FL_FWD(true, 64) : FL_FWD(false, 64);
    case 128: return tc ? FL_FWD(true, 128) : FL_FWD(false, 128);
    default: return 0;
    }
#undef FL_FWD
}

static int flash_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, const int *qstart, int B, int T, int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0) return 1;
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv) || !aligned16(out) ||
        (size_t)B * nh > 0x7fffffffu)
        return 0;
    const int tc = fl_tensor_cores();
    if (fl_bf16()) {
        const FbSeg g = fb_whole(qkv, T, nh, nkv, hd);
        switch (hd) {
        case 32: return fb_backward<32>(dqkv, NULL, dout, qkv, out, lse, qstart, g, B, nh, nkv);
        case 64: return fb_backward<64>(dqkv, NULL, dout, qkv, out, lse, qstart, g, B, nh, nkv);
        case 128: return fb_backward<128>(dqkv, NULL, dout, qkv, out, lse, qstart, g, B, nh, nkv);
        default: return 0;
        }
    }
#define FL_BWD(TC, HD) fl_backward<TC, HD>(dqkv, dout, qkv, out, lse, qstart, B, T, nh, nkv)
    switch (hd) {
    case 32: return tc ? FL_BWD(true, 32) : FL_BWD(false, 32);
    case 64: return tc ? FL_BWD(true, 64) : FL_BWD(false, 64);
    case 128: return tc ? FL_BWD(true, 128) : FL_BWD(false, 128);
    default: return 0;
    }
#undef FL_BWD
}
// ---- flash attention region: end ----

/* train.attention_kernel (kernels_cuda_set_attention) picks the attention
 * kernels: cudnn (cuDNN's fused attention on bf16 qkv, the section below;
 * the shapes it declines take the fused kernels), flash (the fused kernels
 * of the region above, for head dims 32, 64 and 128; other shapes take the
 * GEMMs; TF32 tensor cores, or fp32 FMA under compute dtype fp32 or below
 * sm_80, or bf16 mma.sync under bf16) or gemm (the cuBLASLt GEMMs above, for
 * every shape). auto (the default): cudnn under bf16, whose numerics it
 * shares, else flash (TF32 keeps more of the scores' precision than bf16
 * operands). */
enum { ATT_GEMM = 0, ATT_FLASH = 1, ATT_CUDNN = 2, ATT_AUTO = 3 };
static int att_mode = ATT_AUTO;
static long flash_calls;

static int att_parse(const char *e) {
    return !e                        ? -2
           : strcmp(e, "auto") == 0  ? ATT_AUTO
           : strcmp(e, "flash") == 0 ? ATT_FLASH
           : strcmp(e, "gemm") == 0  ? ATT_GEMM
           : strcmp(e, "cudnn") == 0 ? ATT_CUDNN
                                     : -2;
}

static int attention_mode(void) { return att_mode == ATT_AUTO ? (matmul_bf16() ? ATT_CUDNN : ATT_FLASH) : att_mode; }

extern "C" void kernels_cuda_set_attention(const char *mode) {
    att_mode = att_parse(mode);
    if (att_mode == -2)
        die(EXIT_INTERNAL, "kernels_cuda_set_attention(\"%s\"): expected auto, cudnn, flash or gemm", mode ? mode : "(null)");
}

extern "C" long kernels_cuda_flash_attention_calls(void) { return flash_calls; }
