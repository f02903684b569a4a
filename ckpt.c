/* ckpt.c — sharded training checkpoints (see ckpt.h): who
 * writes which slice, the background writer thread, the manifest, the
 * atomic commit, and loading into any layout of the same model. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ckpt.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PATH_BUF 4096
/* /3 seals the manifest with a checksum of its own text (its last key,
 * "manifest_checksum": mix64 of every byte before that key); /2, written
 * before, has none and is still read (resume says it is unverified). */
#define FORMAT "llmtrain-checkpoint/3"
#define FORMAT_UNSEALED "llmtrain-checkpoint/2"
#define SEAL_KEY "\"manifest_checksum\": \""
#define SEAL_LEN (sizeof SEAL_KEY - 1 + 16 + 4) /* key, 16 hex digits, "\"\n}\n" */
#define IO_CHUNK ((size_t)16 << 20)
#define SLOW_PIECE ((size_t)4096) /* LLMTRAIN_FAULT kind=ckpt_slow */

static const char *const KIND_NAME[3] = {"param", "exp_avg", "exp_avg_sq"};

/* ======================================================================
 * ownership
 * ====================================================================== */

void ckpt_owned_range(const Model *m, int c, int S, int si, int R, int ri, size_t *lo, size_t *hi) {
    size_t len = m->chunk_size[c] / (size_t)S;
    size_t base = m->chunk_offset[c] + (size_t)si * len;
    *lo = base + len * (size_t)ri / (size_t)R;
    *hi = base + len * (size_t)(ri + 1) / (size_t)R;
}

size_t ckpt_owned_floats(const Model *m, int S, int si, int R, int ri) {
    size_t n = 0;
    for (int c = 0; c < m->n_chunks; c++) {
        size_t lo, hi;
        ckpt_owned_range(m, c, S, si, R, ri, &lo, &hi);
        n += hi - lo;
    }
    return n;
}

/* ======================================================================
 * checksum: 64-bit multiply-xorshift over little-endian words
 * ====================================================================== */

