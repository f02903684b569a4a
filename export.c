/* export.c — writes Hugging Face folders: `llmtrain export` of a checkpoint
 * of any layout, and the debug dumps. A tensor at a time (peak memory about
 * the largest tensor, not the model), F32 or BF16, one model.safetensors or
 * Hugging Face's shards and model.safetensors.index.json, config.json and
 * generation_config.json with the run's token ids, and the tokenizer files
 * the run's origin record names, copied only when they are still the bytes
 * the run recorded. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "export.h"
#include "ckpt.h"
#include "hf.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <strings.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_BUF 4096

static void join(char *out, size_t n, const char *dir, const char *name) {
    int w = snprintf(out, n, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= n) die(EXIT_USAGE, "%s/%s: path too long", dir, name);
}

/* ---- config.json and generation_config.json ---- */

/* Shortest decimal that reads back as the same float, so config.json says
 * 1e-05 rather than 9.99999974737875e-06. */
static cJSON *json_float(float x) {
    char s[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, (double)x);
        if (strtof(s, NULL) == x) break;
    }
    return cJSON_CreateNumber(strtod(s, NULL));
}

/* bos_token_id and eos_token_id: the origin record's (init.from's
 * config.json, or data.eod_token), else the ids transformers would
 * otherwise assume (GPT-2's 50256, Llama's 1 and 2) only where they lie
 * inside the vocabulary: GPT-2's <|endoftext|>, else none. */
static void add_ids(cJSON *o, const Model *m, const cJSON *origin) {
    const char *key[2] = {"bos_token_id", "eos_token_id"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(origin, key[i]);
        if (v) cJSON_AddItemToObject(o, key[i], cJSON_Duplicate(v, 1));
        else if (m->cfg.arch == ARCH_GPT2 && m->cfg.vocab_size > 50256) cJSON_AddNumberToObject(o, key[i], 50256);
        else cJSON_AddNullToObject(o, key[i]);
    }
}

/* A mixture-of-experts model's architecture and keys: Mixtral's, or with
 * QK-norm Qwen3-MoE's (hf_moe_qwen); export_check has refused what
 * neither can say. */
static void moe_config_json(cJSON *o, cJSON *arch, const ModelConfig *c) {
    if (hf_moe_qwen(c)) {
        cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen3MoeForCausalLM"));
        cJSON_AddStringToObject(o, "model_type", "qwen3_moe");
        cJSON_AddNumberToObject(o, "num_experts", c->moe_experts);
        cJSON_AddNumberToObject(o, "moe_intermediate_size", c->moe_ffn_hidden);
        cJSON_AddBoolToObject(o, "norm_topk_prob", c->moe_norm_topk);
        cJSON_AddNumberToObject(o, "decoder_sparse_step", c->moe_layer_freq);
        cJSON *dl = cJSON_AddArrayToObject(o, "mlp_only_layers");
        for (int l = 0; l < c->n_layer; l++)
            if (!moe_layer(c, l) && (l + 1) % c->moe_layer_freq == 0) cJSON_AddItemToArray(dl, cJSON_CreateNumber(l));
    } else {
        cJSON_AddItemToArray(arch, cJSON_CreateString("MixtralForCausalLM"));
        cJSON_AddStringToObject(o, "model_type", "mixtral");
        cJSON_AddNumberToObject(o, "num_local_experts", c->moe_experts);
        cJSON_AddNullToObject(o, "sliding_window");
    }
    cJSON_AddNumberToObject(o, "num_experts_per_tok", c->moe_top_k);
    if (c->router_aux_set) cJSON_AddItemToObject(o, "router_aux_loss_coef", json_float(c->router_aux_loss_coef));
}

