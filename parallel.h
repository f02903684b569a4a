/* parallel.h — who this rank is and how it talks to the others: launch
 * detection (mpirun, PMI/PMIx, torchrun-style variables, or a world of
 * one), process groups and the collectives model and trainer use. Nothing
 * outside parallel.c calls MPI. */
#ifndef LLMTRAIN_PARALLEL_H
#define LLMTRAIN_PARALLEL_H
#include <stddef.h>

typedef struct Dist {
    int rank, world, local_rank;
    int local_size;       /* ranks on this node */
    int use_mpi;          /* collectives go through MPI */
    int dp, dp_rank;      /* data-parallel degree and this rank's index */
    /* tensor parallelism (dist_set_tp): world = tp x dp, tp innermost:
     * tp_rank = rank % tp, dp_rank = rank / tp, dp = world / tp */
    int tp, tp_rank;
    /* communication volume of the current step in bus bytes (NCCL-tests
     * convention), reset by dist_comm_reset */
    double bytes_allgather, bytes_reduce_scatter, bytes_allreduce, bytes_tp_allreduce;
    /* seconds this rank spent blocked in collectives and waits since
     * dist_comm_reset: communication that compute did not hide */
    double comm_wait_s, coll_t0;
    /* data-parallel groups (dist_setup_groups): shard x replicate, shard
     * innermost. shard_size S ranks share one copy of the sharded state;
     * shard_index = rank % S, shard_group = rank / S; replicate_size R = dp / S. */
    int shard_size, shard_index, shard_group, replicate_size;
    struct DistGroups *groups; /* the two sub-communicators (NULL: none) */
    struct DistWatch *watch; /* watchdog state (NULL until dist_watchdog_start) */
    /* test-only fault injection from LLMTRAIN_FAULT (kind 0: none) */
    int fault_kind, fault_rank, fault_step_lo, fault_step_hi;
} Dist;

/* Detect the launcher and initialise MPI when one started us. A
 * torchrun-style launch (WORLD_SIZE > 1 without MPI) on the CPU backend is
 * one clear error: CPU collectives need MPI. (On GPUs such a launch is to
 * bootstrap NCCL over the TCP rendezvous in rendezvous.h: rdzv_env, then
 * rank 0's ncclUniqueId to all with rdzv_bcast; not wired in yet.) */
void dist_init(Dist *d, int *argc, char ***argv);
void dist_finalize(Dist *d);
/* Sum in place: float32 over the data-parallel group (ranks of the same
 * tp_rank), float64 over the world. */
void dist_allreduce_sum_f32(Dist *d, float *x, size_t n);
void dist_allreduce_sum_f64(Dist *d, double *x, size_t n);
void dist_barrier(Dist *d);
/* Split the data-parallel ranks into shard groups of S consecutive ranks
 * and replicate groups (same rank % S). S must divide dp. Collective. */
void dist_setup_groups(Dist *d, int S);
/* Set the tensor-parallel degree (before dist_setup_groups; tp divides
 * world). Shard / replicate / data-parallel groups are then formed among
 * ranks of the same tp_rank, and a TP group of the tp consecutive ranks. */
void dist_set_tp(Dist *d, int tp);
/* TP group: in place over the tp ranks, sum (max = 0) or max (max = 1)
 * of floats; sum of doubles; gather n floats to tp_rank 0 (recv[tp*n]). */
void dist_tp_allreduce_f32(Dist *d, float *x, size_t n, int max);
void dist_tp_allreduce_sum_f64(Dist *d, double *x, size_t n);
void dist_tp_gather_f32(Dist *d, const float *send, float *recv, size_t n);
void dist_comm_reset(Dist *d);
/* Shard group: all-gather n floats from every member into recv[S*n]
 * (member i's block at i*n); reduce-scatter (sum) send[S*n] into recv[n];
 * float64 sum in place; gather n floats to shard index 0 (recv[S*n] there). */
void dist_shard_allgather_f32(Dist *d, const float *send, float *recv, size_t n);
void dist_shard_reduce_scatter_f32(Dist *d, const float *send, float *recv, size_t n);
void dist_shard_allreduce_sum_f64(Dist *d, double *x, size_t n);
/* Non-blocking shard-group all-gather / reduce-scatter (same buffers and
 * byte counts as the blocking ones, counted when started). They return a
 * handle for dist_wait / dist_test, or -1 when the group has one member
 * (the copy is already done). Buffers stay untouched until the wait. A
 * reduce-scatter with recv == send runs in place: the result lands in
 * send[0, n). */
int dist_shard_iallgather_f32(Dist *d, const float *send, float *recv, size_t n);
int dist_shard_ireduce_scatter_f32(Dist *d, const float *send, float *recv, size_t n);
/* Complete and release a handle (-1: nothing); the watchdog names its
 * collective while waiting. dist_test only drives progress and says whether
 * it has completed: every handle still needs its dist_wait. */
void dist_wait(Dist *d, int h);
int dist_test(Dist *d, int h);
void dist_shard_gather_f32(Dist *d, const float *send, float *recv, size_t n);
/* Replicate group: sum n floats in place. */
void dist_replicate_allreduce_sum_f32(Dist *d, float *x, size_t n);
/* World: gather n doubles from every rank to rank 0 (recv[world*n] there). */
void dist_gather_f64(Dist *d, const double *send, double *recv, size_t n);
/* Watchdog: a background thread that ends the job with exit code 5
 * (EXIT_TIMEOUT) when the phase recorded by dist_phase has lasted longer
 * than timeout_s seconds, printing one line naming rank, step, phase and the
 * collective in flight. timeout_s <= 0 disables it. It arms at the first
 * dist_phase call. */
void dist_watchdog_start(Dist *d, double timeout_s);
/* Heartbeat from the main thread: step (1-based) and phase name (a string
 * that outlives the call, e.g. a literal: "forward", "allreduce", ...). */
void dist_phase(Dist *d, int step, const char *phase);
/* Test-only fault injection, LLMTRAIN_FAULT="rank=R,step=S[-E],kind=K[,attempt=A]"
 * with K hang|die|nan|ckpt_die|slow (parsed by dist_init; malformed: exit 2; a
 * fault for another attempt than LLMTRAIN_ATTEMPT is no fault).
 * dist_fault_point runs at the start of 1-based step `step` (hang / die /
 * slow: sleep 1 s);
 * dist_fault_nan says whether this rank poisons its gradients at `step`;
 * dist_fault_ckpt_die whether it dies halfway through writing its file of
 * the checkpoint of step `step`. */
void dist_fault_point(Dist *d, int step);
int dist_fault_nan(Dist *d, int step);
int dist_fault_ckpt_die(Dist *d, int step);
/* Startup health check (collective, every rank): time an all-reduce of
 * `bytes` on each group this rank is in; rank 0 prints one `health:` line per
 * group kind with the slowest group's bus bandwidth. Returns 1 when every
 * group reaches min_gbps, else 0 (rank 0 has printed the failure line). */
int dist_health_check(Dist *d, size_t bytes, double min_gbps);
/* World: broadcast n bytes from rank 0. */
void dist_bcast_bytes(Dist *d, void *buf, size_t n);
/* Bring every rank down after a fatal error on this one. */
void dist_abort(Dist *d, int code) __attribute__((noreturn));

#endif
