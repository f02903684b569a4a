/* fit.c — does a job fit its GPUs (see fit.h): the GPU memory and the
 * table of instance types, one rank's estimate under a layout, the verdict
 * `llmtrain check` prints, and the search for the nearest layouts that fit
 * (each candidate estimated in a child process by the checks and sizing a
 * training start uses, so a layout they refuse is skipped, not guessed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fit.h"
#include "util.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

/* GPU memory as nvidia-smi reports it (MiB): A100 40GB 40960, A100 80GB
 * 81920, H100 80GB 81559, H200 141GB 143771, A10G 23028, L40S 46068. */
static const FitInstance INSTANCES[] = {
    {"ml.p4d.24xlarge", "A100 40GB", 8, 40960},   {"ml.p4de.24xlarge", "A100 80GB", 8, 81920},
    {"ml.p5.48xlarge", "H100 80GB", 8, 81559},    {"ml.p5e.48xlarge", "H200 141GB", 8, 143771},
    {"ml.p5en.48xlarge", "H200 141GB", 8, 143771}, {"ml.g5.xlarge", "A10G 24GB", 1, 23028},
    {"ml.g5.2xlarge", "A10G 24GB", 1, 23028},     {"ml.g5.4xlarge", "A10G 24GB", 1, 23028},
    {"ml.g5.8xlarge", "A10G 24GB", 1, 23028},     {"ml.g5.16xlarge", "A10G 24GB", 1, 23028},
    {"ml.g5.12xlarge", "A10G 24GB", 4, 23028},    {"ml.g5.24xlarge", "A10G 24GB", 4, 23028},
    {"ml.g5.48xlarge", "A10G 24GB", 8, 23028},    {"ml.g6e.xlarge", "L40S 48GB", 1, 46068},
    {"ml.g6e.2xlarge", "L40S 48GB", 1, 46068},    {"ml.g6e.4xlarge", "L40S 48GB", 1, 46068},
    {"ml.g6e.8xlarge", "L40S 48GB", 1, 46068},    {"ml.g6e.16xlarge", "L40S 48GB", 1, 46068},
    {"ml.g6e.12xlarge", "L40S 48GB", 4, 46068},   {"ml.g6e.24xlarge", "L40S 48GB", 4, 46068},
    {"ml.g6e.48xlarge", "L40S 48GB", 8, 46068},
};
#define N_INSTANCES (int)(sizeof INSTANCES / sizeof INSTANCES[0])
#define GIB (1024.0 * 1024.0 * 1024.0)

const FitInstance *fit_instance(const char *name) {
    const char *bare = strncmp(name, "ml.", 3) == 0 ? name + 3 : name;
    for (int i = 0; i < N_INSTANCES; i++)
        if (strcmp(INSTANCES[i].name + 3, bare) == 0) return &INSTANCES[i];
    return NULL;
}

int fit_parse_mem(const char *s, double *bytes) {
    static const struct { const char *unit; double scale; } units[] = {
        {"TiB", GIB * 1024}, {"GiB", GIB}, {"MiB", 1024.0 * 1024}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}};
    char *end = NULL;
    double x = strtod(s, &end);
    if (end == s || !(x > 0) || x > 1e9) return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].unit) == 0) {
            *bytes = x * units[i].scale;
            return 0;
        }
    return -1;
}

void fit_take_flags(int *argc, char **argv, const char **mem, const char **inst) {
    static const char *names[2] = {"--gpu-mem", "--instance"};
    const char **out[2] = {mem, inst};
    *mem = *inst = NULL;
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        int f = -1;
        size_t len = 0;
        for (int j = 0; j < 2; j++) {
            len = strlen(names[j]);
            if (strncmp(argv[i], names[j], len) == 0 && (argv[i][len] == '\0' || argv[i][len] == '=')) { f = j; break; }
        }
        if (f < 0) { argv[n++] = argv[i]; continue; }
        if (argv[i][len] == '=') *out[f] = argv[i] + len + 1;
        else if (i + 1 < *argc) *out[f] = argv[++i];
        else *out[f] = "";
        if (!**out[f])
            die(EXIT_USAGE, "%s: expected a value after it (%s)", names[f], f == 0 ? "a GPU's memory, such as 40GiB" : "an instance type, such as ml.p4d.24xlarge");
    }
    *argc = n;
}

/* One line naming every instance type of the table. */
static void instance_names(char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < N_INSTANCES && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", INSTANCES[i].name);
}

