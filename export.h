/* export.h — writing Hugging Face folders (`llmtrain export`, debug dumps):
 * streamed a tensor at a time, F32 or BF16, one model.safetensors or
 * Hugging Face's shards and index, with config.json and
 * generation_config.json carrying the run's token ids, and the tokenizer
 * files its origin record names (init.h makes that record). */
#ifndef LLMTRAIN_EXPORT_H
#define LLMTRAIN_EXPORT_H
#include <stdint.h>
#include "model.h"

typedef struct ExportOpts {
    int bf16;                  /* BF16 tensors (rounded to nearest even), else F32 */
    uint64_t max_shard_bytes;  /* past this, Hugging Face's sharded layout (0: one file) */
    const char *origin_json;   /* the run's origin record (init.h), or NULL: ids by the old rule */
} ExportOpts;

/* s's whole tensor of m's layout: fill buf (s->numel floats) and return
 * it, or return the values where they already are. */
typedef const float *(*ExportReadFn)(void *ctx, const ParamSpec *s, float *buf);

/* Write the folder dir (created) from m's tensors as read() gives them,
 * holding one tensor at a time (two for GPT-2's transposed ones). Returns
 * the number of safetensors files. */
int export_hf(const Model *m, ExportReadFn read, void *ctx, const ExportOpts *o, const char *dir);
/* The same from a host fp32 array laid out as m's table (m->params on CPU;
 * any array, e.g. grads), F32, one file. */
void hf_export(const Model *m, const float *flat, const char *dir);
/* The tokenizer files of dir that export copies, with their sizes and
 * checksums: a JSON object {"dir" (absolute), "from", "files": [{"name",
 * "bytes", "checksum"}]} (malloc'd text), or NULL when dir holds none of
 * them. from names the source in messages (data.tokenizer, init.from). A
 * folder that cannot be read: one line naming from, exit(EXIT_USAGE). */
#define EXPORT_TOKENIZER_NAMES \
    "tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, added_tokens.json"
char *export_tokenizer_record(const char *dir, const char *from);
/* `llmtrain export CHECKPOINT OUT [--dtype fp32|bf16] [--max-shard-size
 * SIZE] [--tokenizer DIR|none]` (argv without "export"). */
int export_main(int argc, char **argv);

/* Why no Hugging Face architecture can hold the model (into why), or NULL. */
const char *export_refusal(const Model *m, char *why, size_t n);

#endif
