/* moe.h — the mixture-of-experts MLP of a layer (Mixtral, Qwen3-MoE,
 * DeepSeek-style shared experts): the router, top-k routing with an
 * optional capacity, the experts' SwiGLU products over the tokens
 * permuted to them, the load-balancing and z losses, and the statistics
 * the trainer logs. Orchestration only, as model.c: kernels.h does the
 * arithmetic. docs/moe.md has the formulas. */
#ifndef LLMTRAIN_MOE_H
#define LLMTRAIN_MOE_H
#include "model.h"

/* Model.moe's geometry from the model config (model_layout). */
void moe_plan(Model *m);
/* Expert parallelism: this rank computes experts [ep_rank E/ep, +E/ep)
 * of its expert group's ep ranks (1: all), for micro-batches of N rows
 * (model_plan_tp, before the activations are carved: it sets their rows). */
void moe_set_ep(Model *m, int ep, int ep_rank, int N, float capacity);
/* Host state for micro-batch rows N (model_build_tp), and its release. */
void moe_alloc(Model *m, int N);
void moe_free(Model *m);
/* The balance options of train.*: capacity factor (0: dropless), the
 * load-balancing loss's and the z-loss's coefficients. */
void moe_set_losses(Model *m, float capacity_factor, float aux_coef, float z_coef);
/* Layer l's MoE MLP over N rows: out = res (NULL: 0) + shared(ln) +
 * sum over the chosen experts of weight x expert(ln); out may alias res.
 * ln is [a]. The routing is the layer's until its next forward. */
void moe_forward(Model *m, int l, float *out, const float *res, const float *ln, int N);
/* Its backward: dln (OVERWRITTEN, fp32, [N, C]) from dout, plus the
 * weights' gradients; the balance losses' gradients (scaled by
 * m->moe.aux_scale) enter through the router. rc: RC_MLP_ACT to
 * recompute the experts' activation first. */
void moe_backward(Model *m, int l, float *dln, const float *dout, const float *ln, int N, int rc);
/* Aux-loss-free balancing: rate (0: off) of moe_bias_update. */
void moe_set_bias_rate(Model *m, float rate);
/* After a step: each MoE layer's bias b_e += rate * sign(mean_e' c_e' -
 * c_e), counts[l][e] (c) the step's choices over every rank (the sum of
 * m->moe.step_counts over them). */
void moe_bias_update(Model *m, const double *counts);
/* Install biases read from a checkpoint (n floats: n_layer x E, or 0: none
 * saved, zeros); exit 2 when n is another model's. */
void moe_bias_install(Model *m, const float *bias, int n, const char *from);
/* Clear the statistics the training forwards gather. */
void moe_stats_reset(Model *m);
/* Active parameters a token's products use (the router, k experts and
 * the shared ones in MoE layers), for the FLOPs: model_flops_per_token. */
double moe_active_mlp_params(const ModelConfig *c, int l);

#endif
