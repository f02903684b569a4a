/* hf.c — safetensors (reader and writer) and the Hugging Face GPT-2 /
 * Llama folders: config.json and the tensor name mapping, read for
 * init.from. Writing a whole folder (export) is export.c's; training
 * checkpoints live in ckpt.c. */
#ifndef _GNU_SOURCE /* mmap, nftw, fsync under -std=c11; guarded so -D_GNU_SOURCE also works */
#define _GNU_SOURCE
#endif
#include "hf.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_BUF 4096
#define HF_CTX "init.from: " /* HF folders are only ever read for init.from */

/* ======================================================================
 * small helpers
 * ====================================================================== */

static void join_path(char *out, size_t n, const char *dir, const char *name) {
    int w = snprintf(out, n, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= n) die(EXIT_USAGE, "%s/%s: path too long", dir, name);
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A rename or create is only durable once its directory entry is synced. */
static void fsync_parent(const char *path) {
    if (sync_parent(path) != 0) die(EXIT_IO, "%s: cannot sync its directory (%s)", path, strerror(errno));
}

/* rm -rf for our own half-written folders. */
static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

static bool same_shape(const StTensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d < 9007199254740992.0) || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

/* ======================================================================
 * safetensors reader
 * ====================================================================== */

static const struct { const char *name; size_t size; } ST_DTYPES[] = {
    [ST_F32] = {"F32", 4}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4},
};
#define ST_NDTYPES ((int)(sizeof ST_DTYPES / sizeof ST_DTYPES[0]))

static int st_dtype_of(const char *s) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(ST_DTYPES[i].name, s) == 0) return i;
    return -1;
}

/* Validate one header entry against the data section of data_len bytes. */
static void st_parse_entry(const StFile *f, const cJSON *e, StTensor *t, size_t data_len, const char *ctx) {
    const char *name = e->string;
    if (strlen(name) >= sizeof t->name)
        die(EXIT_USAGE, "%s%s: tensor name too long (%zu chars): %.60s...", ctx, f->path, strlen(name), name);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!cJSON_IsObject(e)) die(EXIT_USAGE, "%s%s: tensor %s: header entry is not an object", ctx, f->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) die(EXIT_USAGE, "%s%s: tensor %s: missing dtype", ctx, f->path, name);
    t->dtype = st_dtype_of(dt->valuestring);
    if (t->dtype < 0)
        die(EXIT_USAGE, "%s%s: tensor %s: unsupported dtype %s (F32, BF16, F16, I64, I32)", ctx, f->path, name, dt->valuestring);
    if (!cJSON_IsArray(sh)) die(EXIT_USAGE, "%s%s: tensor %s: missing shape", ctx, f->path, name);
    t->ndim = cJSON_GetArraySize(sh);
    if (t->ndim > 4) die(EXIT_USAGE, "%s%s: tensor %s: %d dimensions (at most 4 supported)", ctx, f->path, name, t->ndim);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        if (!json_uint(cJSON_GetArrayItem(sh, i), &d))
            die(EXIT_USAGE, "%s%s: tensor %s: shape entry %d is not a non-negative integer", ctx, f->path, name, i);
        if (d && numel > UINT64_MAX / 16 / d) die(EXIT_USAGE, "%s%s: tensor %s: shape too large", ctx, f->path, name);
        numel *= d;
        t->shape[i] = (int64_t)d;
    }
    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(cJSON_GetArrayItem(off, 0), &b) ||
        !json_uint(cJSON_GetArrayItem(off, 1), &en))
        die(EXIT_USAGE, "%s%s: tensor %s: data_offsets must be [begin, end]", ctx, f->path, name);
    if (b > en || en > data_len)
        die(EXIT_USAGE, "%s%s: tensor %s: data_offsets [%llu, %llu] outside the data section (%zu bytes; file truncated?)",
            ctx, f->path, name, (unsigned long long)b, (unsigned long long)en, data_len);
    if (en - b != numel * ST_DTYPES[t->dtype].size) {
        char s[128];
        shape_str(s, sizeof s, t->ndim, t->shape);
        die(EXIT_USAGE, "%s%s: tensor %s: %llu bytes for shape %s of %s (expected %llu)", ctx, f->path, name,
            (unsigned long long)(en - b), s, ST_DTYPES[t->dtype].name, (unsigned long long)(numel * ST_DTYPES[t->dtype].size));
    }
    t->begin = (size_t)b;
    t->end = (size_t)en;
}

static void st_map(StFile *f, const char *path, const char *ctx) {
    memset(f, 0, sizeof *f);
    if (strlen(path) >= sizeof f->path) die(EXIT_USAGE, "%s%s: path too long", ctx, path);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO's open would wait for a writer: refused below */
    if (fd < 0) die(EXIT_USAGE, "%s%s: cannot open (%s)", ctx, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) die(EXIT_USAGE, "%s%s: cannot stat (%s)", ctx, path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) die(EXIT_USAGE, "%s%s: not a regular file (expected a safetensors file)", ctx, path);
    if (sb.st_size < 8) die(EXIT_USAGE, "%s%s: %lld bytes is too short for a safetensors file", ctx, path, (long long)sb.st_size);
    f->map_len = (size_t)sb.st_size;
    void *p = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) die(EXIT_USAGE, "%s%s: cannot mmap (%s)", ctx, path, strerror(errno));
    f->map = p;
}

static void st_open_ctx(StFile *f, const char *path, const char *ctx) {
    st_map(f, path, ctx);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i]; /* little-endian u64 */
    if (hlen > f->map_len - 8)
        die(EXIT_USAGE, "%s%s: header length %llu runs past the end of the file (%zu bytes; truncated or not safetensors)",
            ctx, path, (unsigned long long)hlen, f->map_len);
    cJSON *root = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) die(EXIT_USAGE, "%s%s: header is not a JSON object (not a safetensors file?)", ctx, path);
    f->data = f->map + 8 + hlen;
    size_t data_len = f->map_len - 8 - (size_t)hlen;
    f->t = calloc_check((size_t)cJSON_GetArraySize(root), sizeof *f->t);
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        if (st_find(f, e->string)) die(EXIT_USAGE, "%s%s: tensor %s appears twice in the header", ctx, path, e->string);
        st_parse_entry(f, e, &f->t[f->n], data_len, ctx);
        f->n++;
    }
    cJSON_Delete(root);
}

void st_open(StFile *f, const char *path) { st_open_ctx(f, path, ""); }

