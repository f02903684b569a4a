/* test_ckpt.c — tests of hf.c: safetensors read/write (F32, BF16, F16),
 * Hugging Face GPT-2 / Llama export and import (bit-exact round trips,
 * sharded folders, config.json), training checkpoints of ckpt.c
 * (write in any layout, load into any other bit-exactly, manifest, checksums,
 * commit, resolve, prune, damage detection) and the one-line errors on bad
 * files (each in a forked child). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ckpt.h"
#include "export.h"
#include "hf.h"
#include "config.h"
#include "kernels.h"
#include "model.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static char TMP[256];

/* ---------------------------------------------------------------- files */

static char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *tpath(const char *fmt, ...) {
    static char bufs[8][1024];
    static int i;
    char *b = bufs[i++ % 8];
    int n = snprintf(b, 1024, "%s/", TMP);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, 1024 - (size_t)n, fmt, ap);
    va_end(ap);
    return b;
}

static int rm_cb(const char *p, const struct stat *sb, int f, struct FTW *ftw) {
    (void)sb; (void)f; (void)ftw;
    return remove(p);
}
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void copy_file(const char *src, const char *dst) {
    size_t n;
    char *buf = read_text_file(src, &n);
    if (!buf) die(EXIT_INTERNAL, "test: cannot read %s", src);
    FILE *f = fopen_check(dst, "wb");
    fwrite_check(buf, 1, n, f, dst);
    fclose_check(f, dst);
    free(buf);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen_check(path, "wb");
    fwrite_check(p, 1, n, f, path);
    fclose_check(f, path);
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* A tensor held in memory by the tests: raw bytes of any dtype. */
typedef struct {
    char name[128];
    const char *dtype;
    int ndim;
    int64_t shape[4];
    unsigned char *data;
    size_t bytes;
} Raw;

/* Hand-made safetensors (any dtype) so the reader is tested against bytes
 * it did not write. */
static void write_raw(const char *path, const Raw *t, int n) {
    char hdr[65536];
    size_t len = (size_t)snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(hdr + len, sizeof hdr - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            len += (size_t)snprintf(hdr + len, sizeof hdr - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(hdr + len, sizeof hdr - len, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].bytes);
        off += t[i].bytes;
    }
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
    while (len % 8) hdr[len++] = ' ';
    FILE *f = fopen_check(path, "wb");
    uint64_t l = len;
    fwrite_check(&l, 8, 1, f, path);
    fwrite_check(hdr, 1, len, f, path);
    for (int i = 0; i < n; i++) fwrite_check(t[i].data, 1, t[i].bytes, f, path);
    fclose_check(f, path);
}

/* Every tensor of a file as F32 Raw entries. */
static Raw *read_all(const char *path, int *n) {
    StFile f;
    st_open(&f, path);
    Raw *r = calloc_check((size_t)f.n + 8, sizeof *r); /* room for tests to add */
    for (int i = 0; i < f.n; i++) {
        const StTensor *t = &f.t[i];
        snprintf(r[i].name, sizeof r[i].name, "%s", t->name);
        r[i].dtype = "F32";
        r[i].ndim = t->ndim;
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) { r[i].shape[d] = t->shape[d]; numel *= (size_t)t->shape[d]; }
        r[i].bytes = numel * 4;
        r[i].data = malloc_check(r[i].bytes);
        st_read_f32(&f, t, (float *)r[i].data);
    }
    *n = f.n;
    st_close(&f);
    return r;
}

static void free_all(Raw *r, int n) {
    for (int i = 0; i < n; i++) free(r[i].data);
    free(r);
}

static Raw *raw_find(Raw *r, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(r[i].name, name) == 0) return &r[i];
    return NULL;
}

static void raw_remove(Raw *r, int *n, const char *name) {
    Raw *t = raw_find(r, *n, name);
    if (!t) die(EXIT_INTERNAL, "test: no tensor %s", name);
    free(t->data);
    *t = r[--*n];
}

/* ------------------------------------------------------------- children */

typedef void (*ChildFn)(const char *arg);

/* Run fn in a child; check it exits with `code` after one stderr line that
 * contains `want`. */
static void expect_die(const char *what, ChildFn fn, const char *arg, int code, const char *want) {
    int pfd[2];
    if (pipe(pfd) != 0) die(EXIT_INTERNAL, "pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        fn(arg);
        _exit(0);
    }
    close(pfd[1]);
    char err[4096];
    size_t len = 0;
    ssize_t r;
    while (len < sizeof err - 1 && (r = read(pfd[0], err + len, sizeof err - 1 - len)) > 0) len += (size_t)r;
    err[len] = '\0';
    close(pfd[0]);
    int status;
    waitpid(pid, &status, 0);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += err[i] == '\n';
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == code && lines == 1 && err[len - 1] == '\n' &&
             strstr(err, want) != NULL;
    if (len) err[len - 1] = '\0';
    check(ok, "%s -> exit %d, one line: %s", what, WIFEXITED(status) ? WEXITSTATUS(status) : -1, err);
}

/* Every fsync of the code under test, by the path of its file descriptor,
 * while logging (the test binary links with --wrap=fsync; the background
 * writer calls it from its own thread). */
int __real_fsync(int fd);
int __wrap_fsync(int fd);
static pthread_mutex_t fsync_mu = PTHREAD_MUTEX_INITIALIZER;
static char fsync_paths[256][1100];
static int fsync_n, fsync_on;

int __wrap_fsync(int fd) {
    pthread_mutex_lock(&fsync_mu);
    if (fsync_on && fsync_n < 256) {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, fsync_paths[fsync_n], sizeof fsync_paths[0] - 1);
        if (n > 0) fsync_paths[fsync_n++][n] = '\0';
    }
    pthread_mutex_unlock(&fsync_mu);
    return __real_fsync(fd);
}

static void fsync_log_start(void) {
    pthread_mutex_lock(&fsync_mu);
    fsync_n = 0;
    fsync_on = 1;
    pthread_mutex_unlock(&fsync_mu);
}

static int fsync_log_stop(void) {
    pthread_mutex_lock(&fsync_mu);
    fsync_on = 0;
    int n = fsync_n;
    pthread_mutex_unlock(&fsync_mu);
    return n;
}

/* malloc of exactly this many bytes fails while non-zero (--wrap=malloc). */
void *__real_malloc(size_t size);
void *__wrap_malloc(size_t size);
static volatile size_t malloc_fail_size;

void *__wrap_malloc(size_t size) { return malloc_fail_size && size == malloc_fail_size ? NULL : __real_malloc(size); }

static int fsync_logged(const char *path) {
    for (int i = 0; i < fsync_n; i++)
        if (strcmp(fsync_paths[i], path) == 0) return 1;
    return 0;
}

/* ------------------------------------------------------- safetensors */

static void test_st_roundtrip(void) {
    float a[6] = {1, -2, 3.5f, 1e-30f, -0.0f, INFINITY}, b[3] = {0.1f, 0.2f, 0.3f}, s = 42;
    StWriter w = {0};
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    st_writer_add(&w, "a", 2, sa, a);
    st_writer_add(&w, "b\"quoted", 1, sb, b);
    st_writer_add(&w, "scalar", 0, NULL, &s);
    char *p = tpath("rt.safetensors");
    st_writer_write(&w, p, "{\"format\":\"pt\",\"note\":\"x\"}");
    st_writer_free(&w);
    check(!exists(tpath("rt.safetensors.tmp")), "st writer: no .tmp left behind");

    size_t len;
    char *bytes = read_text_file(p, &len);
    uint64_t hl;
    memcpy(&hl, bytes, 8);
    check(hl % 8 == 0,
          "st writer: header length %llu is a multiple of 8", (unsigned long long)hl);
    cJSON *h = cJSON_ParseWithLength(bytes + 8, hl);
    const cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
    check(meta && cJSON_IsString(cJSON_GetObjectItem(meta, "format")) &&
              strcmp(cJSON_GetObjectItem(meta, "format")->valuestring, "pt") == 0,
          "st writer: __metadata__ {\"format\":\"pt\"} written");
    check(len == 8 + hl + sizeof a + sizeof b + sizeof s, "st writer: file size = 8 + header + data");
    cJSON_Delete(h);
    free(bytes);

    StFile f;
    st_open(&f, p);
    const StTensor *ta = st_find(&f, "a"), *tb = st_find(&f, "b\"quoted"), *ts = st_find(&f, "scalar");
    check(f.n == 3 && ta && tb && ts && !st_find(&f, "__metadata__"), "st reader: 3 tensors, metadata skipped");
    check(ta && ta->dtype == ST_F32 && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3, "st reader: shape [2, 3] F32");
    check(ts && ts->ndim == 0 && ts->end - ts->begin == 4, "st reader: 0-d scalar");
    float ra[6], rb[3], rs;
    st_read_f32(&f, ta, ra);
    st_read_f32(&f, tb, rb);
    st_read_f32(&f, ts, &rs);
    check(memcmp(ra, a, sizeof a) == 0 && memcmp(rb, b, sizeof b) == 0 && rs == 42, "st reader: values bit-identical");
    st_close(&f);
}

static void test_st_dtypes(void) {
    /* bf16: the top 16 bits of fp32 */
    float want_bf[5] = {1.0f, -2.5f, 3.14159274f, 1e-20f, -65504.0f};
    uint16_t bf[5];
    float want_bf_exact[5];
    for (int i = 0; i < 5; i++) {
        uint32_t u;
        memcpy(&u, &want_bf[i], 4);
        bf[i] = (uint16_t)(u >> 16);
        u &= 0xffff0000u;
        memcpy(&want_bf_exact[i], &u, 4);
    }
    uint16_t hf[10] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7e00, 0x8000, 0x3555};
    float want_hf[10] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 1023 * 0x1p-24f, INFINITY, -INFINITY, NAN, -0.0f, 0.333251953125f};
    int64_t ids[2] = {7, -1};
    Raw t[3] = {
        {"bf", "BF16", 1, {5}, (unsigned char *)bf, sizeof bf},
        {"hf", "F16", 2, {2, 5}, (unsigned char *)hf, sizeof hf},
        {"ids", "I64", 1, {2}, (unsigned char *)ids, sizeof ids},
    };
    char *p = tpath("dtypes.safetensors");
    write_raw(p, t, 3);
    StFile f;
    st_open(&f, p);
    float out[10];
    st_read_f32(&f, st_find(&f, "bf"), out);
    check(memcmp(out, want_bf_exact, sizeof want_bf_exact) == 0 && out[0] == 1.0f && out[1] == -2.5f,
          "st reader: BF16 -> fp32 exact (upper 16 bits)");
    st_read_f32(&f, st_find(&f, "hf"), out);
    int ok = 1;
    for (int i = 0; i < 10; i++) {
        if (isnan(want_hf[i])) ok &= isnan(out[i]) != 0;
        else ok &= out[i] == want_hf[i] && signbit(out[i]) == signbit(want_hf[i]);
    }
    check(ok, "st reader: F16 -> fp32 (normal, max, subnormal, inf, nan, -0)");
    check(st_find(&f, "ids")->dtype == ST_I64, "st reader: I64 tensor accepted in the header");
    st_close(&f);
}