static double instance_bytes(const char *name, const char *origin, char *what, size_t n) {
    const FitInstance *t = fit_instance(name);
    if (!t) {
        char names[1024];
        instance_names(names, sizeof names);
        die(EXIT_USAGE, "%s: unknown instance type \"%s\" (expected one of %s; or give the GPU's memory, --gpu-mem 40GiB)", origin,
            name, names);
    }
    snprintf(what, n, "%s: %d x %s", t->name, t->gpus, t->gpu);
    return t->mib * 1024 * 1024;
}

static double mem_bytes(const char *s, const char *origin, char *what, size_t n) {
    double b;
    if (fit_parse_mem(s, &b) < 0)
        die(EXIT_USAGE, "%s: \"%s\": expected a GPU's memory as a number and a unit, such as 40GiB, 80GB or 81559MiB", origin, s);
    snprintf(what, n, "%s %s", origin, s);
    return b;
}

double fit_gpu_bytes(const Config *c, const char *mem, const char *inst, char *what, size_t n) {
    char origin[1100];
    if (mem) return mem_bytes(mem, "--gpu-mem", what, n);
    if (inst) return instance_bytes(inst, "--instance", what, n);
    if (c->gpu_mem[0]) {
        snprintf(origin, sizeof origin, "%s: train.gpu_mem", c->path);
        return mem_bytes(c->gpu_mem, origin, what, n);
    }
    if (c->instance[0]) {
        snprintf(origin, sizeof origin, "%s: train.instance", c->path);
        return instance_bytes(c->instance, origin, what, n);
    }
    what[0] = 0;
    return 0;
}

int fit_estimate(Config *c, int world, Sharding *sh, Dist *d, Model *m, double b[LAYOUT_RANK_BYTES], double *scratch) {
    d->world = world;
    d->local_size = 1;
    int accum = layout_check(sh, c, d, m);
    /* no backend: the job is sized for the cluster it names, not for this
     * machine's devices (a GPU job checks on a laptop), and nothing is allocated */
    int act_bytes = strcmp(c->device, "cpu") != 0 && layout_cuda_bf16(c) ? 2 : 4; /* the [a] activations on CUDA */
    model_plan_tp(m, &c->model, c->micro_batch, c->seq_len / c->cp, sh->S, d->tp, 0,
                  (ModelMem){c->act_ckpt, c->lm_head_chunk, c->act_offload, act_bytes, c->seq_parallel, c->recompute_modules, c->ep, 0, c->moe_capacity_factor});
    layout_rank_bytes(sh, NULL, b);
    *scratch = strcmp(c->device, "cpu") != 0 ? layout_cuda_scratch_bytes(sh) : 0;
    return accum;
}

double fit_device_bytes(const double b[LAYOUT_RANK_BYTES], double scratch) { return b[0] + b[1] + b[2] + b[3] + b[4] + scratch; }

double fit_try(const Config *c, int world, void (*change)(Config *, const void *), const void *arg) {
    int fd[2];
    fflush(stdout);
    fflush(stderr);
    if (pipe(fd) < 0) die(EXIT_IO, "check: pipe: cannot estimate a candidate layout");
    pid_t pid = fork();
    if (pid < 0) die(EXIT_IO, "check: fork: cannot estimate a candidate layout");
    if (pid == 0) { /* the child: a refusal is its exit 2, its line unseen */
        close(fd[0]);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) { dup2(null, 1); dup2(null, 2); }
        static Config k;
        static Sharding sh;
        static Dist d;
        static Model m;
        double b[LAYOUT_RANK_BYTES], sc;
        k = *c;
        change(&k, arg);
        fit_estimate(&k, world, &sh, &d, &m, b, &sc);
        double need = fit_device_bytes(b, sc);
        _exit(write(fd[1], &need, sizeof need) == (ssize_t)sizeof need ? 0 : 3);
    }
    close(fd[1]);
    double need = -1;
    if (read(fd[0], &need, sizeof need) != (ssize_t)sizeof need) need = -1;
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {}
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? need : -1;
}

/* ---- the nearest layouts that fit ---------------------------------- */

/* The dimensions a candidate changes, cheapest first; option 0 of each is
 * the job's own. */
enum { D_SHARD, D_CKPT, D_TP, D_CP, D_MICRO, D_OFFLOAD, N_DIM };
#define MAX_OPT 6
typedef struct Opt {
    int a, b;     /* shard_degree; act_ckpt; tp, sequence_parallel; cp; micro_batch; act_offload */
    char s[32];   /* strategy */
} Opt;
typedef struct Dims {
    Opt opt[N_DIM][MAX_OPT];
    int n[N_DIM];
} Dims;
typedef struct Cand {
    int pick[N_DIM];
    int dist, cost, order;
    double need;
} Cand;