static cJSON *config_json(const Model *m, const cJSON *origin, int bf16) {
    const ModelConfig *c = &m->cfg;
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    if (c->arch == ARCH_GPT2) {
        cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
        cJSON_AddStringToObject(o, "model_type", "gpt2");
        cJSON_AddNumberToObject(o, "n_layer", c->n_layer);
        cJSON_AddNumberToObject(o, "n_embd", c->n_embd);
        cJSON_AddNumberToObject(o, "n_head", c->n_head);
        cJSON_AddNullToObject(o, "n_inner");
        cJSON_AddNumberToObject(o, "n_positions", c->max_seq_len);
        cJSON_AddNumberToObject(o, "n_ctx", c->max_seq_len);
        cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
        cJSON_AddItemToObject(o, "layer_norm_epsilon", json_float(c->norm_eps));
        cJSON_AddStringToObject(o, "activation_function", "gelu_new");
        cJSON_AddTrueToObject(o, "tie_word_embeddings");
    } else {
        if (m->moe.on) moe_config_json(o, arch, c);
        else { /* QK-norm: Qwen3's model (Llama's blocks, q_norm and k_norm) */
            cJSON_AddItemToArray(arch, cJSON_CreateString(c->qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM"));
            cJSON_AddStringToObject(o, "model_type", c->qk_norm ? "qwen3" : "llama");
        }
        cJSON_AddNumberToObject(o, "hidden_size", c->n_embd);
        cJSON_AddNumberToObject(o, "intermediate_size", m->moe.on && !hf_moe_qwen(c) ? c->moe_ffn_hidden : c->ffn_hidden);
        cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layer);
        cJSON_AddNumberToObject(o, "num_attention_heads", c->n_head);
        cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_kv_head);
        cJSON_AddNumberToObject(o, "head_dim", m->hd);
        cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
        cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_seq_len);
        cJSON_AddItemToObject(o, "rms_norm_eps", json_float(c->norm_eps));
        cJSON_AddItemToObject(o, "rope_theta", json_float(c->rope_theta));
        if (c->rope_scaling == ROPE_LINEAR) {
            cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
            cJSON_AddStringToObject(rs, "rope_type", "linear");
            cJSON_AddItemToObject(rs, "factor", json_float(c->rope_scaling_factor));
        } else if (c->rope_scaling == ROPE_YARN) {
            cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
            cJSON_AddStringToObject(rs, "rope_type", "yarn");
            cJSON_AddItemToObject(rs, "factor", json_float(c->rope_scaling_factor));
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max_seq_len);
            /* the rest only where not Hugging Face's defaults (ours too), so a
             * folder read in writes back its own rope_scaling */
            ModelConfig d;
            config_model_defaults(&d);
            if (c->rope_beta_fast != d.rope_beta_fast) cJSON_AddItemToObject(rs, "beta_fast", json_float(c->rope_beta_fast));
            if (c->rope_beta_slow != d.rope_beta_slow) cJSON_AddItemToObject(rs, "beta_slow", json_float(c->rope_beta_slow));
            if (c->rope_attention_factor > 0)
                cJSON_AddItemToObject(rs, "attention_factor", json_float(c->rope_attention_factor));
            if (!c->rope_truncate) cJSON_AddFalseToObject(rs, "truncate");
        } else if (c->rope_scaling == ROPE_LLAMA3) {
            cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
            cJSON_AddStringToObject(rs, "rope_type", "llama3");
            cJSON_AddItemToObject(rs, "factor", json_float(c->rope_scaling_factor));
            cJSON_AddItemToObject(rs, "low_freq_factor", json_float(c->rope_low_freq_factor));
            cJSON_AddItemToObject(rs, "high_freq_factor", json_float(c->rope_high_freq_factor));
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max_seq_len);
        } else {
            cJSON_AddNullToObject(o, "rope_scaling");
        }
        cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_embeddings);
        cJSON_AddStringToObject(o, "hidden_act", "silu");
        cJSON_AddFalseToObject(o, "attention_bias");
        if (c->qk_norm) {
            cJSON_AddFalseToObject(o, "use_sliding_window");
            cJSON_AddNullToObject(o, "sliding_window");
        } else {
            cJSON_AddFalseToObject(o, "mlp_bias");
        }
    }
    add_ids(o, m, origin);
    cJSON_AddStringToObject(o, "torch_dtype", bf16 ? "bfloat16" : "float32");
    return o;
}

static void write_json(const char *dir, const char *name, cJSON *o) {
    char path[PATH_BUF];
    join(path, sizeof path, dir, name);
    char *text = cJSON_Print(o);
    hf_write_file(path, text, strlen(text), 1);
    cJSON_free(text);
}

/* ---- tokenizer files ---- */

static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                                               "vocab.json", "merges.txt", "added_tokens.json"};

