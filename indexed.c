/* indexed.c — Megatron-LM's indexed dataset (`.bin` + MMIDIDX `.idx`)
 * as one Shard: the index validated and mapped, the tokens mapped, their
 * ids range-checked at open (the result cached), document boundaries read
 * from the mapped index on demand (never copied: a corpus of 10^8
 * documents keeps its 1.6 GB of pointers on disk).
 *
 * The index's arrays sit at offsets that are not multiples of their
 * element size (the header is 34 bytes), so every read goes through
 * memcpy. Reading the documents back to back in index order is reading
 * the .bin from byte 0 when the pointers are back to back (each one the
 * last plus its sequence's bytes), which Megatron's builder always writes
 * and this reader requires: anything else is refused as damaged. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "indexed.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_BYTES (INDEXED_MAGIC_LEN + 8 + 1 + 8 + 8)

static uint64_t rd_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static int64_t rd_i64(const unsigned char *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}
static int32_t rd_i32(const unsigned char *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int indexed_prefix(const char *path, char *prefix, size_t n) {
    char buf[PATH_MAX + 8];
    size_t len = strlen(path);
    if (len + 5 > sizeof buf || len + 1 > n) return 0;
    if (has_suffix(path, ".idx") || has_suffix(path, ".bin")) {
        memcpy(buf, path, len - 4);
        strcpy(buf + len - 4, ".idx");
        if (has_suffix(path, ".bin") && !is_file(buf)) return 0; /* an llm.c shard */
        memcpy(prefix, path, len - 4);
        prefix[len - 4] = '\0';
        return 1;
    }
    snprintf(buf, sizeof buf, "%s.idx", path);
    if (!is_file(buf)) return 0;
    snprintf(buf, sizeof buf, "%s.bin", path);
    if (!is_file(buf)) return 0;
    memcpy(prefix, path, len + 1);
    return 1;
}

static const void *map_file(const char *path, const char *what, size_t *len, struct stat *st) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) die(EXIT_USAGE, "%s: %s: cannot open (%s)", what, path, strerror(errno));
    if (fstat(fd, st) != 0) die(EXIT_USAGE, "%s: %s: cannot stat (%s)", what, path, strerror(errno));
    if (!S_ISREG(st->st_mode)) die(EXIT_USAGE, "%s: %s: not a regular file", what, path);
    *len = (size_t)st->st_size;
    if (*len == 0) {
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) die(EXIT_USAGE, "%s: %s: cannot mmap (%s)", what, path, strerror(errno));
    close(fd);
    return m;
}

/* dtype code -> bytes a token and signedness; 0 for the float codes and
 * unknown ones */
static int dtype_bytes(int code, int *is_signed, const char **name) {
    static const struct { int bytes, sign; const char *name; } t[9] = {
        {0, 0, "?"}, {1, 0, "uint8"}, {1, 1, "int8"}, {2, 1, "int16"}, {4, 1, "int32"},
        {8, 1, "int64"}, {0, 0, "float64"}, {0, 0, "float32"}, {2, 0, "uint16"}};
    if (code < 1 || code > 8) {
        *name = "unknown";
        return 0;
    }
    *is_signed = t[code].sign;
    *name = t[code].name;
    return t[code].bytes;
}

/* --------------------------------------------------------- token scan */

typedef struct { int64_t lo, hi; } Range;

#define SCAN_LOOP(TYPE)                                           \
    do {                                                          \
        const TYPE *p = (const TYPE *)tok;                        \
        TYPE lo = p[0], hi = p[0];                                \
        for (uint64_t i = 0; i < n; i++) {                        \
            lo = p[i] < lo ? p[i] : lo;                           \
            hi = p[i] > hi ? p[i] : hi;                           \
        }                                                         \
        r.lo = (int64_t)lo;                                       \
        r.hi = (int64_t)hi;                                       \
    } while (0)

/* The smallest and largest id of n tokens (n >= 1): branch-free min/max
 * loops the compiler vectorises. */
