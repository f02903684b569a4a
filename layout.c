/* layout.c — the job's parallel layout (see layout.h): its checks, the
 * ranks' agreement on the job, the backend each rank runs on, and what each
 * rank holds in memory under it (the start-up report and `llmtrain check`). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "layout.h"
#include "cp.h"
#include "util.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every rank must train the same job: a host whose copy of the job file
 * (or whose --set overrides, init.from config or llmtrain build) differs
 * would otherwise train other steps, another schedule or another model
 * than its peers, and the job would hang in a collective of another size
 * or its replicas drift apart without a word. The ranks compare a hash of
 * config_canonical's text (one all-gather of 8 bytes a rank); where one
 * differs, rank 0's text and host go to every rank, the first rank that
 * differs finds its first differing key and host into a line that reaches
 * every rank through one all-reduce (its bytes, the others' zeros), and
 * every rank ends with exit 2 and that line. */
#define JOB_DIFF_BYTES 768
void layout_check_same_job(const Config *c, Dist *d) {
    if (d->world == 1) return;
    char *text = config_canonical(c);
    size_t len = strlen(text) + 1;
    uint64_t h = fnv1a64(text);
    uint64_t *hashes = malloc_check((size_t)d->world * sizeof *hashes);
    dist_allgather(d, DIST_GROUP_WORLD, DIST_BYTE, &h, hashes, sizeof h);
    int differ = 0, first = 0;
    for (int r = d->world - 1; r >= 1; r--)
        if (hashes[r] != hashes[0]) differ++, first = r;
    free(hashes);
    if (!differ) {
        free(text);
        return;
    }
    uint64_t root_len = len;
    dist_bcast(d, DIST_GROUP_WORLD, &root_len, sizeof root_len);
    char *root = malloc_check((size_t)root_len), host0[64] = "", diff[JOB_DIFF_BYTES] = "";
    if (d->rank == 0) {
        memcpy(root, text, len);
        host_name(host0, sizeof host0);
    }
    dist_bcast(d, DIST_GROUP_WORLD, root, (size_t)root_len);
    dist_bcast(d, DIST_GROUP_WORLD, host0, sizeof host0);
    root[root_len - 1] = '\0';
    host0[sizeof host0 - 1] = '\0';
    if (d->rank == first) {
        char me[32], host[64], what[JOB_DIFF_BYTES - 256];
        snprintf(me, sizeof me, "on rank %d", d->rank);
        host_name(host, sizeof host);
        if (!config_canonical_diff(text, root, me, "on rank 0", what, sizeof what)) snprintf(what, sizeof what, "(no key differs?)");
        snprintf(diff, sizeof diff, "rank %d (host %.60s) reads another job than rank 0 (host %.60s): %s", d->rank, host, host0, what);
    }
    double *bytes = calloc_check(JOB_DIFF_BYTES, sizeof *bytes);
    for (int i = 0; i < JOB_DIFF_BYTES; i++) bytes[i] = (unsigned char)diff[i];
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, bytes, JOB_DIFF_BYTES);
    for (int i = 0; i < JOB_DIFF_BYTES; i++) diff[i] = (char)(unsigned char)bytes[i];
    diff[JOB_DIFF_BYTES - 1] = '\0';
    die(EXIT_USAGE, "%s: %s (%d of %d ranks differ from rank 0; expected every rank to read the same job file with the same --set "
        "overrides and run the same llmtrain build)", c->path, diff, differ, d->world);
}

