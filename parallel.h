/* parallel.h — who this rank is and how it talks to the others: launch
 * detection (mpirun, PMI/PMIx, torchrun-style variables, or a world of
 * one), process groups and the collectives model and trainer use. Nothing
 * outside parallel.c calls MPI. */
#ifndef LLMTRAIN_PARALLEL_H
#define LLMTRAIN_PARALLEL_H
#include <stddef.h>
#include <stdint.h>

/* The named process groups of a layout, which every collective below
 * takes (as torchtitan names its mesh axes): tp (dist_set_tp), shard,
 * replicate and dp (dist_setup_groups), cp (dist_set_cp), ep (dist_set_ep)
 * and the world. The context and expert groups come after DIST_N_GROUPS,
 * the data-parallel groups' count; a device communicator has one for each
 * group before DIST_N_GROUPS_CP, none for the world (a new axis goes
 * before it). */
enum { DIST_GROUP_TP, DIST_GROUP_SHARD, DIST_GROUP_REPLICATE, DIST_GROUP_DP, DIST_N_GROUPS,
       DIST_GROUP_CP = DIST_N_GROUPS, DIST_GROUP_EP, DIST_N_GROUPS_CP, DIST_GROUP_WORLD = DIST_N_GROUPS_CP };
/* A collective's elements (n counts them): float32, bf16 words, float64, bytes. */
enum { DIST_F32, DIST_BF16, DIST_F64, DIST_BYTE };
/* An all-reduce's operation. */
enum { DIST_SUM = 0, DIST_MAX = 1 };

/* Operations of a device communication library: on float32 elements, but
 * DIST_OP_ALLGATHER_BF16 gathers 16-bit words (bf16; NCCL's ncclBfloat16)
 * and DIST_OP_SENDRECV moves n bytes: send to the next member of the group
 * (index + 1 mod size), recv from the previous one (NCCL's ncclSend and
 * ncclRecv in one group call). */
enum { DIST_OP_ALLREDUCE_SUM, DIST_OP_ALLREDUCE_MAX, DIST_OP_ALLGATHER, DIST_OP_REDUCE_SCATTER, DIST_OP_ALLGATHER_BF16,
       DIST_OP_SENDRECV };

/* The float32 collectives (and the bf16 all-gather) on backend memory
 * through the backend's own library (the CUDA backend: NCCL, dist_nccl.c),
 * attached with dist_attach_device. Without one they run MPI on host memory; the
 * float64, gather and broadcast collectives always do (their buffers are
 * host memory). Every operation is ordered after the backend work queued
 * before it was started. start(h, ...) begins one on a group with the
 * buffers and in-place rules of the dist_* call it serves; wait(h) orders
 * the backend's later work after it (it need not block the host); test(h)
 * says whether it has completed. Handles are small integers parallel.c
 * hands out; n counts elements of the op's type. copy: a one-member
 * group's copy of `bytes` in backend memory.
 * time_allreduce: seconds per all-reduce of n floats on a group (health
 * check), after `warmup` untimed ones. abort: called by the watchdog thread
 * before it exits (the main thread may be blocked on the device). close:
 * called by dist_finalize. alltoallv: start dist_alltoallv's exchange on
 * group g under handle h (byte counts and displacements per member, host
 * arrays read before it returns; buffers in backend memory). */
typedef struct DistDevComm {
    void *ctx;
    const char *name; /* "NCCL 2.28.9" */
    void (*start)(void *ctx, int h, int op, int group, const void *send, void *recv, size_t n);
    void (*wait)(void *ctx, int h);
    int (*test)(void *ctx, int h);
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    double (*time_allreduce)(void *ctx, int group, size_t n, int warmup, int iters);
    void (*abort)(void *ctx);
    void (*close)(void *ctx);
    void (*alltoallv)(void *ctx, int h, int group, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                      const size_t *rcount, const size_t *rdispl);
} DistDevComm;

