/* ckpt_run.c — the checkpoint protocol across the ranks of a running job
 * (see ckpt_run.h; the format, the writer thread and loading: ckpt.c).
 *
 *   begin   (every rank, blocking) wait for the previous checkpoint, copy
 *           the slices this rank owns into the host staging buffer, hand
 *           them to the writer thread -> <dir>/step_N.tmp/rank_R.bin
 *   advance (every step, one small all-reduce) once every writer is done:
 *           exchange sizes and checksums; each node's first rank writes the
 *           manifest and renames step_N.tmp -> step_N; then the same files
 *           are copied to durable_dir and committed there the same way.
 * A failed local write (disk full) is retried straight into durable_dir;
 * a checkpoint that fails everywhere is dropped with a warning, and the
 * previous complete one stays the newest. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ckpt_run.h"
#include "moe.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int is_root(const CkptRun *r) { return r->dist->rank == 0; }
static int node_leader(const CkptRun *r) { return r->dist->local_rank == 0; }

static CkptLayout ck_layout(const CkptRun *r) {
    return (CkptLayout){r->dist->world, r->dist->tp, r->dist->shard_size, r->dist->replicate_size};
}

static void ck_range(const CkptRun *r, int c, size_t *lo, size_t *hi) {
    ckpt_owned_range(r->model, c, r->dist->shard_size, r->dist->shard_index, r->dist->replicate_size, r->dist->shard_group, lo, hi);
}


/* The checkpoint in flight's state: st, with its own copy of the n MoE
 * biases (NULL: none), which outlives the model's next update and st's
 * manifest. */
static void ck_snap(CkptRun *r, const TrainState *st, const float *bias, int n) {
    r->state = *st;
    r->state.moe_bias = NULL;
    r->state.moe_bias_n = 0;
    if (n <= 0) return;
    float *copy = malloc_check((size_t)n * sizeof(float));
    memcpy(copy, bias, (size_t)n * sizeof(float));
    free(r->moe_bias);
    r->moe_bias = copy;
    r->state.moe_bias = copy;
    r->state.moe_bias_n = n;
}
/* die()'s clean-up: a rank that fails mid-run (a bad token in a shard,
 * say) removes the step folder its checkpoint in flight was writing, so
 * that nothing half-written outlives the run (the next start would remove
 * it too). The writer thread may still hold a file there: unlinked, its
 * writes go nowhere. */
static CkptRun *g_run;
static void ck_remove_inflight(void) {
    CkptRun *r = g_run;
    if (!r || r->phase == CK_IDLE || !r->root[0]) return;
    char dir[1100];
    int w = snprintf(dir, sizeof dir, "%s/step_%08d.tmp", r->root, r->state.step);
    if (w <= 0 || (size_t)w >= sizeof dir) return;
    /* the writer makes the folder and its file when its job starts, maybe
     * after this: wait (at most 2 s) until it has written more, or ended */
    size_t p0 = 0, p = 0;
    int st = ckpt_writer_wait_for(r->w, 0, &p0);
    for (int i = 0; i < 200 && st == CKPT_BUSY; i++) {
        st = ckpt_writer_wait_for(r->w, 0.01, &p);
        if (p > p0) break;
    }
    ckpt_remove(dir);
}

void ckpt_run_setup(CkptRun *r, Sharding *sh, void (*event)(void *ctx, const char *line), void *event_ctx) {
    *r = (CkptRun){.sh = sh, .cfg = sh->cfg, .dist = sh->dist, .model = sh->model, .k = sh->k, .event = event, .event_ctx = event_ctx};
    if (node_leader(r)) { /* folders a run that died left half-written (or moved aside: put back) */
        ckpt_remove_partial(r->cfg->ckpt_dir);
        if (r->cfg->ckpt_durable_dir[0]) ckpt_remove_partial(r->cfg->ckpt_durable_dir);
    }
    dist_barrier(r->dist);
    g_run = r;
    die_set_cleanup(ck_remove_inflight);
    r->owned = ckpt_owned_floats(r->model, r->dist->shard_size, r->dist->shard_index, r->dist->replicate_size, r->dist->shard_group);
    r->w = ckpt_writer_new(3 * r->owned);
    r->bytes = calloc_check((size_t)r->dist->world, sizeof(uint64_t));
    r->sums = calloc_check((size_t)r->dist->world, sizeof(uint64_t));
    r->done_step = r->durable_step = -1;
    r->last = now_s();
}