static void child_st_open(const char *path) {
    StFile f;
    st_open(&f, path);
}

static void child_st_read_ids(const char *path) {
    StFile f;
    st_open(&f, path);
    float out[2];
    st_read_f32(&f, st_find(&f, "ids"), out);
}

/* Header text after the 8-byte length, written as is (no padding). */
static void write_header_file(const char *path, const char *hdr, size_t data_bytes) {
    size_t len = strlen(hdr);
    unsigned char *buf = calloc_check(8 + len + data_bytes, 1);
    uint64_t l = len;
    memcpy(buf, &l, 8);
    memcpy(buf + 8, hdr, len);
    write_bytes(path, buf, 8 + len + data_bytes);
    free(buf);
}

static void test_st_errors(void) {
    char *p;
    p = tpath("short.safetensors");
    write_bytes(p, "abc", 3);
    expect_die("st_open: 3-byte file", child_st_open, p, EXIT_USAGE, "short.safetensors");

    p = tpath("hdrlen.safetensors");
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(p, big, sizeof big);
    expect_die("st_open: header length past EOF", child_st_open, p, EXIT_USAGE, "header length 65535");

    p = tpath("badjson.safetensors");
    write_header_file(p, "{\"a\":{\"dtype\":", 0);
    expect_die("st_open: malformed header JSON", child_st_open, p, EXIT_USAGE, "badjson.safetensors");

    p = tpath("dtype.safetensors");
    write_header_file(p, "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    expect_die("st_open: unknown dtype", child_st_open, p, EXIT_USAGE, "tensor a: unsupported dtype F8_E4M3");

    p = tpath("size.safetensors");
    write_header_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20);
    expect_die("st_open: size != prod(shape)*4", child_st_open, p, EXIT_USAGE, "tensor a: 20 bytes for shape [2, 3]");

    p = tpath("trunc.safetensors");
    write_header_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 10);
    expect_die("st_open: truncated data section", child_st_open, p, EXIT_USAGE, "tensor a: data_offsets [0, 24] outside");

    p = tpath("offs.safetensors");
    write_header_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 8);
    expect_die("st_open: malformed data_offsets", child_st_open, p, EXIT_USAGE, "tensor a: data_offsets must be");

    expect_die("st_open: missing file", child_st_open, tpath("nope.safetensors"), EXIT_USAGE, "nope.safetensors: cannot open");
    expect_die("st_read_f32: integer tensor", child_st_read_ids, tpath("dtypes.safetensors"), EXIT_USAGE, "tensor ids has dtype I64");
}

/* Writing past RLIMIT_FSIZE fails like a full disk. */
static void child_write_big(const char *path) {
    struct rlimit rl = {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &rl);
    signal(SIGXFSZ, SIG_IGN);
    static float big[1 << 16];
    StWriter w = {0};
    int64_t sh[1] = {1 << 16};
    st_writer_add(&w, "big", 1, sh, big);
    st_writer_write(&w, path, NULL);
}

static void test_st_write_error(void) {
    char *p = tpath("full.safetensors");
    expect_die("st_writer_write: write failure (file size limit)", child_write_big, p, EXIT_IO, "write failed");
    check(!exists(tpath("full.safetensors.tmp")) && !exists(p), "st_writer_write: tmp file removed after a failed write");
}

/* ------------------------------------------------------------ models */

static ModelConfig gpt2_cfg(void) {
    ModelConfig c;
    config_model_defaults(&c); /* the keys not set below */
    c.arch = ARCH_GPT2;
    c.n_layer = 2; c.n_embd = 32; c.n_head = 4; c.vocab_size = 67; c.max_seq_len = 16;
    c.norm_eps = 1e-5f; c.rope_theta = 10000; c.ffn_multiple_of = 256;
    model_config_finish(&c, "test");
    return c;
}

static ModelConfig llama_cfg(int tied) {
    ModelConfig c;
    config_model_defaults(&c); /* the keys not set below */
    c.arch = ARCH_LLAMA;
    c.n_layer = 2; c.n_embd = 32; c.n_head = 4; c.n_kv_head = 2; c.ffn_hidden = 48; c.vocab_size = 61;
    c.max_seq_len = 32; c.norm_eps = 1e-6f; c.rope_theta = 500000; c.tie_embeddings = tied; c.ffn_multiple_of = 256;
    model_config_finish(&c, "test");
    return c;
}

static int cfg_equal(const ModelConfig *a, const ModelConfig *b) {
    return a->arch == b->arch && a->n_layer == b->n_layer && a->n_embd == b->n_embd && a->n_head == b->n_head &&
           a->n_kv_head == b->n_kv_head && a->ffn_hidden == b->ffn_hidden && a->ffn_multiple_of == b->ffn_multiple_of &&
           a->vocab_size == b->vocab_size && a->max_seq_len == b->max_seq_len && a->norm_eps == b->norm_eps &&
           a->rope_theta == b->rope_theta && a->tie_embeddings == b->tie_embeddings && a->rope_scaling == b->rope_scaling &&
           (!a->rope_scaling || a->rope_scaling_factor == b->rope_scaling_factor) && /* the numbers its scaling reads */
           (a->rope_scaling != ROPE_LLAMA3 ||
            (a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
             a->rope_original_max_seq_len == b->rope_original_max_seq_len)) &&
           (a->rope_scaling != ROPE_YARN ||
            (a->rope_original_max_seq_len == b->rope_original_max_seq_len && a->rope_beta_fast == b->rope_beta_fast &&
             a->rope_beta_slow == b->rope_beta_slow && a->rope_attention_factor == b->rope_attention_factor &&
             a->rope_truncate == b->rope_truncate));
}

static void build(Model *m, const ModelConfig *c, uint64_t seed) {
    model_build(m, c, kernels_cpu(), 1, 4, 3); /* pad_multiple 3: chunks carry padding */
    model_init_random(m, 0.02f, seed);
    /* norm weights and biases are constant after init: vary them so a
     * swapped tensor would show */
    float *h = malloc_check(m->n_params * sizeof(float));
    m->k->to_host(h, m->params, m->n_params * sizeof(float));
    for (int i = 0; i < m->n_specs; i++) {
        const ParamSpec *s = &m->specs[i];
        if (s->ndim == 1)
            for (size_t j = 0; j < s->numel; j++) h[s->offset + j] += 0.001f * (float)(i + 1) + 1e-5f * (float)j;
    }
    m->k->from_host(m->params, h, m->n_params * sizeof(float));
    free(h);
}

/* Same params (all of them, padding included) in two models of one layout. */
static int same_params(const Model *a, const Model *b, uint32_t mask) {
    if (a->n_params != b->n_params) return 0;
    for (size_t i = 0; i < a->n_params; i++) {
        uint32_t x, y;
        memcpy(&x, &a->params[i], 4);
        memcpy(&y, &b->params[i], 4);
        if ((x & mask) != y) return 0;
    }
    return 1;
}

/* Export m, reload into a fresh model, compare. */
static void roundtrip(const char *what, const Model *m, const char *dir) {
    hf_export(m, m->params, dir);
    ModelConfig rc;
    hf_read_config(dir, &rc);
    check(cfg_equal(&rc, &m->cfg), "%s: config.json round-trips to the same ModelConfig", what);
    Model m2;
    model_build(&m2, &rc, kernels_cpu(), 1, 4, 3);
    hf_load_weights(&m2, dir);
    check(same_params(m, &m2, 0xffffffffu), "%s: params bit-identical after export + load", what);
    model_free(&m2);
}

static const float *spec_data(const Model *m, const char *name) {
    const ParamSpec *s = model_find(m, name);
    if (!s) die(EXIT_INTERNAL, "test: no spec %s", name);
    return m->params + s->offset;
}

static void test_gpt2(void) {
    ModelConfig c = gpt2_cfg();
    Model m;
    build(&m, &c, 1);
    char *dir = tpath("hf_gpt2");
    roundtrip("gpt2", &m, dir);

    int n;
    Raw *r = read_all(tpath("hf_gpt2/model.safetensors"), &n);
    Raw *ca = raw_find(r, n, "transformer.h.1.attn.c_attn.weight");
    Raw *fc = raw_find(r, n, "transformer.h.0.mlp.c_fc.weight");
    Raw *pj = raw_find(r, n, "transformer.h.0.mlp.c_proj.weight");
    check(ca && ca->ndim == 2 && ca->shape[0] == 32 && ca->shape[1] == 96, "gpt2 export: c_attn.weight is [C, 3C]");
    check(fc && fc->shape[0] == 32 && fc->shape[1] == 128 && pj && pj->shape[0] == 128 && pj->shape[1] == 32,
          "gpt2 export: c_fc [C, 4C], c_proj [4C, C]");
    /* Conv1D: HF[c][r] == ours[r][c]; q|k|v columns */
    const float *qkv = spec_data(&m, "layers.1.attn.qkv.weight");
    int ok = ca != NULL;
    for (int row = 0; ok && row < 96; row++)
        for (int col = 0; col < 32; col++) ok &= ((float *)ca->data)[col * 96 + row] == qkv[row * 32 + col];
    check(ok, "gpt2 export: c_attn.weight is the transpose of qkv");
    check(!raw_find(r, n, "lm_head.weight") && raw_find(r, n, "transformer.wpe.weight") &&
              raw_find(r, n, "transformer.ln_f.bias") && n == 2 + 2 * 12 + 2,
          "gpt2 export: %d tensors, tied lm_head omitted", n);

    size_t len;
    char *text = read_text_file(tpath("hf_gpt2/config.json"), &len);
    cJSON *j = cJSON_Parse(text);
    check(j && strcmp(cJSON_GetObjectItem(j, "model_type")->valuestring, "gpt2") == 0 &&
              strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring, "GPT2LMHeadModel") == 0 &&
              cJSON_IsNull(cJSON_GetObjectItem(j, "n_inner")) && cJSON_GetObjectItem(j, "n_ctx")->valueint == 16 &&
              cJSON_IsTrue(cJSON_GetObjectItem(j, "tie_word_embeddings")) && strstr(text, "1e-05") &&
              strcmp(cJSON_GetObjectItem(j, "activation_function")->valuestring, "gelu_new") == 0,
          "gpt2 export: config.json keys (architectures, n_inner null, n_ctx, eps 1e-05)");
    cJSON_Delete(j);
    free(text);

    /* GPT2Model naming (no "transformer.") with old attn.bias buffers and a
     * tied lm_head, as in the original gpt2 checkpoint */
    char *d2 = tpath("hf_gpt2_noprefix");
    mkdir_p(d2);
    copy_file(tpath("hf_gpt2/config.json"), tpath("hf_gpt2_noprefix/config.json"));
    for (int i = 0; i < n; i++) memmove(r[i].name, r[i].name + 12, strlen(r[i].name + 12) + 1);
    static float mask[16 * 16], mb = -1e4f;
    r[n++] = (Raw){"h.0.attn.bias", "F32", 4, {1, 1, 16, 16}, (unsigned char *)mask, sizeof mask};
    r[n++] = (Raw){"h.1.attn.masked_bias", "F32", 0, {0}, (unsigned char *)&mb, 4};
    Raw *wte = raw_find(r, n, "wte.weight");
    r[n++] = (Raw){"lm_head.weight", "F32", 2, {wte->shape[0], wte->shape[1]}, wte->data, wte->bytes};
    write_raw(tpath("hf_gpt2_noprefix/model.safetensors"), r, n);
    Model m2;
    model_build(&m2, &c, kernels_cpu(), 1, 4, 3);
    hf_load_weights(&m2, d2);
    check(same_params(&m, &m2, 0xffffffffu), "gpt2: GPT2Model names + attn.bias buffers + tied lm_head load identically");
    model_free(&m2);
    n -= 3;
    free_all(r, n);
    model_free(&m);
}

