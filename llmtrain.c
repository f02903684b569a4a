/* llmtrain.c — main: the command line, setup, the train loop, one step,
 * evaluation and sampling; the export and check commands (the step's logs
 * are steplog.c's).
 *
 * One training step, top to bottom (train_step below):
 *   gradients start at zero (grads_fresh); for each micro-batch: forward, backward (accumulating)
 *   -> sum gradients over data-parallel ranks (NO_SHARD: all-reduce; sharded
 *   strategies: the chunk hooks all-gather each layer chunk before its
 *   forward/backward and reduce-scatter its gradients into the local shard
 *   after its backward; all-reduce over replicas) -> global norm -> clip
 *   -> AdamW at the scheduled LR -> log.
 * Everything numeric is in model.c/kernels; everything collective in parallel.c;
 * the sharding runtime in shard.c; the job's layout checks and memory plan in
 * layout.c; the checkpoint protocol and resume in ckpt_run.c. train() below
 * is setup, then one call a policy each step (loop_step), then finish. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ckpt.h"
#include "ckpt_run.h"
#include "export.h"
#include "hf.h"
#include "init.h"
#include "config.h"
#include "cp.h"
#include "data.h"
#ifdef LLMTRAIN_CUDA
#include "dist_nccl.h"
#endif
#include "kernels.h"
#include "fit.h"
#include "layout.h"
#include "model.h"
#include "moe.h"
#include "parallel.h"
#include "profile.h"
#include "shard.h"
#include "steplog.h"
#include "tboard.h"
#include "trainer.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LLMTRAIN_VERSION "0.1.0"

static volatile sig_atomic_t g_stop_signal; /* SIGTERM / SIGUSR1 / SIGINT / SIGHUP: checkpoint and stop */
static volatile sig_atomic_t g_sigints;     /* Ctrl-Cs so far */
static void on_stop_signal(int sig) {
    if (sig == SIGINT && g_sigints++ > 0) { /* Ctrl-C twice: end now, as without the handler */
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
    }
    g_stop_signal = sig;
}

/* The stop signals answered with a checkpoint. SIGINT and SIGHUP keep a
 * disposition the job was started with ignored (nohup; a script's
 * background job), as a program that ends on them would. */
static void catch_stop_signals(void) {
    signal(SIGTERM, on_stop_signal);
    signal(SIGUSR1, on_stop_signal);
    const int ask[2] = {SIGINT, SIGHUP};
    for (int i = 0; i < 2; i++) {
        struct sigaction old;
        if (sigaction(ask[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) signal(ask[i], on_stop_signal);
    }
}

static void ck_event(void *ctx, const char *line) { metrics_line(ctx, line); }

/* A log write failed on rank 0, agreed by all (a collective of the whole
 * world, once a step): every rank stops at the same step. */
static int logs_failed_agreed(Trainer *t) {
    double f = t->log_errno != 0;
    dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &f, 1);
    return f > 0;
}

/* ------------------------------------------------------------------ */
/* data                                                                */

/* Context parallelism with documents: each local token's document start
 * (t->doc0: the position after the last end-of-document token before it
 * in its sequence, 0 if none). A document may start on another rank's
 * chunk, and a rank reads its own two chunks only: for each sequence and
 * chunk c the position after c's last end-of-document token (0: none) is
 * filled in by c's owner and shared in one float64 sum over the context
 * group ([B x 2 cp] entries, each from one rank: exact); a chunk's scan
 * starts from the largest entry of the chunks before it. A collective:
 * every rank of the context group loads the same batches in the same
 * order (training's micro-batches, step_targets' second reading, eval;
 * debug.dump, which loads on rank 0 alone, is refused under cp). */
/* Whether local token i ends its document: the index's ends, or eod_token. */
static int doc_end_at(const Trainer *t, size_t i) {
    return t->ends ? t->ends[i] : t->tok[i] == t->cfg.eod_token;
}

static void cp_doc_starts(Trainer *t) {
    int B = t->model.B, T = t->model.T, cp = t->model.cp.size, r = t->model.cp.rank, C = 2 * cp, Tc = T / 2;
    double *end = t->doc_end;
    memset(end, 0, (size_t)B * C * sizeof *end);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            size_t at = (size_t)b * T + (size_t)h * Tc;
            int c = h ? C - 1 - r : r;
            for (int i = Tc - 1; i >= 0; i--)
                if (doc_end_at(t, at + (size_t)i)) { end[(size_t)b * C + c] = c * Tc + i + 1; break; }
        }
    dist_allreduce(&t->dist, DIST_GROUP_CP, DIST_F64, DIST_SUM, end, (size_t)B * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            size_t at = (size_t)b * T + (size_t)h * Tc;
            int c = h ? C - 1 - r : r, s = 0;
            for (int k = 0; k < c; k++)
                if (end[(size_t)b * C + k] > s) s = (int)end[(size_t)b * C + k];
            for (int i = 0; i < Tc; i++) {
                t->doc0[at + (size_t)i] = s;
                if (doc_end_at(t, at + (size_t)i)) s = c * Tc + i + 1;
            }
        }
}

/* Fill the host batch with micro-batch j of this rank for step `step`:
 * step k reads the G_k global sequences from the data cursor c_k on, where
 * c_k counts the sequences the run consumed before it (from the resumed
 * checkpoint's cursor on, so a changed global batch continues the data)
 * and G_k is train.global_batch, or the ramp's batch at c_k; rank r owns
 * c_k + [r*G_k/dp, (r+1)*G_k/dp). Under context parallelism a rank reads
 * its two chunks of each sequence only (documents: cp_doc_starts). */
static void load_batch(Trainer *t, const DataSet *ds, uint64_t first_seq) {
    int B = t->model.B, T = t->model.T, cp = t->model.cp.size;
    if (cp == 1)
        for (int b = 0; b < B; b++) {
            dataset_sequence(ds, first_seq + (uint64_t)b, t->tok + (size_t)b * T, t->tgt + (size_t)b * T);
            if (t->ends) dataset_sequence_ends(ds, first_seq + (uint64_t)b, 0, T, t->ends + (size_t)b * T);
        }
    else { /* context parallelism: this rank's two chunks of T/2 tokens */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < 2; h++) {
                int off = cp_pos(h * T / 2, T, cp, t->model.cp.rank);
                size_t at = (size_t)b * T + (size_t)h * T / 2;
                dataset_sequence_part(ds, first_seq + (uint64_t)b, off, T / 2, t->tok + at, t->tgt + at);
                if (t->ends) dataset_sequence_ends(ds, first_seq + (uint64_t)b, off, T / 2, t->ends + at);
            }
    }
    int docs = t->model.block_causal || t->model.reset_pos; /* the model's documents */
    t->model.doc_ends = docs ? t->ends : NULL; /* cleared again by the sampling forwards */
    if (cp > 1 && docs && (t->model.eod_token >= 0 || t->ends)) cp_doc_starts(t);
    if (t->cfg.eod_mask_loss) /* what follows a document's end is not predicted */
        for (size_t i = 0; i < (size_t)B * T; i++)
            if (doc_end_at(t, i)) t->tgt[i] = CE_NO_TARGET;
}

/* c_k: steps only move forward, so the walk from the resume point is done
 * once (config_cursor_at; a jump back starts it again). */
uint64_t step_cursor(Trainer *t, int step) {
    if (step < t->plan_step || t->plan_step < t->step_base) {
        t->plan_step = t->step_base;
        t->plan_cursor = t->seq_base;
    }
    t->plan_cursor = config_cursor_at(&t->cfg, t->plan_step, t->plan_cursor, step);
    t->plan_step = step;
    return t->plan_cursor;
}

/* G_k */
static int step_batch(Trainer *t, int step) { return config_batch_at(&t->cfg, step_cursor(t, step)); }

static uint64_t micro_first_seq(Trainer *t, int step, int j) {
    uint64_t G = (uint64_t)step_batch(t, step);
    uint64_t dp = (uint64_t)dist_seq_dp(&t->dist); /* a context group's ranks read the same sequences */
    return step_cursor(t, step) + (uint64_t)dist_seq_rank(&t->dist) * (G / dp) + (uint64_t)j * (uint64_t)t->model.B;
}

/* How many targets of step `step`'s whole global batch have a loss: all
 * batch x seq_len of them, or under train.eod_mask_loss those not
 * CE_NO_TARGET, counted over this rank's micro-batches (read here once
 * more) and summed over the data-parallel ranks (a TP group's ranks read
 * the same batches). The step's loss is their mean, so a batch's split into
 * micro-batches and ranks does not change it (Megatron's per-token loss). */
static double step_targets(Trainer *t, int step, int batch, int accum) {
    const Config *c = &t->cfg;
    if (!c->eod_mask_loss) return (double)batch * c->seq_len;
    double n = 0;
    size_t N = (size_t)t->model.B * t->model.T;
    dist_phase(&t->dist, step + 1, "forward"); /* the sum is the step's first collective */
    for (int j = 0; j < accum; j++) {
        load_batch(t, &t->train, micro_first_seq(t, step, j));
        for (size_t i = 0; i < N; i++) n += t->tgt[i] != CE_NO_TARGET;
    }
    dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &n, 1);
    return n / t->dist.tp;
}

