/* data.h — token shards in llm.c's format, memory-mapped, addressed by
 * global sequence index so any rank can find its slice of any step, and a
 * token-to-bytes vocab table for printing samples. */
#ifndef LLMTRAIN_DATA_H
#define LLMTRAIN_DATA_H
#include <stdint.h>
#include <stddef.h>

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
    int token_bytes;      /* 2 or 4 */
    uint64_t n_tokens;
    uint64_t start;       /* global offset of its first token */
} Shard;

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
} DataSet;

/* Open every file matching pattern (a path or a glob), validate headers and
 * sizes. Errors: one line naming the file, exit(EXIT_USAGE). `what` names
 * the config key for messages ("data.train"). */
void dataset_open(DataSet *d, const char *pattern, const char *what, int vocab_size,
                  int T, int shuffle, uint64_t seed);
void dataset_close(DataSet *d);
/* Sequence number `seq` (global, counting from 0 over the whole run):
 * inputs = tokens[s, s+T), targets = tokens[s+1, s+T+1] with
 * s = seq*T (shuffle off; wraps to the start at the end of the data), or a
 * seeded permutation of sequence starts per epoch (shuffle on).
 * A token id >= vocab_size: one line naming file and offset, exit(EXIT_USAGE). */
void dataset_sequence(const DataSet *d, uint64_t seq, int *inputs, int *targets);

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
/* Write the bytes of token id (or "<id>" when unknown) to f. */
void vocab_print(const Vocab *v, int id, void *file);
void vocab_free(Vocab *v);

#endif
