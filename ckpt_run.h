/* ckpt_run.h — the checkpoint protocol across the ranks of a running job
 * (the format, the writer thread and loading are ckpt.h's): claiming the
 * folders, beginning a checkpoint, moving it through its local and durable
 * phases as every writer finishes, making room on a full disk, and resume.
 * Every call here is collective over the whole world unless it says not. */
#ifndef LLMTRAIN_CKPT_RUN_H
#define LLMTRAIN_CKPT_RUN_H
#include <stddef.h>
#include <stdint.h>
#include "ckpt.h"
#include "config.h"
#include "kernels.h"
#include "model.h"
#include "parallel.h"
#include "shard.h"

enum { CK_IDLE, CK_LOCAL, CK_DURABLE };

typedef struct CkptRun {
    /* the job it serves, bound by ckpt_run_setup (the sharding runtime's) */
    Sharding *sh;
    const Config *cfg;
    Dist *dist;
    Model *model;
    const Kernels *k;
    /* rank 0: one metrics.jsonl line for each checkpoint that completes
     * or fails (NULL: none) */
    void (*event)(void *ctx, const char *line);
    void *event_ctx;
    /* the checkpoint in flight */
    CkptWriter *w;
    size_t owned;              /* floats per state kind this rank writes */
    int phase;                 /* CK_IDLE, CK_LOCAL, CK_DURABLE */
    int direct;                /* the local write failed: writing straight to durable_dir */
    int room_tried;            /* this phase of the checkpoint found its disk full once (ck_make_room) */
    TrainState state;          /* state of the checkpoint in flight */
    float *moe_bias;           /* its copy of the MoE biases, which state.moe_bias views (ck_snap) */
    char root[1024];           /* where the phase in flight writes */
    char *manifest;            /* kept for the durable copy's commit */
    uint64_t *bytes, *sums;    /* [world]: each rank file's size and checksum in manifest */
    double began, last;        /* now_s() when it began / when the last one began */
    int done_step;             /* newest step whose checkpoint is complete (-1: none) */
    int durable_step;          /* newest step this run copied to (or wrote in) durable_dir (-1: none) */
    int recopy;                /* the resumed checkpoint's durable copy is being made again (ck_recopy) */
    size_t progress;           /* this rank's writer's bytes written, at the last wait (ckpt_control) */
    char sched_change[1024];   /* ckpt_resume under optim.override_schedule: "key: old -> new, ..." where this job's schedule differs ("": none) */
} CkptRun;

/* Before anything is loaded, trained or removed there: each node's first
 * rank makes checkpoint.dir and durable_dir and writes a file in each
 * (exit 3 when it cannot), and rank 0 locks both for the job's life (a
 * folder another job holds: waited for up to checkpoint.lock_wait_s, then
 * exit 2 naming the holder). */
void ckpt_claim_dirs(const Config *c, Dist *d);
/* Bind the protocol to the sharding runtime (set up), remove folders a run
 * that died left half-written, start the writer thread, and register the
 * clean-up that removes the checkpoint in flight when this rank dies. */
void ckpt_run_setup(CkptRun *r, Sharding *sh, void (*event)(void *ctx, const char *line), void *event_ctx);
/* Not collective: the writer thread and the buffers (after ckpt_drain). */
void ckpt_run_free(CkptRun *r);
/* checkpoint.resume: the newest checkpoint every rank can read and verify,
 * loaded into this layout; *st gets its state. Returns 1 when resumed, 0
 * for a new run; a checkpoint of another model, an explicit one that fails,
 * every one damaged, or one trained with another LR or batch schedule
 * without optim.override_schedule (then r->sched_change says what
 * differs): exit 2. */
int ckpt_resume(CkptRun *r, TrainState *st);
/* Begin a checkpoint of *st (its step, data cursor and counters): wait for
 * the one in flight, stage what this rank owns, hand it to the writer.
 * Returns the seconds training was blocked. */
double ckpt_begin(CkptRun *r, const TrainState *st);
/* The step's one small all-reduce: writers busy or failed, a stop request
 * on any rank (stop_here: this rank's), checkpoint.every_minutes due (rank
 * 0's clock). Moves the checkpoint in flight on once every writer is done.
 * wait: wait up to a second for this rank's writer first. */
void ckpt_control(CkptRun *r, int wait, int stop_here, int *stop, int *due);
/* Until the checkpoint in flight is complete everywhere (or dropped). */
void ckpt_drain(CkptRun *r);

#endif