void ckpt_run_free(CkptRun *r) {
    if (g_run == r) { /* nothing is in flight any more: no clean-up at a later die() */
        g_run = NULL;
        die_set_cleanup(NULL);
    }
    ckpt_writer_free(r->w);
    free(r->manifest);
    free(r->bytes);
    free(r->sums);
    free(r->moe_bias);
    r->moe_bias = NULL;
    r->w = NULL;
    r->manifest = NULL;
    r->bytes = r->sums = NULL;
}

static void ck_file(char *out, size_t n, const char *root, int step, int tmp, int rank) {
    char dir[1100];
    ckpt_step_dir(dir, sizeof dir, root, step, tmp);
    snprintf(out, n, "%s/rank_%05d.bin", dir, rank);
}

/* Start writing the staged state into root. */
static void ck_start_write(CkptRun *r, const char *root) {
    snprintf(r->root, sizeof r->root, "%s", root);
    if (!r->owned) return;
    char path[1200];
    ck_file(path, sizeof path, root, r->state.step, 1, r->dist->rank);
    if (dist_fault_ckpt_die(r->dist, r->state.step)) /* test hook: die halfway through the file */
        ckpt_writer_die_after(r->w, 3 * r->owned * sizeof(float) / 2);
    ckpt_writer_fault(r->w, dist_fault_ckpt_slow(r->dist, r->state.step), dist_fault_ckpt_hang(r->dist, r->state.step));
    ckpt_writer_write(r->w, path, 3 * r->owned);
}

static void ck_advance(CkptRun *r, int any_failed);

/* LLMTRAIN_FAULT kind=ckpt_rot: the local disk changes a written file */
static void flip_first_byte(const char *path) {
    int fd = open(path, O_RDWR);
    unsigned char b;
    if (fd >= 0 && pread(fd, &b, 1, 0) == 1) {
        b ^= 0xff;
        if (pwrite(fd, &b, 1, 0) != 1) warnf("ckpt_rot: cannot write %s", path);
    }
    if (fd >= 0) close(fd);
}

/* The durable phase of the checkpoint of `step`, complete in
 * checkpoint.dir: each rank copies its file to durable_dir's step .tmp
 * folder; ck_advance commits it with r->manifest once every copy is done. */
static void ck_start_copy(CkptRun *r, int step) {
    r->phase = CK_DURABLE;
    snprintf(r->root, sizeof r->root, "%s", r->cfg->ckpt_durable_dir);
    if (!r->owned) return;
    char src[1200], dst[1200];
    ck_file(src, sizeof src, r->cfg->ckpt_dir, step, 0, r->dist->rank);
    ck_file(dst, sizeof dst, r->root, step, 1, r->dist->rank);
    if (dist_fault_ckpt_rot(r->dist, step)) flip_first_byte(src); /* test hook */
    ckpt_writer_copy(r->w, src, dst);
}

/* One small all-reduce: checkpoint writers still busy / failed, a stop
 * signal on any rank, the every_minutes clock (rank 0 decides), writers
 * that made progress. Moves the checkpoint in flight on when every writer
 * is done. wait: first wait up to a second for this rank's writer; while
 * any writer makes progress, the watchdog's clock starts again at each
 * round (a slow disk is not a hang; a write that stops moving for
 * parallel.timeout_s still is). Returns the stop and time flags via *stop,
 * *due. */
void ckpt_control(CkptRun *r, int wait, int stop_here, int *stop, int *due) {
    double ctl[5] = {0, 0, 0, 0, 0};
    if (r->phase != CK_IDLE) {
        size_t prog = r->progress;
        int st = wait ? ckpt_writer_wait_for(r->w, 1.0, &prog) : ckpt_writer_state(r->w);
        ctl[0] = st == CKPT_BUSY;
        ctl[1] = st == CKPT_FAILED;
        ctl[4] = prog != r->progress;
        r->progress = prog;
    }
    ctl[2] = stop_here != 0;
    ctl[3] = is_root(r) && r->cfg->ckpt_every_minutes > 0 && now_s() - r->last >= 60.0 * r->cfg->ckpt_every_minutes;
    dist_allreduce(r->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, ctl, 5);
    if (wait && ctl[4] > 0) dist_phase(r->dist, r->dist->phase_step, r->dist->phase);
    if (stop) *stop = ctl[2] > 0;
    if (due) *due = ctl[3] > 0;
    if (r->phase != CK_IDLE && ctl[0] == 0) ck_advance(r, ctl[1] > 0);
}