/* ------------------------------------------------------------------ */
/* evaluation and sampling                                             */

/* Forwards no backward follows (eval, sample); sharded, the chunk hook
 * gathers each chunk for its forward only (on = 0: every chunk is freed). */
static void forward_only(Trainer *t, int on) {
    t->model.forward_only = on;
    t->sh.fwd_only = t->sh.sharded && on;
    for (int c = 0; t->sh.sharded && !on && c < t->model.n_chunks; c++)
        if (t->sh.pslot[c] >= 0) die(EXIT_INTERNAL, "sharded eval: chunk %d still gathered after the forwards", c);
}

/* A stop request (SIGTERM, SIGUSR1) on any rank, agreed by all: a
 * collective of the whole world. */
static int stop_agreed(Trainer *t) {
    double f = g_stop_signal != 0;
    dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &f, 1);
    return f > 0;
}

/* The mean validation loss over eval.batches micro-batches of ds; NaN, with
 * t->eval_stopped set, when a stop request comes before the last of them:
 * a long evaluation (a large model, many batches) must not hold up the
 * checkpoint a preemption's grace period is for. */
/* Whether every rank runs every forward of an evaluation or a sample: the
 * chunk gathers (sharded) and the experts' all-to-alls (expert parallel)
 * are collectives. */
static int all_forward(const Trainer *t) { return t->sh.sharded || t->dist.ep > 1; }

static double eval_loss(Trainer *t, const DataSet *ds) {
    double sum[2] = {0, 0};
    /* the same eval.batches micro-batches whatever the layout: dp rank r takes
     * r, r+dp, ... Every rank goes round as many times, for the stop check
     * (a collective); sharded, every rank also runs as many forwards (the
     * chunk gathers are collectives of the shard group): a rank whose
     * batches ran out runs batch 0 again and does not count it. 64-bit: an
     * eval.batches near 2^31 must not wrap the count to nothing. */
    int64_t dp = dist_seq_dp(&t->dist), n = ((int64_t)t->cfg.eval_batches + dp - 1) / dp; /* a context group: one batch */
    forward_only(t, 1);
    for (int64_t i = 0, j = dist_seq_rank(&t->dist); i < n; i++, j += dp) {
        if (stop_agreed(t)) {
            t->eval_stopped = 1;
            break;
        }
        int counted = j < t->cfg.eval_batches;
        if (!counted && !all_forward(t)) continue;
        load_batch(t, ds, counted ? (uint64_t)j * (uint64_t)t->model.B : 0);
        model_forward(&t->model, t->tok, t->tgt);
        if (counted) { sum[0] += t->model.loss_sum; sum[1] += (double)t->model.n_targets; }
    }
    forward_only(t, 0);
    if (t->eval_stopped) return NAN; /* every rank broke at the same batch */
    dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, sum, 2); /* a TP group's ranks count the same targets */
    return sum[1] > 0 ? sum[0] / sum[1] : NAN;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The next token from a row of logits: argmax at temperature 0, else a
 * draw from softmax(row / temperature). */
static int pick_token(Trainer *t, const float *row, int V) {
    float temp = t->cfg.sample_temperature;
    int next = 0;
    if (temp <= 0) {
        for (int v = 1; v < V; v++) if (row[v] > row[next]) next = v;
        return next;
    }
    float mx = row[0];
    for (int v = 1; v < V; v++) if (row[v] > mx) mx = row[v];
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((row[v] - mx) / temp);
    double u = (xorshift(&t->sample_rng) >> 11) * 0x1.0p-53 * z, acc = 0;
    for (next = 0; next < V - 1; next++) {
        acc += exp((row[next] - mx) / temp);
        if (acc >= u) break;
    }
    return next;
}

/* The sampling RNG's start for the sample after `step`: keyed by init.seed
 * and the step alone (splitmix64), so a resumed run draws what the
 * uninterrupted one drew wherever its checkpoints fell (a state carried
 * from sample to sample would need the checkpoint taken after the sample,
 * and the checkpoint goes first). Odd, so never xorshift's fixed point 0. */
static uint64_t sample_key(uint64_t seed, int step) {
    return splitmix64(splitmix64(seed ^ 0x73616D706C65ull) + (uint64_t)step) | 1;
}

/* Context parallelism: the sampling forward over the window of len
 * tokens, the context group together (the ring, as training's), padded
 * to 2 cp chunks of ceil(len / 2cp) tokens (under the causal mask the
 * padding after the last token changes nothing before it); the local row
 * of the window's last token on the context rank that holds it (its
 * logits computed), -1 on the others. */
static int cp_sample_forward(Trainer *t, const int *win, int len, int *start) {
    Model *m = &t->model;
    int cp = m->cp.size, r = m->cp.rank, ch = (len + 2 * cp - 1) / (2 * cp), Tl = 2 * ch, q = (len - 1) / ch;
    for (int p = 0, s = 0; p < len; p++) { /* documents, as the model finds them in a window */
        start[p] = s;
        if (win[p] == m->eod_token) s = p + 1;
    }
    for (int i = 0; i < Tl; i++) {
        int p = cp_pos(i, Tl, cp, r);
        t->tok[i] = p < len ? win[p] : win[len - 1];
        if (t->doc0) t->doc0[i] = p < len ? start[p] : start[len - 1];
    }
    int row = q < cp ? (len - 1) % ch : ch + (len - 1) % ch, mine = (q < cp ? q : 2 * cp - 1 - q) == r;
    m->logits_end = mine ? row + 1 : 0;
    model_forward_bt(m, t->tok, NULL, 1, Tl);
    m->logits_end = 0;
    return mine ? row - m->logits_row0 : -1;
}

/* Generate sample_tokens tokens after a short prompt taken from the data,
 * and print them (rank 0). Uses B = 1 forwards over the growing context
 * (the last seq_len tokens of it).
 * Tensor parallel: the TP group of data-parallel rank 0 runs the forwards;
 * rank 0 gathers the last row's vocabulary slices, picks, and shares it.
 * Context parallel: the context group of data-parallel slot 0 runs them
 * over the whole context (cp_sample_forward); the row comes to rank 0 in
 * a sum over the group (the others' zeros), the choice goes back in one.
 * Sharded: every rank runs the same forwards (the chunk gathers are
 * collectives of the shard group) and rank 0 shares its choice with all. */
static void print_sample(Trainer *t, int step) {
    const Config *c = &t->cfg;
    t->sample_rng = sample_key((uint64_t)c->seed, step);
    Model *m = &t->model;
    /* dp0: data-parallel slot 0 (its context group, under cp); T: seq_len */
    int cp = m->cp.size, T = m->T * cp, V = m->cfg.vocab_size, tp = t->dist.tp, dp0 = dist_seq_rank(&t->dist) == 0;
    int tp0 = t->dist.tp_rank == 0;
    if (c->sample_tokens <= 0 || (!dp0 && !all_forward(t))) return;
    m->doc_ends = NULL; /* the generated text is one document (an index knows none of it) */
    const DataSet *ds = t->have_val ? &t->val : &t->train;
    int prompt = T < 16 ? (T > 1 ? T / 2 : 1) : 8;
    int total = prompt + c->sample_tokens;
    int *ctx = malloc_check((size_t)total * sizeof(int));
    dataset_sequence_part(ds, 0, 0, prompt, ctx, t->tgt); /* the prompt: sequence 0's first tokens */
    float *row = malloc_check((size_t)V * sizeof(float));
    float *mine = tp > 1 ? malloc_check((size_t)m->V * sizeof(float)) : NULL; /* this rank's vocabulary slice */
    double *sum = cp > 1 ? malloc_check((size_t)V * sizeof(double)) : NULL;
    int *start = cp > 1 ? malloc_check((size_t)T * sizeof(int)) : NULL;
    forward_only(t, 1);
    for (int n = prompt; n < total; n++) {
        int len = n < T ? n : T, last;
        if (cp > 1) {
            last = cp_sample_forward(t, ctx + (n - len), len, start);
        } else {
            model_forward_bt(m, ctx + (n - len), NULL, 1, len);
            last = len - 1 - m->logits_row0;
        }
        if (tp > 1 && dp0 && last >= 0) { /* the TP group holding the row */
            model_logits_to_host(m, last, 1, mine);
            dist_gather(&t->dist, DIST_GROUP_TP, DIST_F32, mine, tp0 ? row : NULL, (size_t)m->V);
        } else if (tp == 1 && dp0 && last >= 0) {
            model_logits_to_host(m, last, 1, row);
        }
        if (cp > 1 && dp0 && tp0) { /* the row to context rank 0 */
            for (int v = 0; v < V; v++) sum[v] = last >= 0 ? row[v] : 0.0;
            dist_allreduce(&t->dist, DIST_GROUP_CP, DIST_F64, DIST_SUM, sum, (size_t)V);
            for (int v = 0; v < V; v++) row[v] = (float)sum[v];
        }
        /* the choice, and whether rank 0 was asked to stop (the sample then
         * ends here; the caller agrees on the stop with every rank) */
        double f[2] = {is_root(t) ? (double)pick_token(t, row, V) : 0, is_root(t) && g_stop_signal != 0};
        if (all_forward(t)) { /* shared: only rank 0 contributes (host memory: float64 sums) */
            dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, f, 2);
        } else {
            if (cp > 1 && tp0) dist_allreduce(&t->dist, DIST_GROUP_CP, DIST_F64, DIST_SUM, f, 2);
            dist_allreduce(&t->dist, DIST_GROUP_TP, DIST_F64, DIST_SUM, f, 2);
        }
        ctx[n] = (int)f[0];
        if (f[1] > 0) {
            total = n + 1;
            break;
        }
    }
    forward_only(t, 0);
    if (is_root(t)) {
        printf("--- sample%s ---\n", total < prompt + c->sample_tokens ? " (cut short: stop requested)" : "");
        if (t->have_vocab) { /* the text whole, then escaped: a character may span tokens */
            char *text = NULL;
            size_t len = 0;
            FILE *m = open_memstream(&text, &len);
            if (!m) die(EXIT_IO, "out of memory for the sample's text");
            for (int n = 0; n < total; n++) vocab_print(&t->vocab, ctx[n], m);
            fclose(m);
            fwrite_printable(text, len, stdout);
            free(text);
        } else {
            for (int n = 0; n < total; n++) printf("%s%d ", n == prompt ? "| " : "", ctx[n]);
        }
        printf("\n--------------\n");
        fflush(stdout);
    }
    free(mine);
    free(sum);
    free(start);
    free(ctx);
    free(row);
}