int layout_check(Sharding *sh, Config *c, Dist *d, Model *m) {
    sh->cfg = c; /* the sharding runtime works on the trainer's job, groups and model */
    sh->dist = d;
    sh->model = m;
    const ModelConfig *mc = &c->model;
    if (d->world % c->tp != 0)
        die(EXIT_USAGE, "%s: parallel.tensor %d does not divide the %d rank%s", c->path, c->tp, d->world, d->world == 1 ? "" : "s");
    if (d->world % (c->tp * c->cp) != 0)
        die(EXIT_USAGE, "%s: parallel.tensor %d x parallel.context %d = %d does not divide the %d rank%s (world = tp x cp x dp)",
            c->path, c->tp, c->cp, c->tp * c->cp, d->world, d->world == 1 ? "" : "s");
    if (c->cp > 1 && c->seq_len % (2 * c->cp) != 0)
        die(EXIT_USAGE, "%s: train.seq_len %d is not divisible by 2 x parallel.context %d = %d (each sequence is cut into 2 cp "
            "equal chunks)", c->path, c->seq_len, c->cp, 2 * c->cp);
    if (c->cp > 1 && strcmp(c->device, "cuda") == 0 && mc->head_dim > 128)
        die(EXIT_USAGE, "%s: parallel.context %d with train.device \"%s\": head dim %d (the CUDA attention parts take head dims "
            "up to 128; expected train.device \"cpu\", or parallel.context 1)", c->path, c->cp, c->device, mc->head_dim);
    if (c->cp > 1 && c->debug_dump[0])
        die(EXIT_USAGE, "%s: debug.dump is not available with parallel.context %d (expected 1)", c->path, c->cp);
    if (mc->n_kv_head % c->tp != 0 || mc->n_head % c->tp != 0)
        die(EXIT_USAGE, "%s: model.n_kv_head %d (n_head %d) is not divisible by parallel.tensor %d", c->path, mc->n_kv_head,
            mc->n_head, c->tp);
    if (mc->ffn_hidden % c->tp != 0)
        die(EXIT_USAGE, "%s: model.ffn_hidden %d is not divisible by parallel.tensor %d", c->path, mc->ffn_hidden, c->tp);
    if (mc->vocab_size % c->tp != 0)
        die(EXIT_USAGE, "%s: model.vocab_size %d is not divisible by parallel.tensor %d; pad the vocabulary", c->path,
            mc->vocab_size, c->tp);
    if (c->seq_parallel && c->tp == 1)
        die(EXIT_USAGE, "%s: parallel.sequence_parallel needs parallel.tensor > 1 (it splits the TP group's rows; got tensor 1)",
            c->path);
    if (c->tp > 1 && c->debug_dump[0])
        die(EXIT_USAGE, "%s: debug.dump is not available with parallel.tensor %d (expected 1)", c->path, c->tp);
    if (c->ep > 1 && c->debug_dump[0])
        die(EXIT_USAGE, "%s: debug.dump is not available with parallel.expert %d (expected 1)", c->path, c->ep);
    /* expert groups: ep consecutive indices of the data-parallel x context
     * ranks (world / tp of them), innermost (parallel.h) */
    if (c->ep < 1) die(EXIT_USAGE, "%s: parallel.expert %d: expected an expert-parallel degree of at least 1", c->path, c->ep);
    if ((d->world / c->tp) % c->ep != 0)
        die(EXIT_USAGE, "%s: parallel.expert %d does not divide the %d data-parallel x context rank%s (world %d / parallel.tensor %d; "
            "an expert group is ep consecutive ones)", c->path, c->ep, d->world / c->tp, d->world / c->tp == 1 ? "" : "s", d->world,
            c->tp);
    dist_set_tp(d, c->tp);
    dist_set_cp(d, c->cp);
    if (c->ep > 1 && !c->model.moe_experts)
        die(EXIT_USAGE, "%s: parallel.expert %d: the model has no experts (model.moe_experts 0; expected parallel.expert 1)", c->path,
            c->ep);
    if (c->model.moe_experts % c->ep != 0)
        die(EXIT_USAGE, "%s: parallel.expert %d does not divide model.moe_experts %d (each rank of an expert group computes "
            "moe_experts / parallel.expert of them)", c->path, c->ep, c->model.moe_experts);
    dist_set_ep(d, c->ep);
    if (strcmp(c->strategy, "FULL_SHARD") == 0 || strcmp(c->strategy, "SHARD_GRAD_OP") == 0) {
        sh->S = d->dp;
    } else if (strcmp(c->strategy, "NO_SHARD") == 0) {
        sh->S = 1;
    } else if (strcmp(c->strategy, "HYBRID_SHARD") == 0 || strcmp(c->strategy, "HYBRID_SHARD_ZERO2") == 0) {
        sh->S = c->shard_degree > 0 ? c->shard_degree : d->dp;
        if (d->dp % sh->S != 0)
            die(EXIT_USAGE, "%s: parallel.shard_degree %d does not divide the %d data-parallel%s ranks (parallel.strategy %s)",
                c->path, c->shard_degree, d->dp, d->cp > 1 ? " x context" : "", c->strategy);
    } else {
        die(EXIT_USAGE, "%s: parallel.strategy \"%s\": expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2",
            c->path, c->strategy);
    }
    sh->sharded = sh->S > 1;
    /* parallel.reshard_after_forward: auto (0) = PyTorch's default per strategy, 1 true, 2 false */
    sh->reshard = c->reshard_after_forward == 0 ? strcmp(c->strategy, "FULL_SHARD") == 0 || strcmp(c->strategy, "HYBRID_SHARD") == 0
                                               : c->reshard_after_forward == 1;
    const int dp = dist_seq_dp(d); /* sequences split over the data-parallel slots; a context group shares its own */
    long long micro_all = (long long)c->micro_batch * dp; /* up to 2^20 x 2^24: computed wide */
    if (c->global_batch == 0 && micro_all > INT_MAX)
        die(EXIT_USAGE, "%s: train.micro_batch %d x data-parallel ranks %d = %lld sequences a step exceeds train.global_batch's "
            "maximum %d", c->path, c->micro_batch, dp, micro_all, INT_MAX);
    if (c->global_batch == 0) c->global_batch = (int)micro_all;
    if (c->global_batch % micro_all != 0) /* so from here micro_batch x dp <= global_batch fits in an int */
        die(EXIT_USAGE, "%s: train.global_batch %d is not divisible by train.micro_batch %d x data-parallel ranks %d",
            c->path, c->global_batch, c->micro_batch, dp);
    int accum = c->global_batch / (c->micro_batch * dp);
    if (c->rampup_start) { /* every batch of the ramp must split into whole micro-batches per rank */
        int unit = c->micro_batch * dp;
        if (c->rampup_start >= c->global_batch)
            die(EXIT_USAGE, "%s: train.rampup_start_batch %d is not below train.global_batch %d (a ramp-up grows to it)", c->path,
                c->rampup_start, c->global_batch);
        if (c->rampup_start % unit != 0 || c->rampup_increment % unit != 0)
            die(EXIT_USAGE, "%s: train.%s %d is not divisible by train.micro_batch %d x data-parallel ranks %d", c->path,
                c->rampup_start % unit ? "rampup_start_batch" : "rampup_batch_increment",
                c->rampup_start % unit ? c->rampup_start : c->rampup_increment, c->micro_batch, dp);
        if ((c->global_batch - c->rampup_start) % c->rampup_increment != 0)
            die(EXIT_USAGE, "%s: train.rampup_batch_increment %d does not divide train.global_batch %d - train.rampup_start_batch %d",
                c->path, c->rampup_increment, c->global_batch, c->rampup_start);
    }
    return accum;
}

