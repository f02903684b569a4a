/* ckpt.h — training checkpoints: one folder per step holding one
 * file per writing rank and a manifest, written in the background, verified
 * and loaded into any parallel layout of the same model.
 *
 *   <root>/step_%08d/rank_%05d.bin   raw fp32: this rank's slices of the
 *                                    master weights, then exp_avg, then exp_avg_sq
 *   <root>/step_%08d/manifest.json   every tensor, its global shape and which
 *                                    file / byte range holds which slice; a
 *                                    checksum per file; step, data cursor, RNG,
 *                                    LR and batch schedule, config and the
 *                                    layout it was written with;
 *                                    last, a checksum of its own text
 *
 * A folder is written as step_%08d.tmp and renamed only after the manifest
 * (written last, after every rank reported success) is durable. Nothing here
 * calls MPI: ckpt_run.c drives the protocol across ranks. */
#ifndef LLMTRAIN_CKPT_H
#define LLMTRAIN_CKPT_H
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "model.h"

#define CKPT_SPIKE_WINDOW 20

/* Everything besides tensors that an exact resume needs. */
typedef struct TrainState {
    int step;                   /* optimizer steps completed */
    uint64_t seq_cursor;        /* global sequence index of the next step's first sequence */
    uint64_t rng;               /* the sampling RNG's key at this step (written for the format; samples are keyed by init.seed and the step) */
    int nonfinite_total;        /* skipped steps so far */
    /* gradient-norm spike tracker (running mean over CKPT_SPIKE_WINDOW steps) */
    double norm_hist[CKPT_SPIKE_WINDOW];
    int norm_n;                 /* norms seen (window holds min(norm_n, WINDOW)) */
    int spike_len;              /* steps the current spike has lasted (0: none) */
    int spikes;                 /* spikes that have ended */
    /* aux-loss-free balancing's biases (moe.c), n_layer x moe_experts of
     * them (0: none saved): a view, of the checkpoint in flight's copy
     * (ckpt_run.c) or of a read manifest's */
    const float *moe_bias;
    int moe_bias_n;
} TrainState;

/* The parallel layout a checkpoint was written with. World = tp x shard x
 * replicate; rank r has tp_rank r % tp, shard index (r / tp) % shard and
 * replica index r / (tp * shard). */
typedef struct CkptLayout {
    int world, tp, shard, replicate;
} CkptLayout;

/* The local flat-array range [lo, hi) (of the rank's TP slice of the model)
 * that the rank with shard index si (of S) and replica index ri (of R)
 * writes, for chunk c: the chunk's shard [off + si*len, +len), len =
 * chunk_size / S, split R ways so replicas share the writing. */
void ckpt_owned_range(const Model *m, int c, int S, int si, int R, int ri, size_t *lo, size_t *hi);
/* Floats one rank writes per state kind (sum over chunks). */
size_t ckpt_owned_floats(const Model *m, int S, int si, int R, int ri);

/* ---- background writer (one per rank) ----
 * ckpt_begin (ckpt_run.c) fills the staging buffer (3 x owned floats: params, exp_avg,
 * exp_avg_sq), then asks for a write; the thread writes, fsyncs and
 * checksums. A copy job copies a finished file (durable_dir). */
typedef struct CkptWriter CkptWriter;
enum { CKPT_IDLE = 0, CKPT_BUSY = 1, CKPT_DONE = 2, CKPT_FAILED = 3 };
CkptWriter *ckpt_writer_new(size_t staging_floats);
void ckpt_writer_free(CkptWriter *w);
float *ckpt_writer_staging(CkptWriter *w);
/* Start writing staging[0, floats) to path (its folder is created). */
void ckpt_writer_write(CkptWriter *w, const char *path, size_t floats);
/* Start copying src to dst (its folder is created), checksumming the copy. */
void ckpt_writer_copy(CkptWriter *w, const char *src, const char *dst);
int ckpt_writer_state(CkptWriter *w);
/* Test hook (LLMTRAIN_FAULT kind=ckpt_die): the next write job kills the
 * process with SIGKILL after `bytes` of its file are written (0: off). */
void ckpt_writer_die_after(CkptWriter *w, size_t bytes);
/* Test hooks (LLMTRAIN_FAULT kind=ckpt_slow, ckpt_hang) for the next job:
 * slow: written 4 KiB at a time, 20 ms apart; hang: never returns. */