/* ------------------------------------------------------------------ */
/* debug dump (tests compare it against PyTorch)                       */

static void dump_flat(Trainer *t, const float *flat, const char *sub) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", t->cfg.debug_dump, sub);
    t->k->to_host(t->host_flat, flat, t->model.n_params * sizeof(float));
    char why[300];
    if (!export_refusal(&t->model, why, sizeof why)) {
        hf_export(&t->model, t->host_flat, dir);
        return;
    }
    /* a model no Hugging Face architecture holds: its tensors under llmtrain's names */
    if (mkdir_p_durable(dir) != 0) die(EXIT_IO, "%s: cannot create directory (%s)", dir, strerror(errno));
    StWriter w = {0};
    for (int i = 0; i < t->model.n_specs; i++) {
        const ParamSpec *s = &t->model.specs[i];
        int64_t shape[2] = {s->shape[0], s->shape[1]};
        st_writer_add(&w, s->name, s->ndim, shape, t->host_flat + s->offset);
    }
    char path[1300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_writer_write(&w, path, NULL);
    st_writer_free(&w);
}

static void dump_logits(Trainer *t, double loss) {
    Model *m = &t->model;
    size_t n = (size_t)m->B * m->T * m->cfg.vocab_size;
    float *logits = malloc_check(n * sizeof(float));
    load_batch(t, &t->train, micro_first_seq(t, 0, 0));
    model_forward(m, t->tok, NULL);
    model_logits_to_host(m, 0, m->B * m->T, logits);
    float lossf = (float)loss;
    StWriter w = {0};
    int64_t shape[3] = {m->B, m->T, m->cfg.vocab_size}, one = 1;
    st_writer_add(&w, "logits", 3, shape, logits);
    st_writer_add(&w, "loss", 1, &one, &lossf);
    char path[1200];
    snprintf(path, sizeof path, "%s/logits.safetensors", t->cfg.debug_dump);
    st_writer_write(&w, path, NULL);
    st_writer_free(&w);
    free(logits);
}

/* ------------------------------------------------------------------ */
/* one step                                                            */

/* The step's MoE statistics over every rank: a micro-batch's balance
 * losses and loads are held alike by its tp and cp ranks (counted as
 * often in the forwards), its choices counted by each of its tp ranks
 * (which all route every row). Under aux-loss-free balancing the step's
 * per-expert counts follow, for moe_bias_update (their sign is what
 * counts: the tp copies do not change it). */
static void moe_step_stats(Trainer *t, StepStats *s) {
    const ModelMoE *x = &t->model.moe;
    int L = t->model.cfg.n_layer;
    size_t nc = x->bias_rate > 0 ? (size_t)L * x->E : 0, n = 5 + (size_t)L + nc;
    double *v = t->moe_red;
    if (!v) v = t->moe_red = malloc_check(n * sizeof(double));
    v[0] = x->aux_sum; v[1] = x->z_sum; v[2] = (double)x->forwards; v[3] = (double)x->dropped; v[4] = (double)x->routed;
    for (int l = 0; l < L; l++) v[5 + l] = x->load[l];
    if (nc) memcpy(v + 5 + L, x->step_counts, nc * sizeof(double));
    dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, v, n);
    double f = v[2] > 0 ? v[2] : 1.0;
    s->moe_aux = v[0] / f;
    s->moe_z = v[1] / f;
    s->moe_dropped = v[3] / t->dist.tp;
    s->moe_routed = v[4] / t->dist.tp;
    s->moe_layer_load = v + 5;
    s->moe_load = 0.0;
    for (int l = 0; l < L; l++) {
        v[5 + l] /= f;
        s->moe_load += v[5 + l] / x->n_layers;
    }
}

static StepStats train_step(Trainer *t, int step) {
    Config *c = &t->cfg;
    Model *m = &t->model;
    const Kernels *k = t->k;
    StepStats s = {.step = step, .batch = step_batch(t, step), .val_loss = NAN};
    int accum = s.batch / (c->micro_batch * dist_seq_dp(&t->dist)); /* layout_check: a whole number at every batch */
    t->sh.step_accum = accum;
    t->sh.chunks_done = 0;
    double t0 = now_s();
    dist_comm_reset(&t->dist);
    /* debug dump: sharded, every rank takes part in gathering the weights */
    int dump = c->debug_dump[0] && step == 0 && (is_root(t) || t->sh.sharded);
    if (dump && t->sh.sharded) shard_gather_params(&t->sh);
    if (dump && is_root(t)) dump_flat(t, m->params, "params0");
    if (dump) shard_free_full_params(&t->sh);

    /* the gradients start at zero: on CUDA the first product into each
     * weight's stores it (no zeroing pass, no read of zeros) */
    if (!t->sh.sharded) k->grads_fresh(m->grads, m->n_params);
    double loss_sum = 0, n_targets = step_targets(t, step, s.batch, accum);
    /* (no target in the batch: no loss, zero gradients, a NaN loss: skipped) */
    float loss_scale = n_targets > 0 ? 1.0f / (float)n_targets : 1.0f;
    m->loss_scale = loss_scale; /* the forwards leave the head's gradients for the backward (crossentropy_fused) */
    /* sharded: the chunk hooks gather each chunk before its forward and
     * backward and reduce-scatter its gradients right after its backward */
    t->sh.in_step = 1;
    /* the last AdamW updated the backend's weight copies too: the first
     * forward need not declare the weights again */
    const int kept = t->sh.weights_kept;
    t->sh.weights_kept = 0;
    moe_stats_reset(m);
    m->moe.aux_scale = 1.0f / (float)(accum * dist_seq_dp(&t->dist)); /* the balance losses: a mean over micro-batches */
    for (int j = 0; j < accum; j++) {
        t->sh.micro = j;
        dist_phase(&t->dist, step + 1, "forward");
        load_batch(t, &t->train, micro_first_seq(t, step, j));
        m->same_weights = j > 0 || kept; /* the optimizer runs after the last micro-batch */
        model_forward(m, t->tok, t->tgt);
        loss_sum += m->loss_sum;
        dist_phase(&t->dist, step + 1, "backward");
        model_backward(m, loss_scale);
        if (t->sh.sharded && j + 1 < accum) shard_rs_finish_all(&t->sh); /* the next micro-batch adds into gshard again */
    }
    t->sh.in_step = 0;
    for (int ch = 0; t->sh.sharded && ch < m->n_chunks; ch++)
        if (t->sh.pslot[ch] >= 0 || (t->sh.gslot[ch] >= 0 && !t->sh.rs_state[ch]))
            die(EXIT_INTERNAL, "sharded step: chunk %d still gathered after the backward", ch);
    /* gradients of the mean loss: each rank holds its share, the sum is the mean */
    double red[2] = {loss_sum, 0};
    if (t->sh.sharded) {
        /* the reduce-scatters still in flight (the lowest two chunks', three
         * with tied embeddings, whose chunk 0 backward hook runs with the
         * final chunk's), whose replicate all-reduces start as each is
         * waited for */
        dist_phase(&t->dist, step + 1, "reduce_scatter");
        shard_rs_finish_all(&t->sh);
        shard_ar_wait_all(&t->sh, step);
        /* each chunk's norm sum was queued when its shard was final;
         * replicas hold identical shards: summed over the shard group only */
        double sq = shard_sumsq_slots_take(&t->sh);
        dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, red, 1);
        red[1] = sq;
    } else {
        /* every chunk's all-reduce began after its backward (shard.c's gradient hook),
         * and its gradient norm's sum was queued when its gradients were final */
        shard_ar_wait_all(&t->sh, step);
        red[1] = shard_sumsq_slots_take(&t->sh);
        dist_allreduce(&t->dist, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, red, 1);
    }
    /* every TP rank of a data-parallel slot holds the same loss */
    s.loss = red[0] / t->dist.tp / n_targets;
    if (m->moe.on) moe_step_stats(t, &s);
    s.norm = sqrt(red[1]);
    s.lr = (float)config_lr_at(c, step);
    if (dump) {
        if (t->sh.sharded) shard_gather_params(&t->sh);
        if (is_root(t)) dump_logits(t, s.loss);
        shard_free_full_params(&t->sh);
        if (t->sh.sharded) { /* the summed gradient, gathered from the shards */
            float *g = k->alloc(m->n_params * sizeof(float));
            for (int ch = 0; ch < m->n_chunks; ch++)
                dist_allgather(&t->dist, DIST_GROUP_SHARD, DIST_F32, t->sh.gshard + t->sh.shard_off[ch], g + m->chunk_offset[ch], shard_len(&t->sh, ch));
            if (is_root(t)) dump_flat(t, g, "grads");
            k->free(g);
        } else {
            dump_flat(t, m->grads, "grads");
        }
    }

    double psq = 0.0;
    int have_psq = 0;
    if (!isfinite(s.loss) || !isfinite(s.norm)) {
        s.skipped = 1;
        t->nonfinite_run++;
        t->st.nonfinite_total++;
    } else {
        t->nonfinite_run = 0;
        float scale = 1.0f;
        if (c->grad_clip > 0 && s.norm > c->grad_clip) {
            scale = (float)(c->grad_clip / (s.norm + 1e-6));
            s.clipped = 1;
        }
        dist_phase(&t->dist, step + 1, "optimizer");
        shard_adamw_step(&t->sh, (float)s.lr, scale, step, c->log_param_norm ? &psq : NULL);
        if (m->moe.bias_rate > 0) moe_bias_update(m, t->moe_red + 5 + m->cfg.n_layer); /* moe_step_stats' counts */
        have_psq = c->log_param_norm;
    }
    shard_refresh_working(&t->sh, step + 1);
    /* the master weights after the update (sharded: the master shard; the
     * fp32 params without a master copy): summed by AdamW as it wrote them,
     * or (a skipped step) read again */
    s.pnorm = NAN;
    if (c->log_param_norm) {
        dist_phase(&t->dist, step + 1, "param_norm");
        s.pnorm = sqrt(have_psq ? shard_model_sumsq_ranks(&t->sh, psq) : shard_model_sumsq(&t->sh, t->sh.master ? t->sh.master : m->params));
    }
    s.comm_ag = t->dist.bytes_allgather;
    s.comm_rs = t->dist.bytes_reduce_scatter;
    s.comm_ar = t->dist.bytes_allreduce;
    s.comm_tp = t->dist.bytes_tp_allreduce;
    s.comm_tp_ag = t->dist.bytes_tp_allgather;
    s.comm_tp_rs = t->dist.bytes_tp_reduce_scatter;
    s.comm_cp = t->dist.bytes_cp;
    s.comm_ep = t->dist.bytes_ep;
    s.comm_wait = t->dist.comm_wait_s;
    s.dt = now_s() - t0;
    return s;
}