static Range scan_range(const void *tok, uint64_t n, int bytes, int sgn) {
    Range r = {0, 0};
    if (bytes == 1 && !sgn) SCAN_LOOP(uint8_t);
    else if (bytes == 1) SCAN_LOOP(int8_t);
    else if (bytes == 2 && !sgn) SCAN_LOOP(uint16_t);
    else if (bytes == 2) SCAN_LOOP(int16_t);
    else if (bytes == 4) SCAN_LOOP(int32_t);
    else SCAN_LOOP(int64_t);
    return r;
}

int64_t indexed_token_at(const Shard *s, uint64_t i) {
    const char *p = (const char *)s->tokens + i * (uint64_t)s->token_bytes;
    switch (s->token_bytes * 2 + s->token_signed) {
    case 2: return *(const uint8_t *)p;
    case 3: return *(const int8_t *)p;
    case 4: return *(const uint16_t *)p;
    case 5: return *(const int16_t *)p;
    case 8: return *(const uint32_t *)p;
    case 9: return *(const int32_t *)p;
    default: return *(const int64_t *)p;
    }
}

/* The cache file of a dataset: LLMTRAIN_CACHE_DIR, else
 * $XDG_CACHE_HOME/llmtrain, else $HOME/.cache/llmtrain; the name a hash
 * of the index's real path. 0 when no folder can be named. */
static int cache_path(const char *idx, char *out, size_t n, int make) {
    char dir[PATH_MAX], real[PATH_MAX];
    const char *e = getenv("LLMTRAIN_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (e && *e) snprintf(dir, sizeof dir, "%s", e);
    else if (x && *x) snprintf(dir, sizeof dir, "%s/llmtrain", x);
    else if (h && *h) snprintf(dir, sizeof dir, "%s/.cache/llmtrain", h);
    else return 0;
    if (!realpath(idx, real)) return 0;
    if (make) {
        char up[PATH_MAX];
        snprintf(up, sizeof up, "%s", dir);
        for (char *q = up + 1; *q; q++)
            if (*q == '/') {
                *q = '\0';
                mkdir(up, 0755);
                *q = '/';
            }
        mkdir(up, 0755);
    }
    uint64_t hash = 1469598103934665603ull; /* FNV-1a */
    for (const char *q = real; *q; q++) hash = (hash ^ (unsigned char)*q) * 1099511628211ull;
    return snprintf(out, n, "%s/indexed-%016llx.scan", dir, (unsigned long long)hash) < (int)n;
}

/* The cache's line for these two files: both sizes and modification
 * times, the dtype and the counts; the id range follows it. */
static void cache_key(char *key, size_t n, const struct stat *si, const struct stat *sb, int dtype) {
    snprintf(key, n, "llmtrain-indexed-scan 1 %lld %lld.%09ld %lld %lld.%09ld %d", (long long)si->st_size,
             (long long)si->st_mtim.tv_sec, si->st_mtim.tv_nsec, (long long)sb->st_size, (long long)sb->st_mtim.tv_sec,
             sb->st_mtim.tv_nsec, dtype);
}

static int cache_read(const char *idx, const char *key, Range *r) {
    char path[PATH_MAX + 64], line[512], want[320];
    if (!cache_path(idx, path, sizeof path, 0)) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    long long lo, hi;
    snprintf(want, sizeof want, "%s ", key);
    if (!ok || strncmp(line, want, strlen(want)) != 0) return 0;
    if (sscanf(line + strlen(want), "%lld %lld", &lo, &hi) != 2) return 0;
    r->lo = lo;
    r->hi = hi;
    return 1;
}

/* Written whole to a temporary name, then renamed: a reader sees the old
 * file or the new one. Failures only cost the next open a scan. */
static void cache_write(const char *idx, const char *key, Range r) {
    char path[PATH_MAX + 64], tmp[PATH_MAX + 96];
    if (!cache_path(idx, path, sizeof path, 1)) return;
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    int bad = fprintf(f, "%s %lld %lld\n", key, (long long)r.lo, (long long)r.hi) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) unlink(tmp);
}