static uint64_t mix_word(uint64_t h, uint64_t w) {
    h ^= w;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

void ckpt_hash_init(CkptHash *h) { memset(h, 0, sizeof *h); h->h = 0x6a09e667f3bcc909ull; }

void ckpt_hash_update(CkptHash *h, const void *p, size_t n) {
    const unsigned char *b = p;
    h->len += n;
    while (h->ntail && n) { h->tail[h->ntail++] = *b++; n--; if (h->ntail == 8) { uint64_t w; memcpy(&w, h->tail, 8); h->h = mix_word(h->h, w); h->ntail = 0; } }
    uint64_t x = h->h;
    for (; n >= 8; n -= 8, b += 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        x = mix_word(x, w);
    }
    h->h = x;
    while (n--) h->tail[h->ntail++] = *b++;
}

uint64_t ckpt_hash_final(CkptHash *h) {
    uint64_t w = 0;
    memcpy(&w, h->tail, (size_t)h->ntail);
    uint64_t x = mix_word(mix_word(h->h, w), h->len);
    return mix_word(x, 0x2545f4914f6cdd1dull);
}

/* ======================================================================
 * file helpers (report errors; the writer thread must not exit)
 * ====================================================================== */

static int errf(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int errf(char *why, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vformat_line(why, n, fmt, ap);
    va_end(ap);
    return -1;
}

static int write_all(int fd, const void *p, size_t n) {
    const char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

void ckpt_remove(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static bool path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void writer_progress(CkptWriter *w, size_t n); /* (background writer, below) */

/* A write job's failure: errno as the failing call left it (the arguments,
 * strerror(errno) among them, are evaluated before this body runs), then
 * the message. */
static int job_err(CkptJobResult *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int job_err(CkptJobResult *r, const char *fmt, ...) {
    r->err = errno;
    va_list ap;
    va_start(ap, fmt);
    vformat_line(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    return -1;
}

/* Write (src == NULL: from buf) or copy (from file src) into dst with a
 * checksum; fsync; the partial file is removed on failure. Each piece
 * written counts in w's progress. */
/* Test hooks: die_after > 0: SIGKILL this process once that many bytes of
 * the file are written, before its fsync; slow: 4 KiB pieces, 20 ms apart. */
static int write_file(CkptWriter *w, const char *dst, const float *buf, size_t floats, const char *src, size_t die_after, int slow,
                      CkptJobResult *r) {
    char dir[PATH_BUF];
    path_parent(dir, sizeof dir, dst);
    if (mkdir_p_durable(dir) != 0) return job_err(r, "%s: cannot create directory (%s)", dir, strerror(errno));
    int in = -1;
    unsigned char *tmp = NULL;
    if (src) {
        in = open(src, O_RDONLY);
        if (in < 0) return job_err(r, "%s: cannot open (%s)", src, strerror(errno));
        tmp = malloc(IO_CHUNK); /* on the writer thread: no memory fails this copy, it does not end the process */
        if (!tmp) {
            close(in);
            return job_err(r, "%s: no memory for the %zu MiB copy buffer", dst, IO_CHUNK >> 20);
        }
    }
    int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        if (in >= 0) close(in);
        free(tmp);
        return job_err(r, "%s: cannot create (%s)", dst, strerror(errno));
    }
    CkptHash h;
    ckpt_hash_init(&h);
    size_t total = src ? 0 : floats * sizeof(float), done = 0;
    int rc = 0;
    for (;;) {
        const void *p;
        size_t n;
        if (src) {
            ssize_t got = read(in, tmp, slow ? SLOW_PIECE : IO_CHUNK);
            if (got < 0) { if (errno == EINTR) continue; rc = job_err(r, "%s: read failed (%s)", src, strerror(errno)); break; }
            if (got == 0) break;
            p = tmp;
            n = (size_t)got;
        } else {
            if (done == total) break;
            n = total - done < IO_CHUNK ? total - done : IO_CHUNK;
            if (slow && n > SLOW_PIECE) n = SLOW_PIECE;
            if (die_after > done && n > die_after - done) n = die_after - done;
            p = (const char *)buf + done;
        }
        ckpt_hash_update(&h, p, n);
        if (write_all(fd, p, n) != 0) { rc = job_err(r, "%s: write failed (%s)", dst, strerror(errno)); break; }
        done += n;
        writer_progress(w, n);
        if (die_after && done >= die_after) raise(SIGKILL); /* LLMTRAIN_FAULT kind=ckpt_die */
        if (slow) { /* LLMTRAIN_FAULT kind=ckpt_slow */
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (rc == 0 && fsync(fd) != 0) rc = job_err(r, "%s: fsync failed (%s)", dst, strerror(errno));
    if (close(fd) != 0 && rc == 0) rc = job_err(r, "%s: close failed (%s)", dst, strerror(errno));
    if (in >= 0) close(in);
    free(tmp);
    if (rc != 0) { unlink(dst); return rc; }
    r->bytes = done;
    r->checksum = ckpt_hash_final(&h);
    return 0;
}

/* ======================================================================
 * background writer
 * ====================================================================== */

struct CkptWriter {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit, job;          /* job: 0 none, 1 write, 2 copy */
    int state;
    char dst[PATH_BUF], src[PATH_BUF];
    size_t floats;
    size_t die_after;       /* test hook for the next write job (0: off) */
    int slow, hang;         /* test hooks for the next job (kind=ckpt_slow, ckpt_hang) */
    size_t progress;        /* bytes written by every job so far */
    float *staging;
    CkptJobResult result;
};

static void *writer_main(void *arg) {
    CkptWriter *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) break;
        int job = w->job, slow = w->slow, hang = w->hang;
        size_t die_after = job == 1 ? w->die_after : 0;
        w->die_after = 0;
        w->slow = w->hang = 0;
        pthread_mutex_unlock(&w->mu);
        while (hang) pause(); /* LLMTRAIN_FAULT kind=ckpt_hang: a write that never returns */
        CkptJobResult r;
        memset(&r, 0, sizeof r);
        double t0 = now_s();
        int rc = write_file(w, w->dst, job == 1 ? w->staging : NULL, w->floats, job == 2 ? w->src : NULL, die_after, slow, &r);
        r.seconds = now_s() - t0;
        r.state = rc == 0 ? CKPT_DONE : CKPT_FAILED;
        pthread_mutex_lock(&w->mu);
        w->result = r;
        w->state = r.state;
        w->job = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

CkptWriter *ckpt_writer_new(size_t staging_floats) {
    CkptWriter *w = calloc_check(1, sizeof *w);
    /* touch every page now, so the first checkpoint's blocking copy does not
     * pay for page faults */
    w->staging = calloc_check(staging_floats ? staging_floats : 1, sizeof(float));
    memset(w->staging, 0, staging_floats * sizeof(float));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) die(EXIT_INTERNAL, "checkpoint: cannot start the writer thread");
    return w;
}

void ckpt_writer_free(CkptWriter *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->staging);
    free(w);
}

float *ckpt_writer_staging(CkptWriter *w) { return w->staging; }

void ckpt_writer_die_after(CkptWriter *w, size_t bytes) {
    pthread_mutex_lock(&w->mu);
    w->die_after = bytes;
    pthread_mutex_unlock(&w->mu);
}

void ckpt_writer_fault(CkptWriter *w, int slow, int hang) {
    pthread_mutex_lock(&w->mu);
    w->slow = slow;
    w->hang = hang;
    pthread_mutex_unlock(&w->mu);
}

static void writer_progress(CkptWriter *w, size_t n) {
    pthread_mutex_lock(&w->mu);
    w->progress += n;
    pthread_mutex_unlock(&w->mu);
}

static void start_job(CkptWriter *w, int job, const char *dst, const char *src, size_t floats) {
    pthread_mutex_lock(&w->mu);
    if (w->state == CKPT_BUSY) die(EXIT_INTERNAL, "checkpoint: writer busy");
    snprintf(w->dst, sizeof w->dst, "%s", dst);
    snprintf(w->src, sizeof w->src, "%s", src ? src : "");
    w->floats = floats;
    w->job = job;
    w->state = CKPT_BUSY;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void ckpt_writer_write(CkptWriter *w, const char *path, size_t floats) { start_job(w, 1, path, NULL, floats); }
void ckpt_writer_copy(CkptWriter *w, const char *src, const char *dst) { start_job(w, 2, dst, src, 0); }

int ckpt_writer_state(CkptWriter *w) {
    pthread_mutex_lock(&w->mu);
    int s = w->state;
    pthread_mutex_unlock(&w->mu);
    return s;
}

int ckpt_writer_wait(CkptWriter *w) {
    pthread_mutex_lock(&w->mu);
    while (w->state == CKPT_BUSY) pthread_cond_wait(&w->cv, &w->mu);
    int s = w->state;
    pthread_mutex_unlock(&w->mu);
    return s;
}

int ckpt_writer_wait_for(CkptWriter *w, double seconds, size_t *progress) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double t = (double)until.tv_nsec * 1e-9 + seconds;
    until.tv_sec += (time_t)t;
    until.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
    pthread_mutex_lock(&w->mu);
    while (w->state == CKPT_BUSY)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT) break;
    int s = w->state;
    *progress = w->progress;
    pthread_mutex_unlock(&w->mu);
    return s;
}

CkptJobResult ckpt_writer_take(CkptWriter *w) {
    pthread_mutex_lock(&w->mu);
    CkptJobResult r = w->result;
    r.state = w->state;
    if (w->state != CKPT_BUSY) w->state = CKPT_IDLE;
    pthread_mutex_unlock(&w->mu);
    return r;
}

/* ======================================================================
 * manifest
 * ====================================================================== */

void ckpt_step_dir(char *out, size_t n, const char *root, int step, int tmp) {
    int w = snprintf(out, n, "%s/step_%08d%s", root, step, tmp ? ".tmp" : "");
    if (w < 0 || (size_t)w >= n) die(EXIT_USAGE, "%s: checkpoint path too long", root);
}

/* Rank r of layout L: its TP rank, shard index and replica index. */
static void rank_coords(const CkptLayout *L, int r, int *tr, int *si, int *ri) {
    *tr = r % L->tp;
    *si = (r / L->tp) % L->shard;
    *ri = r / (L->tp * L->shard);
}

char *ckpt_manifest_text(const Model *m, const CkptLayout *L, const uint64_t *bytes, const uint64_t *checksums,
                         const Config *cfg, const TrainState *st) {
    Buf b = {0};
    buf_add(&b, "{\n\"format\": \"" FORMAT "\",\n\"step\": %d,\n\"seq_cursor\": \"%llu\",\n\"rng\": \"%llu\",\n", st->step,
            (unsigned long long)st->seq_cursor, (unsigned long long)st->rng);
    buf_add(&b, "\"state\": {\"nonfinite_total\": %d, \"norm_n\": %d, \"spike_len\": %d, \"spikes\": %d, \"norm_hist\": [",
            st->nonfinite_total, st->norm_n, st->spike_len, st->spikes);
    for (int i = 0; i < CKPT_SPIKE_WINDOW; i++) buf_add(&b, "%s%.17g", i ? ", " : "", st->norm_hist[i]);
    buf_add(&b, "]");
    if (st->moe_bias_n > 0) { /* aux-loss-free balancing's biases, exact (9 digits read back as the float) */
        buf_add(&b, ", \"moe_bias\": [");
        for (int i = 0; i < st->moe_bias_n; i++) buf_add(&b, "%s%.9g", i ? ", " : "", (double)st->moe_bias[i]);
        buf_add(&b, "]");
    }
    buf_add(&b, "},\n\"layout\": {\"world\": %d, \"tp\": %d, \"shard\": %d, \"replicate\": %d},\n", L->world, L->tp, L->shard,
            L->replicate);
    /* file index of each rank that wrote something */
    int *file_of = malloc_check((size_t)L->world * sizeof(int));
    int nf = 0;
    buf_add(&b, "\"checksum\": \"mix64\",\n\"files\": [");
    for (int r = 0; r < L->world; r++) {
        file_of[r] = -1;
        if (!bytes[r]) continue;
        file_of[r] = nf;
        buf_add(&b, "%s\n  {\"name\": \"rank_%05d.bin\", \"rank\": %d, \"bytes\": %llu, \"checksum\": \"%016llx\"}", nf ? "," : "", r, r,
                (unsigned long long)bytes[r], (unsigned long long)checksums[r]);
        nf++;
    }
    buf_add(&b, "\n],\n\"tensors\": [");
    /* per rank: where each chunk's owned range starts in its file (floats) */
    size_t *pos = malloc_check((size_t)L->world * (size_t)m->n_chunks * sizeof(size_t));
    size_t *owned = malloc_check((size_t)L->world * sizeof(size_t));
    for (int r = 0; r < L->world; r++) {
        int tr, si, ri;
        rank_coords(L, r, &tr, &si, &ri);
        size_t p = 0;
        for (int c = 0; c < m->n_chunks; c++) {
            size_t lo, hi;
            ckpt_owned_range(m, c, L->shard, si, L->replicate, ri, &lo, &hi);
            pos[(size_t)r * m->n_chunks + c] = p;
            p += hi - lo;
        }
        owned[r] = p;
    }
    int first = 1;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < m->n_specs; i++) {
            const ParamSpec *s = &m->specs[i];
            buf_add(&b, "%s\n  {\"name\": \"%s\", \"kind\": \"%s\", \"shape\": [", first ? "" : ",", s->name, KIND_NAME[k]);
            first = 0;
            if (s->ndim == 2) {
                int64_t r0 = s->shape[0], c0 = s->shape[1];
                if (s->tp_axis == 0) r0 *= L->tp;
                if (s->tp_axis == 1) c0 *= L->tp;
                buf_add(&b, "%lld, %lld]", (long long)r0, (long long)c0);
            } else {
                buf_add(&b, "%lld]", (long long)s->shape[0] * (s->tp_axis == 0 ? L->tp : 1));
            }
            buf_add(&b, ", \"local_shape\": [%d", s->shape[0]);
            if (s->ndim == 2) buf_add(&b, ", %d", s->shape[1]);
            buf_add(&b, "], \"tp_axis\": %d, \"slices\": [", s->tp_axis);
            int ns = 0;
            for (int r = 0; r < L->world; r++) {
                int tr, si, ri;
                rank_coords(L, r, &tr, &si, &ri);
                if (s->tp_axis < 0 && tr != 0) continue; /* replicated: TP rank 0's copy */
                size_t lo, hi;
                ckpt_owned_range(m, s->chunk, L->shard, si, L->replicate, ri, &lo, &hi);
                size_t a = s->offset > lo ? s->offset : lo, e = s->offset + s->numel < hi ? s->offset + s->numel : hi;
                if (a >= e) continue;
                size_t fpos = (size_t)k * owned[r] + pos[(size_t)r * m->n_chunks + s->chunk] + (a - lo);
                /* [tp_rank, file, byte offset, first element, elements] */
                buf_add(&b, "%s[%d, %d, %zu, %zu, %zu]", ns++ ? ", " : "", tr, file_of[r], fpos * sizeof(float), a - s->offset, e - a);
            }
            buf_add(&b, "]}");
        }
    }
    char *sched = config_schedule_json(cfg);
    buf_add(&b, "\n],\n\"schedule\": %s,\n\"config\": %s,\n", sched, cfg->json_text ? cfg->json_text : "{}");
    free(sched);
    if (cfg->origin_json) buf_add(&b, "\"origin\": %s,\n", cfg->origin_json);
    CkptHash h;
    ckpt_hash_init(&h);
    ckpt_hash_update(&h, b.s, b.len);
    buf_add(&b, SEAL_KEY "%016llx\"\n}\n", (unsigned long long)ckpt_hash_final(&h));
    free(pos);
    free(owned);
    free(file_of);
    return b.s;
}

/* ckpt_commit's failure: "<what> (<strerror(e)>)" into why, -e returned */
static int commit_err(char *why, size_t n, int e, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int commit_err(char *why, size_t n, int e, const char *fmt, ...) {
    char what[PATH_BUF * 2 + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    errf(why, n, "%s (%s)", what, strerror(e));
    return e > 0 ? -e : -EIO;
}

int ckpt_commit(const char *tmp_dir, const char *final_dir, const char *root, const char *manifest, char *why, size_t n) {
    char path[PATH_BUF], tmp[PATH_BUF + 16];
    snprintf(path, sizeof path, "%s/manifest.json", tmp_dir);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    if (!path_exists(tmp_dir) && path_exists(final_dir)) return 0; /* another node committed it */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return commit_err(why, n, errno, "%s: cannot create", tmp);
    if (write_all(fd, manifest, strlen(manifest)) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return commit_err(why, n, e, "%s: write failed", tmp);
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return commit_err(why, n, e, "%s: cannot rename", tmp);
    }
    if (sync_dir(tmp_dir) != 0) return commit_err(why, n, errno, "%s: fsync failed", tmp_dir);
    char old[PATH_BUF + 8];
    snprintf(old, sizeof old, "%s.old", final_dir);
    bool replace = path_exists(final_dir);
    if (replace) { /* the same step again (a re-run after resume): move the old one aside first */
        ckpt_remove(old);
        if (rename(final_dir, old) != 0) return commit_err(why, n, errno, "%s: cannot move aside", final_dir);
    }
    if (rename(tmp_dir, final_dir) != 0) {
        if (errno == ENOENT && path_exists(final_dir)) return 0;
        return commit_err(why, n, errno, "%s: cannot rename to %s", tmp_dir, final_dir);
    }
    if (sync_dir(root) != 0) return commit_err(why, n, errno, "%s: fsync failed", root);
    if (replace) ckpt_remove(old);
    return 0;
}

/* "step_" followed by 8-10 digits and nothing else (no .tmp / .old). */
static long step_of(const char *name, const char *suffix) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *d = name + 5;
    size_t n = strspn(d, "0123456789");
    if (n < 8 || n > 10 || strcmp(d + n, suffix) != 0) return -1;
    return strtol(d, NULL, 10);
}

static bool has_manifest(const char *dir) {
    char p[PATH_BUF];
    int w = snprintf(p, sizeof p, "%s/manifest.json", dir);
    struct stat sb;
    return w > 0 && (size_t)w < sizeof p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

/* Steps of complete folders under root, newest first (malloc'd). */
static long *complete_steps(const char *root, size_t *count) {
    *count = 0;
    DIR *d = opendir(root);
    if (!d) return NULL;
    long *steps = NULL;
    size_t n = 0, cap = 0;
    char p[PATH_BUF];
    for (struct dirent *e; (e = readdir(d));) {
        long step = step_of(e->d_name, "");
        if (step < 0) continue;
        int len = snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        if (len < 0 || (size_t)len >= sizeof p || !has_manifest(p)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *ns = malloc_check(cap * sizeof *ns);
            if (steps) memcpy(ns, steps, n * sizeof *ns);
            free(steps);
            steps = ns;
        }
        steps[n++] = step;
    }
    closedir(d);
    if (n) qsort(steps, n, sizeof *steps, cmp_desc);
    *count = n;
    return steps;
}

int ckpt_list(const char *root, char *paths, size_t n, int max) {
    size_t count;
    long *steps = complete_steps(root, &count);
    int k = 0;
    for (size_t i = 0; i < count && k < max; i++, k++) snprintf(paths + (size_t)k * n, n, "%s/step_%08ld", root, steps[i]);
    free(steps);
    return k;
}

void ckpt_remove_partial(const char *root) {
    DIR *d = opendir(root);
    if (!d) return;
    char p[PATH_BUF], fin[PATH_BUF];
    int restored = 0;
    for (struct dirent *e; (e = readdir(d));) {
        long old = step_of(e->d_name, ".old");
        if (step_of(e->d_name, ".tmp") < 0 && old < 0) continue;
        int len = snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        if (len <= 0 || (size_t)len >= sizeof p) continue;
        /* a complete folder that ckpt_commit moved aside to replace it, and
         * the run died before the replacement took its name: put it back
         * (resume verifies it as any other) */
        snprintf(fin, sizeof fin, "%s/step_%08ld", root, old);
        if (old >= 0 && !path_exists(fin) && has_manifest(p) && rename(p, fin) == 0) {
            restored = 1;
            continue;
        }
        ckpt_remove(p);
    }
    closedir(d);
    if (restored) (void)sync_dir(root);
}

int ckpt_prune(const char *root, int keep_last, long newest) {
    if (keep_last <= 0) return 0;
    size_t count;
    long *steps = complete_steps(root, &count);
    int removed = 0, kept = 0;
    char p[PATH_BUF];
    for (size_t i = 0; i < count; i++) {
        if (steps[i] > newest) continue; /* not this run's: neither counted nor removed */
        if (kept < keep_last) {
            kept++;
            continue;
        }
        snprintf(p, sizeof p, "%s/step_%08ld", root, steps[i]);
        ckpt_remove(p);
        removed++;
    }
    free(steps);
    return removed;
}

int ckpt_remove_step(const char *root, long step) {
    char p[PATH_BUF];
    snprintf(p, sizeof p, "%s/step_%08ld", root, step);
    if (!path_exists(p)) return 0;
    ckpt_remove(p);
    return 1;
}

/* ======================================================================
 * the folder: writable, and one job's
 * ====================================================================== */

int ckpt_dir_probe(const char *root, int rank, char *why, size_t n) {
    if (mkdir_p_durable(root) != 0) {
        int e = errno;
        errf(why, n, "%s: cannot create the folder (%s)", root, strerror(e));
        return -e;
    }
    char host[64], probe[PATH_BUF + 128];
    host_name(host, sizeof host);
    /* rank and pid: node leaders on one shared folder (containers often
     * share a host name and a small pid) never meet on one name */
    snprintf(probe, sizeof probe, "%s/.llmtrain-probe.%.60s.%d.%d", root, host, rank, (int)getpid());
    unlink(probe); /* one a run that died left */
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        errf(why, n, "%s: cannot create a file in it (%s)", root, strerror(e));
        return -e;
    }
    close(fd);
    if (unlink(probe) != 0 && errno != ENOENT) {
        int e = errno;
        errf(why, n, "%s: cannot remove a file from it (%s)", root, strerror(e));
        return -e;
    }
    return 0;
}

/* a lock the file system does not implement (network and FUSE file
 * systems), as opposed to one another process holds */
static bool lock_unsupported(int e) { return e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS || e == EINVAL; }

int ckpt_dir_lock(const char *root, const char *owner, int *fd_out, char *why, size_t n) {
    char path[PATH_BUF + 32];
    snprintf(path, sizeof path, "%s/" CKPT_LOCK_NAME, root);
    *fd_out = -1;
    /* 0666 less the umask: a teammate's job in a group-shared folder can
     * take it next; a lock file of another user's we may only read still
     * takes a lock (flock needs no write access), without our name in it */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666), named = 1;
    if (fd < 0 && errno == EACCES) {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        named = 0;
    }
    if (fd < 0) {
        int e = errno;
        errf(why, n, "%s: cannot open (%s)", path, strerror(e));
        return e == ENOSPC || e == EDQUOT ? CKPT_LOCK_UNSUPPORTED : CKPT_LOCK_FAILED; /* a full disk: no lock file, as no lock */
    }
    /* flock, else a POSIX record lock (what some network file systems
     * implement instead); both end with the process, so a dead job's lock
     * file holds nothing */
    int rc = flock(fd, LOCK_EX | LOCK_NB), e = rc ? errno : 0, e2 = 0;
    if (rc != 0 && lock_unsupported(e)) {
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        rc = fcntl(fd, F_SETLK, &fl);
        e2 = rc ? errno : 0;
        if (rc != 0 && e2 == EBADF && !named) e2 = ENOLCK; /* a write lock on a read-only descriptor: none to be had */
        if (rc != 0 && lock_unsupported(e2)) {
            close(fd);
            errf(why, n, "%s: the file system takes no lock (flock: %s; fcntl: %s)", path, strerror(e), strerror(e2));
            return CKPT_LOCK_UNSUPPORTED;
        }
        e = e2;
    }
    if (rc != 0) {
        char holder[256] = "";
        ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
        holder[got > 0 ? got : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(fd);
        if (e == EWOULDBLOCK || e == EAGAIN || e == EACCES) {
            errf(why, n, "%s is in use by another job: %s", root, holder[0] ? holder : "(a process that has not yet written its name)");
            return CKPT_LOCK_HELD;
        }
        errf(why, n, "%s: cannot lock (%s)", path, strerror(e));
        return CKPT_LOCK_FAILED;
    }
    size_t len = strlen(owner);
    if (named) { /* a failure loses only the name a second job would print: locked all the same */
        bool ok = ftruncate(fd, 0) == 0 && pwrite(fd, owner, len, 0) == (ssize_t)len && pwrite(fd, "\n", 1, (off_t)len) == 1;
        (void)ok;
    }
    *fd_out = fd;
    return CKPT_LOCKED;
}

int ckpt_resolve(const char *path, char *out_dir, size_t out_len) {
    if (has_manifest(path)) {
        if (strlen(path) >= out_len) return -1;
        snprintf(out_dir, out_len, "%s", path);
        return 0;
    }
    return ckpt_list(path, out_dir, out_len, 1) == 1 ? 0 : -1;
}

/* ======================================================================
 * reading
 * ====================================================================== */

typedef struct Slice { int tp_rank, file; size_t byte_off, start, count; } Slice;
typedef struct MTensor {
    char name[64];
    int kind, ndim, tp_axis;
    int64_t shape[2], local_shape[2];
    Slice *slices;
    int n_slices;
} MTensor;
typedef struct MFile { char name[64]; uint64_t bytes, checksum; } MFile;

struct CkptManifest {
    char dir[PATH_BUF];
    int sealed; /* format /3: the text's own checksum held */
    TrainState st;
    CkptLayout layout;
    char *config;
    char *origin; /* NULL: none (a run before origin records) */
    char *schedule; /* NULL: written before manifests recorded it */
    float *moe_bias; /* state.moe_bias (NULL: none), which st's view points at */
    MFile *files;
    int n_files;
    MTensor *tensors;
    int n_tensors;
};

void ckpt_manifest_close(CkptManifest *mf) {
    if (!mf) return;
    for (int i = 0; i < mf->n_tensors; i++) free(mf->tensors[i].slices);
    free(mf->tensors);
    free(mf->files);
    free(mf->config);
    free(mf->origin);
    free(mf->schedule);
    free(mf->moe_bias);
    free(mf);
}

/* a JSON number that is whole, at least lo and at most 2^53 (exact in a
 * double, so casting it and summing a few cannot overflow) */
static bool json_whole(const cJSON *v, double lo, uint64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= 9007199254740992.0) ||
        v->valuedouble != floor(v->valuedouble))
        return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

static bool get_u64(const cJSON *o, const char *key, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v)) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v->valuestring, &end, 0);
        if (!(v->valuestring[0] >= '0' && v->valuestring[0] <= '9') || *end || errno) return false; /* no sign, no space */
        *out = x;
        return true;
    }
    return json_whole(v, 0, out);
}