/* ------------------------------------------------------------------ */
/* setup                                                               */

/* Rank 0: the profile table after its window (every rank takes part);
 * profile.json is a log file as the others: exit 3 after this step's
 * checkpoint when it cannot be written. */
static void print_profile(Trainer *t) {
    char path[2048];
    snprintf(path, sizeof path, "%s/profile.json", t->cfg.log_dir);
    if (profile_window_report(&t->prof, &t->dist, path, t->peak_gflops, t->peak_gbs) != 0) log_failed(t, path, errno);
}

/* MFU peak: log.peak_gflops, else the GPU's bf16 dense peak, else the
 * measured CPU sgemm rate. */
static double select_peak(Trainer *t, const char **source) {
    if (t->cfg.peak_gflops > 0) { *source = "log.peak_gflops"; return t->cfg.peak_gflops; }
#ifdef LLMTRAIN_CUDA
    if (backend_is_cuda(t)) return kernels_cuda_peak_gflops(source);
#endif
    *source = "measured sgemm";
    t->peak_recheck = 1;
    return kernels_cpu_sgemm_peak_gflops(0);
}

/* The memory-bound entries' peak in the profile: log.peak_gbs, else the
 * GPU's memory bandwidth; on the CPU none (a share of a guess would
 * mislead). */
static double select_peak_gbs(Trainer *t) {
    if (t->cfg.peak_gbs > 0) return t->cfg.peak_gbs;
#ifdef LLMTRAIN_CUDA
    if (backend_is_cuda(t)) return kernels_cuda_peak_gbs();
#endif
    return 0;
}

/* A resumed run appends (a resume event line marks where; steps after the
 * checkpoint that the failed attempt logged stay, and are logged again). */
/* log.dir/config.json: every key's value this start runs with
 * (config_resolved_json), written whole under a temporary name and
 * renamed, so it is the last start's or the one before, never half. */
static void write_resolved_config(Trainer *t) {
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/config.json", t->cfg.log_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char *text = config_resolved_json(&t->cfg);
    FILE *f = fopen(tmp, "w");
    int bad = !f || fputs(text, f) < 0;
    if (f) bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) die(EXIT_IO, "%s: cannot write (%s)", path, strerror(errno));
    free(text);
}

static void open_metrics(Trainer *t, int resumed) {
    if (!is_root(t)) return;
    if (mkdir_p(t->cfg.log_dir) != 0) die(EXIT_IO, "log.dir: cannot create %s (%s)", t->cfg.log_dir, strerror(errno));
    char *path = t->metrics_path;
    snprintf(path, sizeof t->metrics_path, "%s/metrics.jsonl", t->cfg.log_dir);
    t->metrics = fopen(path, resumed ? "a" : "w");
    if (!t->metrics) die(EXIT_IO, "%s: cannot open for writing (%s)", path, strerror(errno));
    t->metrics_good = log_end(t->metrics);
    write_resolved_config(t);
    if (resumed) {
        char line[96];
        snprintf(line, sizeof line, "{\"event\":\"resume\",\"step\":%d,\"world\":%d}\n", t->step_base, t->dist.world);
        metrics_line(t, line);
    }
    /* TensorBoard: a new file each start (it merges a folder's files by step) */
    if (t->cfg.tensorboard_dir[0] && tb_open(&t->tb, t->cfg.tensorboard_dir) != 0) {
        if (t->tb.err) die(EXIT_IO, "log.tensorboard_dir: %s: write failed (%s)", t->tb.path, strerror(t->tb.err));
        die(EXIT_IO, "log.tensorboard_dir: cannot create %s (%s)", t->tb.path[0] ? t->tb.path : t->cfg.tensorboard_dir,
            strerror(errno));
    }
}

/* The sequences a run of train.steps reads: from the resume point's cursor
 * (0 at a fresh start) on, under a ramp-up step by step. */
static uint64_t run_sequences(const Trainer *t) {
    return config_cursor_at(&t->cfg, t->step_base, t->seq_base, t->cfg.steps > t->step_base ? t->cfg.steps : t->step_base);
}

/* 704 -> "704", 12800 -> "12.8k", 2.5e9 -> "2.5B" (4 significant digits) */
static void fmt_count(char *buf, size_t n, double x) {
    static const char unit[] = " kMBT";
    int u = 0;
    while (x >= 1e3 && u < 4) x /= 1e3, u++;
    if (u) snprintf(buf, n, "%.4g%c", x, unit[u]);
    else snprintf(buf, n, "%.0f", x);
}

/* The model and batch-arithmetic lines (training start and `llmtrain check`).
 * The parameter count is the whole model's (GLOBAL tensors under tp > 1). */
