/* parallel.c — launch detection and the collectives: over MPI under an MPI
 * launcher, over the TCP rendezvous (rendezvous.c) under a torchrun-style
 * one; the float32 collectives on device memory go to an attached
 * DistDevComm (NCCL) either way. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "parallel.h"
#include "rendezvous.h"
#include "util.h"
#include <mpi.h>
#include <pthread.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct DistGroups {
    MPI_Comm shard, replicate, tp, dp, cp, ep;
    /* launch without MPI: each group's TCP rendezvous (NULL: one member, or
     * MPI; the world's own when the group is the world) */
    Rendezvous *tcp[DIST_N_GROUPS_CP];
    /* non-blocking collectives: handle i is reqs[2i] and reqs[2i+1] (a ring
     * shift's receive and send; one collective's second is null), named
     * req_name[i] (NULL: free) */
    MPI_Request *reqs;
    const char **req_name;
    int n_reqs;
};

enum { FAULT_NONE, FAULT_HANG, FAULT_DIE, FAULT_NAN, FAULT_CKPT_DIE, FAULT_CKPT_ROT, FAULT_CKPT_SLOW, FAULT_CKPT_HANG, FAULT_SLOW, FAULT_LOW_PEAK };

/* Watchdog state shared by the main thread (dist_phase, collectives) and the
 * watchdog thread; every field is read and written under mu. */
struct DistWatch {
    pthread_mutex_t mu;
    pthread_t thread;
    double timeout_s;
    int rank, armed, step;
    const char *phase, *collective;
    double since; /* now_s() when the phase began */
    const DistDevComm *dev; /* aborted before the watchdog exits (NULL: none) */
};

static int env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
           getenv("PMI_RANK") || getenv("MPI_LOCALNRANKS");
}

/* LLMTRAIN_FAULT="rank=R,step=S[-E],kind=hang|die|nan|ckpt_die|ckpt_rot|ckpt_slow|ckpt_hang|slow|low_peak[,attempt=A]"
 * (rank optional: every rank; attempt optional: every attempt, else only
 * when LLMTRAIN_ATTEMPT, which scripts/run_resilient.sh sets and which is 1
 * when unset, equals A). Malformed: one line and exit 2. */
static void fault_parse(Dist *d) {
    const char *env = getenv("LLMTRAIN_FAULT");
    d->fault_kind = FAULT_NONE;
    if (!env || !*env) return;
    char buf[256];
    if (strlen(env) >= sizeof buf) die(EXIT_USAGE, "LLMTRAIN_FAULT: value too long (expected rank=R,step=S[-E],kind=hang|die|nan|ckpt_die|ckpt_rot|ckpt_slow|ckpt_hang|slow|low_peak[,attempt=A])");
    strcpy(buf, env);
    int kind = FAULT_NONE, rank = -1, lo = 0, hi = 0, have_step = 0, attempt = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        char *end;
        if (!eq) goto bad;
        *eq = 0;
        const char *v = eq + 1;
        if (strcmp(tok, "rank") == 0) {
            long r = strtol(v, &end, 10);
            if (end == v || *end || r < 0 || r > 1000000) goto bad;
            rank = (int)r;
        } else if (strcmp(tok, "step") == 0) {
            long a = strtol(v, &end, 10), b = a;
            if (end == v || a < 1 || a > 1000000000) goto bad;
            if (*end == '-') {
                const char *v2 = end + 1;
                b = strtol(v2, &end, 10);
                if (end == v2 || b < a || b > 1000000000) goto bad;
            }
            if (*end) goto bad;
            lo = (int)a; hi = (int)b; have_step = 1;
        } else if (strcmp(tok, "kind") == 0) {
            if (strcmp(v, "hang") == 0) kind = FAULT_HANG;
            else if (strcmp(v, "die") == 0) kind = FAULT_DIE;
            else if (strcmp(v, "nan") == 0) kind = FAULT_NAN;
            else if (strcmp(v, "ckpt_die") == 0) kind = FAULT_CKPT_DIE;
            else if (strcmp(v, "ckpt_rot") == 0) kind = FAULT_CKPT_ROT;
            else if (strcmp(v, "ckpt_slow") == 0) kind = FAULT_CKPT_SLOW;
            else if (strcmp(v, "ckpt_hang") == 0) kind = FAULT_CKPT_HANG;
            else if (strcmp(v, "slow") == 0) kind = FAULT_SLOW;
            else if (strcmp(v, "low_peak") == 0) kind = FAULT_LOW_PEAK;
            else goto bad;
        } else if (strcmp(tok, "attempt") == 0) {
            long a = strtol(v, &end, 10);
            if (end == v || *end || a < 1 || a > 1000000) goto bad;
            attempt = (int)a;
        } else {
            goto bad;
        }
    }
    if (kind == FAULT_NONE || !have_step) goto bad;
    const char *att = getenv("LLMTRAIN_ATTEMPT");
    if (attempt && attempt != (att && *att ? atoi(att) : 1)) return; /* another attempt's fault */
    d->fault_kind = kind;
    d->fault_rank = rank;
    d->fault_step_lo = lo;
    d->fault_step_hi = hi;
    return;
bad:
    die(EXIT_USAGE, "LLMTRAIN_FAULT \"%s\": malformed (expected rank=R,step=S or step=S-E,kind=hang|die|nan|ckpt_die|ckpt_rot|ckpt_slow|ckpt_hang|slow|low_peak[,attempt=A]; "
        "S is the 1-based step number, A the 1-based LLMTRAIN_ATTEMPT)", env);
}

static int fault_here(const Dist *d, int kind, int step) {
    return d->fault_kind == kind && (d->fault_rank < 0 || d->fault_rank == d->rank) &&
           step >= d->fault_step_lo && step <= d->fault_step_hi;
}

void dist_fault_point(Dist *d, int step) {
    if (fault_here(d, FAULT_DIE, step)) {
        fflush(stdout);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (fault_here(d, FAULT_SLOW, step)) { /* a straggler: the others wait for it */
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    if (fault_here(d, FAULT_HANG, step)) {
        fflush(stdout);
        fflush(stderr);
        for (;;) pause();
    }
}

int dist_fault_nan(Dist *d, int step) { return fault_here(d, FAULT_NAN, step); }
int dist_fault_ckpt_die(Dist *d, int step) { return fault_here(d, FAULT_CKPT_DIE, step); }
int dist_fault_ckpt_rot(Dist *d, int step) { return fault_here(d, FAULT_CKPT_ROT, step); }
int dist_fault_ckpt_slow(Dist *d, int step) { return fault_here(d, FAULT_CKPT_SLOW, step); }
int dist_fault_ckpt_hang(Dist *d, int step) { return fault_here(d, FAULT_CKPT_HANG, step); }
int dist_fault_low_peak(Dist *d, int step) { return fault_here(d, FAULT_LOW_PEAK, step); }

/* Around every blocking collective and wait: tells the watchdog which one
 * is in flight (name; NULL when it returned) and adds the time spent to
 * comm_wait_s, the communication the step waited for. */
static void watch_collective(Dist *d, const char *name) {
    if (name) d->coll_t0 = now_s();
    else d->comm_wait_s += now_s() - d->coll_t0;
    struct DistWatch *w = d->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->collective = name;
    pthread_mutex_unlock(&w->mu);
}

void dist_phase(Dist *d, int step, const char *phase) {
    d->phase_step = step;
    d->phase = phase;
    struct DistWatch *w = d->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->step = step;
    w->phase = phase;
    w->since = now_s();
    w->armed = 1;
    pthread_mutex_unlock(&w->mu);
}

/* The watchdog's exit when the device library's abort itself hangs. */
static void *exit_later(void *arg) {
    (void)arg;
    struct timespec ts = {10, 0};
    nanosleep(&ts, NULL);
    _exit(EXIT_TIMEOUT);
    return NULL;
}

/* Polls the heartbeat; on expiry prints one line, aborts the device
 * communicators (NCCL kernels waiting for a dead peer would otherwise keep
 * the device busy; at most 10 s) and ends this process with EXIT_TIMEOUT.
 * MPI_Abort is not called: the main thread owns MPI (MPI_THREAD_FUNNELED);
 * mpirun ends the other ranks when one exits non-zero. */
static void *watchdog_main(void *arg) {
    struct DistWatch *w = arg;
    double poll = w->timeout_s / 10;
    if (poll > 0.5) poll = 0.5;
    if (poll < 0.02) poll = 0.02;
    struct timespec ts = {(time_t)poll, (long)((poll - (double)(time_t)poll) * 1e9)};
    for (;;) {
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&w->mu);
        int fire = w->armed && now_s() - w->since > w->timeout_s;
        int step = w->step;
        const char *phase = w->phase ? w->phase : "?", *coll = w->collective ? w->collective : "none";
        const DistDevComm *dev = w->dev;
        pthread_mutex_unlock(&w->mu);
        if (fire) {
            fprintf(stderr, "llmtrain: rank %d: watchdog: step %d phase %s (collective %s) exceeded parallel.timeout_s=%g s; aborting\n",
                    w->rank, step, phase, coll, w->timeout_s);
            fflush(stderr);
            pthread_t t;
            if (dev && pthread_create(&t, NULL, exit_later, NULL) == 0) dev->abort(dev->ctx);
            _exit(EXIT_TIMEOUT);
        }
    }
    return NULL;
}

void dist_watchdog_start(Dist *d, double timeout_s) {
    if (timeout_s <= 0 || d->watch) return;
    struct DistWatch *w = calloc_check(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    w->timeout_s = timeout_s;
    w->rank = d->rank;
    w->since = now_s();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&w->thread, &attr, watchdog_main, w) != 0) die(EXIT_INTERNAL, "watchdog: pthread_create failed");
    pthread_attr_destroy(&attr);
    d->watch = w;
}

