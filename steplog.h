/* steplog.h — a training step's logs: its statistics (StepStats), the
 * gradient-norm spike tracker, the step line on stdout and the step's
 * metrics.jsonl line and TensorBoard scalars; the metrics file's writes. */
#ifndef LLMTRAIN_STEPLOG_H
#define LLMTRAIN_STEPLOG_H
#include "trainer.h"

typedef struct StepStats {
    int step;          /* 0-based */
    int batch;         /* its global batch in sequences (train.global_batch, or the ramp's) */
    double loss, lr, norm, dt, val_loss;
    double pnorm;      /* the master weights' L2 norm after the step (NAN: log.param_norm off) */
    int n_val_src;     /* a blended data.val: each source's own val loss */
    double val_src[BLEND_MAX_SOURCES];
    int clipped, skipped;
    double comm_ag, comm_rs, comm_ar, comm_tp; /* bus bytes of this step per collective kind */
    double comm_tp_ag, comm_tp_rs;             /* ... and sequence parallelism's (the step line's tp counts all three) */
    double comm_cp;                            /* context parallelism's ring: bytes sent */
    double comm_ep;                            /* expert parallelism's all-to-all: bytes sent to the other members */
    /* mixture of experts (moe.on): the balance losses' values (unscaled, each
     * the mean over MoE layers and micro-batches), the expert load (max over
     * mean tokens an expert) per layer and its mean, the choices dropped */
    double moe_aux, moe_z, moe_load, moe_dropped, moe_routed;
    double *moe_layer_load;                    /* [n_layer] (NULL: no MoE); the Trainer's */
    double comm_wait;  /* seconds blocked in collectives and waits (exposed communication) */
    double ck_block;   /* seconds training was blocked by a checkpoint begun after this step */
    double norm_mean;  /* running mean of the previous CKPT_SPIKE_WINDOW norms (NAN: none yet) */
    int spike;         /* norm above norm_mean + 0.1 */
    int spike_ended;   /* a spike ended at this step after this many steps (0: none) */
} StepStats;

void log_failed(Trainer *t, const char *path, int err);
void metrics_line(Trainer *t, const char *line);
void track_spikes(Trainer *t, StepStats *s);
void log_step(Trainer *t, const StepStats *s);

#endif
