/* tests/test_data.c — data.c against an independent reference: writes its
 * own shards (uint16 and uint32, several per set) to a temp dir, checks
 * dataset_sequence against a plain concatenated array and the addressing
 * formula, the shuffle's per-epoch permutation property, the vocab table,
 * and that every malformed input exits EXIT_USAGE with exactly one stderr
 * line naming the file (each error case runs in a fork()ed child).
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -I. \
 *            tests/test_data.c data.c util.c -o tests/test_data
 * Run:   tests/test_data        (prints one line per check, then
 *                                "N passed, M failed"; exit 1 on failure) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data.h"
#include "util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <sys/stat.h>

#include "check.h"

static char tmpdir[512];

static uint64_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

/* Write a shard; hdr_count overrides the header's count when >= 0 (to build
 * malformed files), magic/version as given. */
static void write_shard_raw(const char *path, int32_t magic, int32_t version, int64_t hdr_count,
                            const uint32_t *tok, size_t n, int token_bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(99); }
    int32_t h[SHARD_HEADER_INTS] = {0};
    h[0] = magic;
    h[1] = version;
    h[2] = (int32_t)(hdr_count >= 0 ? hdr_count : (int64_t)n);
    fwrite(h, sizeof h, 1, f);
    for (size_t i = 0; i < n; i++) {
        if (token_bytes == 2) { uint16_t v = (uint16_t)tok[i]; fwrite(&v, 2, 1, f); }
        else fwrite(&tok[i], 4, 1, f);
    }
    fclose(f);
}

static void write_shard(const char *path, const uint32_t *tok, size_t n, int token_bytes) {
    if (token_bytes == 2) write_shard_raw(path, SHARD_MAGIC_U16, SHARD_VERSION_U16, -1, tok, n, 2);
    else write_shard_raw(path, SHARD_MAGIC_U32, SHARD_VERSION_U32, -1, tok, n, 4);
}

/* Reference: plain array + the formula in data.h / data.c. */
static int check_seq_ref(const DataSet *d, const uint32_t *ref, uint64_t n, int T, uint64_t seq, uint64_t start,
                         int *in, int *tg) {
    dataset_sequence(d, seq, in, tg);
    for (int i = 0; i < T; i++) {
        if ((uint32_t)in[i] != ref[(start + (uint64_t)i) % n]) return 0;
        if ((uint32_t)tg[i] != ref[(start + (uint64_t)i + 1) % n]) return 0;
    }
    return 1;
}

/* ------------------------------------------------------ sequential tests */

