/* tests/test_indexed.c — indexed.c (Megatron's indexed datasets) against a
 * writer and a reference written here from the format's definition
 * (indexed.h: the MMIDIDX index, version 1): every integer token dtype
 * read back as the documents concatenated in index order (sequences split
 * inside documents, wrap-around, the prefix, .bin and .idx forms, globs
 * that match both files, several datasets and shards in one set), the
 * document ends against the reference under shuffling and blends, the id
 * scan's cache (a hit skips the scan, a changed file is scanned again),
 * and each damaged index or out-of-range id as exit 2 with one line.
 *
 * Run: tests/test_indexed   ("N passed, M failed"; exit 1 on failure) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data.h"
#include "indexed.h"
#include "util.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static char tmpdir[512];
static uint64_t rng_state = 99;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* dtype code -> bytes (0 for the float ones), as the format defines it */
static int code_bytes(int code) {
    static const int b[9] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
    return b[code];
}

/* A dataset of nd documents with doc_len[d] tokens each (tok, in order),
 * each document written as one or two sequences; damage: 0 none, else a
 * fault put into the index (see the cases in test_errors). */
enum { OK = 0, BAD_MAGIC, BAD_VERSION, FLOAT_DTYPE, SIZE_PAST_BIN, PTR_ORDER, DOCS_END, DOCS_DOWN, BIN_LONGER, SHORT_IDX };

static void write_indexed(const char *prefix, int code, const int64_t *tok, const int *doc_len, int nd, int damage) {
    char p[700];
    int tb = code_bytes(code);
    snprintf(p, sizeof p, "%s.bin", prefix);
    FILE *f = fopen(p, "wb");
    uint64_t n = 0;
    for (int d = 0; d < nd; d++) n += (uint64_t)doc_len[d];
    for (uint64_t i = 0; i < n; i++) {
        int64_t v = tok[i];
        fwrite(&v, (size_t)tb, 1, f); /* little-endian: the low bytes */
    }
    if (damage == BIN_LONGER) fwrite(tok, 1, (size_t)tb, f);
    fclose(f);
    /* sequences: a document of 3 or more tokens is split in two */
    int32_t *sizes = malloc(2 * (size_t)nd * sizeof *sizes + 8);
    int64_t *ptrs = malloc(2 * (size_t)nd * sizeof *ptrs + 8), *docs = malloc(((size_t)nd + 1) * sizeof *docs);
    uint64_t S = 0, at = 0;
    docs[0] = 0;
    for (int d = 0; d < nd; d++) {
        int parts = doc_len[d] >= 3 ? 2 : 1, first = parts == 2 ? doc_len[d] / 3 : doc_len[d];
        for (int k = 0; k < parts; k++) {
            int len = k == 0 ? first : doc_len[d] - first;
            sizes[S] = len;
            ptrs[S] = (int64_t)at;
            at += (uint64_t)len * (uint64_t)tb;
            S++;
        }
        docs[d + 1] = (int64_t)S;
    }
    if (damage == SIZE_PAST_BIN) sizes[S - 1] += 5;
    if (damage == PTR_ORDER) ptrs[1] += (int64_t)tb;
    if (damage == DOCS_END) docs[nd] = (int64_t)S - 1;
    if (damage == DOCS_DOWN && nd > 2) docs[1] = docs[2] + 1;
    snprintf(p, sizeof p, "%s.idx", prefix);
    f = fopen(p, "wb");
    fwrite(damage == BAD_MAGIC ? "MMIDIDY\0\0" : "MMIDIDX\0\0", 1, 9, f);
    uint64_t version = damage == BAD_VERSION ? 2 : 1, D = (uint64_t)nd + 1;
    uint8_t c = damage == FLOAT_DTYPE ? 7 : (uint8_t)code;
    fwrite(&version, 8, 1, f);
    fwrite(&c, 1, 1, f);
    fwrite(&S, 8, 1, f);
    fwrite(&D, 8, 1, f);
    if (damage != SHORT_IDX) {
        fwrite(sizes, 4, S, f);
        fwrite(ptrs, 8, S, f);
        fwrite(docs, 8, D, f);
    }
    fclose(f);
    free(sizes);
    free(ptrs);
    free(docs);
}

/* nd random documents of 1..max tokens; *n their tokens, ends[i] = 1 at
 * each document's last token (the reference) */