/* Seconds a rank waits for the others at the rendezvous. */
#define RDZV_TIMEOUT_DEFAULT_S 300.0
/* Collectives over TCP wait as long as MPI's would: a peer that exits is an
 * error at once; one that hangs is the watchdog's (parallel.timeout_s). */
#define TCP_COLLECTIVE_TIMEOUT_S 1e9
static double rdzv_timeout_s = RDZV_TIMEOUT_DEFAULT_S; /* LLMTRAIN_RDZV_TIMEOUT_S: forming the world and its groups */

/* A variable holding a number in [lo, hi], or dflt when unset; one line and
 * exit 2 when malformed. */
static double env_num(const char *name, double dflt, double lo, double hi) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi))
        die(EXIT_USAGE, "%s=\"%s\": expected a number in [%g, %g]", name, s, lo, hi);
    return v;
}

/* A torchrun-style launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
 * MASTER_PORT; LOCAL_WORLD_SIZE optional): form the world over TCP. Rank 0
 * listens on MASTER_PORT, or MASTER_PORT + 1 when the launcher's own store
 * holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), or
 * LLMTRAIN_RDZV_PORT. */
#define TCP_LAUNCH "torchrun-style launch (WORLD_SIZE is set, no MPI launcher): " /* its variables' messages */
#define SLURM_LAUNCH "Slurm srun launch (SLURM_STEP_NUM_TASKS is set, no MPI launcher, no WORLD_SIZE): "
/* e: the torchrun variables (rdzv_env) or an srun step's (rdzv_env_slurm,
 * slurm 1), read and checked */
static void tcp_init(Dist *d, RdzvEnv e, int slurm) {
    char why[1024];
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    int port = e.master_port + (!slurm && agent && strcmp(agent, "True") == 0 && e.master_port < 65535 ? 1 : 0);
    port = (int)env_num("LLMTRAIN_RDZV_PORT", port, 1, 65535);
    double timeout = rdzv_timeout_s = env_num("LLMTRAIN_RDZV_TIMEOUT_S", RDZV_TIMEOUT_DEFAULT_S, 1e-3, 1e7);
    /* Rank 0 holds a connection to every rank, and a group's first member
     * one to each member: up to 2 x world sockets, plus files. Raise the
     * soft open-file limit (often 1024) toward the hard one; every rank
     * checks the same bound, so a cluster-wide limit fails every rank alike
     * at once instead of rank 0 running out of descriptors mid-rendezvous. */
    struct rlimit rl;
    rlim_t need = 2 * (rlim_t)e.world + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need)
            die(EXIT_USAGE, "rank %d: the open-file limit is %llu, below the %llu descriptors a world of %d ranks needs "
                "over TCP (a socket per rank at rank 0, per member at each group's first member): raise the hard limit "
                "(ulimit -Hn %llu) or launch with mpirun", e.rank, (unsigned long long)rl.rlim_cur, (unsigned long long)need,
                e.world, (unsigned long long)need);
    }
    d->rank = e.rank;
    d->world = e.world;
    d->rdzv = rdzv_open_job(e.master_addr, port, e.rank, e.world, e.job, timeout, why, sizeof why);
    if (!d->rdzv) die(EXIT_PEER, "rank %d: rendezvous failed: %s", e.rank, why);
    rdzv_set_timeout(d->rdzv, TCP_COLLECTIVE_TIMEOUT_S);
    snprintf(d->launch, sizeof d->launch, "%s, host collectives over TCP (rendezvous %.80s:%d)",
             slurm ? "Slurm srun" : "torchrun-style", e.master_addr, port);
    d->local_rank = e.local_rank;
    d->local_size = e.local_world;
    if (d->local_size < 1) { /* count the ranks that share this host name */
        char (*names)[256] = calloc_check((size_t)d->world, sizeof *names), me[256];
        host_name(me, sizeof me);
        if (rdzv_allgather(d->rdzv, me, names, sizeof me, why, sizeof why) < 0)
            die(EXIT_PEER, "rank %d: rendezvous: host names: %s", d->rank, why);
        d->local_size = 0;
        for (int i = 0; i < d->world; i++) d->local_size += strcmp(names[i], me) == 0;
        free(names);
    }
}

void dist_init(Dist *d, int *argc, char ***argv) {
    memset(d, 0, sizeof *d);
    d->world = 1;
    d->local_size = 1;
    if (launched_by_mpi()) {
        int provided;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            die(EXIT_USAGE, "MPI_Init failed");
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &d->world);
        d->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", env_int("PMI_LOCAL_RANK", -1)));
        d->local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", env_int("PMI_LOCAL_SIZE", -1)));
        if (d->local_rank < 0 || d->local_size < 1) { /* a launcher that names neither: ask MPI who shares this node */
            MPI_Comm node;
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &node);
            MPI_Comm_rank(node, &d->local_rank);
            MPI_Comm_size(node, &d->local_size);
            MPI_Comm_free(&node);
        }
        d->use_mpi = 1;
        snprintf(d->launch, sizeof d->launch, "MPI");
    } else {
        /* WORLD_SIZE set without an MPI launcher: a torchrun-style launch of
         * that many ranks (1: this process alone); a malformed one is exit 2,
         * not a world of one */
        int ws = 1, set;
        char why[1024];
        RdzvEnv e;
        if ((set = rdzv_env_world(&ws, why, sizeof why)) < 0) die(EXIT_USAGE, TCP_LAUNCH "%s", why);
        if (ws > 1) {
            if (rdzv_env(&e, why, sizeof why) < 0) die(EXIT_USAGE, TCP_LAUNCH "%s", why);
            tcp_init(d, e, 0);
        } else if (!set) { /* no WORLD_SIZE: a task of an srun step forms the step's world the same way */
            int rc = rdzv_env_slurm(&e, why, sizeof why);
            if (rc < 0) die(EXIT_USAGE, SLURM_LAUNCH "%s", why);
            if (rc > 0 && e.world > 1) tcp_init(d, e, 1);
        }
    }
    d->dp = d->world;
    d->dp_rank = d->rank;
    d->tp = 1;
    d->cp = 1;
    d->ep = 1;
    d->shard_size = 1;
    d->replicate_size = d->dp;
    d->shard_group = d->rank;
    fault_parse(d);
    const char *tr = getenv("LLMTRAIN_COMM_TRACE");
    if (tr && *tr) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", tr, d->rank);
        if (!(d->trace = fopen(path, "w")))
            die(EXIT_USAGE, "LLMTRAIN_COMM_TRACE: cannot open %s for writing: %s", path, strerror(errno));
        setvbuf(d->trace, NULL, _IOLBF, 0); /* a hung or killed rank leaves its last line */
    }
}

/* LLMTRAIN_COMM_TRACE's line for a collective started (kind != NULL) or a
 * wait on handle h (kind NULL) */
static void trace(const Dist *d, const char *kind, const char *group, size_t n, int h) {
    if (!d->trace) return;
    FILE *f = d->trace;
    fprintf(f, "step %d phase %s ", d->phase_step, d->phase ? d->phase : "setup");
    if (kind) fprintf(f, "start %s %s %zu h%d\n", kind, group, n, h);
    else fprintf(f, "wait h%d\n", h);
}

void dist_finalize(Dist *d) {
    if (d->trace) fclose(d->trace);
    d->trace = NULL;
    watch_collective(d, "MPI_Finalize");
    if (d->dev) {
        const DistDevComm *dev = d->dev;
        dist_attach_device(d, NULL); /* the watchdog forgets it first */
        dev->close(dev->ctx);
    }
    if (d->groups) {
        if (d->use_mpi) {
            MPI_Comm_free(&d->groups->shard);
            MPI_Comm_free(&d->groups->replicate);
            MPI_Comm_free(&d->groups->tp);
            MPI_Comm_free(&d->groups->dp);
            MPI_Comm_free(&d->groups->cp);
            MPI_Comm_free(&d->groups->ep);
        }
        for (int g = 0; g < DIST_N_GROUPS_CP; g++)
            if (d->groups->tcp[g] != d->rdzv) rdzv_close(d->groups->tcp[g]);
        free(d->groups->reqs);
        free(d->groups->req_name);
        free(d->groups);
        d->groups = NULL;
    }
    if (d->use_mpi) MPI_Finalize();
    rdzv_close(d->rdzv);
    d->rdzv = NULL;
    watch_collective(d, NULL);
}

static void check(Dist *d, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "llmtrain: rank %d: %s failed: %s\n", d->rank, what, msg);
    dist_abort(d, EXIT_PEER);
}

