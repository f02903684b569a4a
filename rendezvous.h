/* rendezvous.h — a TCP rendezvous for launches without MPI (torchrun-style:
 * RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): reading those
 * variables, forming the group at MASTER_ADDR:MASTER_PORT, and the few small
 * collectives a bootstrap and the host side of training need (rank 0's
 * bytes to all, for the 128-byte ncclUniqueId; every rank's bytes to all,
 * for hostnames; gather and scatter through rank 0; a barrier; splitting into
 * subgroups). It is a star through rank 0: every byte passes rank 0, so it
 * suits scalars and small tensors, not bandwidth. No MPI, no CUDA.
 *
 * Every call that can fail returns NULL / -1 and writes one line (no
 * newline) saying why into the caller's buffer; nothing is printed. Every
 * blocking call ends within about timeout_s (rdzv_open's, counted from the
 * start of each call; ranks other than 0 wait up to 0.5 s longer for rank 0,
 * whose reason names the culprit, and rank 0 spends up to 0.5 s telling the
 * others why it failed), and a peer that exits gives an error at once, not a
 * hang. When any rank fails, every rank's pending or next call fails: rank 0
 * sends its reason to the others, and another rank closes its connection.
 * After an error the handle is broken: later calls fail with the first reason
 * (rdzv_close is still needed). Not thread-safe: one caller per handle. */
#ifndef LLMTRAIN_RENDEZVOUS_H
#define LLMTRAIN_RENDEZVOUS_H
#include <stddef.h>

typedef struct Rendezvous Rendezvous;

/* The torchrun variables. LOCAL_WORLD_SIZE is optional (local_world = -1
 * when unset: derive it, e.g. from an allgather of host names). */
#define RDZV_JOB_MAX 161
typedef struct RdzvEnv {
    int rank, world, local_rank, local_world;
    char master_addr[256];
    int master_port;
    /* what tells this job's rendezvous from another's on the same port
     * (rdzv_open_job): LLMTRAIN_RDZV_ID, else TORCHELASTIC_RUN_ID (torchrun's
     * --rdzv-id; its default "none" counts as unset), else SLURM_JOB_ID,
     * else ""; an srun step's: SLURM_JOB_ID.SLURM_STEP_ID */
    char job[RDZV_JOB_MAX];
} RdzvEnv;

/* Parse RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (optional),
 * MASTER_ADDR and MASTER_PORT with range checks. 0, or -1 with a reason
 * naming the variable and what was expected. */
int rdzv_env(RdzvEnv *e, char *why, size_t n);
/* WORLD_SIZE alone, as rdzv_env checks it: 1 read into *world, 0 unset
 * or empty, -1 with the reason (WORLD_SIZE=abc, 0, -4, past 2^20). */
int rdzv_env_world(int *world, char *why, size_t n);

/* A task of an srun step (Slurm) launched without MPI: world from
 * SLURM_STEP_NUM_TASKS, rank from SLURM_PROCID, local rank from
 * SLURM_LOCALID (local_world -1: derive it), rank 0's address from
 * MASTER_ADDR, else the first host of SLURM_STEP_NODELIST (else
 * SLURM_JOB_NODELIST), and the port from MASTER_PORT, else
 * RDZV_SLURM_PORT(SLURM_JOB_ID, SLURM_STEP_ID). 1 read (world 1: a step
 * of one task, nothing past the count read), 0 not in an srun step
 * (SLURM_STEP_NUM_TASKS unset or empty), -1 with the reason naming the
 * variable. */
int rdzv_env_slurm(RdzvEnv *e, char *why, size_t n);
/* The port of a Slurm step's rendezvous: 15000..31999, below Linux's
 * ephemeral ports, different for the 8 steps of a job that may run at once
 * and for jobs whose ids differ by less than 2125. */
