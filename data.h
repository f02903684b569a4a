/* data.h — token shards in llm.c's format, memory-mapped, addressed by
 * global sequence index so any rank can find its slice of any step, and a
 * token-to-bytes vocab table for printing samples. */
#ifndef LLMTRAIN_DATA_H
#define LLMTRAIN_DATA_H
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

/* Shard header: 256 x int32: [0] magic, [1] version, [2] token count.
 *   magic 20240520 version 1: uint16 tokens
 *   magic 20240801 version 7: uint32 tokens                              */
#define SHARD_MAGIC_U16 20240520
#define SHARD_VERSION_U16 1
#define SHARD_MAGIC_U32 20240801
#define SHARD_VERSION_U32 7
#define SHARD_HEADER_INTS 256

typedef struct Shard {
    char path[1024];
    const void *map;      /* whole file mapping */
    size_t map_len;
    const void *tokens;   /* map + header */
    int token_bytes;      /* 2 or 4; an indexed dataset's 1, 2, 4 or 8 */
    int token_signed;     /* an indexed dataset's int8/16/32/64 tokens */
    uint64_t n_tokens;
    uint64_t start;       /* global offset of its first token */
    /* a Megatron indexed dataset (indexed.h; path is its .bin): the mapped
     * index, its pointer and document-index arrays and their counts; NULL
     * idx_map for an llm.c shard */
    const void *idx_map;
    size_t idx_len;
    const void *idx_ptrs, *idx_docs;
    uint64_t n_seq, n_docidx;
} Shard;

/* A blend's pattern repeats every BLEND_PERIOD sequences (see data.c). */
#define BLEND_PERIOD 65536
#define BLEND_MAX_SOURCES 64

typedef struct DataSet {
    char what[64];        /* config key for messages, e.g. "data.train" */
    Shard *shards;        /* sorted by path */
    int n_shards;
    uint64_t n_tokens;    /* all shards concatenated */
    int vocab_size;       /* ids must be < this */
    int T;                /* sequence length */
    int shuffle;
    uint64_t seed;
    uint64_t n_seqs;      /* sequences of T+1 tokens per epoch (shuffle addressing) */
    /* a blend ("0.7 web/shard_*.bin 0.3 code/shard_*.bin"): the sources (each a plain
     * DataSet; the shard fields above stay empty), their weights normalised
     * to sum 1, and one period of the pattern: sequence p of a period comes
     * from source pat_src[p], as that source's pat_idx[p]-th of the period;
     * pat_cnt[i] = source i's sequences a period */
    int n_src;
    struct DataSet *src;
    double *weight;
    uint8_t *pat_src;
    uint32_t *pat_idx;
    uint32_t *pat_cnt;
    /* LLMTRAIN_DATA_TRACE (tests, debugging; set by llmtrain.c, not
     * closed here): one line a read, `WHAT SEQ OFF N` (tokens [OFF, OFF +
     * N) of sequence SEQ and their targets); NULL: off */
    FILE *trace;
} DataSet;

/* Open every file matching pattern (a path or a glob), validate headers and
 * sizes. A Megatron indexed dataset (its prefix, or its .bin or .idx) is
 * one shard of its documents in index order (indexed.h); a glob may
 * match both of its files. Errors: one line naming the file, exit(EXIT_USAGE). `what` names
 * the config key for messages ("data.train"). A pattern of weight-path
 * pairs separated by blanks ("0.7 web/shard_*.bin 0.3 code/shard_*.bin", Megatron's
 * --data-path form) opens a blend: source i is opened as above (shuffled
 * with seed + i) and draws weight_i / sum of weights of the sequences. */
void dataset_open(DataSet *d, const char *pattern, const char *what, int vocab_size,
                  int T, int shuffle, uint64_t seed);
void dataset_close(DataSet *d);
/* Sequence number `seq` (global, counting from 0 over the whole run):
 * inputs = tokens[s, s+T), targets = tokens[s+1, s+T+1] with
 * s = seq*T (shuffle off; wraps to the start at the end of the data), or a
 * seeded permutation of sequence starts per epoch (shuffle on).
 * A token id >= vocab_size: one line naming file and offset, exit(EXIT_USAGE). */
void dataset_sequence(const DataSet *d, uint64_t seq, int *inputs, int *targets);
/* Tokens [off, off + n) of sequence seq and their targets: what
 * dataset_sequence writes there, read alone (context parallelism's chunks). */
void dataset_sequence_part(const DataSet *d, uint64_t seq, int off, int n, int *inputs, int *targets);
/* Whether the data knows its documents' ends without an end-of-document
 * token: every shard (of every source of a blend) an indexed dataset. */
int dataset_has_docs(const DataSet *d);
/* For the inputs dataset_sequence_part(d, seq, off, n) reads: ends[i] = 1
 * when input i is the last token of its document (dataset_has_docs). */
void dataset_sequence_ends(const DataSet *d, uint64_t seq, int off, int n, unsigned char *ends);
/* A blend: which source sequence seq comes from, and its number there
 * (dataset_sequence(&d->src[*src], *n) is sequence seq). */
void dataset_blend_pick(const DataSet *d, uint64_t seq, int *src, uint64_t *n);
/* One line for the header: "PATH (N tokens)", or for a blend every source's
 * normalised weight, pattern and tokens; run_tokens > 0 (the tokens a run
 * reads) adds the epochs of each source that makes: ", E epochs this run"
 * ("E epochs" per source of a blend, its share of run_tokens). */
void dataset_describe(const DataSet *d, const char *pattern, double run_tokens, char *buf, size_t n);

/* Vocab table, llm.c's tokenizer format: 256 x uint32 header (magic
 * 20240328, version 2, vocab_size, eot_token), then per token a uint8
 * length and that many bytes. */
#define VOCAB_MAGIC 20240328
typedef struct Vocab {
    int n;
    int eot;              /* -1 if none */
    char **tok;           /* NUL-terminated byte strings */
    unsigned char *len;
} Vocab;
/* On error prints one line and exits(EXIT_USAGE). Version 1 (no eot) and 2. */
void vocab_load(Vocab *v, const char *path);
/* The table (read from path, named by the key `what`) against the model's
 * vocab_size: as many tokens, or fewer where vocab_size is the table padded
 * up to the next multiple of VOCAB_PAD (GPT-2's 50257 to 50304); else one
 * line naming both sizes and exit(EXIT_USAGE). */
#define VOCAB_PAD 128
void vocab_fit(const Vocab *v, const char *what, const char *path, int vocab_size);
/* Write the bytes of token id (or "<id>" when unknown) to f. */
void vocab_print(const Vocab *v, int id, void *file);
void vocab_free(Vocab *v);

#endif
