/* model.c — GPT-2 and Llama over flat arrays: the layout table (the one
 * place a tensor's name and shape are written), deterministic init, and
 * the forward and backward passes. Orchestration only: it never touches a
 * tensor element (that is kernels.h) and never communicates (parallel.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "model.h"
#include "cp.h"
#include "fp8.h"
#include "moe.h"
#include "util.h"
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* layout table                                                        */

typedef struct {
    Model *m;
    size_t off;
    int cap;
} LayoutBuilder;

static void add_spec(LayoutBuilder *lb, const char *name, ParamKind kind, int layer, int chunk,
                     int rows, int cols, int tp_axis, int nparts) {
    Model *m = lb->m;
    if (m->n_specs == lb->cap) {
        lb->cap = lb->cap ? 2 * lb->cap : 64;
        ParamSpec *ns = malloc_check((size_t)lb->cap * sizeof *ns);
        if (m->specs) memcpy(ns, m->specs, (size_t)m->n_specs * sizeof *ns);
        free(m->specs);
        m->specs = ns;
    }
    ParamSpec *s = &m->specs[m->n_specs++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->kind = kind;
    s->layer = layer;
    s->chunk = chunk;
    s->ndim = cols > 0 ? 2 : 1;
    s->shape[0] = rows;
    s->shape[1] = cols > 0 ? cols : 1;
    s->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    s->offset = lb->off;
    s->tp_axis = tp_axis;
    s->nparts = nparts;
    s->decay = s->ndim == 2;
    lb->off += s->numel;
}

static void end_chunk(LayoutBuilder *lb, int chunk, size_t chunk_start, size_t pad) {
    size_t size = lb->off - chunk_start;
    size = (size + pad - 1) / pad * pad;
    lb->m->chunk_offset[chunk] = chunk_start;
    lb->m->chunk_size[chunk] = size;
    lb->off = chunk_start + size;
}

/* Build the table: chunk 0 embeddings, chunk 1+l layer l, last chunk the
 * final norm (and untied LM head). Each chunk is contiguous and padded so a
 * shard group can split it evenly. */
static void build_layout(Model *m, int pad_multiple) {
    const ModelConfig *c = &m->cfg;
    int gpt2 = c->arch == ARCH_GPT2;
    int C = c->n_embd, F = m->F, V = m->V;
    LayoutBuilder lb = {m, 0, 0};
    m->n_chunks = c->n_layer + 2;
    m->chunk_offset = calloc_check((size_t)m->n_chunks, sizeof(size_t));
    m->chunk_size = calloc_check((size_t)m->n_chunks, sizeof(size_t));
    size_t pad = (size_t)(pad_multiple > 0 ? pad_multiple : 1) * 16; /* 64-byte aligned chunks */
    char nm[64];

    size_t start = lb.off;
    add_spec(&lb, "wte.weight", P_WTE, -1, 0, V, C, 0, 1);
    if (gpt2) add_spec(&lb, "wpe.weight", P_WPE, -1, 0, c->max_seq_len, C, -1, 1);
    end_chunk(&lb, 0, start, pad);

    for (int l = 0; l < c->n_layer; l++) {
        int ch = l + 1;
        start = lb.off;
#define L(suffix) (snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix), nm)
        add_spec(&lb, L("ln1.weight"), P_LN1_W, l, ch, C, 0, -1, 1);
        if (gpt2) add_spec(&lb, L("ln1.bias"), P_LN1_B, l, ch, C, 0, -1, 1);
        add_spec(&lb, L("attn.qkv.weight"), P_QKV_W, l, ch, m->qkv_dim, C, 0, 3);
        if (gpt2) add_spec(&lb, L("attn.qkv.bias"), P_QKV_B, l, ch, m->qkv_dim, 0, 0, 3);
        if (c->qk_norm) { /* one weight for all heads: every TP rank's copy, whatever heads it holds */
            add_spec(&lb, L("attn.q_norm.weight"), P_Q_NORM_W, l, ch, m->hd, 0, -1, 1);
            add_spec(&lb, L("attn.k_norm.weight"), P_K_NORM_W, l, ch, m->hd, 0, -1, 1);
        }
        add_spec(&lb, L("attn.out.weight"), P_ATTN_OUT_W, l, ch, C, m->nh * m->hd, 1, 1);
        if (gpt2) add_spec(&lb, L("attn.out.bias"), P_ATTN_OUT_B, l, ch, C, 0, -1, 1);
        add_spec(&lb, L("ln2.weight"), P_LN2_W, l, ch, C, 0, -1, 1);
        if (gpt2) add_spec(&lb, L("ln2.bias"), P_LN2_B, l, ch, C, 0, -1, 1);
        if (moe_layer(c, l)) { /* moe.c: the router, E experts, shared experts; whole on every TP rank */
            const ModelMoE *x = &m->moe;
            add_spec(&lb, L("moe.router.weight"), P_ROUTER_W, l, ch, x->E, C, -1, 1);
            add_spec(&lb, L("moe.experts.fc.weight"), P_EXP_FC_W, l, ch, x->E * 2 * x->F, C, -1, 1);
            add_spec(&lb, L("moe.experts.proj.weight"), P_EXP_PROJ_W, l, ch, x->E * C, x->F, -1, 1);
            if (x->Fs) {
                add_spec(&lb, L("moe.shared.fc.weight"), P_SH_FC_W, l, ch, 2 * x->Fs, C, -1, 1);
                add_spec(&lb, L("moe.shared.proj.weight"), P_SH_PROJ_W, l, ch, C, x->Fs, -1, 1);
            }
        } else {
            add_spec(&lb, L("mlp.fc.weight"), P_FC_W, l, ch, m->fc_dim, C, 0, gpt2 ? 1 : 2);
            if (gpt2) add_spec(&lb, L("mlp.fc.bias"), P_FC_B, l, ch, m->fc_dim, 0, 0, 1);
            add_spec(&lb, L("mlp.proj.weight"), P_PROJ_W, l, ch, C, F, 1, 1);
            if (gpt2) add_spec(&lb, L("mlp.proj.bias"), P_PROJ_B, l, ch, C, 0, -1, 1);
        }
#undef L
        end_chunk(&lb, ch, start, pad);
    }

    int last = c->n_layer + 1;
    start = lb.off;
    add_spec(&lb, "lnf.weight", P_LNF_W, -1, last, C, 0, -1, 1);
    if (gpt2) add_spec(&lb, "lnf.bias", P_LNF_B, -1, last, C, 0, -1, 1);
    if (!c->tie_embeddings) add_spec(&lb, "lm_head.weight", P_LM_HEAD, -1, last, V, C, 0, 1);
    end_chunk(&lb, last, start, pad);

    m->n_params = lb.off;
    m->chunk_spec0 = calloc_check((size_t)m->n_chunks + 1, sizeof(int));
    for (int i = m->n_specs - 1; i >= 0; i--) m->chunk_spec0[m->specs[i].chunk] = i; /* specs are in chunk order */
    m->chunk_spec0[m->n_chunks] = m->n_specs;
    m->n_real_params = 0;
    for (int i = 0; i < m->n_specs; i++) m->n_real_params += m->specs[i].numel;
}

/* Point the view's field for tensor s at p. */
static void set_ptr(ModelPtrs *out, const ParamSpec *s, float *p) {
    LayerPtrs *L = s->layer >= 0 ? &out->layers[s->layer] : NULL;
    switch (s->kind) {
    case P_WTE: out->wte = p; break;
    case P_WPE: out->wpe = p; break;
    case P_LNF_W: out->lnf_w = p; break;
    case P_LNF_B: out->lnf_b = p; break;
    case P_LM_HEAD: out->lm_head = p; break;
    case P_LN1_W: L->ln1_w = p; break;
    case P_LN1_B: L->ln1_b = p; break;
    case P_QKV_W: L->qkv_w = p; break;
    case P_QKV_B: L->qkv_b = p; break;
    case P_ATTN_OUT_W: L->attn_out_w = p; break;
    case P_ATTN_OUT_B: L->attn_out_b = p; break;
    case P_Q_NORM_W: L->q_norm_w = p; break;
    case P_K_NORM_W: L->k_norm_w = p; break;
    case P_LN2_W: L->ln2_w = p; break;
    case P_LN2_B: L->ln2_b = p; break;
    case P_FC_W: L->fc_w = p; break;
    case P_FC_B: L->fc_b = p; break;
    case P_PROJ_W: L->proj_w = p; break;
    case P_PROJ_B: L->proj_b = p; break;
    case P_ROUTER_W: L->router_w = p; break;
    case P_EXP_FC_W: L->exp_fc_w = p; break;
    case P_EXP_PROJ_W: L->exp_proj_w = p; break;
    case P_SH_FC_W: L->sh_fc_w = p; break;
    case P_SH_PROJ_W: L->sh_proj_w = p; break;
    default: die(EXIT_INTERNAL, "bind: unknown tensor kind %d", (int)s->kind);
    }
}

/* Resolve the named tensors into pointers inside one flat array. */
static void bind(const Model *m, float *base, ModelPtrs *out) {
    memset(out->layers, 0, (size_t)m->cfg.n_layer * sizeof(LayerPtrs));
    out->wte = out->wpe = out->lnf_w = out->lnf_b = out->lm_head = NULL;
    for (int i = 0; i < m->n_specs; i++) set_ptr(out, &m->specs[i], base + m->specs[i].offset);
    if (!out->lm_head) out->lm_head = out->wte; /* tied */
}

/* Re-resolve chunk c's tensors from chunk_params[c] / chunk_grads[c]. */
static void bind_chunk(Model *m, int c) {
    float *pb = m->chunk_params[c], *gb = m->chunk_grads[c];
    size_t c0 = m->chunk_offset[c];
    for (int i = m->chunk_spec0[c]; i < m->chunk_spec0[c + 1]; i++) {
        const ParamSpec *s = &m->specs[i];
        set_ptr(&m->p, s, pb ? pb + (s->offset - c0) : NULL);
        set_ptr(&m->g, s, gb ? gb + (s->offset - c0) : NULL);
    }
    if (c == 0 && m->cfg.tie_embeddings) { m->p.lm_head = m->p.wte; m->g.lm_head = m->g.wte; }
}

/* Chunk hook: tell the trainer, then take the chunk's (maybe moved)
 * pointers; after a chunk's backward, grads_done too. */
static void chunk_event(Model *m, int c, int ev) {
    if (m->comm.chunk) {
        m->comm.chunk(m->comm.hook_ctx, c, ev);
        if (ev == CHUNK_PRE_FORWARD || ev == CHUNK_PRE_BACKWARD) {
            bind_chunk(m, c);
            /* (re)gathered: its weights are new and stay until its next gather */
            m->k->weights_stable(m->chunk_params[c], m->chunk_size[c]);
        }
    }
    if (ev == CHUNK_POST_BACKWARD && m->comm.grads_done) m->comm.grads_done(m->comm.hook_ctx, c);
}

const ParamSpec *model_find(const Model *m, const char *name) {
    for (int i = 0; i < m->n_specs; i++)
        if (strcmp(m->specs[i].name, name) == 0) return &m->specs[i];
    return NULL;
}

/* ------------------------------------------------------------------ */
/* activations                                                         */

/* One layer's activation buffers in carve order: where the pointer lives,
 * its size in floats, and the recompute bits (RC_*) that drop it: a buffer
 * is kept per layer unless Model.recompute holds one of them, else the
 * backward recomputes it and every layer shares layer 0's buffer. */
typedef struct { float **ptr; size_t n; unsigned drop; int act; } ActBuf; /* act: an [a] buffer of n elements */
#define MAX_ACT_BUFS 32

static int layer_bufs(const Model *m, LayerActs *a, ActBuf *b) {
    size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.n_embd, S = (size_t)m->tp.S; /* S: the residual stream's rows */
    int gpt2 = m->cfg.arch == ARCH_GPT2, n = 0;
    const unsigned L = RC_LAYER, NORM = RC_NORM | RC_LAYER;
#define BUF(p, sz, drop, act) (b[n++] = (ActBuf){&a->p, (sz), (drop), (act)})
    BUF(ln1, S * C, NORM, 1);
    if (gpt2) BUF(ln1_mean, S, NORM, 0);
    BUF(ln1_rstd, S, NORM, 0);
    BUF(qkv, N * (size_t)m->qkv_dim, L, 1); /* [a]: RoPE and attention read it */
    if (m->cfg.qk_norm) { /* kept unless the norms are recomputed (from qkv, as ln1 from x) */
        BUF(qkn, N * (size_t)m->qkv_dim, NORM, 1);
        BUF(qk_rstd, N * (size_t)(m->nh + m->nkv), NORM, 0);
    }
    BUF(atty, N * (size_t)m->nh * m->hd, RC_ATTENTION | L, 1);
    BUF(lse, (size_t)m->B * m->nh * m->T, RC_ATTENTION | L, 0);
    BUF(res2, S * C, L, 0);
    BUF(ln2, S * C, NORM, 1);
    if (gpt2) BUF(ln2_mean, S, NORM, 0);
    BUF(ln2_rstd, S, NORM, 0);
    /* the MLP pre-activation, [a]: only the activation's kernels read it
     * (SwiGLU's written by matmul_forward_a, GELU's by matmul_gelu_forward, or
     * under mlp_act recompute by matmul_forward_a) */
    size_t dense = m->moe.n_layers < m->cfg.n_layer; /* the dense MLP's buffers: some layer has one */
    BUF(fch, dense * N * (size_t)m->fc_dim, L, 1);
    BUF(fch_act, dense * N * (size_t)m->F, RC_MLP_ACT | L, 1);
    if (m->moe.on) { /* every layer's, when some layer is MoE (the recompute shares them by index) */
        const ModelMoE *x = &m->moe;
        size_t Nk = N * (size_t)x->k, E = (size_t)x->E, R = x->R; /* R: the rows this rank's experts may compute */
        BUF(probs, N * E, L, 0);
        BUF(mlse, N, L, 0);
        BUF(wts, Nk, L, 0);
        b[n++] = (ActBuf){(float **)&a->idx, Nk, L, 0}; /* ints: a float's size */
        b[n++] = (ActBuf){(float **)&a->slot, Nk, L, 0};
        b[n++] = (ActBuf){(float **)&a->src, Nk, L, 0};
        BUF(xh, R * 2 * (size_t)x->F, L, 1);
        BUF(xact, R * (size_t)x->F, RC_MLP_ACT | L, 1);
        BUF(yp, Nk * C, L, 0);
        if (x->ep > 1) BUF(xr, R * C, L, 1);
        if (x->Fs) {
            BUF(sh_h, N * 2 * (size_t)x->Fs, L, 1);
            BUF(sh_act, N * (size_t)x->Fs, RC_MLP_ACT | L, 1);
        }
    }
    BUF(res3, S * C, 0, 0);
#undef BUF
    if (!gpt2) a->ln1_mean = a->ln2_mean = NULL;
    if (!m->cfg.qk_norm) a->qkn = a->qk_rstd = NULL;
    return n;
}

static int buf_kept(const Model *m, const ActBuf *b) { return !(b->drop & (unsigned)m->recompute); }
static size_t round16(size_t n) { return (n + 15) / 16 * 16; }
/* floats that n elements of an [a] buffer take */
static size_t act_floats(const Model *m, size_t n) { return (n * (size_t)m->act_bytes + sizeof(float) - 1) / sizeof(float); }
static size_t buf_bytes(const Model *m, const ActBuf *b) { return b->n * (b->act ? (size_t)m->act_bytes : sizeof(float)); }
static size_t buf_floats(const Model *m, const ActBuf *b) { return b->act ? act_floats(m, b->n) : b->n; }
/* element i of an [a] buffer */
static float *act_at(const Model *m, float *base, size_t i) { return (float *)((char *)base + i * (size_t)m->act_bytes); }

/* Floats of one layer's kept buffers (what activation offload moves). */
static size_t layer_kept_floats(const Model *m) {
    LayerActs tmp = {0};
    ActBuf b[MAX_ACT_BUFS];
    size_t s = 0;
    int nb = layer_bufs(m, &tmp, b);
    for (int i = 0; i < nb; i++)
        if (buf_kept(m, &b[i])) s += round16(buf_floats(m, &b[i]));
    return s;
}

/* Carve every activation buffer out of one allocation. With base NULL it
 * only counts, so the same code sizes and assigns. */
static size_t carve_acts(Model *m, float *base) {
    const ModelConfig *c = &m->cfg;
    size_t N = (size_t)m->B * m->T, C = (size_t)c->n_embd, off = 0;
    /* sequence parallelism: the residual stream's S rows a rank, and the
     * all-gathered / reduce-scattered buffers' Np = tp * S >= N */
    size_t S = (size_t)m->tp.S, Np = m->tp.sp ? S * (size_t)m->tp.size : N;
    size_t widest = N * (size_t)(m->fc_dim > m->qkv_dim ? m->fc_dim : m->qkv_dim);
    if (widest < N * C) widest = N * C;
    int gpt2 = c->arch == ARCH_GPT2;
#define TAKE(ptr, n) do { size_t n_ = (n); (ptr) = base ? base + off : NULL; off += round16(n_); } while (0)
    TAKE(m->encoded, S * C);
    /* activation checkpointing: layers after the first share layer 0's
     * buffers for what the backward recomputes (full: everything but the
     * layer output res3; selective: what Model.recompute names).
     * Activation offload: layer l keeps its buffers in slot l % OFFLOAD_SLOTS
     * (the first layers' own), with a copy in host memory (model_offload_*). */
    ActBuf b0[MAX_ACT_BUFS];
    layer_bufs(m, &m->la[0], b0);
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *a = &m->la[l];
        if (m->offload.on && l >= OFFLOAD_SLOTS) {
            *a = m->la[l % OFFLOAD_SLOTS];
            continue;
        }
        ActBuf b[MAX_ACT_BUFS];
        int nb = layer_bufs(m, a, b);
        for (int i = 0; i < nb; i++) {
            if (l > 0 && !buf_kept(m, &b[i])) *b[i].ptr = *b0[i].ptr;
            else TAKE(*b[i].ptr, buf_floats(m, &b[i]));
        }
    }
    TAKE(m->lnf, act_floats(m, Np * C)); /* all rows: the LM head is vocab-parallel */
    if (gpt2) TAKE(m->lnf_mean, S); else m->lnf_mean = NULL;
    TAKE(m->lnf_rstd, S);
    size_t R = m->head_rows > 0 && (size_t)m->head_rows < N ? (size_t)m->head_rows : N;
    TAKE(m->logits, act_floats(m, R * (size_t)m->V)); /* [a] */
    TAKE(m->losses, N);
    if (m->tp.size > 1) { TAKE(m->tp.ce_max, R); TAKE(m->tp.ce_sum, 2 * R); }
    else m->tp.ce_max = m->tp.ce_sum = NULL;
    TAKE(m->dres, S * C);
    /* bf16 [a]: the norms' backward writes dres's bf16 copy too, which the
     * output projections' backward GEMMs read (no conversion of their own);
     * not under sequence parallelism, where they read dres's rows gathered */
    if (m->act_bytes < (int)sizeof(float) && !m->tp.sp) TAKE(m->dres_a, act_floats(m, S * C));
    else m->dres_a = NULL;
    /* dbuf1: [N, C] outputs (Np rows: a reduce-scatter's input) and [N,
     * nh*hd] gradients; dbuf2 the widest (d(fch), d(qkv)) */
    TAKE(m->dbuf1, (m->tp.sp ? Np : N) * (size_t)(C > (size_t)m->nh * m->hd ? C : (size_t)m->nh * m->hd));
    TAKE(m->dbuf2, widest);
    TAKE(m->dlnf, Np * C);
    if (m->moe.on) { /* moe.c's scratch */
        ModelMoE *x = &m->moe;
        size_t Nk = N * (size_t)x->k, E = (size_t)x->E, dh = x->R * 2 * (size_t)x->F;
        if (dh < N * 2 * (size_t)x->Fs) dh = N * 2 * (size_t)x->Fs;
        TAKE(x->logits, N * E);
        TAKE(x->dlogits, N * E);
        TAKE(x->xp, act_floats(m, Nk * C));
        TAKE(x->dxp, Nk * C);
        TAKE(x->dyp, Nk * C);
        TAKE(x->dh, act_floats(m, dh));
        TAKE(x->dwts, Nk);
        TAKE(x->dprob, E);
        TAKE(x->psum, E);
        if (x->ep > 1) {
            TAKE(x->ybuf, x->R * C);
            TAKE(x->dxr, x->R * C);
        }
    }
    if (m->tp.sp) {
        TAKE(m->tp.sp_gath, act_floats(m, Np * C));
        TAKE(m->tp.sp_dgath, Np * C);
        TAKE(m->tp.sp_part, S * C);
        TAKE(m->tp.sp_lnf, act_floats(m, S * C));
        TAKE(m->tp.sp_dnorm, 2 * C);
    } else {
        m->tp.sp_gath = m->tp.sp_dgath = m->tp.sp_part = m->tp.sp_lnf = m->tp.sp_dnorm = NULL;
    }
    if (c->qk_norm && m->tp.size > 1) TAKE(m->tp.qk_dnorm, 2 * (size_t)m->hd);
    else m->tp.qk_dnorm = NULL;
#undef TAKE
    return off;
}