void ckpt_writer_fault(CkptWriter *w, int slow, int hang);
/* Block until the job ends; returns CKPT_DONE or CKPT_FAILED (or CKPT_IDLE). */
int ckpt_writer_wait(CkptWriter *w);
/* The same for at most `seconds` (then CKPT_BUSY); *progress: the bytes
 * every job so far has written (growing while a job makes progress). */
int ckpt_writer_wait_for(CkptWriter *w, double seconds, size_t *progress);
/* After CKPT_DONE: bytes, checksum and seconds of the last job; after
 * CKPT_FAILED: the reason (one line). Resets the state to CKPT_IDLE. */
typedef struct CkptJobResult {
    int state;
    int err; /* CKPT_FAILED: errno of the call that failed (ENOSPC, EDQUOT: the disk is full) */
    uint64_t bytes, checksum;
    double seconds;
    char error[512];
} CkptJobResult;
CkptJobResult ckpt_writer_take(CkptWriter *w);

/* Streaming 64-bit checksum of the file bytes (the manifest's "mix64"). */
typedef struct CkptHash { uint64_t h, len; unsigned char tail[8]; int ntail; } CkptHash;
void ckpt_hash_init(CkptHash *h);
void ckpt_hash_update(CkptHash *h, const void *p, size_t n);
uint64_t ckpt_hash_final(CkptHash *h);

/* ---- manifest and commit ---- */
/* The manifest JSON text (malloc'd). m: any TP rank's local model (the
 * layout of TP ranks differs only in which global slice they hold);
 * bytes/checksums: per world rank (0 bytes: that rank wrote nothing). */
char *ckpt_manifest_text(const Model *m, const CkptLayout *L, const uint64_t *bytes, const uint64_t *checksums,
                         const Config *cfg, const TrainState *st);
/* Write manifest.json into tmp_dir durably, then rename tmp_dir to
 * final_dir and sync root. Tolerates another node having committed the same
 * folder already. Returns 0, or -errno of the call that failed (-ENOSPC,
 * -EDQUOT: the disk is full) with a reason in why. */
int ckpt_commit(const char *tmp_dir, const char *final_dir, const char *root, const char *manifest, char *why, size_t n);
/* <root>/step_%08d (.tmp when tmp). */
void ckpt_step_dir(char *out, size_t n, const char *root, int step, int tmp);
/* Remove every step_*.tmp and step_*.old folder under root (left by a run
 * that died), except a complete step_N.old whose step_N is missing (the run
 * died inside ckpt_commit's replacement of step N): that one is renamed
 * back to step_N. */
void ckpt_remove_partial(const char *root);
/* keep_last: of the complete step folders up to step `newest` (the one just
 * completed), remove all but the newest keep_last (0 = keep all). Folders
 * past `newest` are another lineage's (a newer checkpoint resume rejected as
 * damaged, or one an explicit checkpoint.resume went back past, or a
 * node-local copy that could not verify): they neither count nor go, and a
 * checkpoint of their step replaces them. Only called after `newest` is
 * complete. Returns how many were removed. */
int ckpt_prune(const char *root, int keep_last, long newest);
/* Remove root's folder of `step` (complete or not); 1 when there was one. */
int ckpt_remove_step(const char *root, long step);
/* Remove a folder tree (a failed .tmp). */
void ckpt_remove(const char *dir);

/* ---- the folder: writable, and one job's ---- */
/* Make root (and its parents) and create and remove a probe file in it
 * (named by host, rank and pid):
 * 0, or -errno with a reason in why (EROFS, EACCES, ENOTDIR, ENOSPC...). */
int ckpt_dir_probe(const char *root, int rank, char *why, size_t n);
/* Lock root/.llmtrain.lock for the rest of this process's life (flock,
 * else a POSIX record lock; the descriptor stays open) and write owner into
 * it. Another job holding it: CKPT_LOCK_HELD, why naming the holder as its
 * owner text says. No lock to be had on this file system (or no room for
 * the lock file on a full disk): CKPT_LOCK_UNSUPPORTED. A lock of a process that died holds nothing (the kernel
 * drops it), so a stale lock file never blocks a restart. */