const StTensor *st_find(const StFile *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: exactly mant * 2^-24 */
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    uint32_t bits = sign | (exp == 0x1f ? 0x7f800000u | (mant << 13) : ((exp + 112) << 23) | (mant << 13));
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

void st_read_f32(const StFile *f, const StTensor *t, float *out) {
    const unsigned char *src = f->data + t->begin;
    size_t n = (t->end - t->begin) / ST_DTYPES[t->dtype].size;
    switch (t->dtype) {
    case ST_F32:
        memcpy(out, src, n * 4); /* the format and every host we target are little-endian */
        break;
    case ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = ((uint32_t)src[2 * i] | (uint32_t)src[2 * i + 1] << 8) << 16; /* bf16 = top half of fp32 */
            memcpy(&out[i], &bits, 4);
        }
        break;
    case ST_F16:
        for (size_t i = 0; i < n; i++) out[i] = half_to_float((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        break;
    default:
        die(EXIT_USAGE, "%s: tensor %s has dtype %s, expected a floating-point type (F32, BF16, F16)", f->path, t->name,
            ST_DTYPES[t->dtype].name);
    }
}

void st_close(StFile *f) {
    if (f->map) munmap((void *)f->map, f->map_len);
    free(f->t);
    memset(f, 0, sizeof *f);
}

/* ======================================================================
 * safetensors writer
 * ====================================================================== */

void st_writer_add_as(StWriter *w, const char *name, int ndim, const int64_t *shape, int dtype, const float *data) {
    if (strlen(name) >= sizeof w->t[0].name) die(EXIT_INTERNAL, "st_writer_add: tensor name too long: %s", name);
    if (ndim < 0 || ndim > 4) die(EXIT_INTERNAL, "st_writer_add: %s has %d dimensions", name, ndim);
    if (dtype != ST_F32 && dtype != ST_BF16) die(EXIT_INTERNAL, "st_writer_add: %s: dtype %d is not F32 or BF16", name, dtype);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        void *t = realloc(w->t, (size_t)cap * sizeof *w->t);
        if (!t) die(EXIT_IO, "out of memory in st_writer_add");
        w->t = t;
        w->cap = cap;
    }
    snprintf(w->t[w->n].name, sizeof w->t[w->n].name, "%s", name);
    w->t[w->n].ndim = ndim;
    for (int i = 0; i < ndim; i++) w->t[w->n].shape[i] = shape[i];
    w->t[w->n].dtype = dtype;
    w->t[w->n].data = data;
    w->n++;
}

void st_writer_add(StWriter *w, const char *name, int ndim, const int64_t *shape, const float *data) {
    st_writer_add_as(w, name, ndim, shape, ST_F32, data);
}

static size_t st_writer_numel(const StWriter *w, int i) {
    size_t n = 1;
    for (int d = 0; d < w->t[i].ndim; d++) n *= (size_t)w->t[i].shape[d];
    return n;
}

size_t st_writer_bytes(const StWriter *w, int i) { return st_writer_numel(w, i) * ST_DTYPES[w->t[i].dtype].size; }

/* Header JSON, padded with spaces so the data section starts 8-aligned. */
static void st_header(const StWriter *w, const char *metadata_json, Buf *b) {
    buf_add(b, "{");
    if (metadata_json) {
        cJSON *meta = cJSON_Parse(metadata_json);
        if (!cJSON_IsObject(meta)) die(EXIT_INTERNAL, "safetensors metadata is not a JSON object: %s", metadata_json);
        for (const cJSON *e = meta->child; e; e = e->next)
            if (!cJSON_IsString(e)) die(EXIT_INTERNAL, "safetensors metadata value %s is not a string", e->string);
        char *s = cJSON_PrintUnformatted(meta);
        buf_add(b, "\"__metadata__\":%s", s);
        cJSON_free(s);
        cJSON_Delete(meta);
    }
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        buf_add(b, "%s", (i || metadata_json) ? "," : "");
        buf_json_string(b, w->t[i].name);
        buf_add(b, ":{\"dtype\":\"%s\",\"shape\":[", ST_DTYPES[w->t[i].dtype].name);
        for (int d = 0; d < w->t[i].ndim; d++) buf_add(b, "%s%lld", d ? "," : "", (long long)w->t[i].shape[d]);
        size_t bytes = st_writer_bytes(w, i);
        buf_add(b, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    buf_add(b, "}");
    while (b->len % 8) buf_add(b, " ");
}

/* Any failure mid-write (disk full) leaves no partial file behind. */
static void write_or_die(FILE *fp, const void *p, size_t n, const char *tmp) {
    if (n && fwrite(p, 1, n, fp) != n) {
        int e = errno;
        fclose(fp);
        unlink(tmp);
        die(EXIT_IO, "%s: write failed (%s)", tmp, strerror(e));
    }
}

/* fflush + fsync + fclose + rename + directory fsync, tmp removed on error. */
static void commit_file(FILE *fp, const char *tmp, const char *path) {
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
        int e = errno;
        fclose(fp);
        unlink(tmp);
        die(EXIT_IO, "%s: write failed (%s)", tmp, strerror(e));
    }
    if (fclose(fp) != 0) {
        int e = errno;
        unlink(tmp);
        die(EXIT_IO, "%s: close failed (%s)", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        die(EXIT_IO, "%s: cannot rename to %s (%s)", tmp, path, strerror(e));
    }
    fsync_parent(path);
}

static FILE *open_tmp(const char *path, char *tmp, size_t tmp_len) {
    int w = snprintf(tmp, tmp_len, "%s.tmp", path);
    if (w < 0 || (size_t)w >= tmp_len) die(EXIT_USAGE, "%s: path too long", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) die(EXIT_IO, "%s: cannot create (%s)", tmp, strerror(errno));
    return fp;
}

void st_writer_begin(StWriter *w, const char *path, const char *metadata_json) {
    Buf hdr = {0};
    st_header(w, metadata_json, &hdr);
    if (strlen(path) >= sizeof w->path) die(EXIT_USAGE, "%s: path too long", path);
    snprintf(w->path, sizeof w->path, "%s", path);
    w->fp = open_tmp(path, w->tmp, sizeof w->tmp);
    w->next = 0;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
    write_or_die(w->fp, len8, 8, w->tmp);
    write_or_die(w->fp, hdr.s, hdr.len, w->tmp);
    free(hdr.s);
}

uint16_t st_bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN (quiet) */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest, ties to even */
}

void st_writer_put(StWriter *w, const float *data) {
    if (!w->fp || w->next >= w->n) die(EXIT_INTERNAL, "st_writer_put: no tensor left to write in %s", w->path);
    size_t n = st_writer_numel(w, w->next);
    if (w->t[w->next].dtype == ST_F32) {
        write_or_die(w->fp, data, n * sizeof(float), w->tmp); /* the format and every host we target are little-endian */
    } else { /* BF16, converted a block at a time */
        enum { BLOCK = 16384 };
        uint16_t blk[BLOCK];
        for (size_t i = 0; i < n; i += BLOCK) {
            size_t k = n - i < BLOCK ? n - i : BLOCK;
            for (size_t j = 0; j < k; j++) blk[j] = st_bf16_of(data[i + j]);
            write_or_die(w->fp, blk, k * sizeof(uint16_t), w->tmp);
        }
    }
    w->next++;
}

void st_writer_end(StWriter *w) {
    if (!w->fp || w->next != w->n) die(EXIT_INTERNAL, "st_writer_end: %s: %d of %d tensors written", w->path, w->next, w->n);
    commit_file(w->fp, w->tmp, w->path);
    w->fp = NULL;
}

void st_writer_write(StWriter *w, const char *path, const char *metadata_json) {
    st_writer_begin(w, path, metadata_json);
    for (int i = 0; i < w->n; i++) st_writer_put(w, w->t[i].data);
    st_writer_end(w);
}

void hf_write_file(const char *path, const void *data, size_t len, int newline) {
    char tmp[PATH_BUF];
    FILE *fp = open_tmp(path, tmp, sizeof tmp);
    write_or_die(fp, data, len, tmp);
    if (newline) write_or_die(fp, "\n", 1, tmp);
    commit_file(fp, tmp, path);
}

void st_writer_free(StWriter *w) {
    free(w->t);
    memset(w, 0, sizeof *w);
}

/* ======================================================================
 * Hugging Face name / layout mapping
 * ====================================================================== */


static void spec_rows_cols(const ParamSpec *s, size_t *rows, size_t *cols) {
    *rows = (size_t)s->shape[0];
    *cols = s->ndim == 2 ? (size_t)s->shape[1] : 1;
    if (*rows * *cols != s->numel) die(EXIT_INTERNAL, "%s: shape does not match numel %zu", s->name, s->numel);
}

static void hf_part(HfPart *p, const ParamSpec *s, size_t row0, size_t rows, int transpose, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void hf_part(HfPart *p, const ParamSpec *s, size_t row0, size_t rows, int transpose, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    size_t all_rows, cols;
    spec_rows_cols(s, &all_rows, &cols);
    p->row0 = row0;
    p->rows = rows;
    p->cols = cols;
    p->transpose = transpose;
    p->ndim = s->ndim;
    p->shape[0] = (int64_t)(transpose ? cols : rows);
    p->shape[1] = (int64_t)(transpose ? rows : cols);
}

/* GPT2LMHeadModel names; `pre` is "transformer." or "" (GPT2Model files).
 * Conv1D weights are stored [in, out], the transpose of ours. */
static int hf_parts_gpt2(const ParamSpec *s, const char *pre, HfPart *p) {
    size_t rows = (size_t)s->shape[0];
    int L = s->layer, T = s->ndim == 2;
    switch (s->kind) {
    case P_WTE: hf_part(p, s, 0, rows, 0, "%swte.weight", pre); return 1;
    case P_WPE: hf_part(p, s, 0, rows, 0, "%swpe.weight", pre); return 1;
    case P_LN1_W: hf_part(p, s, 0, rows, 0, "%sh.%d.ln_1.weight", pre, L); return 1;
    case P_LN1_B: hf_part(p, s, 0, rows, 0, "%sh.%d.ln_1.bias", pre, L); return 1;
    case P_QKV_W: hf_part(p, s, 0, rows, T, "%sh.%d.attn.c_attn.weight", pre, L); return 1;
    case P_QKV_B: hf_part(p, s, 0, rows, 0, "%sh.%d.attn.c_attn.bias", pre, L); return 1;
    case P_ATTN_OUT_W: hf_part(p, s, 0, rows, T, "%sh.%d.attn.c_proj.weight", pre, L); return 1;
    case P_ATTN_OUT_B: hf_part(p, s, 0, rows, 0, "%sh.%d.attn.c_proj.bias", pre, L); return 1;
    case P_LN2_W: hf_part(p, s, 0, rows, 0, "%sh.%d.ln_2.weight", pre, L); return 1;
    case P_LN2_B: hf_part(p, s, 0, rows, 0, "%sh.%d.ln_2.bias", pre, L); return 1;
    case P_FC_W: hf_part(p, s, 0, rows, T, "%sh.%d.mlp.c_fc.weight", pre, L); return 1;
    case P_FC_B: hf_part(p, s, 0, rows, 0, "%sh.%d.mlp.c_fc.bias", pre, L); return 1;
    case P_PROJ_W: hf_part(p, s, 0, rows, T, "%sh.%d.mlp.c_proj.weight", pre, L); return 1;
    case P_PROJ_B: hf_part(p, s, 0, rows, 0, "%sh.%d.mlp.c_proj.bias", pre, L); return 1;
    case P_LNF_W: hf_part(p, s, 0, rows, 0, "%sln_f.weight", pre); return 1;
    case P_LNF_B: hf_part(p, s, 0, rows, 0, "%sln_f.bias", pre); return 1;
    case P_LM_HEAD: hf_part(p, s, 0, rows, 0, "lm_head.weight"); return 1;
    default: break;
    }
    die(EXIT_INTERNAL, "%s: no GPT-2 Hugging Face name for this tensor", s->name);
}

/* A mixture-of-experts layer's tensors under MixtralForCausalLM's names
 * (block_sparse_moe.gate, experts.N.w1 | w3 | w2) or, with QK-norm,
 * Qwen3MoeForCausalLM's (mlp.gate, mlp.experts.N.gate_proj | up_proj |
 * down_proj): each expert by its index, our stacked gate|up and down
 * projections split into row blocks. */
static int hf_parts_moe(const Model *m, const ParamSpec *s, HfPart *p) {
    const ModelMoE *x = &m->moe;
    size_t F = (size_t)x->F, C = (size_t)m->cfg.n_embd;
    int L = s->layer, qwen = hf_moe_qwen(&m->cfg);
    const char *pre = qwen ? "mlp" : "block_sparse_moe";
    const char *gate = qwen ? "gate_proj" : "w1", *up = qwen ? "up_proj" : "w3", *down = qwen ? "down_proj" : "w2";
    switch (s->kind) {
    case P_ROUTER_W: hf_part(p, s, 0, (size_t)x->E, 0, "model.layers.%d.%s.gate.weight", L, pre); return 1;
    case P_EXP_FC_W:
        for (int e = 0; e < x->E; e++) {
            hf_part(&p[2 * e], s, (size_t)e * 2 * F, F, 0, "model.layers.%d.%s.experts.%d.%s.weight", L, pre, e, gate);
            hf_part(&p[2 * e + 1], s, (size_t)e * 2 * F + F, F, 0, "model.layers.%d.%s.experts.%d.%s.weight", L, pre, e, up);
        }
        return 2 * x->E;
    case P_EXP_PROJ_W:
        for (int e = 0; e < x->E; e++)
            hf_part(&p[e], s, (size_t)e * C, C, 0, "model.layers.%d.%s.experts.%d.%s.weight", L, pre, e, down);
        return x->E;
    default: break;
    }
    die(EXIT_INTERNAL, "%s: not a mixture-of-experts tensor", s->name);
}

int hf_parts_max(const Model *m) { return m->moe.on && 2 * m->moe.E > 3 ? 2 * m->moe.E : 3; }

int hf_moe_qwen(const ModelConfig *c) { return c->qk_norm; }

/* LlamaForCausalLM (and Qwen3ForCausalLM) names; our fused qkv and gate|up
 * split into row blocks. */
static int hf_parts_llama(const Model *m, const ParamSpec *s, HfPart *p) {
    size_t rows = (size_t)s->shape[0];
    int L = s->layer;
    size_t q = (size_t)m->cfg.n_head * (size_t)m->hd, kv = (size_t)m->cfg.n_kv_head * (size_t)m->hd;
    size_t F = (size_t)m->cfg.ffn_hidden;
    switch (s->kind) {
    case P_WTE: hf_part(p, s, 0, rows, 0, "model.embed_tokens.weight"); return 1;
    case P_LN1_W: hf_part(p, s, 0, rows, 0, "model.layers.%d.input_layernorm.weight", L); return 1;
    case P_QKV_W:
        if (rows != q + 2 * kv) die(EXIT_INTERNAL, "%s: %zu rows, expected %zu", s->name, rows, q + 2 * kv);
        hf_part(&p[0], s, 0, q, 0, "model.layers.%d.self_attn.q_proj.weight", L);
        hf_part(&p[1], s, q, kv, 0, "model.layers.%d.self_attn.k_proj.weight", L);
        hf_part(&p[2], s, q + kv, kv, 0, "model.layers.%d.self_attn.v_proj.weight", L);
        return 3;
    case P_ATTN_OUT_W: hf_part(p, s, 0, rows, 0, "model.layers.%d.self_attn.o_proj.weight", L); return 1;
    case P_Q_NORM_W: hf_part(p, s, 0, rows, 0, "model.layers.%d.self_attn.q_norm.weight", L); return 1;
    case P_K_NORM_W: hf_part(p, s, 0, rows, 0, "model.layers.%d.self_attn.k_norm.weight", L); return 1;
    case P_LN2_W: hf_part(p, s, 0, rows, 0, "model.layers.%d.post_attention_layernorm.weight", L); return 1;
    case P_FC_W:
        if (rows != 2 * F) die(EXIT_INTERNAL, "%s: %zu rows, expected %zu", s->name, rows, 2 * F);
        hf_part(&p[0], s, 0, F, 0, "model.layers.%d.mlp.gate_proj.weight", L);
        hf_part(&p[1], s, F, F, 0, "model.layers.%d.mlp.up_proj.weight", L);
        return 2;
    case P_PROJ_W: hf_part(p, s, 0, rows, 0, "model.layers.%d.mlp.down_proj.weight", L); return 1;
    case P_ROUTER_W: case P_EXP_FC_W: case P_EXP_PROJ_W: return hf_parts_moe(m, s, p);
    case P_LNF_W: hf_part(p, s, 0, rows, 0, "model.norm.weight"); return 1;
    case P_LM_HEAD: hf_part(p, s, 0, rows, 0, "lm_head.weight"); return 1;
    default: break;
    }
    die(EXIT_INTERNAL, "%s: no Llama Hugging Face name for this tensor", s->name);
}

int hf_parts(const Model *m, const ParamSpec *s, const char *gpt2_prefix, HfPart *p) {
    return m->cfg.arch == ARCH_GPT2 ? hf_parts_gpt2(s, gpt2_prefix, p) : hf_parts_llama(m, s, p);
}

/* Tensors a real checkpoint may carry that the model does not need. */
static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static bool hf_ignorable(const Model *m, const char *name) {
    if (strcmp(name, "lm_head.weight") == 0) return m->cfg.tie_embeddings; /* tied: wte is the head */
    if (m->cfg.arch == ARCH_GPT2) /* causal-mask buffers saved by old transformers */
        return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
    return ends_with(name, ".rotary_emb.inv_freq"); /* RoPE buffer in old Llama files */
}

/* Cache-friendly transpose: dst[c*rows + r] = src[r*cols + c]. */
void hf_transpose(float *dst, const float *src, size_t rows, size_t cols) {
    const size_t B = 32;
    for (size_t r0 = 0; r0 < rows; r0 += B)
        for (size_t c0 = 0; c0 < cols; c0 += B)
            for (size_t r = r0; r < r0 + B && r < rows; r++)
                for (size_t c = c0; c < c0 + B && c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* ======================================================================
 * Hugging Face config.json
 * ====================================================================== */

typedef struct { const char *path; const cJSON *root; } HfCfg;

static const cJSON *cfg_get(const HfCfg *c, const char *key, bool required) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (cJSON_IsNull(v)) v = NULL;
    if (!v && required) die(EXIT_USAGE, HF_CTX "%s: missing key %s", c->path, key);
    return v;
}

/* A value as config.json wrote it, for a message (the process then ends). */
static const char *cfg_shown(const cJSON *v) {
    static char got[96];
    char *shown = cJSON_PrintUnformatted(v);
    snprintf(got, sizeof got, "%s", shown ? shown : "?");
    free(shown);
    return got;
}

/* A value config.json gives a model.* field (job_key) is held to that job
 * key's range, as a job's would be (and to > 0: 0 is no size); a key no
 * job key fills (job_key NULL) to a positive int. */
static int cfg_int(const HfCfg *c, const char *key, const char *job_key, bool required, int def) {
    const cJSON *v = cfg_get(c, key, required);
    if (!v) return def;
    double lo = 1, hi = 0x7fffffff;
    if (job_key) config_key_range(job_key, &lo, &hi);
    if (lo < 1) lo = 1;
    uint64_t u;
    if (!json_uint(v, &u) || (double)u < lo || (double)u > hi) {
        if (job_key)
            die(EXIT_USAGE, HF_CTX "%s: key %s: expected an integer in [%.0f, %.0f] (the range of %s), got %s", c->path, key, lo,
                hi, job_key, cfg_shown(v));
        die(EXIT_USAGE, HF_CTX "%s: key %s: expected a positive integer", c->path, key);
    }
    return (int)u;
}

static float cfg_float(const HfCfg *c, const char *key, const char *job_key, float def) {
    const cJSON *v = cfg_get(c, key, false);
    if (!v) return def;
    double lo, hi;
    config_key_range(job_key, &lo, &hi);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        die(EXIT_USAGE, HF_CTX "%s: key %s: expected a number in %s%g, %g] (the range of %s, above 0), got %s", c->path, key,
            lo > 0 ? "[" : "(", lo, hi, job_key, cfg_shown(v));
    return (float)v->valuedouble;
}

static bool cfg_bool(const HfCfg *c, const char *key, bool def) {
    const cJSON *v = cfg_get(c, key, false);
    if (!v) return def;
    if (!cJSON_IsBool(v)) die(EXIT_USAGE, HF_CTX "%s: key %s: expected true or false", c->path, key);
    return cJSON_IsTrue(v);
}

static const char *cfg_str(const HfCfg *c, const char *key, const char *def) {
    const cJSON *v = cfg_get(c, key, false);
    if (!v) return def;
    if (!cJSON_IsString(v)) die(EXIT_USAGE, HF_CTX "%s: key %s: expected a string", c->path, key);
    return v->valuestring;
}

static void gpt2_config(const HfCfg *c, ModelConfig *o) {
    o->arch = ARCH_GPT2;
    o->n_layer = cfg_int(c, "n_layer", "model.n_layer", true, 0);
    o->n_embd = cfg_int(c, "n_embd", "model.n_embd", true, 0);
    o->n_head = cfg_int(c, "n_head", "model.n_head", true, 0);
    o->n_kv_head = o->n_head;
    o->vocab_size = cfg_int(c, "vocab_size", "model.vocab_size", true, 0);
    o->max_seq_len = cfg_int(c, "n_positions", "model.max_seq_len", true, 0);
    o->norm_eps = cfg_float(c, "layer_norm_epsilon", "model.norm_eps", 1e-5f);
    int inner = cfg_int(c, "n_inner", NULL, false, 4 * o->n_embd);
    if (inner != 4 * o->n_embd)
        die(EXIT_USAGE, HF_CTX "%s: key n_inner: %d is not supported (only 4*n_embd = %d)", c->path, inner, 4 * o->n_embd);
    o->ffn_hidden = 4 * o->n_embd;
    const char *act = cfg_str(c, "activation_function", "gelu_new");
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        die(EXIT_USAGE, HF_CTX "%s: key activation_function: \"%s\" is not supported (gelu_new or gelu_pytorch_tanh)", c->path, act);
    /* these change the attention math; our kernel is the default one */
    if (!cfg_bool(c, "scale_attn_weights", true))
        die(EXIT_USAGE, HF_CTX "%s: key scale_attn_weights: false is not supported", c->path);
    if (cfg_bool(c, "scale_attn_by_inverse_layer_idx", false))
        die(EXIT_USAGE, HF_CTX "%s: key scale_attn_by_inverse_layer_idx: true is not supported", c->path);
    /* GPT2LMHeadModel unties only when told to; we would drop its lm_head */
    if (!cfg_bool(c, "tie_word_embeddings", true))
        die(EXIT_USAGE, HF_CTX "%s: key tie_word_embeddings: false is not supported for GPT-2", c->path);
    o->rope_theta = 10000.0f;
    o->tie_embeddings = 1;
}

/* A number of a RoPE object (name: rope_scaling or rope_parameters) in
 * the range of the job key it fills (a whole one if whole); kind: its
 * rope_type, for the message. */
static double rope_num(const HfCfg *c, const cJSON *rs, const char *name, const char *kind, const char *key, const char *job_key,
                       int whole) {
    double lo, hi;
    config_key_range(job_key, &lo, &hi);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, key);
    if (!v) die(EXIT_USAGE, HF_CTX "%s: key %s: missing key %s (rope_type %s)", c->path, name, key, kind);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) || (whole && v->valuedouble != floor(v->valuedouble)))
        die(EXIT_USAGE, HF_CTX "%s: key %s.%s: expected %s in [%g, %g]", c->path, name, key, whole ? "an integer" : "a number", lo, hi);
    return v->valuedouble;
}