#ifdef LLMTRAIN_CUDA
/* One rank's claim in gpu_shared: its host and the UUID of its device. */
enum { CLAIM_HOST = 128, CLAIM_ID = 64 };
typedef struct GpuClaim {
    char host[CLAIM_HOST], id[CLAIM_ID];
    int rank;
} GpuClaim;

static int claim_cmp(const void *a, const void *b) {
    const GpuClaim *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (!c) c = strcmp(x->host, y->host);
    return c ? c : x->rank - y->rank;
}

/* Several ranks: do two ranks of one host use the same GPU (NCCL cannot put
 * two ranks of a communicator on one)? Compared by the devices' UUIDs, so
 * ranks that each see all of the node's GPUs and ranks bound to one each
 * (CUDA_VISIBLE_DEVICES per rank, srun --gpus-per-task 1) are judged alike;
 * a UUID that cannot be read counts as the device's index on the host (the
 * old rule: more ranks than visible devices clash). Called before any rank
 * creates a context; every rank takes part and gets the same answer: 1 with
 * what clashed in msg, else 0. dev < 0: this rank uses no GPU. */
static int gpu_shared(Dist *d, int dev, int count, char *msg, size_t n) {
    GpuClaim mine, *all = calloc_check((size_t)d->world, sizeof *all);
    memset(&mine, 0, sizeof mine);
    mine.rank = d->rank;
    host_name(mine.host, sizeof mine.host);
    if (dev >= 0 && kernels_cuda_device_uuid(mine.id, sizeof mine.id) < 0)
        snprintf(mine.id, sizeof mine.id, "device %d of %d visible (UUID unreadable)", dev, count);
    dist_allgather(d, DIST_GROUP_WORLD, DIST_BYTE, &mine, all, sizeof mine);
    qsort(all, (size_t)d->world, sizeof *all, claim_cmp); /* the same GPU of a host: neighbours */
    int clash = 0;
    for (int i = 0; i + 1 < d->world && !clash; i++)
        if (all[i].id[0] && !strcmp(all[i].id, all[i + 1].id) && !strcmp(all[i].host, all[i + 1].host)) {
            snprintf(msg, n, "ranks %d and %d on host %.60s would share GPU %.60s", all[i].rank, all[i + 1].rank, all[i].host,
                     all[i].id);
            clash = 1;
        }
    free(all);
    return clash;
}
#endif