/* ------------------------------------------------------------- open */

void indexed_open(Shard *s, const char *prefix, const char *what, int vocab_size) {
    char ip[1100], bp[1100];
    if (snprintf(ip, sizeof ip, "%s.idx", prefix) >= (int)sizeof s->path ||
        snprintf(bp, sizeof bp, "%s.bin", prefix) >= (int)sizeof s->path)
        die(EXIT_USAGE, "%s: %s: path too long (at most %zu bytes)", what, prefix, sizeof s->path - 5);
    memset(s, 0, sizeof *s);
    strcpy(s->path, bp);
    struct stat si, sb;
    size_t ilen, blen;
    const unsigned char *ix = map_file(ip, what, &ilen, &si);
    if (ilen < HEADER_BYTES)
        die(EXIT_USAGE, "%s: %s: %zu bytes, shorter than the %d-byte MMIDIDX header (expected a Megatron index)", what, ip,
            ilen, HEADER_BYTES);
    if (memcmp(ix, INDEXED_MAGIC, INDEXED_MAGIC_LEN) != 0)
        die(EXIT_USAGE, "%s: %s: bad magic (expected MMIDIDX, a Megatron indexed dataset's index)", what, ip);
    uint64_t version = rd_u64(ix + 9);
    if (version != INDEXED_VERSION)
        die(EXIT_USAGE, "%s: %s: index version %llu (expected %d)", what, ip, (unsigned long long)version, INDEXED_VERSION);
    int code = ix[17], sgn = 0;
    const char *dname;
    int tb = dtype_bytes(code, &sgn, &dname);
    if (!tb)
        die(EXIT_USAGE, "%s: %s: token dtype %s (code %d): token ids must be integers (uint8, int8, int16, int32, int64, uint16)",
            what, ip, dname, code);
    uint64_t S = rd_u64(ix + 18), D = rd_u64(ix + 26);
    /* sizes (4 S), pointers (8 S), document index (8 D); modes may follow */
    __uint128_t need = (__uint128_t)HEADER_BYTES + (__uint128_t)12 * S + (__uint128_t)8 * D;
    if (need > ilen)
        die(EXIT_USAGE, "%s: %s: header says %llu sequences and %llu document indices, %.4g bytes, but the index has %zu", what,
            ip, (unsigned long long)S, (unsigned long long)D, (double)need, ilen);
    if (D < 1) die(EXIT_USAGE, "%s: %s: empty document index (expected at least the leading 0)", what, ip);
    const unsigned char *sizes = ix + HEADER_BYTES, *ptrs = sizes + 4 * S, *docs = ptrs + 8 * S;
    const unsigned char *bin = map_file(bp, what, &blen, &sb);
    char key[300];
    cache_key(key, sizeof key, &si, &sb, code);
    Range r;
    int cached = cache_read(ip, key, &r);
    /* the index: every size non-negative, every pointer where the last
     * sequence ended, all inside the .bin, which they fill exactly */
    uint64_t at = 0;
    if (!cached)
        for (uint64_t i = 0; i < S; i++) {
            int32_t len = rd_i32(sizes + 4 * i);
            int64_t p = rd_i64(ptrs + 8 * i);
            if (len < 0) die(EXIT_USAGE, "%s: %s: sequence %llu has size %d (expected >= 0)", what, ip, (unsigned long long)i, len);
            if ((uint64_t)p != at)
                die(EXIT_USAGE, "%s: %s: sequence %llu's pointer is %lld, expected %llu (the previous sequence's end: pointers out of order)",
                    what, ip, (unsigned long long)i, (long long)p, (unsigned long long)at);
            at += (uint64_t)len * (uint64_t)tb;
            if (at > blen)
                die(EXIT_USAGE, "%s: %s: sequence %llu ends at byte %llu, past the %zu bytes of %s", what, ip, (unsigned long long)i,
                    (unsigned long long)at, blen, bp);
        }
    else
        for (uint64_t i = 0; i < S; i++) at += (uint64_t)(uint32_t)rd_i32(sizes + 4 * i) * (uint64_t)tb;
    if (at != blen)
        die(EXIT_USAGE, "%s: %s: the index's sequences fill %llu bytes but %s has %zu", what, ip, (unsigned long long)at, bp, blen);
    if (!cached) {
        if (rd_i64(docs) != 0) die(EXIT_USAGE, "%s: %s: document index starts at %lld (expected 0)", what, ip, (long long)rd_i64(docs));
        for (uint64_t d = 1; d < D; d++) {
            int64_t a = rd_i64(docs + 8 * (d - 1)), b = rd_i64(docs + 8 * d);
            if (b < a || (uint64_t)b > S)
                die(EXIT_USAGE, "%s: %s: document index %llu is %lld after %lld (expected non-decreasing, at most the %llu sequences)",
                    what, ip, (unsigned long long)d, (long long)b, (long long)a, (unsigned long long)S);
        }
        if ((uint64_t)rd_i64(docs + 8 * (D - 1)) != S)
            die(EXIT_USAGE, "%s: %s: document index ends at %lld, expected the sequence count %llu", what, ip,
                (long long)rd_i64(docs + 8 * (D - 1)), (unsigned long long)S);
    }
    uint64_t n = blen / (uint64_t)tb;
    if (n == 0) die(EXIT_USAGE, "%s: %s: empty dataset (no tokens)", what, bp);
    s->map = bin;
    s->map_len = blen;
    s->tokens = bin;
    s->token_bytes = tb;
    s->token_signed = sgn;
    s->n_tokens = n;
    s->idx_map = ix;
    s->idx_len = ilen;
    s->idx_ptrs = ptrs;
    s->idx_docs = docs;
    s->n_seq = S;
    s->n_docidx = D;
    if (!cached) {
        r = scan_range(bin, n, tb, sgn);
        cache_write(ip, key, r);
    }
    if (r.lo < 0 || r.hi >= vocab_size) { /* find the first offender for the line */
        for (uint64_t i = 0; i < n; i++) {
            int64_t v = indexed_token_at(s, i);
            if (v < 0 || v >= vocab_size)
                die(EXIT_USAGE, "%s: %s: token %lld at token offset %llu is outside [0, model.vocab_size %d)", what, bp, (long long)v,
                    (unsigned long long)i, vocab_size);
        }
        die(EXIT_USAGE, "%s: %s: the scan cache says ids [%lld, %lld] but none is outside [0, %d): remove the cache file", what, bp,
            (long long)r.lo, (long long)r.hi, vocab_size);
    }
}

