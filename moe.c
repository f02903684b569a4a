/* moe.c — a layer's mixture-of-experts MLP over flat arrays: the router
 * (a linear, softmax, top-k, renormalised or not), the routing of the
 * (token, choice) pairs to their experts on the host (counts, an
 * optional capacity that drops overflow first come first served), the
 * experts' SwiGLU products expert by expert over their tokens' rows, the
 * shared experts, and the load-balancing and z losses, whose gradients
 * enter through the router's backward. Orchestration only: kernels.h
 * does the arithmetic, and statistics that span ranks go through the
 * model's comm. */
#include "moe.h"
#include "util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int moe_dense_next(const char **p, long *v) {
    while (**p == ' ' || **p == ',') (*p)++;
    if (!**p) return 0;
    char *end;
    *v = strtol(*p, &end, 10);
    if (end == *p) return -1;
    *p = end;
    return **p && **p != ',' && **p != ' ' ? -1 : 1;
}

int moe_layer(const ModelConfig *m, int l) {
    if (m->moe_experts <= 0 || (l + 1) % (m->moe_layer_freq > 0 ? m->moe_layer_freq : 1) != 0) return 0;
    long v;
    for (const char *p = m->moe_dense_layers; moe_dense_next(&p, &v) > 0;)
        if (v == l) return 0;
    return 1;
}

int moe_layer_count(const ModelConfig *m) {
    int n = 0;
    for (int l = 0; l < m->n_layer; l++) n += moe_layer(m, l);
    return n;
}

void moe_plan(Model *m) {
    const ModelConfig *c = &m->cfg;
    ModelMoE *x = &m->moe;
    memset(x, 0, sizeof *x);
    x->n_layers = moe_layer_count(c);
    if (!x->n_layers) return;
    x->on = 1;
    x->E = c->moe_experts;
    x->k = c->moe_top_k;
    x->F = c->moe_ffn_hidden;
    x->Fs = c->moe_shared_experts * c->moe_ffn_hidden;
    x->norm_topk = c->moe_norm_topk;
    x->aux_scale = 1.0f;
    while (!moe_layer(c, x->first)) x->first++;
}

void moe_set_ep(Model *m, int ep, int ep_rank, int N, float capacity) {
    ModelMoE *x = &m->moe;
    if (!x->on) return;
    if (ep < 1 || x->E % ep || ep_rank < 0 || ep_rank >= ep)
        die(EXIT_INTERNAL, "moe_set_ep: expert-parallel degree %d (rank %d) does not divide %d experts", ep, ep_rank, x->E);
    x->ep = ep;
    x->ep_rank = ep_rank;
    x->El = x->E / ep;
    x->R = (size_t)ep * N * x->k; /* every member's every choice to this rank's experts: the dropless bound */
    if (capacity > 0) { /* ... or what the capacity lets this rank's experts take from the ep members */
        size_t cap = (size_t)ceil((double)capacity * N * x->k / x->E), most = (size_t)x->E * cap;
        if (most < x->R) x->R = most;
    }
}

void moe_alloc(Model *m, int N) {
    ModelMoE *x = &m->moe;
    if (!x->on) return;
    size_t L = (size_t)m->cfg.n_layer, E = (size_t)x->E, Nk = (size_t)N * x->k;
    x->counts = calloc_check(L * E, sizeof(int));
    x->kept = calloc_check(L * E, sizeof(int));
    x->idx_host = calloc_check(Nk, sizeof(int));
    x->src_host = calloc_check(Nk, sizeof(int));
    x->slot_host = calloc_check(Nk, sizeof(int));
    x->stats = calloc_check(2 * E, sizeof(double));
    x->psum_host = calloc_check(E, sizeof(float));
    x->fill = calloc_check(2 * E, sizeof(int));
    x->load = calloc_check(L, sizeof(double));
    x->f = calloc_check(L * E, sizeof(double));
    x->bias = calloc_check(L * E, sizeof(float));
    x->step_counts = calloc_check(L * E, sizeof(double));
    x->bias_dev = m->k->alloc(L * E * sizeof(float)); /* zero-filled */
    if (x->ep > 1) {
        x->rc = calloc_check(L * E, sizeof(int)); /* ep x El = E a layer */
        x->a2a = calloc_check(4 * (size_t)x->ep, sizeof(size_t));
    }
}