static int count_of(size_t n, const char *what) {
    if (n > (size_t)0x7fffffff) die(EXIT_INTERNAL, "%s: %zu elements exceed one MPI call", what, n);
    return (int)n;
}

/* ------------------------------------------------------------------ */
/* host transport: a group's MPI communicator, or its TCP rendezvous     */

/* A group as the host collectives see it. Under MPI, mpi; under a launch
 * without MPI, tcp (NULL only for a group of one). */
typedef struct Xc {
    MPI_Comm mpi;
    Rendezvous *tcp;
    int size;
    int kind; /* DIST_GROUP_*, or -1: the world */
} Xc;
enum { X_F32, X_F64 };
enum { X_SUM, X_MAX, X_MIN };

/* Elements per TCP round (bounds rank 0's scratch: group size x this). */
#define TCP_CHUNK ((size_t)1 << 20)

static Xc xc_world(const Dist *d) { return (Xc){MPI_COMM_WORLD, d->rdzv, d->world, -1}; }

static Xc xc_group(const Dist *d, int g) {
    const struct DistGroups *c = d->groups;
    if (!c) die(EXIT_INTERNAL, "group %d used before dist_setup_groups", g);
    int r, n;
    dist_group_rank(d, g, &r, &n);
    MPI_Comm m = g == DIST_GROUP_TP ? c->tp : g == DIST_GROUP_SHARD ? c->shard : g == DIST_GROUP_REPLICATE ? c->replicate
               : g == DIST_GROUP_CP ? c->cp : g == DIST_GROUP_EP ? c->ep : c->dp;
    return (Xc){m, c->tcp[g], n, g};
}

/* World rank of member i of this rank's group of kind g. */
static int member_rank(const Dist *d, int g, int i) {
    int tp = d->tp, S = d->shard_size;
    switch (g) {
    case DIST_GROUP_TP: return d->dp_rank * tp + i;
    case DIST_GROUP_SHARD: return (d->shard_group * S + i) * tp + d->tp_rank;
    case DIST_GROUP_REPLICATE: return (i * S + d->shard_index) * tp + d->tp_rank;
    case DIST_GROUP_CP: return (d->dp_rank / d->cp * d->cp + i) * tp + d->tp_rank;
    case DIST_GROUP_EP: return (d->dp_rank / d->ep * d->ep + i) * tp + d->tp_rank;
    default: return i * tp + d->tp_rank; /* DIST_GROUP_DP */
    }
}

/* A failed TCP collective: one line naming the group (the reason numbers
 * ranks within it, so a subgroup's members are listed as world ranks), and
 * exit 6; the peers see this rank's connections close. */
static void tcp_check(Dist *d, Xc c, int rc, const char *what, const char *why) {
    if (rc == 0) return;
    static const char *names[DIST_N_GROUPS_CP] = {"tp", "shard", "replicate", "dp", "cp", "ep"};
    char members[200] = "";
    if (c.kind >= 0 && c.size < d->world) {
        size_t len = (size_t)snprintf(members, sizeof members, " (its ranks 0..%d are world ranks", c.size - 1);
        for (int i = 0; i < c.size && len < sizeof members - 16; i++)
            len += (size_t)snprintf(members + len, sizeof members - len, "%s%d", i ? "," : " ", member_rank(d, c.kind, i));
        snprintf(members + len, sizeof members - len, "%s)", len >= sizeof members - 16 ? ",..." : "");
    }
    fprintf(stderr, "llmtrain: rank %d: %s on the %s group failed: %s%s\n", d->rank, what,
            c.kind >= 0 && c.size < d->world ? names[c.kind] : "world", why, members);
    dist_abort(d, EXIT_PEER);
}

static void combine(void *acc, const void *in, size_t n, int type, int op) {
    if (type == X_F32) {
        float *a = acc;
        const float *b = in;
        for (size_t i = 0; i < n; i++) a[i] = op == X_SUM ? a[i] + b[i] : op == X_MAX ? (b[i] > a[i] ? b[i] : a[i]) : (b[i] < a[i] ? b[i] : a[i]);
    } else {
        double *a = acc;
        const double *b = in;
        for (size_t i = 0; i < n; i++) a[i] = op == X_SUM ? a[i] + b[i] : op == X_MAX ? (b[i] > a[i] ? b[i] : a[i]) : (b[i] < a[i] ? b[i] : a[i]);
    }
}

/* In place over the group: sum, max or min of n floats or doubles. Over
 * TCP the first member combines the members' values in member order (so
 * every rank gets the same bits, run after run) and sends the result back. */
static void x_allreduce(Dist *d, Xc c, void *x, size_t n, int type, int op) {
    if (c.size == 1 || n == 0) return;
    size_t es = type == X_F32 ? sizeof(float) : sizeof(double);
    unsigned char *p = x;
    if (d->use_mpi) {
        MPI_Datatype t = type == X_F32 ? MPI_FLOAT : MPI_DOUBLE;
        MPI_Op o = op == X_SUM ? MPI_SUM : op == X_MAX ? MPI_MAX : MPI_MIN;
        for (size_t off = 0; off < n; off += (size_t)1 << 30) {
            int cnt = (int)(n - off < ((size_t)1 << 30) ? n - off : ((size_t)1 << 30));
            watch_collective(d, "MPI_Allreduce");
            check(d, MPI_Allreduce(MPI_IN_PLACE, p + off * es, cnt, t, o, c.mpi), "MPI_Allreduce");
            watch_collective(d, NULL);
        }
        return;
    }
    char why[1024];
    int lead = rdzv_rank(c.tcp) == 0;
    size_t chunk = n < TCP_CHUNK ? n : TCP_CHUNK;
    unsigned char *tmp = lead ? malloc_check((size_t)c.size * chunk * es) : NULL;
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        watch_collective(d, "TCP allreduce");
        tcp_check(d, c, rdzv_gather(c.tcp, p + off * es, tmp, m * es, why, sizeof why), "TCP allreduce", why);
        if (lead) {
            for (int i = 1; i < c.size; i++) combine(tmp, tmp + (size_t)i * m * es, m, type, op);
            memcpy(p + off * es, tmp, m * es);
        }
        tcp_check(d, c, rdzv_bcast(c.tcp, p + off * es, m * es, why, sizeof why), "TCP allreduce", why);
        watch_collective(d, NULL);
    }
    free(tmp);
}

/* MPI's type for elements of es bytes: float32, (2) bf16 words or (1) bytes */
static MPI_Datatype mpi_elem(size_t es) { return es == 1 ? MPI_BYTE : es == 2 ? MPI_UINT16_T : MPI_FLOAT; }

/* Every member's n elements of es bytes (4: float32, 2: bf16 words, 1: bytes) to
 * every member's recv[size * n]. */
static void x_allgather(Dist *d, Xc c, const void *send, void *recv, size_t n, size_t es) {
    if (d->use_mpi) {
        MPI_Datatype t = mpi_elem(es);
        watch_collective(d, "MPI_Allgather");
        check(d, MPI_Allgather(send, count_of(n, "MPI_Allgather"), t, recv, (int)n, t, c.mpi), "MPI_Allgather");
    } else {
        char why[1024];
        watch_collective(d, "TCP allgather");
        tcp_check(d, c, rdzv_allgather(c.tcp, send, recv, n * es, why, sizeof why), "TCP allgather", why);
    }
    watch_collective(d, NULL);
}

/* Sum of the members' send[size * n], block i to member i's recv[n]
 * (recv == send: in place, the result in send[0, n)). */
static void x_reduce_scatter_f32(Dist *d, Xc c, const float *send, float *recv, size_t n) {
    if (d->use_mpi) {
        watch_collective(d, "MPI_Reduce_scatter_block");
        check(d, MPI_Reduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, count_of(n, "MPI_Reduce_scatter_block"),
                                          MPI_FLOAT, MPI_SUM, c.mpi), "MPI_Reduce_scatter_block");
        watch_collective(d, NULL);
        return;
    }
    /* in rounds of m elements of each block: pack block i's [off, off+m) at
     * pack[i*m], gather the packs to the first member, sum them in member
     * order, scatter block i's sums to member i */
    char why[1024];
    int S = c.size, lead = rdzv_rank(c.tcp) == 0;
    size_t m0 = TCP_CHUNK / (size_t)S > 0 ? TCP_CHUNK / (size_t)S : 1;
    if (m0 > n) m0 = n;
    float *pack = malloc_check((size_t)S * m0 * sizeof(float));
    float *all = lead ? malloc_check((size_t)S * S * m0 * sizeof(float)) : NULL;
    watch_collective(d, "TCP reduce-scatter");
    for (size_t off = 0; off < n; off += m0) {
        size_t m = n - off < m0 ? n - off : m0;
        for (int i = 0; i < S; i++) memcpy(pack + (size_t)i * m, send + (size_t)i * n + off, m * sizeof(float));
        tcp_check(d, c, rdzv_gather(c.tcp, pack, all, (size_t)S * m * sizeof(float), why, sizeof why), "TCP reduce-scatter", why);
        if (lead)
            for (int k = 1; k < S; k++) combine(all, all + (size_t)k * S * m, (size_t)S * m, X_F32, X_SUM);
        tcp_check(d, c, rdzv_scatter(c.tcp, all, recv + off, m * sizeof(float), why, sizeof why), "TCP reduce-scatter", why);
    }
    watch_collective(d, NULL);
    free(pack);
    free(all);
}