/* train.device: "cpu"; "cuda" (exit 2 with one line when unusable); "auto":
 * CUDA when this is a CUDA build and every rank has a usable GPU of its own,
 * else the CPU on every rank. A rank takes device local_rank % count of the
 * devices it sees (CUDA_VISIBLE_DEVICES applies: all of the node's, or one
 * bound to it), and no two ranks of a host may use the same GPU (compared by
 * UUID): NCCL cannot put two ranks of a communicator on one GPU.
 * LLMTRAIN_DEVICE (cpu|cuda) overrides "auto" only, so the CPU test
 * suite can pin the CPU on a machine with a GPU. Several CUDA ranks talk
 * through NCCL (dist_nccl.c, attached after dist_setup_groups). */
const Kernels *layout_select_backend(const Config *c, Dist *d) {
    const char *dev = c->device;
    const char *env = getenv("LLMTRAIN_DEVICE");
    if (env && *env && strcmp(env, "cpu") != 0 && strcmp(env, "cuda") != 0) /* not silently auto */
        die(EXIT_USAGE, "environment: LLMTRAIN_DEVICE=\"%s\": expected cpu or cuda (or unset)", env);
    if (strcmp(dev, "auto") == 0 && env && *env) dev = env;
#ifdef LLMTRAIN_CUDA
    int want = strcmp(dev, "cuda") == 0;
    if (want || strcmp(dev, "auto") == 0) {
        char why[320], clash[320];
        int count = kernels_cuda_device_count(why, sizeof why), use = 0, dev = count >= 1 ? d->local_rank % count : -1;
        if (dev >= 0) kernels_cuda_set_device(dev);
        if (d->world > 1 && gpu_shared(d, dev, count, clash, sizeof clash)) {
            if (want)
                die(EXIT_USAGE, "%s: train.device \"cuda\": %s (%d ranks on this node, %d CUDA device%s visible to this rank; expected "
                    "one GPU per rank: NCCL cannot share a GPU between ranks; start at most one rank per GPU, or use train.device \"cpu\")",
                    c->path, clash, d->local_size, count, count == 1 ? "" : "s");
            dev = -1; /* auto: every rank saw the clash, every rank takes the CPU (before any makes a context) */
        }
        if (dev >= 0) use = kernels_cuda_available(why, sizeof why);
        if (want && !use) die(EXIT_USAGE, "%s: train.device \"cuda\": no usable CUDA device (%s)", c->path, why);
        if (!want && d->world > 1) { /* auto: CUDA only when every rank can */
            double n = use;
            dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &n, 1);
            use = n == d->world;
        }
        if (use) {
            kernels_cuda_set_compute_dtype(c->compute_dtype);
            kernels_cuda_set_attention(c->attention_kernel);
            return kernels_cuda();
        }
    }