#define RDZV_SLURM_PORT(job, step) (15000 + (int)(((unsigned long long)(job) * 8 + (unsigned)(step) % 8) % 17000))
/* The first host name of a Slurm node list ("node[07-09,12],gpu1" ->
 * "node07"; a bracket's first number keeps its zero padding; several
 * brackets in a name each give their first). 0, or -1 with the reason. */
int rdzv_hostlist_first(const char *list, char *out, size_t outn, char *why, size_t n);

/* Form the group of `world` ranks. Rank 0 listens on addr:port and accepts
 * the other world-1 ranks; they connect, retrying until timeout_s (rank 0
 * may start later). Bind address: when addr is a numeric address of this
 * host, rank 0 binds to it (the rendezvous stays on the network it names);
 * for a host name, or an address that is not on this host (NAT, a forwarded
 * port), it binds the wildcard of the address family, since a host name may
 * resolve to a loopback address on its own host (Debian maps the host name to
 * 127.0.1.1) and to the real interface elsewhere. A connection that does not
 * speak this protocol is dropped and waiting goes on; a peer with another
 * protocol version or world size, a rank out of range or a rank that
 * connects twice ends the rendezvous on every connected rank with the reason.
 * Returns after every rank has arrived, or NULL with the reason (a timeout
 * names the ranks that never arrived). world = 1 opens no socket. */
Rendezvous *rdzv_open(const char *addr, int port, int rank, int world, double timeout_s, char *why, size_t n);
/* rdzv_open for the ranks of one job: each hello carries a key of `job`
 * (at most RDZV_JOB_MAX - 1 bytes are used; rdzv_open's is ""), and rank 0
 * turns away a connection whose key differs (another job's rank on the
 * same port) without failing: that rank fails at once, saying both ids,
 * and rank 0 waits on for its own ranks (a timeout counts those turned
 * away). The groups rdzv_split forms carry the parent's id. */
Rendezvous *rdzv_open_job(const char *addr, int port, int rank, int world, const char *job, double timeout_s, char *why,
                          size_t n);

/* Rank 0's n bytes of buf to every rank's buf. */
int rdzv_bcast(Rendezvous *r, void *buf, size_t n, char *why, size_t wn);
/* Every rank's n bytes of send to every rank's recv[world * n], rank i's at
 * recv + i * n. */
int rdzv_allgather(Rendezvous *r, const void *send, void *recv, size_t n, char *why, size_t wn);
/* Returns on any rank only after every rank has entered it. */
int rdzv_barrier(Rendezvous *r, char *why, size_t wn);
/* Every rank's n bytes of send to rank 0's recv[world * n] (rank i's at
 * recv + i * n; recv is not touched elsewhere). Ranks other than 0 return
 * once theirs is sent. */
int rdzv_gather(Rendezvous *r, const void *send, void *recv, size_t n, char *why, size_t wn);
/* Rank 0's send[world * n]: block i to rank i's recv (n bytes). */
int rdzv_scatter(Rendezvous *r, const void *send, void *recv, size_t n, char *why, size_t wn);
/* Collective over parent, like MPI_Comm_split: ranks of the same color form
 * a group ordered by (key, parent rank). The group's first member listens on
 * a port the kernel picks, on every address, and tells the members over the
 * parent the address it reached parent rank 0 through (when that is loopback:
 * its first non-loopback interface of the same family, if any); they connect
 * there. Concurrent splits of disjoint groups cannot deadlock: every group
 * forms independently. Returns the group's handle (a group of one opens no
 * socket), or NULL with the reason. */
Rendezvous *rdzv_split(Rendezvous *parent, int color, int key, double timeout_s, char *why, size_t wn);
int rdzv_rank(const Rendezvous *r);
int rdzv_world(const Rendezvous *r);
/* The bound on each later call (> 0; e.g. long, once formed, when another
 * mechanism such as a watchdog handles hangs). */
void rdzv_set_timeout(Rendezvous *r, double timeout_s);
/* Close the connections and free the handle (NULL: nothing). */
void rdzv_close(Rendezvous *r);

#endif