/* A RoPE scaling object, rs (NULL: none), named name in config.json:
 * transformers 4's rope_scaling, or transformers 5's rope_parameters,
 * which also carries rope_theta (theta_too). rope_type "default" (or,
 * in rope_parameters, none) is no scaling; Llama 3.1's rescaled
 * frequencies, {"rope_type": "llama3", "factor", "low_freq_factor",
 * "high_freq_factor", "original_max_position_embeddings"}; position
 * interpolation, {"rope_type": "linear", "factor"} ("type" in older
 * files); or YaRN, {"rope_type": "yarn", "factor"} with, as Hugging Face
 * reads them, optional "original_max_position_embeddings" (the file's
 * max_position_embeddings), "beta_fast" (32), "beta_slow" (1),
 * "attention_factor" (0.1 ln(factor) + 1) and "truncate" (true). The other
 * kinds (dynamic, longrope, ...) are other math and are refused, as is a key
 * the kind does not have (YaRN's mscale and mscale_all_dim among them). */
static void rope_scaling_read(const HfCfg *c, const cJSON *rs, const char *name, int theta_too, ModelConfig *o) {
    if (!rs) return;
    if (!cJSON_IsObject(rs)) die(EXIT_USAGE, HF_CTX "%s: key %s: expected an object or null", c->path, name);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : !t && theta_too ? "default" : NULL;
    if (!type) die(EXIT_USAGE, HF_CTX "%s: key %s: expected a string rope_type", c->path, name);
    enum { MAX_KEYS = 6 };
    static const struct { const char *type, *keys[MAX_KEYS]; int kind; } kinds[] = {
        {"default", {NULL}, ROPE_NONE},
        {"llama3", {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, ROPE_LLAMA3},
        {"linear", {"factor"}, ROPE_LINEAR},
        {"yarn",
         {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "truncate"},
         ROPE_YARN},
    };
    int k = 0, n_kinds = (int)(sizeof kinds / sizeof kinds[0]);
    while (k < n_kinds && strcmp(type, kinds[k].type) != 0) k++;
    if (k == n_kinds)
        die(EXIT_USAGE, HF_CTX "%s: key %s: rope_type \"%s\" is not supported (llama3, linear, yarn or default)", c->path, name, type);
    for (const cJSON *e = rs->child; e; e = e->next) {
        int known = strcmp(e->string, "rope_type") == 0 || strcmp(e->string, "type") == 0 ||
                    (theta_too && strcmp(e->string, "rope_theta") == 0);
        for (int i = 0; i < MAX_KEYS && kinds[k].keys[i] && !known; i++) known = strcmp(e->string, kinds[k].keys[i]) == 0;
        if (!known) {
            char has[160] = "";
            for (int i = 0; i < MAX_KEYS && kinds[k].keys[i]; i++)
                snprintf(has + strlen(has), sizeof has - strlen(has), "%s%s", i ? ", " : "", kinds[k].keys[i]);
            die(EXIT_USAGE, HF_CTX "%s: key %s.%s: not supported (rope_type %s has %s)", c->path, name, e->string, kinds[k].type,
                has[0] ? has : "no other key");
        }
    }
    if (theta_too && cJSON_GetObjectItemCaseSensitive(rs, "rope_theta"))
        o->rope_theta = (float)rope_num(c, rs, name, type, "rope_theta", "model.rope_theta", 0);
    if (kinds[k].kind == ROPE_NONE) return;
    o->rope_scaling = kinds[k].kind;
    o->rope_scaling_factor = (float)rope_num(c, rs, name, type, "factor", "model.rope_scaling_factor", 0);
    if (o->rope_scaling == ROPE_LINEAR) return;
    if (o->rope_scaling == ROPE_YARN) {
        if (!cJSON_GetObjectItemCaseSensitive(rs, "original_max_position_embeddings"))
            o->rope_original_max_seq_len = o->max_seq_len;
        else
            o->rope_original_max_seq_len =
                (int)rope_num(c, rs, name, type, "original_max_position_embeddings", "model.rope_original_max_seq_len", 1);
        if (cJSON_GetObjectItemCaseSensitive(rs, "beta_fast"))
            o->rope_beta_fast = (float)rope_num(c, rs, name, type, "beta_fast", "model.rope_beta_fast", 0);
        if (cJSON_GetObjectItemCaseSensitive(rs, "beta_slow"))
            o->rope_beta_slow = (float)rope_num(c, rs, name, type, "beta_slow", "model.rope_beta_slow", 0);
        if (cJSON_GetObjectItemCaseSensitive(rs, "attention_factor")) {
            o->rope_attention_factor = (float)rope_num(c, rs, name, type, "attention_factor", "model.rope_attention_factor", 0);
            if (!(o->rope_attention_factor > 0)) /* 0 is the job key's "default", not a factor */
                die(EXIT_USAGE, HF_CTX "%s: key %s.attention_factor: expected a number > 0", c->path, name);
        }
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(rs, "truncate");
        if (tr && !cJSON_IsBool(tr)) die(EXIT_USAGE, HF_CTX "%s: key %s.truncate: expected true or false", c->path, name);
        if (tr) o->rope_truncate = cJSON_IsTrue(tr);
        return;
    }
    o->rope_low_freq_factor = (float)rope_num(c, rs, name, type, "low_freq_factor", "model.rope_low_freq_factor", 0);
    o->rope_high_freq_factor = (float)rope_num(c, rs, name, type, "high_freq_factor", "model.rope_high_freq_factor", 0);
    o->rope_original_max_seq_len =
        (int)rope_num(c, rs, name, type, "original_max_position_embeddings", "model.rope_original_max_seq_len", 1);
}

static int same_rope(const ModelConfig *a, const ModelConfig *b) {
    return a->rope_theta == b->rope_theta && a->rope_scaling == b->rope_scaling && a->rope_scaling_factor == b->rope_scaling_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_seq_len == b->rope_original_max_seq_len && a->rope_beta_fast == b->rope_beta_fast &&
           a->rope_beta_slow == b->rope_beta_slow && a->rope_attention_factor == b->rope_attention_factor &&
           a->rope_truncate == b->rope_truncate;
}

/* A Llama's RoPE from either layout: transformers 4's top-level rope_theta
 * and rope_scaling, or transformers 5's rope_parameters (rope_theta,
 * rope_type and that type's keys, and no top-level ones). A file with both
 * is read both ways, which must agree. */
static void llama_rope(const HfCfg *c, ModelConfig *o) {
    const cJSON *rp = cfg_get(c, "rope_parameters", false);
    int v4 = cfg_get(c, "rope_theta", false) || cfg_get(c, "rope_scaling", false);
    ModelConfig old = *o;
    if (v4 || !rp) {
        old.rope_theta = cfg_float(c, "rope_theta", "model.rope_theta", 10000.0f);
        rope_scaling_read(c, cfg_get(c, "rope_scaling", false), "rope_scaling", 0, &old);
    }
    if (!rp) {
        *o = old;
        return;
    }
    o->rope_theta = 10000.0f;
    rope_scaling_read(c, rp, "rope_parameters", 1, o);
    if (v4 && !same_rope(o, &old))
        die(EXIT_USAGE, HF_CTX "%s: keys rope_parameters and rope_theta / rope_scaling: they give another RoPE (theta %g and %g); "
            "expected one of the two layouts, or both alike", c->path, o->rope_theta, old.rope_theta);
}

/* Keys that change the computation and that llmtrain does not implement,
 * where the file sets them: one line for the caller to print. */
static void hf_ignored(const HfCfg *c, char *note, size_t n) {
    static const char *const drop[] = {"attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"};
    size_t o = 0;
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) {
        const cJSON *v = cfg_get(c, drop[i], false);
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || o >= n) continue;
        o += (size_t)snprintf(note + o, n - o, "%s%s %g", o ? ", " : "", drop[i], v->valuedouble);
    }
}

