/* data.c — token shards in llm.c's format, memory-mapped (never read into
 * RAM), addressed by global sequence number; and the llm.c vocab table.
 *
 * Addressing (see data.h): n = total tokens of all shards concatenated in
 * path order.
 *   shuffle off: start = (seq * T) mod n   (128-bit product, so any seq works)
 *   shuffle on:  n_seqs = n / T (>= 1 because n >= T+1), epoch = seq / n_seqs,
 *                j = seq % n_seqs, start = perm(seed, epoch, j) * T
 *   inputs[i] = tok[(start + i) mod n], targets[i] = tok[(start + i + 1) mod n]
 *   for i < T, i.e. reads wrap to the start of the data.
 *
 * perm(seed, epoch, .) is a bijection on [0, n_seqs) that needs no memory: a
 * balanced Feistel network with 6 rounds on the smallest domain of 2^(2h)
 * elements that holds n_seqs (h >= 1), keyed per round by splitmix64 of
 * (seed, epoch, round), with cycle-walking: the network is applied again
 * until the value falls inside [0, n_seqs). Since the domain is at most 4x
 * n_seqs, that takes under 4 applications on average. Each epoch therefore
 * visits every sequence start j*T exactly once, in an order that depends on
 * (seed, epoch) only, so any rank can compute any step's sequences.
 *
 * A blend of sources with weights w_i (normalised to sum 1) is a fixed
 * pattern of BLEND_PERIOD = 65536 positions, built greedily as Megatron
 * builds its blended index: position p goes to the source with the largest
 * w_i * (p + 1) - c_i, c_i its positions so far (ties: the lowest i). Global
 * sequence seq = q * P + p is then source pat_src[p]'s sequence
 * q * pat_cnt[src] + pat_idx[p]: every source's sequences are used in their
 * own order (shuffled or not) with none skipped or repeated, any prefix of
 * the pattern holds each source less than one sequence above its share (it is
 * picked only while below it) and about one below (README: measured bounds),
 * and a step is still addressable without history.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data.h"
#include "indexed.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- shards */

static const char *ds_what(const DataSet *d) {
    return d->what;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void shard_open(Shard *s, const char *path, const char *what) {
    if (strlen(path) >= sizeof s->path)
        die(EXIT_USAGE, "%s: %s: path too long (at most %zu bytes)", what, path, sizeof s->path - 1);
    memset(s, 0, sizeof *s);
    strcpy(s->path, path);
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO's open would wait for a writer: refused below */
    if (fd < 0) die(EXIT_USAGE, "%s: %s: cannot open (%s)", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) die(EXIT_USAGE, "%s: %s: cannot stat (%s)", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        die(EXIT_USAGE, "%s: %s: not a regular file (expected a token shard)", what, path);
    const size_t header_bytes = SHARD_HEADER_INTS * sizeof(int32_t);
    uint64_t size = (uint64_t)st.st_size;
    if (size < header_bytes)
        die(EXIT_USAGE, "%s: %s: file has %llu bytes, shorter than the %zu-byte shard header", what, path,
            (unsigned long long)size, header_bytes);
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) die(EXIT_USAGE, "%s: %s: cannot mmap (%s)", what, path, strerror(errno));
    close(fd);
    const int32_t *h = (const int32_t *)map;
    int32_t magic = h[0], version = h[1];
    int tb;
    if (magic == SHARD_MAGIC_U16) {
        tb = 2;
        if (version != SHARD_VERSION_U16)
            die(EXIT_USAGE, "%s: %s: bad version %d for magic %d (expected %d)", what, path, version, magic,
                SHARD_VERSION_U16);
    } else if (magic == SHARD_MAGIC_U32) {
        tb = 4;
        if (version != SHARD_VERSION_U32)
            die(EXIT_USAGE, "%s: %s: bad version %d for magic %d (expected %d)", what, path, version, magic,
                SHARD_VERSION_U32);
    } else {
        die(EXIT_USAGE, "%s: %s: bad magic %d (expected %d or %d)", what, path, magic, SHARD_MAGIC_U16,
            SHARD_MAGIC_U32);
    }
    /* The count is an int32 in llm.c; read it unsigned so a shard of up to
     * 2^32-1 uint32 tokens works; a negative count then fails the size check. */
    uint64_t ntok = (uint32_t)h[2];
    uint64_t have = size - header_bytes;
    if (ntok * (uint64_t)tb != have)
        die(EXIT_USAGE, "%s: %s: header says %llu tokens (%llu bytes) but file has %llu bytes of tokens", what,
            path, (unsigned long long)ntok, (unsigned long long)(ntok * (uint64_t)tb), (unsigned long long)have);
    if (ntok == 0) die(EXIT_USAGE, "%s: %s: empty shard (header says 0 tokens)", what, path);
    s->map = map;
    s->map_len = (size_t)size;
    s->tokens = (const char *)map + header_bytes;
    s->token_bytes = tb;
    s->n_tokens = ntok;
}

/* ---------------------------------------------------------------- blends */

/* A whole blank-free word that is a number (so "1.bin" is not one). */
static int word_number(const char *w, size_t len, double *v) {
    char buf[64], *end;
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, w, len);
    buf[len] = '\0';
    errno = 0;
    *v = strtod(buf, &end);
    return end == buf + len && errno == 0;
}

