/* init.c — init.from: a Hugging Face folder or an llmtrain checkpoint as
 * the start of a run (its model section, its weights, the header line that
 * names them), and the origin record (token ids, tokenizer files) that the
 * run's checkpoints carry for export. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "init.h"
#include "export.h"
#include "hf.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PATH_BUF 4096

void init_from_model(Config *c, InitFrom *f, int rank) {
    memset(f, 0, sizeof *f);
    if (!c->init_from[0]) return;
    char path[PATH_BUF];
    snprintf(path, sizeof path, "%s/config.json", c->init_from);
    struct stat sb;
    if (stat(path, &sb) == 0) { /* a Hugging Face folder (config.json's reader names what is wrong with it) */
        f->kind = INIT_HF;
        snprintf(f->dir, sizeof f->dir, "%s", c->init_from);
        ModelConfig hf;
        char note[1200];
        hf_read_config_note(c->init_from, &hf, note, sizeof note);
        if (note[0] && rank == 0) fprintf(stderr, "llmtrain: warning: %s\n", note);
        config_take_model(c, &hf, path);
        return;
    }
    if (stat(c->init_from, &sb) != 0)
        die(EXIT_USAGE, "init.from: %s: cannot read (%s); expected a Hugging Face folder (config.json + model.safetensors) or an "
            "llmtrain checkpoint", c->init_from, strerror(errno));
    if (ckpt_resolve(c->init_from, f->dir, sizeof f->dir) != 0)
        die(EXIT_USAGE, "init.from: %s: neither a Hugging Face folder (no config.json) nor an llmtrain checkpoint (no manifest.json, "
            "no complete step_* folder)", c->init_from);
    f->kind = INIT_CKPT;
    char why[1400];
    CkptManifest *mf = ckpt_manifest_open(f->dir, why, sizeof why);
    if (!mf) die(EXIT_USAGE, "init.from: %s", why);
    snprintf(path, sizeof path, "%s/manifest.json", f->dir);
    Config old;
    config_load_string(&old, ckpt_manifest_config(mf), path);
    config_take_model(c, &old.model, path);
    config_free(&old);
    f->step = ckpt_manifest_state(mf)->step;
    f->layout = ckpt_manifest_layout(mf);
    if (ckpt_manifest_origin(mf)) f->origin = strdup(ckpt_manifest_origin(mf));
    ckpt_manifest_close(mf);
}

/* A checkpoint's weights: every rank checks every file's size, the ranks
 * split the checksum reading, and all agree before any rank loads. */
static void load_ckpt(InitFrom *f, Model *m, Dist *d) {
    char why[1400] = "";
    CkptManifest *mf = ckpt_manifest_open(f->dir, why, sizeof why);
    if (mf && (ckpt_manifest_verify(mf, d->rank, d->world, why, sizeof why) != 0 || ckpt_manifest_check(mf, m, why, sizeof why) != 0)) {
        ckpt_manifest_close(mf);
        mf = NULL;
    }
    double bad = mf == NULL;
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &bad, 1);
    if (!mf) die(EXIT_USAGE, "init.from: %s", why);
    if (bad > 0) {
        die_replicated(1); /* the rank that failed says why */
        die(EXIT_USAGE, "init.from: %s: another rank could not verify it", f->dir);
    }
    if (d->rank == 0 && !ckpt_manifest_sealed(mf))
        fprintf(stderr, "llmtrain: warning: %s/manifest.json is format llmtrain-checkpoint/2 (before manifests carried their own "
                        "checksum): its text is read unverified\n", f->dir);
    size_t *lo = malloc_check((size_t)m->n_chunks * sizeof(size_t)), *hi = malloc_check((size_t)m->n_chunks * sizeof(size_t));
    ckpt_full_ranges(m, lo, hi);
    float *host = malloc_check(m->n_params * sizeof(float));
    ckpt_manifest_load(mf, m, lo, hi, host, NULL, NULL); /* the master weights alone: the moments stay new */
    m->k->from_host(m->params, host, m->n_params * sizeof(float));
    free(host);
    free(lo);
    free(hi);
    ckpt_manifest_close(mf);
    f->n_tensors = m->n_specs;
    f->n_files = f->layout.world;
    snprintf(f->dtype, sizeof f->dtype, "F32");
}