/* A mixture-of-experts config.json's keys: Mixtral's (moe 1) or
 * Qwen3-MoE's (moe 2); both the 4.x and the 5.x layouts name them so. */
static void moe_config(const HfCfg *c, ModelConfig *o, int moe) {
    if (moe == 1) {
        o->moe_experts = cfg_int(c, "num_local_experts", "model.moe_experts", true, 0);
        o->moe_ffn_hidden = o->ffn_hidden;
        o->moe_norm_topk = 1;
        const cJSON *sw = cfg_get(c, "sliding_window", false);
        if (cJSON_IsNumber(sw) && sw->valuedouble < o->max_seq_len)
            die(EXIT_USAGE, HF_CTX "%s: key sliding_window: %g is not supported (sliding-window attention is not built; expected null "
                "or at least max_position_embeddings %d)", c->path, sw->valuedouble, o->max_seq_len);
    } else {
        o->moe_experts = cfg_int(c, "num_experts", "model.moe_experts", true, 0);
        o->moe_ffn_hidden = cfg_int(c, "moe_intermediate_size", "model.moe_ffn_hidden", true, 0);
        o->moe_norm_topk = cfg_bool(c, "norm_topk_prob", false);
        o->moe_layer_freq = cfg_int(c, "decoder_sparse_step", "model.moe_layer_freq", false, 1);
        const cJSON *dl = cfg_get(c, "mlp_only_layers", false);
        if (dl && !cJSON_IsArray(dl))
            die(EXIT_USAGE, HF_CTX "%s: key mlp_only_layers: expected an array of layer indices", c->path);
        size_t n = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, dl) {
            if (!cJSON_IsNumber(it) || it->valuedouble != (int)it->valuedouble)
                die(EXIT_USAGE, HF_CTX "%s: key mlp_only_layers: expected integer layer indices", c->path);
            n += (size_t)snprintf(o->moe_dense_layers + n, sizeof o->moe_dense_layers > n ? sizeof o->moe_dense_layers - n : 0,
                                  "%s%d", n ? "," : "", (int)it->valuedouble);
            if (n >= sizeof o->moe_dense_layers)
                die(EXIT_USAGE, HF_CTX "%s: key mlp_only_layers: too many layers (at most %zu characters as a list)", c->path,
                    sizeof o->moe_dense_layers - 1);
        }
    }
    o->moe_top_k = cfg_int(c, "num_experts_per_tok", "model.moe_top_k", true, 0);
    const cJSON *coef = cfg_get(c, "router_aux_loss_coef", false);
    if (cJSON_IsNumber(coef)) {
        o->router_aux_set = 1;
        o->router_aux_loss_coef = (float)coef->valuedouble;
    }
}