/* The blank-separated words of s: start and length of word k, or 0. */
static int nth_word(const char *s, int k, const char **w, size_t *len) {
    for (int i = 0;; i++) {
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) return 0;
        const char *e = s;
        while (*e && *e != ' ' && *e != '\t') e++;
        if (i == k) {
            *w = s;
            *len = (size_t)(e - s);
            return 1;
        }
        s = e;
    }
}

/* A pattern whose first word is a number is a blend. */
static int is_blend(const char *pattern) {
    const char *w = NULL;
    size_t len = 0;
    double v;
    return nth_word(pattern, 1, &w, &len) && nth_word(pattern, 0, &w, &len) && word_number(w, len, &v);
}

static void blend_open(DataSet *d, const char *pattern, const char *what, int vocab_size, int T, int shuffle,
                       uint64_t seed) {
    int nw = 0;
    const char *w = NULL;
    size_t len = 0;
    while (nth_word(pattern, nw, &w, &len)) nw++;
    if (nw % 2)
        die(EXIT_USAGE, "%s: '%s': a blend is pairs of weight and path (\"0.7 a/*.bin 0.3 b/*.bin\"); got %d words", what,
            pattern, nw);
    int n = nw / 2;
    if (n > BLEND_MAX_SOURCES) die(EXIT_USAGE, "%s: a blend of %d sources (at most %d)", what, n, BLEND_MAX_SOURCES);
    d->n_src = n;
    d->src = calloc_check((size_t)n, sizeof *d->src);
    d->weight = calloc_check((size_t)n, sizeof *d->weight);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        nth_word(pattern, 2 * i, &w, &len);
        if (!word_number(w, len, &d->weight[i]) || !(d->weight[i] > 0) || !isfinite(d->weight[i]))
            die(EXIT_USAGE, "%s: blend source %d: weight '%.*s' (expected a positive number before each path)", what, i + 1,
                (int)len, w);
        sum += d->weight[i];
        nth_word(pattern, 2 * i + 1, &w, &len);
        char path[1024];
        if (len >= sizeof path) die(EXIT_USAGE, "%s: blend source %d: path too long", what, i + 1);
        memcpy(path, w, len);
        path[len] = '\0';
        dataset_open(&d->src[i], path, what, vocab_size, T, shuffle, seed + (uint64_t)i);
        d->n_tokens += d->src[i].n_tokens;
    }
    for (int i = 0; i < n; i++) d->weight[i] /= sum;
    d->pat_src = malloc_check(BLEND_PERIOD * sizeof *d->pat_src);
    d->pat_idx = malloc_check(BLEND_PERIOD * sizeof *d->pat_idx);
    d->pat_cnt = calloc_check((size_t)n, sizeof *d->pat_cnt);
    for (uint32_t p = 0; p < BLEND_PERIOD; p++) {
        int best = 0;
        double best_err = -INFINITY;
        for (int i = 0; i < n; i++) {
            double err = d->weight[i] * (double)(p + 1) - (double)d->pat_cnt[i];
            if (err > best_err) best_err = err, best = i;
        }
        d->pat_src[p] = (uint8_t)best;
        d->pat_idx[p] = d->pat_cnt[best]++;
    }
    for (int i = 0; i < n; i++)
        if (!d->pat_cnt[i])
            die(EXIT_USAGE, "%s: blend source %d: weight %g of %g draws no sequence in %d (expected at least 1/%d of the sum)",
                what, i + 1, d->weight[i] * sum, sum, BLEND_PERIOD, BLEND_PERIOD);
    d->vocab_size = vocab_size;
    d->T = T;
    d->shuffle = shuffle ? 1 : 0;
    d->seed = seed;
}