/* Every member's n elements to the first member's recv[size * n]. */
static void x_gather(Dist *d, Xc c, const void *send, void *recv, size_t n, int type) {
    if (d->use_mpi) {
        MPI_Datatype t = type == X_F32 ? MPI_FLOAT : MPI_DOUBLE;
        watch_collective(d, "MPI_Gather");
        check(d, MPI_Gather(send, count_of(n, "MPI_Gather"), t, recv, (int)n, t, 0, c.mpi), "MPI_Gather");
    } else {
        char why[1024];
        watch_collective(d, "TCP gather");
        tcp_check(d, c, rdzv_gather(c.tcp, send, recv, n * (type == X_F32 ? sizeof(float) : sizeof(double)), why, sizeof why),
                  "TCP gather", why);
    }
    watch_collective(d, NULL);
}

/* The first member's n bytes to every member. */
static void x_bcast(Dist *d, Xc c, void *buf, size_t n) {
    if (c.size == 1) return;
    if (d->use_mpi) {
        watch_collective(d, "MPI_Bcast");
        check(d, MPI_Bcast(buf, count_of(n, "MPI_Bcast"), MPI_BYTE, 0, c.mpi), "MPI_Bcast");
    } else {
        char why[1024];
        watch_collective(d, "TCP bcast");
        tcp_check(d, c, rdzv_bcast(c.tcp, buf, n, why, sizeof why), "TCP bcast", why);
    }
    watch_collective(d, NULL);
}

static void x_barrier(Dist *d, Xc c) {
    if (c.size == 1) return;
    if (d->use_mpi) {
        watch_collective(d, "MPI_Barrier");
        check(d, MPI_Barrier(c.mpi), "MPI_Barrier");
    } else {
        char why[1024];
        watch_collective(d, "TCP barrier");
        tcp_check(d, c, rdzv_barrier(c.tcp, why, sizeof why), "TCP barrier", why);
    }
    watch_collective(d, NULL);
}

/* ------------------------------------------------------------------ */
/* device collectives (an attached DistDevComm)                        */

static int req_slot(Dist *d);

/* Start device collective `op` on group g under handle h (taken from the
 * request table, named for the watchdog until dist_wait releases it). */
static int dev_start(Dist *d, const char *name, int op, int g, const void *send, void *recv, size_t n) {
    int h = req_slot(d);
    watch_collective(d, name);
    d->dev->start(d->dev->ctx, h, op, g, send, recv, n);
    watch_collective(d, NULL);
    d->groups->req_name[h] = name;
    return h;
}

static void wait_handle(Dist *d, int h, int traced);

/* A blocking float32 collective on device memory: started, and the
 * device's later work ordered after it. */
static void dev_collective(Dist *d, const char *name, int op, int g, const void *send, void *recv, size_t n) {
    wait_handle(d, dev_start(d, name, op, g, send, recv, n), 0);
}

/* A one-member group's all-gather or reduce-scatter: a copy in backend memory. */
static void copy_bytes(Dist *d, void *recv, const void *send, size_t bytes) {
    if (recv == send) return;
    if (d->dev) d->dev->copy(d->dev->ctx, recv, send, bytes);
    else memcpy(recv, send, bytes);
}

void dist_attach_device(Dist *d, const DistDevComm *dev) {
    if (dev && !d->groups) die(EXIT_INTERNAL, "dist_attach_device before dist_setup_groups");
    d->dev = dev;
    struct DistWatch *w = d->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->dev = dev;
    pthread_mutex_unlock(&w->mu);
}

void dist_group_rank(const Dist *d, int g, int *rank, int *size) {
    switch (g) {
    case DIST_GROUP_TP: *rank = d->tp_rank; *size = d->tp; break;
    case DIST_GROUP_SHARD: *rank = d->shard_index; *size = d->shard_size; break;
    case DIST_GROUP_REPLICATE: *rank = d->shard_group; *size = d->replicate_size; break;
    case DIST_GROUP_DP: *rank = d->dp_rank; *size = d->dp; break;
    case DIST_GROUP_CP: *rank = d->cp_rank; *size = d->cp; break;
    case DIST_GROUP_EP: *rank = d->ep_rank; *size = d->ep; break;
    case DIST_GROUP_WORLD: *rank = d->rank; *size = d->world; break;
    default: die(EXIT_INTERNAL, "dist_group_rank: unknown group %d", g);
    }
}

static void group_bcast_bytes(Dist *d, int g, void *buf, size_t n) { x_bcast(d, xc_group(d, g), buf, n); }

static void dp_allreduce_sum_f32(Dist *d, float *x, size_t n) {
    if (d->dp == 1) return;
    trace(d, "allreduce", "dp", n, -1);
    if (d->dev) dev_collective(d, "ncclAllReduce", DIST_OP_ALLREDUCE_SUM, DIST_GROUP_DP, x, x, n);
    else x_allreduce(d, d->tp > 1 ? xc_group(d, DIST_GROUP_DP) : xc_world(d), x, n, X_F32, X_SUM);
    d->bytes_allreduce += 2.0 * (d->dp - 1) / d->dp * (double)n * sizeof(float);
}

static void world_allreduce_sum_f64(Dist *d, double *x, size_t n) {
    if (d->world == 1) return;
    x_allreduce(d, xc_world(d), x, n, X_F64, X_SUM);
}

void dist_barrier(Dist *d) {
    if (d->world > 1) x_barrier(d, xc_world(d));
}

void dist_abort(Dist *d, int code) {
    fflush(stdout);
    fflush(stderr);
    if (d->use_mpi && d->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code); /* without MPI: the peers see this rank's connections close */
}

/* ------------------------------------------------------------------ */
/* shard / replicate groups                                            */

