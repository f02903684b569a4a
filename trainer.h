/* trainer.h — the trainer's state (one struct a rank), shared by
 * llmtrain.c (setup, the loop, one step) and steplog.c (the step's logs). */
#ifndef LLMTRAIN_TRAINER_H
#define LLMTRAIN_TRAINER_H
#include "ckpt.h"
#include "ckpt_run.h"
#include "config.h"
#include "data.h"
#include "init.h"
#include "kernels.h"
#include "model.h"
#include "parallel.h"
#include "profile.h"
#include "shard.h"
#include "tboard.h"
#include <signal.h>
#include <stdio.h>
#include <string.h>

typedef struct Trainer {
    Config cfg;
    InitFrom init; /* init.from: what it named, for the header */
    Dist dist;
    const Kernels *k;
    Model model;
    DataSet train, val;
    int have_val;
    Vocab vocab;
    int have_vocab;
    int accum;                 /* micro-batches per rank per step at train.global_batch (a ramp's steps take fewer) */
    int threads;               /* CPU threads of this rank */
    int *tok, *tgt;            /* host batch [B*T] (B x seq_len: under cp a sample's window of up to seq_len tokens goes into it) */
    unsigned char *ends;       /* documents from an indexed dataset's index (data.eod_token -1): 1 where a
                                * token of tok ends its document [B*T] (NULL: documents from eod_token) */
    int *doc0;                 /* context parallelism with documents: each local token's document start in its sequence [B*T] (Model.cp_doc0) */
    double *doc_end;           /* ... and each chunk's last document end, shared by the context group [B x 2 cp] (cp_doc_starts) */
    float *host_flat;          /* host copy of a flat array (debug.dump) */
    FILE *metrics;
    TBoard tb;                 /* log.tensorboard_dir (rank 0); tb.f NULL: off */
    char metrics_path[1200];
    long long metrics_good;    /* metrics.jsonl's end after its last whole line */
    /* rank 0: the first log file (metrics.jsonl, TensorBoard, profile.json)
     * a write failed for, and its errno (0: none): the loop stops after this
     * step's checkpoint and the run exits 3 (log_failed) */
    char log_path[1400];
    int log_errno;
    double peak_gflops;
    const char *peak_source;   /* where peak_gflops comes from (header line) */
    int peak_recheck;          /* a measured CPU peak, not yet measured again (check_peak) */
    double peak_gbs;           /* log.peak_gbs, else the GPU's memory bandwidth, else 0 (the profile's GB/s share) */
    double flops_per_token;
    int nonfinite_run;         /* consecutive skipped steps */
    int ck_deferred;           /* a periodic checkpoint fell on a skipped step */
    int eval_stopped;          /* a stop request came during this step's evaluation */
    Sharding sh;                  /* the sharding runtime (shard.c): optimizer state, chunk pools, collectives in flight */
    double train_time;         /* seconds spent in steps, for the ETA */
    double timed_seqs;         /* the sequences of those steps */
    ProfileWindow prof;        /* log.profile_steps: the steps timed (profile.c) */
    uint64_t sample_rng;
    /* resume: step `step_base` reads global sequences from `seq_base` on */
    int step_base;
    uint64_t seq_base;
    int plan_step;             /* step_cursor's walk: the cursor before step plan_step */
    uint64_t plan_cursor;
    uint64_t end_cursor;       /* the cursor after the last step (run_sequences, once), for the ETA */
    TrainState st;             /* counters and the spike tracker, saved with every checkpoint */
    CkptRun ck;                /* the checkpoint protocol (ckpt_run.c): the checkpoint in flight */
    double *moe_red;           /* [5 + n_layer]: a step's MoE statistics, reduced (moe_step_stats) */
} Trainer;

static inline int is_root(const Trainer *t) { return t->dist.rank == 0; }
static inline int backend_is_cuda(const Trainer *t) { return strcmp(t->k->name, "cuda") == 0; }

/* The global sequence cursor before step `step` (llmtrain.c). */
uint64_t step_cursor(Trainer *t, int step);

#endif
