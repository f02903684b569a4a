/* tests/fuzz/fuzz.c — fuzz targets for every reader of bytes a user (or a
 * crash, or a full disk) hands llmtrain: the job file, a Hugging Face
 * config.json and safetensors file, a checkpoint's manifest.json, a token
 * shard, a Megatron indexed dataset and a vocab file.
 *
 * Each input must end in one of two ways: the reader accepts it, or it
 * refuses it with one line (die() or the error text a reader returns):
 * non-empty, printable, no newline, and not an internal error (exit 70,
 * a bug). Anything else is a finding: a sanitizer report (the build runs
 * under AddressSanitizer and UndefinedBehaviorSanitizer), or abort() here
 * when the refusal breaks that contract.
 *
 * Two builds (Makefile):
 *   make fuzz            clang's libFuzzer drives LLVMFuzzerTestOneInput,
 *                        each target for FUZZ_SECONDS from its seeds in
 *                        tests/fuzz/corpus/<target>/;
 *   tests/fuzz_replay    gcc, no libFuzzer: main() below runs the files it
 *                        is given (make test replays the committed corpus,
 *                        the seeds and every input a finding was fixed for).
 * The target is LLMTRAIN_FUZZ_TARGET's (the environment) under libFuzzer,
 * the first argument under the replay.
 *
 * die() never returns, so the link wraps it (-Wl,--wrap=die): __wrap_die
 * checks the line and jumps back here. What the refused call had opened
 * stays open, so the wrappers of mmap and munmap keep a table of live
 * mappings, and each input ends by unmapping what is left and closing the
 * descriptors above those open before it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt.h"
#include "hf.h"
#include "config.h"
#include "data.h"
#include "util.h"

/* ---- a refusal: one printable line ---- */
static void check_line(const char *where, const char *line) {
    size_t n = strlen(line);
    int ok = n > 0;
    for (size_t i = 0; i < n && ok; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f) ok = 0;
    if (!ok) {
        fprintf(stderr, "fuzz: %s: the refusal is not one printable line: \"", where);
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)line[i];
            if (c >= 0x20 && c != 0x7f) fputc(c, stderr); else fprintf(stderr, "\\x%02x", c);
        }
        fprintf(stderr, "\"\n");
        abort();
    }
}

static jmp_buf g_jump;
static int g_armed;
static char g_last[4096]; /* the last refusal, for the replay's report */

/* die() as the product's util.c formats it (its own escaping included:
 * this wrapper sees the line util.c's die_format would write) */
__attribute__((noreturn)) void __wrap_die(int code, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    die_format(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!g_armed) {
        fprintf(stderr, "fuzz: die() outside a target: %s\n", line);
        abort();
    }
    if (code == EXIT_INTERNAL) {
        fprintf(stderr, "fuzz: an internal error (exit 70, a bug): %s\n", line);
        abort();
    }
    check_line("die()", line);
    snprintf(g_last, sizeof g_last, "%s", line);
    longjmp(g_jump, 1);
}

/* ---- what a refused call leaves open ---- */
#define MAX_MAPS 64
static struct { void *p; size_t n; } g_maps[MAX_MAPS];
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __real_munmap(void *addr, size_t len);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    void *p = __real_mmap(addr, len, prot, flags, fd, off);
    if (p != MAP_FAILED)
        for (int i = 0; i < MAX_MAPS; i++)
            if (!g_maps[i].p) { g_maps[i].p = p; g_maps[i].n = len; break; }
    return p;
}
int __wrap_munmap(void *addr, size_t len) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (g_maps[i].p == addr) g_maps[i].p = NULL;
    return __real_munmap(addr, len);
}
static void release(int fd0) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (g_maps[i].p) { __real_munmap(g_maps[i].p, g_maps[i].n); g_maps[i].p = NULL; }
    for (int fd = fd0; fd < fd0 + 64; fd++) close(fd);
}

/* ---- the targets ---- */
static char g_dir[256];

static void write_file(const char *path, const uint8_t *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror(path); abort(); }
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) { perror(path); abort(); }
        done += (size_t)w;
    }
    close(fd);
}

/* the input as g_dir/name; returns its path */
static const char *put(const char *name, const uint8_t *data, size_t size) {
    static char path[300];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    write_file(path, data, size);
    return path;
}

/* the job file (cJSON, then every key's type, range and the cross-checks) */
static void t_config(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    Config cfg;
    config_load_string(&cfg, s, "fuzz.json");
    config_free(&cfg);
    free(s);
}

/* the job file as a file (config_load): strict JSON's diagnosis of what
 * is not (comments, trailing commas, TOML, YAML), then the whole job */
static void t_job(const uint8_t *data, size_t size) {
    Config cfg;
    config_load(&cfg, put("job.json", data, size), 0, NULL);
    config_free(&cfg);
}

/* a safetensors file: the header's JSON, dtypes, shapes and byte ranges,
 * then every tensor read back as fp32 */
static void t_safetensors(const uint8_t *data, size_t size) {
    const char *path = put("model.safetensors", data, size);
    StFile f;
    st_open(&f, path);
    for (int i = 0; i < f.n; i++) {
        size_t numel = 1;
        for (int d = 0; d < f.t[i].ndim; d++) numel *= (size_t)f.t[i].shape[d];
        float *out = malloc(numel * sizeof(float) + 1);
        st_read_f32(&f, &f.t[i], out);
        free(out);
    }
    st_close(&f);
}