#else
    if (strcmp(dev, "cuda") == 0)
        die(EXIT_USAGE, "%s: train.device \"cuda\": this binary was built without the CUDA backend (use \"cpu\" or \"auto\")", c->path);
    (void)d;
#endif
    return kernels_cpu();
}

int layout_cuda_bf16(const Config *c) { return strcmp(c->compute_dtype, "bf16") == 0 || strcmp(c->compute_dtype, "fp8") == 0; }

double layout_cuda_scratch_bytes(const Sharding *sh) {
    const Model *m = sh->model;
    const Config *c = sh->cfg;
    int np, ng, off_grid = 0;
    shard_pool_slots(sh, &np, &ng);
    for (int i = 0; i < m->n_specs; i++) off_grid |= m->specs[i].ndim == 2 && m->specs[i].offset % 8 != 0;
    CudaScratchShape shape = {.B = c->micro_batch, .T = c->seq_len / c->cp, .C = c->model.n_embd, .nh = m->nh, .hd = m->hd,
                              .qkv_dim = m->qkv_dim, .fc_dim = m->fc_dim, .F = m->F, .V = m->V, .n_params = m->n_params,
                              .gpt2 = c->model.arch == ARCH_GPT2, .qk_norm = c->model.qk_norm, .bf16 = layout_cuda_bf16(c),
                              .attention = c->attention_kernel,
                              .weight_copies = sh->sharded ? np - 2 : c->model.n_layer, .sharded = sh->sharded, .off_grid = off_grid, .cp = c->cp};
    Fp8Sizes z = model_fp8_sizes(m, shape.B * shape.T);
    if (config_fp8_recipe(c) >= 0) shape.fp8 = &z, shape.fp8_recipe = config_fp8_recipe(c);
    return kernels_cuda_scratch_bytes(&shape);
}

void layout_rank_bytes(const Sharding *sh, const Kernels *k, double out[LAYOUT_RANK_BYTES]) {
    const Model *m = sh->model;
    const Config *cf = sh->cfg;
    size_t n_shard = 0;
    for (int c = 0; c < m->n_chunks; c++) n_shard += shard_len(sh, c);
    double full = (double)m->n_params * sizeof(float), shard = (double)n_shard * sizeof(float);
    /* sharded: working weights and gradients are the chunk pools (shard_setup) */
    out[0] = shard_params_bytes(sh, shard);
    out[1] = sh->sharded ? shard : cf->param_dtype == 1 ? full : 0; /* NO_SHARD fp32: the params are the master */
    out[2] = sh->sharded ? shard_pool_bytes(sh, 1) + shard : full;
    out[3] = 2 * (sh->sharded ? shard : full);
    out[4] = (double)m->acts_floats * sizeof(float) + 2.0 * cf->micro_batch * (cf->seq_len / cf->cp) * sizeof(int) +
             cp_ring_bytes(m, cf->cp, cf->cp_mode);
    out[5] = (double)m->offload.floats * sizeof(float);
    out[6] = k && strcmp(k->name, "cuda") == 0 ? layout_cuda_scratch_bytes(sh) : 0; /* training on cuda only (check prints its own) */
}

const char *layout_offload_field(double bytes, char *buf, size_t n) {
    if (bytes > 0) snprintf(buf, n, " offload_host_bytes %.0f", bytes);
    else buf[0] = 0;
    return buf;
}

/* The groups of k consecutive data-parallel indices (of dp) of each of the
 * tp ranks' P: `  [tp_rank t]  WHAT group g: ranks ...` */