void dataset_blend_pick(const DataSet *d, uint64_t seq, int *src, uint64_t *n) {
    uint64_t q = seq / BLEND_PERIOD, p = seq % BLEND_PERIOD;
    *src = d->pat_src[p];
    *n = q * d->pat_cnt[*src] + d->pat_idx[p];
}

void dataset_describe(const DataSet *d, const char *pattern, double run_tokens, char *buf, size_t n) {
    char ep[48] = "";
    if (!d->n_src) {
        if (run_tokens > 0) snprintf(ep, sizeof ep, ", %.3g epochs this run", run_tokens / (double)d->n_tokens);
        snprintf(buf, n, "%s (%llu tokens%s)", pattern, (unsigned long long)d->n_tokens, ep);
        return;
    }
    size_t at = (size_t)snprintf(buf, n, "blend of %d:", d->n_src);
    for (int i = 0; i < d->n_src && at < n; i++) {
        const char *w = NULL;
        size_t len = 0;
        nth_word(pattern, 2 * i + 1, &w, &len);
        if (run_tokens > 0) snprintf(ep, sizeof ep, ", %.3g epochs", run_tokens * d->weight[i] / (double)d->src[i].n_tokens);
        at += (size_t)snprintf(buf + at, n - at, "%s %.4g%% %.*s (%llu tokens%s)", i ? "," : "", 100 * d->weight[i], (int)len, w,
                               (unsigned long long)d->src[i].n_tokens, ep);
    }
}

void dataset_open(DataSet *d, const char *pattern, const char *what, int vocab_size, int T, int shuffle,
                  uint64_t seed) {
    memset(d, 0, sizeof *d);
    if (!what) what = "data";
    if (!pattern || !*pattern) die(EXIT_USAGE, "%s: empty path (expected a token shard file or glob)", what);
    if (T <= 0) die(EXIT_USAGE, "%s: sequence length %d must be positive", what, T);
    if (vocab_size <= 0) die(EXIT_USAGE, "%s: model.vocab_size %d must be positive", what, vocab_size);
    snprintf(d->what, sizeof d->what, "%s", what);
    if (is_blend(pattern)) {
        blend_open(d, pattern, what, vocab_size, T, shuffle, seed);
        return;
    }

    /* A path that names an existing file is taken literally (it may contain
     * glob metacharacters); anything else is a glob. */
    char **paths;
    int n = 0;
    glob_t g;
    int globbed = 0;
    struct stat st;
    char pre[1024];
    if (indexed_prefix(pattern, pre, sizeof pre) || stat(pattern, &st) == 0) {
        paths = malloc_check(sizeof *paths);
        paths[0] = (char *)pattern;
        n = 1;
    } else {
        int rc = glob(pattern, 0, NULL, &g);
        if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0))
            die(EXIT_USAGE, "%s: no file matches '%s'", what, pattern);
        if (rc != 0) die(EXIT_USAGE, "%s: cannot expand '%s' (glob error %d)", what, pattern, rc);
        globbed = 1;
        n = (int)g.gl_pathc;
        paths = malloc_check((size_t)n * sizeof *paths);
        for (int i = 0; i < n; i++) paths[i] = g.gl_pathv[i];
        qsort(paths, (size_t)n, sizeof *paths, cmp_str); /* byte order, independent of locale */
    }

    d->shards = calloc_check((size_t)n, sizeof(Shard));
    uint64_t total = 0;
    char last[1024] = "";
    for (int i = 0; i < n; i++) {
        Shard *s = &d->shards[d->n_shards];
        if (indexed_prefix(paths[i], pre, sizeof pre)) { /* a glob matches its .bin and .idx both: once */
            if (strcmp(pre, last) == 0) continue;
            snprintf(last, sizeof last, "%s", pre);
            indexed_open(s, pre, what, vocab_size);
        } else {
            shard_open(s, paths[i], what);
        }
        s->start = total;
        total += s->n_tokens;
        madvise((void *)s->map, s->map_len, shuffle ? MADV_NORMAL : MADV_SEQUENTIAL);
        d->n_shards++;
    }
    free(paths);
    if (globbed) globfree(&g);

    if (total < (uint64_t)T + 1)
        die(EXIT_USAGE, "%s: '%s': %llu tokens in %d file%s, need at least sequence length + 1 = %llu", what,
            pattern, (unsigned long long)total, n, n == 1 ? "" : "s", (unsigned long long)T + 1);
    d->n_tokens = total;
    d->vocab_size = vocab_size;
    d->T = T;
    d->shuffle = shuffle ? 1 : 0;
    d->seed = seed;
    d->n_seqs = total / (uint64_t)T;
}