char *export_tokenizer_record(const char *dir, const char *from) {
    char abs[PATH_BUF];
    if (!realpath(dir, abs)) die(EXIT_USAGE, "%s: %s: cannot read (%s); expected a folder holding a Hugging Face tokenizer", from, dir, strerror(errno));
    cJSON *o = cJSON_CreateObject(), *files = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "dir", abs);
    cJSON_AddStringToObject(o, "from", from);
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof TOKENIZER_FILES[0]; i++) {
        char path[PATH_BUF];
        join(path, sizeof path, abs, TOKENIZER_FILES[i]);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        size_t len;
        char *data = read_text_file(path, &len);
        if (!data) die(EXIT_USAGE, "%s: %s: cannot read (%s)", from, path, read_text_why());
        CkptHash h;
        ckpt_hash_init(&h);
        ckpt_hash_update(&h, data, len);
        free(data);
        char sum[17];
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)ckpt_hash_final(&h));
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", TOKENIZER_FILES[i]);
        cJSON_AddNumberToObject(f, "bytes", (double)len);
        cJSON_AddStringToObject(f, "checksum", sum);
        cJSON_AddItemToArray(files, f);
    }
    char *text = NULL;
    if (cJSON_GetArraySize(files) > 0) {
        cJSON_AddItemToObject(o, "files", files);
        text = cJSON_PrintUnformatted(o);
    } else {
        cJSON_Delete(files);
    }
    cJSON_Delete(o);
    return text;
}

/* Copy each file the record lists from its folder, only if it is still
 * the size and checksum the run recorded (user_dir: the record of a folder
 * named on the command line: whatever is there). */
static int copy_tokenizer(const cJSON *tok, const char *out_dir, int user_dir) {
    const cJSON *dir = cJSON_GetObjectItemCaseSensitive(tok, "dir"), *files = cJSON_GetObjectItemCaseSensitive(tok, "files");
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(tok, "from");
    if (!cJSON_IsString(dir) || !cJSON_IsArray(files))
        die(EXIT_USAGE, "export: the checkpoint's origin.tokenizer: expected dir and files (damaged?)");
    const char *hint = "pass --tokenizer DIR to copy them from another folder, or --tokenizer none to export without them";
    int n = 0;
    for (const cJSON *f = files->child; f; f = f->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name"), *bytes = cJSON_GetObjectItemCaseSensitive(f, "bytes"),
                    *sum = cJSON_GetObjectItemCaseSensitive(f, "checksum");
        if (!cJSON_IsString(name) || strchr(name->valuestring, '/') || !cJSON_IsNumber(bytes) || !cJSON_IsString(sum))
            die(EXIT_USAGE, "export: the checkpoint's origin.tokenizer.files: expected name, bytes and checksum (damaged?)");
        char src[PATH_BUF], dst[PATH_BUF];
        join(src, sizeof src, dir->valuestring, name->valuestring);
        join(dst, sizeof dst, out_dir, name->valuestring);
        size_t len;
        char *data = read_text_file(src, &len);
        if (!data && user_dir) die(EXIT_USAGE, "export: --tokenizer: %s: cannot read (%s)", src, read_text_why());
        if (!data)
            die(EXIT_USAGE, "export: %s: cannot read (%s); the run recorded it as its tokenizer (%s): %s", src, read_text_why(),
                cJSON_IsString(from) ? from->valuestring : "?", hint);
        CkptHash h;
        ckpt_hash_init(&h);
        ckpt_hash_update(&h, data, len);
        char got[17];
        snprintf(got, sizeof got, "%016llx", (unsigned long long)ckpt_hash_final(&h));
        if (!user_dir && ((double)len != bytes->valuedouble || strcmp(got, sum->valuestring) != 0))
            die(EXIT_USAGE, "export: %s: %zu bytes, checksum %s, but the run recorded %.0f bytes, checksum %s: it changed since the "
                "run's tokenizer was recorded; %s", src, len, got, bytes->valuedouble, sum->valuestring, hint);
        hf_write_file(dst, data, len, 0);
        free(data);
        n++;
    }
    return n;
}

/* ---- the sharded layout ---- */

typedef struct Part { HfPart p; int spec, shard; uint64_t bytes; } Part;