static bool get_int(const cJSON *o, const char *key, int lo, int *out) {
    uint64_t u;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v) && v->valuedouble < 0 && lo < 0 && v->valuedouble >= lo && v->valuedouble == (int)v->valuedouble) {
        *out = (int)v->valuedouble;
        return true;
    }
    if (!get_u64(o, key, &u) || u > 0x7fffffff || (int)u < lo) return false;
    *out = (int)u;
    return true;
}

static bool get_shape(const cJSON *o, const char *key, int *ndim, int64_t *shape) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    int n = cJSON_GetArraySize(a);
    if (!cJSON_IsArray(a) || n < 1 || n > 2) return false;
    for (int i = 0; i < n; i++) {
        uint64_t d;
        if (!json_whole(cJSON_GetArrayItem(a, i), 1, &d)) return false;
        shape[i] = (int64_t)d;
    }
    *ndim = n;
    return true;
}

/* A sealed manifest ends with SEAL_KEY, the mix64 of every byte before
 * it as 16 lower-case hex digits, and "\"\n}\n": any other ending, or
 * another sum, is an edit or damage. */
static int seal_check(const char *text, size_t len, const char *path, char *why, size_t n) {
    if (len < SEAL_LEN) return errf(why, n, "%s: does not end with its manifest_checksum line (cut short or edited?)", path);
    const char *seal = text + len - SEAL_LEN, *hex = seal + sizeof SEAL_KEY - 1;
    if (memcmp(seal, SEAL_KEY, sizeof SEAL_KEY - 1) != 0 || strspn(hex, "0123456789abcdef") != 16 ||
        memcmp(hex + 16, "\"\n}\n", 4) != 0)
        return errf(why, n, "%s: does not end with its manifest_checksum line (cut short or edited?)", path);
    CkptHash h;
    ckpt_hash_init(&h);
    ckpt_hash_update(&h, text, len - SEAL_LEN);
    char sum[17];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)ckpt_hash_final(&h));
    if (memcmp(sum, hex, 16) != 0)
        return errf(why, n, "%s: the manifest's own checksum is %s, its manifest_checksum says %.16s (edited or damaged)", path, sum, hex);
    return 0;
}