/* ------------------------------------------------------------------ */
/* activation offload                                                  */

/* Queue the copy of layer l's kept buffers between its slot and its host
 * copy (after the compute queued so far; beside later compute). */
static void offload_layer(Model *m, int l, int to_host) {
    ActBuf b[MAX_ACT_BUFS];
    int nb = layer_bufs(m, &m->la[l], b);
    float *h = m->offload.host + (size_t)l * m->offload.layer_floats;
    for (int i = 0; i < nb; i++)
        if (buf_kept(m, &b[i])) {
            m->k->offload_copy(h, *b[i].ptr, buf_bytes(m, &b[i]), to_host);
            h += round16(buf_floats(m, &b[i]));
        }
}

/* Copies run in the order queued, so a load into a slot follows the slot's
 * previous store; compute waits only where it would race one. Forward,
 * before layer l writes its slot: the slot's previous layer must be on the
 * host (and no load into it in flight). After it: send layer l out. */
static void slot_wait(Model *m, int *mark) {
    if (*mark >= 0) m->k->offload_wait(*mark);
    *mark = -1;
}

static void offload_pre_forward(Model *m, int l) {
    int s = l % OFFLOAD_SLOTS;
    slot_wait(m, &m->offload.slot_out[s]);
    slot_wait(m, &m->offload.slot_in[s]);
}