void moe_free(Model *m) {
    ModelMoE *x = &m->moe;
    free(x->counts); free(x->kept); free(x->idx_host); free(x->src_host); free(x->slot_host);
    free(x->stats); free(x->psum_host); free(x->load); free(x->f); free(x->rc); free(x->a2a); free(x->bias);
    free(x->step_counts);
    free(x->fill);
    x->fill = NULL;
    if (x->bias_dev) m->k->free(x->bias_dev);
    x->bias = x->bias_dev = NULL;
    x->step_counts = NULL;
    x->f = NULL;
    x->rc = NULL;
    x->a2a = NULL;
    x->counts = x->kept = x->idx_host = x->src_host = x->slot_host = NULL;
    x->stats = NULL;
    x->psum_host = NULL;
    x->load = NULL;
}

void moe_set_losses(Model *m, float capacity_factor, float aux_coef, float z_coef) {
    m->moe.capacity_factor = capacity_factor;
    m->moe.aux_coef = aux_coef;
    m->moe.z_coef = z_coef;
}

void moe_set_bias_rate(Model *m, float rate) { m->moe.bias_rate = rate; }

void moe_bias_update(Model *m, const double *counts) {
    ModelMoE *x = &m->moe;
    if (!x->on || x->bias_rate <= 0) return;
    int E = x->E;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        if (!moe_layer(&m->cfg, l)) continue;
        const double *c = counts + (size_t)l * E;
        double mean = 0;
        for (int e = 0; e < E; e++) mean += c[e] / E;
        for (int e = 0; e < E; e++)
            x->bias[(size_t)l * E + e] += c[e] < mean ? x->bias_rate : c[e] > mean ? -x->bias_rate : 0.0f;
    }
    m->k->from_host(x->bias_dev, x->bias, (size_t)m->cfg.n_layer * E * sizeof(float));
}

void moe_bias_install(Model *m, const float *bias, int n, const char *from) {
    ModelMoE *x = &m->moe;
    if (!x->on || n == 0) return;
    size_t want = (size_t)m->cfg.n_layer * x->E;
    if ((size_t)n != want)
        die(EXIT_USAGE, "%s: moe_bias has %d values, expected %zu (n_layer %d x moe_experts %d)", from, n, want, m->cfg.n_layer, x->E);
    memcpy(x->bias, bias, want * sizeof(float));
    m->k->from_host(x->bias_dev, x->bias, want * sizeof(float));
}

void moe_stats_reset(Model *m) {
    ModelMoE *x = &m->moe;
    if (x->step_counts) memset(x->step_counts, 0, (size_t)m->cfg.n_layer * x->E * sizeof(double));
    x->aux_sum = x->z_sum = 0.0;
    x->forwards = x->dropped = x->routed = 0;
    if (x->load) memset(x->load, 0, (size_t)m->cfg.n_layer * sizeof(double));
}

/* element i of an [a] buffer */
static float *act_at(const Model *m, const float *base, size_t i) {
    return (float *)((char *)base + i * (size_t)m->act_bytes);
}

/* The tokens of one micro-batch, wherever its rows sit: this rank's N
 * times the context group's size. */
static double mb_tokens(const Model *m, int N) { return (double)N * (m->cp.size > 1 ? m->cp.size : 1); }

/* The host side of the routing: from the chosen experts (idx), each
 * expert's count, the capacity's cut, and the permuted layout: expert by
 * expert, tokens in order; slot[n k + j] the row of token n's choice j
 * (-1: dropped), src[r] the token of row r. Returns the rows. */