static int is_shard_name(const char *s) {
    unsigned a, b;
    int end = 0;
    return sscanf(s, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && s[end] == '\0';
}

static void remove_file(const char *dir, const char *name) {
    char path[PATH_BUF];
    join(path, sizeof path, dir, name);
    if (unlink(path) != 0 && errno != ENOENT) die(EXIT_IO, "%s: cannot remove (%s)", path, strerror(errno));
}

/* What another layout left in dir: the index, and shards not in this
 * export's set (keep_shards: this export's count of them, 0 for none). */
static void remove_stale(const char *dir, int single, int keep_shards) {
    char path[PATH_BUF];
    remove_file(dir, "model.safetensors.index.json");
    DIR *d = opendir(dir);
    if (!d) die(EXIT_IO, "%s: cannot list (%s)", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_shard_name(e->d_name)) continue;
        unsigned a, b;
        sscanf(e->d_name, "model-%5u-of-%5u.safetensors", &a, &b);
        if (!single && (int)b == keep_shards && a >= 1 && (int)a <= keep_shards) continue;
        join(path, sizeof path, dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT) die(EXIT_IO, "%s: cannot remove (%s)", path, strerror(errno));
    }
    closedir(d);
}

static void shard_name(char *out, size_t n, int i, int of) {
    if (of == 1) snprintf(out, n, "model.safetensors");
    else snprintf(out, n, "model-%05d-of-%05d.safetensors", i + 1, of);
}

const char *export_refusal(const Model *m, char *why, size_t n) {
    const ModelConfig *c = &m->cfg;
    if (!m->moe.on) return NULL;
    if (c->moe_shared_experts)
        snprintf(why, n, "model.moe_shared_experts %d: neither Mixtral nor Qwen3-MoE has shared experts (no Hugging Face "
                 "architecture to write; keep the llmtrain checkpoint)", c->moe_shared_experts);
    else if (!hf_moe_qwen(c) && (m->moe.n_layers < c->n_layer || !c->moe_norm_topk))
        snprintf(why, n, "an MoE model with %s is written as Qwen3-MoE, which needs model.qk_norm (Mixtral has every layer "
                 "MoE and renormalised top-k weights)", m->moe.n_layers < c->n_layer ? "dense layers" : "model.moe_norm_topk false");
    else return NULL;
    return why;
}

/* What no Hugging Face architecture export writes can hold: one line, exit 2. */
static void export_check(const Model *m) {
    char why[300];
    if (export_refusal(m, why, sizeof why)) die(EXIT_USAGE, "export: %s", why);
}