#define BAD(...) do { errf(why, n, __VA_ARGS__); goto fail; } while (0)

CkptManifest *ckpt_manifest_open(const char *dir, char *why, size_t n) {
    char path[PATH_BUF];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    size_t len;
    char *text = read_text_file(path, &len);
    CkptManifest *mf = calloc_check(1, sizeof *mf);
    snprintf(mf->dir, sizeof mf->dir, "%s", dir);
    cJSON *root = NULL;
    if (!text) BAD("%s: cannot read (%s)", path, read_text_why());
    root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) BAD("%s: not valid JSON (truncated?)", path);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt)) BAD("%s: key format: expected \"" FORMAT "\"", path);
    mf->sealed = strcmp(fmt->valuestring, FORMAT) == 0;
    if (!mf->sealed && strcmp(fmt->valuestring, FORMAT_UNSEALED) != 0)
        BAD("%s: key format: \"%.80s\" is not a format this build reads (expected \"" FORMAT "\", or \"" FORMAT_UNSEALED
            "\" from before manifests carried their own checksum)", path, fmt->valuestring);
    if (!mf->sealed && cJSON_HasObjectItem(root, "manifest_checksum"))
        BAD("%s: key format says \"" FORMAT_UNSEALED "\", which has no manifest_checksum, but this manifest has one (edited or damaged)", path);
    if (mf->sealed && seal_check(text, len, path, why, n) != 0) goto fail;
    uint64_t u;
    if (!get_int(root, "step", 0, &mf->st.step)) BAD("%s: key step: expected a non-negative integer", path);
    if (!get_u64(root, "seq_cursor", &mf->st.seq_cursor)) BAD("%s: key seq_cursor: expected a decimal string", path);
    if (!get_u64(root, "rng", &u)) BAD("%s: key rng: expected a decimal string", path);
    mf->st.rng = u;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "state");
    const cJSON *hist = cJSON_GetObjectItemCaseSensitive(st, "norm_hist");
    if (!cJSON_IsObject(st) || !get_int(st, "nonfinite_total", 0, &mf->st.nonfinite_total) || !get_int(st, "norm_n", 0, &mf->st.norm_n) ||
        !get_int(st, "spike_len", 0, &mf->st.spike_len) || !get_int(st, "spikes", 0, &mf->st.spikes) || !cJSON_IsArray(hist) ||
        cJSON_GetArraySize(hist) != CKPT_SPIKE_WINDOW)
        BAD("%s: key state: expected nonfinite_total, norm_n, spike_len, spikes and %d norm_hist values", path, CKPT_SPIKE_WINDOW);
    for (int i = 0; i < CKPT_SPIKE_WINDOW; i++) mf->st.norm_hist[i] = cJSON_GetArrayItem(hist, i)->valuedouble;
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(st, "moe_bias");
    if (bias) { /* aux-loss-free balancing's biases (a manifest before them, or without them: none) */
        int nb = cJSON_IsArray(bias) ? cJSON_GetArraySize(bias) : -1;
        if (nb < 1) BAD("%s: key state.moe_bias: expected an array of numbers", path);
        mf->moe_bias = malloc_check((size_t)nb * sizeof(float));
        for (int i = 0; i < nb; i++) {
            const cJSON *v = cJSON_GetArrayItem(bias, i);
            if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) BAD("%s: key state.moe_bias[%d]: expected a finite number", path, i);
            mf->moe_bias[i] = (float)v->valuedouble;
        }
        mf->st.moe_bias = mf->moe_bias;
        mf->st.moe_bias_n = nb;
    }
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(root, "layout");
    CkptLayout *L = &mf->layout;
    if (!get_int(lay, "world", 1, &L->world) || !get_int(lay, "tp", 1, &L->tp) || !get_int(lay, "shard", 1, &L->shard) ||
        !get_int(lay, "replicate", 1, &L->replicate) || L->world != (long long)L->tp * L->shard * L->replicate)
        BAD("%s: key layout: expected world = tp x shard x replicate", path);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsArray(files)) BAD("%s: key files: expected an array", path);
    mf->n_files = cJSON_GetArraySize(files);
    mf->files = calloc_check((size_t)mf->n_files + 1, sizeof(MFile));
    for (int i = 0; i < mf->n_files; i++) {
        const cJSON *f = cJSON_GetArrayItem(files, i), *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        MFile *F = &mf->files[i];
        if (!cJSON_IsString(nm) || strlen(nm->valuestring) >= sizeof F->name || strchr(nm->valuestring, '/') ||
            !get_u64(f, "bytes", &F->bytes))
            BAD("%s: files[%d]: expected name and bytes", path, i);
        snprintf(F->name, sizeof F->name, "%s", nm->valuestring);
        const cJSON *cs = cJSON_GetObjectItemCaseSensitive(f, "checksum");
        char *end;
        if (!cJSON_IsString(cs) || !cs->valuestring[0]) BAD("%s: files[%d]: expected a hex checksum", path, i);
        F->checksum = strtoull(cs->valuestring, &end, 16);
        if (*end) BAD("%s: files[%d]: expected a hex checksum", path, i);
    }
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsArray(tensors)) BAD("%s: key tensors: expected an array", path);
    mf->n_tensors = cJSON_GetArraySize(tensors);
    mf->tensors = calloc_check((size_t)mf->n_tensors + 1, sizeof(MTensor));
    for (int i = 0; i < mf->n_tensors; i++) {
        const cJSON *t = cJSON_GetArrayItem(tensors, i), *nm = cJSON_GetObjectItemCaseSensitive(t, "name"),
                    *kind = cJSON_GetObjectItemCaseSensitive(t, "kind"), *sl = cJSON_GetObjectItemCaseSensitive(t, "slices");
        MTensor *T = &mf->tensors[i];
        int lnd;
        if (!cJSON_IsString(nm) || strlen(nm->valuestring) >= sizeof T->name || !cJSON_IsString(kind) ||
            !get_shape(t, "shape", &T->ndim, T->shape) || !get_shape(t, "local_shape", &lnd, T->local_shape) || lnd != T->ndim ||
            !get_int(t, "tp_axis", -1, &T->tp_axis) || !cJSON_IsArray(sl))
            BAD("%s: tensors[%d]: expected name, kind, shape, local_shape, tp_axis and slices", path, i);
        snprintf(T->name, sizeof T->name, "%s", nm->valuestring);
        T->kind = -1;
        for (int k = 0; k < 3; k++) if (strcmp(kind->valuestring, KIND_NAME[k]) == 0) T->kind = k;
        if (T->kind < 0) BAD("%s: tensors[%d] (%s): kind \"%s\": expected param, exp_avg or exp_avg_sq", path, i, T->name, kind->valuestring);
        T->n_slices = cJSON_GetArraySize(sl);
        T->slices = calloc_check((size_t)T->n_slices + 1, sizeof(Slice));
        for (int j = 0; j < T->n_slices; j++) {
            const cJSON *a = cJSON_GetArrayItem(sl, j);
            uint64_t v[5];
            if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 5) BAD("%s: tensors[%d] (%s): slice %d: expected 5 numbers", path, i, T->name, j);
            for (int q = 0; q < 5; q++)
                if (!json_whole(cJSON_GetArrayItem(a, q), 0, &v[q]))
                    BAD("%s: tensors[%d] (%s): slice %d: expected 5 non-negative integers", path, i, T->name, j);
            if (v[0] >= (uint64_t)L->tp || v[1] >= (uint64_t)mf->n_files || v[2] + v[4] * sizeof(float) > mf->files[v[1]].bytes)
                BAD("%s: tensors[%d] (%s): slice %d lies outside the files or the layout", path, i, T->name, j);
            Slice *S = &T->slices[j];
            S->tp_rank = (int)v[0];
            S->file = (int)v[1];
            S->byte_off = (size_t)v[2];
            S->start = (size_t)v[3];
            S->count = (size_t)v[4];
        }
    }
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(root, "config");
    if (!cJSON_IsObject(config)) BAD("%s: key config: expected an object", path);
    mf->config = cJSON_PrintUnformatted(config);
    const cJSON *origin = cJSON_GetObjectItemCaseSensitive(root, "origin");
    if (origin && !cJSON_IsObject(origin)) BAD("%s: key origin: expected an object", path);
    if (origin) mf->origin = cJSON_PrintUnformatted(origin);
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(root, "schedule");
    if (sched && !cJSON_IsObject(sched)) BAD("%s: key schedule: expected an object", path);
    if (sched) mf->schedule = cJSON_PrintUnformatted(sched);
    cJSON_Delete(root);
    free(text);
    return mf;
