/* parallel.h — who this rank is and how it talks to the others: launch
 * detection (mpirun, PMI/PMIx, torchrun-style variables, or a world of
 * one), process groups and the collectives model and trainer use. Nothing
 * outside parallel.c calls MPI. */
#ifndef LLMTRAIN_PARALLEL_H
#define LLMTRAIN_PARALLEL_H
#include <stddef.h>

typedef struct Dist {
    int rank, world, local_rank;
    int use_mpi;          /* collectives go through MPI */
    int dp, dp_rank;      /* data-parallel degree and this rank's index */
    double bytes_allreduce; /* communication volume of the current step */
    struct DistWatch *watch; /* watchdog state (NULL until dist_watchdog_start) */
    /* test-only fault injection from LLMTRAIN_FAULT (kind 0: none) */
    int fault_kind, fault_rank, fault_step_lo, fault_step_hi;
} Dist;

/* Detect the launcher and initialise MPI when one started us. A
 * torchrun-style launch (WORLD_SIZE > 1 without MPI) on the CPU backend is
 * one clear error: CPU collectives need MPI. */
void dist_init(Dist *d, int *argc, char ***argv);
void dist_finalize(Dist *d);
/* Sum in place over the data-parallel group (float32 / float64). */
void dist_allreduce_sum_f32(Dist *d, float *x, size_t n);
void dist_allreduce_sum_f64(Dist *d, double *x, size_t n);
void dist_barrier(Dist *d);
/* Watchdog: a background thread that ends the job with exit code 5
 * (EXIT_TIMEOUT) when the phase recorded by dist_phase has lasted longer
 * than timeout_s seconds, printing one line naming rank, step, phase and the
 * collective in flight. timeout_s <= 0 disables it. It arms at the first
 * dist_phase call. */
void dist_watchdog_start(Dist *d, double timeout_s);
/* Heartbeat from the main thread: step (1-based) and phase name (a string
 * that outlives the call, e.g. a literal: "forward", "allreduce", ...). */
void dist_phase(Dist *d, int step, const char *phase);
/* Test-only fault injection, LLMTRAIN_FAULT="rank=R,step=S[-E],kind=K"
 * with K hang|die|nan (parsed by dist_init; malformed: exit 2).
 * dist_fault_point runs at the start of 1-based step `step` (hang / die);
 * dist_fault_nan says whether this rank poisons its gradients at `step`. */
void dist_fault_point(Dist *d, int step);
int dist_fault_nan(Dist *d, int step);
/* Bring every rank down after a fatal error on this one. */
void dist_abort(Dist *d, int code) __attribute__((noreturn));

#endif