/* Block until the checkpoint in flight is complete everywhere (or dropped). */
void ckpt_drain(CkptRun *r) {
    while (r->phase != CK_IDLE) ckpt_control(r, 1, 0, NULL, NULL);
}

/* The write or durable copy of `step` failed on some rank because its disk
 * (or quota) is full. Under checkpoint.keep_last K >= 2, what would go once
 * this one is complete goes now instead, and the write or copy starts again
 * (from the staging buffer, or the local file), once a phase, so a disk that
 * holds K checkpoints but not K + 1 keeps checkpointing: a folder of this
 * step already there (another lineage's, a damaged one resume passed over,
 * which the commit would replace), and all but the newest K - 1 complete
 * folders up to this run's newest good checkpoint in that root (the one it
 * completed or resumed from, which so always stays; folders between it and
 * this step, other lineages', neither count nor go; without one, up to
 * step - 1). Returns 1 when it started again. */
static int ck_make_room(CkptRun *r, int step) {
    if (r->room_tried || r->cfg->ckpt_keep_last < 2) return 0;
    r->room_tried = 1;
    char root[sizeof r->root];
    snprintf(root, sizeof root, "%s", r->root);
    int good = r->phase == CK_DURABLE || r->direct ? r->durable_step : r->done_step;
    double removed = 0;
    if (node_leader(r))
        removed = ckpt_remove_step(root, step) + ckpt_prune(root, r->cfg->ckpt_keep_last - 1, good >= 0 ? good : step - 1);
    dist_allreduce(r->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &removed, 1);
    if (removed == 0) return 0;
    if (is_root(r))
        fprintf(stderr, "llmtrain: checkpoint step %d: no space left in %s; removed its oldest complete checkpoint(s) now rather "
                        "than once this one is complete (checkpoint.keep_last %d), and %s step %d again\n",
                step, root, r->cfg->ckpt_keep_last, r->phase == CK_DURABLE ? "copying" : "writing", step);
    if (r->phase == CK_DURABLE) ck_start_copy(r, step);
    else ck_start_write(r, root);
    return 1;
}