static int route_host(Model *m, int l, int N) {
    ModelMoE *x = &m->moe;
    int E = x->E, k = x->k, *cnt = x->counts + (size_t)l * E, *kept = x->kept + (size_t)l * E;
    long cap = x->capacity_factor > 0 ? (long)ceil((double)x->capacity_factor * N * k / E) : (long)N * k;
    memset(cnt, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < N * k; i++) {
        int e = x->idx_host[i];
        if (e < 0 || e >= E) die(EXIT_INTERNAL, "moe: layer %d routed a token to expert %d of %d", l, e, E);
        cnt[e]++;
    }
    int rows = 0;
    for (int e = 0; e < E; e++) {
        kept[e] = cnt[e] < cap ? cnt[e] : (int)cap;
        rows += kept[e];
    }
    /* each choice in token order takes its expert's next row, while the expert has room */
    int *fill = x->fill, *start = x->fill + E;
    for (int e = 0, r = 0; e < E; e++) { start[e] = fill[e] = r; r += kept[e]; }
    for (int i = 0; i < N * k; i++) {
        int e = x->idx_host[i];
        if (fill[e] - start[e] < kept[e]) {
            x->slot_host[i] = fill[e];
            x->src_host[fill[e]] = i / k;
            fill[e]++;
        } else {
            x->slot_host[i] = -1;
        }
    }
    return rows;
}

/* The balance statistics of the layer's forward, over the whole
 * micro-batch: the counts and summed probabilities (all-reduced over the
 * ranks that hold parts of it), into x->stats [counts | psum]. */
static void layer_stats(Model *m, int l, const float *probs, int N) {
    ModelMoE *x = &m->moe;
    int E = x->E;
    double tokens = mb_tokens(m, N);
    m->k->moe_colsum(x->psum, probs, N, E);
    m->k->to_host(x->psum_host, x->psum, (size_t)E * sizeof(float));
    for (int e = 0; e < E; e++) {
        x->stats[e] = x->counts[(size_t)l * E + e];
        x->stats[E + e] = x->psum_host[e];
    }
    if (m->cp.size > 1 && m->comm.mb_allreduce) m->comm.mb_allreduce(m->comm.ctx, x->stats, 2 * (size_t)E);
    for (int e = 0; e < E; e++) x->f[(size_t)l * E + e] = x->stats[e] / (tokens * x->k);
}

/* The load-balancing loss of the layer from x->stats: E sum_e f_e P_e with
 * f_e the share of the micro-batch's choices routed to e and P_e the mean
 * router probability (uniform routing gives 1). */
static double aux_value(const Model *m, double tokens) {
    const ModelMoE *x = &m->moe;
    double s = 0.0;
    for (int e = 0; e < x->E; e++) s += x->stats[e] / (tokens * x->k) * (x->stats[x->E + e] / tokens);
    return x->E * s;
}

/* The rows this rank's experts compute for layer l, as E blocks in order:
 * block b is expert *e's *n rows. Without expert parallelism, each
 * expert's kept choices; with it, member i's rows for local expert q
 * (b = i El + q), as they arrived. */
static void block(const Model *m, int l, int b, int *e, int *n) {
    const ModelMoE *x = &m->moe;
    if (x->ep > 1) {
        *e = x->ep_rank * x->El + b % x->El;
        *n = x->rc[(size_t)l * x->E + b];
    } else {
        *e = b;
        *n = x->kept[(size_t)l * x->E + b];
    }
}

static size_t block_rows(const Model *m, int l) {
    size_t r = 0;
    for (int b = 0, e, n; b < m->moe.E; b++) { block(m, l, b, &e, &n); r += (size_t)n; }
    return r;
}

/* Expert parallelism: the counts of layer l's rows for each member's
 * experts, exchanged (rc: what each member sends this rank's experts). */
