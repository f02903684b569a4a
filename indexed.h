/* indexed.h — Megatron-LM's indexed dataset (`name.bin` + `name.idx`, the
 * MMIDIDX index, version 1) opened as one Shard of data.h: the documents
 * concatenated in index order, memory-mapped, with the index's document
 * boundaries kept for block-causal masks and eod_mask_loss. */
#ifndef LLMTRAIN_INDEXED_H
#define LLMTRAIN_INDEXED_H
#include "data.h"

/* Index layout (little-endian, packed):
 *   9 bytes  "MMIDIDX\0\0"
 *   uint64   version (1)
 *   uint8    dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
 *            6 float64, 7 float32, 8 uint16 (the float codes are refused)
 *   uint64   S, the sequence count
 *   uint64   D, the document-index count (documents + 1)
 *   int32    [S] tokens a sequence
 *   int64    [S] byte offset of each sequence in the .bin
 *   int64    [D] document index: document d is sequences [di[d], di[d+1]),
 *            di[0] = 0, di[D-1] = S, non-decreasing
 *   (int8    [S] sequence modes, multimodal only: ignored)                */
#define INDEXED_MAGIC "MMIDIDX\0\0"
#define INDEXED_MAGIC_LEN 9
#define INDEXED_VERSION 1

/* The dataset path's prefix when path names an indexed dataset: a path
 * ending in .idx, or in .bin with the .idx beside it, or a prefix with
 * both PREFIX.bin and PREFIX.idx; 0 (prefix untouched) otherwise. */
int indexed_prefix(const char *path, char *prefix, size_t n);

/* Open PREFIX.idx and PREFIX.bin into s: validate the index (magic,
 * version, dtype, counts, sizes within the .bin, pointers in order and
 * back to back, the document index), map both, and scan the tokens for
 * ids outside [0, vocab_size) (cached by path, size and mtime; see
 * docs/data.md). Errors: one line naming the file, exit(EXIT_USAGE). */
void indexed_open(Shard *s, const char *prefix, const char *what, int vocab_size);
void indexed_close(Shard *s);
/* Token i of a shard of any token dtype (indexed.h's, or llm.c's 2 and 4
 * bytes unsigned), sign-extended. */
int64_t indexed_token_at(const Shard *s, uint64_t i);

/* ends[i] = 1 when token off + i of the shard is the last one of its
 * document (0 otherwise), for i < n, n <= the shard's tokens from off. */
void indexed_ends(const Shard *s, uint64_t off, uint64_t n, unsigned char *ends);

#endif