static void test_llama(void) {
    for (int tied = 0; tied <= 1; tied++) {
        ModelConfig c = llama_cfg(tied);
        Model m;
        build(&m, &c, 7 + (uint64_t)tied);
        char *dir = tpath("hf_llama%d", tied);
        char what[64];
        snprintf(what, sizeof what, "llama GQA %s", tied ? "tied" : "untied");
        roundtrip(what, &m, dir);
        int n;
        Raw *r = read_all(tpath("hf_llama%d/model.safetensors", tied), &n);
        Raw *q = raw_find(r, n, "model.layers.1.self_attn.q_proj.weight"), *k = raw_find(r, n, "model.layers.1.self_attn.k_proj.weight");
        Raw *v = raw_find(r, n, "model.layers.1.self_attn.v_proj.weight"), *up = raw_find(r, n, "model.layers.0.mlp.up_proj.weight");
        Raw *gate = raw_find(r, n, "model.layers.0.mlp.gate_proj.weight");
        check(q && k && v && q->shape[0] == 32 && k->shape[0] == 16 && v->shape[0] == 16 && v->shape[1] == 32,
              "%s export: q [32,32], k [16,32], v [16,32]", what);
        const float *qkv = spec_data(&m, "layers.1.attn.qkv.weight"), *fc = spec_data(&m, "layers.0.mlp.fc.weight");
        check(q && k && v && memcmp(q->data, qkv, 32 * 32 * 4) == 0 && memcmp(k->data, qkv + 32 * 32, 16 * 32 * 4) == 0 &&
                  memcmp(v->data, qkv + 48 * 32, 16 * 32 * 4) == 0,
              "%s export: q|k|v are the row blocks of qkv", what);
        check(gate && up && gate->shape[0] == 48 && memcmp(gate->data, fc, 48 * 32 * 4) == 0 &&
                  memcmp(up->data, fc + 48 * 32, 48 * 32 * 4) == 0,
              "%s export: gate|up are the row blocks of fc", what);
        check((raw_find(r, n, "lm_head.weight") != NULL) == !tied && n == 2 + 9 * 2 + !tied,
              "%s export: %d tensors, lm_head %s", what, n, tied ? "omitted" : "present");
        free_all(r, n);
        model_free(&m);
    }
}

/* A RoPE scaling's config.json: rope_scaling carries the kind (the scaling
 * of c, a Llama config with its numbers set) and the n numbers of keys[]
 * (values want[]) out and back, "truncate": false where !c.rope_truncate,
 * and nothing else. */
static void rope_scaling_roundtrip(const char *kind, ModelConfig c, int n, const char *const *keys, const double *want) {
    Model m;
    build(&m, &c, 11);
    char dir_name[64], what[96];
    snprintf(dir_name, sizeof dir_name, "hf_%s_%d", kind, n);
    snprintf(what, sizeof what, "%s rope scaling (%d number%s)", kind, n, n == 1 ? "" : "s");
    roundtrip(what, &m, tpath(dir_name));
    size_t len;
    char cfg_name[96];
    snprintf(cfg_name, sizeof cfg_name, "%s/config.json", dir_name);
    char *text = read_text_file(tpath(cfg_name), &len);
    cJSON *root = text ? cJSON_Parse(text) : NULL, *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type"), *tr = cJSON_GetObjectItemCaseSensitive(rs, "truncate");
    int same = cJSON_IsString(type) && strcmp(type->valuestring, kind) == 0 &&
               cJSON_GetArraySize(rs) == n + 1 + !c.rope_truncate && (c.rope_truncate ? !tr : cJSON_IsFalse(tr));
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, keys[i]);
        same &= cJSON_IsNumber(v) && v->valuedouble == want[i];
    }
    check(same, "%s: config.json has rope_scaling {rope_type %s and the job's %d numbers%s}", what, kind, n,
          c.rope_truncate ? "" : ", truncate false");
    cJSON_Delete(root);
    free(text);
    model_free(&m);
}

/* Llama 3's RoPE scaling, linear scaling (position interpolation) and YaRN
 * (its keys at Hugging Face's defaults left out, then every one set) */
static void test_rope_scaling(void) {
    static const char *const keys[4] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    static const char *const ykeys[5] = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"};
    static const double llama3[4] = {32, 1.5, 6, 24}, linear[1] = {4}, yarn[5] = {4, 24, 16, 2, 0.75};
    ModelConfig c = llama_cfg(1);
    c.rope_scaling = ROPE_LLAMA3;
    c.rope_scaling_factor = 32, c.rope_low_freq_factor = 1.5f, c.rope_high_freq_factor = 6, c.rope_original_max_seq_len = 24;
    rope_scaling_roundtrip("llama3", c, 4, keys, llama3);
    c = llama_cfg(1);
    c.rope_scaling = ROPE_LINEAR;
    c.rope_scaling_factor = 4;
    rope_scaling_roundtrip("linear", c, 1, keys, linear);
    c = llama_cfg(1);
    c.rope_scaling = ROPE_YARN;
    c.rope_scaling_factor = 4, c.rope_original_max_seq_len = 24;
    rope_scaling_roundtrip("yarn", c, 2, ykeys, yarn);
    c.rope_beta_fast = 16, c.rope_beta_slow = 2, c.rope_attention_factor = 0.75f, c.rope_truncate = 0;
    rope_scaling_roundtrip("yarn", c, 5, ykeys, yarn);
}

/* llama (untied) folder rewritten: every tensor as BF16 (truncated). */
static void test_bf16_load(void) {
    ModelConfig c = llama_cfg(0);
    Model m;
    build(&m, &c, 7);
    char *d = tpath("hf_llama_bf16");
    mkdir_p(d);
    copy_file(tpath("hf_llama0/config.json"), tpath("hf_llama_bf16/config.json"));
    int n;
    Raw *r = read_all(tpath("hf_llama0/model.safetensors"), &n);
    for (int i = 0; i < n; i++) {
        size_t numel = r[i].bytes / 4;
        uint16_t *b = malloc_check(numel * 2);
        for (size_t j = 0; j < numel; j++) {
            uint32_t u;
            memcpy(&u, r[i].data + 4 * j, 4);
            b[j] = (uint16_t)(u >> 16);
        }
        free(r[i].data);
        r[i].data = (unsigned char *)b;
        r[i].bytes = numel * 2;
        r[i].dtype = "BF16";
    }
    write_raw(tpath("hf_llama_bf16/model.safetensors"), r, n);
    free_all(r, n);
    Model m2;
    model_build(&m2, &c, kernels_cpu(), 1, 4, 3);
    hf_load_weights(&m2, d);
    check(same_params(&m, &m2, 0xffff0000u), "llama BF16 folder: loads as the fp32 values' upper 16 bits");
    model_free(&m2);
    model_free(&m);
}