void dist_setup_groups(Dist *d, int S) {
    if (S < 1 || d->dp % S != 0) die(EXIT_INTERNAL, "dist_setup_groups: shard size %d does not divide %d ranks", S, d->dp);
    d->shard_size = S;
    d->replicate_size = d->dp / S;
    d->shard_index = d->dp_rank % S;
    d->shard_group = d->dp_rank / S;
    if (!d->use_mpi && !d->rdzv) return;
    struct DistGroups *g = calloc_check(1, sizeof *g);
    int tp = d->tp;
    /* color (the group) and key (the rank's place in it) of each kind */
    const int color[DIST_N_GROUPS_CP] = {[DIST_GROUP_SHARD] = d->shard_group * tp + d->tp_rank,
                                         [DIST_GROUP_REPLICATE] = d->shard_index * tp + d->tp_rank,
                                         [DIST_GROUP_TP] = d->dp_rank, [DIST_GROUP_DP] = d->tp_rank,
                                         [DIST_GROUP_CP] = d->dp_rank / d->cp * tp + d->tp_rank,
                                         [DIST_GROUP_EP] = d->dp_rank / d->ep * tp + d->tp_rank};
    const int key[DIST_N_GROUPS_CP] = {[DIST_GROUP_SHARD] = d->shard_index, [DIST_GROUP_REPLICATE] = d->shard_group,
                                       [DIST_GROUP_TP] = d->tp_rank, [DIST_GROUP_DP] = d->dp_rank,
                                       [DIST_GROUP_CP] = d->cp_rank, [DIST_GROUP_EP] = d->ep_rank};
    if (d->use_mpi) {
        watch_collective(d, "MPI_Comm_split");
        check(d, MPI_Comm_split(MPI_COMM_WORLD, color[DIST_GROUP_SHARD], key[DIST_GROUP_SHARD], &g->shard), "MPI_Comm_split");
        check(d, MPI_Comm_split(MPI_COMM_WORLD, color[DIST_GROUP_REPLICATE], key[DIST_GROUP_REPLICATE], &g->replicate), "MPI_Comm_split");
        check(d, MPI_Comm_split(MPI_COMM_WORLD, color[DIST_GROUP_TP], key[DIST_GROUP_TP], &g->tp), "MPI_Comm_split");
        check(d, MPI_Comm_split(MPI_COMM_WORLD, color[DIST_GROUP_DP], key[DIST_GROUP_DP], &g->dp), "MPI_Comm_split");
        check(d, MPI_Comm_split(MPI_COMM_WORLD, color[DIST_GROUP_CP], key[DIST_GROUP_CP], &g->cp), "MPI_Comm_split");
        check(d, MPI_Comm_split(MPI_COMM_WORLD, color[DIST_GROUP_EP], key[DIST_GROUP_EP], &g->ep), "MPI_Comm_split");
        watch_collective(d, NULL);
        MPI_Comm_set_errhandler(g->shard, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(g->replicate, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(g->tp, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(g->dp, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(g->cp, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(g->ep, MPI_ERRORS_RETURN);
    } else {
        /* every rank splits every kind in the same order; a kind whose
         * groups are the world (or single ranks) needs no split on any rank */
        watch_collective(d, "TCP split");
        for (int k = 0; k < DIST_N_GROUPS_CP; k++) {
            int r, n;
            dist_group_rank(d, k, &r, &n);
            if (n == d->world) { g->tcp[k] = d->rdzv; continue; }
            if (n == 1) continue;
            char why[1024];
            g->tcp[k] = rdzv_split(d->rdzv, color[k], key[k], rdzv_timeout_s, why, sizeof why);
            if (!g->tcp[k]) {
                fprintf(stderr, "llmtrain: rank %d: forming the process groups over TCP failed: %s\n", d->rank, why);
                dist_abort(d, EXIT_PEER);
            }
            rdzv_set_timeout(g->tcp[k], TCP_COLLECTIVE_TIMEOUT_S);
        }
        watch_collective(d, NULL);
    }
    d->groups = g;
}

/* ------------------------------------------------------------------ */
/* startup health check                                                */

/* Seconds per float32 all-reduce of n floats over the host transport on
 * group c, after 3 untimed ones and a barrier. */
static double host_time_allreduce(Dist *d, Xc c, size_t n) {
    float *buf = calloc_check(n, sizeof(float));
    for (int i = 0; i < 3; i++) x_allreduce(d, c, buf, n, X_F32, X_SUM);
    x_barrier(d, c);
    const int iters = 5;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) x_allreduce(d, c, buf, n, X_F32, X_SUM);
    free(buf);
    return (now_s() - t0) / iters;
}

int dist_health_check(Dist *d, size_t bytes, double min_gbps) {
    if ((!d->use_mpi && !d->rdzv) || d->world < 2 || !d->groups) return 1;
    const char *kinds[DIST_N_GROUPS_CP] = {"tp", "shard", "replicate", "dp", "cp", "ep"};
    size_t n = bytes / sizeof(float);
    int ok = 1;
    for (int k = 0; k < DIST_N_GROUPS_CP; k++) {
        Xc c = xc_group(d, k);
        int gn = c.size;
        /* every rank takes part in the world reductions below, so a kind
         * with no multi-rank groups is skipped on all ranks alike */
        double maxn = gn;
        x_allreduce(d, xc_world(d), &maxn, 1, X_F64, X_MAX);
        if (maxn < 2) continue;
        double bus = 1e300;
        if (gn > 1) {
            /* the collectives training uses: NCCL on device memory when attached */
            double dt = d->dev ? d->dev->time_allreduce(d->dev->ctx, k, n, 3, 5) : host_time_allreduce(d, c, n);
            if (dt < 1e-9) dt = 1e-9;
            double algbw = (double)(n * sizeof(float)) / dt / 1e9;
            bus = algbw * 2.0 * (gn - 1) / gn;
            x_allreduce(d, c, &bus, 1, X_F64, X_MIN); /* slowest member of the group */
        }
        x_allreduce(d, xc_world(d), &bus, 1, X_F64, X_MIN); /* slowest group of this kind */
        if (d->rank == 0) {
            printf("health: %s all-reduce %zu over %d ranks: %.3f GB/s bus bandwidth (slowest group%s%s)\n", kinds[k],
                   n * sizeof(float), (int)maxn, bus, d->dev ? ", " : d->use_mpi ? "" : ", TCP",
                   d->dev ? d->dev->name : "");
            fflush(stdout);
        }
        if (ok && min_gbps > 0 && bus < min_gbps) {
            ok = 0;
            if (d->rank == 0) {
                fprintf(stderr, "llmtrain: health check: %s group bus bandwidth %.3f GB/s is below parallel.min_bus_gbps %g\n",
                        kinds[k], bus, min_gbps);
                fflush(stderr);
            }
        }
    }
    return ok;
}

void dist_comm_reset(Dist *d) {
    d->bytes_allgather = d->bytes_reduce_scatter = d->bytes_allreduce = d->bytes_tp_allreduce = 0;
    d->bytes_tp_allgather = d->bytes_tp_reduce_scatter = 0;
    d->bytes_cp = d->bytes_ep = 0;
    d->comm_wait_s = 0;
}

void dist_set_tp(Dist *d, int tp) {
    if (tp < 1 || d->world % tp != 0) die(EXIT_INTERNAL, "dist_set_tp: %d does not divide %d ranks", tp, d->world);
    d->tp = tp;
    d->tp_rank = d->rank % tp;
    d->dp = d->world / tp;
    d->dp_rank = d->rank / tp;
    d->replicate_size = d->dp;
    d->shard_group = d->dp_rank;
    d->cp = 1;
    d->cp_rank = 0;
    d->ep = 1;
    d->ep_rank = 0;
}

void dist_set_cp(Dist *d, int cp) {
    if (cp < 1 || d->dp % cp != 0) die(EXIT_INTERNAL, "dist_set_cp: %d does not divide %d data-parallel ranks", cp, d->dp);
    d->cp = cp;
    d->cp_rank = d->dp_rank % cp;
}

void dist_set_ep(Dist *d, int ep) {
    if (ep < 1 || d->dp % ep != 0)
        die(EXIT_INTERNAL, "dist_set_ep: %d does not divide %d data-parallel x context ranks", ep, d->dp);
    d->ep = ep;
    d->ep_rank = d->dp_rank % ep;
}

static int cp_shift_start(Dist *d, const void *send, void *recv, size_t bytes) {
    int cp = d->cp;
    if (cp == 1 || !d->groups) {
        copy_bytes(d, recv, send, bytes);
        return -1;
    }
    d->bytes_cp += (double)bytes;
    if (d->dev) return dev_start(d, "ncclSend/ncclRecv", DIST_OP_SENDRECV, DIST_GROUP_CP, send, recv, bytes);
    Xc c = xc_group(d, DIST_GROUP_CP);
    int next = (d->cp_rank + 1) % cp, prev = (d->cp_rank + cp - 1) % cp;
    if (d->use_mpi && bytes <= INT_MAX) { /* started: the receive and the send under one handle */
        const char *name = "MPI_Isend_Irecv";
        int h = req_slot(d);
        MPI_Request *r = &d->groups->reqs[2 * h];
        watch_collective(d, name);
        check(d, MPI_Irecv(recv, (int)bytes, MPI_BYTE, prev, 58, c.mpi, &r[0]), "MPI_Irecv");
        check(d, MPI_Isend(send, (int)bytes, MPI_BYTE, next, 58, c.mpi, &r[1]), "MPI_Isend");
        watch_collective(d, NULL);
        d->groups->req_name[h] = name;
        return h;
    }
    if (d->use_mpi) { /* MPI counts are ints: done here, a GiB at a time */
        const size_t most = (size_t)1 << 30;
        watch_collective(d, "MPI_Sendrecv");
        for (size_t off = 0; off < bytes; off += most) {
            int cnt = (int)(bytes - off < most ? bytes - off : most);
            check(d, MPI_Sendrecv((const char *)send + off, cnt, MPI_BYTE, next, 58, (char *)recv + off, cnt, MPI_BYTE, prev, 58,
                                  c.mpi, MPI_STATUS_IGNORE), "MPI_Sendrecv");
        }
        watch_collective(d, NULL);
    } else { /* the rendezvous has no point-to-point: every member's block to all, the previous one's kept */
        unsigned char *all = malloc_check((size_t)cp * bytes);
        x_allgather(d, c, send, all, bytes, 1);
        memcpy(recv, all + (size_t)prev * bytes, bytes);
        free(all);
    }
    return -1;
}

static void cp_wait(Dist *d, int h) { wait_handle(d, h, 0); }

static void cp_allreduce_sum_f64(Dist *d, double *x, size_t n) {
    if (d->cp == 1 || !d->groups) return;
    x_allreduce(d, xc_group(d, DIST_GROUP_CP), x, n, X_F64, X_SUM);
}

static void cp_allgather(Dist *d, const void *send, void *recv, size_t bytes) {
    if (d->cp == 1 || !d->groups) {
        copy_bytes(d, recv, send, bytes);
        return;
    }
    if (d->dev) {
        if (bytes % 2) die(EXIT_INTERNAL, "dist_allgather: %zu bytes over the cp group's device communicator (16-bit words)", bytes);
        dev_collective(d, "ncclAllGather", DIST_OP_ALLGATHER_BF16, DIST_GROUP_CP, send, recv, bytes / 2);
    } else {
        x_allgather(d, xc_group(d, DIST_GROUP_CP), send, recv, bytes, 1);
    }
    d->bytes_cp += (double)(d->cp - 1) * (double)bytes;
}

static void cp_reduce_scatter_f32(Dist *d, const float *send, float *recv, size_t n) {
    if (d->cp == 1 || !d->groups) {
        copy_bytes(d, recv, send, n * sizeof(float));
        return;
    }
    if (d->dev) dev_collective(d, "ncclReduceScatter", DIST_OP_REDUCE_SCATTER, DIST_GROUP_CP, send, recv, n);
    else x_reduce_scatter_f32(d, xc_group(d, DIST_GROUP_CP), send, recv, n);
    d->bytes_cp += (double)(d->cp - 1) * (double)n * sizeof(float);
}

static void cp_allreduce_max_f32(Dist *d, float *x, size_t n) {
    int P = d->cp;
    if (P == 1 || !d->groups) return;
    if (d->dev) dev_collective(d, "ncclAllReduce", DIST_OP_ALLREDUCE_MAX, DIST_GROUP_CP, x, x, n);
    else x_allreduce(d, xc_group(d, DIST_GROUP_CP), x, n, X_F32, X_MAX);
    d->bytes_cp += 2.0 * (P - 1) / P * (double)n * sizeof(float);
}

/* ------------------------------------------------------------------ */
/* the expert group's all-to-all of variable sizes                     */

static const char *group_name(int g);

/* MPI's all-to-all: int counts and displacements of bytes (a block past
 * 2^31 - 1 is an internal error, named). Over TCP: every member's counts
 * to all (an n x n matrix, m[i * n + j] the bytes i sends j), each
 * member's blocks packed in member order and gathered to the first member,
 * which repacks them by receiver and scatters them; blocks as large as the
 * largest sender's and receiver's total. */
static void x_alltoallv(Dist *d, Xc c, int me, const unsigned char *send, const size_t *scount, const size_t *sdispl,
                        unsigned char *recv, const size_t *rcount, const size_t *rdispl) {
    int n = c.size;
    if (d->use_mpi) {
        int *v = malloc_check(4 * (size_t)n * sizeof *v), *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
        for (int i = 0; i < n; i++) {
            if (scount[i] > INT_MAX || sdispl[i] > INT_MAX || rcount[i] > INT_MAX || rdispl[i] > INT_MAX)
                die(EXIT_INTERNAL, "dist_alltoallv: member %d's blocks (%zu bytes at %zu sent, %zu at %zu received) are past "
                    "MPI_Alltoallv's int counts and displacements (2^31 - 1 bytes)", i, scount[i], sdispl[i], rcount[i], rdispl[i]);
            sc[i] = (int)scount[i], sd[i] = (int)sdispl[i], rc[i] = (int)rcount[i], rd[i] = (int)rdispl[i];
        }
        watch_collective(d, "MPI_Alltoallv");
        check(d, MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, c.mpi), "MPI_Alltoallv");
        watch_collective(d, NULL);
        free(v);
        return;
    }
    char why[1024];
    size_t *m = malloc_check((size_t)n * (size_t)n * sizeof *m), most_out = 0, most_in = 0;
    watch_collective(d, "TCP alltoallv");
    tcp_check(d, c, rdzv_allgather(c.tcp, scount, m, (size_t)n * sizeof *m, why, sizeof why), "TCP alltoallv", why);
    for (int i = 0; i < n; i++) {
        size_t out = 0, in = 0;
        for (int j = 0; j < n; j++) out += m[(size_t)i * n + j], in += m[(size_t)j * n + i];
        if (out > most_out) most_out = out;
        if (in > most_in) most_in = in;
        if (m[(size_t)i * n + me] != rcount[i])
            die(EXIT_INTERNAL, "dist_alltoallv: member %d of the %s group sends %zu bytes to member %d, which expects %zu", i,
                group_name(c.kind), m[(size_t)i * n + me], me, rcount[i]);
    }
    if (most_out > 0) { /* every member sees the same matrix: all skip, or none */
        int lead = rdzv_rank(c.tcp) == 0;
        unsigned char *pack = malloc_check(most_out), *in = malloc_check(most_in);
        unsigned char *all = lead ? malloc_check((size_t)n * most_out) : NULL, *out = lead ? malloc_check((size_t)n * most_in) : NULL;
        size_t off = 0;
        for (int j = 0; j < n; j++) {
            if (scount[j]) memcpy(pack + off, send + sdispl[j], scount[j]);
            off += scount[j];
        }
        tcp_check(d, c, rdzv_gather(c.tcp, pack, all, most_out, why, sizeof why), "TCP alltoallv", why);
        if (lead) /* receiver j's pack: sender i's block for j, i in order */
            for (int j = 0; j < n; j++) {
                size_t at = 0;
                for (int i = 0; i < n; i++) {
                    size_t from = 0;
                    for (int k = 0; k < j; k++) from += m[(size_t)i * n + k];
                    memcpy(out + (size_t)j * most_in + at, all + (size_t)i * most_out + from, m[(size_t)i * n + j]);
                    at += m[(size_t)i * n + j];
                }
            }
        tcp_check(d, c, rdzv_scatter(c.tcp, out, in, most_in, why, sizeof why), "TCP alltoallv", why);
        off = 0;
        for (int i = 0; i < n; i++) {
            if (rcount[i]) memcpy(recv + rdispl[i], in + off, rcount[i]);
            off += rcount[i];
        }
        free(pack);
        free(in);
        free(all);
        free(out);
    }
    watch_collective(d, NULL);
    free(m);
}

/* One size_t per member each way: recv[i] = member i's send[me]. */
static void x_alltoall_counts(Dist *d, Xc c, int me, const size_t *send, size_t *recv) {
    int n = c.size;
    if (d->use_mpi) {
        watch_collective(d, "MPI_Alltoall");
        check(d, MPI_Alltoall(send, (int)sizeof *send, MPI_BYTE, recv, (int)sizeof *recv, MPI_BYTE, c.mpi), "MPI_Alltoall");
        watch_collective(d, NULL);
        return;
    }
    char why[1024];
    size_t *m = malloc_check((size_t)n * (size_t)n * sizeof *m);
    watch_collective(d, "TCP alltoall");
    tcp_check(d, c, rdzv_allgather(c.tcp, send, m, (size_t)n * sizeof *m, why, sizeof why), "TCP alltoall", why);
    watch_collective(d, NULL);
    for (int i = 0; i < n; i++) recv[i] = m[(size_t)i * n + me];
    free(m);
}

static void ep_alltoallv(Dist *d, const void *send, const size_t *scount, const size_t *sdispl, void *recv, const size_t *rcount,
                         const size_t *rdispl) {
    int me, n;
    dist_group_rank(d, DIST_GROUP_EP, &me, &n);
    if (scount[me] != rcount[me])
        die(EXIT_INTERNAL, "dist_alltoallv: member %d sends itself %zu bytes but expects %zu", me, scount[me], rcount[me]);
    if (n == 1) {
        if (scount[0]) copy_bytes(d, (unsigned char *)recv + rdispl[0], (const unsigned char *)send + sdispl[0], scount[0]);
        return;
    }
    if (!d->groups) die(EXIT_INTERNAL, "dist_alltoallv over %d members before dist_setup_groups", n);
    double sent = 0;
    for (int j = 0; j < n; j++) sent += j == me ? 0 : (double)scount[j];
    trace(d, "alltoallv", "ep", (size_t)sent, -1);
    if (d->dev) {
        const char *name = "ncclSend/ncclRecv (all-to-all)";
        if (!d->dev->alltoallv) die(EXIT_INTERNAL, "dist_alltoallv: the device communicator (%s) has no all-to-all", d->dev->name);
        int h = req_slot(d);
        watch_collective(d, name);
        d->dev->alltoallv(d->dev->ctx, h, DIST_GROUP_EP, send, scount, sdispl, recv, rcount, rdispl);
        watch_collective(d, NULL);
        d->groups->req_name[h] = name;
        wait_handle(d, h, 0);
    } else {
        x_alltoallv(d, xc_group(d, DIST_GROUP_EP), me, send, scount, sdispl, recv, rcount, rdispl);
    }
    d->bytes_ep += sent;
}

static void ep_alltoall_counts(Dist *d, const size_t *send, size_t *recv) {
    int me, n;
    dist_group_rank(d, DIST_GROUP_EP, &me, &n);
    if (n == 1) recv[0] = send[0];
    else if (!d->groups) die(EXIT_INTERNAL, "dist_alltoall_counts over %d members before dist_setup_groups", n);
    else x_alltoall_counts(d, xc_group(d, DIST_GROUP_EP), me, send, recv);
}

static void tp_allreduce_f32(Dist *d, float *x, size_t n, int max) {
    int P = d->tp;
    if (P == 1 || !d->groups) return;
    if (d->dev) dev_collective(d, "ncclAllReduce", max ? DIST_OP_ALLREDUCE_MAX : DIST_OP_ALLREDUCE_SUM, DIST_GROUP_TP, x, x, n);
    else x_allreduce(d, xc_group(d, DIST_GROUP_TP), x, n, X_F32, max ? X_MAX : X_SUM);
    d->bytes_tp_allreduce += 2.0 * (P - 1) / P * (double)n * sizeof(float);
}

/* Gather floats to the group's first rank; a group of one copies. */
static void gather_f32_in(Dist *d, int g, int size, const float *send, float *recv, size_t n) {
    if (size == 1 || !d->groups) {
        if (recv && recv != send) memcpy(recv, send, n * sizeof(float));
        return;
    }
    x_gather(d, xc_group(d, g), send, recv, n, X_F32);
}

static void tp_allreduce_sum_f64(Dist *d, double *x, size_t n) {
    if (d->tp == 1 || !d->groups) return;
    x_allreduce(d, xc_group(d, DIST_GROUP_TP), x, n, X_F64, X_SUM);
}

static void tp_gather_f32(Dist *d, const float *send, float *recv, size_t n) { gather_f32_in(d, DIST_GROUP_TP, d->tp, send, recv, n); }

/* Bytes of an element of collective op: bf16 words for DIST_OP_ALLGATHER_BF16, else floats. */
static size_t op_elem_bytes(int op) { return op == DIST_OP_ALLGATHER_BF16 ? 2 : sizeof(float); }

/* All-gather of n elements per member over group g (shard or TP): float32
 * (op DIST_OP_ALLGATHER) or bf16 words (DIST_OP_ALLGATHER_BF16), its bus
 * bytes added to *bytes; a group of one copies. */
static void group_allgather(Dist *d, int g, int op, const void *send, void *recv, size_t n, double *bytes) {
    int r, S;
    dist_group_rank(d, g, &r, &S);
    size_t es = op_elem_bytes(op);
    if (S == 1 || !d->groups) {
        copy_bytes(d, recv, send, n * es);
        return;
    }
    if (d->dev) dev_collective(d, "ncclAllGather", op, g, send, recv, n);
    else x_allgather(d, xc_group(d, g), send, recv, n, es);
    *bytes += (double)(S - 1) / S * (double)S * (double)n * es;
}

/* Reduce-scatter (sum) of send[size * n] into recv[n] over group g, its bus bytes added to *bytes. */
static void group_reduce_scatter(Dist *d, int g, const float *send, float *recv, size_t n, double *bytes) {
    int r, S;
    dist_group_rank(d, g, &r, &S);
    if (S == 1 || !d->groups) {
        copy_bytes(d, recv, send, n * sizeof(float));
        return;
    }
    if (d->dev) dev_collective(d, "ncclReduceScatter", DIST_OP_REDUCE_SCATTER, g, send, recv, n);
    else x_reduce_scatter_f32(d, xc_group(d, g), send, recv, n);
    *bytes += (double)(S - 1) / S * (double)S * (double)n * sizeof(float);
}

static void shard_allgather(Dist *d, int op, const void *send, void *recv, size_t n) {
    group_allgather(d, DIST_GROUP_SHARD, op, send, recv, n, &d->bytes_allgather);
}

static void tp_allgather(Dist *d, const void *send, void *recv, size_t n, int es) {
    if (es != 2 && es != 4) die(EXIT_INTERNAL, "dist_allgather: tp elements of %d bytes (expected 2 or 4)", es);
    group_allgather(d, DIST_GROUP_TP, es == 2 ? DIST_OP_ALLGATHER_BF16 : DIST_OP_ALLGATHER, send, recv, n, &d->bytes_tp_allgather);
}

static void tp_reduce_scatter_f32(Dist *d, const float *send, float *recv, size_t n) {
    group_reduce_scatter(d, DIST_GROUP_TP, send, recv, n, &d->bytes_tp_reduce_scatter);
}

static void shard_allgather_f32(Dist *d, const float *send, float *recv, size_t n) {
    if (d->shard_size > 1) trace(d, "allgather", "shard", n, -1);
    shard_allgather(d, DIST_OP_ALLGATHER, send, recv, n);
}

static void shard_allgather_bf16(Dist *d, const uint16_t *send, uint16_t *recv, size_t n) {
    if (d->shard_size > 1) trace(d, "allgather_bf16", "shard", n, -1);
    shard_allgather(d, DIST_OP_ALLGATHER_BF16, send, recv, n);
}

static void shard_reduce_scatter_f32(Dist *d, const float *send, float *recv, size_t n) {
    if (d->shard_size > 1) trace(d, "reduce_scatter", "shard", n, -1);
    group_reduce_scatter(d, DIST_GROUP_SHARD, send, recv, n, &d->bytes_reduce_scatter);
}

/* A free slot of the request table (grown on demand). */
static int req_slot(Dist *d) {
    struct DistGroups *g = d->groups;
    for (int i = 0; i < g->n_reqs; i++)
        if (!g->req_name[i]) return i; /* a handle is taken from its start to its dist_wait */
    int n = g->n_reqs ? 2 * g->n_reqs : 16;
    MPI_Request *r = malloc_check((size_t)n * 2 * sizeof *r);
    const char **nm = malloc_check((size_t)n * sizeof *nm);
    for (int i = 0; i < 2 * n; i++) r[i] = i < 2 * g->n_reqs ? g->reqs[i] : MPI_REQUEST_NULL;
    for (int i = 0; i < n; i++) nm[i] = i < g->n_reqs ? g->req_name[i] : NULL;
    free(g->reqs);
    free(g->req_name);
    g->reqs = r;
    g->req_name = nm;
    int first = g->n_reqs;
    g->n_reqs = n;
    return first;
}

/* Start a shard-group all-gather (op DIST_OP_ALLGATHER: floats,
 * DIST_OP_ALLGATHER_BF16: bf16 words) or reduce-scatter
 * (DIST_OP_REDUCE_SCATTER: floats) of n elements per member; a handle, or
 * -1 when it is already done (a one-member group's copy; over TCP, which has
 * no non-blocking collectives, the collective itself). */
static int shard_istart(Dist *d, int op, const void *send, void *recv, size_t n) {
    int S = d->shard_size, rs = op == DIST_OP_REDUCE_SCATTER;
    size_t es = op_elem_bytes(op);
    if (S == 1 || !d->groups) {
        copy_bytes(d, recv, send, n * es);
        return -1;
    }
    int h;
    if (d->dev) {
        h = dev_start(d, rs ? "ncclReduceScatter" : "ncclAllGather", op, DIST_GROUP_SHARD, send, recv, n);
    } else if (!d->use_mpi) {
        if (rs) x_reduce_scatter_f32(d, xc_group(d, DIST_GROUP_SHARD), send, recv, n);
        else x_allgather(d, xc_group(d, DIST_GROUP_SHARD), send, recv, n, es);
        h = -1;
    } else {
        const char *name = rs ? "MPI_Ireduce_scatter_block" : "MPI_Iallgather";
        MPI_Datatype t = mpi_elem(es);
        int cnt = count_of(n, name);
        h = req_slot(d);
        MPI_Request *r = &d->groups->reqs[2 * h];
        watch_collective(d, name);
        check(d, rs ? MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, cnt, t, MPI_SUM, d->groups->shard, r)
                    : MPI_Iallgather(send, cnt, t, recv, cnt, t, d->groups->shard, r), name);
        watch_collective(d, NULL);
        d->groups->req_name[h] = name;
    }
    trace(d, rs ? "reduce_scatter" : op == DIST_OP_ALLGATHER ? "allgather" : "allgather_bf16", "shard", n, h);
    *(rs ? &d->bytes_reduce_scatter : &d->bytes_allgather) += (double)(S - 1) / S * (double)S * (double)n * es;
    return h;
}

static int shard_iallgather_f32(Dist *d, const float *send, float *recv, size_t n) {
    return shard_istart(d, DIST_OP_ALLGATHER, send, recv, n);
}

static int shard_iallgather_bf16(Dist *d, const uint16_t *send, uint16_t *recv, size_t n) {
    return shard_istart(d, DIST_OP_ALLGATHER_BF16, send, recv, n);
}

static int shard_ireduce_scatter_f32(Dist *d, const float *send, float *recv, size_t n) {
    return shard_istart(d, DIST_OP_REDUCE_SCATTER, send, recv, n);
}

/* A non-blocking sum of n floats in place over group g: DIST_GROUP_DP (the
 * group dp_allreduce_sum_f32 uses) or DIST_GROUP_REPLICATE, traced as
 * gname; -1 when the group has one member or it is already done (over TCP,
 * the collective itself). */
static int iallreduce(Dist *d, int g, const char *gname, float *x, size_t n) {
    int rank, size;
    dist_group_rank(d, g, &rank, &size);
    if (size == 1 || n == 0) return -1;
    int h = -1;
    if (d->dev) {
        h = dev_start(d, "ncclAllReduce", DIST_OP_ALLREDUCE_SUM, g, x, x, n);
    } else if (!d->use_mpi || !d->groups) {
        x_allreduce(d, g == DIST_GROUP_DP && d->tp == 1 ? xc_world(d) : xc_group(d, g), x, n, X_F32, X_SUM);
    } else {
        const char *name = "MPI_Iallreduce";
        int cnt = count_of(n, name);
        h = req_slot(d);
        watch_collective(d, name);
        check(d, MPI_Iallreduce(MPI_IN_PLACE, x, cnt, MPI_FLOAT, MPI_SUM, g == DIST_GROUP_DP ? d->groups->dp : d->groups->replicate,
                                &d->groups->reqs[2 * h]), name);
        watch_collective(d, NULL);
        d->groups->req_name[h] = name;
    }
    trace(d, "allreduce", gname, n, h);
    d->bytes_allreduce += 2.0 * (size - 1) / size * (double)n * sizeof(float);
    return h;
}

static int dp_iallreduce_sum_f32(Dist *d, float *x, size_t n) { return iallreduce(d, DIST_GROUP_DP, "dp", x, n); }

static int replicate_iallreduce_sum_f32(Dist *d, float *x, size_t n) { return iallreduce(d, DIST_GROUP_REPLICATE, "replicate", x, n); }

/* dist_wait; traced: a handle the caller started (a blocking
 * collective's own handle is not traced) */
static void wait_handle(Dist *d, int h, int traced) {
    if (h < 0 || !d->groups) return;
    struct DistGroups *g = d->groups;
    if (h >= g->n_reqs || !g->req_name[h]) die(EXIT_INTERNAL, "dist_wait: bad request handle %d", h);
    if (traced) trace(d, NULL, NULL, 0, h);
    watch_collective(d, g->req_name[h]); /* the watchdog names the collective a hung wait is for */
    if (d->dev) d->dev->wait(d->dev->ctx, h);
    else check(d, MPI_Waitall(2, &g->reqs[2 * h], MPI_STATUSES_IGNORE), g->req_name[h]);
    watch_collective(d, NULL);
    g->reqs[2 * h] = g->reqs[2 * h + 1] = MPI_REQUEST_NULL;
    g->req_name[h] = NULL;
}

void dist_wait(Dist *d, int h) { wait_handle(d, h, 1); }

int dist_test(Dist *d, int h) {
    if (h < 0 || !d->groups) return 1;
    if (d->dev) return d->dev->test(d->dev->ctx, h);
    int done = 0;
    check(d, MPI_Testall(2, &d->groups->reqs[2 * h], &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    return done; /* the handle stays taken until dist_wait (MPI_Wait on a completed request returns at once) */
}

static void shard_allreduce_sum_f64(Dist *d, double *x, size_t n) {
    if (d->shard_size == 1 || !d->groups) return;
    x_allreduce(d, xc_group(d, DIST_GROUP_SHARD), x, n, X_F64, X_SUM);
}

static void shard_gather_f32(Dist *d, const float *send, float *recv, size_t n) {
    gather_f32_in(d, DIST_GROUP_SHARD, d->shard_size, send, recv, n);
}

static void replicate_allreduce_sum_f32(Dist *d, float *x, size_t n) {
    int R = d->replicate_size;
    if (R == 1 || !d->groups) return;
    trace(d, "allreduce", "replicate", n, -1);
    if (d->dev) dev_collective(d, "ncclAllReduce", DIST_OP_ALLREDUCE_SUM, DIST_GROUP_REPLICATE, x, x, n);
    else x_allreduce(d, xc_group(d, DIST_GROUP_REPLICATE), x, n, X_F32, X_SUM);
    d->bytes_allreduce += 2.0 * (R - 1) / R * (double)n * sizeof(float);
}

static void world_gather_f64(Dist *d, const double *send, double *recv, size_t n) {
    if (d->world == 1) {
        memcpy(recv, send, n * sizeof(double));
        return;
    }
    x_gather(d, xc_world(d), send, recv, n, X_F64);
}

static void world_allgather_bytes(Dist *d, const void *send, void *recv, size_t n) {
    if (d->world == 1) {
        memcpy(recv, send, n);
        return;
    }
    x_allgather(d, xc_world(d), send, recv, n, 1);
}

static void world_bcast_bytes(Dist *d, void *buf, size_t n) {
    if (d->world > 1) x_bcast(d, xc_world(d), buf, n);
}

/* ------------------------------------------------------------------ */
/* the collectives over named groups (parallel.h): each (group, type,   */
/* operation) the layouts use, routed to its implementation above      */

static const char *group_name(int g) {
    static const char *const names[] = {"tp", "shard", "replicate", "dp", "cp", "ep", "world"};
    return g >= 0 && g <= DIST_GROUP_WORLD ? names[g] : "unknown";
}
static const char *type_name(int type) {
    return type == DIST_F32 ? "f32" : type == DIST_BF16 ? "bf16" : type == DIST_F64 ? "f64" : type == DIST_BYTE ? "byte" : "unknown";
}
static void no_such(const char *what, int g, int type) {
    die(EXIT_INTERNAL, "%s: no %s collective over the %s group (%d)", what, type_name(type), group_name(g), g);
}

void dist_allreduce(Dist *d, int g, int type, int op, void *x, size_t n) {
    if (op != DIST_SUM && op != DIST_MAX) die(EXIT_INTERNAL, "dist_allreduce: operation %d", op);
    if (type == DIST_F32 && g == DIST_GROUP_TP) tp_allreduce_f32(d, x, n, op == DIST_MAX);
    else if (type == DIST_F32 && g == DIST_GROUP_CP && op == DIST_MAX) cp_allreduce_max_f32(d, x, n);
    else if (type == DIST_F32 && g == DIST_GROUP_DP && op == DIST_SUM) dp_allreduce_sum_f32(d, x, n);
    else if (type == DIST_F32 && g == DIST_GROUP_REPLICATE && op == DIST_SUM) replicate_allreduce_sum_f32(d, x, n);
    else if (type == DIST_F64 && op == DIST_SUM && g == DIST_GROUP_WORLD) world_allreduce_sum_f64(d, x, n);
    else if (type == DIST_F64 && op == DIST_SUM && g == DIST_GROUP_TP) tp_allreduce_sum_f64(d, x, n);
    else if (type == DIST_F64 && op == DIST_SUM && g == DIST_GROUP_CP) cp_allreduce_sum_f64(d, x, n);
    else if (type == DIST_F64 && op == DIST_SUM && g == DIST_GROUP_SHARD) shard_allreduce_sum_f64(d, x, n);
    else no_such(op == DIST_MAX ? "dist_allreduce (max)" : "dist_allreduce (sum)", g, type);
}

int dist_iallreduce(Dist *d, int g, float *x, size_t n) {
    if (g == DIST_GROUP_DP) return dp_iallreduce_sum_f32(d, x, n);
    if (g == DIST_GROUP_REPLICATE) return replicate_iallreduce_sum_f32(d, x, n);
    no_such("dist_iallreduce", g, DIST_F32);
    return -1;
}

void dist_allgather(Dist *d, int g, int type, const void *send, void *recv, size_t n) {
    if (g == DIST_GROUP_TP && (type == DIST_F32 || type == DIST_BF16)) tp_allgather(d, send, recv, n, type == DIST_BF16 ? 2 : 4);
    else if (g == DIST_GROUP_SHARD && type == DIST_F32) shard_allgather_f32(d, send, recv, n);
    else if (g == DIST_GROUP_SHARD && type == DIST_BF16) shard_allgather_bf16(d, send, recv, n);
    else if (g == DIST_GROUP_CP && type == DIST_BYTE) cp_allgather(d, send, recv, n);
    else if (g == DIST_GROUP_WORLD && type == DIST_BYTE) world_allgather_bytes(d, send, recv, n);
    else no_such("dist_allgather", g, type);
}

int dist_iallgather(Dist *d, int g, int type, const void *send, void *recv, size_t n) {
    if (g == DIST_GROUP_SHARD && type == DIST_F32) return shard_iallgather_f32(d, send, recv, n);
    if (g == DIST_GROUP_SHARD && type == DIST_BF16) return shard_iallgather_bf16(d, send, recv, n);
    no_such("dist_iallgather", g, type);
    return -1;
}

void dist_reduce_scatter(Dist *d, int g, const float *send, float *recv, size_t n) {
    if (g == DIST_GROUP_TP) tp_reduce_scatter_f32(d, send, recv, n);
    else if (g == DIST_GROUP_SHARD) shard_reduce_scatter_f32(d, send, recv, n);
    else if (g == DIST_GROUP_CP) cp_reduce_scatter_f32(d, send, recv, n);
    else no_such("dist_reduce_scatter", g, DIST_F32);
}

int dist_ireduce_scatter(Dist *d, int g, const float *send, float *recv, size_t n) {
    if (g == DIST_GROUP_SHARD) return shard_ireduce_scatter_f32(d, send, recv, n);
    no_such("dist_ireduce_scatter", g, DIST_F32);
    return -1;
}

void dist_gather(Dist *d, int g, int type, const void *send, void *recv, size_t n) {
    if (g == DIST_GROUP_TP && type == DIST_F32) tp_gather_f32(d, send, recv, n);
    else if (g == DIST_GROUP_SHARD && type == DIST_F32) shard_gather_f32(d, send, recv, n);
    else if (g == DIST_GROUP_WORLD && type == DIST_F64) world_gather_f64(d, send, recv, n);
    else no_such("dist_gather", g, type);
}

void dist_bcast(Dist *d, int g, void *buf, size_t n) {
    if (g == DIST_GROUP_WORLD) world_bcast_bytes(d, buf, n);
    else if (g >= 0 && g < DIST_N_GROUPS_CP) group_bcast_bytes(d, g, buf, n);
    else no_such("dist_bcast", g, DIST_BYTE);
}

int dist_shift_start(Dist *d, int g, const void *send, void *recv, size_t bytes) {
    if (g == DIST_GROUP_CP) return cp_shift_start(d, send, recv, bytes);
    no_such("dist_shift_start", g, DIST_BYTE);
    return -1;
}

void dist_shift_wait(Dist *d, int h) { cp_wait(d, h); }

void dist_alltoallv(Dist *d, int g, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                    const size_t *rcount, const size_t *rdispl) {
    if (g == DIST_GROUP_EP) ep_alltoallv(d, send, scount, sdispl, recv, rcount, rdispl);
    else no_such("dist_alltoallv", g, DIST_BYTE);
}

void dist_alltoall_counts(Dist *d, int g, const size_t *send, size_t *recv) {
    if (g == DIST_GROUP_EP) ep_alltoall_counts(d, send, recv);
    else no_such("dist_alltoall_counts", g, DIST_BYTE);
}