static void test_sequential(int token_bytes, uint32_t vocab) {
    /* three shards of odd sizes, written out of order so sorting matters */
    const size_t sizes[3] = {37, 53, 11};
    const char *names[3] = {"seq_b.bin", "seq_c.bin", "seq_a.bin"}; /* path order: a, b, c */
    const int order[3] = {2, 0, 1};                                /* index into sizes by path order */
    uint64_t n = 0;
    for (int i = 0; i < 3; i++) n += sizes[i];
    uint32_t *ref = malloc(n * sizeof *ref);
    /* ref is the concatenation in path order */
    uint64_t off = 0;
    uint32_t *parts[3];
    for (int i = 0; i < 3; i++) {
        parts[i] = malloc(sizes[i] * sizeof(uint32_t));
        for (size_t k = 0; k < sizes[i]; k++) parts[i][k] = rnd() % vocab;
    }
    for (int p = 0; p < 3; p++) {
        int i = order[p];
        memcpy(ref + off, parts[i], sizes[i] * sizeof(uint32_t));
        off += sizes[i];
    }
    char sub[600];
    snprintf(sub, sizeof sub, "%s/seq%d", tmpdir, token_bytes);
    mkdir(sub, 0755);
    for (int i = 0; i < 3; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", sub, names[i]);
        write_shard(p, parts[i], sizes[i], token_bytes);
        free(parts[i]);
    }
    char pattern[700];
    snprintf(pattern, sizeof pattern, "%s/seq_*.bin", sub);

    const int Ts[4] = {1, 8, 40, 100}; /* 100 < n=101: reads span all shards and wrap */
    for (int ti = 0; ti < 4; ti++) {
        int T = Ts[ti];
        DataSet d;
        dataset_open(&d, pattern, "data.train", (int)vocab, T, 0, 0);
        int ok = d.n_shards == 3 && d.n_tokens == n && d.shards[0].start == 0 && d.shards[1].start == 11 &&
                 d.shards[2].start == 48 && d.shards[0].token_bytes == token_bytes;
        check(ok, "u%d T=%d: 3 shards sorted by path, %llu tokens, starts 0/11/48", token_bytes * 8, T,
              (unsigned long long)d.n_tokens);
        int *in = malloc((size_t)T * sizeof(int)), *tg = malloc((size_t)T * sizeof(int));
        int good = 1;
        for (uint64_t seq = 0; seq < 500 && good; seq++)
            good = check_seq_ref(&d, ref, n, T, seq, (seq * (uint64_t)T) % n, in, tg);
        check(good, "u%d T=%d: seq 0..499 match reference (start = seq*T mod n, wrap-around)", token_bytes * 8, T);
        /* huge sequence numbers: seq*T overflows 64 bits */
        const uint64_t big[4] = {UINT64_MAX, UINT64_MAX / 3, (1ull << 62) + 7, 0xDEADBEEFCAFEull};
        good = 1;
        for (int b = 0; b < 4 && good; b++) {
            uint64_t start = (uint64_t)(((__uint128_t)big[b] * (unsigned)T) % n);
            good = check_seq_ref(&d, ref, n, T, big[b], start, in, tg);
        }
        check(good, "u%d T=%d: huge seq numbers (128-bit seq*T mod n)", token_bytes * 8, T);
        free(in);
        free(tg);
        dataset_close(&d);
    }
    /* a single literal path */
    {
        char p[700];
        snprintf(p, sizeof p, "%s/seq_c.bin", sub);
        DataSet d;
        dataset_open(&d, p, "data.val", (int)vocab, 4, 0, 0);
        int in[4], tg[4];
        int good = d.n_shards == 1 && d.n_tokens == 53;
        for (uint64_t seq = 0; seq < 40 && good; seq++)
            good = check_seq_ref(&d, ref + 48, 53, 4, seq, (seq * 4) % 53, in, tg);
        check(good, "u%d: single literal path, 53 tokens, wrap-around", token_bytes * 8);
        dataset_close(&d);
    }
    free(ref);
}

/* --------------------------------------------------------- shuffle tests */

/* Shards whose token at global position p is p (unique), u32 format. */
static void make_identity_set(const char *dir, uint64_t n, int n_shards, uint32_t **ref_out) {
    mkdir(dir, 0755);
    uint32_t *ref = malloc(n * sizeof *ref);
    for (uint64_t i = 0; i < n; i++) ref[i] = (uint32_t)i;
    uint64_t per = n / (uint64_t)n_shards, off = 0;
    for (int s = 0; s < n_shards; s++) {
        uint64_t m = (s == n_shards - 1) ? n - off : per;
        char p[700];
        snprintf(p, sizeof p, "%s/id_%02d.bin", dir, s);
        write_shard(p, ref + off, m, 4);
        off += m;
    }
    *ref_out = ref;
}