int export_hf(const Model *m, ExportReadFn read, void *ctx, const ExportOpts *o, const char *dir) {
    export_check(m);
    if (mkdir_p_durable(dir) != 0) die(EXIT_IO, "%s: cannot create directory (%s)", dir, strerror(errno));
    cJSON *origin = o->origin_json ? cJSON_Parse(o->origin_json) : NULL;
    int dtype = o->bf16 ? ST_BF16 : ST_F32;
    size_t esize = o->bf16 ? 2 : 4;
    /* the plan: every HF tensor, in order, and the shard it goes to (a new
     * one where it would take the current one past the size; a tensor
     * larger than the size alone in its own, as Hugging Face does) */
    size_t most_parts = (size_t)hf_parts_max(m);
    Part *parts = malloc_check((size_t)m->n_specs * most_parts * sizeof *parts);
    HfPart *hp = malloc_check(most_parts * sizeof *hp);
    int np = 0, n_shards = 1;
    uint64_t in_shard = 0, total = 0;
    size_t most = 0, most_t = 0;
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        int k = hf_parts(m, s, "transformer.", hp);
        most = s->numel > most ? s->numel : most;
        for (int j = 0; j < k; j++) {
            Part *p = &parts[np++];
            p->p = hp[j];
            p->spec = i;
            p->bytes = (uint64_t)hp[j].rows * hp[j].cols * esize;
            if (hp[j].transpose) most_t = s->numel > most_t ? s->numel : most_t;
            if (o->max_shard_bytes && in_shard > 0 && in_shard + p->bytes > o->max_shard_bytes) {
                n_shards++;
                in_shard = 0;
            }
            p->shard = n_shards - 1;
            in_shard += p->bytes;
            total += p->bytes;
        }
    }
    StWriter *w = calloc_check((size_t)n_shards, sizeof *w);
    for (int j = 0; j < np; j++) st_writer_add_as(&w[parts[j].shard], parts[j].p.name, parts[j].p.ndim, parts[j].p.shape, dtype, NULL);
    /* the folder is complete again only once config.json is written, last;
     * shards go in under a new index only, and a single file (which
     * loaders prefer to an index) must not stand beside one */
    remove_file(dir, "config.json");
    if (n_shards > 1) {
        remove_file(dir, "model.safetensors");
        remove_stale(dir, 0, n_shards);
    }
    float *buf = malloc_check((most ? most : 1) * sizeof(float)), *tbuf = most_t ? malloc_check(most_t * sizeof(float)) : NULL;
    char name[64], path[PATH_BUF];
    int cur = -1;
    for (int i = 0, j = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        const float *src = read(ctx, s, buf);
        for (; j < np && parts[j].spec == i; j++) {
            const HfPart *p = &parts[j].p;
            if (parts[j].shard != cur) {
                if (cur >= 0) st_writer_end(&w[cur]);
                cur = parts[j].shard;
                shard_name(name, sizeof name, cur, n_shards);
                join(path, sizeof path, dir, name);
                st_writer_begin(&w[cur], path, "{\"format\":\"pt\"}");
            }
            const float *v = src + p->row0 * p->cols;
            if (p->transpose) {
                hf_transpose(tbuf, v, p->rows, p->cols);
                v = tbuf;
            }
            st_writer_put(&w[cur], v);
        }
    }
    if (cur >= 0) st_writer_end(&w[cur]);
    free(buf);
    free(tbuf);
    if (n_shards > 1) { /* the index last: a folder with it is complete */
        cJSON *idx = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(idx, "metadata"), *wm = cJSON_AddObjectToObject(idx, "weight_map");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        for (int j = 0; j < np; j++) {
            shard_name(name, sizeof name, parts[j].shard, n_shards);
            cJSON_AddStringToObject(wm, parts[j].p.name, name);
        }
        write_json(dir, "model.safetensors.index.json", idx);
        cJSON_Delete(idx);
    } else {
        remove_stale(dir, 1, 0);
    }
    cJSON *gen = cJSON_CreateObject();
    add_ids(gen, m, origin);
    write_json(dir, "generation_config.json", gen);
    cJSON_Delete(gen);
    cJSON *cfg = config_json(m, origin, o->bf16);
    write_json(dir, "config.json", cfg);
    cJSON_Delete(cfg);
    for (int i = 0; i < n_shards; i++) st_writer_free(&w[i]);
    free(w);
    free(parts);
    free(hp);
    cJSON_Delete(origin);
    return n_shards;
}

static const float *read_flat(void *ctx, const ParamSpec *s, float *buf) {
    (void)buf;
    return (const float *)ctx + s->offset;
}

void hf_export(const Model *m, const float *flat, const char *dir) {
    ExportOpts o = {0};
    export_hf(m, read_flat, (void *)flat, &o, dir);
}

/* ---- llmtrain export ---- */

/* "5GB", "500MB", "2GiB", "123" (bytes); 0: one file. -1 when not a size. */
static double parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return -1;
    static const struct { const char *suf; double mul; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].suf) == 0) return v * units[i].mul;
    return -1;
}

static const float *read_ckpt(void *ctx, const ParamSpec *s, float *buf) {
    ckpt_tensor_read(ctx, s, 0, buf);
    return buf;
}