static void ep_counts(Model *m, int l) {
    ModelMoE *x = &m->moe;
    size_t *send = x->a2a, *recv = x->a2a + x->ep;
    for (int q = 0; q < x->El; q++) {
        for (int j = 0; j < x->ep; j++) send[j] = (size_t)x->kept[(size_t)l * x->E + j * x->El + q];
        m->comm.ep_counts(m->comm.ctx, send, recv);
        for (int i = 0; i < x->ep; i++) x->rc[(size_t)l * x->E + i * x->El + q] = (int)recv[i];
    }
    if (block_rows(m, l) > x->R) die(EXIT_INTERNAL, "moe: layer %d received %zu rows, room for %zu", l, block_rows(m, l), x->R);
}

/* The all-to-all of rows of C elements of es bytes: out (back 0) this
 * rank's permuted rows to the members that hold their experts, received
 * in block order; back (1) the received rows' results to where they came
 * from, into the permuted order. */
static void ep_exchange(Model *m, int l, const void *send, void *recv, size_t es, int back) {
    ModelMoE *x = &m->moe;
    int P = x->ep, El = x->El;
    size_t *sc = x->a2a, *sd = sc + P, *rcn = sc + 2 * P, *rd = sc + 3 * P, row = (size_t)m->cfg.n_embd * es;
    for (int j = 0; j < P; j++) {
        size_t mine = 0, theirs = 0; /* rows this rank sends member j; rows member j sends this rank */
        for (int q = 0; q < El; q++) {
            mine += (size_t)x->kept[(size_t)l * x->E + j * El + q];
            theirs += (size_t)x->rc[(size_t)l * x->E + j * El + q];
        }
        sc[j] = (back ? theirs : mine) * row;
        rcn[j] = (back ? mine : theirs) * row;
        sd[j] = j ? sd[j - 1] + sc[j - 1] : 0;
        rd[j] = j ? rd[j - 1] + rcn[j - 1] : 0;
    }
    m->comm.ep_alltoallv(m->comm.ctx, send, sc, sd, recv, rcn, rd);
}

/* The experts' products over rows X [a] (block order), into Y (fp32):
 * gate|up into a->xh, SwiGLU into a->xact. */
static void experts_forward(Model *m, int l, const float *X, float *Y) {
    const Kernels *k = m->k;
    LayerActs *a = &m->la[l];
    const LayerPtrs *w = &m->p.layers[l];
    int C = m->cfg.n_embd, F = m->moe.F;
    size_t rows = block_rows(m, l), r0 = 0;
    for (int b = 0, e, n; b < m->moe.E; b++) {
        block(m, l, b, &e, &n);
        if (!n) continue;
        k->matmul_forward_a(act_at(m, a->xh, r0 * 2 * F), act_at(m, X, r0 * C), w->exp_fc_w + (size_t)e * 2 * F * C, NULL, n, C,
                            2 * F);
        r0 += (size_t)n;
    }
    k->swiglu_forward(a->xact, a->xh, (int)rows, F);
    r0 = 0;
    for (int b = 0, e, n; b < m->moe.E; b++) {
        block(m, l, b, &e, &n);
        if (!n) continue;
        k->matmul_forward(Y + r0 * C, act_at(m, a->xact, r0 * F), w->exp_proj_w + (size_t)e * C * F, NULL, n, F, C);
        r0 += (size_t)n;
    }
}

/* Their backward: d(rows) into dX (fp32, OVERWRITTEN) from dY, the
 * weights' gradients added. */