/* LlamaForCausalLM, or (qwen3) Qwen3ForCausalLM: Llama's blocks with
 * model.qk_norm, a free head_dim and no attention biases; moe: Mixtral's
 * (1) or Qwen3-MoE's (2) experts too (Qwen3-MoE is qwen3). */
static void llama_config(const HfCfg *c, ModelConfig *o, int qwen3, int moe) {
    o->arch = ARCH_LLAMA;
    o->qk_norm = qwen3;
    o->n_embd = cfg_int(c, "hidden_size", "model.n_embd", true, 0);
    o->ffn_hidden = cfg_int(c, "intermediate_size", "model.ffn_hidden", true, 0);
    o->n_layer = cfg_int(c, "num_hidden_layers", "model.n_layer", true, 0);
    o->n_head = cfg_int(c, "num_attention_heads", "model.n_head", true, 0);
    o->n_kv_head = cfg_int(c, "num_key_value_heads", "model.n_kv_head", false, o->n_head);
    o->vocab_size = cfg_int(c, "vocab_size", "model.vocab_size", true, 0);
    o->max_seq_len = cfg_int(c, "max_position_embeddings", "model.max_seq_len", true, 0);
    o->norm_eps = cfg_float(c, "rms_norm_eps", "model.norm_eps", 1e-6f);
    o->tie_embeddings = cfg_bool(c, "tie_word_embeddings", false);
    const char *act = cfg_str(c, "hidden_act", "silu");
    if (strcmp(act, "silu") != 0)
        die(EXIT_USAGE, HF_CTX "%s: key hidden_act: \"%s\" is not supported (only silu)", c->path, act);
    if (cfg_bool(c, "attention_bias", false))
        die(EXIT_USAGE, HF_CTX "%s: key attention_bias: true is not supported (no attention biases in %s)", c->path,
            qwen3 ? "llmtrain's Qwen3" : "Llama");
    if (qwen3 && cfg_bool(c, "use_sliding_window", false))
        die(EXIT_USAGE, HF_CTX "%s: key use_sliding_window: true is not supported (full causal attention only)", c->path);
    if (cfg_bool(c, "mlp_bias", false))
        die(EXIT_USAGE, HF_CTX "%s: key mlp_bias: true is not supported (no biases in Llama)", c->path);
    llama_rope(c, o);
    o->head_dim = cfg_int(c, "head_dim", "model.head_dim", false, 0);
    if (!o->head_dim && o->n_embd % o->n_head != 0)
        die(EXIT_USAGE, HF_CTX "%s: key num_attention_heads: %d does not divide hidden_size %d (and no head_dim)", c->path,
            o->n_head, o->n_embd);
    if (moe) moe_config(c, o, moe);
}