int export_main(int argc, char **argv) {
    const char *usage = "usage: llmtrain export CHECKPOINT_DIR OUT_DIR [--dtype fp32|bf16] [--max-shard-size SIZE (e.g. 5GB, 0: one file)] "
                        "[--tokenizer DIR|none]";
    const char *pos[2] = {NULL, NULL}, *tok_dir = NULL;
    int npos = 0, bf16 = 0;
    double shard = 5e9; /* Hugging Face's save_pretrained default */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL, *eq = strchr(a, '=');
        char key[32] = "";
        if (strncmp(a, "--", 2) == 0) {
            size_t kl = eq ? (size_t)(eq - a) : strlen(a);
            if (kl >= sizeof key) die(EXIT_USAGE, "export: unknown option '%s' (%s)", a, usage);
            memcpy(key, a, kl);
            key[kl] = '\0';
            if (eq) v = eq + 1;
            else if (i + 1 < argc) v = argv[++i];
            else die(EXIT_USAGE, "export: %s: expected a value after it (%s)", key, usage);
        }
        if (!key[0]) {
            if (npos == 2) die(EXIT_USAGE, "export: unexpected argument '%s' (%s)", a, usage);
            pos[npos++] = a;
        } else if (strcmp(key, "--dtype") == 0) {
            if (strcmp(v, "bf16") == 0) bf16 = 1;
            else if (strcmp(v, "fp32") == 0) bf16 = 0;
            else die(EXIT_USAGE, "export: --dtype: expected fp32 or bf16, got '%s'", v);
        } else if (strcmp(key, "--max-shard-size") == 0) {
            shard = parse_size(v);
            if (shard < 0 || shard > 1.8e19)
                die(EXIT_USAGE, "export: --max-shard-size: expected a size such as 5GB, 500MB, 2GiB or a number of bytes (0: one file), got '%s'", v);
        } else if (strcmp(key, "--tokenizer") == 0) {
            tok_dir = v;
        } else {
            die(EXIT_USAGE, "export: unknown option '%s' (%s)", key, usage);
        }
    }
    if (npos != 2) die(EXIT_USAGE, "%s", usage);
    char step_dir[2048], why[1400];
    if (ckpt_resolve(pos[0], step_dir, sizeof step_dir) != 0)
        die(EXIT_USAGE, "export: %s: no complete checkpoint found (expected a step folder with manifest.json, or a root holding step_* folders)", pos[0]);
    CkptManifest *mf = ckpt_manifest_open(step_dir, why, sizeof why);
    if (!mf || ckpt_manifest_verify(mf, 0, 1, why, sizeof why) != 0) die(EXIT_USAGE, "export: %s", why);
    Config c;
    config_load_string(&c, ckpt_manifest_config(mf), step_dir);
    Model m; /* the global (tp = 1) layout: any written layout is reassembled into it */
    model_layout(&m, &c.model, 1, 1, 0);
    if (ckpt_manifest_check(mf, &m, why, sizeof why) != 0) die(EXIT_USAGE, "export: %s", why);
    if (!ckpt_manifest_sealed(mf))
        fprintf(stderr, "llmtrain: warning: %s/manifest.json is format llmtrain-checkpoint/2 (before manifests carried their own checksum): "
                        "its text is read unverified\n", step_dir);
    const char *origin = ckpt_manifest_origin(mf);
    /* the tokenizer first: a missing or changed file fails before the weights are written */
    cJSON *or = origin ? cJSON_Parse(origin) : NULL;
    cJSON *tok = NULL;
    int user = tok_dir && strcmp(tok_dir, "none") != 0;
    if (user) {
        char *rec = export_tokenizer_record(tok_dir, "--tokenizer");
        if (!rec) die(EXIT_USAGE, "export: --tokenizer %s: no tokenizer file there (expected any of %s)", tok_dir, EXPORT_TOKENIZER_NAMES);
        tok = cJSON_Parse(rec);
        free(rec);
    } else if (!tok_dir) {
        tok = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(or, "tokenizer"), 1);
    }
    if (mkdir_p_durable(pos[1]) != 0) die(EXIT_IO, "%s: cannot create directory (%s)", pos[1], strerror(errno));
    int n_tok = tok ? copy_tokenizer(tok, pos[1], user) : 0;
    CkptTensorReader *r = ckpt_tensor_reader(mf, &m);
    ExportOpts o = {bf16, (uint64_t)shard, origin};
    int files = export_hf(&m, read_ckpt, r, &o, pos[1]);
    ckpt_tensor_reader_free(r);
    CkptLayout L = ckpt_manifest_layout(mf);
    char tk[PATH_BUF + 64] = "no tokenizer files";
    if (n_tok) snprintf(tk, sizeof tk, "%d tokenizer file%s from %s", n_tok, n_tok == 1 ? "" : "s",
                        cJSON_GetObjectItemCaseSensitive(tok, "dir")->valuestring);
    else if (!origin) snprintf(tk, sizeof tk, "no tokenizer files (the checkpoint predates origin records)");
    char sh[96] = "model.safetensors";
    if (files > 1) snprintf(sh, sizeof sh, "%d shards of at most %.0f bytes + index", files, shard);
    printf("exported %s (step %d, written by %d rank%s: tp %d x shard %d x replicate %d) -> %s | %s, %s | %s\n", step_dir,
           ckpt_manifest_state(mf)->step, L.world, L.world == 1 ? "" : "s", L.tp, L.shard, L.replicate, pos[1], bf16 ? "bf16" : "fp32", sh, tk);
    cJSON_Delete(tok);
    cJSON_Delete(or);
    model_free(&m);
    ckpt_manifest_close(mf);
    config_free(&c);
    return EXIT_OK;
}
