/* cp.h — context parallelism's side of the model: which positions of a
 * sequence a rank's rows are, and attention over the context group as a
 * ring of key/value blocks (orchestration over kernels.h and
 * ModelComm.cp_shift, as model.c: no element touched, no MPI). */
#ifndef LLMTRAIN_CP_H
#define LLMTRAIN_CP_H
#include <stddef.h>
#include "model.h"

/* parallel.context_mode */
enum { CP_RING = 0, CP_ALL_GATHER = 1 };
/* Turn context parallelism on for a built model (its T is seq_len / cp):
 * rank cp_rank of cp holds chunks cp_rank and 2 cp - 1 - cp_rank of each
 * sequence; allocates the buffers of mode (CP_RING, CP_ALL_GATHER). cp 1:
 * nothing. */
void cp_setup(Model *m, int cp, int cp_rank, int mode);
/* The position in its sequence of local row i (0 <= i < T of the model's
 * rows per sequence) of context rank r of cp: chunks of T/2 tokens. */
static inline int cp_pos(int i, int T, int cp, int r) {
    int Tc = T / 2;
    return (i < Tc ? r : 2 * cp - 1 - r) * Tc + i % Tc;
}
/* Bytes of the buffers for a model of m's shape under cp and mode (0 for
 * cp 1): the ring's 2 x (block + gradient) + a gradient, all_gather's
 * (cp + 1) x (block + gradient). `llmtrain check` and the start-up report count them with
 * the activations. */
double cp_ring_bytes(const Model *m, int cp, int mode);
/* Attention of this rank's rows over the whole sequence (ring: cp - 1
 * shifts of the k|v block; all_gather: one all-gather of the blocks): out
 * [B*T, nh hd] and lse as attention_forward's; qstart: each row's document
 * start in the sequence (NULL: plain causal). */
void cp_attention_forward(Model *m, float *out, float *lse, const float *qkv, const int *qstart, int B, int T);
/* Its backward: dqkv (overwritten) from dout and the forward's out and
 * lse; ring: the k|v block and its gradient go round the ring again, each
 * block's gradient arriving back at its owner; all_gather: the blocks
 * gathered again, their gradients reduce-scattered to their owners. */
void cp_attention_backward(Model *m, float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                           const int *qstart, int B, int T);

#endif