static int64_t *make_docs(int nd, int max, int64_t lo, int64_t hi, int **doc_len, uint64_t *n, unsigned char **ends) {
    *doc_len = malloc((size_t)nd * sizeof **doc_len);
    uint64_t total = 0;
    for (int d = 0; d < nd; d++) total += (uint64_t)((*doc_len)[d] = 1 + (int)(rnd() % (unsigned)max));
    int64_t *tok = malloc(total * sizeof *tok);
    *ends = calloc(total, 1);
    for (uint64_t i = 0; i < total; i++) tok[i] = lo + (int64_t)(rnd() % (uint64_t)(hi - lo));
    uint64_t at = 0;
    for (int d = 0; d < nd; d++) (*ends)[(at += (uint64_t)(*doc_len)[d]) - 1] = 1;
    *n = total;
    return tok;
}

/* Every sequence of the first 3 epochs, inputs, targets and ends,
 * against the reference at start seq*T mod n. */
static int reads_match(const DataSet *d, const int64_t *ref, const unsigned char *ref_end, uint64_t n, int T) {
    int *in = malloc((size_t)T * sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    unsigned char *e = malloc((size_t)T);
    int good = 1;
    for (uint64_t seq = 0; seq < 3 * n / (uint64_t)T + 3 && good; seq++) {
        uint64_t s = seq * (uint64_t)T % n;
        dataset_sequence(d, seq, in, tg);
        dataset_sequence_ends(d, seq, 0, T, e);
        for (int i = 0; i < T && good; i++)
            good = in[i] == ref[(s + (uint64_t)i) % n] && tg[i] == ref[(s + (uint64_t)i + 1) % n] &&
                   e[i] == ref_end[(s + (uint64_t)i) % n];
    }
    free(in);
    free(tg);
    free(e);
    return good;
}

static void test_dtypes(void) {
    const int codes[6] = {1, 2, 3, 4, 5, 8};
    const char *names[6] = {"uint8", "int8", "int16", "int32", "int64", "uint16"};
    const int64_t vocab[6] = {256, 128, 32768, 100000, 70000, 65536};
    for (int c = 0; c < 6; c++) {
        int *dl, nd = 40;
        uint64_t n;
        unsigned char *ends;
        int64_t *tok = make_docs(nd, 9, 0, vocab[c], &dl, &n, &ends);
        char pre[700], form[720];
        snprintf(pre, sizeof pre, "%s/dt_%s", tmpdir, names[c]);
        write_indexed(pre, codes[c], tok, dl, nd, OK);
        const char *suffix[3] = {"", ".bin", ".idx"};
        for (int f = 0; f < 3; f++) {
            snprintf(form, sizeof form, "%s%s", pre, suffix[f]);
            DataSet d;
            dataset_open(&d, form, "data.train", (int)vocab[c], 7, 0, 0);
            int ok = d.n_shards == 1 && d.n_tokens == n && d.shards[0].idx_map && dataset_has_docs(&d);
            ok = ok && reads_match(&d, tok, ends, n, 7);
            check(ok, "%s, named as PREFIX%s: %llu tokens in %d documents (split into sequences), reads and ends match the reference", names[c],
                  suffix[f], (unsigned long long)n, nd);
            dataset_close(&d);
        }
        free(tok);
        free(dl);
        free(ends);
    }
}

/* Two indexed datasets and an llm.c shard in one glob; a glob matching a
 * dataset's .bin and .idx opens it once. */
static void test_globs(void) {
    char sub[600], pre[700], pat[720];
    snprintf(sub, sizeof sub, "%s/glob", tmpdir);
    mkdir(sub, 0755);
    int *dl[2];
    uint64_t n[2];
    unsigned char *e[2];
    int64_t *tok[2];
    for (int k = 0; k < 2; k++) {
        tok[k] = make_docs(20 + k, 6, 0, 500, &dl[k], &n[k], &e[k]);
        snprintf(pre, sizeof pre, "%s/part%d", sub, k);
        write_indexed(pre, 8, tok[k], dl[k], 20 + k, OK);
    }
    uint64_t N = n[0] + n[1];
    int64_t *ref = malloc(N * sizeof *ref);
    unsigned char *ref_e = malloc(N);
    memcpy(ref, tok[0], n[0] * sizeof *ref);
    memcpy(ref + n[0], tok[1], n[1] * sizeof *ref);
    memcpy(ref_e, e[0], n[0]);
    memcpy(ref_e + n[0], e[1], n[1]);
    snprintf(pat, sizeof pat, "%s/part*", sub);
    DataSet d;
    dataset_open(&d, pat, "data.train", 500, 5, 0, 0);
    check(d.n_shards == 2 && d.n_tokens == N && reads_match(&d, ref, ref_e, N, 5),
          "glob matching both datasets' .bin and .idx: 2 shards of %llu tokens in path order, reads and ends across them",
          (unsigned long long)N);
    dataset_close(&d);
    /* an llm.c shard beside them: the set no longer knows its documents */
    char shard[720];
    snprintf(shard, sizeof shard, "%s/part2.bin", sub);
    FILE *f = fopen(shard, "wb");
    int32_t h[SHARD_HEADER_INTS] = {SHARD_MAGIC_U16, SHARD_VERSION_U16, 4};
    uint16_t t4[4] = {1, 2, 3, 4};
    fwrite(h, sizeof h, 1, f);
    fwrite(t4, 2, 4, f);
    fclose(f);
    snprintf(pat, sizeof pat, "%s/part*.bin", sub);
    dataset_open(&d, pat, "data.train", 500, 5, 0, 0);
    int in[5], tg[5];
    dataset_sequence(&d, N / 5, in, tg); /* starts inside the shard's tokens or just before */
    check(d.n_shards == 3 && d.n_tokens == N + 4 && !d.shards[2].idx_map && !dataset_has_docs(&d),
          "two indexed datasets and an llm.c shard in one glob: 3 shards, %llu tokens, no documents known", (unsigned long long)d.n_tokens);
    dataset_close(&d);
    for (int k = 0; k < 2; k++) free(tok[k]), free(dl[k]), free(e[k]);
    free(ref);
    free(ref_e);
}

/* Shuffled and blended sets: ends follow the same starts as the tokens.
 * Tokens are their own positions (int32), so a sequence's first input
 * names its start. */
static void test_shuffled_ends(void) {
    int nd = 300, *dl = malloc((size_t)nd * sizeof *dl);
    uint64_t n = 0;
    for (int d = 0; d < nd; d++) n += (uint64_t)(dl[d] = 1 + (int)(rnd() % 12));
    int64_t *tok = malloc(n * sizeof *tok);
    unsigned char *ends = calloc(n, 1);
    for (uint64_t i = 0; i < n; i++) tok[i] = (int64_t)i;
    uint64_t at = 0;
    for (int d = 0; d < nd; d++) ends[(at += (uint64_t)dl[d]) - 1] = 1;
    char pre[700], blend[1600];
    snprintf(pre, sizeof pre, "%s/pos", tmpdir);
    write_indexed(pre, 4, tok, dl, nd, OK);
    snprintf(blend, sizeof blend, "0.6 %s 0.4 %s.bin", pre, pre);
    for (int b = 0; b < 2; b++) {
        DataSet d;
        dataset_open(&d, b ? blend : pre, "data.train", (int)n, 16, 1, 7);
        int in[16], tg[16], good = dataset_has_docs(&d);
        unsigned char e[16];
        for (uint64_t seq = 0; seq < 400 && good; seq++) {
            dataset_sequence_part(&d, seq, 3, 10, in, tg);
            dataset_sequence_ends(&d, seq, 3, 10, e);
            for (int i = 0; i < 10 && good; i++) good = e[i] == ends[(uint64_t)in[i]];
        }
        check(good, "%s, shuffled: each part's ends are the reference's at the tokens it reads (400 sequences, offset 3)",
              b ? "a blend of two indexed sources" : "one indexed dataset");
        dataset_close(&d);
    }
    free(tok);
    free(dl);
    free(ends);
}

static void expect_exit2(const char *name, const char *pattern, int vocab, int read_all, const char *must1, const char *must2) {
    char errpath[700];
    snprintf(errpath, sizeof errpath, "%s/stderr_%s.txt", tmpdir, name);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        close(fd);
        DataSet d;
        dataset_open(&d, pattern, "data.train", vocab, 4, 0, 0);
        if (read_all) {
            int in[4], tg[4];
            for (uint64_t s = 0; s < d.n_tokens; s++) dataset_sequence(&d, s, in, tg);
        }
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    size_t len = 0;
    char *err = read_text_file(errpath, &len);
    if (!err) err = calloc(1, 1);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += err[i] == '\n';
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char *nl = strchr(err, '\n');
    if (nl) *nl = '\0';
    check(code == EXIT_USAGE && lines == 1 && strstr(err, must1) && (!must2 || strstr(err, must2)), "%s: exit %d, %d line(s): %s",
          name, code, lines, err);
    free(err);
}

static void test_errors(void) {
    int *dl;
    uint64_t n;
    unsigned char *ends;
    int64_t *tok = make_docs(10, 6, 0, 100, &dl, &n, &ends);
    struct { int damage; const char *name, *must; } cases[] = {
        {BAD_MAGIC, "bad magic", "bad magic"},
        {BAD_VERSION, "version 2", "index version 2"},
        {FLOAT_DTYPE, "float32 tokens", "must be integers"},
        {SIZE_PAST_BIN, "a size past the .bin", "past the"},
        {PTR_ORDER, "pointers out of order", "pointers out of order"},
        {DOCS_END, "document index short of the sequences", "document index ends at"},
        {DOCS_DOWN, "document index decreasing", "non-decreasing"},
        {BIN_LONGER, ".bin longer than the index says", "fill"},
        {SHORT_IDX, "index cut after its header", "but the index has"},
    };
    char pre[700];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(pre, sizeof pre, "%s/bad%zu", tmpdir, i);
        write_indexed(pre, 8, tok, dl, 10, cases[i].damage);
        char file[720];
        snprintf(file, sizeof file, "bad%zu.idx", i);
        expect_exit2(cases[i].name, pre, 100, 0, cases[i].must, file);
    }
    /* ids: found at open, before any read */
    tok[n / 2] = 100;
    snprintf(pre, sizeof pre, "%s/badid", tmpdir);
    write_indexed(pre, 8, tok, dl, 10, OK);
    char off[64];
    snprintf(off, sizeof off, "at token offset %llu", (unsigned long long)(n / 2));
    expect_exit2("an id past the vocabulary, at open", pre, 100, 0, "token 100", off);
    tok[n / 2] = -3;
    snprintf(pre, sizeof pre, "%s/negid", tmpdir);
    write_indexed(pre, 3, tok, dl, 10, OK);
    expect_exit2("a negative int16 id, at open", pre, 100, 0, "token -3", off);
    free(tok);
    free(dl);
    free(ends);
}