/* Every writer is done with the phase in flight. */
static void ck_advance(CkptRun *r, int any_failed) {
    Dist *d = r->dist;
    int W = d->world, step = r->state.step;
    CkptJobResult res = ckpt_writer_take(r->w);
    if (res.state == CKPT_FAILED) fprintf(stderr, "llmtrain: rank %d: checkpoint step %d: %s\n", d->rank, step, res.error);
    /* sizes, checksums (as two exact 32-bit halves) and times of every rank */
    double *info = calloc_check((size_t)W * 4, sizeof(double));
    if (res.state == CKPT_DONE) {
        double *x = info + 4 * (size_t)d->rank;
        x[0] = (double)res.bytes;
        x[1] = (double)(res.checksum >> 32);
        x[2] = (double)(res.checksum & 0xffffffffu);
        x[3] = res.seconds;
    }
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, info, (size_t)W * 4);
    char tmp[1100], fin[1100], why[600] = "";
    ckpt_step_dir(tmp, sizeof tmp, r->root, step, 1);
    ckpt_step_dir(fin, sizeof fin, r->root, step, 0);
    uint64_t *bytes = calloc_check((size_t)W, sizeof(uint64_t)), *sums = calloc_check((size_t)W, sizeof(uint64_t));
    double total = 0, secs = 0;
    for (int i = 0; i < W; i++) {
        bytes[i] = (uint64_t)info[4 * i];
        sums[i] = ((uint64_t)info[4 * i + 1] << 32) | (uint64_t)info[4 * i + 2];
        total += info[4 * i];
        if (info[4 * i + 3] > secs) secs = info[4 * i + 3];
    }
    free(info);
    int failed = any_failed, commit_full = 0;
    if (!failed && r->phase == CK_DURABLE) {
        /* the copy read what the manifest says was written, or the local
         * file changed since (the durable folder would hold what resume
         * refuses, and keep_last would prune the good ones behind it) */
        for (int i = 0; i < W && !failed; i++) {
            if (bytes[i] == r->bytes[i] && sums[i] == r->sums[i]) continue;
            if (is_root(r))
                fprintf(stderr, "llmtrain: checkpoint step %d: rank_%05d.bin read %llu bytes with checksum %016llx for the durable copy; "
                                "the manifest says %llu bytes, %016llx (the local file changed after it was written)\n",
                        step, i, (unsigned long long)bytes[i], (unsigned long long)sums[i], (unsigned long long)r->bytes[i],
                        (unsigned long long)r->sums[i]);
            snprintf(why, sizeof why, "rank_%05d.bin changed after it was written; its durable copy is not committed", i);
            failed = 1;
        }
    }
    if (!failed) {
        if (r->phase == CK_LOCAL) {
            free(r->manifest);
            CkptLayout L = ck_layout(r);
            r->manifest = ckpt_manifest_text(r->model, &L, bytes, sums, r->cfg, &r->state);
            memcpy(r->bytes, bytes, (size_t)W * sizeof *bytes);
            memcpy(r->sums, sums, (size_t)W * sizeof *sums);
        }
        /* rank 0 commits first; then the first rank of every other node
         * commits its own copy where the folder is node-local (on a shared
         * filesystem rank 0's rename already took the folder away) */
        int cr = is_root(r) ? ckpt_commit(tmp, fin, r->root, r->manifest, why, sizeof why) : 0;
        dist_barrier(d);
        if (!is_root(r) && node_leader(r)) cr = ckpt_commit(tmp, fin, r->root, r->manifest, why, sizeof why);
        double bad = cr != 0;
        commit_full = cr == -ENOSPC || cr == -EDQUOT; /* the manifest found the disk (or its inodes, or quota) full */
        if (bad) fprintf(stderr, "llmtrain: rank %d: checkpoint step %d: %s\n", d->rank, step, why);
        dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &bad, 1);
        failed = bad > 0;
    }
    free(bytes);
    free(sums);
    int durable = r->cfg->ckpt_durable_dir[0] != 0;
    if (failed) {
        if (node_leader(r)) ckpt_remove(tmp);
        double full = commit_full || (res.state == CKPT_FAILED && (res.err == ENOSPC || res.err == EDQUOT));
        dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &full, 1);
        if (full > 0 && ck_make_room(r, step)) return;
        dist_barrier(d);
        if (r->phase == CK_LOCAL && durable && !r->direct) {
            if (is_root(r)) fprintf(stderr, "llmtrain: checkpoint step %d: local write failed; writing it to %s instead\n", step, r->cfg->ckpt_durable_dir);
            r->direct = 1;
            r->room_tried = 0;
            ck_start_write(r, r->cfg->ckpt_durable_dir); /* the staging buffer still holds the state */
            return;
        }
        char hint[1200] = "";
        if (full > 0 && r->cfg->ckpt_keep_last >= 2)
            snprintf(hint, sizeof hint, "; the disk of %s is full with the newest %d checkpoint%s kept: free space there, or lower "
                     "checkpoint.keep_last", r->root, r->cfg->ckpt_keep_last - 1, r->cfg->ckpt_keep_last > 2 ? "s" : "");
        else if (full > 0)
            snprintf(hint, sizeof hint, "; the disk of %s is full: free space there, or set checkpoint.keep_last to 2 or more (at "
                     "most the checkpoints it holds) so that the oldest makes room", r->root);
        if (is_root(r) && r->phase == CK_DURABLE)
            fprintf(stderr, "llmtrain: warning: checkpoint step %d: the copy to %s failed; the checkpoint is complete in %s only "
                            "(the next checkpoint is copied again)%s\n", step, r->cfg->ckpt_durable_dir, r->cfg->ckpt_dir, hint);
        else if (is_root(r))
            fprintf(stderr, "llmtrain: warning: checkpoint step %d dropped; the newest complete checkpoint is %s%s\n", step,
                    r->done_step >= 0 ? "still the previous one" : "none yet", hint);
        if (is_root(r) && r->event) { /* for whatever watches the run: a checkpoint it does not have */
            Buf line = {0};
            buf_add(&line, "{\"event\":\"checkpoint_failed\",\"step\":%d,\"durable\":%s,\"disk_full\":%s,\"error\":", step,
                    r->phase == CK_DURABLE || r->direct ? "true" : "false", full > 0 ? "true" : "false");
            buf_json_string(&line, res.state == CKPT_FAILED ? res.error : why[0] ? why : "failed on another rank (its stderr line says why)");
            buf_add(&line, "}\n");
            r->event(r->event_ctx, line.s);
            free(line.s);
        }
        r->phase = CK_IDLE;
        r->direct = 0;
        return;
    }
    if (node_leader(r)) ckpt_prune(r->root, r->cfg->ckpt_keep_last, step); /* only now that a newer one is complete */
    if (is_root(r)) {
        printf("checkpoint: %s complete | %.1f MB in %.2f s background (%.0f MB/s)%s\n", fin, total / 1e6, secs,
               secs > 0 ? total / 1e6 / secs : 0.0, r->phase == CK_DURABLE ? " [durable copy]" : "");
        fflush(stdout);
        if (r->event) {
            Buf line = {0};
            buf_add(&line, "{\"event\":\"checkpoint\",\"step\":%d,\"path\":", step);
            buf_json_string(&line, fin);
            buf_add(&line, ",\"bytes\":%.0f,\"write_s\":%.6f,\"durable\":%s}\n", total, secs,
                    r->phase == CK_DURABLE || r->direct ? "true" : "false");
            r->event(r->event_ctx, line.s);
            free(line.s);
        }
    }
    r->done_step = step;
    if (r->phase == CK_DURABLE || r->direct) r->durable_step = step;
    if (r->phase == CK_LOCAL && durable && !r->direct) {
        r->room_tried = 0;
        ck_start_copy(r, step);
        return;
    }
    r->phase = CK_IDLE;
    r->direct = 0;
}