fail:
    cJSON_Delete(root);
    free(text);
    ckpt_manifest_close(mf);
    return NULL;
}

int ckpt_manifest_verify(const CkptManifest *mf, int rank, int world, char *why, size_t n) {
    unsigned char *buf = NULL;
    for (int i = 0; i < mf->n_files; i++) {
        const MFile *F = &mf->files[i];
        char path[PATH_BUF + 80];
        snprintf(path, sizeof path, "%s/%s", mf->dir, F->name);
        struct stat sb;
        if (stat(path, &sb) != 0) { free(buf); return errf(why, n, "%s: missing (%s)", path, strerror(errno)); }
        if ((uint64_t)sb.st_size != F->bytes) {
            free(buf);
            return errf(why, n, "%s: %lld bytes, the manifest says %llu (truncated?)", path, (long long)sb.st_size, (unsigned long long)F->bytes);
        }
        if (i % world != rank) continue;
        int fd = open(path, O_RDONLY);
        if (fd < 0) { free(buf); return errf(why, n, "%s: cannot open (%s)", path, strerror(errno)); }
        if (!buf) buf = malloc_check(IO_CHUNK);
        CkptHash h;
        ckpt_hash_init(&h);
        for (;;) {
            ssize_t got = read(fd, buf, IO_CHUNK);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) { close(fd); free(buf); return errf(why, n, "%s: read failed (%s)", path, strerror(errno)); }
            if (got == 0) break;
            ckpt_hash_update(&h, buf, (size_t)got);
        }
        close(fd);
        uint64_t sum = ckpt_hash_final(&h);
        if (sum != F->checksum) {
            free(buf);
            return errf(why, n, "%s: checksum %016llx, the manifest says %016llx (corrupted)", path, (unsigned long long)sum,
                        (unsigned long long)F->checksum);
        }
    }
    free(buf);
    return 0;
}

