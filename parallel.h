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
/* Bring every rank down after a fatal error on this one. */
void dist_abort(Dist *d, int code) __attribute__((noreturn));

#endif