void init_from_load(InitFrom *f, Model *m, Dist *d) {
    if (f->kind == INIT_CKPT) {
        load_ckpt(f, m, d);
        return;
    }
    HfLoaded got = hf_load_weights(m, f->dir);
    f->n_tensors = got.n_tensors;
    f->n_files = got.n_files;
    static const char *names[] = {[ST_F32] = "F32", [ST_BF16] = "BF16", [ST_F16] = "F16"};
    f->dtype[0] = '\0';
    for (int t = ST_F32; t <= ST_F16; t++)
        if (got.dtypes & (1u << t))
            snprintf(f->dtype + strlen(f->dtype), sizeof f->dtype - strlen(f->dtype), "%s%s", f->dtype[0] ? "+" : "", names[t]);
}

void init_from_describe(const InitFrom *f, char *out, size_t n) {
    if (f->kind == INIT_HF)
        snprintf(out, n, "init.from: %s | Hugging Face safetensors, %d file%s | %d tensors | %s", f->dir, f->n_files,
                 f->n_files == 1 ? "" : "s", f->n_tensors, f->dtype);
    else if (f->kind == INIT_CKPT)
        snprintf(out, n, "init.from: %s | llmtrain checkpoint of step %d, written by %d rank%s (tp %d x shard %d x replicate %d); "
                 "weights only: new optimizer state, step 0 | %d tensors | %s", f->dir, f->step, f->layout.world,
                 f->layout.world == 1 ? "" : "s", f->layout.tp,
                 f->layout.shard, f->layout.replicate, f->n_tensors, f->dtype);
    else
        snprintf(out, n, "init.from: none");
}

/* A token id as config.json gives it: a non-negative integer, or (an
 * eos_token_id) a list of them; anything else is no id. */
static int id_value(const cJSON *v) {
    if (cJSON_IsNumber(v)) return v->valuedouble >= 0 && v->valuedouble == (double)(long long)v->valuedouble;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0) return 0;
    for (const cJSON *e = v->child; e; e = e->next)
        if (!id_value(e) || cJSON_IsArray(e)) return 0;
    return 1;
}

void init_origin(Config *c, const InitFrom *f) {
    cJSON *o = cJSON_CreateObject(), *src = NULL;
    char from[PATH_BUF + 32] = "";
    if (f->kind == INIT_HF) {
        char path[PATH_BUF];
        snprintf(path, sizeof path, "%s/config.json", f->dir);
        size_t len;
        char *text = read_text_file(path, &len);
        src = text ? cJSON_ParseWithLength(text, len) : NULL;
        free(text);
        snprintf(from, sizeof from, "init.from %s", path);
    } else if (f->kind == INIT_CKPT && f->origin) {
        src = cJSON_Parse(f->origin);
        const cJSON *was = cJSON_GetObjectItemCaseSensitive(src, "ids_from");
        snprintf(from, sizeof from, "init.from %s (%s)", f->dir, cJSON_IsString(was) ? was->valuestring : "its record");
    }
    const char *key[2] = {"bos_token_id", "eos_token_id"};
    int have = 0, eod = 0;
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, key[i]);
        if (id_value(v)) {
            cJSON_AddItemToObject(o, key[i], cJSON_Duplicate(v, 1));
            have = 1;
        } else if (c->eod_token >= 0) { /* the documents' separator: GPT-2's <|endoftext|> is both */
            cJSON_AddNumberToObject(o, key[i], c->eod_token);
            eod = 1;
        }
    }
    if (have || eod)
        cJSON_AddStringToObject(o, "ids_from", have && eod ? "init.from and data.eod_token" : have ? from : "data.eod_token");
    char *tok = NULL;
    if (c->data_tokenizer[0]) {
        tok = export_tokenizer_record(c->data_tokenizer, "data.tokenizer");
        if (!tok)
            die(EXIT_USAGE, "%s: data.tokenizer %s: no tokenizer file there (expected any of " EXPORT_TOKENIZER_NAMES ")", c->path,
                c->data_tokenizer);
    } else if (f->kind == INIT_HF) {
        tok = export_tokenizer_record(f->dir, "init.from");
    } else if (f->kind == INIT_CKPT) { /* carried on: export checks the files are still the ones recorded */
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(src, "tokenizer");
        if (cJSON_IsObject(t)) tok = cJSON_PrintUnformatted(t);
    }
    if (tok) cJSON_AddItemToObject(o, "tokenizer", cJSON_Parse(tok));
    free(tok);
    free(c->origin_json);
    c->origin_json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(src);
}

void init_from_free(InitFrom *f) {
    free(f->origin);
    f->origin = NULL;
}