static void print_model_batch(const Trainer *t) {
    const Config *c = &t->cfg;
    const ModelConfig *mc = &c->model;
    double n = 0;
    for (int i = 0; i < t->model.n_specs; i++) n += (double)model_global_numel(&t->model, &t->model.specs[i]);
    char rope[256] = "";
    if (mc->head_dim * mc->n_head != mc->n_embd) snprintf(rope, sizeof rope, ", head_dim %d", mc->head_dim);
    if (mc->qk_norm) snprintf(rope + strlen(rope), sizeof rope - strlen(rope), ", QK-norm");
    if (mc->arch == ARCH_LLAMA)
        snprintf(rope + strlen(rope), sizeof rope - strlen(rope), ", RoPE theta %g", mc->rope_theta);
    if (mc->rope_scaling == ROPE_LINEAR)
        snprintf(rope + strlen(rope), sizeof rope - strlen(rope), " scaled linear (factor %g)", mc->rope_scaling_factor);
    if (mc->rope_scaling == ROPE_YARN) {
        Rope r = {.scaling = ROPE_YARN, .factor = mc->rope_scaling_factor, .attention_factor = mc->rope_attention_factor};
        snprintf(rope + strlen(rope), sizeof rope - strlen(rope),
                 " scaled yarn (factor %g, original %d, beta %g/%g%s, attention factor %.4g)", mc->rope_scaling_factor,
                 mc->rope_original_max_seq_len, mc->rope_beta_fast, mc->rope_beta_slow, mc->rope_truncate ? "" : " untruncated",
                 rope_mscale(&r));
    }
    if (mc->rope_scaling == ROPE_LLAMA3)
        snprintf(rope + strlen(rope), sizeof rope - strlen(rope), " scaled llama3 (factor %g, low %g, high %g, original %d)",
                 mc->rope_scaling_factor, mc->rope_low_freq_factor, mc->rope_high_freq_factor, mc->rope_original_max_seq_len);
    if (c->attention_mask == ATT_MASK_BLOCK_CAUSAL)
        snprintf(rope + strlen(rope), sizeof rope - strlen(rope), ", block-causal attention (documents end at token %d)",
                 c->eod_token);
    if (c->reset_position_ids)
        snprintf(rope + strlen(rope), sizeof rope - strlen(rope), ", positions reset after token %d", c->eod_token);
    printf("model %s: %d layers, %d embd, %d heads (%d kv), ffn %d, vocab %d, %.2fM parameters%s%s\n",
           mc->arch == ARCH_GPT2 ? "gpt2" : "llama", mc->n_layer, mc->n_embd, mc->n_head, mc->n_kv_head,
           mc->ffn_hidden, mc->vocab_size, n / 1e6, mc->tie_embeddings ? " (tied embeddings)" : "", rope);
    if (mc->moe_experts > 0) { /* active: all but the experts a token does not choose */
        int nm = moe_layer_count(mc);
        double idle = (double)nm * (mc->moe_experts - mc->moe_top_k) * 3.0 * mc->moe_ffn_hidden * mc->n_embd;
        char total[32], active[32], shared[64] = "", ep[64] = "";
        if (c->ep > 1) snprintf(ep, sizeof ep, "; ep %d computes %d a rank", c->ep, mc->moe_experts / c->ep);
        fmt_count(total, sizeof total, n);
        fmt_count(active, sizeof active, n - idle);
        if (mc->moe_shared_experts)
            snprintf(shared, sizeof shared, ", %d shared expert%s", mc->moe_shared_experts, mc->moe_shared_experts > 1 ? "s" : "");
        printf("moe: %d experts, top-%d%s, expert width %d%s, %d of %d layers MoE | parameters %s total, %s active a token "
               "(every rank holds every expert%s)\n", mc->moe_experts, mc->moe_top_k,
               mc->moe_norm_topk ? " renormalised" : "", mc->moe_ffn_hidden, shared, nm, mc->n_layer, total, active, ep);
    }
    printf("batch: %d seqs x %d tokens = %lld tokens/step; micro %d x accum %d x dp %d | world %d", c->global_batch, c->seq_len,
           (long long)c->global_batch * c->seq_len, c->micro_batch, t->accum, dist_seq_dp(&t->dist), t->dist.world);
    if (c->cp > 1) printf(" | context parallel %d: %d tokens of each sequence a rank", c->cp, c->seq_len / c->cp);
    if (c->rampup_start) { /* where the ramp ends, walked from this run's start (a resume: its checkpoint) */
        int k = t->step_base, g = 0;
        uint64_t cur = t->seq_base;
        for (; k < c->steps && (g = config_batch_at(c, cur)) < c->global_batch; k++) cur += (uint64_t)g;
        printf(" | ramp-up from %d seqs, +%d per %g samples", c->rampup_start, c->rampup_increment,
               (double)c->rampup_samples / ((c->global_batch - c->rampup_start) / c->rampup_increment));
        if (k < c->steps) printf(": %d from step %d", c->global_batch, k + 1);
        else if (g) printf(": still %d at the last step", g);
    }
    if (c->eod_mask_loss) printf(" | no loss on the targets after token %d (eod_mask_loss)", c->eod_token);
    const Model *m = &t->model;
    if (m->act_ckpt == ACT_FULL) printf(" | full activation checkpointing");
    if (m->act_ckpt == ACT_SELECTIVE) { /* what the backward recomputes (train.recompute_modules) */
        char name[32];
        printf(" | selective activation checkpointing (");
        for (int i = 0, first = 1; i < 3; i++)
            if (m->recompute >> i & 1) {
                printf("%s%s", first ? "" : ", ", config_enum_name(RECOMPUTE_MODULES, i, name, sizeof name));
                first = 0;
            }
        printf(")");
    }
    int mb_rows = c->micro_batch * (c->seq_len / c->cp); /* a rank's micro-batch: under cp its share of each sequence */
    if (m->head_rows < mb_rows) /* the chunked LM head: how many rows, and the logits it holds */
        printf(" | lm head %d rows at a time (%.0f MiB of logits%s)", m->head_rows,
               (double)m->head_rows * m->V * m->act_bytes / (1 << 20), m->tp.size > 1 ? " per rank" : "");
    printf("\n");
    /* the run's whole budget (a resumed run: its earlier steps too), against the parameters (Chinchilla: ~20) */
    double seqs = (double)run_sequences(t), tokens = seqs * c->seq_len;
    char tk[32];
    fmt_count(tk, sizeof tk, tokens);
    printf("tokens: %s over %d steps (%.0f sequences; %.3g per parameter)\n", tk, c->steps, seqs, tokens / n);
    char lr[192];
    config_lr_text(c, lr, sizeof lr);
    printf("optim: AdamW, lr %s | weight decay %g%s, betas %g/%g, eps %g, clip %g\n", lr, c->weight_decay,
           c->decay_all ? " (all parameters)" : "", c->beta1, c->beta2, c->eps, c->grad_clip);
}

static void print_header(Trainer *t) {
    if (!is_root(t)) return;
    const Config *c = &t->cfg;
#ifdef LLMTRAIN_CUDA
    if (backend_is_cuda(t))
        printf("llmtrain %s | %s | backend cuda%s%s | %s\n", LLMTRAIN_VERSION, c->path, t->dist.dev ? ", collectives " : "",
               t->dist.dev ? t->dist.dev->name : "", kernels_cuda_device_info());
    else
#endif
    printf("llmtrain %s | %s | backend %s, %d threads/rank | %s\n", LLMTRAIN_VERSION, c->path, t->k->name, t->threads,
           kernels_cpu_blas_info());
    print_model_batch(t);
    if (t->ck.sched_change[0]) /* ckpt_resume under optim.override_schedule */
        printf("schedule: this job's, not the checkpoint's (optim.override_schedule): %s\n", t->ck.sched_change);
    if (t->dist.world > 1) printf("launch: %s | %d ranks, %d on this node\n", t->dist.launch, t->dist.world, t->dist.local_size);
    char data[1024];
    dataset_describe(&t->train, c->data_train, (double)run_sequences(t) * c->seq_len, data, sizeof data);
    printf("data: %s%s | peak for MFU %.1f GFLOP/s (%s)%s\n", data, t->have_val ? ", val on" : "", t->peak_gflops,
           t->peak_source, config_fp8_recipe(c) >= 0 ? "; MFU against it under fp8 too, as FP8 MFU is quoted" : "");
    if (t->have_val && t->val.n_src) { /* val_loss lines then add each source's, in this order */
        dataset_describe(&t->val, c->data_val, 0, data, sizeof data);
        printf("val: %s\n", data);
    }
    if (t->init.kind) {
        char line[4400];
        init_from_describe(&t->init, line, sizeof line);
        printf("%s%s\n", line, t->step_base > 0 ? " (replaced by the resumed checkpoint's weights)" : "");
    }
    printf("metrics: %s\n", t->metrics_path); /* the whole line is the path: scripts/run_resilient.sh reads it */
    if (t->tb.f) printf("tensorboard: %s\n", t->tb.path);
    fflush(stdout);
}

static void tp_allreduce_cb(void *ctx, float *x, size_t n, int max) { dist_allreduce(ctx, DIST_GROUP_TP, DIST_F32, max, x, n); }
static void tp_allgather_cb(void *ctx, const void *send, void *recv, size_t n, int es) { dist_allgather(ctx, DIST_GROUP_TP, es == 2 ? DIST_BF16 : DIST_F32, send, recv, n); }
static void tp_reduce_scatter_cb(void *ctx, const float *send, float *recv, size_t n) {
    dist_reduce_scatter(ctx, DIST_GROUP_TP, send, recv, n);
}

static int cp_shift_cb(void *ctx, const void *send, void *recv, size_t bytes) { return dist_shift_start(ctx, DIST_GROUP_CP, send, recv, bytes); }
static void cp_wait_cb(void *ctx, int h) { dist_shift_wait(ctx, h); }
static void cp_allgather_cb(void *ctx, const void *send, void *recv, size_t bytes) { dist_allgather(ctx, DIST_GROUP_CP, DIST_BYTE, send, recv, bytes); }
static void cp_reduce_scatter_cb(void *ctx, const float *send, float *recv, size_t n) {
    dist_reduce_scatter(ctx, DIST_GROUP_CP, send, recv, n);
}
static void cp_allreduce_max_cb(void *ctx, float *x, size_t n) { dist_allreduce(ctx, DIST_GROUP_CP, DIST_F32, DIST_MAX, x, n); }
static void mb_allreduce_cb(void *ctx, double *x, size_t n) { dist_allreduce(ctx, DIST_GROUP_CP, DIST_F64, DIST_SUM, x, n); }
static void ep_alltoallv_cb(void *ctx, const void *send, const size_t *scount, const size_t *sdispl, void *recv, const size_t *rcount,
                            const size_t *rdispl) {
    dist_alltoallv(ctx, DIST_GROUP_EP, send, scount, sdispl, recv, rcount, rdispl);
}
static void ep_counts_cb(void *ctx, const size_t *send, size_t *recv) { dist_alltoall_counts(ctx, DIST_GROUP_EP, send, recv); }

