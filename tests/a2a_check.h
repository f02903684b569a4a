/* tests/a2a_check.h — the expert group's all-to-all checked the same way
 * by the suites that drive it (test_dist_dev over MPI / TCP,
 * test_dist_nccl over the fake NCCL, test_nccl_emu over the emulated one):
 * random sizes per (sender, receiver, round) with zeros, a rank that sends
 * nothing and a round where none does, every byte a function of where it
 * comes from, blocks laid out in reverse member order with gaps, and the
 * expected bytes computed here from the layout's formula. Header-only:
 * include it after parallel.h and util.h. */
#ifndef LLMTRAIN_TEST_A2A_CHECK_H
#define LLMTRAIN_TEST_A2A_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes world rank src sends member dst of its expert group in round r
 * (0..3): 0..37, zero for about one pair in four; in round 1 world rank 1
 * sends nothing at all, in round 2 no rank sends anything. */
static size_t a2a_count(int src, int dst, int r) {
    if (r == 2 || (r == 1 && src == 1)) return 0;
    unsigned h = (unsigned)(src * 7919 + dst * 104729 + r * 1299709) * 2654435761u;
    h ^= h >> 13;
    return h % 4 == 0 ? 0 : (size_t)(h >> 16) % 38;
}
static unsigned char a2a_byte(int src, int dst, size_t k, int r) { return (unsigned char)(src * 31 + dst * 7 + (int)k * 13 + r); }

/* World rank of member i of this rank's expert group, written out from the
 * layout (tp innermost, then dp x cp; blocks of ep consecutive dp indices). */
static int a2a_member(int rank, int tp, int ep, int i) { return (rank / tp / ep * ep + i) * tp + rank % tp; }

/* What a round moved, for the callers' own checks (the NCCL calls it takes). */
typedef struct A2aRound {
    int peer_ops;   /* nonzero sends and receives with other members */
    int self_bytes; /* this rank's own block */
} A2aRound;

/* Round r of dist_alltoall_counts and dist_alltoallv over the expert group
 * (ep members; buffers from alloc, device memory where it is, written and
 * read through put / get, e.g. a copy; NULL: host memory). 1 when every
 * received byte, the fill outside the blocks and bytes_ep are right, else
 * 0 and why. */
static int a2a_round(Dist *d, int tp, int ep, int r, A2aRound *out, char *why, size_t wn) {
    int me = d->ep_rank;
    size_t sc[64], sd[64], rc[64], rd[64], want[64], at = 0;
    for (int j = ep - 1; j >= 0; j--) { /* send blocks: the last member's first, 3 bytes apart */
        sc[j] = a2a_count(d->rank, j, r);
        sd[j] = at;
        at += sc[j] + 3;
    }
    unsigned char *send = malloc_check(at + 1);
    memset(send, 0x5a, at + 1);
    for (int j = 0; j < ep; j++)
        for (size_t k = 0; k < sc[j]; k++) send[sd[j] + k] = a2a_byte(d->rank, j, k, r);
    for (int i = 0; i < ep; i++) rc[i] = (size_t)-1;
    dist_alltoall_counts(d, DIST_GROUP_EP, sc, rc);
    int ok = 1;
    for (int i = 0; i < ep; i++) {
        want[i] = a2a_count(a2a_member(d->rank, tp, ep, i), me, r);
        if (rc[i] != want[i] && ok) {
            snprintf(why, wn, "round %d: dist_alltoall_counts: member %d sends %zu, expected %zu", r, i, rc[i], want[i]);
            ok = 0;
        }
    }
    size_t rat = 5;
    for (int i = ep - 1; i >= 0; i--) { /* receive blocks: reversed too, 2 bytes apart, 5 in */
        rd[i] = rat;
        rat += want[i] + 2;
    }
    unsigned char *recv = malloc_check(rat + 1);
    memset(recv, 0xee, rat + 1);
    double b0 = d->bytes_ep, sent = 0;
    out->peer_ops = 0;
    for (int j = 0; j < ep; j++) {
        sent += j == me ? 0 : (double)sc[j];
        out->peer_ops += j != me && sc[j] > 0;
        out->peer_ops += j != me && want[j] > 0;
    }
    out->self_bytes = (int)sc[me];
    dist_alltoallv(d, DIST_GROUP_EP, send, sc, sd, recv, want, rd);
    for (int i = 0; i < ep && ok; i++) {
        int src = a2a_member(d->rank, tp, ep, i);
        for (size_t k = 0; k < want[i] && ok; k++)
            if (recv[rd[i] + k] != a2a_byte(src, me, k, r)) {
                snprintf(why, wn, "round %d: dist_alltoallv: byte %zu of member %d's block (world rank %d): %d, expected %d", r, k, i,
                         src, recv[rd[i] + k], a2a_byte(src, me, k, r));
                ok = 0;
            }
    }
    for (size_t k = 0; k <= rat && ok; k++) { /* outside the blocks: still the fill */
        int in = 0;
        for (int i = 0; i < ep; i++) in |= k >= rd[i] && k < rd[i] + want[i];
        if (!in && recv[k] != 0xee) {
            snprintf(why, wn, "round %d: dist_alltoallv wrote byte %zu, outside every block", r, k);
            ok = 0;
        }
    }
    if (ok && d->bytes_ep - b0 != sent) {
        snprintf(why, wn, "round %d: bytes_ep grew by %g, expected %g (the bytes sent to the other members)", r, d->bytes_ep - b0, sent);
        ok = 0;
    }
    free(send);
    free(recv);
    return ok;
}

/* The members' world ranks in member order, through the all-to-all itself
 * (each member's rank to every member): 1 when they are the formula's. */
static int a2a_members(Dist *d, int tp, int ep, char *why, size_t wn) {
    size_t one[64], disp[64];
    int mine[64], ranks[64];
    for (int i = 0; i < ep; i++) one[i] = sizeof(int), disp[i] = (size_t)i * sizeof(int), ranks[i] = -1, mine[i] = d->rank;
    dist_alltoallv(d, DIST_GROUP_EP, mine, one, disp, ranks, one, disp);
    for (int i = 0; i < ep; i++)
        if (ranks[i] != a2a_member(d->rank, tp, ep, i)) {
            snprintf(why, wn, "ep %d: member %d is world rank %d, expected %d", ep, i, ranks[i], a2a_member(d->rank, tp, ep, i));
            return 0;
        }
    return 1;
}
#endif