/* llama (untied) split into two shards + model.safetensors.index.json. */
static void test_sharded(void) {
    ModelConfig c = llama_cfg(0);
    Model m;
    build(&m, &c, 7);
    char *d = tpath("hf_llama_sharded");
    mkdir_p(d);
    copy_file(tpath("hf_llama0/config.json"), tpath("hf_llama_sharded/config.json"));
    int n;
    Raw *r = read_all(tpath("hf_llama0/model.safetensors"), &n);
    int half = n / 2;
    write_raw(tpath("hf_llama_sharded/model-00001-of-00002.safetensors"), r, half);
    write_raw(tpath("hf_llama_sharded/model-00002-of-00002.safetensors"), r + half, n - half);
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    cJSON_AddObjectToObject(idx, "metadata");
    for (int i = 0; i < n; i++)
        cJSON_AddStringToObject(wm, r[i].name, i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    char *text = cJSON_Print(idx);
    write_text(tpath("hf_llama_sharded/model.safetensors.index.json"), text);
    free(text);
    cJSON_Delete(idx);
    free_all(r, n);
    Model m2;
    model_build(&m2, &c, kernels_cpu(), 1, 4, 3);
    hf_load_weights(&m2, d);
    check(same_params(&m, &m2, 0xffffffffu), "llama sharded folder (index.json + 2 files): params bit-identical");
    model_free(&m2);
    model_free(&m);
}

/* ---------------------------------------------------------- HF errors */

static void child_hf_load(const char *dir) {
    ModelConfig c;
    hf_read_config(dir, &c);
    Model m;
    model_build(&m, &c, kernels_cpu(), 1, 4, 1);
    hf_load_weights(&m, dir);
}

static void child_hf_config(const char *dir) {
    ModelConfig c;
    hf_read_config(dir, &c);
}

/* A copy of the untied llama folder whose tensors `edit` may change. */
static char *variant(const char *name, void (*edit)(Raw *r, int *n)) {
    char *d = tpath("%s", name);
    static char keep[8][1024];
    static int k;
    char *out = keep[k++ % 8];
    snprintf(out, 1024, "%s", d);
    mkdir_p(out);
    char cfg[1100], st[1100];
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    snprintf(st, sizeof st, "%s/model.safetensors", out);
    copy_file(tpath("hf_llama0/config.json"), cfg);
    int n;
    Raw *r = read_all(tpath("hf_llama0/model.safetensors"), &n);
    if (edit) edit(r, &n);
    write_raw(st, r, n);
    free_all(r, n);
    return out;
}

static void edit_missing(Raw *r, int *n) { raw_remove(r, n, "model.layers.1.mlp.up_proj.weight"); }
static void edit_shape(Raw *r, int *n) {
    Raw *t = raw_find(r, *n, "model.layers.1.mlp.up_proj.weight");
    t->shape[0] = 64;
    t->shape[1] = 32;
    t->bytes = 64 * 32 * 4;
    t->data = realloc(t->data, t->bytes);
}
static void edit_extra(Raw *r, int *n) {
    static float bias[32];
    Raw *t = &r[(*n)++];
    *t = (Raw){"model.layers.0.self_attn.q_proj.bias", "F32", 1, {32}, NULL, sizeof bias};
    t->data = malloc_check(sizeof bias);
    memcpy(t->data, bias, sizeof bias);
}

/* config.json's key set to json_value (NULL: removed); keep_old: added as a
 * second copy of the key (cJSON keeps both) instead. */
static void edit_config(const char *dir, const char *key, const char *json_value, int keep_old) {
    char p[1100];
    snprintf(p, sizeof p, "%s/config.json", dir);
    size_t len;
    char *text = read_text_file(p, &len);
    cJSON *j = cJSON_Parse(text);
    if (!keep_old) cJSON_DeleteItemFromObject(j, key);
    if (json_value) cJSON_AddItemToObject(j, key, cJSON_Parse(json_value));
    char *out = cJSON_Print(j);
    write_text(p, out);
    free(out);
    free(text);
    cJSON_Delete(j);
}

static void set_config(const char *dir, const char *key, const char *json_value) { edit_config(dir, key, json_value, 0); }

/* child_hf_load that cannot hang the suite: a blocked open ends by SIGALRM
 * (no exit code, so the check fails). */
static void child_hf_load_alarm(const char *dir) {
    alarm(20);
    child_hf_load(dir);
}

static int rope_equal(const ModelConfig *a, const ModelConfig *b) {
    return a->rope_theta == b->rope_theta && a->rope_scaling == b->rope_scaling && a->rope_scaling_factor == b->rope_scaling_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_seq_len == b->rope_original_max_seq_len && a->rope_beta_fast == b->rope_beta_fast &&
           a->rope_beta_slow == b->rope_beta_slow && a->rope_attention_factor == b->rope_attention_factor &&
           a->rope_truncate == b->rope_truncate;
}

/* transformers 5 writes a Llama's RoPE as rope_parameters {rope_theta,
 * rope_type, that type's keys} and no top-level rope_theta / rope_scaling:
 * read as the same RoPE as transformers 4's layout of it, for theta alone
 * and for each rope_type llmtrain has; what it cannot do is one line. */
static void test_hf_rope_parameters(void) {
    char *d = variant("rope5", NULL);
    static const struct { const char *what, *theta, *scaling, *params; } cases[] = {
        {"theta only", "500000", "null", "{\"rope_theta\":500000,\"rope_type\":\"default\"}"},
        {"theta without a rope_type", "250000", "null", "{\"rope_theta\":250000}"},
        {"llama3", "500000", "{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                             "\"original_max_position_embeddings\":16}",
         "{\"rope_theta\":500000,\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
         "\"original_max_position_embeddings\":16}"},
        {"linear", "10000", "{\"rope_type\":\"linear\",\"factor\":4.0}", "{\"rope_theta\":10000,\"rope_type\":\"linear\",\"factor\":4.0}"},
        {"yarn", "1000000", "{\"rope_type\":\"yarn\",\"factor\":8.0,\"original_max_position_embeddings\":16,\"beta_fast\":16}",
         "{\"rope_theta\":1000000,\"rope_type\":\"yarn\",\"factor\":8.0,\"original_max_position_embeddings\":16,\"beta_fast\":16}"},
    };
    ModelConfig none;
    set_config(d, "rope_theta", NULL);
    set_config(d, "rope_scaling", NULL);
    hf_read_config(d, &none);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ModelConfig v4, v5, both;
        set_config(d, "rope_parameters", NULL);
        set_config(d, "rope_theta", cases[i].theta);
        set_config(d, "rope_scaling", cases[i].scaling);
        hf_read_config(d, &v4);
        set_config(d, "rope_parameters", cases[i].params);
        hf_read_config(d, &both);
        set_config(d, "rope_theta", NULL);
        set_config(d, "rope_scaling", NULL);
        hf_read_config(d, &v5);
        check(rope_equal(&v4, &v5) && rope_equal(&v4, &both) && !rope_equal(&v5, &none),
              "hf config: transformers 5's rope_parameters, %s: the RoPE of transformers 4's layout (theta %g, scaling %d), also with both "
              "layouts given; not the theta-10000 default", cases[i].what, v5.rope_theta, v5.rope_scaling);
    }
    set_config(d, "rope_parameters", "{\"rope_theta\":500000,\"rope_type\":\"dynamic\",\"factor\":2.0}");
    expect_die("hf config: rope_parameters rope_type dynamic", child_hf_config, d, EXIT_USAGE,
               "key rope_parameters: rope_type \"dynamic\" is not supported (llama3, linear, yarn or default)");
    set_config(d, "rope_parameters", "{\"rope_theta\":500000,\"rope_type\":\"linear\",\"factor\":2.0,\"mscale\":1}");
    expect_die("hf config: rope_parameters key the kind lacks", child_hf_config, d, EXIT_USAGE, "key rope_parameters.mscale: not supported");
    set_config(d, "rope_parameters", "{\"rope_theta\":-5,\"rope_type\":\"default\"}");
    expect_die("hf config: rope_parameters.rope_theta negative", child_hf_config, d, EXIT_USAGE, "key rope_parameters.rope_theta: expected a number");
    set_config(d, "rope_parameters", "{\"rope_theta\":500000,\"rope_type\":\"default\"}");
    set_config(d, "rope_theta", "10000");
    expect_die("hf config: rope_parameters and rope_theta disagree", child_hf_config, d, EXIT_USAGE,
               "keys rope_parameters and rope_theta / rope_scaling: they give another RoPE");
    set_config(d, "rope_theta", NULL);
    set_config(d, "rope_parameters", "[1]");
    expect_die("hf config: rope_parameters not an object", child_hf_config, d, EXIT_USAGE, "key rope_parameters: expected an object or null");
    set_config(d, "rope_parameters", NULL);
    set_config(d, "rope_theta", "10000");
    /* dropout: trained without, said once */
    ModelConfig c;
    char note[1200];
    set_config(d, "attention_dropout", "0.1");
    hf_read_config_note(d, &c, note, sizeof note);
    check(strstr(note, "config.json: ignored, llmtrain trains without dropout: attention_dropout 0.1") != NULL, "hf config: dropout above 0 noted (%s)", note);
    set_config(d, "attention_dropout", "0.0");
    hf_read_config_note(d, &c, note, sizeof note);
    check(note[0] == '\0', "hf config: dropout 0 not noted");
    set_config(d, "attention_dropout", NULL);
}

static void test_hf_errors(void) {
    char *d = variant("err_missing", edit_missing);
    expect_die("hf load: missing tensor", child_hf_load, d, EXIT_USAGE,
               "model.safetensors: missing tensor model.layers.1.mlp.up_proj.weight");
    d = variant("err_shape", edit_shape);
    expect_die("hf load: wrong shape", child_hf_load, d, EXIT_USAGE,
               "tensor model.layers.1.mlp.up_proj.weight has shape [64, 32], expected [48, 32]");
    d = variant("err_extra", edit_extra);
    expect_die("hf load: unexpected tensor", child_hf_load, d, EXIT_USAGE,
               "unexpected tensor model.layers.0.self_attn.q_proj.bias");

    d = variant("err_trunc", NULL);
    char st[1100];
    snprintf(st, sizeof st, "%s/model.safetensors", d);
    struct stat sb;
    stat(st, &sb);
    if (truncate(st, sb.st_size - 100) != 0) die(EXIT_INTERNAL, "truncate");
    expect_die("hf load: truncated file", child_hf_load, d, EXIT_USAGE, "outside the data section");
    if (truncate(st, 20) != 0) die(EXIT_INTERNAL, "truncate");
    expect_die("hf load: header length past EOF", child_hf_load, d, EXIT_USAGE, "runs past the end of the file");
    unlink(st);
    expect_die("hf load: no weights file", child_hf_load, d, EXIT_USAGE, "no model.safetensors or model.safetensors.index.json");

    /* rope_scaling objects refused: a kind not supported, a key missing or
     * foreign to its kind, a number out of range, bands or a ramp that do
     * not exist, a value of the wrong type */
#define L3 "\"rope_type\":\"llama3\",\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192"
    static const struct { const char *what, *rs, *want; } bad_rs[] = {
        {"rope_scaling dynamic", "{\"type\":\"dynamic\",\"factor\":2.0}",
         "config.json: key rope_scaling: rope_type \"dynamic\" is not supported (llama3, linear, yarn or default)"},
        {"linear without factor", "{\"type\":\"linear\"}", "key rope_scaling: missing key factor (rope_type linear)"},
        {"linear with llama3's key", "{\"rope_type\":\"linear\",\"factor\":2,\"low_freq_factor\":1}",
         "key rope_scaling.low_freq_factor: not supported (rope_type linear has factor)"},
        {"rope_scaling not an object", "[1]", "key rope_scaling: expected an object or null"},
        {"rope_scaling without rope_type", "{\"factor\":2.0}", "key rope_scaling: expected a string rope_type"},
        {"llama3 without factor", "{" L3 "}", "key rope_scaling: missing key factor (rope_type llama3)"},
        {"llama3 factor 0.5", "{" L3 ",\"factor\":0.5}", "key rope_scaling.factor: expected a number in [1, 1e+06]"},
        {"llama3 with an unknown key", "{" L3 ",\"factor\":8,\"mscale\":1}", "key rope_scaling.mscale: not supported"},
        {"llama3 high_freq_factor == low_freq_factor",
         "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}",
         "model.rope_high_freq_factor 4 must exceed model.rope_low_freq_factor 4"},
        {"llama3 original_max_position_embeddings 8192.5",
         "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":8192.5}",
         "key rope_scaling.original_max_position_embeddings: expected an integer in [1, 1.67772e+07]"},
        {"yarn with DeepSeek's mscale", "{\"rope_type\":\"yarn\",\"factor\":40,\"mscale\":1.0,\"mscale_all_dim\":1.0}",
         "key rope_scaling.mscale: not supported (rope_type yarn has factor, original_max_position_embeddings, beta_fast, "
         "beta_slow, attention_factor, truncate)"},
        {"yarn attention_factor 0", "{\"rope_type\":\"yarn\",\"factor\":4,\"attention_factor\":0}",
         "key rope_scaling.attention_factor: expected a number > 0"},
        {"yarn truncate 0", "{\"rope_type\":\"yarn\",\"factor\":4,\"truncate\":0}", "key rope_scaling.truncate: expected true or false"},
        {"yarn beta_fast == beta_slow", "{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":1,\"beta_slow\":1}",
         "model.rope_beta_fast 1 must exceed model.rope_beta_slow 1"},
    };