static void print_blocks(const char *what, int dp, int k, int P) {
    for (int tr = 0; tr < P; tr++)
        for (int g = 0; g < dp / k; g++) {
            if (P > 1) printf("  tp_rank %d", tr);
            printf("  %s group %d: ranks", what, g);
            for (int i = 0; i < k; i++) printf(" %d", (g * k + i) * P + tr);
            printf("\n");
        }
}

/* Rank 0 prints the data-parallel layout and every rank's memory for
 * working parameters, fp32 master weights, gradients and optimizer state. */
void layout_print(const Sharding *sh, const Kernels *k) {
    Dist *d = sh->dist;
    double mine[LAYOUT_RANK_BYTES];
    layout_rank_bytes(sh, k, mine);
    double *all = d->rank == 0 ? malloc_check((size_t)d->world * LAYOUT_RANK_BYTES * sizeof(double)) : NULL;
    dist_gather(d, DIST_GROUP_WORLD, DIST_F64, mine, all, LAYOUT_RANK_BYTES);
    if (d->rank != 0) return;
    int S = d->shard_size, R = d->replicate_size;
    printf("parallel: strategy %s | shard groups of %d x %d replicas | %s\n", sh->cfg->strategy, S, R,
           sh->sharded ? (sh->reshard ? "sharded per layer chunk; gathered before forward and again before backward (reshard_after_forward)"
                                    : "sharded per layer chunk; gathered before forward, kept until backward (no reshard_after_forward)")
                      : "replicated");
    int P = d->tp;
    if (P > 1) {
        printf("tensor parallel: %d ranks per TP group (tp innermost); heads, ffn and vocabulary split %d ways%s\n", P, P,
               sh->cfg->seq_parallel ? "; sequence parallel: the residual stream and norms split by rows" : "");
        for (int g = 0; g < d->dp; g++) {
            printf("  TP group %d: ranks", g);
            for (int i = 0; i < P; i++) printf(" %d", g * P + i);
            printf("\n");
        }
    }
    int cp = d->cp;
    if (cp > 1) {
        printf("context parallel: %d ranks per context group (after tp); each sequence in %d chunks of %d tokens, context rank r "
               "holding chunks r and %d-r; attention %s\n", cp, 2 * cp, sh->cfg->seq_len / (2 * cp), 2 * cp - 1,
               sh->cfg->cp_mode == CP_ALL_GATHER ? "over the key/value blocks all-gathered in the group (context_mode all_gather)"
                                                 : "as a ring of key/value blocks over the group");
        print_blocks("context", d->dp, cp, P);
    }
    int ep = d->ep;
    if (ep > 1) {
        printf("expert parallel: %d ranks per expert group (consecutive data-parallel x context ranks of one tp_rank, "
               "innermost), exchanging tokens by all-to-all\n", ep);
        print_blocks("expert", d->dp, ep, P);
    }
    for (int tr = 0; tr < P; tr++) {
        for (int g = 0; g < R; g++) {
            if (P > 1) printf("  tp_rank %d", tr);
            printf("  shard group %d: ranks", g);
            for (int i = 0; i < S; i++) printf(" %d", (g * S + i) * P + tr);
            printf("\n");
        }
        for (int i = 0; i < S; i++) {
            if (P > 1) printf("  tp_rank %d", tr);
            printf("  replicate group %d: ranks", i);
            for (int g = 0; g < R; g++) printf(" %d", (g * S + i) * P + tr);
            printf("\n");
        }
    }
    for (int r = 0; r < d->world; r++) {
        const double *x = all + LAYOUT_RANK_BYTES * r;
        char off[64];
        char scr[64] = "";
        if (x[6] > 0) snprintf(scr, sizeof scr, " cuda_scratch_bytes %.0f", x[6]);
        printf("  rank %d: params_bytes %.0f master_bytes %.0f grads_bytes %.0f optimizer_state_bytes %.0f activations_bytes %.0f%s%s\n", r,
               x[0], x[1], x[2], x[3], x[4], layout_offload_field(x[5], off, sizeof off), scr);
    }
    fflush(stdout);
    free(all);
}
