/* layout.h — the job's parallel layout: its checks (every start and
 * `llmtrain check`, with the same messages), the ranks' agreement on the
 * job, the backend each rank runs on, and the bytes each rank holds under
 * the layout (the start-up report and `llmtrain check`'s estimate). */
#ifndef LLMTRAIN_LAYOUT_H
#define LLMTRAIN_LAYOUT_H
#include "config.h"
#include "kernels.h"
#include "model.h"
#include "parallel.h"
#include "shard.h"

/* Every rank reads the same job (a hash of config_canonical's text): else
 * exit 2 on every rank, naming the first rank that differs, its host and
 * its first differing key. */
void layout_check_same_job(const Config *c, Dist *d);
/* Validate the parallel layout for d->world ranks (sets d's tp), bind the
 * sharding runtime to the job, its groups and model, and derive its S,
 * sharded and reshard; returns the micro-batches per rank per step at
 * train.global_batch (and fills a global_batch of 0). Arithmetic only (no
 * collectives), so `llmtrain check` runs it for any world size. */
int layout_check(Sharding *sh, Config *c, Dist *d, Model *m);
/* train.device: the backend this rank runs on (collective when several
 * ranks may use CUDA; one line and exit 2 when "cuda" cannot be had). */
const Kernels *layout_select_backend(const Config *c, Dist *d);
/* train.compute_dtype bf16 on CUDA: bf16 GEMMs and [a] activations. */
int layout_cuda_bf16(const Config *c);
/* The CUDA backend's scratch beside the layout's buffers, as the backend
 * sizes it (kernels_cuda_scratch_bytes) for this rank's local model. */
double layout_cuda_scratch_bytes(const Sharding *sh);
/* This rank's bytes of working parameters, fp32 master weights,
 * gradients, optimizer state and activations (on the device), activations
 * offloaded to host memory, and on the CUDA backend (k) its scratch: from
 * the layout table alone, so a model that is never allocated is sized. */
#define LAYOUT_RANK_BYTES 7
void layout_rank_bytes(const Sharding *sh, const Kernels *k, double out[LAYOUT_RANK_BYTES]);
/* " offload_host_bytes N" when bytes > 0, else "" (in buf). */
const char *layout_offload_field(double bytes, char *buf, size_t n);
/* Rank 0 prints the groups and every rank's bytes (collective). */
void layout_print(const Sharding *sh, const Kernels *k);

#endif