const char *ckpt_manifest_config(const CkptManifest *mf) { return mf->config; }
const char *ckpt_manifest_origin(const CkptManifest *mf) { return mf->origin; }
const char *ckpt_manifest_schedule(const CkptManifest *mf) { return mf->schedule; }
int ckpt_manifest_sealed(const CkptManifest *mf) { return mf->sealed; }
const TrainState *ckpt_manifest_state(const CkptManifest *mf) { return &mf->st; }
CkptLayout ckpt_manifest_layout(const CkptManifest *mf) { return mf->layout; }

void ckpt_manifest_rank_file(const CkptManifest *mf, int r, uint64_t *bytes, uint64_t *checksum) {
    char name[64];
    snprintf(name, sizeof name, "rank_%05d.bin", r);
    *bytes = *checksum = 0;
    for (int i = 0; i < mf->n_files; i++)
        if (strcmp(mf->files[i].name, name) == 0) {
            *bytes = mf->files[i].bytes;
            *checksum = mf->files[i].checksum;
        }
}

static const MTensor *find_tensor(const CkptManifest *mf, const char *name, int kind) {
    for (int i = 0; i < mf->n_tensors; i++)
        if (mf->tensors[i].kind == kind && strcmp(mf->tensors[i].name, name) == 0) return &mf->tensors[i];
    return NULL;
}