void dataset_close(DataSet *d) {
    for (int i = 0; i < d->n_src; i++) dataset_close(&d->src[i]);
    free(d->src);
    free(d->weight);
    free(d->pat_src);
    free(d->pat_idx);
    free(d->pat_cnt);
    if (d->shards) {
        for (int i = 0; i < d->n_shards; i++) {
            if (d->shards[i].map) munmap((void *)d->shards[i].map, d->shards[i].map_len);
            indexed_close(&d->shards[i]);
        }
        free(d->shards);
    }
    memset(d, 0, sizeof *d);
}

/* ---------------------------------------------------------- permutation */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

#define FEISTEL_ROUNDS 6

/* Bijection on [0, n) keyed by (seed, epoch); see the comment at the top. */
static uint64_t permute(uint64_t j, uint64_t n, uint64_t seed, uint64_t epoch) {
    if (n <= 1) return 0;
    int bits = 0;
    while (bits < 64 && (n - 1) >> bits) bits++; /* n-1 < 2^bits */
    int h = (bits + 1) / 2;                       /* domain 2^(2h) >= n */
    uint64_t mask = (h >= 32) ? 0xFFFFFFFFull : ((1ull << h) - 1);
    uint64_t keys[FEISTEL_ROUNDS];
    uint64_t k = splitmix64(seed ^ 0x6C6C6D747261696Eull);
    k = splitmix64(k ^ epoch);
    for (int r = 0; r < FEISTEL_ROUNDS; r++) keys[r] = splitmix64(k + (uint64_t)r * 0xD1B54A32D192ED03ull);
    uint64_t x = j;
    do {
        uint64_t L = (x >> h) & mask, R = x & mask;
        for (int r = 0; r < FEISTEL_ROUNDS; r++) {
            uint64_t F = splitmix64(R ^ keys[r]) & mask;
            uint64_t nl = R;
            R = L ^ F;
            L = nl;
        }
        x = (L << h) | R;
    } while (x >= n); /* cycle-walk: x started inside [0,n), so this ends */
    return x;
}

/* ---------------------------------------------------------------- reads */