/* Option `name` at argv[*i], as `name VALUE` or `name=VALUE`: 1 with *val
 * VALUE and *i at its last word; 0 when argv[*i] is another word. */
static int cli_option(int argc, char **argv, int *i, const char *name, const char **val) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return 0;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n]) return 0;
    if (*i + 1 >= argc) die(EXIT_USAGE, "%s: expected a value after it (%s VALUE or %s=VALUE)", name, name, name);
    *val = argv[++*i];
    return 1;
}

/* `JOB [--set k=v ...]`, and for check (world not NULL) `--world N`, each
 * option also as --opt=value: load the job into
 * t->cfg, take init.from's model section and freeze the model. */
static void load_job(Trainer *t, int argc, char **argv, int *world, const char *usage_line) {
    const char *job = NULL, *v;
    char **sets = malloc_check((size_t)argc * sizeof(char *));
    int n_set = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_option(argc, argv, &i, "--set", &v)) {
            sets[n_set++] = (char *)v;
        } else if (world && cli_option(argc, argv, &i, "--world", &v)) {
            char *end = NULL;
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 1 || n > (1 << 24))
                die(EXIT_USAGE, "--world: expected a number of ranks in [1, %d], got '%s'", 1 << 24, v);
            *world = (int)n;
        } else if (!world && cli_option(argc, argv, &i, "--world", &v)) {
            die(EXIT_USAGE, "--world is llmtrain check's option: a training run takes its ranks from its launcher (mpirun -np N, "
                "torchrun, srun)");
        } else if (argv[i][0] == '-') {
            die(EXIT_USAGE, "unknown option '%s' (expected %s; see llmtrain --help)", argv[i], world ? "--set or --world" : "--set");
        } else if (!job) {
            job = argv[i];
        } else {
            die(EXIT_USAGE, "unexpected argument '%s': one job file only (usage: %s)", argv[i], usage_line);
        }
    }
    if (!job) die(EXIT_USAGE, "no job file given (usage: %s)", usage_line);
    /* the CUDA backend's precision and attention were once these variables:
     * a job must not silently run otherwise than its environment says */
    static const char *gone[][2] = {{"LLMTRAIN_CUDA_MATMUL", "train.compute_dtype"}, {"LLMTRAIN_CUDA_ATTENTION", "train.attention_kernel"}};
    for (int i = 0; i < 2; i++)
        if (getenv(gone[i][0]))
            die(EXIT_USAGE, "environment: %s is no longer read; set %s in the job (or --set %s=...) and unset it", gone[i][0],
                gone[i][1], gone[i][1]);
    Config *c = &t->cfg;
    config_load(c, job, n_set, sets);
    free(sets);
    init_from_model(c, &t->init, t->dist.rank); /* a Hugging Face folder or a checkpoint: its model section */
    config_moe_check(c);
    config_freeze_model(c);
    if (c->eod_token >= c->model.vocab_size)
        die(EXIT_USAGE, "%s: data.eod_token %d is not a token of the model (expected below model.vocab_size %d)", c->path,
            c->eod_token, c->model.vocab_size);
}

/* Everything before the first step: the job and its layout, the backend,
 * the checkpoint folders, data, model and sharding, resume, the header. */
static void setup(Trainer *t, int *argc, char ***argv) {
    dist_init(&t->dist, argc, argv);
    die_replicated(t->dist.rank != 0); /* the job file and the layout: one error line per job */
    load_job(t, *argc, *argv, NULL, "llmtrain job.json [--set key=value ...]");
    Config *c = &t->cfg;
    dist_watchdog_start(&t->dist, c->timeout_s);
    layout_check_same_job(c, &t->dist); /* the first collective, under the watchdog: a rank stuck reading its job ends the job */
    t->accum = layout_check(&t->sh, c, &t->dist, &t->model);
    t->k = layout_select_backend(c, &t->dist); /* a missing GPU is usually every rank's error too */
    if (c->profile_steps > 0) t->k = profile_wrap(t->k); /* timing off until its window */
    die_replicated(0); /* from here errors may differ per rank or host (data paths, memory) */
    t->threads = kernels_cpu_set_threads(0, t->dist.local_size);

    /* data first: a bad path should fail before minutes of setup */
    dataset_open(&t->train, c->data_train, "data.train", c->model.vocab_size, c->seq_len, c->data_shuffle, c->seed);
    if (c->data_val[0]) {
        dataset_open(&t->val, c->data_val, "data.val", c->model.vocab_size, c->seq_len, 0, c->seed);
        t->have_val = 1;
    }
    if (c->eod_token < 0 && (c->attention_mask == ATT_MASK_BLOCK_CAUSAL || c->eod_mask_loss || c->reset_position_ids)) {
        /* documents without an end token: an indexed dataset's index */
        for (int v = 0; v < 1 + t->have_val; v++)
            if (!dataset_has_docs(v ? &t->val : &t->train))
                die(EXIT_USAGE, "%s: %s '%s' has no document index (an llm.c shard among it): %s needs data.eod_token, or Megatron "
                    "indexed datasets whose index gives the documents", c->path, v ? "data.val" : "data.train",
                    v ? c->data_val : c->data_train,
                    c->attention_mask == ATT_MASK_BLOCK_CAUSAL ? "train.attention_mask block_causal"
                    : c->eod_mask_loss ? "train.eod_mask_loss" : "train.reset_position_ids");
        t->ends = malloc_check((size_t)c->micro_batch * c->seq_len);
    }
    if (c->data_vocab[0]) {
        vocab_load(&t->vocab, c->data_vocab);
        vocab_fit(&t->vocab, "data.vocab", c->data_vocab, c->model.vocab_size);
        t->have_vocab = 1;
    }
    const char *dtr = getenv("LLMTRAIN_DATA_TRACE"); /* tests: the tokens this rank reads (data.h) */
    if (dtr && *dtr) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", dtr, t->dist.rank);
        FILE *f = fopen(path, "w");
        if (!f) die(EXIT_USAGE, "LLMTRAIN_DATA_TRACE: cannot open %s for writing: %s", path, strerror(errno));
        t->train.trace = t->val.trace = f; /* closed at exit */
    }

    dist_setup_groups(&t->dist, t->sh.S);
#ifdef LLMTRAIN_CUDA
    if (backend_is_cuda(t) && t->dist.world > 1) dist_nccl_attach(&t->dist); /* device collectives through NCCL */