#undef L3
    d = variant("err_cfg", NULL);
    for (size_t b = 0; b < sizeof bad_rs / sizeof bad_rs[0]; b++) {
        char what[96];
        snprintf(what, sizeof what, "hf config: %s", bad_rs[b].what);
        set_config(d, "rope_scaling", bad_rs[b].rs);
        expect_die(what, child_hf_config, d, EXIT_USAGE, bad_rs[b].want);
    }
    ModelConfig rc;
    set_config(d, "rope_scaling", "{\"type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                                  "\"original_max_position_embeddings\":8192}");
    hf_read_config(d, &rc);
    check(rc.rope_scaling == 1 && rc.rope_scaling_factor == 32 && rc.rope_low_freq_factor == 1 && rc.rope_high_freq_factor == 4 &&
              rc.rope_original_max_seq_len == 8192,
          "hf config: Llama 3.2's rope_scaling (legacy \"type\" key) read as llama3, factor 32, 1, 4, 8192");
    /* YaRN: Hugging Face's defaults for the keys left out (the original
     * context: the file's max_position_embeddings), each key read when given */
    set_config(d, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4.0}");
    hf_read_config(d, &rc);
    check(rc.rope_scaling == ROPE_YARN && rc.rope_scaling_factor == 4 && rc.rope_original_max_seq_len == rc.max_seq_len &&
              rc.rope_beta_fast == 32 && rc.rope_beta_slow == 1 && rc.rope_attention_factor == 0 && rc.rope_truncate == 1,
          "hf config: yarn with only its factor: original context max_position_embeddings (%d), betas 32/1, the default "
          "attention factor, truncated",
          rc.max_seq_len);
    set_config(d, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":32.0,\"original_max_position_embeddings\":4096,"
                                  "\"beta_fast\":16,\"beta_slow\":2,\"attention_factor\":0.5,\"truncate\":false}");
    hf_read_config(d, &rc);
    check(rc.rope_scaling == ROPE_YARN && rc.rope_scaling_factor == 32 && rc.rope_original_max_seq_len == 4096 &&
              rc.rope_beta_fast == 16 && rc.rope_beta_slow == 2 && rc.rope_attention_factor == 0.5f && rc.rope_truncate == 0,
          "hf config: yarn with every key (gpt-oss's truncate false) read as given");
    set_config(d, "rope_scaling", "{\"rope_type\":\"default\"}");
    hf_read_config(d, &rc);
    check(rc.rope_scaling == 0, "hf config: rope_type default = no scaling");
    set_config(d, "rope_scaling", "null");
    set_config(d, "hidden_act", "\"gelu\"");
    expect_die("hf config: hidden_act gelu", child_hf_config, d, EXIT_USAGE, "key hidden_act");
    set_config(d, "hidden_act", NULL);
    /* a head_dim of its own (Qwen3's, and transformers' Llama's) is the
     * model's; 0 is no head, an odd one no RoPE */
    set_config(d, "head_dim", "16");
    hf_read_config(d, &rc);
    check(rc.head_dim == 16 && rc.qk_norm == 0, "hf config: head_dim 16 != hidden/heads read as model.head_dim 16 (llama: no QK-norm)");
    set_config(d, "model_type", "\"qwen3\"");
    hf_read_config(d, &rc);
    check(rc.head_dim == 16 && rc.qk_norm == 1, "hf config: model_type qwen3 read as Llama with model.qk_norm, head_dim 16");
    set_config(d, "model_type", "\"llama\"");
    set_config(d, "head_dim", "0");
    expect_die("hf config: head_dim 0", child_hf_config, d, EXIT_USAGE, "key head_dim: expected an integer in [1, 65536]");
    set_config(d, "head_dim", "7");
    expect_die("hf config: head_dim 7", child_hf_config, d, EXIT_USAGE, "model.head_dim 7 (the head dimension) must be even for RoPE");
    set_config(d, "head_dim", NULL);
    set_config(d, "attention_bias", "true");
    expect_die("hf config: attention_bias true", child_hf_config, d, EXIT_USAGE, "key attention_bias");
    set_config(d, "attention_bias", NULL);
    set_config(d, "hidden_size", NULL);
    expect_die("hf config: missing hidden_size", child_hf_config, d, EXIT_USAGE, "config.json: missing key hidden_size");
    set_config(d, "hidden_size", "32");
    set_config(d, "model_type", "\"mistral\"");
    expect_die("hf config: model_type mistral", child_hf_config, d, EXIT_USAGE, "key model_type");
    set_config(d, "model_type", "\"llama\"");
    set_config(d, "intermediate_size", "64");
    expect_die("hf config/weights mismatch: wrong shape", child_hf_load, d, EXIT_USAGE, "has shape [48, 32], expected [64, 32]");

    char *g = tpath("err_gpt2cfg");
    mkdir_p(g);
    copy_file(tpath("hf_gpt2/config.json"), tpath("err_gpt2cfg/config.json"));
    set_config(g, "n_inner", "100");
    expect_die("hf config: gpt2 n_inner != 4C", child_hf_config, g, EXIT_USAGE, "key n_inner");
    set_config(g, "n_inner", "128");
    ModelConfig c;
    hf_read_config(g, &c);
    check(c.ffn_hidden == 128, "hf config: gpt2 n_inner = 4C accepted");
    set_config(g, "activation_function", "\"relu\"");
    expect_die("hf config: gpt2 activation relu", child_hf_config, g, EXIT_USAGE, "key activation_function");
    set_config(g, "activation_function", "\"gelu_pytorch_tanh\"");
    hf_read_config(g, &c);
    check(c.arch == ARCH_GPT2 && c.tie_embeddings && c.n_kv_head == 4, "hf config: gpt2 gelu_pytorch_tanh accepted");
    set_config(g, "tie_word_embeddings", "false");
    expect_die("hf config: gpt2 untied", child_hf_config, g, EXIT_USAGE, "key tie_word_embeddings");
    expect_die("hf config: missing config.json", child_hf_config, tpath("nowhere"), EXIT_USAGE, "config.json: cannot read");

    /* A key twice: Python's json (so transformers) keeps the last, cJSON
     * finds the first; the file is refused, not read as another model. */
    d = variant("err_dup", NULL);
    edit_config(d, "hidden_size", "64", 1);
    expect_die("hf config: hidden_size twice", child_hf_config, d, EXIT_USAGE, "config.json: key hidden_size appears twice");
    d = variant("err_dup_nested", NULL);
    set_config(d, "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                                  "\"original_max_position_embeddings\":8192,\"factor\":32.0}");
    expect_die("hf config: rope_scaling.factor twice", child_hf_config, d, EXIT_USAGE,
               "config.json: key rope_scaling.factor appears twice");
    set_config(d, "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                                  "\"original_max_position_embeddings\":8192}");
    hf_read_config(d, &c);
    check(c.rope_scaling == 1 && c.rope_scaling_factor == 32, "hf config: the same rope_scaling with factor once is read");

    /* index.json: a tensor named twice in weight_map, and a FIFO named as a
     * shard (refused, not opened for reading: that would wait for a writer) */
    char *x = tpath("err_index");
    mkdir_p(x);
    copy_file(tpath("hf_llama_sharded/config.json"), tpath("err_index/config.json"));
    copy_file(tpath("hf_llama_sharded/model-00001-of-00002.safetensors"), tpath("err_index/a.safetensors"));
    write_text(tpath("err_index/model.safetensors.index.json"),
               "{\"metadata\":{},\"weight_map\":{\"model.embed_tokens.weight\":\"a.safetensors\","
               "\"model.norm.weight\":\"a.safetensors\",\"model.embed_tokens.weight\":\"a.safetensors\"}}");
    expect_die("hf index: a tensor twice in weight_map", child_hf_load, x, EXIT_USAGE,
               "model.safetensors.index.json: key weight_map.model.embed_tokens.weight appears twice");
    if (mkfifo(tpath("err_index/fifo.safetensors"), 0600) != 0) die(EXIT_INTERNAL, "mkfifo failed");
    write_text(tpath("err_index/model.safetensors.index.json"),
               "{\"weight_map\":{\"model.embed_tokens.weight\":\"a.safetensors\",\"model.norm.weight\":\"fifo.safetensors\"}}");
    expect_die("hf index: a FIFO as a shard", child_hf_load_alarm, x, EXIT_USAGE,
               "fifo.safetensors: not a regular file (expected a safetensors file)");
}

/* ------------------------------------------------- training checkpoints */

static const char *JOB = "{\"model\":{\"arch\":\"llama\",\"n_layer\":2,\"n_embd\":32,\"n_head\":4,\"n_kv_head\":2,"
                         "\"ffn_hidden\":48,\"vocab_size\":64,\"max_seq_len\":32},\"data\":{\"train\":\"x.bin\"},"
                         "\"optim\":{\"lr\":0.001}}";

static ModelConfig ck_cfg(void) {
    ModelConfig c = llama_cfg(0);
    c.vocab_size = 64; /* divisible by tp 2 */
    return c;
}

/* The global (tp = 1) state the tests write: distinct values everywhere. */
typedef struct GState { Model g; float *p, *m, *v; } GState;

