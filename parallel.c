/* parallel.c — launch detection and collectives over MPI. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "parallel.h"
#include "util.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
           getenv("PMI_RANK") || getenv("MPI_LOCALNRANKS");
}

void dist_init(Dist *d, int *argc, char ***argv) {
    memset(d, 0, sizeof *d);
    d->world = 1;
    if (launched_by_mpi()) {
        int provided;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            die(EXIT_USAGE, "MPI_Init failed");
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &d->world);
        d->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", env_int("PMI_LOCAL_RANK", 0)));
        d->use_mpi = 1;
    } else if (env_int("WORLD_SIZE", 1) > 1) {
        die(EXIT_USAGE, "WORLD_SIZE=%d set by a torchrun-style launcher, but the CPU backend needs MPI for "
            "collectives: launch with mpirun -np %d instead", env_int("WORLD_SIZE", 1), env_int("WORLD_SIZE", 1));
    }
    d->dp = d->world;
    d->dp_rank = d->rank;
}

void dist_finalize(Dist *d) {
    if (d->use_mpi) MPI_Finalize();
}

static void check(Dist *d, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "llmtrain: rank %d: %s failed: %s\n", d->rank, what, msg);
    dist_abort(d, EXIT_PEER);
}

void dist_allreduce_sum_f32(Dist *d, float *x, size_t n) {
    if (d->world == 1) return;
    for (size_t off = 0; off < n; off += (size_t)1 << 30) {
        int cnt = (int)(n - off < ((size_t)1 << 30) ? n - off : ((size_t)1 << 30));
        check(d, MPI_Allreduce(MPI_IN_PLACE, x + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    }
    d->bytes_allreduce += 2.0 * (d->world - 1) / d->world * (double)n * sizeof(float);
}

void dist_allreduce_sum_f64(Dist *d, double *x, size_t n) {
    if (d->world == 1) return;
    check(d, MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
}

void dist_barrier(Dist *d) {
    if (d->use_mpi) MPI_Barrier(MPI_COMM_WORLD);
}

void dist_abort(Dist *d, int code) {
    fflush(stdout);
    fflush(stderr);
    if (d->use_mpi && d->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}