/* A forward no backward follows (evaluation, sampling) keeps the slots to
 * itself: nothing goes to the host, and afterwards no slot holds a layer. */
static void offload_forward_only(Model *m) {
    for (int s = 0; s < OFFLOAD_SLOTS; s++) {
        slot_wait(m, &m->offload.slot_out[s]);
        slot_wait(m, &m->offload.slot_in[s]);
        m->offload.slot_layer[s] = -1;
    }
}

static void offload_post_forward(Model *m, int l) {
    int s = l % OFFLOAD_SLOTS;
    offload_layer(m, l, 1);
    m->offload.slot_out[s] = m->k->offload_mark();
    m->offload.slot_layer[s] = l;
}

/* Backward: load layer l into its slot unless it is there; wait: compute
 * after this call may read it. */
static void offload_fetch(Model *m, int l, int wait) {
    int s = l % OFFLOAD_SLOTS;
    if (m->offload.slot_layer[s] != l) {
        offload_layer(m, l, 0);
        m->offload.slot_in[s] = m->k->offload_mark();
        m->offload.slot_layer[s] = l;
    }
    if (wait) slot_wait(m, &m->offload.slot_in[s]);
}

/* Before layer l's backward: it and layer l-1 (whose output is its input)
 * resident; layer l-2 starts loading into the slot layer l+1 has finished
 * with, so its copy overlaps this layer's backward. */
static void offload_pre_backward(Model *m, int l) {
    offload_fetch(m, l, 1);
    /* full recompute rewrites the layer's output, which may still be on its
     * way out (not the last layer's: model_backward does not recompute it) */
    if (m->act_ckpt == ACT_FULL && l < m->cfg.n_layer - 1) slot_wait(m, &m->offload.slot_out[l % OFFLOAD_SLOTS]);
    if (l >= 1) offload_fetch(m, l - 1, 1);
    if (l >= 2) offload_fetch(m, l - 2, 0);
}

void model_build(Model *m, const ModelConfig *cfg, const Kernels *k, int B, int T, int pad_multiple) {
    model_build_ex(m, cfg, k, B, T, pad_multiple, 1);
}

void model_build_ex(Model *m, const ModelConfig *cfg, const Kernels *k, int B, int T, int pad_multiple, int alloc_moments) {
    model_build_tp(m, cfg, k, B, T, pad_multiple, alloc_moments, 1, 0, (ModelMem){ACT_NONE, 0, 0, 0, 0, 0, 0, 0, 0});
}

void model_layout(Model *m, const ModelConfig *cfg, int pad_multiple, int tp, int tp_rank) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    if (tp < 1 || cfg->n_kv_head % tp || cfg->n_head % tp || cfg->ffn_hidden % tp || cfg->vocab_size % tp)
        die(EXIT_INTERNAL, "model_build: tensor-parallel degree %d does not divide the model", tp);
    m->tp.size = tp;
    m->tp.rank = tp_rank;
    m->nh = cfg->n_head / tp;
    m->nkv = cfg->n_kv_head / tp;
    m->F = cfg->ffn_hidden / tp;
    m->V = cfg->vocab_size / tp;
    m->tp.v0 = tp_rank * m->V;
    m->hd = cfg->head_dim > 0 ? cfg->head_dim : cfg->n_embd / cfg->n_head; /* model_config_finish sets it */
    m->qkv_dim = (m->nh + 2 * m->nkv) * m->hd;
    m->fc_dim = cfg->arch == ARCH_LLAMA ? 2 * m->F : m->F;
    moe_plan(m);
    build_layout(m, pad_multiple);
}

int model_head_rows_auto(int N, int V, int act_bytes) {
    size_t row = (size_t)V * (size_t)act_bytes;
    if ((size_t)N * row <= HEAD_AUTO_BYTES) return N;
    size_t most = HEAD_AUTO_BYTES / row / 64 * 64; /* a multiple of 64 rows within the bound */
    if (most < 64) most = 64;
    size_t chunks = ((size_t)N + most - 1) / most, rows = ((size_t)N + chunks - 1) / chunks;
    return (int)((rows + 63) / 64 * 64); /* at most `most`: rows <= most, a multiple of 64 */
}

void model_plan_tp(Model *m, const ModelConfig *cfg, int B, int T, int pad_multiple, int tp, int tp_rank, ModelMem mem) {
    model_layout(m, cfg, pad_multiple, tp, tp_rank);
    m->act_bytes = mem.act_bytes > 0 ? mem.act_bytes : (int)sizeof(float);
    m->act_ckpt = mem.act_ckpt;
    m->recompute = mem.act_ckpt == ACT_FULL ? RC_LAYER
                 : mem.act_ckpt == ACT_SELECTIVE ? (mem.recompute ? mem.recompute : RC_ATTENTION) : 0;
    m->head_rows = mem.head_rows > 0 ? mem.head_rows : model_head_rows_auto(B * T, m->V, m->act_bytes);
    m->offload.on = mem.offload && cfg->n_layer > OFFLOAD_SLOTS;
    m->B = B;
    m->T = T;
    m->tp.sp = mem.seq_parallel && tp > 1;
    m->tp.S = m->tp.sp ? (B * T + tp - 1) / tp : B * T;
    moe_set_ep(m, mem.ep > 0 ? mem.ep : 1, mem.ep_rank, B * T, mem.capacity);
    m->la = calloc_check((size_t)cfg->n_layer, sizeof(LayerActs));
    m->acts_floats = carve_acts(m, NULL);
    m->offload.layer_floats = layer_kept_floats(m);
    m->offload.floats = m->offload.on ? (size_t)cfg->n_layer * m->offload.layer_floats : 0;
    for (int s = 0; s < OFFLOAD_SLOTS; s++) m->offload.slot_layer[s] = m->offload.slot_out[s] = m->offload.slot_in[s] = -1;
}