static void dims_build(const Config *c, Dims *d) {
    memset(d, 0, sizeof *d);
    Opt *o;
    o = d->opt[D_SHARD]; /* sharding: larger hybrid shard groups, then all of the data-parallel ranks */
    snprintf(o[0].s, sizeof o[0].s, "%s", c->strategy);
    o[0].a = c->shard_degree;
    int n = 1, hybrid = strncmp(c->strategy, "HYBRID_SHARD", 12) == 0;
    for (int f = 2; hybrid && c->shard_degree > 0 && f <= 8; f *= 2, n++) {
        snprintf(o[n].s, sizeof o[n].s, "%s", c->strategy);
        o[n].a = c->shard_degree * f;
    }
    if (strcmp(c->strategy, "FULL_SHARD") != 0) snprintf(o[n++].s, sizeof o[n].s, "FULL_SHARD");
    d->n[D_SHARD] = n;
    o = d->opt[D_CKPT]; /* activation checkpointing: stronger modes */
    n = 0;
    for (int a = c->act_ckpt; a <= ACT_FULL; a++) o[n++].a = a;
    d->n[D_CKPT] = n;
    o = d->opt[D_TP]; /* tensor parallelism: sequence parallel, then more tp in a node (with it) */
    o[0].a = c->tp, o[0].b = c->seq_parallel, n = 1;
    if (c->tp > 1 && !c->seq_parallel) o[n].a = c->tp, o[n++].b = 1;
    for (int t = c->tp * 2; t <= 8; t *= 2) o[n].a = t, o[n++].b = 1;
    d->n[D_TP] = n;
    o = d->opt[D_CP]; /* context parallelism */
    o[0].a = c->cp, n = 1;
    for (int f = 2; f <= 8; f *= 2) o[n++].a = c->cp * f;
    d->n[D_CP] = n;
    o = d->opt[D_MICRO]; /* smaller micro-batches (more accumulation) */
    o[0].a = c->micro_batch, n = 1;
    for (int m = c->micro_batch / 2; m >= 1 && n < 4 && c->micro_batch % m == 0; m /= 2) o[n++].a = m;
    d->n[D_MICRO] = n;
    o = d->opt[D_OFFLOAD]; /* activations to host memory */
    o[0].a = c->act_offload, n = 1;
    if (!c->act_offload) o[n++].a = 1;
    d->n[D_OFFLOAD] = n;
}

typedef struct Apply {
    const Dims *d;
    const int *pick;
} Apply;

static void cand_apply(Config *c, const void *arg) {
    const Apply *x = arg;
    const Opt *s = &x->d->opt[D_SHARD][x->pick[D_SHARD]];
    snprintf(c->strategy, sizeof c->strategy, "%s", s->s);
    c->shard_degree = s->a;
    c->act_ckpt = x->d->opt[D_CKPT][x->pick[D_CKPT]].a;
    c->tp = x->d->opt[D_TP][x->pick[D_TP]].a;
    c->seq_parallel = x->d->opt[D_TP][x->pick[D_TP]].b;
    c->cp = x->d->opt[D_CP][x->pick[D_CP]].a;
    c->micro_batch = x->d->opt[D_MICRO][x->pick[D_MICRO]].a;
    c->act_offload = x->d->opt[D_OFFLOAD][x->pick[D_OFFLOAD]].a;
}

/* The candidate's changes as --set options (in buf). */
static void cand_text(const Config *c, const Dims *d, const int *pick, char *buf, size_t n) {
    size_t o = 0;
#define ADD(...) (o += o < n ? (size_t)snprintf(buf + o, n - o, __VA_ARGS__) : 0)
    buf[0] = 0;
    const Opt *s = &d->opt[D_SHARD][pick[D_SHARD]];
    if (strcmp(s->s, c->strategy) != 0) ADD(" --set parallel.strategy=%s", s->s);
    if (s->a != c->shard_degree) ADD(" --set parallel.shard_degree=%d", s->a);
    char name[32];
    if (pick[D_CKPT]) ADD(" --set train.activation_checkpointing=%s", config_enum_name(ACT_CKPT_MODES, d->opt[D_CKPT][pick[D_CKPT]].a, name, sizeof name));
    const Opt *t = &d->opt[D_TP][pick[D_TP]];
    if (t->a != c->tp) ADD(" --set parallel.tensor=%d", t->a);
    if (t->b != c->seq_parallel) ADD(" --set parallel.sequence_parallel=true");
    if (pick[D_CP]) ADD(" --set parallel.context=%d", d->opt[D_CP][pick[D_CP]].a);
    if (pick[D_MICRO]) ADD(" --set train.micro_batch=%d", d->opt[D_MICRO][pick[D_MICRO]].a);
    if (pick[D_OFFLOAD]) ADD(" --set train.activation_offload=true");
#undef ADD
}