double ckpt_begin(CkptRun *r, const TrainState *st) {
    double t0 = now_s();
    ckpt_drain(r);
    float *stage = ckpt_writer_staging(r->w);
    size_t pos = 0;
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < r->model->n_chunks; c++) {
            size_t lo, hi;
            ck_range(r, c, &lo, &hi);
            r->k->to_host(stage + pos, shard_state_ptr(r->sh, k, c, lo), (hi - lo) * sizeof(float));
            pos += hi - lo;
        }
    ck_snap(r, st, r->model->moe.bias_rate > 0 ? r->model->moe.bias : NULL,
            r->model->moe.bias_rate > 0 ? r->model->cfg.n_layer * r->model->moe.E : 0);
    r->phase = CK_LOCAL;
    r->direct = 0;
    r->room_tried = 0;
    r->began = r->last = t0;
    ck_start_write(r, r->cfg->ckpt_dir);
    if (!r->cfg->ckpt_async) ckpt_drain(r);
    return now_s() - t0;
}

#define MAX_CANDIDATES 256

/* Resumed from the local checkpoint of step S (path) while durable_dir has
 * no complete step S: the run that wrote it died during its durable copy,
 * or the copy failed. Make that copy again, in the background as any
 * durable phase (ckpt_control advances it; the step's final check waits for
 * it when S is the last step), when the layout is the one that wrote it
 * (rank r copies rank r's file); another layout's ranks own other files,
 * and the next checkpoint is the first copied. */
static void ck_recopy(CkptRun *r, const TrainState *st, const CkptManifest *mf, const char *path) {
    const Config *c = r->cfg;
    Dist *d = r->dist;
    const int S = ckpt_manifest_state(mf)->step;
    char local[1100], dur[1100], found[1100];
    if (!c->ckpt_durable_dir[0]) return;
    ckpt_step_dir(local, sizeof local, c->ckpt_dir, S, 0);
    ckpt_step_dir(dur, sizeof dur, c->ckpt_durable_dir, S, 0);
    /* rank 0 decides for all (ranks see the same folders) */
    double need = is_root(r) && strcmp(path, local) == 0 && ckpt_resolve(dur, found, sizeof found) != 0;
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &need, 1);
    if (need == 0) return;
    CkptLayout L = ckpt_manifest_layout(mf), now = ck_layout(r);
    if (L.world != now.world || L.tp != now.tp || L.shard != now.shard || L.replicate != now.replicate) {
        if (is_root(r))
            fprintf(stderr, "llmtrain: warning: %s has no complete copy of step %d and this layout cannot make it "
                            "(written by %d rank%s, now %d); the next checkpoint is copied there\n", c->ckpt_durable_dir, S, L.world,
                    L.world == 1 ? "" : "s", d->world);
        return;
    }
    char man[1200];
    snprintf(man, sizeof man, "%s/manifest.json", local);
    size_t len;
    char *text = read_text_file(man, &len);
    double bad = text == NULL;
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &bad, 1);
    if (bad > 0) { /* verified a moment ago: gone since */
        free(text);
        if (is_root(r)) fprintf(stderr, "llmtrain: warning: %s: cannot read again; step %d is not copied to %s\n", man, S, c->ckpt_durable_dir);
        return;
    }
    free(r->manifest);
    r->manifest = text;
    for (int i = 0; i < d->world; i++) ckpt_manifest_rank_file(mf, i, &r->bytes[i], &r->sums[i]);
    ck_snap(r, st, st->moe_bias, st->moe_bias_n);
    r->state.step = S;
    r->direct = 0;
    r->recopy = 1;
    r->began = now_s();
    if (is_root(r)) printf("resume: %s has no complete step %d; copying it there again\n", c->ckpt_durable_dir, S);
    ck_start_copy(r, S);
}