typedef struct Dist {
    int rank, world, local_rank;
    int local_size;       /* ranks on this node */
    int use_mpi;          /* collectives go through MPI */
    struct Rendezvous *rdzv; /* else (torchrun-style launch, world > 1): the world's TCP rendezvous */
    char launch[200];     /* how this world was formed, for the start-up output */
    int dp, dp_rank;      /* data-parallel degree and this rank's index */
    /* tensor parallelism (dist_set_tp): world = tp x dp, tp innermost:
     * tp_rank = rank % tp, dp_rank = rank / tp, dp = world / tp */
    int tp, tp_rank;
    /* context parallelism (dist_set_cp): world = tp x cp x (dp / cp), tp
     * innermost, then cp: cp_rank = dp_rank % cp. dp and dp_rank above
     * count data-parallel and context ranks together (Megatron's dp-cp
     * group: gradients are reduced and state sharded over it); the ranks
     * of a context group read the same sequences (dist_seq_dp) */
    int cp, cp_rank;
    /* expert parallelism (dist_set_ep): an expert group is ep consecutive
     * data-parallel indices (dp x cp) of one tp_rank, innermost: ep_rank =
     * dp_rank % ep, its group dp_rank / ep */
    int ep, ep_rank;
    /* communication volume of the current step in bus bytes (NCCL-tests
     * convention), reset by dist_comm_reset */
    double bytes_allgather, bytes_reduce_scatter, bytes_allreduce, bytes_tp_allreduce;
    double bytes_tp_allgather, bytes_tp_reduce_scatter; /* sequence parallelism's */
    double bytes_cp; /* context parallelism's ring: bytes this rank sent (dist_shift_start) */
    double bytes_ep; /* expert parallelism's all-to-all: bytes this rank sent to the other members (dist_alltoallv) */
    /* seconds this rank spent blocked in collectives and waits since
     * dist_comm_reset: communication that compute did not hide */
    double comm_wait_s, coll_t0;
    /* data-parallel groups (dist_setup_groups): shard x replicate, shard
     * innermost. shard_size S ranks share one copy of the sharded state;
     * shard_index = rank % S, shard_group = rank / S; replicate_size R = dp / S. */
    int shard_size, shard_index, shard_group, replicate_size;
    struct DistGroups *groups; /* the two sub-communicators (NULL: none) */
    struct DistWatch *watch; /* watchdog state (NULL until dist_watchdog_start) */
    const DistDevComm *dev;  /* float32 collectives on device memory (NULL: MPI) */
    /* the step and phase of the last dist_phase (0 and NULL before it) */
    int phase_step;
    const char *phase;
    /* LLMTRAIN_COMM_TRACE: this rank's trace of its data-parallel
     * collectives (NULL: off; see dist_init) */
    void *trace;
    /* test-only fault injection from LLMTRAIN_FAULT (kind 0: none) */
    int fault_kind, fault_rank, fault_step_lo, fault_step_hi;
} Dist;

/* Detect the launcher: initialise MPI when one started us; under a
 * torchrun-style launch (WORLD_SIZE > 1 without MPI) form the world over the
 * TCP rendezvous (rendezvous.h) at MASTER_ADDR:MASTER_PORT, and run the host
 * collectives there (a star through each group's first member: fine for the
 * scalars and bootstrap bytes of the CUDA backend, whose tensors go through
 * NCCL; slow for the CPU backend's gradients). Bad variables: exit 2; a
 * rendezvous that does not complete: exit 6. */
void dist_init(Dist *d, int *argc, char ***argv);
/* LLMTRAIN_COMM_TRACE=PREFIX (debugging; read by dist_init): each rank
 * writes PREFIX.<rank>, one line per data-parallel float32 collective on
 * backend memory as it is started and per wait on a non-blocking one:
 * `step S phase P start KIND GROUP N hH` (KIND allreduce, allgather,
 * allgather_bf16 or reduce_scatter; GROUP dp, shard or replicate; N
 * elements per member; H the handle, -1 for a blocking one or one already
 * done; and the expert group's `alltoallv ep N h-1`, N the bytes this rank
 * sends to the other members) and `step S phase P wait hH`. A file that cannot be opened: exit 2. */
void dist_finalize(Dist *d);
/* The collectives: one family over the named groups. Each (group, type,
 * operation) the layouts use is below; any other is exit 70 (EXIT_INTERNAL)
 * naming it. float32 and bf16 collectives take backend memory (device
 * memory under an attached DistDevComm); float64, byte, gather and
 * broadcast collectives take host memory, but the context group's byte
 * all-gather and the expert group's all-to-all (backend memory; its count
 * exchange, host memory). A group of one member copies (or does
 * nothing in place).
 *
 * dist_allreduce, in place over group g:
 *   dp       F32 SUM  (ranks of the same tp_rank: the data-parallel sum)
 *   replicate F32 SUM (HYBRID_SHARD's sum of a chunk's gradient shard)
 *   tp       F32 SUM or MAX
 *   cp       F32 MAX  (FP8 amaxes of tensors whose tokens the group
 *                      splits; counted in bytes_cp as bus bytes, 2 (cp - 1)
 *                      / cp x the floats)
 *   world, tp, cp, shard  F64 SUM (host memory; cp's: sampling moves a row
 *                      of logits and the choice with it) */