static void test_shuffle_case(uint64_t n, int T, int n_shards) {
    char dir[600], pattern[700];
    snprintf(dir, sizeof dir, "%s/shuf_%llu_%d", tmpdir, (unsigned long long)n, T);
    uint32_t *ref;
    make_identity_set(dir, n, n_shards, &ref);
    snprintf(pattern, sizeof pattern, "%s/id_*.bin", dir);
    DataSet d, d2, d3;
    int V = (int)n + 1;
    dataset_open(&d, pattern, "data.train", V, T, 1, 1234);
    dataset_open(&d2, pattern, "data.train", V, T, 1, 1234);
    dataset_open(&d3, pattern, "data.train", V, T, 1, 999);
    uint64_t ns = n / (uint64_t)T;
    check(d.n_seqs == ns, "shuffle n=%llu T=%d: n_seqs = %llu", (unsigned long long)n, T, (unsigned long long)ns);
    int *in = malloc((size_t)T * sizeof(int)), *tg = malloc((size_t)T * sizeof(int));
    int *in2 = malloc((size_t)T * sizeof(int)), *tg2 = malloc((size_t)T * sizeof(int));
    uint64_t *starts = malloc(4 * ns * sizeof *starts);
    unsigned char *seen = malloc(ns);
    int perm_ok = 1, ref_ok = 1, same_ok = 1;
    uint64_t diff_seed = 0;
    const uint64_t epochs[4] = {0, 1, 2, 1000000007ull};
    for (int e = 0; e < 4; e++) {
        memset(seen, 0, ns);
        for (uint64_t j = 0; j < ns; j++) {
            uint64_t seq = epochs[e] * ns + j;
            dataset_sequence(&d, seq, in, tg);
            uint64_t start = (uint64_t)in[0];
            starts[(uint64_t)e * ns + j] = start;
            if (start % (uint64_t)T != 0 || start / (uint64_t)T >= ns || seen[start / (uint64_t)T]) perm_ok = 0;
            else seen[start / (uint64_t)T] = 1;
            for (int i = 0; i < T; i++)
                if ((uint32_t)in[i] != ref[(start + (uint64_t)i) % n] ||
                    (uint32_t)tg[i] != ref[(start + (uint64_t)i + 1) % n])
                    ref_ok = 0;
            dataset_sequence(&d2, seq, in2, tg2);
            if (memcmp(in, in2, (size_t)T * sizeof(int)) || memcmp(tg, tg2, (size_t)T * sizeof(int))) same_ok = 0;
            dataset_sequence(&d3, seq, in2, tg2);
            if (in2[0] != in[0]) diff_seed++;
        }
    }
    check(perm_ok, "shuffle n=%llu T=%d: each of 4 epochs visits every start j*T exactly once",
          (unsigned long long)n, T);
    check(ref_ok, "shuffle n=%llu T=%d: inputs/targets match reference at the chosen start (targets wrap)",
          (unsigned long long)n, T);
    check(same_ok, "shuffle n=%llu T=%d: same seed gives identical sequences", (unsigned long long)n, T);
    if (ns > 1) {
        int all_differ = 1;
        for (int e = 1; e < 4; e++)
            for (int f = 0; f < e; f++)
                if (!memcmp(starts + (uint64_t)e * ns, starts + (uint64_t)f * ns, ns * sizeof *starts))
                    all_differ = 0;
        check(all_differ, "shuffle n=%llu T=%d: order differs between epochs", (unsigned long long)n, T);
        check(diff_seed > 0, "shuffle n=%llu T=%d: a different seed gives a different order (%llu of %llu differ)",
              (unsigned long long)n, T, (unsigned long long)diff_seed, (unsigned long long)(4 * ns));
        /* not the identity (a permutation that does nothing would pass the above) */
        uint64_t fixed = 0;
        for (uint64_t j = 0; j < ns; j++) fixed += starts[j] == j * (uint64_t)T;
        check(ns < 8 || fixed < ns / 2, "shuffle n=%llu T=%d: epoch 0 is shuffled (%llu of %llu in place)",
              (unsigned long long)n, T, (unsigned long long)fixed, (unsigned long long)ns);
    }
    free(starts);
    free(seen);
    free(in);
    free(tg);
    free(in2);
    free(tg2);
    free(ref);
    dataset_close(&d);
    dataset_close(&d2);
    dataset_close(&d3);
}

/* ------------------------------------------------------------ vocab tests */

static void write_vocab(const char *path, uint32_t magic, uint32_t version, uint32_t n, uint32_t eot,
                        const char **toks, const unsigned char *lens, int truncate_last) {
    FILE *f = fopen(path, "wb");
    uint32_t h[256] = {0};
    h[0] = magic;
    h[1] = version;
    h[2] = n;
    h[3] = eot;
    fwrite(h, sizeof h, 1, f);
    for (uint32_t i = 0; i < n; i++) {
        unsigned char l = lens[i];
        fputc(l, f);
        if (truncate_last && i == n - 1) { fwrite(toks[i], 1, l > 0 ? l - 1u : 0, f); break; }
        fwrite(toks[i], 1, l, f);
    }
    fclose(f);
}

static int print_matches(const Vocab *v, int id, const char *expect, size_t elen) {
    char *buf = NULL;
    size_t sz = 0;
    FILE *f = open_memstream(&buf, &sz);
    vocab_print(v, id, f);
    fclose(f);
    int ok = sz == elen && memcmp(buf, expect, elen) == 0;
    free(buf);
    return ok;
}

/* fwrite_printable (the printed sample): printable UTF-8 as it is, every
 * other byte \xHH; each case against the text written out by hand */