/* Python's json, which Hugging Face reads these files with, keeps the last
 * of a key given twice and cJSON finds the first: refuse the file rather
 * than read another model than transformers would (nested objects too). */
static void hf_no_duplicate_keys(const cJSON *obj, const char *path, const char *prefix) {
    for (const cJSON *it = obj->child; it; it = it->next) {
        for (const cJSON *before = obj->child; before != it; before = before->next)
            if (strcmp(before->string, it->string) == 0)
                die(EXIT_USAGE, HF_CTX "%s: key %s%s appears twice (expected each key once)", path, prefix, it->string);
        if (cJSON_IsObject(it)) {
            char inner[256];
            snprintf(inner, sizeof inner, "%s%s.", prefix, it->string);
            hf_no_duplicate_keys(it, path, inner);
        }
    }
}

void hf_read_config(const char *dir, ModelConfig *out) { hf_read_config_note(dir, out, NULL, 0); }

void hf_read_config_note(const char *dir, ModelConfig *out, char *note, size_t note_n) {
    char path[PATH_BUF];
    join_path(path, sizeof path, dir, "config.json");
    size_t len;
    char *text = read_text_file(path, &len);
    if (!text) die(EXIT_USAGE, HF_CTX "%s: cannot read (%s)", path, read_text_why());
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) die(EXIT_USAGE, HF_CTX "%s: not a JSON object (malformed JSON?)", path);
    hf_no_duplicate_keys(root, path, "");
    HfCfg c = {path, root};
    config_model_defaults(out); /* what config.json does not say (ffn_multiple_of, the RoPE scaling's numbers) */
    const char *type = cfg_str(&c, "model_type", NULL);
    if (!type) die(EXIT_USAGE, HF_CTX "%s: missing key model_type", path);
    if (strcmp(type, "gpt2") == 0) gpt2_config(&c, out);
    else if (strcmp(type, "llama") == 0) llama_config(&c, out, 0, 0);
    else if (strcmp(type, "qwen3") == 0) llama_config(&c, out, 1, 0);
    else if (strcmp(type, "mixtral") == 0) llama_config(&c, out, 0, 1);
    else if (strcmp(type, "qwen3_moe") == 0) llama_config(&c, out, 1, 2);
    else die(EXIT_USAGE, HF_CTX "%s: key model_type: \"%s\" is not supported (gpt2, llama, qwen3, mixtral or qwen3_moe)", path, type);
    if (note && note_n) {
        note[0] = '\0';
        char ign[400] = "";
        hf_ignored(&c, ign, sizeof ign);
        if (ign[0])
            snprintf(note, note_n, "%s: ignored, llmtrain trains without dropout: %s", path, ign);
    }
    char where[PATH_BUF + 16];
    snprintf(where, sizeof where, HF_CTX "%s", path);
    model_config_finish(out, where); /* the same shape rules as a job file */
    cJSON_Delete(root);
    free(text);
}