static void gstate_init(GState *G) {
    ModelConfig c = ck_cfg();
    model_layout(&G->g, &c, 1, 1, 0);
    size_t n = G->g.n_params;
    G->p = malloc_check(n * 4); G->m = malloc_check(n * 4); G->v = malloc_check(n * 4);
    for (size_t i = 0; i < n; i++) { G->p[i] = (float)i * 1e-3f - 1.0f; G->m[i] = 0.5f + (float)i * 1e-5f; G->v[i] = 2.0f + (float)i * 1e-6f; }
}

/* This layout's local TP-rank-tr state of kind k (host, n_params floats). */
static float *local_state(const GState *G, const Model *lm, int k) {
    const float *src[3] = {G->p, G->m, G->v};
    float *out = calloc_check(lm->n_params, sizeof(float));
    for (int i = 0; i < lm->n_specs; i++) {
        const ParamSpec *s = &lm->specs[i], *gs = model_find(&G->g, s->name);
        model_tp_copy(lm, s, (float *)src[k] + gs->offset, out + s->offset, 0);
    }
    return out;
}

/* Write the global state as layout L would (every rank its owned slices,
 * through the background writer), then the manifest and the commit. */
static int save_as(const GState *G, const CkptLayout *L, const char *root, int step, const Config *cfg, char *why, size_t wn) {
    uint64_t *bytes = calloc_check((size_t)L->world, 8), *sums = calloc_check((size_t)L->world, 8);
    Model lm0;
    ModelConfig c = ck_cfg();
    char tmp[1200], fin[1200];
    ckpt_step_dir(tmp, sizeof tmp, root, step, 1);
    ckpt_step_dir(fin, sizeof fin, root, step, 0);
    int rc = 0;
    for (int r = 0; r < L->world; r++) {
        int tr = r % L->tp, si = (r / L->tp) % L->shard, ri = r / (L->tp * L->shard);
        Model lm;
        model_layout(&lm, &c, L->shard, L->tp, tr);
        size_t own = ckpt_owned_floats(&lm, L->shard, si, L->replicate, ri), pos = 0;
        CkptWriter *w = ckpt_writer_new(3 * own);
        float *stage = ckpt_writer_staging(w);
        for (int k = 0; k < 3; k++) {
            float *loc = local_state(G, &lm, k);
            for (int ch = 0; ch < lm.n_chunks; ch++) {
                size_t lo, hi;
                ckpt_owned_range(&lm, ch, L->shard, si, L->replicate, ri, &lo, &hi);
                memcpy(stage + pos, loc + lo, (hi - lo) * 4);
                pos += hi - lo;
            }
            free(loc);
        }
        char path[1300];
        snprintf(path, sizeof path, "%s/rank_%05d.bin", tmp, r);
        ckpt_writer_write(w, path, 3 * own);
        CkptJobResult res = ckpt_writer_take(w); /* still busy: take must not reset */
        if (ckpt_writer_wait(w) != CKPT_DONE) { snprintf(why, wn, "write failed"); rc = -1; }
        res = ckpt_writer_take(w);
        if (res.state != CKPT_DONE || ckpt_writer_state(w) != CKPT_IDLE) { snprintf(why, wn, "writer state after take"); rc = -1; }
        bytes[r] = res.bytes;
        sums[r] = res.checksum;
        ckpt_writer_free(w);
        model_free(&lm);
    }
    TrainState st = {0};
    st.step = step;
    st.seq_cursor = (1ull << 40) + 3;
    st.rng = 0xDEADBEEFCAFEF00Dull;
    st.nonfinite_total = 2;
    st.norm_n = 23;
    st.spike_len = 1;
    st.spikes = 4;
    for (int i = 0; i < CKPT_SPIKE_WINDOW; i++) st.norm_hist[i] = 0.1 * i + 1e-17;
    model_layout(&lm0, &c, L->shard, L->tp, 0);
    char *text = ckpt_manifest_text(&lm0, L, bytes, sums, cfg, &st);
    if (rc == 0) rc = ckpt_commit(tmp, fin, root, text, why, wn);
    free(text);
    model_free(&lm0);
    free(bytes);
    free(sums);
    return rc;
}

/* Load a checkpoint into TP rank tr of tp (padding pad) and compare every
 * tensor of all three kinds with the global state, bit for bit. */
static int load_matches(const GState *G, const char *dir, int tp, int tr, int pad) {
    char why[600];
    CkptManifest *mf = ckpt_manifest_open(dir, why, sizeof why);
    if (!mf) { printf("  %s\n", why); return 0; }
    ModelConfig c = ck_cfg();
    Model lm;
    model_layout(&lm, &c, pad, tp, tr);
    float *got[3], *want[3];
    for (int k = 0; k < 3; k++) { got[k] = calloc_check(lm.n_params, 4); want[k] = local_state(G, &lm, k); }
    size_t lo[64], hi[64];
    ckpt_full_ranges(&lm, lo, hi);
    ckpt_manifest_load(mf, &lm, lo, hi, got[0], got[1], got[2]);
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < lm.n_specs; i++) {
            const ParamSpec *s = &lm.specs[i];
            if (memcmp(got[k] + s->offset, want[k] + s->offset, s->numel * 4) != 0) { ok = 0; printf("  kind %d %s differs\n", k, s->name); }
        }
    }
    /* a shard: shard index 1 of 3 of every chunk, packed, holds the same floats
     * (padding aside) and nothing is read outside it */
    int S = 3;
    if (pad % S == 0) {
        size_t n = 0;
        for (int c = 0; c < lm.n_chunks; c++) {
            size_t len = lm.chunk_size[c] / (size_t)S;
            lo[c] = lm.chunk_offset[c] + len;
            hi[c] = lo[c] + len;
            n += len;
        }
        float *part = calloc_check(n, 4);
        ckpt_manifest_load(mf, &lm, lo, hi, NULL, part, NULL);
        size_t pos = 0;
        for (int c = 0; c < lm.n_chunks; c++) {
            for (int i = 0; i < lm.n_specs; i++) {
                const ParamSpec *s = &lm.specs[i];
                if (s->chunk != c) continue;
                size_t a = s->offset > lo[c] ? s->offset : lo[c], b = s->offset + s->numel < hi[c] ? s->offset + s->numel : hi[c];
                if (a < b && memcmp(part + pos + (a - lo[c]), want[1] + a, (b - a) * 4) != 0) { ok = 0; printf("  shard of %s differs\n", s->name); }
            }
            pos += hi[c] - lo[c];
        }
        free(part);
    }
    for (int k = 0; k < 3; k++) {
        free(got[k]);
        free(want[k]);
    }
    model_free(&lm);
    ckpt_manifest_close(mf);
    return ok;
}

/* The manifest's own checksum (format /3): text with its seal made again
 * over the edited body, as a writer of that text would have. */
static void reseal(char *text) {
    const char *key = "\"manifest_checksum\": \"";
    char *at = NULL;
    for (char *q = strstr(text, key); q; q = strstr(q + 1, key)) at = q;
    if (!at) return;
    CkptHash h;
    ckpt_hash_init(&h);
    ckpt_hash_update(&h, text, (size_t)(at - text));
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ckpt_hash_final(&h));
    memcpy(at + strlen(key), hex, 16);
}

/* text with the first `from` after `after` replaced by `to` (malloc'd;
 * NULL when not found) */
static char *edit(const char *text, const char *after, const char *from, const char *to) {
    const char *a = strstr(text, after);
    const char *f = a ? strstr(a, from) : NULL;
    if (!f) return NULL;
    size_t n = strlen(text), nf = strlen(from), nt = strlen(to);
    char *out = malloc_check(n - nf + nt + 1);
    memcpy(out, text, (size_t)(f - text));
    memcpy(out + (f - text), to, nt);
    memcpy(out + (f - text) + nt, f + nf, n - (size_t)(f - text) - nf + 1);
    return out;
}

/* Open (and check against the model) a manifest text placed in dir; 0 when
 * it is refused, with the reason in why. */
static int manifest_accepted(const char *dir, const char *text, const Model *lm, char *why, size_t wn) {
    char man[1200];
    snprintf(man, sizeof man, "%s/manifest.json", dir);
    write_text(man, text);
    CkptManifest *mf = ckpt_manifest_open(dir, why, wn);
    int ok = mf && ckpt_manifest_check(mf, lm, why, wn) == 0;
    ckpt_manifest_close(mf);
    return ok;
}

/* A manifest of format /3 carries a checksum of its own text: every bit of
 * it is covered, and a manifest whose text holds but whose slices cannot
 * be loaded (a tensor missing, a gap, an overlap, a slice past its tensor)
 * is refused by ckpt_manifest_check before anything is read. */