static int find_shard(const DataSet *d, uint64_t pos) {
    int lo = 0, hi = d->n_shards - 1;
    while (lo < hi) { /* last shard with start <= pos */
        int mid = (lo + hi + 1) / 2;
        if (d->shards[mid].start <= pos) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static void bad_token(const DataSet *d, const Shard *s, int64_t tok, uint64_t off) {
    die(EXIT_USAGE, "%s: %s: token %lld at token offset %llu %s model.vocab_size %d", ds_what(d), s->path, (long long)tok,
        (unsigned long long)off, tok < 0 ? "is negative, expected [0," : ">=", d->vocab_size);
}

/* An indexed dataset's tokens of 1 or 8 bytes, or signed: one by one. */
static void read_any(const DataSet *d, const Shard *s, uint64_t off, int *out, uint64_t m) {
    const int64_t V = d->vocab_size;
    for (uint64_t i = 0; i < m; i++) {
        int64_t v = indexed_token_at(s, off + i);
        if (v < 0 || v >= V) bad_token(d, s, v, off + i);
        out[i] = (int)v;
    }
}

/* out[0..count) = tok[(pos + i) mod n]; find the shard once, then walk. */
static void read_tokens(const DataSet *d, uint64_t pos, int *out, uint64_t count) {
    int si = find_shard(d, pos);
    uint64_t off = pos - d->shards[si].start;
    const uint32_t V = (uint32_t)d->vocab_size;
    while (count) {
        const Shard *s = &d->shards[si];
        uint64_t m = s->n_tokens - off;
        if (m > count) m = count;
        if (s->token_signed || s->token_bytes == 1 || s->token_bytes == 8) {
            read_any(d, s, off, out, m);
        } else if (s->token_bytes == 2) {
            const uint16_t *t = (const uint16_t *)s->tokens + off;
            for (uint64_t i = 0; i < m; i++) {
                uint32_t v = t[i];
                if (v >= V) bad_token(d, s, v, off + i);
                out[i] = (int)v;
            }
        } else {
            const uint32_t *t = (const uint32_t *)s->tokens + off;
            for (uint64_t i = 0; i < m; i++) {
                uint32_t v = t[i];
                if (v >= V) bad_token(d, s, v, off + i);
                out[i] = (int)v;
            }
        }
        out += m;
        count -= m;
        off = 0;
        if (++si == d->n_shards) si = 0; /* wrap to the start of the data */
    }
}

void dataset_sequence(const DataSet *d, uint64_t seq, int *inputs, int *targets) {
    dataset_sequence_part(d, seq, 0, d->T, inputs, targets);
}

/* Where sequence seq of a plain (not blended) set starts. */
static uint64_t seq_start(const DataSet *d, uint64_t seq) {
    const uint64_t T = (uint64_t)d->T;
    if (!d->shuffle) return (uint64_t)(((__uint128_t)seq * T) % d->n_tokens);
    return permute(seq % d->n_seqs, d->n_seqs, d->seed, seq / d->n_seqs) * T;
}

void dataset_sequence_part(const DataSet *d, uint64_t seq, int off, int len, int *inputs, int *targets) {
    if (d->trace) fprintf(d->trace, "%s %llu %d %d\n", d->what, (unsigned long long)seq, off, len);
    if (d->n_src) {
        int i;
        uint64_t k;
        dataset_blend_pick(d, seq, &i, &k);
        dataset_sequence_part(&d->src[i], k, off, len, inputs, targets);
        return;
    }
    const uint64_t n = d->n_tokens;
    /* targets = tokens [start+1, start+T], inputs = [start, start+T); the part from off */
    uint64_t start = (seq_start(d, seq) + (uint64_t)off) % n;
    read_tokens(d, start, inputs, 1);
    read_tokens(d, (start + 1) % n, targets, (uint64_t)len);
    if (len > 1) memcpy(inputs + 1, targets, (size_t)(len - 1) * sizeof *inputs);
}

/* --------------------------------------------------------- documents */

int dataset_has_docs(const DataSet *d) {
    for (int i = 0; i < d->n_src; i++)
        if (!dataset_has_docs(&d->src[i])) return 0;
    for (int i = 0; i < d->n_shards; i++)
        if (!d->shards[i].idx_map) return 0;
    return d->n_src || d->n_shards;
}

void dataset_sequence_ends(const DataSet *d, uint64_t seq, int off, int len, unsigned char *ends) {
    if (d->n_src) {
        int i;
        uint64_t k;
        dataset_blend_pick(d, seq, &i, &k);
        dataset_sequence_ends(&d->src[i], k, off, len, ends);
        return;
    }
    uint64_t pos = (seq_start(d, seq) + (uint64_t)off) % d->n_tokens, count = (uint64_t)len;
    int si = find_shard(d, pos);
    uint64_t o = pos - d->shards[si].start;
    while (count) { /* as read_tokens walks, wrapping at the end of the data */
        const Shard *s = &d->shards[si];
        uint64_t m = s->n_tokens - o;
        if (m > count) m = count;
        indexed_ends(s, o, m, ends);
        ends += m;
        count -= m;
        o = 0;
        if (++si == d->n_shards) si = 0;
    }
}

/* ---------------------------------------------------------------- vocab */

void vocab_load(Vocab *v, const char *path) {
    memset(v, 0, sizeof *v);
    size_t len;
    char *buf = read_text_file(path, &len);
    if (!buf) die(EXIT_USAGE, "data.vocab: %s: cannot read vocab file (%s)", path, read_text_why());
    const size_t hb = 256 * sizeof(uint32_t);
    if (len < hb)
        die(EXIT_USAGE, "data.vocab: %s: vocab file has %zu bytes, shorter than the %zu-byte header", path, len, hb);
    uint32_t h[256];
    memcpy(h, buf, hb);
    if (h[0] != VOCAB_MAGIC)
        die(EXIT_USAGE, "data.vocab: %s: bad vocab magic %u (expected %d)", path, h[0], VOCAB_MAGIC);
    if (h[1] != 1 && h[1] != 2) die(EXIT_USAGE, "data.vocab: %s: bad vocab version %u (expected 1 or 2)", path, h[1]);
    if (h[2] == 0 || h[2] > (1u << 30)) die(EXIT_USAGE, "data.vocab: %s: bad vocab size %u in header", path, h[2]);
    /* each token takes at least its length byte: a size past that is a
     * damaged header, refused before the tables are allocated for it */
    if (h[2] > len - hb)
        die(EXIT_USAGE, "data.vocab: %s: vocab header says %u tokens but the file has only %zu bytes after the header (at least one a token)",
            path, h[2], len - hb);
    int n = (int)h[2];
    int eot = -1;
    if (h[1] == 2 && h[3] != 0xFFFFFFFFu) {
        if (h[3] >= h[2])
            die(EXIT_USAGE, "data.vocab: %s: eot token %u >= vocab size %u (expected < vocab size, or 0xFFFFFFFF for none)",
                path, h[3], h[2]);
        eot = (int)h[3];
    }
    v->tok = calloc_check((size_t)n, sizeof *v->tok);
    v->len = malloc_check((size_t)n);
    v->n = n;
    v->eot = eot;
    size_t p = hb;
    for (int i = 0; i < n; i++) {
        if (p >= len)
            die(EXIT_USAGE, "data.vocab: %s: truncated vocab file: ends at token %d of %d (expected a length byte)", path, i, n);
        unsigned l = (unsigned char)buf[p++];
        if (len - p < l)
            die(EXIT_USAGE, "data.vocab: %s: truncated vocab file: token %d needs %u bytes, file has %zu left", path, i, l,
                len - p);
        v->tok[i] = malloc_check(l + 1);
        memcpy(v->tok[i], buf + p, l);
        v->tok[i][l] = '\0';
        v->len[i] = (unsigned char)l;
        p += l;
    }
    free(buf);
}

void vocab_fit(const Vocab *v, const char *what, const char *path, int vocab_size) {
    long long n = v->n, padded = (n + VOCAB_PAD - 1) / VOCAB_PAD * VOCAB_PAD;
    if (n > vocab_size)
        die(EXIT_USAGE, "data.vocab: %s: %s has %lld tokens, more than model.vocab_size %d (a table of another tokenizer? expected at most "
            "%d)", what, path, n, vocab_size, vocab_size);
    if (vocab_size > padded && padded > n)
        die(EXIT_USAGE, "data.vocab: %s: %s has %lld tokens but model.vocab_size is %d (expected %lld, or up to %lld: a vocabulary padded "
            "to the next multiple of %d, as GPT-2's 50257 to 50304)", what, path, n, vocab_size, n, padded, VOCAB_PAD);
    if (vocab_size > padded)
        die(EXIT_USAGE, "data.vocab: %s: %s has %lld tokens but model.vocab_size is %d (expected %lld, a multiple of %d that no padding "
            "rounds up)", what, path, n, vocab_size, n, VOCAB_PAD);
}

void vocab_print(const Vocab *v, int id, void *file) {
    FILE *f = (FILE *)file;
    if (v && v->tok && id >= 0 && id < v->n) fwrite(v->tok[id], 1, v->len[id], f);
    else fprintf(f, "<%d>", id);
}

void vocab_free(Vocab *v) {
    if (v->tok)
        for (int i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->len);
    memset(v, 0, sizeof *v);
}