/* FP8 under tp: a split tensor's amaxes, max over the TP group (read
 * through m->comm when called: the trainer sets it after model_fp8) */
static void fp8_amax_max(void *ctx, float *amax, size_t n) {
    Model *m = ctx;
    m->comm.allreduce(m->comm.ctx, amax, n, 1);
}

/* ... and under cp, over the context group (whose ranks run a sample's
 * forward together too) */
static void fp8_amax_max_cp(void *ctx, float *amax, size_t n) {
    Model *m = ctx;
    if (m->cp.size > 1) m->comm.cp_allreduce_max(m->comm.ctx, amax, n);
}

Fp8Sizes model_fp8_sizes(const Model *m, int N) {
    int width = m->cfg.n_embd, w[] = {m->nh * m->hd, m->F, m->qkv_dim, m->fc_dim};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) width = w[i] > width ? w[i] : width;
    Fp8Sizes z = {(size_t)N * width, 0, 0, 0, N > width ? N : width};
    for (int i = 0; i < m->n_specs; i++) {
        ParamKind kind = m->specs[i].kind;
        if (kind != P_QKV_W && kind != P_ATTN_OUT_W && kind != P_FC_W && kind != P_PROJ_W) continue;
        z.weight_floats += m->specs[i].numel;
        z.weight_max = m->specs[i].numel > z.weight_max ? m->specs[i].numel : z.weight_max;
        z.n_weights++;
    }
    return z;
}

/* the backend's room for the layers' linears: the sizes of their operands */
void model_fp8(Model *m, int recipe) {
    if (recipe < 0) return;
    if (!m->k->fp8_setup)
        die(EXIT_USAGE, "train.compute_dtype \"fp8\": the %s backend has no FP8 products yet (the cpu backend has them)", m->k->name);
    if (m->moe.on)
        die(EXIT_USAGE, "train.compute_dtype \"fp8\" with model.moe_experts %d: FP8 products inside the experts are not built yet "
            "(use bf16)", m->moe.E);
    Fp8Sizes z = model_fp8_sizes(m, m->B * m->T);
    if (m->tp.size > 1 && !m->k->fp8_tp)
        die(EXIT_USAGE, "train.compute_dtype \"fp8\" with parallel.tensor %d: the %s backend's FP8 runs no tensor "
            "parallelism yet (the cpu backend's does)", m->tp.size, m->k->name);
    /* blockwise: each rank's part of a split dimension (its q, k and v
     * heads, its MLP width) whole 128-blocks, so that no block or weight
     * tile spans two ranks (then none is reduced) */
    if (m->tp.size > 1 && recipe == FP8_BLOCKWISE && ((m->nh * m->hd) % FP8_BLOCK || (m->nkv * m->hd) % FP8_BLOCK || m->F % FP8_BLOCK))
        die(EXIT_USAGE, "train.fp8_recipe \"blockwise\" with parallel.tensor %d: a rank's q heads (%d rows), k and v heads (%d) "
            "and MLP width (%d) must be multiples of %d, or a 128-block would span two ranks", m->tp.size, m->nh * m->hd,
            m->nkv * m->hd, m->F, FP8_BLOCK);
    if (m->cp.size > 1 && !m->k->fp8_cp)
        die(EXIT_USAGE, "train.compute_dtype \"fp8\" with parallel.context %d: the %s backend's FP8 runs no context "
            "parallelism yet (the cpu backend's does)", m->cp.size, m->k->name);
    /* blockwise: the weight gradient's 1 x 128 blocks along the tokens
     * are the 1-rank run's when each of a rank's two chunks of a sequence
     * (T/2 of its T rows) is whole blocks (then none is reduced) */
    if (m->cp.size > 1 && recipe == FP8_BLOCKWISE && (m->T / 2) % FP8_BLOCK)
        die(EXIT_USAGE, "train.fp8_recipe \"blockwise\" with parallel.context %d: a context chunk (train.seq_len / %d = %d "
            "tokens) must be a multiple of %d, or a 128-token block of the weight gradient would span two chunks", m->cp.size,
            2 * m->cp.size, m->T / 2, FP8_BLOCK);
    m->k->fp8_setup(recipe, &z);
    /* LLMTRAIN_FP8_AGREE=0 (tests only): each rank's own amaxes, so that
     * the tests see what the agreement changes */
    const char *agree = getenv("LLMTRAIN_FP8_AGREE");
    if (agree && strcmp(agree, "0") && strcmp(agree, "1"))
        die(EXIT_USAGE, "LLMTRAIN_FP8_AGREE: expected 0 or 1, got \"%s\"", agree);
    if (!agree || agree[0] == '1') {
        if (m->tp.size > 1) m->k->fp8_tp(fp8_amax_max, m);
        if (m->cp.size > 1) m->k->fp8_cp(fp8_amax_max_cp, m);
    }
    m->fp8.on = 1;
}

/* The products between fp8_scope(m, 1) and (m, 0) are a layer's linears:
 * FP8 under train.compute_dtype fp8 (kernels.h) */
static void fp8_scope(const Model *m, int on) {
    if (m->fp8.on) m->k->fp8_scope(on);
}

/* Under tp, the next products are a column-parallel linear's (FP8_COLUMN)
 * or a row-parallel one's (FP8_ROW): which operands are split (kernels.h) */
static void fp8_linear(const Model *m, int kind) {
    if (m->fp8.on && m->tp.size > 1) m->k->fp8_scope(kind);
}

void model_build_tp(Model *m, const ModelConfig *cfg, const Kernels *k, int B, int T, int pad_multiple, int alloc_moments,
                    int tp, int tp_rank, ModelMem mem) {
    mem.act_bytes = k->act_bytes;
    model_plan_tp(m, cfg, B, T, pad_multiple, tp, tp_rank, mem);
    m->k = k;
    size_t bytes = m->n_params * sizeof(float);
    m->params = k->alloc(bytes);
    m->grads = k->alloc(bytes);
    if (alloc_moments) {
        m->m = k->alloc(bytes);
        m->v = k->alloc(bytes);
    }
    m->p.layers = calloc_check((size_t)cfg->n_layer, sizeof(LayerPtrs));
    m->g.layers = calloc_check((size_t)cfg->n_layer, sizeof(LayerPtrs));
    bind(m, m->params, &m->p);
    bind(m, m->grads, &m->g);
    m->chunk_params = calloc_check((size_t)m->n_chunks, sizeof(float *));
    m->chunk_grads = calloc_check((size_t)m->n_chunks, sizeof(float *));
    for (int c = 0; c < m->n_chunks; c++) {
        m->chunk_params[c] = m->params + m->chunk_offset[c];
        m->chunk_grads[c] = m->grads + m->chunk_offset[c];
    }

    m->acts_mem = k->alloc(m->acts_floats * sizeof(float));
    carve_acts(m, m->acts_mem);
    if (m->offload.on) m->offload.host = k->host_alloc(m->offload.floats * sizeof(float));
    m->tokens = k->alloc((size_t)B * T * sizeof(int));
    m->targets = k->alloc((size_t)B * T * sizeof(int));
    m->qstart = k->alloc((size_t)B * T * sizeof(int));
    m->qstart_host = malloc_check((size_t)B * T * sizeof(int));
    m->pos = k->alloc((size_t)B * T * sizeof(int));
    m->pos_host = malloc_check((size_t)B * T * sizeof(int));
    m->eod_token = -1;
    moe_alloc(m, B * T);
}