static void test_manifest_seal(const char *dir12) {
    char man[1200], why[1400], dir[1024];
    snprintf(man, sizeof man, "%s/manifest.json", dir12);
    size_t len;
    char *text = read_text_file(man, &len);
    snprintf(dir, sizeof dir, "%s", tpath("seal"));
    mkdir(dir, 0755);
    ModelConfig c = ck_cfg();
    Model lm;
    model_layout(&lm, &c, 1, 1, 0);
    check(text && strstr(text, "\"format\": \"llmtrain-checkpoint/3\"") && manifest_accepted(dir, text, &lm, why, sizeof why),
          "seal: the written manifest is format /3 and passes open and check (%s)", why);
    /* every byte, one bit of it flipped (bit i % 8 of byte i) */
    char *t = malloc_check(len + 1);
    size_t accepted = 0, first = (size_t)-1;
    for (size_t i = 0; i < len; i++) {
        memcpy(t, text, len + 1);
        t[i] ^= (char)(1u << (i % 8));
        if (manifest_accepted(dir, t, &lm, why, sizeof why)) {
            accepted++;
            if (first == (size_t)-1) first = i;
        }
    }
    check(accepted == 0, "seal: each of the %zu bytes with one bit flipped is refused (%zu accepted, first at byte %zu)", len, accepted, first);
    /* one-character edits of each kind of field: refused, the seal named */
    static const char *const edits[][4] = {
        {"slice offset", "\"slices\": [[", ", 0, ", ", 4, "},
        {"slice length", "\"slices\": [[", "]", "1]"},
        {"step", "\"step\": ", "12", "13"},
        {"seq_cursor", "\"seq_cursor\": \"", "3\"", "2\""},
        {"tensor name", "\"tensors\": [", "\"name\": \"", "\"name\": \"x"},
        {"kind", "\"kind\": \"exp_avg", "\"exp_avg\"", "\"exp_avG\""},
        {"file checksum", "\"files\": [", "\"checksum\": \"", "\"checksum\": \"0"},
        {"file bytes", "\"files\": [", "\"bytes\": ", "\"bytes\": 1"},
        {"layout", "\"layout\": ", "\"replicate\": 2", "\"replicate\": 1"},
        {"config", "\"config\": ", "{", "{ "},
    };
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char *x = edit(text, edits[e][1], edits[e][2], edits[e][3]);
        int acc = x ? manifest_accepted(dir, x, &lm, why, sizeof why) : 1;
        check(x && !acc && (strstr(why, "its manifest_checksum says") || strstr(why, "does not end with its manifest_checksum")),
              "seal: a one-character edit of the %s is refused (%s)", edits[e][0], why);
        free(x);
    }
    /* the seal's own digits: one changed, one upper-cased */
    for (int up = 0; up < 2; up++) {
        char *y = strdup(text), *hex = strstr(y, "\"manifest_checksum\": \"") + 22;
        int i = 0;
        while (up && i < 15 && !(hex[i] >= 'a' && hex[i] <= 'f')) i++;
        hex[i] = up ? (char)(hex[i] - 32) : (hex[i] == '0' ? '1' : '0');
        check(!manifest_accepted(dir, y, &lm, why, sizeof why) && (strstr(why, "its manifest_checksum says") || strstr(why, "does not end with")),
              "seal: a digit of the manifest_checksum %s is refused (%s)", up ? "upper-cased" : "changed", why);
        free(y);
    }
    /* format /3 -> /2 keeping the seal: not an old manifest, an edited one */
    char *x = edit(text, "\"format\"", "/3", "/2");
    check(x && !manifest_accepted(dir, x, &lm, why, sizeof why) && strstr(why, "has no manifest_checksum, but this manifest has one"),
          "seal: format /3 edited to /2 (seal kept) is refused (%s)", why);
    free(x);
    /* an old (/2) manifest, without a seal, is still read, unverified */
    x = edit(text, "\"format\"", "/3", "/2");
    char *cut = x ? strstr(x, ",\n\"manifest_checksum\"") : NULL;
    if (cut) strcpy(cut, "\n}\n");
    snprintf(man, sizeof man, "%s/manifest.json", dir);
    if (x) write_text(man, x);
    CkptManifest *mf = ckpt_manifest_open(dir, why, sizeof why);
    check(cut && mf && !ckpt_manifest_sealed(mf) && ckpt_manifest_check(mf, &lm, why, sizeof why) == 0,
          "seal: a format /2 manifest (no seal) still opens and checks, marked unsealed%s%s", mf ? "" : ": ", mf ? "" : why);
    ckpt_manifest_close(mf);
    free(x);
    /* sealed again after the edit (a writer bug, not damage on disk): the
     * check finds what loading would have died on */
    static const char *const bad[][5] = {
        {"a tensor missing (one kind renamed)", "\"kind\": \"exp_avg_sq\"", "\"name\": \"", "\"name\": \"zz", "no tensor"},
        {"a gap (first element 1 instead of 0)", "\"slices\": [[", "0, 0, 0, 0, ", "0, 0, 0, 1, ", "gap, overlap or run past"},
        {"a slice past its tensor (one element longer)", "\"slices\": [[", "]", "1]", "gap, overlap or run past"},
        {"a shape of another model", "\"shape\": [", "[", "[1", "shape, local shape or tp_axis"},
        {"a tp_axis of another layout", "\"tp_axis\": ", "0", "1", "shape, local shape or tp_axis"},
    };
    for (size_t e = 0; e < sizeof bad / sizeof bad[0]; e++) {
        x = edit(text, bad[e][1], bad[e][2], bad[e][3]);
        why[0] = '\0';
        if (x) reseal(x);
        snprintf(man, sizeof man, "%s/manifest.json", dir);
        if (x) write_text(man, x);
        mf = x ? ckpt_manifest_open(dir, why, sizeof why) : NULL;
        int rc = mf ? ckpt_manifest_check(mf, &lm, why, sizeof why) : 0;
        check(mf && rc == -1 && strstr(why, bad[e][4]), "check: resealed manifest with %s: opens, then refused before loading (%s)", bad[e][0],
              mf ? why : "did not open");
        ckpt_manifest_close(mf);
        free(x);
    }
    free(t);
    free(text);
    model_free(&lm);
}

static void child_load_other_model(const char *dir) {
    char why[600];
    CkptManifest *mf = ckpt_manifest_open(dir, why, sizeof why);
    ModelConfig c = ck_cfg();
    c.vocab_size = 66;
    Model lm;
    model_layout(&lm, &c, 1, 1, 0);
    float *p = calloc_check(lm.n_params, 4);
    size_t lo[64], hi[64];
    ckpt_full_ranges(&lm, lo, hi);
    ckpt_manifest_load(mf, &lm, lo, hi, p, NULL, NULL);
}