void dist_allreduce(Dist *d, int g, int type, int op, void *x, size_t n);
/* Non-blocking float32 sum in place over dp or replicate (counted when
 * started): a handle for dist_wait / dist_test, or -1 when the group has
 * one member or it is already done (over TCP, the collective itself). x
 * stays untouched until the wait. */
int dist_iallreduce(Dist *d, int g, float *x, size_t n);
/* dist_allgather, every member's n elements into recv[size * n] (member i's
 * block at i * n):
 *   tp     F32 or BF16 (sequence parallelism)
 *   shard  F32 or BF16 (the working weights under train.param_dtype bf16,
 *          2 bytes each, counted so)
 *   cp     BYTE, backend memory (parallel.context_mode all_gather; n even: a
 *          device communicator moves 16-bit words; counted in bytes_cp as
 *          bus bytes, (cp - 1) x the block each)
 *   world  BYTE, host memory
 * dist_reduce_scatter (float32 sum) of send[size * n], block index into
 * recv[n]: tp, shard, cp (counted in bytes_cp as (cp - 1) x the block). */
void dist_allgather(Dist *d, int g, int type, const void *send, void *recv, size_t n);
void dist_reduce_scatter(Dist *d, int g, const float *send, float *recv, size_t n);
/* Non-blocking shard-group all-gather (F32, BF16) / reduce-scatter (same
 * buffers and byte counts as the blocking ones, counted when started). They
 * return a handle for dist_wait / dist_test, or -1 when the group has one
 * member (the copy is already done). Buffers stay untouched until the wait.
 * A reduce-scatter with recv == send runs in place: the result lands in
 * send[0, n). */
int dist_iallgather(Dist *d, int g, int type, const void *send, void *recv, size_t n);
int dist_ireduce_scatter(Dist *d, int g, const float *send, float *recv, size_t n);
/* Gather n elements of HOST memory to the group's first member
 * (recv[size * n] there; always MPI or TCP): tp F32, shard F32, world F64. */
void dist_gather(Dist *d, int g, int type, const void *send, void *recv, size_t n);
/* Broadcast n bytes of host memory from the group's first member: the world,
 * or any other group (bootstraps a device communicator; needs
 * dist_setup_groups). */
void dist_bcast(Dist *d, int g, void *buf, size_t n);
/* The context group's ring, backend memory: send `bytes` to the next member
 * (cp_rank + 1 mod cp) and receive as many from the previous one into
 * recv, started: a handle for dist_shift_wait. Over a device communicator
 * (NCCL) it is queued on the communication stream after the backend's
 * work so far and the backend's later work keeps running beside it until
 * dist_shift_wait; over MPI it is MPI_Irecv and MPI_Isend under one handle
 * (a shift over 2^31 - 1 bytes: MPI_Sendrecv, done before this returns,
 * handle -1); over TCP, which has no point-to-point, an all-gather of the
 * group whose previous member's block is kept (-1). Shifts in flight
 * together pair up in the order they were started (MPI's message order:
 * every member starts them in the same order). Counted in bytes_cp as the
 * bytes sent. g: DIST_GROUP_CP. */
int dist_shift_start(Dist *d, int g, const void *send, void *recv, size_t bytes);
/* The backend's later work after shift h (-1: nothing); the host does not
 * wait for a device communicator's. */
void dist_shift_wait(Dist *d, int h);
/* The expert group's all-to-all of variable sizes, in bytes, on backend
 * memory (device memory under an attached DistDevComm): member j of group
 * g gets scount[j] bytes from send + sdispl[j]; this rank gets rcount[i]
 * bytes from member i at recv + rdispl[i] (rcount[i] must be what member
 * i sends it: dist_alltoall_counts). Counts may be zero, a rank may send
 * nothing at all; every member still calls it. Blocking for the backend:
 * its later work sees the result (NCCL: ncclSend / ncclRecv per peer with
 * a nonzero count in one group call on the communication stream, this
 * rank's own block a copy there; MPI: MPI_Alltoallv, counts and
 * displacements past 2^31 - 1 bytes exit 70; TCP: the members' counts
 * all-gathered, their blocks gathered to the first member and scattered
 * from it, which holds 2 x members x the largest member's bytes). Counted
 * in bytes_ep: the bytes sent to the other members. g: DIST_GROUP_EP. */