void model_free(Model *m) {
    const Kernels *k = m->k;
    if (k) { /* NULL: a layout or plan owns no backend memory */
        k->free(m->params); k->free(m->grads);
        if (m->m) k->free(m->m);
        if (m->v) k->free(m->v);
        k->free(m->acts_mem); k->free(m->tokens); k->free(m->targets); k->free(m->qstart);
        k->free(m->pos);
        for (int i = 0; i < 2; i++) if (m->cp.ring[i]) k->free(m->cp.ring[i]);
        if (m->offload.host) k->host_free(m->offload.host);
        if (m->fp8.on) k->fp8_setup(-1, NULL);
    }
    free(m->p.layers); free(m->g.layers); free(m->la);
    free(m->specs); free(m->chunk_offset); free(m->chunk_size);
    free(m->chunk_params); free(m->chunk_grads); free(m->chunk_spec0); free(m->qstart_host);
    free(m->pos_host);
    moe_free(m);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ */
/* init                                                                */

size_t model_global_numel(const Model *m, const ParamSpec *s) {
    return s->tp_axis >= 0 ? s->numel * (size_t)m->tp.size : s->numel;
}

void model_tp_copy(const Model *m, const ParamSpec *s, float *global, float *local, int to_global) {
    size_t tp = (size_t)m->tp.size, r = (size_t)m->tp.rank;
    if (s->tp_axis < 0 || tp == 1) {
        if (to_global) memcpy(global, local, s->numel * sizeof(float));
        else memcpy(local, global, s->numel * sizeof(float));
        return;
    }
    size_t cols = s->ndim == 2 ? (size_t)s->shape[1] : 1, rows = (size_t)s->shape[0];
    if (s->tp_axis == 1) { /* column split: each row's local columns sit at r*cols of the global row */
        for (size_t i = 0; i < rows; i++) {
            float *g = global + i * cols * tp + r * cols, *l = local + i * cols;
            if (to_global) memcpy(g, l, cols * sizeof(float));
            else memcpy(l, g, cols * sizeof(float));
        }
        return;
    }
    /* row split, fused row blocks (qkv: q|k|v, llama fc: gate|up) split separately */
    size_t parts[3] = {rows, 0, 0};
    int np = 1;
    if (s->kind == P_QKV_W || s->kind == P_QKV_B) {
        parts[0] = (size_t)m->nh * m->hd; parts[1] = parts[2] = (size_t)m->nkv * m->hd; np = 3;
    } else if ((s->kind == P_FC_W || s->kind == P_FC_B) && s->nparts == 2) {
        parts[0] = parts[1] = (size_t)m->F; np = 2;
    }
    size_t goff = 0, loff = 0;
    for (int p = 0; p < np; p++) {
        float *g = global + (goff + r * parts[p]) * cols, *l = local + loff * cols;
        if (to_global) memcpy(g, l, parts[p] * cols * sizeof(float));
        else memcpy(l, g, parts[p] * cols * sizeof(float));
        goff += parts[p] * tp;
        loff += parts[p];
    }
}

/* The splitmix64 generator: the next output of state *s (kernels.h's hash). */
static uint64_t splitmix64_next(uint64_t *s) {
    uint64_t z = *s;
    *s += 0x9E3779B97F4A7C15ull;
    return splitmix64(z);
}

/* Each tensor draws from its own stream keyed by (seed, name), so a
 * tensor's initial values do not depend on the layout or parallelism. */
void model_init_random(Model *m, float std, uint64_t seed) {
    float *host = malloc_check(m->n_params * sizeof(float));
    memset(host, 0, m->n_params * sizeof(float));
    float resid_std = std / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        /* tensor parallel: generate the GLOBAL tensor, keep the local slice */
        int split = m->tp.size > 1 && s->tp_axis >= 0;
        size_t numel = model_global_numel(m, s);
        float *p = split ? calloc_check(numel, sizeof(float)) : host + s->offset;
        switch (s->kind) {
        case P_LN1_W: case P_LN2_W: case P_LNF_W: case P_Q_NORM_W: case P_K_NORM_W:
            for (size_t j = 0; j < s->numel; j++) p[j] = 1.0f;
            break;
        case P_LN1_B: case P_LN2_B: case P_LNF_B: case P_QKV_B: case P_ATTN_OUT_B: case P_FC_B: case P_PROJ_B:
            break; /* zero */
        default: {
            int resid = s->kind == P_ATTN_OUT_W || s->kind == P_PROJ_W || s->kind == P_EXP_PROJ_W || s->kind == P_SH_PROJ_W;
            float sd = resid ? resid_std : std;
            uint64_t st = seed ^ fnv1a64(s->name);
            for (size_t j = 0; j < numel; j += 2) { /* Box-Muller pairs */
                double u1 = ((splitmix64_next(&st) >> 11) + 1.0) * 0x1.0p-53;
                double u2 = (splitmix64_next(&st) >> 11) * 0x1.0p-53;
                double r = sqrt(-2.0 * log(u1));
                p[j] = (float)(sd * r * cos(2 * M_PI * u2));
                if (j + 1 < numel) p[j + 1] = (float)(sd * r * sin(2 * M_PI * u2));
            }
        }
        }
        if (split) { model_tp_copy(m, s, p, host + s->offset, 0); free(p); }
    }
    m->k->from_host(m->params, host, m->n_params * sizeof(float));
    free(host);
}

/* ------------------------------------------------------------------ */
/* forward and backward                                                */

static void norm_forward(const Model *m, float *out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b, int N) {
    const ModelConfig *c = &m->cfg;
    if (c->arch == ARCH_GPT2) m->k->layernorm_forward(out, mean, rstd, inp, w, b, N, c->n_embd, c->norm_eps);
    else m->k->rmsnorm_forward(out, rstd, inp, w, N, c->n_embd, c->norm_eps);
}

/* res = a + b, then out = norm(res): the residual add fused with the norm */
static void add_norm_forward(const Model *m, float *res, float *out, float *mean, float *rstd, const float *a,
                             const float *b, const float *w, const float *bias, int N) {
    const ModelConfig *c = &m->cfg;
    if (c->arch == ARCH_GPT2) m->k->add_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, c->n_embd, c->norm_eps);
    else m->k->add_rmsnorm_forward(res, out, rstd, a, b, w, N, c->n_embd, c->norm_eps);
}

/* dinp_a (NULL: none): dinp's [a] copy, for a product's backward next */
static void norm_backward(const Model *m, float *dinp, float *dinp_a, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd, int N) {
    if (m->cfg.arch == ARCH_GPT2)
        m->k->layernorm_backward(dinp, dinp_a, dw, db, dout, inp, w, mean, rstd, N, m->cfg.n_embd);
    else m->k->rmsnorm_backward(dinp, dinp_a, dw, dout, inp, w, rstd, N, m->cfg.n_embd);
}

static void tp_allreduce(const Model *m, float *x, size_t n, int max) {
    if (m->tp.size > 1) m->comm.allreduce(m->comm.ctx, x, n, max);
}

/* Sequence parallelism: the rows of N this rank's residual stream holds. */
static int sp_rows(const Model *m, int N) { return m->tp.sp ? (N + m->tp.size - 1) / m->tp.size : N; }

/* Every TP rank's S rows of C elements (es bytes each) into full [tp * S, C]. */
static void sp_gather(const Model *m, void *full, const void *rows, int S, int es) {
    m->comm.allgather(m->comm.ctx, rows, full, (size_t)S * m->cfg.n_embd, es);
}

/* The TP ranks' partial sums full[N, C] summed, this rank's S rows into
 * rows[S, C] (rows [N, tp * S) of full are zeroed first: the padding). */
static void sp_scatter(const Model *m, float *rows, float *full, int N, int S) {
    size_t C = (size_t)m->cfg.n_embd, Np = (size_t)S * (size_t)m->tp.size;
    if (Np > (size_t)N) m->k->zero(full + (size_t)N * C, (Np - (size_t)N) * C * sizeof(float));
    m->comm.reduce_scatter(m->comm.ctx, full, rows, (size_t)S * C);
}

/* A row-parallel product's partial output full[N, C] made whole: all-reduced
 * in place (returns full), or under sequence parallelism reduce-scattered
 * into sp_part (returns it: this rank's S rows). */
static const float *tp_reduce_rows(Model *m, float *full, int N, int S) {
    if (m->tp.sp) {
        sp_scatter(m, m->tp.sp_part, full, N, S);
        return m->tp.sp_part;
    }
    tp_allreduce(m, full, (size_t)N * m->cfg.n_embd, 0);
    return full;
}

/* The input a column-parallel product reads: a norm's output of S rows,
 * all-gathered under sequence parallelism (into sp_gath), else itself. */
static const float *tp_gather_rows(Model *m, const float *ln, int S) {
    if (!m->tp.sp) return ln;
    sp_gather(m, m->tp.sp_gath, ln, S, m->act_bytes);
    return m->tp.sp_gath;
}

/* The norm's backward over S rows. Under sequence parallelism its weight
 * (and bias) gradient covers this rank's rows only: it is computed apart,
 * all-reduced over the TP group and then added, so every TP rank holds the
 * same gradient of the replicated norm. */
static void norm_backward_rows(Model *m, float *dinp, float *dinp_a, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean, const float *rstd, int S) {
    if (!m->tp.sp) {
        norm_backward(m, dinp, dinp_a, dw, db, dout, inp, w, mean, rstd, S);
        return;
    }
    const Kernels *k = m->k;
    size_t C = (size_t)m->cfg.n_embd, n = db ? 2 * C : C;
    float *pw = m->tp.sp_dnorm, *pb = db ? pw + C : NULL;
    k->zero(pw, n * sizeof(float));
    norm_backward(m, dinp, dinp_a, pw, pb, dout, inp, w, mean, rstd, S);
    tp_allreduce(m, pw, n, 0);
    k->add(dw, dw, pw, C);
    if (db) k->add(db, db, pb, C);
}

/* The job's RoPE for the kernels. */
static Rope rope_of(const ModelConfig *c) {
    return (Rope){.theta = c->rope_theta,
                  .scaling = c->rope_scaling,
                  .factor = c->rope_scaling_factor,
                  .low_freq_factor = c->rope_low_freq_factor,
                  .high_freq_factor = c->rope_high_freq_factor,
                  .original_max_seq_len = c->rope_original_max_seq_len,
                  .beta_fast = c->rope_beta_fast,
                  .beta_slow = c->rope_beta_slow,
                  .attention_factor = c->rope_attention_factor,
                  .truncate = c->rope_truncate};
}

/* attention's qstart: the last forward's documents under a block-causal
 * mask, else NULL (plain causal) */
static const int *att_qstart(const Model *m) { return m->block_causal ? m->qstart : NULL; }

/* the embeddings' and RoPE's positions: the last forward's, counted from
 * each document's first token, under reset_pos, else NULL (the row's) */
static const int *positions(const Model *m) { return m->reset_pos || m->cp.size > 1 ? m->pos : NULL; }

/* attention's q|k|v: qkn under model.qk_norm, else qkv */
static float *att_qkv(const LayerActs *a) { return a->qkn ? a->qkn : a->qkv; }