/* The scan's cache: a second open with the files unchanged takes the
 * cached range (so a bad id written under the same size and mtime passes
 * the open and is caught by the read); a new mtime scans again. */
static void test_cache(void) {
    int *dl;
    uint64_t n;
    unsigned char *ends;
    int64_t *tok = make_docs(10, 6, 0, 100, &dl, &n, &ends);
    char pre[700], bin[720];
    snprintf(pre, sizeof pre, "%s/cached", tmpdir);
    snprintf(bin, sizeof bin, "%s.bin", pre);
    write_indexed(pre, 8, tok, dl, 10, OK);
    DataSet d;
    dataset_open(&d, pre, "data.train", 100, 4, 0, 0);
    dataset_close(&d);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "ls %s/cache/indexed-*.scan >/dev/null 2>&1", tmpdir);
    check(system(cmd) == 0, "the first open writes a scan cache under LLMTRAIN_CACHE_DIR");
    struct stat st;
    stat(bin, &st);
    uint16_t bad = 100;
    int fd = open(bin, O_WRONLY);
    if (pwrite(fd, &bad, 2, 2 * 3) != 2) perror("pwrite");
    close(fd);
    struct timespec keep[2] = {st.st_atim, st.st_mtim};
    utimensat(AT_FDCWD, bin, keep, 0);
    expect_exit2("same size and mtime: the cache is taken at open, the read still finds id 100", pre, 100, 1, "token 100",
                 "at token offset 3 >= model.vocab_size 100");
    struct timespec later[2] = {st.st_atim, {st.st_mtim.tv_sec + 5, 0}};
    utimensat(AT_FDCWD, bin, later, 0);
    expect_exit2("a new mtime: scanned again, id 100 found at open", pre, 100, 0, "token 100", "outside [0, model.vocab_size 100)");
    free(tok);
    free(dl);
    free(ends);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_indexed_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    setenv("LLMTRAIN_CACHE_DIR", cache, 1);
    test_dtypes();
    test_globs();
    test_shuffled_ends();
    test_errors();
    test_cache();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