static void test_printable(void) {
    static const struct { const char *in; size_t n; const char *out, *what; } cases[] = {
        {"plain text\tand\nlines", 20, "plain text\tand\nlines", "ASCII, tab and newline kept"},
        {"a\0b\x1b[0m\x7f\r", 9, "a\\x00b\\x1b[0m\\x7f\\x0d", "NUL, ESC, DEL and CR escaped"},
        {"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "2-, 3- and 4-byte characters kept"},
        {"\xc2\x85\xc2\x9f\xc2\xa0", 6, "\\xc2\\x85\\xc2\\x9f\xc2\xa0", "C1 controls escaped, U+00A0 kept"},
        {"\xc0\xaf\xe0\x80\xaf\xed\xa0\x80", 8, "\\xc0\\xaf\\xe0\\x80\\xaf\\xed\\xa0\\x80", "overlong forms and a surrogate escaped"},
        {"\xf4\x90\x80\x80\xff\xfe", 6, "\\xf4\\x90\\x80\\x80\\xff\\xfe", "past U+10FFFF, 0xff and 0xfe escaped"},
        {"x\xe2\x82", 3, "x\\xe2\\x82", "a character cut at the end escaped"},
        {"\xe2\x82x\xa9", 4, "\\xe2\\x82x\\xa9", "a lead byte without its continuation, a stray continuation"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *buf = NULL;
        size_t sz = 0;
        FILE *f = open_memstream(&buf, &sz);
        fwrite_printable(cases[i].in, cases[i].n, f);
        fclose(f);
        check(sz == strlen(cases[i].out) && memcmp(buf, cases[i].out, sz) == 0, "fwrite_printable: %s", cases[i].what);
        free(buf);
    }
}

static void test_vocab(void) {
    const char *toks[4] = {"a", "hello", "x\0y", "<|endoftext|>"};
    const unsigned char lens[4] = {1, 5, 3, 13};
    char p[700];
    path_in(p, sizeof p, "vocab_v2.bin");
    write_vocab(p, VOCAB_MAGIC, 2, 4, 3, toks, lens, 0);
    Vocab v;
    vocab_load(&v, p);
    check(v.n == 4 && v.eot == 3, "vocab v2: n=4 eot=3 (got n=%d eot=%d)", v.n, v.eot);
    check(v.len[2] == 3 && memcmp(v.tok[2], "x\0y", 4) == 0 && strcmp(v.tok[1], "hello") == 0,
          "vocab v2: token bytes incl. embedded NUL, NUL-terminated");
    check(print_matches(&v, 1, "hello", 5) && print_matches(&v, 2, "x\0y", 3) && print_matches(&v, 4, "<4>", 3) &&
              print_matches(&v, -1, "<-1>", 4),
          "vocab_print: bytes for known ids, <id> for out-of-range");
    vocab_free(&v);

    path_in(p, sizeof p, "vocab_v1.bin");
    write_vocab(p, VOCAB_MAGIC, 1, 4, 3, toks, lens, 0);
    vocab_load(&v, p);
    check(v.n == 4 && v.eot == -1, "vocab v1: eot = -1");
    vocab_free(&v);

    path_in(p, sizeof p, "vocab_noeot.bin");
    write_vocab(p, VOCAB_MAGIC, 2, 4, 0xFFFFFFFFu, toks, lens, 0);
    vocab_load(&v, p);
    check(v.n == 4 && v.eot == -1, "vocab v2 with eot 0xFFFFFFFF: eot = -1");
    vocab_free(&v);

    /* byte-level vocab as scripts/prepare_data.py writes it */
    const char *bt[256];
    unsigned char bl[256];
    static char bytes[256];
    for (int i = 0; i < 256; i++) { bytes[i] = (char)i; bt[i] = &bytes[i]; bl[i] = 1; }
    path_in(p, sizeof p, "vocab_bytes.bin");
    write_vocab(p, VOCAB_MAGIC, 2, 256, 0xFFFFFFFFu, bt, bl, 0);
    vocab_load(&v, p);
    int ok = v.n == 256 && v.eot == -1;
    for (int i = 0; i < 256 && ok; i++) ok = v.len[i] == 1 && (unsigned char)v.tok[i][0] == i;
    check(ok, "vocab: 256 single-byte tokens, no eot");
    vocab_free(&v);
}

/* ------------------------------------------------------------ error cases */

enum { OP_OPEN, OP_SEQ, OP_VOCAB };

/* Run op in a child with stderr captured; expect exit EXIT_USAGE, exactly
 * one stderr line, containing every string in must[]. */
static void expect_error(const char *name, int op, const char *pattern, int vocab, int T, uint64_t seq,
                         const char *must1, const char *must2) {
    char errpath[700];
    snprintf(errpath, sizeof errpath, "%s/stderr_%s.txt", tmpdir, name);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        close(fd);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        if (op == OP_VOCAB) {
            Vocab v;
            vocab_load(&v, pattern);
        } else {
            DataSet d;
            dataset_open(&d, pattern, "data.train", vocab, T, 0, 0);
            if (op == OP_SEQ) {
                int *in = malloc((size_t)T * sizeof(int)), *tg = malloc((size_t)T * sizeof(int));
                for (uint64_t s = 0; s <= seq; s++) dataset_sequence(&d, s, in, tg);
            }
        }
        _exit(0); /* no error: the parent reports exit 0 */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    size_t len = 0;
    char *err = read_text_file(errpath, &len);
    if (!err) err = calloc(1, 1);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += err[i] == '\n';
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int ok = code == EXIT_USAGE && lines == 1 && (!must1 || strstr(err, must1)) && (!must2 || strstr(err, must2));
    char shown[400];
    snprintf(shown, sizeof shown, "%s", err);
    char *nl = strchr(shown, '\n');
    if (nl) *nl = '\0';
    check(ok, "error %s: exit %d, %d stderr line(s): %s", name, code, lines, shown);
    free(err);
}

static void test_errors(void) {
    char p[700], q[700];
    uint32_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint32_t)i;

    path_in(p, sizeof p, "nomatch_*.bin");
    expect_error("no_match", OP_OPEN, p, 256, 4, 0, "data.train: no file matches", "nomatch_*.bin");
    path_in(p, sizeof p, "does_not_exist.bin");
    expect_error("missing_literal", OP_OPEN, p, 256, 4, 0, "data.train", "does_not_exist.bin");

    path_in(p, sizeof p, "short.bin");
    FILE *f = fopen(p, "wb");
    fwrite(tok, 1, 100, f);
    fclose(f);
    expect_error("short_header", OP_OPEN, p, 256, 4, 0, "short.bin", "shorter than");

    path_in(p, sizeof p, "zero_bytes.bin");
    fclose(fopen(p, "wb"));
    expect_error("zero_byte_file", OP_OPEN, p, 256, 4, 0, "zero_bytes.bin", "shorter than");

    path_in(p, sizeof p, "badmagic.bin");
    write_shard_raw(p, 123, 1, -1, tok, 50, 2);
    expect_error("bad_magic", OP_OPEN, p, 256, 4, 0, "badmagic.bin: bad magic 123 (expected 20240520 or 20240801)",
                 "data.train");

    path_in(p, sizeof p, "badversion.bin");
    write_shard_raw(p, SHARD_MAGIC_U16, 7, -1, tok, 50, 2);
    expect_error("bad_version_u16", OP_OPEN, p, 256, 4, 0, "badversion.bin", "bad version 7");
    path_in(p, sizeof p, "badversion32.bin");
    write_shard_raw(p, SHARD_MAGIC_U32, 1, -1, tok, 50, 4);
    expect_error("bad_version_u32", OP_OPEN, p, 256, 4, 0, "badversion32.bin", "bad version 1");

    path_in(p, sizeof p, "truncated.bin");
    write_shard_raw(p, SHARD_MAGIC_U16, 1, 1000, tok, 75, 2);
    expect_error("truncated", OP_OPEN, p, 256, 4, 0, "truncated.bin",
                 "header says 1000 tokens (2000 bytes) but file has 150 bytes of tokens");
    path_in(p, sizeof p, "toolong.bin");
    write_shard_raw(p, SHARD_MAGIC_U32, 7, 10, tok, 20, 4);
    expect_error("extra_bytes", OP_OPEN, p, 256, 4, 0, "toolong.bin",
                 "header says 10 tokens (40 bytes) but file has 80 bytes of tokens");
    path_in(p, sizeof p, "odd_bytes.bin");
    write_shard_raw(p, SHARD_MAGIC_U16, 1, 10, tok, 10, 2);
    f = fopen(p, "ab");
    fputc(0, f);
    fclose(f);
    expect_error("odd_byte_count", OP_OPEN, p, 256, 4, 0, "odd_bytes.bin", "21 bytes of tokens");

    /* an empty shard next to a good one (so the total would be enough) */
    snprintf(q, sizeof q, "%s/withempty", tmpdir);
    mkdir(q, 0755);
    snprintf(p, sizeof p, "%s/withempty/a.bin", tmpdir);
    write_shard(p, tok, 50, 2);
    snprintf(p, sizeof p, "%s/withempty/b.bin", tmpdir);
    write_shard_raw(p, SHARD_MAGIC_U32, 7, -1, tok, 0, 4);
    snprintf(p, sizeof p, "%s/withempty/*.bin", tmpdir);
    expect_error("empty", OP_OPEN, p, 256, 4, 0, "withempty/b.bin: empty shard", "0 tokens");

    /* second shard bad: the message names that file, not the first */
    snprintf(q, sizeof q, "%s/mixed", tmpdir);
    mkdir(q, 0755);
    snprintf(p, sizeof p, "%s/mixed/a.bin", tmpdir);
    write_shard(p, tok, 50, 2);
    snprintf(p, sizeof p, "%s/mixed/b.bin", tmpdir);
    write_shard_raw(p, 42, 1, -1, tok, 50, 2);
    snprintf(p, sizeof p, "%s/mixed/*.bin", tmpdir);
    expect_error("second_shard_bad", OP_OPEN, p, 256, 4, 0, "mixed/b.bin: bad magic 42", NULL);

    path_in(p, sizeof p, "few.bin");
    write_shard(p, tok, 8, 2);
    expect_error("too_few_tokens", OP_OPEN, p, 256, 8, 0, "few.bin", "need at least sequence length + 1 = 9");

    /* blends: pairs, positive weights, each large enough to draw, each path opened */
    {
        char ok[700], bl[2200];
        path_in(ok, sizeof ok, "blend_ok.bin");
        write_shard(ok, tok, 100, 2);
        snprintf(bl, sizeof bl, "0.5 %s 0.5", ok);
        expect_error("blend_odd_words", OP_OPEN, bl, 256, 4, 0, "a blend is pairs of weight and path", "got 3 words");
        snprintf(bl, sizeof bl, "-1 %s 1 %s", ok, ok);
        expect_error("blend_negative_weight", OP_OPEN, bl, 256, 4, 0, "blend source 1: weight '-1'",
                     "expected a positive number before each path");
        snprintf(bl, sizeof bl, "1 %s x %s", ok, ok);
        expect_error("blend_weight_not_a_number", OP_OPEN, bl, 256, 4, 0, "blend source 2: weight 'x'", NULL);
        snprintf(bl, sizeof bl, "1e-9 %s 1 %s", ok, ok);
        expect_error("blend_weight_too_small", OP_OPEN, bl, 256, 4, 0, "blend source 1: weight 1e-09",
                     "draws no sequence in 65536");
        snprintf(bl, sizeof bl, "1 %s 1 %s/blend_none_*.bin", ok, tmpdir);
        expect_error("blend_source_missing", OP_OPEN, bl, 256, 4, 0, "data.train: no file matches", "blend_none_*.bin");
    }

    path_in(p, sizeof p, "dirshard.bin");
    mkdir(p, 0755);
    expect_error("directory", OP_OPEN, p, 256, 4, 0, "dirshard.bin", "not a regular file");

    /* out-of-vocab token, found when the sequence containing it is read */
    {
        uint32_t big[100];
        for (int i = 0; i < 100; i++) big[i] = (uint32_t)i;
        big[77] = 70000;
        path_in(p, sizeof p, "oov32.bin");
        write_shard(p, big, 100, 4);
        expect_error("token_out_of_vocab_u32", OP_SEQ, p, 50257, 10, 8,
                     "data.train: ", "oov32.bin: token 70000 at token offset 77 >= model.vocab_size 50257");
        /* in a second shard: offset is within that file */
        snprintf(q, sizeof q, "%s/oov2", tmpdir);
        mkdir(q, 0755);
        snprintf(p, sizeof p, "%s/oov2/s0.bin", tmpdir);
        write_shard(p, tok, 30, 2);
        big[77] = 300;
        snprintf(p, sizeof p, "%s/oov2/s1.bin", tmpdir);
        write_shard(p, big, 100, 2);
        snprintf(p, sizeof p, "%s/oov2/s*.bin", tmpdir);
        expect_error("token_out_of_vocab_u16", OP_SEQ, p, 256, 10, 20,
                     "oov2/s1.bin: token 300 at token offset 77 >= model.vocab_size 256", "data.train");
    }

    /* vocab errors */
    const char *toks[2] = {"ab", "cd"};
    const unsigned char lens[2] = {2, 2};
    path_in(p, sizeof p, "vocab_badmagic.bin");
    write_vocab(p, 1234, 2, 2, 0, toks, lens, 0);
    expect_error("vocab_bad_magic", OP_VOCAB, p, 0, 0, 0, "vocab_badmagic.bin", "bad vocab magic 1234");
    path_in(p, sizeof p, "vocab_badver.bin");
    write_vocab(p, VOCAB_MAGIC, 3, 2, 0, toks, lens, 0);
    expect_error("vocab_bad_version", OP_VOCAB, p, 0, 0, 0, "vocab_badver.bin", "version 3");
    path_in(p, sizeof p, "vocab_trunc.bin");
    write_vocab(p, VOCAB_MAGIC, 2, 2, 0, toks, lens, 1);
    expect_error("vocab_truncated", OP_VOCAB, p, 0, 0, 0, "vocab_trunc.bin", "truncated");
    path_in(p, sizeof p, "vocab_short.bin");
    f = fopen(p, "wb");
    fwrite(tok, 1, 40, f);
    fclose(f);
    expect_error("vocab_short_header", OP_VOCAB, p, 0, 0, 0, "vocab_short.bin", "shorter than");
    path_in(p, sizeof p, "vocab_missing.bin");
    expect_error("vocab_missing", OP_VOCAB, p, 0, 0, 0, "vocab_missing.bin", "cannot read");
}

/* ------------------------------------------------------------------ blends */

/* "0.5 A 0.3 B 0.2 C" against the three sources opened alone (source i
 * shuffled with seed + i) and the greedy rule written out again here: for
 * three periods and a bit, sequence seq is the next unused sequence of the
 * source the rule picks, read from that source alone. */
static void test_blend_case(int shuffle, const char *weights[3], const char *label) {
    enum { T = 5 };
    const uint64_t seed = 77;
    char src[3][800], pat[2600];
    static const int sizes[3] = {1000, 701, 333};
    for (int i = 0; i < 3; i++) {
        char name[64], dir[700];
        snprintf(name, sizeof name, "blend_%s_%d", label, i);
        path_in(dir, sizeof dir, name);
        mkdir(dir, 0755);
        uint32_t tok[1000];
        for (int k = 0; k < sizes[i]; k++) tok[k] = (uint32_t)(i * 1000 + k) % 3001;
        char f[800];
        snprintf(f, sizeof f, "%s/a.bin", dir);
        write_shard(f, tok, (size_t)sizes[i] / 2, i == 1 ? 4 : 2);
        snprintf(f, sizeof f, "%s/b.bin", dir);
        write_shard(f, tok + sizes[i] / 2, (size_t)(sizes[i] - sizes[i] / 2), i == 1 ? 4 : 2);
        snprintf(src[i], sizeof src[i], "%s/*.bin", dir);
    }
    snprintf(pat, sizeof pat, "%s %s  %s %s\t%s %s", weights[0], src[0], weights[1], src[1], weights[2], src[2]);
    DataSet b, s[3];
    dataset_open(&b, pat, "data.train", 3001, T, shuffle, seed);
    for (int i = 0; i < 3; i++) dataset_open(&s[i], src[i], "data.train", 3001, T, shuffle, seed + (uint64_t)i);
    check(b.n_src == 3 && b.n_tokens == 1000 + 701 + 333, "blend %s: 3 sources, %llu tokens", label,
          (unsigned long long)b.n_tokens);
    const double w[3] = {0.5, 0.3, 0.2};
    uint64_t used[3] = {0, 0, 0};
    uint32_t c[3] = {0, 0, 0};
    double worst_share = 0;
    int bad_pick = 0, bad_tok = 0;
    const uint64_t N = 3 * (uint64_t)BLEND_PERIOD + 1234;
    int in[T], tg[T], in2[T], tg2[T];
    for (uint64_t seq = 0; seq < N; seq++) {
        uint64_t p = seq % BLEND_PERIOD;
        if (p == 0) c[0] = c[1] = c[2] = 0;
        int best = 0;
        for (int i = 1; i < 3; i++)
            if (w[i] * (double)(p + 1) - c[i] > w[best] * (double)(p + 1) - c[best]) best = i;
        c[best]++;
        for (int i = 0; i < 3 && seq < BLEND_PERIOD; i++) {
            double dev = fabs((double)c[i] - w[i] * (double)(p + 1));
            if (dev > worst_share) worst_share = dev;
        }
        int got;
        uint64_t n;
        dataset_blend_pick(&b, seq, &got, &n);
        if (got != best || n != used[best]) bad_pick++;
        dataset_sequence(&b, seq, in, tg);
        dataset_sequence(&s[best], used[best], in2, tg2);
        if (memcmp(in, in2, sizeof in) || memcmp(tg, tg2, sizeof tg)) bad_tok++;
        used[best]++;
    }
    check(bad_pick == 0 && bad_tok == 0,
          "blend %s (shuffle %d): %llu sequences (3 periods and more) are each source's next unused one, by the greedy "
          "rule (%d wrong picks, %d wrong tokens); used %llu/%llu/%llu", label, shuffle, (unsigned long long)N, bad_pick,
          bad_tok, (unsigned long long)used[0], (unsigned long long)used[1], (unsigned long long)used[2]);
    check(worst_share < 1.0, "blend %s: every prefix of the period holds each source within %.3f (< 1) sequences of its "
                             "share", label, worst_share);
    char line[4096];
    dataset_describe(&b, pat, 0, line, sizeof line);
    check(strstr(line, "blend of 3: 50% ") && strstr(line, "30% ") && strstr(line, "20% ") &&
              strstr(line, "(333 tokens)"), "blend %s: describe: %s", label, line);
    /* a run of 2000 tokens reads 1000 / 600 / 400 tokens of the sources' 1000 / 701 / 333 */
    dataset_describe(&b, pat, 2000, line, sizeof line);
    check(strstr(line, "(1000 tokens, 1 epochs)") && strstr(line, "(701 tokens, 0.856 epochs)") &&
              strstr(line, "(333 tokens, 1.2 epochs)"), "blend %s: describe with a run of 2000 tokens: %s", label, line);
    dataset_describe(&s[2], "one", 2000, line, sizeof line);
    check(strcmp(line, "one (333 tokens, 6.01 epochs this run)") == 0, "describe one source with a run of 2000 tokens: %s", line);
    for (int i = 0; i < 3; i++) dataset_close(&s[i]);
    dataset_close(&b);
}

static void test_blend(void) {
    const char *norm[3] = {"0.5", "0.3", "0.2"}, *raw[3] = {"5", "3e0", "2."};
    test_blend_case(0, norm, "norm");
    test_blend_case(1, norm, "shuf");
    test_blend_case(0, raw, "raw"); /* weights are normalised */
    /* a pattern whose first word is not a number is one path, blanks included */
    char p[700];
    path_in(p, sizeof p, "a b.bin");
    uint32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (uint32_t)i;
    write_shard(p, tok, 40, 2);
    DataSet d;
    dataset_open(&d, p, "data.train", 256, 4, 0, 0);
    check(d.n_src == 0 && d.n_tokens == 40, "a path with a blank is one path, not a blend");
    dataset_close(&d);
}

/* ------------------------------------------------------------------ main */

static void rm_rf(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

int main(int argc, char **argv) {
    int keep = argc > 1 && strcmp(argv[1], "--keep") == 0;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_data_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }

    test_sequential(2, 50257);
    test_sequential(4, 100000); /* ids above 65535 */
    test_shuffle_case(90, 8, 2);    /* n_seqs 11, leftover tokens at the end */
    test_shuffle_case(64, 8, 3);    /* n_seqs 8 = power of two, last target wraps to token 0 */
    test_shuffle_case(4003, 4, 3);  /* n_seqs 1000 */
    test_shuffle_case(1025, 1, 2);  /* n_seqs 1025 = 2^10 + 1, T = 1 */
    test_shuffle_case(13, 7, 1);    /* n_seqs 1 */
    test_printable();
    test_vocab();
    test_blend();
    test_errors();

    if (keep) printf("kept %s\n", tmpdir);
    else rm_rf(tmpdir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