/* Attention of a layer's rows (forward, backward): over the whole sequence
 * by the context group's ring under context parallelism (cp.c), else the
 * kernel's. */
static void attn_forward(Model *m, LayerActs *a, int B, int T) {
    if (m->cp.size > 1) cp_attention_forward(m, a->atty, a->lse, att_qkv(a), att_qstart(m), B, T);
    else m->k->attention_forward(a->atty, a->lse, att_qkv(a), att_qstart(m), B, T, m->nh, m->nkv, m->hd);
}

static void attn_backward(Model *m, float *dqkv, const float *dout, const LayerActs *a, int B, int T) {
    if (m->cp.size > 1) cp_attention_backward(m, dqkv, dout, att_qkv(a), a->atty, a->lse, att_qstart(m), B, T);
    else m->k->attention_backward(dqkv, dout, att_qkv(a), a->atty, a->lse, att_qstart(m), B, T, m->nh, m->nkv, m->hd);
}

/* The QKV product's output qkv made attention's input: under model.qk_norm
 * each q and k head RMS-normalized into qkn (v copied), then (Llama) RoPE
 * on it. The backward's recompute (RC_NORM) calls it again: the same
 * kernels on the same qkv, so the same bits. */
static void qk_forward(Model *m, LayerActs *a, const LayerPtrs *w, int B, int T) {
    const ModelConfig *c = &m->cfg;
    if (a->qkn)
        m->k->headnorm_forward(a->qkn, a->qk_rstd, a->qkv, w->q_norm_w, w->k_norm_w, B * T, m->nh, m->nkv, m->hd, c->norm_eps);
    if (c->arch == ARCH_LLAMA) {
        Rope rope = rope_of(c);
        m->k->rope_forward(att_qkv(a), positions(m), B, T, m->nh, m->nkv, m->hd, &rope);
    }
}

/* d(attention's input) in dqkv back to d(qkv): RoPE's transpose, then
 * (model.qk_norm) the head norm's backward, in place. This rank's heads
 * give part of the shared norm weights' gradient under tp: computed apart,
 * all-reduced over the TP group, then added (as norm_backward_rows). */
static void qk_backward(Model *m, float *dqkv, const LayerActs *a, const LayerPtrs *w, const LayerPtrs *g, int B, int T) {
    const Kernels *k = m->k;
    int hd = m->hd;
    if (m->cfg.arch == ARCH_LLAMA) {
        Rope rope = rope_of(&m->cfg);
        k->rope_backward(dqkv, positions(m), B, T, m->nh, m->nkv, hd, &rope);
    }
    if (!a->qkn) return;
    if (!m->tp.qk_dnorm) {
        k->headnorm_backward(dqkv, g->q_norm_w, g->k_norm_w, a->qkv, w->q_norm_w, w->k_norm_w, a->qk_rstd, B * T, m->nh,
                             m->nkv, hd);
        return;
    }
    float *pq = m->tp.qk_dnorm, *pk = pq + hd;
    k->zero(pq, 2 * (size_t)hd * sizeof(float));
    k->headnorm_backward(dqkv, pq, pk, a->qkv, w->q_norm_w, w->k_norm_w, a->qk_rstd, B * T, m->nh, m->nkv, hd);
    tp_allreduce(m, pq, 2 * (size_t)hd, 0);
    k->add(g->q_norm_w, g->q_norm_w, pq, (size_t)hd);
    k->add(g->k_norm_w, g->k_norm_w, pk, (size_t)hd);
}

/* A mixture-of-experts layer's MLP (moe.c): res3 = res2 + moe(ln2). The
 * experts are whole on every TP rank, and each routes all N rows (ln2
 * gathered under sequence parallelism), so no product is split: under
 * sequence parallelism a rank then keeps its own S rows of the output
 * (dbuf1, whose padding rows past N are zeroed). */
static void moe_block_forward(Model *m, int l, const float *ln2, int N, int S) {
    LayerActs *a = &m->la[l];
    if (!m->tp.sp) {
        moe_forward(m, l, a->res3, a->res2, ln2, N);
        return;
    }
    size_t C = (size_t)m->cfg.n_embd, Np = (size_t)S * (size_t)m->tp.size;
    moe_forward(m, l, m->dbuf1, NULL, ln2, N);
    if (Np > (size_t)N) m->k->zero(m->dbuf1 + (size_t)N * C, (Np - (size_t)N) * C * sizeof(float));
    m->k->add(a->res3, a->res2, m->dbuf1 + (size_t)m->tp.rank * S * C, (size_t)S * C);
}

/* Its backward from d(res3) (all N rows: dres_rows): d(ln2) of this rank's
 * S rows, in dbuf1 (every TP rank computed all of it: nothing to reduce). */
static const float *moe_block_backward(Model *m, int l, const float *dout, const float *ln2, int N, int S, int rc) {
    moe_backward(m, l, m->dbuf1, dout, ln2, N, rc);
    if (!m->tp.sp) return m->dbuf1;
    size_t C = (size_t)m->cfg.n_embd, Np = (size_t)S * (size_t)m->tp.size;
    if (Np > (size_t)N) m->k->zero(m->dbuf1 + (size_t)N * C, (Np - (size_t)N) * C * sizeof(float));
    return m->dbuf1 + (size_t)m->tp.rank * S * C;
}

/* One transformer layer's forward from its input x into m->la[l] (under
 * activation checkpointing the backward calls it again to recompute). */
static void layer_forward(Model *m, int l, const float *x, int B, int T) {
    const Kernels *k = m->k;
    const ModelConfig *c = &m->cfg;
    int N = B * T, S = sp_rows(m, N), C = c->n_embd, F = m->F, nh = m->nh, hd = m->hd;
    int llama = c->arch == ARCH_LLAMA, tp = m->tp.size > 1, root = m->tp.rank == 0;
    const LayerPtrs *w = &m->p.layers[l];
    LayerActs *a = &m->la[l];
    fp8_scope(m, 1);
        /* attention block: res2 = x + out_proj(attn(qkv(norm1(x)))); x, res2
         * and the norms' outputs have S rows (N but under sequence parallelism) */
        norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, S);
        fp8_linear(m, FP8_COLUMN);
        k->matmul_forward_a(a->qkv, tp_gather_rows(m, a->ln1, S), w->qkv_w, w->qkv_b, N, C, m->qkv_dim); /* qkv is [a] */
        qk_forward(m, a, w, B, T);
        attn_forward(m, a, B, T);
        if (tp) { /* row-parallel: partial sums, the replicated bias added once (rank 0) */
            fp8_linear(m, FP8_ROW);
            k->matmul_forward(m->dbuf1, a->atty, w->attn_out_w, root ? w->attn_out_b : NULL, N, nh * hd, C);
            const float *y = tp_reduce_rows(m, m->dbuf1, N, S);
            /* the residual add fused with norm2 */
            add_norm_forward(m, a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, x, y, w->ln2_w, w->ln2_b, S);
        } else { /* the residual add fused with the product */
            k->matmul_forward_res(a->res2, x, a->atty, w->attn_out_w, w->attn_out_b, N, nh * hd, C);
            norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b, N);
        }
        /* MLP block: res3 = res2 + proj(act(fc(norm2(res2)))) */
        const float *ln2 = tp_gather_rows(m, a->ln2, S);
        if (moe_layer(c, l)) {
            moe_block_forward(m, l, ln2, N, S);
            fp8_scope(m, 0);
            return;
        }
        fp8_linear(m, FP8_COLUMN);
        if (llama) {
            k->matmul_forward_a(a->fch, ln2, w->fc_w, NULL, N, C, m->fc_dim); /* no bias; fch is [a] */
            k->swiglu_forward(a->fch_act, a->fch, N, F);
        } else if (m->recompute & RC_MLP_ACT) {
            /* the backward recomputes the GELU with gelu_forward: the
             * forward runs that kernel too (CUDA's GEMM epilogue rounds
             * the GELU of the unrounded product) */
            k->matmul_forward_a(a->fch, ln2, w->fc_w, w->fc_b, N, C, F);
            k->gelu_forward(a->fch_act, a->fch, (size_t)N * F);
        } else { /* fc_dim = F: one call, so CUDA can fuse the GELU into the GEMM */
            k->matmul_gelu_forward(a->fch_act, a->fch, ln2, w->fc_w, w->fc_b, N, C, F);
        }
        if (tp) {
            fp8_linear(m, FP8_ROW);
            k->matmul_forward(m->dbuf1, a->fch_act, w->proj_w, root ? w->proj_b : NULL, N, F, C);
            const float *y = tp_reduce_rows(m, m->dbuf1, N, S);
            k->add(a->res3, a->res2, y, (size_t)S * C);
        } else {
            k->matmul_forward_res(a->res3, a->res2, a->fch_act, w->proj_w, w->proj_b, N, F, C);
        }
    fp8_scope(m, 0);
}

/* Rows of the LM head and cross-entropy at a time for N rows. */
static int head_rows(const Model *m, int N) { return m->head_rows > 0 && m->head_rows < N ? m->head_rows : N; }

/* LM head and cross-entropy of rows [r0, r0 + n): logits, then the
 * softmax probabilities in place and losses[r0, +n); with dloss != 0 (not
 * under tp), d(logits) = (probabilities - onehot) * dloss instead of the
 * probabilities. Vocab-parallel under tp: no rank holds a full row (row max
 * all-reduced, then the exp sums and the target logit). */