static int cmp_slice_start(const void *a, const void *b) {
    const Slice *x = *(const Slice *const *)a, *y = *(const Slice *const *)b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int ckpt_manifest_check(const CkptManifest *mf, const Model *m, char *why, size_t n) {
    int wtp = mf->layout.tp, rc = 0;
    const ModelConfig *mc = &m->cfg;
    if (mc->n_kv_head % wtp || mc->n_head % wtp || mc->ffn_hidden % wtp || mc->vocab_size % wtp)
        return errf(why, n, "%s/manifest.json: key layout.tp: %d does not divide the model's n_head %d, n_kv_head %d, ffn_hidden %d "
                    "and vocab_size %d (damaged?)", mf->dir, wtp, mc->n_head, mc->n_kv_head, mc->ffn_hidden, mc->vocab_size);
    Model wl; /* the writer's TP layout: the local shape of each of its slices */
    model_layout(&wl, mc, 1, wtp, 0);
    int most = 1;
    for (int i = 0; i < mf->n_tensors; i++) most = mf->tensors[i].n_slices > most ? mf->tensors[i].n_slices : most;
    const Slice **order = malloc_check((size_t)most * sizeof *order);
    for (int k = 0; k < 3 && !rc; k++)
        for (int i = 0; i < m->n_specs && !rc; i++) {
            const ParamSpec *s = &m->specs[i], *ws = model_find(&wl, s->name);
            const MTensor *T = find_tensor(mf, s->name, k);
            if (!T || !ws) {
                rc = errf(why, n, "%s/manifest.json: no tensor %s (%s)", mf->dir, s->name, KIND_NAME[k]);
                break;
            }
            /* dims are at most 2^53 each (json_whole): a product past 2^64 is no model's */
            uint64_t g1 = T->ndim == 2 ? (uint64_t)T->shape[1] : 1, l1 = T->ndim == 2 ? (uint64_t)T->local_shape[1] : 1;
            bool big = (uint64_t)T->shape[0] > UINT64_MAX / g1 || (uint64_t)T->local_shape[0] > UINT64_MAX / l1;
            uint64_t gsz = big ? 0 : (uint64_t)T->shape[0] * g1, lsz = big ? 0 : (uint64_t)T->local_shape[0] * l1;
            if (big || T->ndim != s->ndim || gsz != model_global_numel(m, s) || lsz != ws->numel || T->tp_axis != ws->tp_axis) {
                rc = errf(why, n, "%s/manifest.json: tensor %s (%s): shape, local shape or tp_axis are not this model's with tp %d", mf->dir,
                          s->name, KIND_NAME[k], wtp);
                break;
            }
            /* each writer TP rank's slices tile its local tensor exactly */
            for (int r = 0; r < (ws->tp_axis < 0 ? 1 : wtp) && !rc; r++) {
                int cnt = 0;
                for (int j = 0; j < T->n_slices; j++)
                    if (T->slices[j].tp_rank == r) order[cnt++] = &T->slices[j];
                qsort(order, (size_t)cnt, sizeof *order, cmp_slice_start);
                size_t at = 0;
                for (int j = 0; j < cnt && !rc; j++) {
                    if (order[j]->start != at || order[j]->count == 0 || order[j]->count > ws->numel - at)
                        rc = errf(why, n, "%s/manifest.json: tensor %s (%s): the slices of TP rank %d leave a gap, overlap or run past its %zu elements "
                                  "at element %zu", mf->dir, s->name, KIND_NAME[k], r, ws->numel, at);
                    else at += order[j]->count;
                }
                if (!rc && at != ws->numel)
                    rc = errf(why, n, "%s/manifest.json: tensor %s (%s): the slices of TP rank %d cover %zu of its %zu elements", mf->dir, s->name,
                              KIND_NAME[k], r, at, ws->numel);
            }
        }
    free(order);
    model_free(&wl);
    return rc;
}

/* Read elements [a, b) of TP rank tr's local tensor T (numel elements) into
 * out[0, b - a); dies unless every element is covered. */
static void read_local(const CkptManifest *mf, const int *fds, const MTensor *T, int tr, size_t numel, size_t a, size_t b, float *out) {
    size_t covered = 0;
    for (int j = 0; j < T->n_slices; j++) {
        const Slice *S = &T->slices[j];
        if (S->tp_rank != tr) continue;
        if (S->start + S->count > numel)
            die(EXIT_USAGE, "%s/manifest.json: tensor %s (%s): slice beyond its %zu elements", mf->dir, T->name, KIND_NAME[T->kind], numel);
        size_t lo = S->start > a ? S->start : a, hi = S->start + S->count < b ? S->start + S->count : b;
        if (lo >= hi) continue;
        size_t want = (hi - lo) * sizeof(float), got = 0, off = S->byte_off + (lo - S->start) * sizeof(float);
        char *dst = (char *)(out + (lo - a));
        while (got < want) {
            ssize_t r = pread(fds[S->file], dst + got, want - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) die(EXIT_IO, "%s/%s: read failed at byte %zu (%s)", mf->dir, mf->files[S->file].name, off + got,
                            r < 0 ? strerror(errno) : "unexpected end of file");
            got += (size_t)r;
        }
        covered += hi - lo;
    }
    if (covered != b - a)
        die(EXIT_USAGE, "%s/manifest.json: tensor %s (%s): slices of TP rank %d cover %zu of elements [%zu, %zu)", mf->dir, T->name,
            KIND_NAME[T->kind], tr, covered, a, b);
}

/* The writer's layout must divide this model (else no writer's layout). */
static void check_writer_tp(const CkptManifest *mf, const Model *m) {
    int wtp = mf->layout.tp;
    const ModelConfig *mc = &m->cfg;
    if (mc->n_kv_head % wtp || mc->n_head % wtp || mc->ffn_hidden % wtp || mc->vocab_size % wtp)
        die(EXIT_USAGE, "%s/manifest.json: key layout.tp: %d does not divide the model's n_head %d, n_kv_head %d, ffn_hidden %d "
            "and vocab_size %d (damaged?)", mf->dir, wtp, mc->n_head, mc->n_kv_head, mc->ffn_hidden, mc->vocab_size);
}

static int *open_files(const CkptManifest *mf) {
    int *fds = malloc_check(((size_t)mf->n_files + 1) * sizeof(int));
    for (int i = 0; i < mf->n_files; i++) {
        char path[PATH_BUF + 80];
        snprintf(path, sizeof path, "%s/%s", mf->dir, mf->files[i].name);
        fds[i] = open(path, O_RDONLY);
        if (fds[i] < 0) die(EXIT_IO, "%s: cannot open (%s)", path, strerror(errno));
    }
    return fds;
}

static void close_files(const CkptManifest *mf, int *fds) {
    for (int i = 0; i < mf->n_files; i++) close(fds[i]);
    free(fds);
}

/* Elements [a, b) of tensor s (kind k) of m's layout into out, from the
 * writer's slices (wl: the writer's TP layout). */
static void load_part(const CkptManifest *mf, const int *fds, Model *wl, const Model *m, const ParamSpec *s, int k, size_t a, size_t b,
                      float *out) {
    const MTensor *T = find_tensor(mf, s->name, k);
    if (!T) die(EXIT_USAGE, "%s/manifest.json: no tensor %s (%s) (a checkpoint of a different model?)", mf->dir, s->name, KIND_NAME[k]);
    const ParamSpec *ws = model_find(wl, s->name);
    size_t gnum = model_global_numel(m, s);
    int64_t gsz = T->shape[0] * (T->ndim == 2 ? T->shape[1] : 1);
    if (!ws || T->ndim != s->ndim || (size_t)gsz != gnum || (size_t)(T->local_shape[0] * (T->ndim == 2 ? T->local_shape[1] : 1)) != ws->numel)
        die(EXIT_USAGE, "%s/manifest.json: tensor %s has %lld elements, this model expects %zu (a checkpoint of a different model?)",
            mf->dir, s->name, (long long)gsz, gnum);
    if (wl->tp.size == m->tp.size) { /* same TP split: read just the wanted elements of this rank's slices */
        read_local(mf, fds, T, s->tp_axis < 0 ? 0 : m->tp.rank, s->numel, a, b, out);
        return;
    }
    /* another TP split: assemble the global tensor from the writer's TP
     * ranks, cut this rank's slice, keep the wanted part (the global
     * tensor straight into out when it is all that is wanted) */
    int whole = m->tp.size == 1 && a == 0 && b == s->numel;
    float *global = whole ? out : malloc_check(gnum * sizeof(float)), *local = malloc_check(ws->numel * sizeof(float));
    for (int r = 0; r < (ws->tp_axis < 0 ? 1 : wl->tp.size); r++) {
        read_local(mf, fds, T, r, ws->numel, 0, ws->numel, local);
        wl->tp.rank = r;
        model_tp_copy(wl, ws, global, local, 1);
    }
    free(local);
    if (whole) return;
    float *mine = malloc_check(s->numel * sizeof(float));
    model_tp_copy(m, s, global, mine, 0);
    memcpy(out, mine + a, (b - a) * sizeof(float));
    free(global);
    free(mine);
}

void ckpt_manifest_load(const CkptManifest *mf, const Model *m, const size_t *lo, const size_t *hi, float *params, float *exp_avg,
                        float *exp_avg_sq) {
    float *dst[3] = {params, exp_avg, exp_avg_sq};
    size_t *base = malloc_check(((size_t)m->n_chunks + 1) * sizeof(size_t)); /* packed offset of each chunk's range */
    size_t pos = 0;
    for (int c = 0; c < m->n_chunks; c++) {
        if (lo[c] > hi[c] || lo[c] < m->chunk_offset[c] || hi[c] > m->chunk_offset[c] + m->chunk_size[c])
            die(EXIT_INTERNAL, "ckpt_manifest_load: range of chunk %d outside the chunk", c);
        base[c] = pos;
        pos += hi[c] - lo[c];
    }
    int *fds = open_files(mf);
    check_writer_tp(mf, m);
    Model wl; /* the writer's TP layout, to place its slices in the global tensor */
    model_layout(&wl, &m->cfg, 1, mf->layout.tp, 0);
    for (int k = 0; k < 3; k++) {
        if (!dst[k]) continue;
        for (int i = 0; i < m->n_specs; i++) {
            const ParamSpec *s = &m->specs[i];
            /* the part of this tensor inside the wanted range of its chunk */
            size_t a = s->offset > lo[s->chunk] ? s->offset : lo[s->chunk];
            size_t b = s->offset + s->numel < hi[s->chunk] ? s->offset + s->numel : hi[s->chunk];
            if (a >= b) continue;
            load_part(mf, fds, &wl, m, s, k, a - s->offset, b - s->offset, dst[k] + base[s->chunk] + (a - lo[s->chunk]));
        }
    }
    model_free(&wl);
    close_files(mf, fds);
    free(base);
}

struct CkptTensorReader {
    const CkptManifest *mf;
    const Model *m;
    Model wl;
    int *fds;
};

CkptTensorReader *ckpt_tensor_reader(const CkptManifest *mf, const Model *m) {
    CkptTensorReader *r = calloc_check(1, sizeof *r);
    r->mf = mf;
    r->m = m;
    r->fds = open_files(mf);
    check_writer_tp(mf, m);
    model_layout(&r->wl, &m->cfg, 1, mf->layout.tp, 0);
    return r;
}

void ckpt_tensor_read(CkptTensorReader *r, const ParamSpec *s, int kind, float *out) {
    load_part(r->mf, r->fds, &r->wl, r->m, s, kind, 0, s->numel, out);
}

void ckpt_tensor_reader_free(CkptTensorReader *r) {
    if (!r) return;
    model_free(&r->wl);
    close_files(r->mf, r->fds);
    free(r);
}

void ckpt_full_ranges(const Model *m, size_t *lo, size_t *hi) {
    for (int c = 0; c < m->n_chunks; c++) {
        lo[c] = m->chunk_offset[c];
        hi[c] = m->chunk_offset[c] + m->chunk_size[c];
    }
}
