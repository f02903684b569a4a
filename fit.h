/* fit.h — does a job fit its GPUs (`llmtrain check`): the GPU memory it
 * is given (--gpu-mem, --instance, or the job's train.gpu_mem and
 * train.instance) and the table of instance types, one rank's estimated
 * device bytes under a layout, the verdict, and when the job does not fit,
 * the nearest layouts that do, found by estimating candidate layouts with
 * the checks a training start runs. */
#ifndef LLMTRAIN_FIT_H
#define LLMTRAIN_FIT_H
#include "config.h"
#include "layout.h"

/* An instance type: its GPUs and one GPU's memory as the driver reports
 * it (nvidia-smi's total, MiB). */
typedef struct FitInstance {
    const char *name; /* "ml.p4d.24xlarge" (also taken without "ml.") */
    const char *gpu;  /* "A100 40GB" */
    int gpus;
    double mib;
} FitInstance;

/* The instance type of that name, NULL when the table has none. */
const FitInstance *fit_instance(const char *name);
/* "40GiB", "80GB", "81559MiB" (also TiB, TB, MB; case-insensitive) into
 * bytes: 0, else -1 with nothing set. */
int fit_parse_mem(const char *s, double *bytes);
/* Take `--gpu-mem X`, `--gpu-mem=X`, `--instance X` and `--instance=X`
 * out of argv (the rest keeps its order); *mem / *inst the values (NULL:
 * not given). One line and exit 2 for a flag without a value. */
void fit_take_flags(int *argc, char **argv, const char **mem, const char **inst);
/* The GPU memory to fit to: --gpu-mem, else --instance's, else
 * train.gpu_mem, else train.instance's; 0 when none is named. what: the
 * source in words ("ml.p4d.24xlarge: 8 x A100 40GB"). A bad value or an
 * unknown instance: one line naming the flag or key, exit 2. */
double fit_gpu_bytes(const Config *c, const char *mem, const char *inst, char *what, size_t n);
/* One rank's estimate for job c on world ranks: layout_check (same
 * checks and messages as a start) and the model sized without allocating
 * it (model_plan_tp) into sh, d and m; b as layout_rank_bytes, *scratch
 * the CUDA backend's (0 under train.device cpu). Returns layout_check's
 * micro-batches a step. m: free with model_free. */
int fit_estimate(Config *c, int world, Sharding *sh, Dist *d, Model *m, double b[LAYOUT_RANK_BYTES], double *scratch);
/* The device bytes of an estimate: b's device parts and the scratch (not
 * the host copy of offloaded activations). */
double fit_device_bytes(const double b[LAYOUT_RANK_BYTES], double scratch);
/* Job c (as layout_check left it) estimated again with a change, in a
 * child process so that a candidate the checks refuse is skipped: the
 * device bytes, or -1 when the checks refuse it. */
double fit_try(const Config *c, int world, void (*change)(Config *, const void *), const void *arg);
/* The fraction of a GPU's memory a job may use: the rest is the CUDA
 * context's, NCCL's buffers' and the allocator's, which no estimate counts. */
#define FIT_USABLE 0.9
/* Print the verdict for `need` device bytes a rank against gpu bytes and,
 * when it does not fit, the nearest layouts that do; returns 1 when it
 * fits. */
int fit_report(const Config *c, int world, double need, double gpu, const char *what);
/* train.param_dtype bf16: one line saying what bf16 working weights cost
 * against fp32 ones (the job estimated again with fp32; need: this
 * estimate) and why they cost more. Nothing under fp32. */
void fit_print_bf16_cost(const Config *c, int world, double need, int sharded);

#endif
