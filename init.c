/* init.c — init.from: a Hugging Face folder as the start of a run (its
 * model section, its weights), and the origin record (token ids, tokenizer
 * files) that the run's checkpoints carry for export. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "init.h"
#include "export.h"
#include "hf.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define PATH_BUF 4096

void init_from_model(Config *c, InitFrom *f, int rank) {
    memset(f, 0, sizeof *f);
    if (!c->init_from[0]) return;
    f->kind = INIT_HF;
    snprintf(f->dir, sizeof f->dir, "%s", c->init_from);
    ModelConfig hf;
    char note[1200];
    hf_read_config_note(c->init_from, &hf, note, sizeof note);
    if (note[0] && rank == 0) fprintf(stderr, "llmtrain: warning: %s\n", note);
    config_take_model(c, &hf, c->init_from);
}

void init_from_load(InitFrom *f, Model *m, Dist *d) {
    (void)d;
    hf_load_weights(m, f->dir);
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
    }
    if (tok) cJSON_AddItemToObject(o, "tokenizer", cJSON_Parse(tok));
    free(tok);
    free(c->origin_json);
    c->origin_json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(src);
}