void indexed_close(Shard *s) {
    if (s->idx_map) munmap((void *)s->idx_map, s->idx_len);
    s->idx_map = NULL;
}

/* ----------------------------------------------------- document ends */

/* Token offset where document d (< D - 1) starts; D - 1: the end. */
static uint64_t doc_start(const Shard *s, uint64_t d) {
    uint64_t q = (uint64_t)rd_i64((const unsigned char *)s->idx_docs + 8 * d);
    if (q >= s->n_seq) return s->n_tokens;
    return (uint64_t)rd_i64((const unsigned char *)s->idx_ptrs + 8 * q) / (uint64_t)s->token_bytes;
}

void indexed_ends(const Shard *s, uint64_t off, uint64_t n, unsigned char *ends) {
    memset(ends, 0, (size_t)n);
    /* the first document boundary after off: the smallest d with start > off */
    uint64_t lo = 1, hi = s->n_docidx - 1; /* doc_start(D-1) = n_tokens > off */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (doc_start(s, mid) > off) hi = mid;
        else lo = mid + 1;
    }
    for (uint64_t d = lo; d < s->n_docidx; d++) {
        uint64_t b = doc_start(s, d); /* token b - 1 ends a document */
        if (b - 1 >= off + n) break;
        if (b > off) ends[b - 1 - off] = 1;
    }
}
