/* steplog.c — a training step's logs: the step line on stdout, its
 * metrics.jsonl line and TensorBoard scalars, the gradient-norm spike
 * tracker, and the metrics file's whole-line writes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "steplog.h"
#include "util.h"
#include <errno.h>
#include <math.h>
#include <sys/resource.h>

/* Rank 0: a log file could not be written (a full log.dir): the first
 * failure is kept, no step dies of it: the loop stops after this step's
 * checkpoint, and the run ends with one line naming it and exit 3
 * (logs_failed_agreed) */
void log_failed(Trainer *t, const char *path, int err) {
    if (t->log_errno) return;
    size_t n = strlen(path) < sizeof t->log_path ? strlen(path) : sizeof t->log_path - 1;
    memcpy(t->log_path, path, n);
    t->log_path[n] = '\0';
    t->log_errno = err ? err : EIO;
}

/* One whole line of metrics.jsonl, flushed; when it fails, the file is cut
 * back to its last whole line and closed (nothing more is written to it). */
void metrics_line(Trainer *t, const char *line) {
    if (!t->metrics) return;
    size_t n = strlen(line);
    errno = 0;
    int err = log_record_end(t->metrics, fwrite(line, 1, n, t->metrics) == n, &t->metrics_good);
    if (!err) return;
    fclose(t->metrics);
    t->metrics = NULL;
    log_failed(t, t->metrics_path, err);
}

static double peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

/* Peak device memory of the CUDA backend in bytes; -1 on the CPU backend. */
static double gpu_peak_bytes(const Trainer *t) {
#ifdef LLMTRAIN_CUDA
    if (backend_is_cuda(t)) {
        size_t peak = 0;
        kernels_cuda_mem_stats(NULL, &peak);
        return (double)peak;
    }
#endif
    (void)t;
    return -1;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long x = (long)(s + 0.5);
    snprintf(buf, n, "%ld:%02ld:%02ld", x / 3600, (x / 60) % 60, x % 60);
}

static void json_num(Buf *b, const char *key, double v) {
    if (isfinite(v)) buf_add(b, ",\"%s\":%.9g", key, v);
    else buf_add(b, ",\"%s\":null", key);
}

/* One number of a step line (built in b): metrics.jsonl's key, and the same
 * value as the step's TensorBoard scalar tag (log.tensorboard_dir;
 * non-finite: none) */
static void step_num(Trainer *t, Buf *b, const char *key, const char *tag, double v) {
    json_num(b, key, v);
    tb_scalar(&t->tb, tag, v);
}

/* Gradient-norm spikes as the Llama 2 recipe tracks them: the running mean
 * r of the norm over the previous 20 steps; a spike is a norm above r + 0.1,
 * lasting until the norm is back below it, flagged only once 20 steps are
 * behind it (r over fewer is logged, not held against). Skipped steps do
 * not count. */
void track_spikes(Trainer *t, StepStats *s) {
    TrainState *st = &t->st;
    s->norm_mean = NAN;
    if (s->skipped || !isfinite(s->norm)) return;
    int n = st->norm_n < CKPT_SPIKE_WINDOW ? st->norm_n : CKPT_SPIKE_WINDOW;
    if (n > 0) {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += st->norm_hist[i];
        s->norm_mean = sum / n;
        s->spike = n == CKPT_SPIKE_WINDOW && s->norm > s->norm_mean + 0.1; /* flagged once the window is full */
    }
    if (s->spike) {
        st->spike_len++;
    } else if (st->spike_len > 0) {
        s->spike_ended = st->spike_len;
        st->spikes++;
        st->spike_len = 0;
    }
    st->norm_hist[st->norm_n % CKPT_SPIKE_WINDOW] = s->norm;
    st->norm_n++;
}

/* A step that ran faster than the CPU peak measured at start shows that
 * measurement read low (its quarter second shared the cores with something
 * else: on a 2-core VM once 119.6 GFLOP/s, against 228 in the runs before
 * and after), which would put MFU over 100%: measure again, once, and keep
 * the higher. (LLMTRAIN_FAULT kind=low_peak divides the peak by 10^4 at its
 * step: a measurement far too low.) */
static void check_peak(Trainer *t, int step, double gflops) {
    if (!t->peak_recheck || !(gflops > t->peak_gflops)) return;
    t->peak_recheck = 0;
    double was = t->peak_gflops, now = kernels_cpu_sgemm_peak_gflops(1);
    if (now > was) t->peak_gflops = now;
    if (is_root(t))
        printf("peak for MFU measured again after step %d, which ran at %.4g GFLOP/s a rank: %.4g GFLOP/s (measured "
               "sgemm; %.4g before)\n", step, gflops, t->peak_gflops, was);
}