static void flip_byte(const char *path, long off) {
    FILE *f = fopen_check(path, "r+b");
    fseek(f, off, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(ch ^ 0x40, f);
    fclose_check(f, path);
}

static void test_ckpt(void) {
    GState G;
    gstate_init(&G);
    Config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.json_text = strdup(JOB);
    char root[1024], why[600];
    snprintf(root, sizeof root, "%s", tpath("ckpts")); /* tpath's buffers are reused */

    /* checksum: streaming in odd pieces equals one pass; any bit flip shows */
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
    CkptHash h1, h2;
    ckpt_hash_init(&h1); ckpt_hash_update(&h1, buf, 1000);
    ckpt_hash_init(&h2); ckpt_hash_update(&h2, buf, 3); ckpt_hash_update(&h2, buf + 3, 500); ckpt_hash_update(&h2, buf + 503, 497);
    uint64_t a = ckpt_hash_final(&h1), b = ckpt_hash_final(&h2);
    buf[777] ^= 1;
    ckpt_hash_init(&h1); ckpt_hash_update(&h1, buf, 1000);
    check(a == b && ckpt_hash_final(&h1) != a, "checksum: streaming in pieces equals one pass; a flipped bit changes it");

    /* ownership: every local float written exactly once per TP rank, replicas split the writing */
    {
        ModelConfig c = ck_cfg();
        Model lm;
        model_layout(&lm, &c, 4, 2, 1);
        unsigned char *cnt = calloc_check(lm.n_params, 1);
        for (int si = 0; si < 4; si++)
            for (int ri = 0; ri < 3; ri++)
                for (int ch = 0; ch < lm.n_chunks; ch++) {
                    size_t lo, hi;
                    ckpt_owned_range(&lm, ch, 4, si, 3, ri, &lo, &hi);
                    for (size_t x = lo; x < hi; x++) cnt[x]++;
                }
        int once = 1;
        for (size_t x = 0; x < lm.n_params; x++) once &= cnt[x] == 1;
        size_t f0 = ckpt_owned_floats(&lm, 4, 0, 3, 0), f2 = ckpt_owned_floats(&lm, 4, 0, 3, 2);
        check(once && f0 > 0 && f0 < lm.n_params / 10 && f2 + 8 >= f0, "ownership: shard 4 x replicate 3 covers each float once, replicas split evenly (%zu, %zu of %zu)",
              f0, f2, lm.n_params);
        free(cnt);
        model_free(&lm);
    }

    /* write with tp 2 x shard 2 x replicate 2 (8 ranks), read into other layouts */
    CkptLayout L8 = {8, 2, 2, 2};
    int rc = save_as(&G, &L8, root, 12, &cfg, why, sizeof why);
    check(rc == 0 && exists(tpath("ckpts/step_00000012/manifest.json")) && exists(tpath("ckpts/step_00000012/rank_00007.bin")) &&
              !exists(tpath("ckpts/step_00000012.tmp")),
          "save: 8 rank files + manifest committed, no .tmp left%s%s", rc ? ": " : "", rc ? why : "");
    char dir12[1024];
    snprintf(dir12, sizeof dir12, "%s", tpath("ckpts/step_00000012"));
    check(load_matches(&G, dir12, 1, 0, 1), "load: tp2 x shard2 x replicate2 -> one rank (tp 1): params, exp_avg, exp_avg_sq bit-identical");
    test_manifest_seal(dir12);
    check(load_matches(&G, dir12, 2, 1, 3) && load_matches(&G, dir12, 2, 0, 1), "load: -> tp 2 (other padding): each TP rank's slices bit-identical, and shard 1 of 3 alone");
    CkptLayout L1 = {1, 1, 1, 1};
    rc = save_as(&G, &L1, root, 7, &cfg, why, sizeof why);
    char dir7[1024];
    snprintf(dir7, sizeof dir7, "%s", tpath("ckpts/step_00000007"));
    check(rc == 0 && load_matches(&G, dir7, 2, 1, 3) && load_matches(&G, dir7, 1, 0, 6), "load: one rank -> tp 2 rank 1 and -> tp 1 with shard 1 of 3 alone, bit-identical");

    CkptManifest *mf = ckpt_manifest_open(dir12, why, sizeof why);
    const TrainState *st = mf ? ckpt_manifest_state(mf) : NULL;
    CkptLayout L = mf ? ckpt_manifest_layout(mf) : (CkptLayout){0, 0, 0, 0};
    check(st && st->step == 12 && st->seq_cursor == (1ull << 40) + 3 && st->rng == 0xDEADBEEFCAFEF00Dull && st->nonfinite_total == 2 &&
              st->norm_n == 23 && st->spike_len == 1 && st->spikes == 4 && st->norm_hist[19] == 0.1 * 19 + 1e-17,
          "manifest: step, 64-bit cursor and rng, counters and spike window round-trip exactly");
    check(L.world == 8 && L.tp == 2 && L.shard == 2 && L.replicate == 2, "manifest: layout recorded");
    Config cfg2;
    if (mf) {
        config_load_string(&cfg2, ckpt_manifest_config(mf), "manifest");
        check(cfg2.model.vocab_size == 64 && cfg2.lr == 6e-4f, "manifest: config_load_string takes the model section (the job's lr 0.001 not)");
        config_free(&cfg2);
        /* a stored job this binary would refuse outside its model section
         * (a key since renamed, a duplicate) still gives its model */
        const char *skew = "{\"train\": {\"stepz\": 3, \"steps\": 1, \"steps\": 2}, \"optimizer\": 1, "
                           "\"model\": {\"arch\": \"llama\", \"n_layer\": 3, \"n_embd\": 32, \"n_head\": 4, \"vocab_size\": 64}}";
        config_load_string(&cfg2, skew, "manifest");
        check(cfg2.model.n_layer == 3 && cfg2.model.vocab_size == 64 && cfg2.model.n_kv_head == 4,
              "manifest: a stored config with keys this binary refuses outside the model section gives its model");
        config_free(&cfg2);
        check(ckpt_manifest_verify(mf, 0, 1, why, sizeof why) == 0, "verify: all checksums hold");
        ckpt_manifest_close(mf);
    }
    expect_die("load: checkpoint of another model", child_load_other_model, dir12, EXIT_USAGE, "tensor wte.weight has 2048 elements, this model expects 2112");

    /* resolve / list: newest complete; .tmp and folders without a manifest are not candidates */
    mkdir_p(tpath("ckpts/step_00000099.tmp"));
    copy_file(tpath("ckpts/step_00000012/manifest.json"), tpath("ckpts/step_00000099.tmp/manifest.json"));
    mkdir_p(tpath("ckpts/step_00000050"));
    char dir[1024];
    rc = ckpt_resolve(root, dir, sizeof dir);
    check(rc == 0 && strcmp(dir, dir12) == 0, "resolve(root): newest complete step (%s)", rc == 0 ? dir : "none");
    rc = ckpt_resolve(dir7, dir, sizeof dir);
    check(rc == 0 && strcmp(dir, dir7) == 0, "resolve(step dir): the folder itself");
    mkdir_p(tpath("empty_root"));
    check(ckpt_resolve(tpath("empty_root"), dir, sizeof dir) == -1 && ckpt_resolve(tpath("missing_root"), dir, sizeof dir) == -1,
          "resolve: -1 for an empty or missing root");
    char list[3][1024];
    int nl = ckpt_list(root, &list[0][0], 1024, 3);
    check(nl == 2 && strcmp(list[0], dir12) == 0 && strcmp(list[1], dir7) == 0, "list: complete steps newest first (%d)", nl);
    ckpt_remove_partial(root);
    check(!exists(tpath("ckpts/step_00000099.tmp")) && exists(dir12), "remove_partial: .tmp folders gone, complete ones kept");

    /* damage: each is reported by open/verify, never loaded */
    char f3[1200];
    snprintf(f3, sizeof f3, "%s/rank_00003.bin", dir12);
    flip_byte(f3, 100);
    mf = ckpt_manifest_open(dir12, why, sizeof why);
    rc = mf ? ckpt_manifest_verify(mf, 3 % 2, 2, why, sizeof why) : 0;
    check(mf && rc == -1 && strstr(why, "rank_00003.bin: checksum"), "verify: a flipped byte in a rank file fails its checksum (%s)", why);
    rc = mf ? ckpt_manifest_verify(mf, 0, 2, why, sizeof why) : -1;
    check(rc == 0, "verify: ranks split the checksum reading (rank 0 of 2 does not read file 3)");
    ckpt_manifest_close(mf);
    flip_byte(f3, 100);
    if (truncate(f3, 64) != 0) die(EXIT_INTERNAL, "truncate");
    mf = ckpt_manifest_open(dir12, why, sizeof why);
    rc = mf ? ckpt_manifest_verify(mf, 0, 8, why, sizeof why) : 0;
    check(rc == -1 && strstr(why, "64 bytes, the manifest says"), "verify: a truncated rank file is caught by any rank (%s)", why);
    ckpt_manifest_close(mf);
    char man[1200];
    snprintf(man, sizeof man, "%s/manifest.json", dir7);
    size_t mlen;
    char *mtext = read_text_file(man, &mlen);
    write_bytes(man, mtext, mlen / 2);
    mf = ckpt_manifest_open(dir7, why, sizeof why);
    check(!mf && strstr(why, "not valid JSON (truncated?)"), "open: a truncated manifest is refused (%s)", why);
    free(mtext);
    unlink(man);
    mf = ckpt_manifest_open(dir7, why, sizeof why);
    check(!mf && strstr(why, "manifest.json: cannot read"), "open: a missing manifest is refused (%s)", why);

    /* A checkpoint.dir the first checkpoint creates survives a power loss:
     * each directory made (the root's missing parents, the root, the step's
     * .tmp) has its parent fsynced, and the commit's rename its root. */
    {
        char droot[1024];
        snprintf(droot, sizeof droot, "%s", tpath("fresh/a/ckpts"));
        fsync_log_start();
        rc = save_as(&G, &L1, droot, 4, &cfg, why, sizeof why);
        int n_logged = fsync_log_stop();
        const char *parents[] = {TMP, tpath("fresh"), tpath("fresh/a"), droot};
        char missing[1200] = "";
        for (size_t i = 0; i < sizeof parents / sizeof parents[0]; i++)
            if (!fsync_logged(parents[i])) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", parents[i]);
        check(rc == 0 && !missing[0], "save into a new checkpoint.dir: the parents of each directory it made fsynced (%d fsyncs; not:%s)",
              n_logged, missing[0] ? missing : " none");
    }

    /* commit over an existing step replaces it; keep_last prunes only complete folders */
    char proot[1024];
    snprintf(proot, sizeof proot, "%s", tpath("prune"));
    int okc = 1;
    for (int s = 3; s <= 12; s++)
        if (s == 3 || s == 5 || s == 7 || s == 12) okc &= save_as(&G, &L1, proot, s, &cfg, why, sizeof why) == 0;
    okc &= save_as(&G, &L1, proot, 12, &cfg, why, sizeof why) == 0;
    check(okc && exists(tpath("prune/step_00000012/manifest.json")) && !exists(tpath("prune/step_00000012.old")),
          "commit: saving an existing step replaces it");
    mkdir_p(tpath("prune/step_00000001.tmp"));
    int removed = ckpt_prune(proot, 2, 12);
    check(removed == 2 && !exists(tpath("prune/step_00000003")) && !exists(tpath("prune/step_00000005")) &&
              exists(tpath("prune/step_00000007/manifest.json")) && exists(tpath("prune/step_00000012/manifest.json")) &&
              exists(tpath("prune/step_00000001.tmp")),
          "prune(keep_last=2): the two oldest complete steps removed, newest two and incomplete folders kept (removed %d)", removed);
    check(ckpt_prune(proot, 0, 12) == 0 && exists(tpath("prune/step_00000007/manifest.json")), "prune(keep_last=0): keeps everything");
    /* a run resumed from below a newer complete-looking folder (damaged, or
     * another lineage) completes step 9: the newer ones neither count nor go */
    okc = save_as(&G, &L1, proot, 20, &cfg, why, sizeof why) == 0 && save_as(&G, &L1, proot, 9, &cfg, why, sizeof why) == 0;
    removed = ckpt_prune(proot, 1, 9);
    check(okc && removed == 1 && exists(tpath("prune/step_00000009/manifest.json")) && !exists(tpath("prune/step_00000007")) &&
              exists(tpath("prune/step_00000012/manifest.json")) && exists(tpath("prune/step_00000020/manifest.json")),
          "prune(keep_last=1) after step 9: step 9 kept, 7 removed, 12 and 20 (past it) untouched (removed %d)", removed);
    /* died inside a replacement: step 12 moved aside, its new copy complete
     * in .tmp; and a stale .old beside a complete step 20 */
    int mv = rename(tpath("prune/step_00000012"), tpath("prune/step_00000012.old")) == 0;
    mkdir_p(tpath("prune/step_00000012.tmp"));
    copy_file(tpath("prune/step_00000009/manifest.json"), tpath("prune/step_00000012.tmp/manifest.json"));
    mkdir_p(tpath("prune/step_00000020.old"));
    copy_file(tpath("prune/step_00000009/manifest.json"), tpath("prune/step_00000020.old/manifest.json"));
    ckpt_remove_partial(proot);
    check(mv && exists(tpath("prune/step_00000012/manifest.json")) && !exists(tpath("prune/step_00000012.old")) &&
              !exists(tpath("prune/step_00000012.tmp")) && !exists(tpath("prune/step_00000020.old")) &&
              exists(tpath("prune/step_00000020/manifest.json")),
          "remove_partial: a complete step_12.old whose step_12 is missing is renamed back; .tmp and a stale .old removed");

    /* a write that cannot happen reports, leaves no file, and the writer survives */
    CkptWriter *w = ckpt_writer_new(16);
    write_bytes(tpath("afile"), "x", 1);
    ckpt_writer_write(w, tpath("afile/sub/rank.bin"), 16);
    int ws = ckpt_writer_wait(w);
    CkptJobResult res = ckpt_writer_take(w);
    check(ws == CKPT_FAILED && strstr(res.error, "cannot create directory"), "writer: failure reported as one line (%s)", res.error);
    ckpt_writer_copy(w, dir12, tpath("copy.bin")); /* a directory cannot be read as a file */
    ws = ckpt_writer_wait(w);
    res = ckpt_writer_take(w);
    check(ws == CKPT_FAILED && !exists(tpath("copy.bin")), "writer: a failed copy leaves no partial file (%s)", res.error);
    /* the copy buffer not to be had: the copy fails, the process and the writer go on */
    malloc_fail_size = (size_t)16 << 20;
    ckpt_writer_copy(w, tpath("prune/step_00000009/manifest.json"), tpath("copy.bin"));
    ws = ckpt_writer_wait(w);
    res = ckpt_writer_take(w);
    malloc_fail_size = 0;
    check(ws == CKPT_FAILED && strstr(res.error, "no memory for the 16 MiB copy buffer") && !exists(tpath("copy.bin")),
          "writer: a copy buffer it cannot allocate fails the copy, not the process (%s)", res.error);
    ckpt_writer_copy(w, tpath("prune/step_00000009/manifest.json"), tpath("copy.bin"));
    ws = ckpt_writer_wait(w);
    res = ckpt_writer_take(w);
    check(ws == CKPT_DONE && exists(tpath("copy.bin")), "writer: the next copy succeeds (%s)", res.error);
    ckpt_writer_free(w);

    free(cfg.json_text);
    model_free(&G.g);
    free(G.p); free(G.m); free(G.v);
}

int main(void) {
    snprintf(TMP, sizeof TMP, "/tmp/test_ckpt_XXXXXX");
    if (!mkdtemp(TMP)) die(EXIT_INTERNAL, "mkdtemp failed");
    test_st_roundtrip();
    test_st_dtypes();
    test_st_errors();
    test_st_write_error();
    test_gpt2();
    test_llama();
    test_rope_scaling();
    test_bf16_load();
    test_sharded();
    test_hf_errors();
    test_hf_rope_parameters();
    test_ckpt();
    if (n_fail == 0 && !getenv("TEST_CKPT_KEEP")) rm_rf(TMP);
    else printf("(files kept in %s)\n", TMP);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