static void head_forward(Model *m, int r0, int n, float dloss) {
    const Kernels *k = m->k;
    const int *tg = m->targets + r0;
    k->matmul_forward_a(m->logits, act_at(m, m->lnf, (size_t)r0 * m->cfg.n_embd), m->p.lm_head, NULL, n, m->cfg.n_embd,
                        m->V);
    if (m->tp.size > 1) {
        float *tgt = m->tp.ce_sum + n; /* sums and target logits: one all-reduce of 2n */
        k->crossentropy_vp_max(m->tp.ce_max, m->logits, n, m->V);
        tp_allreduce(m, m->tp.ce_max, (size_t)n, 1);
        k->crossentropy_vp_expsum(m->tp.ce_sum, tgt, m->logits, m->tp.ce_max, tg, n, m->V, m->tp.v0);
        tp_allreduce(m, m->tp.ce_sum, 2 * (size_t)n, 0);
        k->crossentropy_vp_finish(m->losses + r0, m->logits, m->tp.ce_max, m->tp.ce_sum, tgt, tg, n, m->V);
    } else if (dloss != 0.0f) {
        k->crossentropy_fused(m->losses + r0, m->logits, tg, dloss, n, m->cfg.vocab_size);
    } else {
        k->crossentropy_forward(m->losses + r0, m->logits, tg, n, m->cfg.vocab_size);
    }
}

/* The LM head's forward and backward for the N rows of a training
 * micro-batch, head_rows at a time: each chunk's logits, its losses and
 * d(logits) = (probabilities - onehot) * loss_scale in their place, then
 * d(lnf) of its rows and its terms of the head's weight gradient. One
 * chunk's logits exist at a time and none is computed twice (the chunk's
 * backward follows its forward at once: the loss scale is known before the
 * forward). Under tp d(lnf) is a partial sum over the vocabulary slices,
 * all-reduced by the backward. The caller has taken the final chunk's (and,
 * tied, the embeddings') gradient buffers: CHUNK_PRE_BACKWARD. */
static void head_train(Model *m, int N, float loss_scale) {
    const Kernels *k = m->k;
    const int C = m->cfg.n_embd, R = head_rows(m, N), tp = m->tp.size > 1;
    for (int r0 = 0; r0 < N; r0 += R) {
        int n = N - r0 < R ? N - r0 : R;
        head_forward(m, r0, n, tp ? 0.0f : loss_scale);
        if (tp) k->crossentropy_vp_backward(m->logits, m->targets + r0, loss_scale, n, m->V, m->tp.v0);
        k->matmul_backward_a(m->dlnf + (size_t)r0 * C, m->g.lm_head, NULL, m->logits, act_at(m, m->lnf, (size_t)r0 * C),
                             m->p.lm_head, n, C, m->V);
    }
    m->head_scale = loss_scale;
}

/* The mean of the N rows' losses over those with a target (a row without
 * one has loss 0), their sum left in m->loss_sum */
static float forward_loss(Model *m, int N) {
    m->loss_sum = m->k->sum(m->losses, (size_t)N);
    return m->n_targets ? (float)(m->loss_sum / (double)m->n_targets) : NAN;
}

float model_forward_bt(Model *m, const int *tokens, const int *targets, int B, int T) {
    const Kernels *k = m->k;
    const ModelConfig *c = &m->cfg;
    if (B > m->B || T > m->T) die(EXIT_INTERNAL, "model_forward: %dx%d exceeds the built %dx%d", B, T, m->B, m->T);
    int N = B * T, S = sp_rows(m, N), C = c->n_embd;
    int tp = m->tp.size > 1, root = m->tp.rank == 0;
    m->cur_B = B;
    m->cur_T = T;
    k->from_host(m->tokens, tokens, (size_t)N * sizeof(int));
    if (targets) k->from_host(m->targets, targets, (size_t)N * sizeof(int));
    if (m->cp.size > 1) { /* this rank's chunks: positions in the sequence, documents from the caller's starts */
        if (T % 2) die(EXIT_INTERNAL, "model_forward: %d rows a sequence under context parallelism (odd)", T);
        for (int n = 0; n < N; n++) {
            int p = cp_pos(n % T, T, m->cp.size, m->cp.rank), s = m->eod_token >= 0 || m->doc_ends ? m->cp.doc0[n] : 0;
            m->qstart_host[n] = s;
            m->pos_host[n] = m->reset_pos ? p - s : p;
        }
        k->from_host(m->pos, m->pos_host, (size_t)N * sizeof(int));
        if (m->block_causal) k->from_host(m->qstart, m->qstart_host, (size_t)N * sizeof(int));
    } else if (m->eod_token >= 0 || m->doc_ends) { /* documents: one starts after each end, and at each row's start */
        for (int b = 0; b < B; b++)
            for (int t = 0, s = 0; t < T; t++) {
                int n = b * T + t;
                m->qstart_host[n] = s;
                m->pos_host[n] = t - s;
                if (m->doc_ends ? m->doc_ends[n] : tokens[n] == m->eod_token) s = t + 1;
            }
        if (m->block_causal) k->from_host(m->qstart, m->qstart_host, (size_t)N * sizeof(int));
        if (m->reset_pos) k->from_host(m->pos, m->pos_host, (size_t)N * sizeof(int));
    }
    int L = c->n_layer, tied = c->tie_embeddings;

    /* Whatever changed the weights since the last forward (the optimizer,
     * a load) is done, and nothing changes them until the backward of this
     * forward is: all of them stay put (kernels.h weights_stable), or, when
     * a hook gathers chunks, each chunk from its gather on (chunk_event).
     * same_weights: the caller says nothing wrote them since the last
     * forward, whose declaration (and the copies made under it) still holds. */
    if (!m->same_weights || m->comm.chunk) {
        k->weights_stable(NULL, 0);
        if (!m->comm.chunk) k->weights_stable(m->params, m->n_params);
    }
    m->same_weights = 0;
    chunk_event(m, 0, CHUNK_PRE_FORWARD);
    if (m->tp.sp) { /* vocab-parallel lookup; wpe added once (tp rank 0); this rank's rows of the sum */
        k->embed_forward_vp(m->dbuf1, m->tokens, positions(m), m->p.wte, root ? m->p.wpe : NULL, N, T, C, m->tp.v0, m->V);
        sp_scatter(m, m->encoded, m->dbuf1, N, S);
    } else if (tp) {
        k->embed_forward_vp(m->encoded, m->tokens, positions(m), m->p.wte, root ? m->p.wpe : NULL, N, T, C, m->tp.v0,
                            m->V);
        tp_allreduce(m, m->encoded, (size_t)N * C, 0);
    } else {
        k->embed_forward(m->encoded, m->tokens, positions(m), m->p.wte, m->p.wpe, N, T, C);
    }
    chunk_event(m, 0, CHUNK_POST_FORWARD);
    const float *x = m->encoded;
    int offload = m->offload.on && !m->forward_only;
    if (m->offload.on && m->forward_only) offload_forward_only(m);
    for (int l = 0; l < L; l++) {
        chunk_event(m, l + 1, CHUNK_PRE_FORWARD);
        if (offload) offload_pre_forward(m, l);
        layer_forward(m, l, x, B, T);
        if (offload) offload_post_forward(m, l);
        x = m->la[l].res3;
        chunk_event(m, l + 1, CHUNK_POST_FORWARD);
    }
    chunk_event(m, L + 1, CHUNK_PRE_FORWARD);
    if (tied) chunk_event(m, 0, CHUNK_PRE_FORWARD); /* the LM head reads wte */
    if (m->tp.sp) { /* the LM head reads every row */
        norm_forward(m, m->tp.sp_lnf, m->lnf_mean, m->lnf_rstd, x, m->p.lnf_w, m->p.lnf_b, S);
        sp_gather(m, m->lnf, m->tp.sp_lnf, S, m->act_bytes);
    } else {
        norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, x, m->p.lnf_w, m->p.lnf_b, N);
    }
    int R = head_rows(m, N);
    m->head_scale = 0.0f;
    m->n_targets = 0;
    for (int n = 0; targets && n < N; n++) {
        if (targets[n] == CE_NO_TARGET) continue;
        if (targets[n] < 0 || targets[n] >= c->vocab_size)
            die(EXIT_INTERNAL, "crossentropy: target %d out of range [0, %d)", targets[n], c->vocab_size);
        m->n_targets++;
    }
    int end = m->logits_end > 0 && m->logits_end < N ? m->logits_end : N;
    m->logits_row0 = targets ? 0 : end < R ? 0 : end - R;
    if (targets && !m->forward_only && m->loss_scale != 0.0f) {
        /* a training forward: the backward of the final chunk starts here,
         * with the LM head's (so no POST_FORWARD: the chunk stays for the
         * backward, which ends it) */
        chunk_event(m, L + 1, CHUNK_PRE_BACKWARD);
        if (tied) chunk_event(m, 0, CHUNK_PRE_BACKWARD); /* the LM head writes wte's gradient; POST after the embedding */
        head_train(m, N, m->loss_scale);
        return forward_loss(m, N);
    }
    if (!targets) /* the logits of the R rows up to end (sampling reads the last one) */
        k->matmul_forward_a(m->logits, act_at(m, m->lnf, (size_t)m->logits_row0 * C), m->p.lm_head, NULL, R, C, m->V);
    else
        for (int r0 = 0; r0 < N; r0 += R) /* full logits never exist when R < N */
            head_forward(m, r0, N - r0 < R ? N - r0 : R, 0.0f);
    if (tied) chunk_event(m, 0, CHUNK_POST_FORWARD);
    chunk_event(m, L + 1, CHUNK_POST_FORWARD);
    if (!targets) return NAN;
    return forward_loss(m, N);
}