static void experts_backward(Model *m, int l, const float *X, const float *dY, float *dX, int rc) {
    const Kernels *k = m->k;
    ModelMoE *x = &m->moe;
    const LayerActs *a = &m->la[l];
    const LayerPtrs *w = &m->p.layers[l], *g = &m->g.layers[l];
    int C = m->cfg.n_embd, F = x->F;
    size_t r0 = 0;
    if (rc & RC_MLP_ACT) k->swiglu_forward(a->xact, a->xh, (int)block_rows(m, l), F);
    for (int b = 0, e, n; b < x->E; b++) {
        block(m, l, b, &e, &n);
        if (!n) continue;
        float *dh = act_at(m, x->dh, r0 * 2 * F);
        k->matmul_swiglu_backward(dh, g->exp_proj_w + (size_t)e * C * F, NULL, dY + r0 * C, NULL, act_at(m, a->xact, r0 * F),
                                  w->exp_proj_w + (size_t)e * C * F, act_at(m, a->xh, r0 * 2 * F), n, F, C);
        k->matmul_backward_a(dX + r0 * C, g->exp_fc_w + (size_t)e * 2 * F * C, NULL, dh, act_at(m, X, r0 * C),
                             w->exp_fc_w + (size_t)e * 2 * F * C, n, C, 2 * F);
        r0 += (size_t)n;
    }
}

void moe_forward(Model *m, int l, float *out, const float *res, const float *ln, int N) {
    const Kernels *k = m->k;
    ModelMoE *x = &m->moe;
    LayerActs *a = &m->la[l];
    const LayerPtrs *w = &m->p.layers[l];
    int C = m->cfg.n_embd, E = x->E, K = x->k;
    if (!k->moe_route) die(EXIT_USAGE, "model.moe_experts: the %s backend has no mixture-of-experts kernels yet", k->name);
    /* the router: fp32 logits, softmax, top-k */
    k->matmul_forward(x->logits, ln, w->router_w, NULL, N, C, E);
    k->moe_route(a->probs, a->mlse, a->idx, a->wts, x->logits, x->bias_rate > 0 ? x->bias_dev + (size_t)l * E : NULL, N, E, K,
                 x->norm_topk);
    k->to_host(x->idx_host, a->idx, (size_t)N * K * sizeof(int));
    int rows = route_host(m, l, N);
    k->from_host(a->slot, x->slot_host, (size_t)N * K * sizeof(int));
    k->from_host(a->src, x->src_host, (size_t)rows * sizeof(int));
    if (!x->recomputing && !m->forward_only) {
        layer_stats(m, l, a->probs, N);
        if (l == x->first) x->forwards++;
        for (int e = 0; e < E; e++) x->step_counts[(size_t)l * E + e] += x->counts[(size_t)l * E + e];
        double tokens = mb_tokens(m, N), lse2 = k->sumsq(a->mlse, (size_t)N);
        if (m->cp.size > 1 && m->comm.mb_allreduce) m->comm.mb_allreduce(m->comm.ctx, &lse2, 1);
        x->aux_sum += aux_value(m, tokens) / x->n_layers;
        x->z_sum += lse2 / tokens / x->n_layers;
        double most = 0.0, all = 0.0;
        for (int e = 0; e < E; e++) {
            most = x->stats[e] > most ? x->stats[e] : most;
            all += x->stats[e];
        }
        x->load[l] += all > 0 ? most / (all / E) : 0.0;
        x->routed += (long)N * K;
        x->dropped += (long)N * K - rows;
    }
    /* the experts, each over its rows (expert parallelism: those of the
     * members' rows for this rank's experts, sent and their results
     * returned, in fp32) */
    k->moe_permute(x->xp, ln, a->src, rows, C);
    if (x->ep > 1) {
        ep_counts(m, l);
        ep_exchange(m, l, x->xp, a->xr, (size_t)m->act_bytes, 0);
        experts_forward(m, l, a->xr, x->ybuf);
        ep_exchange(m, l, x->ybuf, a->yp, sizeof(float), 1);
    } else {
        experts_forward(m, l, x->xp, a->yp);
    }
    /* the shared experts, then the routed ones' weighted sum */
    if (x->Fs) {
        k->matmul_forward_a(a->sh_h, ln, w->sh_fc_w, NULL, N, C, 2 * x->Fs);
        k->swiglu_forward(a->sh_act, a->sh_h, N, x->Fs);
        if (res && res != out) k->matmul_forward_res(out, res, a->sh_act, w->sh_proj_w, NULL, N, x->Fs, C);
        else if (res) { /* out aliases res: the product apart, then added */
            k->matmul_forward(x->dyp, a->sh_act, w->sh_proj_w, NULL, N, x->Fs, C);
            k->add(out, out, x->dyp, (size_t)N * C);
        } else k->matmul_forward(out, a->sh_act, w->sh_proj_w, NULL, N, x->Fs, C);
        res = out;
    }
    k->moe_combine(out, res, a->yp, a->wts, a->slot, N, K, C);
}