static int cand_cmp(const void *pa, const void *pb) {
    const Cand *a = pa, *b = pb;
    if (a->dist != b->dist) return a->dist - b->dist;
    if (a->cost != b->cost) return a->cost - b->cost;
    return a->order - b->order;
}

/* Up to 3 changed dimensions; estimate candidates nearest first (fewest
 * changed dimensions, then the smallest steps), through the first number
 * of changes at which any fits; print up to 5 of those. */
#define FIT_MAX_DIST 3
#define FIT_MAX_TRIES 600
#define FIT_SHOW 5
static void print_nearest(const Config *c, int world, double limit) {
    Dims d;
    dims_build(c, &d);
    int total = 1;
    for (int i = 0; i < N_DIM; i++) total *= d.n[i];
    Cand *all = malloc_check((size_t)total * sizeof *all);
    int nc = 0;
    for (int idx = 0; idx < total; idx++) {
        Cand k = {.order = idx};
        for (int i = 0, r = idx; i < N_DIM; i++) {
            k.pick[i] = r % d.n[i];
            r /= d.n[i];
            k.dist += k.pick[i] > 0;
            k.cost += k.pick[i];
        }
        if (k.dist >= 1 && k.dist <= FIT_MAX_DIST) all[nc++] = k;
    }
    qsort(all, (size_t)nc, sizeof *all, cand_cmp);
    int shown = 0, found_dist = 0, tries = 0;
    char text[512];
    for (int i = 0; i < nc && tries < FIT_MAX_TRIES; i++) {
        if (found_dist && all[i].dist > found_dist) break;
        Apply x = {&d, all[i].pick};
        double need = fit_try(c, world, cand_apply, &x);
        tries++;
        if (need < 0 || need > limit) continue;
        if (!found_dist) printf("fit: the nearest layouts that fit (each estimated as above; fewest changes first):\n");
        found_dist = all[i].dist;
        if (shown++ < FIT_SHOW) {
            cand_text(c, &d, all[i].pick, text, sizeof text);
            printf("  %s: %.1f GiB a rank, %.1f GiB left\n", text + 1, need / GIB, (limit - need) / GIB);
        }
    }
    if (shown > FIT_SHOW) printf("  (and %d more with as many changes)\n", shown - FIT_SHOW);
    if (!found_dist)
        printf("fit: no layout within %d changes of sharding, activation checkpointing, tp, cp, micro-batch and activation offload "
               "fits on %d ranks (%d tried): use more ranks or GPUs with more memory\n", FIT_MAX_DIST, world, tries);
    free(all);
}

int fit_report(const Config *c, int world, double need, double gpu, const char *what) {
    double limit = FIT_USABLE * gpu;
    printf("fit: %s, %.1f GiB a GPU; a rank may use %.1f GiB (%.0f%%: the rest is for the CUDA context, NCCL's buffers and the "
           "allocator, which the estimate does not count) | estimate %.1f GiB a rank: ", what, gpu / GIB, limit / GIB,
           100 * FIT_USABLE, need / GIB);
    if (need <= limit) {
        printf("fits, %.1f GiB left\n", (limit - need) / GIB);
        return 1;
    }
    printf("does not fit, %.1f GiB over\n", (need - limit) / GIB);
    print_nearest(c, world, limit);
    return 0;
}

static void to_fp32(Config *c, const void *arg) {
    (void)arg;
    c->param_dtype = 0;
}

void fit_print_bf16_cost(const Config *c, int world, double need, int sharded) {
    if (c->param_dtype != 1) return;
    double f = fit_try(c, world, to_fp32, NULL);
    if (f < 0) return;
    printf("param_dtype bf16: %.0f bytes a rank more than fp32 working weights (%.1f against %.1f GiB): AdamW updates fp32 master "
           "weights and the layers read fp32 words that hold the bf16 values, so bf16 adds %s; it saves half the weight "
           "all-gathers' bytes%s, not memory\n", need - f, need / GIB, f / GIB,
           sharded ? "the bf16 words of the rank's shard that the all-gathers send (half the fp32 shard's bytes)"
                   : "a whole fp32 master copy beside the working weights",
           sharded ? "" : " (sharded only)");
}