#endif
    model_build_tp(&t->model, &c->model, t->k, c->micro_batch, c->seq_len / c->cp, t->sh.S, !t->sh.sharded, t->dist.tp,
                   t->dist.tp_rank, (ModelMem){c->act_ckpt, c->lm_head_chunk, c->act_offload, 0, c->seq_parallel, c->recompute_modules, c->ep, t->dist.ep_rank, c->moe_capacity_factor});
    cp_setup(&t->model, c->cp, t->dist.cp_rank, c->cp_mode);
    model_fp8(&t->model, config_fp8_recipe(c)); /* train.compute_dtype fp8 */
    t->model.block_causal = c->attention_mask == ATT_MASK_BLOCK_CAUSAL;
    t->model.reset_pos = c->reset_position_ids;
    t->model.eod_token = t->model.block_causal || t->model.reset_pos ? c->eod_token : -1;
    int mb_rows = c->micro_batch * c->seq_len;
    if (c->debug_dump[0] && t->model.head_rows < mb_rows)
        die(EXIT_USAGE, "%s: debug.dump writes the whole micro-batch's logits, but the LM head takes %d of its %d rows at a time "
            "(train.lm_head_chunk %d; expected at least %d, or 0 with the logits within %zu MiB)", c->path,
            t->model.head_rows, mb_rows, c->lm_head_chunk, mb_rows, HEAD_AUTO_BYTES >> 20);
    t->model.comm = (ModelComm){&t->dist, tp_allreduce_cb, tp_allgather_cb, tp_reduce_scatter_cb, NULL, NULL, NULL, cp_shift_cb,
                                cp_wait_cb, cp_allgather_cb, cp_reduce_scatter_cb, cp_allreduce_max_cb, mb_allreduce_cb, ep_alltoallv_cb, ep_counts_cb};
    moe_set_losses(&t->model, c->moe_capacity_factor, config_moe_aux_coef(c), c->moe_z_loss_coef);
    moe_set_bias_rate(&t->model, c->moe_bias_rate);
    if (t->init.kind) init_from_load(&t->init, &t->model, &t->dist);
    else model_init_random(&t->model, c->init_std, c->seed);
    init_origin(c, &t->init); /* the ids and tokenizer files the checkpoints carry for export */
    t->sh.k = t->k;
    shard_setup(&t->sh);
    shard_opt_ranges_build(&t->sh);
    shard_setup_bf16(&t->sh);
    t->tok = malloc_check((size_t)c->micro_batch * c->seq_len * sizeof(int));
    t->tgt = malloc_check((size_t)c->micro_batch * c->seq_len * sizeof(int));
    t->host_flat = malloc_check(t->model.n_params * sizeof(float));
    if (c->cp > 1) {
        t->doc0 = malloc_check((size_t)c->micro_batch * c->seq_len * sizeof(int));
        t->doc_end = malloc_check((size_t)c->micro_batch * 2 * c->cp * sizeof(double));
        t->model.cp.doc0 = t->doc0;
    }
    /* the run's folders only now, with the job, data, vocab and weights read:
     * a start that fails on them leaves nothing behind */
    ckpt_claim_dirs(c, &t->dist);
    t->flops_per_token = model_flops_per_token(&c->model, c->seq_len);
    t->peak_gflops = select_peak(t, &t->peak_source);
    if (c->profile_steps > 0) t->peak_gbs = select_peak_gbs(t);
    /* the profile table rates the FP8 products at the FP8 tensor cores'
     * dense rate, twice bf16's on sm_89 and sm_90; the CPU's FP8 products
     * are fake-quantized fp32 ones */
    if (c->profile_steps > 0) profile_set_fp8_peak(backend_is_cuda(t) ? 2.0 : 1.0);
    ckpt_run_setup(&t->ck, &t->sh, ck_event, t);
    int resumed = ckpt_resume(&t->ck, &t->st);
    if (resumed) {
        t->step_base = t->plan_step = t->st.step;
        t->seq_base = t->plan_cursor = t->st.seq_cursor;
    }
    t->end_cursor = run_sequences(t);
    profile_window_init(&t->prof, t->step_base, c->steps, c->profile_steps);
    shard_refresh_working(&t->sh, t->step_base);
    open_metrics(t, resumed);
    print_header(t);
    layout_print(&t->sh, t->k);
    if (c->health_check && !dist_health_check(&t->dist, (size_t)1 << 20, c->min_bus_gbps)) {
        dist_finalize(&t->dist);
        exit(EXIT_SLOW_FABRIC);
    }
    if (t->step_base >= c->steps && is_root(t)) {
        if (resumed)
            printf("resume: the checkpoint is at step %d and train.steps is %d: nothing to train (raise train.steps to continue)\n",
                   t->step_base, c->steps);
        else printf("train.steps is 0: nothing to train\n");
    }
}

/* Asked to stop before the first step: the newest checkpoint (or none, for
 * a new run) is already where a restart begins. */
static int stop_at_start(Trainer *t) {
    if (is_root(t))
        fprintf(stderr, "llmtrain: stopped by signal during start-up, before step %d; nothing new to checkpoint, exiting %d\n",
                t->step_base + 1, EXIT_STOPPED);
    ckpt_drain(&t->ck); /* a durable copy the start made again */
    ckpt_run_free(&t->ck);
    if (t->metrics) fclose_check(t->metrics, "metrics.jsonl");
    tb_close(&t->tb);
    dist_phase(&t->dist, t->step_base, "finalize");
    dist_finalize(&t->dist);
    return EXIT_STOPPED;
}

/* Begin the checkpoint of the state after `step` steps (the data cursor
 * before the next, the sampling key: the format's field, resume needs
 * nothing from it). Returns the seconds training was blocked. */
static double save_checkpoint(Trainer *t, int step) {
    dist_phase(&t->dist, step, "checkpoint");
    TrainState st = t->st;
    st.step = step;
    st.seq_cursor = step_cursor(t, step);
    st.rng = sample_key((uint64_t)t->cfg.seed, step);
    return ckpt_begin(&t->ck, &st);
}

/* Non-finite policy: after optim.max_nonfinite_steps skipped steps in a
 * row, exit 4; the checkpoint in flight predates the streak, so a restart
 * rolls back to it. */
static void check_nonfinite_run(Trainer *t, const StepStats *s) {
    if (t->nonfinite_run < t->cfg.max_nonfinite_steps) return;
    log_step(t, s);
    if (is_root(t)) fprintf(stderr, "llmtrain: %d consecutive steps with non-finite loss or gradients (step %d); exiting\n",
                            t->nonfinite_run, s->step + 1);
    ckpt_drain(&t->ck);
    dist_abort(&t->dist, EXIT_NONFINITE);
}

/* The validation loss after `step` steps (a blend: also each source alone,
 * on its own first eval.batches); a stop request during it abandons it. */
static void evaluate(Trainer *t, StepStats *s, int step) {
    s->val_loss = eval_loss(t, &t->val);
    for (int i = 0; i < t->val.n_src && !t->eval_stopped; i++) s->val_src[i] = eval_loss(t, &t->val.src[i]);
    s->n_val_src = t->eval_stopped ? 0 : t->val.n_src;
    if (t->eval_stopped) { /* no partial loss, no sample */
        s->val_loss = NAN;
        if (is_root(t)) fprintf(stderr, "llmtrain: stop requested during the evaluation after step %d; evaluation abandoned\n", step);
    }
}

/* The step's fault-injection hooks (LLMTRAIN_FAULT; tests only): die or
 * hang here, a lowered peak (check_peak), NaN gradients (shard.c's poison).
 * The checkpoint writer's hooks are ckpt_run.c's. */
static void step_test_hooks(Trainer *t, int step) {
    dist_fault_point(&t->dist, step);
    if (dist_fault_low_peak(&t->dist, step)) t->peak_gflops /= 1e4;
    t->sh.poison = dist_fault_nan(&t->dist, step);
}

/* One iteration of the loop, each policy a call: the step, the checkpoint
 * and stop agreement, non-finite steps, checkpoint, evaluation, logging,
 * a late stop. Returns 1 when the run stops after this step. */
static int loop_step(Trainer *t, int step) {
    const Config *c = &t->cfg;
    dist_phase(&t->dist, step + 1, "forward");
    step_test_hooks(t, step + 1);
    int timed = profile_window_begin(&t->prof, step);
    StepStats s = train_step(t, step);
    profile_window_end(&t->prof, timed);
    track_spikes(t, &s);
    int last = step + 1 == c->steps, stop = 0, due = 0;
    dist_phase(&t->dist, step + 1, "checkpoint");
    ckpt_control(&t->ck, 0, g_stop_signal != 0, &stop, &due);
    int eval = (c->eval_every > 0 && (step + 1) % c->eval_every == 0) || last;
    int save = (c->ckpt_every > 0 && (step + 1) % c->ckpt_every == 0) || last || stop || due || t->ck_deferred;
    /* a periodic checkpoint during a run of non-finite steps would keep a
     * state that exit 4 is about to roll back: take it at the next good step */
    t->ck_deferred = save && !last && !stop && t->nonfinite_run > 0;
    if (t->ck_deferred) save = 0;
    /* evaluation only when it has work (a validation loss or a sample)
     * and no stop was asked for: the checkpoint comes first */
    eval = eval && !stop && ((t->have_val && c->eval_batches > 0) || c->sample_tokens > 0);
    check_nonfinite_run(t, &s);
    /* the checkpoint first: it reads only the shards, and an evaluation
     * that fails must not cost it */
    if (save) s.ck_block = save_checkpoint(t, step + 1);
    /* sharded: eval and sample forwards gather chunk by chunk through the
     * chunk hook, as the step does (never the full weights) */
    if (eval) dist_phase(&t->dist, step + 1, "eval");
    if (eval && t->have_val && c->eval_batches > 0) evaluate(t, &s, step + 1);
    log_step(t, &s);
    if (step == t->prof.last) print_profile(t);
    if (eval && !t->eval_stopped) print_sample(t, step + 1);
    /* asked to stop while evaluating or sampling, or a log write failed
     * (a full log.dir: exit 3): this step's checkpoint now (if it was not
     * taking one), not after another step */
    if (logs_failed_agreed(t) || (eval && (t->eval_stopped || stop_agreed(t)))) {
        stop = 1;
        if (!save) save_checkpoint(t, step + 1);
    }
    return stop && !last;
}

/* After the last step (or a stop): the final checkpoint complete (and its
 * durable copy), the logs closed; the exit code. */