void moe_backward(Model *m, int l, float *dln, const float *dout, const float *ln, int N, int rc) {
    const Kernels *k = m->k;
    ModelMoE *x = &m->moe;
    const LayerActs *a = &m->la[l];
    const LayerPtrs *w = &m->p.layers[l], *g = &m->g.layers[l];
    int C = m->cfg.n_embd, E = x->E, K = x->k;
    /* the weighted sum's backward: d(expert outputs), d(weights); then the
     * experts' (expert parallelism: the gradients of the rows sent out go
     * to the members that computed them and back) */
    k->moe_combine_backward(x->dyp, x->dwts, dout, a->yp, a->wts, a->slot, N, K, C);
    if (x->ep > 1) {
        ep_exchange(m, l, x->dyp, x->ybuf, sizeof(float), 0);
        experts_backward(m, l, a->xr, x->ybuf, x->dxr, rc);
        ep_exchange(m, l, x->dxr, x->dxp, sizeof(float), 1);
    } else {
        int rows = 0;
        for (int e = 0; e < E; e++) rows += x->kept[(size_t)l * E + e];
        k->moe_permute(x->xp, ln, a->src, rows, C); /* the experts' input rows again */
        experts_backward(m, l, x->xp, x->dyp, x->dxp, rc);
    }
    /* the router, with the balance losses: d(probs) = aux_scale coef / n_layers
     * E f_e / tokens for every token; the z-loss's per-token coefficient */
    double tokens = mb_tokens(m, N);
    const float *dprob = NULL;
    if (x->aux_coef > 0) { /* f_e: the layer's training forward's */
        float *h = x->psum_host;
        for (int e = 0; e < E; e++)
            h[e] = (float)((double)x->aux_scale * x->aux_coef / x->n_layers * E * x->f[(size_t)l * E + e] / tokens);
        k->from_host(x->dprob, h, (size_t)E * sizeof(float));
        dprob = x->dprob;
    }
    float dz = (float)((double)x->aux_scale * x->z_coef / x->n_layers / tokens);
    k->moe_route_backward(x->dlogits, a->probs, a->mlse, a->idx, a->wts, x->dwts, dprob, dz, N, E, K, x->norm_topk);
    k->matmul_backward(dln, g->router_w, NULL, x->dlogits, ln, w->router_w, N, C, E);
    k->moe_unpermute_add(dln, x->dxp, a->slot, N, K, C);
    if (x->Fs) {
        if (rc & RC_MLP_ACT) k->swiglu_forward(a->sh_act, a->sh_h, N, x->Fs);
        k->matmul_swiglu_backward(x->dh, g->sh_proj_w, NULL, dout, NULL, a->sh_act, w->sh_proj_w, a->sh_h, N, x->Fs, C);
        k->matmul_backward_a(x->dxp, g->sh_fc_w, NULL, x->dh, ln, w->sh_fc_w, N, C, 2 * x->Fs);
        k->add(dln, dln, x->dxp, (size_t)N * C);
    }
}

double moe_active_mlp_params(const ModelConfig *c, int l) {
    double C = c->n_embd;
    if (!moe_layer(c, l)) return 3.0 * c->ffn_hidden * C;
    double Fe = c->moe_ffn_hidden, Fs = (double)c->moe_shared_experts * Fe;
    return (double)c->moe_experts * C + c->moe_top_k * 3.0 * Fe * C + 3.0 * Fs * C;
}