#define CKPT_LOCK_NAME ".llmtrain.lock"
enum { CKPT_LOCKED = 0, CKPT_LOCK_HELD = 1, CKPT_LOCK_UNSUPPORTED = 2, CKPT_LOCK_FAILED = 3 };
int ckpt_dir_lock(const char *root, const char *owner, int *fd, char *why, size_t n);

/* ---- reading ---- */
typedef struct CkptManifest CkptManifest;
/* Complete step folders (a manifest.json, not .tmp) of root, newest first:
 * fills up to max paths of PATH_MAX-ish length n each; returns the count. */
int ckpt_list(const char *root, char *paths, size_t n, int max);
/* Parse <dir>/manifest.json; NULL with a reason in why when it is missing,
 * truncated or malformed. */
CkptManifest *ckpt_manifest_open(const char *dir, char *why, size_t n);
void ckpt_manifest_close(CkptManifest *mf);
/* Every file present with its recorded size; the checksum of the files
 * i with i % world == rank recomputed (ranks split the reading). 0 or -1. */
int ckpt_manifest_verify(const CkptManifest *mf, int rank, int world, char *why, size_t n);
/* Everything ckpt_manifest_load will read, checked without reading it:
 * every tensor of m (any TP rank's local model) present in each of the
 * three kinds with this model's shapes under the writer's tp, and each of
 * the writer's TP ranks' slices tiling its local tensor exactly (no gap,
 * no overlap, nothing past its end). 0, or -1 with a reason in why. */
int ckpt_manifest_check(const CkptManifest *mf, const Model *m, char *why, size_t n);
/* 1 when the manifest is format /3 and its own checksum held; 0 for a
 * format /2 manifest, read unverified (its files' checksums still hold). */
int ckpt_manifest_sealed(const CkptManifest *mf);
const char *ckpt_manifest_config(const CkptManifest *mf); /* config JSON text */
/* The run's origin record (init.h: token ids, tokenizer files; JSON text),
 * NULL for a checkpoint written before manifests carried one. */
const char *ckpt_manifest_origin(const CkptManifest *mf);
/* The LR and batch schedule it was trained with (config_schedule_json's
 * text); NULL from a manifest written before manifests recorded it. */
const char *ckpt_manifest_schedule(const CkptManifest *mf);
const TrainState *ckpt_manifest_state(const CkptManifest *mf);
CkptLayout ckpt_manifest_layout(const CkptManifest *mf);
/* The size and checksum the manifest records for rank r's file
 * (rank_%05d.bin); 0 and 0 when rank r wrote none. */
void ckpt_manifest_rank_file(const CkptManifest *mf, int r, uint64_t *bytes, uint64_t *checksum);
/* Fill host arrays with the state of m's layout (its tp and tp_rank; any
 * padding) from a checkpoint written with any layout of the same model,
 * reading only the local flat ranges [lo[c], hi[c]) of each chunk c (a
 * rank's shard), packed in chunk order into params / exp_avg / exp_avg_sq
 * (NULL = skip that kind). A tensor missing or of another shape: one line,
 * exit(EXIT_USAGE). */
void ckpt_manifest_load(const CkptManifest *mf, const Model *m, const size_t *lo, const size_t *hi, float *params, float *exp_avg,
                        float *exp_avg_sq);
/* The same a tensor at a time, with memory of about that tensor (and one
 * of the writer's TP slices of it where the TP split differs): every
 * tensor s of m's layout (this TP rank's slice) whole into out (s->numel
 * floats), kind 0 params, 1 exp_avg, 2 exp_avg_sq. The reader keeps the
 * rank files open until freed. */
typedef struct CkptTensorReader CkptTensorReader;
CkptTensorReader *ckpt_tensor_reader(const CkptManifest *mf, const Model *m);
void ckpt_tensor_read(CkptTensorReader *r, const ParamSpec *s, int kind, float *out);
void ckpt_tensor_reader_free(CkptTensorReader *r);
/* Ranges covering every chunk whole (packed = the flat layout itself). */
void ckpt_full_ranges(const Model *m, size_t *lo, size_t *hi);
/* A step folder, or a root (its newest complete step). 0, or -1 when none. */
int ckpt_resolve(const char *path, char *out_dir, size_t out_len);

#endif