void dist_alltoallv(Dist *d, int g, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                    const size_t *rcount, const size_t *rdispl);
/* The count exchange before dist_alltoallv, host memory: recv[i] = member
 * i's send[this rank's index] (one size_t per member each way). g:
 * DIST_GROUP_EP. */
void dist_alltoall_counts(Dist *d, int g, const size_t *send, size_t *recv);
/* Complete and release a handle (-1: nothing); the watchdog names its
 * collective while waiting. dist_test only drives progress and says whether
 * it has completed: every handle still needs its dist_wait. */
void dist_wait(Dist *d, int h);
int dist_test(Dist *d, int h);
void dist_barrier(Dist *d);
void dist_comm_reset(Dist *d);
/* Split the data-parallel ranks into shard groups of S consecutive ranks
 * and replicate groups (same rank % S). S must divide dp. Collective. */
void dist_setup_groups(Dist *d, int S);
/* Set the tensor-parallel degree (before dist_setup_groups; tp divides
 * world). Shard / replicate / data-parallel groups are then formed among
 * ranks of the same tp_rank, and a TP group of the tp consecutive ranks. */
void dist_set_tp(Dist *d, int tp);
/* Set the context-parallel degree (after dist_set_tp, before
 * dist_setup_groups; cp divides world / tp). A context group is the cp
 * consecutive data-parallel indices of one tp_rank. */
void dist_set_cp(Dist *d, int cp);
/* Set the expert-parallel degree (after dist_set_cp, before
 * dist_setup_groups; ep divides dp, which counts the context ranks). An
 * expert group is the ep consecutive data-parallel indices of one
 * tp_rank: with tp and cp innermost of the world, its ranks are the
 * nearest ones of that tp_rank (a node's, as Megatron places expert
 * groups), so the all-to-all stays inside a node when ep x tp fits one. */
void dist_set_ep(Dist *d, int ep);
/* The batch arithmetic's data-parallel degree and this rank's index in it:
 * sequences are split over dp / cp slots, not over dp x cp ranks. */
static inline int dist_seq_dp(const Dist *d) { return d->dp / (d->cp > 0 ? d->cp : 1); }
static inline int dist_seq_rank(const Dist *d) { return d->dp_rank / (d->cp > 0 ? d->cp : 1); }
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
 * with K hang|die|nan|ckpt_die|ckpt_rot|ckpt_slow|ckpt_hang|slow|low_peak (parsed by dist_init; malformed: exit 2; a
 * fault for another attempt than LLMTRAIN_ATTEMPT is no fault).
 * dist_fault_point runs at the start of 1-based step `step` (hang / die /
 * slow: sleep 1 s);
 * dist_fault_nan says whether this rank poisons its gradients at `step`;
 * dist_fault_ckpt_die whether it dies halfway through writing its file of
 * the checkpoint of step `step`. */
void dist_fault_point(Dist *d, int step);
int dist_fault_nan(Dist *d, int step);
int dist_fault_ckpt_die(Dist *d, int step);
/* ... whether it flips a byte of its local file of the checkpoint of step
 * `step` once that checkpoint is complete, before the durable copy reads
 * it (kind=ckpt_rot: the local disk changed what was written) */
int dist_fault_ckpt_rot(Dist *d, int step);
/* ... whether its writer writes its file of the checkpoint of step `step`
 * slowly (kind=ckpt_slow: 4 KiB pieces 20 ms apart, progressing) or never
 * (kind=ckpt_hang: the write blocks) */
int dist_fault_ckpt_slow(Dist *d, int step);
int dist_fault_ckpt_hang(Dist *d, int step);
/* ... and whether this rank divides its MFU peak by 10^4 at `step`
 * (kind=low_peak: as a peak measured while the cores were busy reads low) */
int dist_fault_low_peak(Dist *d, int step);
/* Startup health check (collective, every rank): time an all-reduce of
 * `bytes` on each group this rank is in; rank 0 prints one `health:` line per
 * group kind with the slowest group's bus bandwidth. Returns 1 when every
 * group reaches min_gbps, else 0 (rank 0 has printed the failure line). */
int dist_health_check(Dist *d, size_t bytes, double min_gbps);
/* This rank's index in group g (DIST_GROUP_*) and the group's size. */
void dist_group_rank(const Dist *d, int g, int *rank, int *size);
/* Route the float32 collectives through dev (after dist_setup_groups; dev
 * outlives the Dist) and give the watchdog its abort. */
void dist_attach_device(Dist *d, const DistDevComm *dev);
/* Bring every rank down after a fatal error on this one. */
void dist_abort(Dist *d, int code) __attribute__((noreturn));

#endif