/* ======================================================================
 * Hugging Face weights: load
 * ====================================================================== */

/* One or more safetensors files seen as a single name space. */
typedef struct HfFiles {
    char where[PATH_BUF]; /* file or index named in "missing tensor" errors */
    StFile *f;
    unsigned char **used; /* [nf][f->n] */
    int nf;
} HfFiles;

static void hf_add_file(HfFiles *h, const char *path) {
    for (int i = 0; i < h->nf; i++)
        if (strcmp(h->f[i].path, path) == 0) return;
    h->f = realloc(h->f, (size_t)(h->nf + 1) * sizeof *h->f);
    h->used = realloc(h->used, (size_t)(h->nf + 1) * sizeof *h->used);
    if (!h->f || !h->used) die(EXIT_IO, "out of memory opening %s", path);
    st_open_ctx(&h->f[h->nf], path, HF_CTX);
    h->used[h->nf] = calloc_check((size_t)h->f[h->nf].n + 1, 1);
    h->nf++;
}

/* Sharded checkpoints list their files in index.json's weight_map. */
static void hf_open_index(HfFiles *h, const char *dir, const char *index) {
    size_t len;
    char *text = read_text_file(index, &len);
    if (!text) die(EXIT_USAGE, HF_CTX "%s: cannot read (%s)", index, read_text_why());
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) die(EXIT_USAGE, HF_CTX "%s: missing key weight_map (malformed index?)", index);
    hf_no_duplicate_keys(root, index, "");
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/'))
            die(EXIT_USAGE, HF_CTX "%s: weight_map.%s: expected a file name in this folder", index, e->string);
        char path[PATH_BUF];
        join_path(path, sizeof path, dir, e->valuestring);
        hf_add_file(h, path);
    }
    cJSON_Delete(root);
    free(text);
}