void model_logits_to_host(const Model *m, int row, int n, float *dst) {
    size_t cnt = (size_t)n * m->V;
    const float *src = act_at(m, m->logits, (size_t)row * m->V);
    if (m->act_bytes == (int)sizeof(float)) {
        m->k->to_host(dst, src, cnt * sizeof(float));
        return;
    }
    /* bf16 words into the upper half of dst, widened there in place by the
     * CPU backend (host memory is its memory) */
    uint16_t *w = (uint16_t *)(void *)dst + cnt;
    m->k->to_host(w, src, cnt * sizeof(uint16_t));
    kernels_cpu()->unpack_bf16(dst, w, cnt);
}

float model_forward(Model *m, const int *tokens, const int *targets) {
    return model_forward_bt(m, tokens, targets, m->B, m->T);
}

/* d(residual stream) of all N rows for a product that reads them: m->dres,
 * or under sequence parallelism every TP rank's S rows of it gathered into
 * sp_dgath. */
static const float *dres_rows(Model *m, int S) {
    if (!m->tp.sp) return m->dres;
    sp_gather(m, m->tp.sp_dgath, m->dres, S, (int)sizeof(float));
    return m->tp.sp_dgath;
}

void model_backward(Model *m, float loss_scale) {
    const Kernels *k = m->k;
    const ModelConfig *c = &m->cfg;
    int B = m->cur_B, T = m->cur_T, N = B * T, S = sp_rows(m, N), C = c->n_embd, F = m->F;
    int nh = m->nh, hd = m->hd;
    int llama = c->arch == ARCH_LLAMA, tp = m->tp.size > 1;
    int L = c->n_layer, tied = c->tie_embeddings;

    /* the training forward ran the LM head's backward (head_train) */
    if (m->head_scale == 0.0f)
        die(EXIT_INTERNAL, "model_backward: the last forward was not a training forward (targets, model.loss_scale set, not forward_only)");
    if (loss_scale != m->head_scale)
        die(EXIT_INTERNAL, "model_backward: loss_scale %g, but the forward's cross-entropy took %g", (double)loss_scale,
            (double)m->head_scale);
    m->head_scale = 0.0f;
    /* d(lnf) is partial over the vocabulary slices; m->dres, d(residual
     * stream), has S rows (N but under sequence parallelism), and where a
     * product reads all N rows of it, sp_dgath gathers them (dres_rows) */
    const float *dlnf = tp ? tp_reduce_rows(m, m->dlnf, N, S) : m->dlnf;
    const float *xL = c->n_layer > 0 ? m->la[c->n_layer - 1].res3 : m->encoded;
    k->zero(m->dres, (size_t)S * C * sizeof(float));
    norm_backward_rows(m, m->dres, m->dres_a, m->g.lnf_w, m->g.lnf_b, dlnf, xL, m->p.lnf_w, m->lnf_mean, m->lnf_rstd, S);
    chunk_event(m, L + 1, CHUNK_POST_BACKWARD);

    for (int l = L - 1; l >= 0; l--) {
        chunk_event(m, l + 1, CHUNK_PRE_BACKWARD);
        if (m->offload.on) offload_pre_backward(m, l);
        const LayerPtrs *w = &m->p.layers[l];
        const LayerPtrs *g = &m->g.layers[l];
        const LayerActs *a = &m->la[l];
        const float *x = l > 0 ? m->la[l - 1].res3 : m->encoded;
        /* deterministic: the same values again, each just before its first
         * reader (ln1's after the attention's backward); not for the last
         * layer, whose forward's values still fill the shared buffers (the
         * final norm and the LM head write buffers of their own) */
        const int again = l < L - 1;
        const int rc = again && m->act_ckpt == ACT_SELECTIVE ? m->recompute : 0;
        const int moe = moe_layer(c, l);
        if (again && m->act_ckpt == ACT_FULL) {
            m->moe.recomputing = 1; /* the same routing again; its statistics are the forward's */
            layer_forward(m, l, x, B, T);
            m->moe.recomputing = 0;
        }
        fp8_scope(m, 1); /* (after the recompute's layer_forward, which ends its own) */
        if ((rc & RC_NORM) && a->qkn) qk_forward(m, &m->la[l], w, B, T); /* attention's input, first */
        if (rc & RC_ATTENTION) attn_forward(m, &m->la[l], B, T);
        if ((rc & RC_MLP_ACT) && !moe) {
            if (llama) k->swiglu_forward(a->fch_act, a->fch, N, F);
            else k->gelu_forward(a->fch_act, a->fch, (size_t)N * F);
        }
        /* MLP block; m->dres holds d(res3) and becomes d(res2) */
        /* d(fch) into dbuf2 (overwritten: the down-projection's backward and
         * the activation's in one call), [a]: the up-projection's backward
         * reads it as it is (Llama has no biases: NULL) */
        const float *dout = dres_rows(m, S), *dln;
        if (moe) {
            if (rc & RC_NORM) norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b, S);
            dln = moe_block_backward(m, l, dout, tp_gather_rows(m, a->ln2, S), N, S, rc);
        } else {
            fp8_linear(m, FP8_ROW);
            if (llama)
                k->matmul_swiglu_backward(m->dbuf2, g->proj_w, g->proj_b, dout, m->dres_a, a->fch_act, w->proj_w, a->fch,
                                          N, F, C);
            else
                k->matmul_gelu_backward(m->dbuf2, g->proj_w, g->proj_b, dout, m->dres_a, a->fch_act, w->proj_w, a->fch, N, F,
                                        C);
            if (rc & RC_NORM) norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b, S);
            fp8_linear(m, FP8_COLUMN);
            k->matmul_backward_a(m->dbuf1, g->fc_w, g->fc_b, m->dbuf2, tp_gather_rows(m, a->ln2, S), w->fc_w, N, C,
                                 m->fc_dim);
            /* column-parallel: partial input gradient */
            dln = tp ? tp_reduce_rows(m, m->dbuf1, N, S) : m->dbuf1;
        }
        norm_backward_rows(m, m->dres, m->dres_a, g->ln2_w, g->ln2_b, dln, a->res2, w->ln2_w, a->ln2_mean, a->ln2_rstd, S);
        /* attention block; m->dres becomes d(x); d(atty) in dbuf1 and d(qkv)
         * in dbuf2 are [a] */
        fp8_linear(m, FP8_ROW);
        k->matmul_backward_dinp_a(m->dbuf1, g->attn_out_w, g->attn_out_b, dres_rows(m, S), m->dres_a, a->atty,
                                  w->attn_out_w, N, nh * hd, C);
        attn_backward(m, m->dbuf2, m->dbuf1, a, B, T);
        qk_backward(m, m->dbuf2, a, w, g, B, T);
        if (rc & RC_NORM) norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, S);
        fp8_linear(m, FP8_COLUMN);
        k->matmul_backward_a(m->dbuf1, g->qkv_w, g->qkv_b, m->dbuf2, tp_gather_rows(m, a->ln1, S), w->qkv_w, N, C, m->qkv_dim);
        dln = tp ? tp_reduce_rows(m, m->dbuf1, N, S) : m->dbuf1;
        /* (the embeddings' backward reads dres as it is: no copy below layer 0) */
        norm_backward_rows(m, m->dres, l > 0 ? m->dres_a : NULL, g->ln1_w, g->ln1_b, dln, x, w->ln1_w, a->ln1_mean,
                           a->ln1_rstd, S);
        fp8_scope(m, 0);
        chunk_event(m, l + 1, CHUNK_POST_BACKWARD);
    }
    if (!tied) chunk_event(m, 0, CHUNK_PRE_BACKWARD);
    if (tp) k->embed_backward_vp(m->g.wte, m->g.wpe, dres_rows(m, S), m->tokens, positions(m), N, T, C, m->tp.v0, m->V);
    else k->embed_backward(m->g.wte, m->g.wpe, m->dres, m->tokens, positions(m), N, T, C);
    chunk_event(m, 0, CHUNK_POST_BACKWARD);
}

double model_flops_per_token(const ModelConfig *c, int T) {
    /* 6 FLOPs per parameter that takes part in a matrix product (forward
     * 2, backward 4), plus attention's scores and weighted sum, 12*L*C*T
     * (PaLM's count, with n_head * head_dim for C; causal masking is not
     * subtracted). */
    double C = c->n_embd, hd = c->head_dim > 0 ? c->head_dim : C / c->n_head, A = c->n_head * hd;
    double qkv = (c->n_head + 2.0 * c->n_kv_head) * hd;
    double fc = c->arch == ARCH_LLAMA ? 2.0 * c->ffn_hidden : c->ffn_hidden;
    double attn = qkv * C + A * C, mlp = fc * C + c->ffn_hidden * C;
    double matmul_params = (double)c->vocab_size * C;
    for (int l = 0; l < c->n_layer; l++) /* an MoE layer's active parameters: the router, k experts, the shared */
        matmul_params += attn + (moe_layer(c, l) ? moe_active_mlp_params(c, l) : mlp);
    return 6.0 * matmul_params + 12.0 * c->n_layer * A * T; /* A = C but under model.head_dim */
}