/* a Hugging Face config.json (GPT-2 or Llama) */
static void t_hf_config(const uint8_t *data, size_t size) {
    put("config.json", data, size);
    ModelConfig mc;
    hf_read_config(g_dir, &mc);
}

/* a checkpoint's manifest.json, then its check against the files (which
 * are not there: the check must say so) */
static void t_manifest(const uint8_t *data, size_t size) {
    char why[1024] = "";
    put("manifest.json", data, size);
    CkptManifest *mf = ckpt_manifest_open(g_dir, why, sizeof why);
    if (!mf) {
        check_line("ckpt_manifest_open", why);
        snprintf(g_last, sizeof g_last, "%s", why);
        return;
    }
    CkptLayout L = ckpt_manifest_layout(mf);
    for (int r = 0; r < L.world && r < 4; r++)
        if (ckpt_manifest_verify(mf, r, L.world, why, sizeof why) != 0) {
            check_line("ckpt_manifest_verify", why);
            snprintf(g_last, sizeof g_last, "%s", why);
        }
    ckpt_manifest_close(mf);
}

/* a token shard: its header against its size, then a few sequences (ids
 * at or past the vocabulary refused), in order and shuffled */
static void t_shard(const uint8_t *data, size_t size) {
    const char *path = put("shard.bin", data, size);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        DataSet d;
        dataset_open(&d, path, "data.train", 512, 8, shuffle, 1234);
        int in[8], tgt[8];
        for (uint64_t s = 0; s < 4; s++) dataset_sequence(&d, s * 7, in, tgt);
        dataset_close(&d);
    }
}

/* a Megatron indexed dataset: the input's first two bytes the .bin's
 * length (little-endian; its bytes i % 7, ids of every dtype below the
 * vocabulary), the rest the .idx; then a few sequences and their document
 * ends, in order and shuffled */
static void t_indexed(const uint8_t *data, size_t size) {
    if (size < 2) return;
    size_t blen = (size_t)data[0] | (size_t)data[1] << 8;
    uint8_t *bin = malloc(blen + 1);
    for (size_t i = 0; i < blen; i++) bin[i] = (uint8_t)(i % 7);
    put("ds.bin", bin, blen);
    free(bin);
    const char *idx = put("ds.idx", data + 2, size - 2);
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(idx) - 4), idx);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        DataSet d;
        dataset_open(&d, prefix, "data.train", 1 << 30, 8, shuffle, 1234);
        int in[8], tgt[8];
        unsigned char ends[8];
        for (uint64_t s = 0; s < 4; s++) {
            dataset_sequence(&d, s * 7, in, tgt);
            dataset_sequence_ends(&d, s * 7, 0, 8, ends);
        }
        dataset_close(&d);
    }
}

/* a vocab file (llm.c's tokenizer format), every token printed */
static void t_vocab(const uint8_t *data, size_t size) {
    const char *path = put("tokenizer.bin", data, size);
    Vocab v;
    vocab_load(&v, path);
    FILE *null = fopen("/dev/null", "w");
    for (int i = -1; i <= v.n && null; i++) vocab_print(&v, i, null);
    if (null) fclose(null);
    vocab_free(&v);
}

static const struct { const char *name; void (*run)(const uint8_t *, size_t); } TARGETS[] = {
    {"config", t_config}, {"job", t_job}, {"safetensors", t_safetensors}, {"hf_config", t_hf_config},
    {"manifest", t_manifest}, {"shard", t_shard}, {"indexed", t_indexed}, {"vocab", t_vocab},
};
static int g_target = -1;

static void pick(const char *name) {
    for (size_t i = 0; i < sizeof TARGETS / sizeof TARGETS[0]; i++)
        if (name && strcmp(name, TARGETS[i].name) == 0) g_target = (int)i;
    if (g_target < 0) {
        fprintf(stderr, "fuzz: target '%s': expected one of", name ? name : "(none)");
        for (size_t i = 0; i < sizeof TARGETS / sizeof TARGETS[0]; i++) fprintf(stderr, " %s", TARGETS[i].name);
        fprintf(stderr, "\n");
        exit(2);
    }
    snprintf(g_dir, sizeof g_dir, "%s/llmtrain-fuzz-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) { perror(g_dir); exit(2); }
}

/* 1: refused, 0: accepted */
static int run_one(const uint8_t *data, size_t size) {
    int fd0 = dup(0);
    close(fd0);
    g_last[0] = '\0';
    volatile int refused = 0;
    g_armed = 1;
    if (setjmp(g_jump) == 0) TARGETS[g_target].run(data, size);
    else refused = 1;
    g_armed = 0;
    release(fd0);
    return refused || g_last[0];
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    pick(getenv("LLMTRAIN_FUZZ_TARGET"));
    return 0;
}
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run_one(data, size);
    return 0;
}
#else
/* fuzz_replay TARGET FILE...: each file's outcome on a line; exit 0 when
 * every one ended in acceptance or a one-line refusal (a finding aborts) */
int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s TARGET FILE...\n", argv[0]); return 2; }
    pick(argv[1]);
    for (int i = 2; i < argc; i++) {
        size_t len;
        char *buf = read_text_file(argv[i], &len);
        if (!buf) { fprintf(stderr, "fuzz_replay: %s: cannot read\n", argv[i]); return 2; }
        int refused = run_one((const uint8_t *)buf, len);
        printf("%s %s: %s%s\n", argv[1], argv[i], refused ? "refused: " : "accepted", refused ? g_last : "");
        free(buf);
    }
    return 0;
}
#endif