static void hf_open(HfFiles *h, const char *dir) {
    memset(h, 0, sizeof *h);
    char single[PATH_BUF], index[PATH_BUF];
    join_path(single, sizeof single, dir, "model.safetensors");
    join_path(index, sizeof index, dir, "model.safetensors.index.json");
    if (is_file(single)) {
        snprintf(h->where, sizeof h->where, "%s", single);
        hf_add_file(h, single);
    } else if (is_file(index)) {
        snprintf(h->where, sizeof h->where, "%s", index);
        hf_open_index(h, dir, index);
    } else {
        die(EXIT_USAGE, HF_CTX "%s: no model.safetensors or model.safetensors.index.json (only safetensors weights are supported)", dir);
    }
}

static void hf_close(HfFiles *h) {
    for (int i = 0; i < h->nf; i++) {
        st_close(&h->f[i]);
        free(h->used[i]);
    }
    free(h->f);
    free(h->used);
}

static const StTensor *hf_lookup(const HfFiles *h, const char *name, int *fi) {
    for (int i = 0; i < h->nf; i++) {
        const StTensor *t = st_find(&h->f[i], name);
        if (t) { *fi = i; return t; }
    }
    return NULL;
}

static bool hf_has(const HfFiles *h, const char *name) {
    int fi;
    return hf_lookup(h, name, &fi) != NULL;
}

/* Check one HF tensor's shape and dtype, and copy it into our layout. */
static void hf_load_part(HfFiles *h, const ParamSpec *s, const HfPart *p, float *flat) {
    int fi;
    const StTensor *t = hf_lookup(h, p->name, &fi);
    if (!t) die(EXIT_USAGE, HF_CTX "%s: missing tensor %s", h->where, p->name);
    const StFile *f = &h->f[fi];
    h->used[fi][t - f->t] = 1;
    if (!same_shape(t, p->ndim, p->shape)) {
        char got[128], want[128];
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(want, sizeof want, p->ndim, p->shape);
        die(EXIT_USAGE, HF_CTX "%s: tensor %s has shape %s, expected %s", f->path, p->name, got, want);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
        die(EXIT_USAGE, HF_CTX "%s: tensor %s has dtype %s, expected F32, BF16 or F16", f->path, p->name, ST_DTYPES[t->dtype].name);
    float *dst = flat + s->offset + p->row0 * p->cols;
    if (!p->transpose) {
        st_read_f32(f, t, dst);
        return;
    }
    float *tmp = malloc_check(p->rows * p->cols * sizeof(float));
    st_read_f32(f, t, tmp);
    hf_transpose(dst, tmp, p->cols, p->rows); /* HF [cols, rows] -> ours [rows, cols] */
    free(tmp);
}

/* A tensor we did not consume means the file is not the model the config
 * describes (e.g. a Llama with biases), which would silently train wrong. */
static void hf_check_unused(const Model *m, const HfFiles *h) {
    for (int i = 0; i < h->nf; i++)
        for (int j = 0; j < h->f[i].n; j++)
            if (!h->used[i][j] && !hf_ignorable(m, h->f[i].t[j].name))
                die(EXIT_USAGE, HF_CTX "%s: unexpected tensor %s (not part of a %s model with this config.json)", h->f[i].path,
                    h->f[i].t[j].name, m->cfg.arch == ARCH_GPT2 ? "GPT-2" : "Llama");
}

HfLoaded hf_load_weights(Model *m, const char *dir) {
    HfLoaded got = {0};
    HfFiles h;
    hf_open(&h, dir);
    /* Hugging Face tensors are global: read them into the tp = 1 layout and,
     * under tensor parallelism, keep this rank's slices */
    Model global;
    const Model *g = m;
    if (m->tp.size > 1) {
        model_layout(&global, &m->cfg, 1, 1, 0);
        g = &global;
    }
    /* GPT2Model checkpoints (e.g. the original gpt2) have no "transformer." prefix */
    const char *pre = (m->cfg.arch == ARCH_GPT2 && !hf_has(&h, "transformer.wte.weight") && hf_has(&h, "wte.weight"))
                          ? "" : "transformer.";
    float *flat = calloc_check(g->n_params, sizeof(float));
    HfPart *parts = malloc_check((size_t)hf_parts_max(g) * sizeof *parts);
    for (int i = 0; i < g->n_specs; i++) {
        int np = hf_parts(g, &g->specs[i], pre, parts);
        for (int j = 0; j < np; j++) hf_load_part(&h, &g->specs[i], &parts[j], flat);
    }
    free(parts);
    hf_check_unused(g, &h);
    for (int i = 0; i < h.nf; i++)
        for (int j = 0; j < h.f[i].n; j++)
            if (h.used[i][j]) {
                got.n_tensors++;
                got.dtypes |= 1u << h.f[i].t[j].dtype;
            }
    got.n_files = h.nf;
    if (m->tp.size > 1) {
        float *local = calloc_check(m->n_params, sizeof(float));
        for (int i = 0; i < m->n_specs; i++) {
            const ParamSpec *s = &m->specs[i];
            model_tp_copy(m, s, flat + model_find(g, s->name)->offset, local + s->offset, 0);
        }
        free(flat);
        flat = local;
        model_free(&global);
    }
    m->k->from_host(m->params, flat, m->n_params * sizeof(float));
    free(flat);
    hf_close(&h);
    return got;
}
