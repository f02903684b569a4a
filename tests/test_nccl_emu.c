/* test_nccl_emu.c — the expert group's all-to-all through dist_nccl.c on
 * the host emulation's NCCL and CUDA runtime (tests/cuda_emu: nccl_emu.c's
 * grouped ncclSend / ncclRecv over MPI, emu.cpp's streams and copies), the
 * pair tests/llmtrain_emu runs: the members and rounds of random sizes of
 * tests/a2a_check.h, and a receive whose count is not its sender's, which
 * the emulation refuses as the hardware would not (NCCL leaves it
 * undefined): one line naming the collective and the counts, exit 70.
 *
 *   mpirun -np N test_nccl_emu TP EP       layout tp x dp with expert groups of EP
 *   mpirun -np 2 test_nccl_emu mismatch    rank 1 expects 12 bytes from rank 0, which sends 8
 * Rank 0 prints "N passed, M failed" over every rank's checks. */
#include "dist_nccl.h"
#include "parallel.h"
#include "util.h"
#include "a2a_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the CUDA backend's side dist_nccl.c calls (kernels.cu's): the legacy stream, no host-wait hook */
void *kernels_cuda_stream(void) { return NULL; }
void kernels_cuda_set_host_wait(void (*poll)(void *ctx), void *ctx) { (void)poll; (void)ctx; }

static int pass, fail;
static void expect(int rank, int ok, const char *why) {
    pass += ok;
    fail += !ok;
    if (!ok) printf("FAIL rank %d: %s\n", rank, why);
}

int main(int argc, char **argv) {
    Dist d;
    dist_init(&d, &argc, &argv);
    if (argc == 2 && strcmp(argv[1], "mismatch") == 0) {
        dist_set_ep(&d, 2);
        dist_setup_groups(&d, 1);
        dist_nccl_attach(&d);
        size_t sc[2] = {0, 8}, rc[2] = {d.rank == 1 ? 12 : 0, 0}, o[2] = {0, 0};
        char s8[16] = {0}, r8[16];
        if (d.rank == 1) sc[1] = 0, sc[0] = 0;
        dist_alltoallv(&d, DIST_GROUP_EP, s8, sc, o, r8, rc, o); /* rank 1: exit 70 */
        dist_barrier(&d);
        printf("rank %d: the mismatch was not reported\n", d.rank);
        return 1;
    }
    if (argc != 3) die(EXIT_USAGE, "usage: test_nccl_emu TP EP | mismatch");
    int tp = atoi(argv[1]), ep = atoi(argv[2]);
    dist_set_tp(&d, tp);
    dist_set_ep(&d, ep);
    dist_setup_groups(&d, 1);
    dist_nccl_attach(&d);
    expect(d.rank, d.dev && strncmp(d.dev->name, "NCCL 2.28", 9) == 0, "not attached to the emulated NCCL");
    char why[256] = "";
    expect(d.rank, a2a_members(&d, tp, ep, why, sizeof why), why);
    A2aRound got;
    for (int r = 0; r < 4; r++) expect(d.rank, a2a_round(&d, tp, ep, r, &got, why, sizeof why), why);
    double tot[2] = {pass, fail};
    dist_allreduce(&d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, tot, 2);
    dist_finalize(&d);
    if (d.rank == 0) printf("%d passed, %d failed\n", (int)tot[0], (int)tot[1]);
    return tot[1] ? 1 : 0;
}