void log_step(Trainer *t, const StepStats *s) {
    const Config *c = &t->cfg;
    double tokens = (double)s->batch * c->seq_len;
    double tps = tokens / s->dt;
    check_peak(t, s->step + 1, t->flops_per_token * tps / 1e9 / t->dist.world);
    double mfu = t->peak_gflops > 0 ? t->flops_per_token * tps / (t->peak_gflops * 1e9) / t->dist.world : NAN;
    /* mem: the device's memory on CUDA (the host's peak RSS also goes to
     * metrics), the process's peak RSS on the CPU */
    double host_mem = peak_rss_bytes(), gpu_mem = gpu_peak_bytes(t);
    double mem = gpu_mem >= 0 ? gpu_mem : host_mem;
    if (s->step > 0 || c->steps == 1) { t->train_time += s->dt; t->timed_seqs += s->batch; }
    /* time per sequence x the sequences left (a ramp's steps grow) */
    double per_seq = t->timed_seqs > 0 ? t->train_time / t->timed_seqs : s->dt / s->batch;
    uint64_t next = step_cursor(t, s->step + 1);
    char eta[32];
    fmt_duration(eta, sizeof eta, per_seq * (double)(t->end_cursor - next));
    if (!is_root(t)) return;
    if ((s->step + 1) % c->log_every == 0 || s->step + 1 == c->steps || s->skipped) {
        char comm[160] = ""; /* a world of one does not communicate */
        if (t->dist.world > 1) {
            const double kind[6] = {s->comm_ag, s->comm_rs, s->comm_ar, s->comm_tp + s->comm_tp_ag + s->comm_tp_rs, s->comm_cp,
                                    s->comm_ep};
            const char *name[6] = {"ag", "rs", "ar", "tp", "cp", "a2a"};
            double all = 0;
            for (int i = 0; i < 6; i++) all += kind[i];
            int n = snprintf(comm, sizeof comm, " | comm %.2f MB (", all / 1e6);
            const char *sep = "";
            for (int i = 0; i < 6; i++)
                if (kind[i] > 0) {
                    n += snprintf(comm + n, sizeof comm - (size_t)n, "%s%s %.2f", sep, name[i], kind[i] / 1e6);
                    sep = " ";
                }
            snprintf(comm + n, sizeof comm - (size_t)n, ") wait %.0f ms", 1000 * s->comm_wait);
        }
        char ck[48] = "", batch[32] = "", pn[48] = "", moe[96] = "";
        if (s->moe_layer_load)
            snprintf(moe, sizeof moe, " | aux %.3f load %.2f%s", s->moe_aux, s->moe_load,
                     c->moe_capacity_factor > 0 ? "" : "");
        if (s->moe_layer_load && c->moe_capacity_factor > 0)
            snprintf(moe + strlen(moe), sizeof moe - strlen(moe), " drop %.2f%%", 100 * s->moe_dropped / s->moe_routed);
        if (c->rampup_start) snprintf(batch, sizeof batch, " | batch %d", s->batch);
        if (c->log_param_norm) snprintf(pn, sizeof pn, " | pnorm %.2f", s->pnorm);
        if (s->ck_block > 0) snprintf(ck, sizeof ck, " | ckpt blocked %.0f ms", 1000 * s->ck_block);
        printf("step %5d/%d | loss %.4f%s | lr %.2e | norm %.3f%s%s%s%s | %.0f tok/s | MFU %.1f%% | mem %.2f GiB%s%s | %.0f ms%s | ETA %s%s\n",
               s->step + 1, c->steps, s->loss, moe, s->lr, s->norm, s->clipped ? "*" : "", s->spike ? " SPIKE" : "", pn, batch, tps, 100 * mfu,
               mem / (1 << 30), gpu_mem >= 0 ? " gpu" : "", comm, 1000 * s->dt, ck, eta, s->skipped ? " | SKIPPED (non-finite)" : "");
        if (isfinite(s->val_loss)) {
            printf("step %5d/%d | val_loss %.4f", s->step + 1, c->steps, s->val_loss);
            for (int i = 0; i < s->n_val_src; i++) printf("%s%.4f", i ? " " : " | by source ", s->val_src[i]);
            printf("\n");
        }
        fflush(stdout);
    }
    Buf line = {0}; /* the line, written whole (metrics_line) */
    double now = unix_time_s();
    buf_add(&line, "{\"step\":%d,\"time\":%.3f", s->step + 1, now);
    tb_begin(&t->tb, s->step + 1, now);
    step_num(t, &line, "loss", "train/loss", s->loss);
    step_num(t, &line, "lr", "train/lr", s->lr);
    step_num(t, &line, "grad_norm", "train/grad_norm", s->norm);
    if (s->moe_layer_load) { /* mixture of experts */
        step_num(t, &line, "moe_aux_loss", "moe/aux_loss", s->moe_aux);
        step_num(t, &line, "moe_z_loss", "moe/z_loss", s->moe_z);
        step_num(t, &line, "moe_load", "moe/load", s->moe_load);
        step_num(t, &line, "moe_dropped", "moe/dropped", s->moe_dropped);
        buf_add(&line, ",\"moe_layer_load\":[");
        for (int l = 0, n = 0; l < c->model.n_layer; l++)
            if (moe_layer(&c->model, l)) buf_add(&line, "%s%.6g", n++ ? "," : "", s->moe_layer_load[l]);
        buf_add(&line, "]");
    }
    if (c->log_param_norm) step_num(t, &line, "param_norm", "train/param_norm", s->pnorm);
    buf_add(&line, ",\"global_batch\":%d,\"consumed_samples\":%llu", s->batch, (unsigned long long)next);
    tb_scalar(&t->tb, "train/global_batch", s->batch);
    tb_scalar(&t->tb, "train/consumed_samples", (double)next);
    step_num(t, &line, "tokens_per_s", "perf/tokens_per_s", tps);
    step_num(t, &line, "mfu", "perf/mfu", mfu);
    step_num(t, &line, "mem_bytes", "memory/mem_bytes", mem);
    /* sharded: the working weights at their largest so far (shard_params_bytes,
     * plus the full-size array a debug.dump gathers) */
    if (t->sh.sharded)
        step_num(t, &line, "params_peak_bytes", "memory/params_peak_bytes",
                 shard_params_bytes(&t->sh, (double)t->sh.n_shard * sizeof(float)) + t->sh.full_peak);
    if (gpu_mem >= 0) {
        step_num(t, &line, "gpu_mem_bytes", "memory/gpu_mem_bytes", gpu_mem);
        step_num(t, &line, "host_mem_bytes", "memory/host_mem_bytes", host_mem);
    }
    step_num(t, &line, "step_ms", "perf/step_ms", 1000 * s->dt);
    buf_add(&line, ",\"clipped\":%s,\"skipped\":%s,\"nonfinite_total\":%d", s->clipped ? "true" : "false",
            s->skipped ? "true" : "false", t->st.nonfinite_total);
    tb_scalar(&t->tb, "train/nonfinite_total", t->st.nonfinite_total);
    if (isfinite(s->val_loss)) step_num(t, &line, "val_loss", "val/loss", s->val_loss);
    if (isfinite(s->val_loss) && s->n_val_src) {
        buf_add(&line, ",\"val_loss_sources\":[");
        for (int i = 0; i < s->n_val_src; i++) {
            char tag[32];
            snprintf(tag, sizeof tag, "val/loss_%d", i);
            tb_scalar(&t->tb, tag, s->val_src[i]);
            if (isfinite(s->val_src[i])) buf_add(&line, "%s%.9g", i ? "," : "", s->val_src[i]);
            else buf_add(&line, "%snull", i ? "," : "");
        }
        buf_add(&line, "]");
    }
    if (isfinite(s->norm_mean)) step_num(t, &line, "grad_norm_mean20", "train/grad_norm_mean20", s->norm_mean);
    buf_add(&line, ",\"grad_spike\":%s", s->spike ? "true" : "false");
    if (s->spike_ended) buf_add(&line, ",\"grad_spike_steps\":%d", s->spike_ended);
    if (s->ck_block > 0) step_num(t, &line, "ckpt_block_ms", "perf/ckpt_block_ms", 1000 * s->ck_block);
    if (t->dist.world > 1) step_num(t, &line, "comm_wait_ms", "perf/comm_wait_ms", 1000 * s->comm_wait);
    if (tb_write(&t->tb)) log_failed(t, t->tb.path, t->tb.err);
    buf_add(&line, ",\"comm_bytes\":{\"allgather\":%.0f,\"reduce_scatter\":%.0f,\"allreduce\":%.0f,\"tp_allreduce\":%.0f,"
               "\"tp_allgather\":%.0f,\"tp_reduce_scatter\":%.0f",
            s->comm_ag, s->comm_rs, s->comm_ar, s->comm_tp, s->comm_tp_ag, s->comm_tp_rs);
    if (t->dist.cp > 1) buf_add(&line, ",\"cp_sendrecv\":%.0f", s->comm_cp);
    if (t->dist.ep > 1) buf_add(&line, ",\"a2a\":%.0f", s->comm_ep);
    buf_add(&line, "}}\n");
    metrics_line(t, line.s);
    free(line.s);
}