static int finish(Trainer *t, int stopped) {
    const Config *c = &t->cfg;
    CkptRun *ck = &t->ck;
    print_profile(t); /* stopped inside the window */
    dist_phase(&t->dist, c->steps, "checkpoint");
    ckpt_drain(ck);
    int final_step = t->step_base < c->steps ? ck->state.step : ck->done_step;
    if (is_root(t) && t->st.norm_n > 0)
        printf("grad-norm spikes: %d (norm above its %d-step running mean + 0.1; lengths in metrics.jsonl grad_spike_steps)\n",
               t->st.spikes + (t->st.spike_len > 0), CKPT_SPIKE_WINDOW);
    if (t->metrics && fclose(t->metrics) != 0) log_failed(t, t->metrics_path, errno);
    t->metrics = NULL;
    if (tb_close(&t->tb)) log_failed(t, t->tb.path, t->tb.err);
    int logs_failed = logs_failed_agreed(t);
    if (logs_failed) { /* every rank: exit 3 below, rather than 143 for a stop */
        stopped = 0;
        if (is_root(t))
            fprintf(stderr, "llmtrain: %s: cannot write (%s); stopped after step %d%s, exiting %d\n", t->log_path,
                    strerror(t->log_errno), final_step, ck->done_step == final_step ? ", its checkpoint written" : "", EXIT_IO);
    }
    if (ck->done_step != final_step) {
        if (is_root(t)) fprintf(stderr, "llmtrain: the final checkpoint (step %d) could not be written to %s%s%s; see the lines above\n",
                                final_step, c->ckpt_dir, c->ckpt_durable_dir[0] ? " or " : "", c->ckpt_durable_dir);
        dist_abort(&t->dist, EXIT_IO);
    }
    /* the local disk may not outlive the job (SageMaker's does not): a final
     * checkpoint this run wrote is complete only with its durable copy */
    if (c->ckpt_durable_dir[0] && (t->step_base < c->steps || ck->recopy) && ck->durable_step != final_step) {
        if (is_root(t)) fprintf(stderr, "llmtrain: the final checkpoint (step %d) is complete in %s but could not be copied to %s; see the lines above\n",
                                final_step, c->ckpt_dir, c->ckpt_durable_dir);
        dist_abort(&t->dist, EXIT_IO);
    }
    ckpt_run_free(ck);
    if (stopped && is_root(t))
        fprintf(stderr, "llmtrain: stopped by signal after step %d; checkpoint written, exiting %d\n", final_step, EXIT_STOPPED);
    dist_phase(&t->dist, c->steps, "finalize");
    dist_finalize(&t->dist);
    return logs_failed ? EXIT_IO : stopped ? EXIT_STOPPED : EXIT_OK;
}

/* `llmtrain job.json`: one line a policy. A stop signal from the start: a
 * stop request during start-up (a rendezvous, a long load) is answered
 * before the first step, not by the signal's default action (SIGUSR1's,
 * what the launchers send mpirun, kills). */
static int train(int argc, char **argv) {
    static Trainer tr;
    Trainer *t = &tr;
    catch_stop_signals();
    setup(t, &argc, &argv);
    if (t->step_base < t->cfg.steps && stop_agreed(t)) return stop_at_start(t);
    int stopped = 0;
    for (int step = t->step_base; step < t->cfg.steps && !stopped; step++) stopped = loop_step(t, step);
    return finish(t, stopped);
}

/* ------------------------------------------------------------------ */
/* export                                                              */

static int cmd_export(int argc, char **argv) { return export_main(argc, argv); } /* export.c */

/* ------------------------------------------------------------------ */
/* check: validate a job and its parallel layout for N ranks, no MPI     */

/* The same config and layout checks (and messages) as a training start on
 * --world N ranks, then the layout summary and this implementation's
 * per-rank memory estimate, without opening data or allocating the model. */
static int cmd_check(int argc, char **argv) {
    static Trainer tr;
    Trainer *t = &tr;
    int world = 1;
    const char *gpu_mem, *instance;
    fit_take_flags(&argc, argv, &gpu_mem, &instance);
    int print_config = 0; /* --print-config: the resolved job as JSON, not the report */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--print-config") == 0) {
            print_config = 1;
            memmove(argv + i, argv + i + 1, (size_t)(argc - i) * sizeof *argv);
            argc--, i--;
        }
    load_job(t, argc, argv, &world, "llmtrain check JOB.json [--world N] [--gpu-mem 40GiB | --instance TYPE] [--print-config] [--set key=value ...]");
    const Config *c = &t->cfg;
    char what[256];
    double gpu = fit_gpu_bytes(c, gpu_mem, instance, what, sizeof what);
    double b[LAYOUT_RANK_BYTES], sc;
    t->accum = fit_estimate(&t->cfg, world, &t->sh, &t->dist, &t->model, b, &sc);
    if (print_config) { /* valid for the world: the job, every key resolved */
        char *text = config_resolved_json(c);
        fputs(text, stdout);
        free(text);
        model_free(&t->model);
        config_free(&t->cfg);
        return EXIT_OK;
    }
    printf("check: %s: valid for %d rank%s\n", c->path, world, world == 1 ? "" : "s");
    if (c->description[0]) printf("description: %s\n", c->description);
    print_model_batch(t);
    int tp = t->dist.tp, dp = t->dist.dp, cp = t->dist.cp;
    char ctx[96] = "";
    if (cp > 1) snprintf(ctx, sizeof ctx, " x context %d (%d tokens of each sequence a rank)", cp, c->seq_len / cp);
    char ep[64] = "";
    if (t->dist.ep > 1) snprintf(ep, sizeof ep, " | expert groups of %d (innermost of dp x cp)", t->dist.ep);
    printf("parallel: tensor %d%s%s x data-parallel %d | strategy %s: shard groups of %d x %d replicas%s%s\n", tp,
           c->seq_parallel ? " (sequence parallel)" : "", ctx, dp / cp, c->strategy, t->sh.S, dp / t->sh.S,
           cp > 1 ? " (over data-parallel x context ranks)" : "", ep);
    char off[64];
    printf("per rank (estimate): params_bytes %.0f master_bytes %.0f grads_bytes %.0f optimizer_state_bytes %.0f "
           "activations_bytes %.0f%s | total %.1f GiB\n", b[0], b[1], b[2], b[3], b[4], layout_offload_field(b[5], off, sizeof off),
           fit_device_bytes(b, 0) / (1 << 30));
    if (strcmp(c->device, "cpu") != 0)
        printf("on CUDA also (estimate): cuda_scratch_bytes %.0f (cuBLASLt workspace, attention, gradient and sort "
               "scratch%s) | total %.1f GiB\n", sc, config_fp8_recipe(c) >= 0 ? ", FP8 codes and stage" : "",
               fit_device_bytes(b, sc) / (1 << 30));
    fit_print_bf16_cost(c, world, fit_device_bytes(b, sc), t->sh.sharded);
    int fits = 1;
    if (gpu > 0) fits = fit_report(c, world, fit_device_bytes(b, sc), gpu, what);
    else if (strcmp(c->device, "cpu") != 0)
        printf("fit: not checked against a GPU (give --gpu-mem 40GiB or --instance ml.p4d.24xlarge, or train.instance in the job)\n");
    fflush(stdout);
    if (!fits)
        die(EXIT_USAGE, "%s: does not fit %s: %.1f GiB a rank by the estimate, over the %.1f GiB a rank may use (expected a layout "
            "that fits: the nearest are above)", c->path, what, fit_device_bytes(b, sc) / (1 << 30), FIT_USABLE * gpu / (1 << 30));
    model_free(&t->model);
    config_free(&t->cfg);
    return EXIT_OK;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: llmtrain JOB.json [--set key=value ...]   train (mpirun -np N for several ranks)\n"
            "       llmtrain export CHECKPOINT_DIR OUT_DIR [--dtype fp32|bf16] [--max-shard-size SIZE] [--tokenizer DIR|none]\n"
            "                                                 write a Hugging Face folder\n"
            "       llmtrain check JOB.json [--world N] [--gpu-mem SIZE | --instance TYPE] [--print-config] [--set key=value ...]\n"
            "                                                 validate the job and its layout for N ranks\n"
            "       llmtrain keys                             list every config key with its default\n"
            "       llmtrain --version\n"
            "every option takes its value as --opt VALUE or --opt=VALUE\n");
}

/* The first argument when it is no command: a job file to train when it
 * names a file, or looks like a path or a .json; else a mistyped command,
 * refused with the commands and the closest of them. */
static void check_job_word(const char *arg) {
    static const char *commands[] = {"check", "export", "keys"};
    struct stat st;
    size_t n = strlen(arg);
    if (arg[0] == '-' || stat(arg, &st) == 0 || strchr(arg, '/') || (n > 5 && strcmp(arg + n - 5, ".json") == 0)) return;
    const char *best = NULL;
    int bestd = 3;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        int d = edit_distance(arg, commands[i]);
        if (d < bestd && d < (int)strlen(commands[i]) - 1) { bestd = d; best = commands[i]; }
    }
    char hint[64] = "";
    if (best) snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
    die(EXIT_USAGE, "'%s' is not a command, nor a job file%s: the commands are check, export and keys, and `llmtrain JOB.json` "
        "trains (see llmtrain --help)", arg, hint);
}

int main(int argc, char **argv) {
    kernels_cpu_select_blas_core(argv);
    if (argc < 2) { usage(stderr); return EXIT_USAGE; }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) { usage(stdout); return EXIT_OK; }
    if (strcmp(argv[1], "--version") == 0) { printf("llmtrain %s\n", LLMTRAIN_VERSION); return EXIT_OK; }
    if (strcmp(argv[1], "keys") == 0) { config_print_keys(); return EXIT_OK; }
    if (strcmp(argv[1], "export") == 0) return cmd_export(argc - 2, argv + 2);
    if (strcmp(argv[1], "check") == 0) return cmd_check(argc - 1, argv + 1);
    check_job_word(argv[1]);
    return train(argc, argv);
}