/* The checkpoint folders, before anything is loaded, trained or removed
 * there: each node's first rank makes each folder and creates and removes
 * a file in it (an unwritable one is exit 3 now, not a run whose every
 * checkpoint is dropped), and rank 0 locks each for the job's life (a
 * second job on the same folder would resume the first's checkpoints,
 * overwrite its steps and remove its checkpoint in flight). A folder
 * another job holds is waited for up to checkpoint.lock_wait_s (a stopping
 * job writing its last checkpoint lets go within it), then exit 2 naming
 * the holder. Every rank ends with the first failing rank's line. */
#define CLAIM_HELD (-1) /* rank 0's code while the folder it waits for is held */
#define CLAIM_LINE 2048

void ckpt_claim_dirs(const Config *c, Dist *d) {
    const char *dirs[2] = {c->ckpt_dir, c->ckpt_durable_dir}, *keys[2] = {"checkpoint.dir", "checkpoint.durable_dir"};
    char line[CLAIM_LINE] = "", why[900], host[64], owner[600], when[32];
    int code = 0, locked[2] = {!dirs[0][0] || d->rank != 0, !dirs[1][0] || d->rank != 0};
    host_name(host, sizeof host);
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(owner, sizeof owner, "llmtrain pid %d on host %.60s, job %.400s, since %s", (int)getpid(), host, c->path, when);
    for (int i = 0; i < 2 && !code; i++) {
        int e = dirs[i][0] && d->local_rank == 0 ? ckpt_dir_probe(dirs[i], d->rank, why, sizeof why) : 0;
        if (e == -ENOSPC || e == -EDQUOT) /* writable; a full disk makes room as it checkpoints */
            fprintf(stderr, "llmtrain: warning: %s: %s (host %s); checkpoints will make room or be dropped\n", keys[i], why, host);
        else if (e) {
            code = EXIT_IO;
            snprintf(line, sizeof line, "%s: %s (host %.60s); expected a folder this job can write, checked before step 1", keys[i], why, host);
        }
    }
    struct stat s0, s1;
    if (!code && d->rank == 0 && dirs[1][0] && stat(dirs[0], &s0) == 0 && stat(dirs[1], &s1) == 0 && s0.st_dev == s1.st_dev &&
        s0.st_ino == s1.st_ino) {
        code = EXIT_USAGE;
        snprintf(line, sizeof line, "checkpoint.durable_dir %.900s is the folder checkpoint.dir %.900s names; expected another folder "
                 "(the durable copy goes elsewhere), or none", dirs[1], dirs[0]);
    }
    int *codes = malloc_check((size_t)d->world * sizeof *codes);
    double began = now_s(), said = 0;
    for (;;) {
        for (int i = 0; i < 2 && code <= 0; i++) {
            if (locked[i]) continue;
            int fd, rc = ckpt_dir_lock(dirs[i], owner, &fd, why, sizeof why);
            code = 0;
            if (rc == CKPT_LOCKED) {
                locked[i] = 1;
            } else if (rc == CKPT_LOCK_HELD) {
                code = CLAIM_HELD;
                snprintf(line, sizeof line, "%s: %s; two jobs on one folder overwrite each other's checkpoints (stop that job, or give this "
                         "one another %s)", keys[i], why, keys[i]);
            } else if (rc == CKPT_LOCK_UNSUPPORTED) {
                locked[i] = 1;
                fprintf(stderr, "llmtrain: warning: %s: %s; this job cannot tell whether another uses the folder: make sure none does\n",
                        keys[i], why);
            } else {
                code = EXIT_IO;
                snprintf(line, sizeof line, "%s: %s", keys[i], why);
            }
        }
        double waited = now_s() - began;
        if (code == CLAIM_HELD && waited >= c->ckpt_lock_wait_s) code = EXIT_USAGE;
        dist_allgather(d, DIST_GROUP_WORLD, DIST_BYTE, &code, codes, sizeof code);
        int first = -1, held = 0;
        for (int r = 0; r < d->world; r++) {
            if (codes[r] == CLAIM_HELD) held = 1;
            else if (codes[r] && first < 0) first = r;
        }
        if (first >= 0) { /* that rank's line, to every rank (an all-reduce of its bytes) */
            double *bytes = calloc_check(CLAIM_LINE, sizeof *bytes);
            for (int i = 0; d->rank == first && i < CLAIM_LINE; i++) bytes[i] = (unsigned char)line[i];
            dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, bytes, CLAIM_LINE);
            for (int i = 0; i < CLAIM_LINE; i++) line[i] = (char)(unsigned char)bytes[i];
            line[CLAIM_LINE - 1] = '\0';
            free(bytes);
            die_replicated(d->rank != first);
            die(codes[first], "%s", line);
        }
        if (!held) break;
        if (d->rank == 0 && !said) {
            fprintf(stderr, "llmtrain: %s; waiting up to %.0f s (checkpoint.lock_wait_s) for it to end\n", line, c->ckpt_lock_wait_s);
            said = 1;
        }
        struct timespec ts = {0, 250 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(codes);
}

/* checkpoint.resume: find the newest checkpoint every rank can read and
 * whose checksums hold (skipping the others with a warning), load it into
 * this layout and continue from its step. Returns 1 when resumed. */
int ckpt_resume(CkptRun *r, TrainState *out) {
    const Config *c = r->cfg;
    Dist *d = r->dist;
    if (strcmp(c->ckpt_resume, "none") == 0) return 0;
    int explicit = strcmp(c->ckpt_resume, "auto") != 0;
    size_t PN = 1100;
    char *cand = calloc_check((size_t)MAX_CANDIDATES * 2, PN);
    int nc = 0;
    if (is_root(r)) {
        if (explicit) {
            char one[1100];
            if (ckpt_resolve(c->ckpt_resume, one, sizeof one) == 0) snprintf(cand, PN, "%s", one);
            else snprintf(cand, PN, "%s", c->ckpt_resume); /* let the checks below name what is wrong */
            nc = 1;
        } else { /* newest first; at equal steps the local copy first */
            int nl = ckpt_list(c->ckpt_dir, cand, PN, MAX_CANDIDATES);
            int nd = c->ckpt_durable_dir[0] ? ckpt_list(c->ckpt_durable_dir, cand + (size_t)nl * PN, PN, MAX_CANDIDATES) : 0;
            nc = nl + nd;
            for (int i = 1; i < nc; i++) /* stable insertion sort by step, descending */
                for (int j = i; j > 0; j--) {
                    const char *a = strrchr(cand + (size_t)(j - 1) * PN, '_'), *b = strrchr(cand + (size_t)j * PN, '_');
                    if (atol(a + 1) >= atol(b + 1)) break;
                    char tmp[1100];
                    memcpy(tmp, cand + (size_t)(j - 1) * PN, PN);
                    memcpy(cand + (size_t)(j - 1) * PN, cand + (size_t)j * PN, PN);
                    memcpy(cand + (size_t)j * PN, tmp, PN);
                }
        }
    }
    CkptManifest *mf = NULL;
    char path[1100], why[1400] = "", skipped[2600] = "";
    int n_skipped = 0;
    for (int i = 0;; i++) {
        memset(path, 0, sizeof path);
        why[0] = '\0';
        if (is_root(r) && i < nc) snprintf(path, sizeof path, "%s", cand + (size_t)i * PN);
        dist_bcast(d, DIST_GROUP_WORLD, path, sizeof path);
        if (!path[0]) break;
        mf = ckpt_manifest_open(path, why, sizeof why);
        if (mf && ckpt_manifest_verify(mf, d->rank, d->world, why, sizeof why) != 0) { ckpt_manifest_close(mf); mf = NULL; }
        if (mf) {
            Config old;
            config_load_string(&old, ckpt_manifest_config(mf), path);
            char diff[200];
            if (config_model_diff(&old.model, &c->model, diff, sizeof diff)) /* a user error, not damage: never skipped */
                die(EXIT_USAGE, "checkpoint.resume: %s was written for another model (checkpoint vs job: %s); use checkpoint.resume=none or another checkpoint.dir",
                    path, diff);
            config_free(&old);
        }
        /* the same model: what the load will read must all be there */
        if (mf && ckpt_manifest_check(mf, r->model, why, sizeof why) != 0) { ckpt_manifest_close(mf); mf = NULL; }
        double bad = mf == NULL;
        if (bad) {
            if (explicit) die(EXIT_USAGE, "checkpoint.resume: %s", why);
            fprintf(stderr, "llmtrain: rank %d: warning: skipping checkpoint %s: %s\n", d->rank, path, why);
        }
        dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &bad, 1);
        if (bad == 0) break;
        ckpt_manifest_close(mf);
        mf = NULL;
        if (is_root(r) && !skipped[0]) snprintf(skipped, sizeof skipped, "%s: %s", path, why[0] ? why : "another rank could not verify it");
        n_skipped++;
    }
    free(cand);
    if (!mf && n_skipped > 0) {
        /* every checkpoint there is damaged: starting over would train past
         * them silently; that is the user's call, not the launcher's */
        dist_bcast(d, DIST_GROUP_WORLD, skipped, sizeof skipped);
        die_replicated(!is_root(r));
        die(EXIT_USAGE, "checkpoint.resume: every checkpoint in %s%s%s failed verification (%d; newest %s); to train from step 0 anyway "
            "set checkpoint.resume=none (or move the folders away)", c->ckpt_dir, c->ckpt_durable_dir[0] ? " and " : "",
            c->ckpt_durable_dir, n_skipped, skipped);
    }
    if (!mf) {
        if (is_root(r)) printf("resume: no complete checkpoint in %s%s%s; starting at step 0\n", c->ckpt_dir,
                               c->ckpt_durable_dir[0] ? " or " : "", c->ckpt_durable_dir);
        return 0;
    }
    /* the schedule it was trained with (a manifest from before it was
     * recorded: the job config it stored); every rank has the same job and
     * manifest, so one line */
    const char *sched = ckpt_manifest_schedule(mf);
    char first[400], all[sizeof r->sched_change];
    if (config_schedule_diff(sched ? sched : ckpt_manifest_config(mf), c, path, first, sizeof first, all, sizeof all)) {
        if (!c->override_schedule) {
            die_replicated(!is_root(r));
            die(EXIT_USAGE, "checkpoint.resume: %s was trained with another schedule, %s; set optim.override_schedule=true to "
                "take this job's from step %d on, or give the key the checkpoint's value", path, first, ckpt_manifest_state(mf)->step);
        }
        snprintf(r->sched_change, sizeof r->sched_change, "%s", all);
    }
    if (is_root(r) && !ckpt_manifest_sealed(mf))
        fprintf(stderr, "llmtrain: warning: %s/manifest.json is format llmtrain-checkpoint/2, written before manifests carried "
                        "their own checksum: its text is read unverified (the next checkpoint is format /3)\n", path);
    /* read only what this rank owns: its shard of every chunk, or all of it */
    Model *m = r->model;
    size_t *lo = malloc_check((size_t)m->n_chunks * sizeof(size_t)), *hi = malloc_check((size_t)m->n_chunks * sizeof(size_t));
    ckpt_full_ranges(m, lo, hi);
    if (r->sh->sharded)
        for (int ch = 0; ch < m->n_chunks; ch++) {
            lo[ch] += (size_t)d->shard_index * shard_len(r->sh, ch);
            hi[ch] = lo[ch] + shard_len(r->sh, ch);
        }
    size_t n = r->sh->sharded ? r->sh->n_shard : m->n_params;
    float *p = calloc_check(n, sizeof(float)), *mm = calloc_check(n, sizeof(float)), *vv = calloc_check(n, sizeof(float));
    ckpt_manifest_load(mf, m, lo, hi, p, mm, vv);
    shard_install_state(r->sh, p, mm, vv);
    free(lo);
    free(hi);
    free(p);
    free(mm);
    free(vv);
    const TrainState *st = ckpt_manifest_state(mf);
    CkptLayout L = ckpt_manifest_layout(mf);
    moe_bias_install(m, st->moe_bias, st->moe_bias_n, path);
    *out = *st;
    out->moe_bias = NULL; /* the manifest's, closed below; the model holds them now */
    out->moe_bias_n = 0;
    r->done_step = st->step;
    if (is_root(r)) {
        printf("resume: %s at step %d (written by %d rank%s: tp %d x shard %d x replicate %d; now %d: tp %d x shard %d x replicate %d)\n",
               path, st->step, L.world, L.world == 1 ? "" : "s", L.tp, L.shard, L.replicate, d->world, d->tp, d->shard_size, d->replicate_size);
        fflush(stdout);
    }
    if (!explicit) ck_recopy(r, out, mf, path);
    ckpt_manifest_close(mf);
    return 1;
}
