/* hf.h — safetensors reading/writing, Hugging Face GPT-2 / Llama
 * import and the name mapping export uses (fused q|k|v and gate|up split
 * back into HF's names; export itself: export.h). Training checkpoints:
 * ckpt.h. */
#ifndef LLMTRAIN_HF_H
#define LLMTRAIN_HF_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "config.h"
#include "model.h"

/* ---- safetensors ---- */
enum { ST_F32 = 0, ST_BF16 = 1, ST_F16 = 2, ST_I64 = 3, ST_I32 = 4 };
typedef struct StTensor {
    char name[128];
    int dtype;
    int ndim;
    int64_t shape[4];
    size_t begin, end;    /* byte range in the data section */
} StTensor;
typedef struct StFile {
    char path[1024];
    const unsigned char *map; size_t map_len;
    const unsigned char *data; /* data section */
    StTensor *t; int n;
} StFile;
/* Open and validate (header JSON, byte ranges within the file, dtypes).
 * On error: one line naming the file, exit(EXIT_USAGE). */
void st_open(StFile *f, const char *path);
const StTensor *st_find(const StFile *f, const char *name);
/* Copy tensor to fp32 (converting BF16/F16). */
void st_read_f32(const StFile *f, const StTensor *t, float *out);
void st_close(StFile *f);

/* Writer: add tensors (values given as fp32, stored F32 or BF16 rounded
 * to nearest even), then write them all at once (st_writer_write: data
 * pointers valid until then), or stream them: st_writer_begin writes the
 * header, st_writer_put each tensor's values in order (data NULL when
 * added), st_writer_end commits. Writes to path.tmp, fsyncs, renames. */
typedef struct StWriter {
    int n, cap;
    struct { char name[128]; int ndim; int64_t shape[4]; int dtype; const float *data; } *t;
    FILE *fp; /* between begin and end */
    int next;
    char path[1024], tmp[1040];
} StWriter;
void st_writer_add(StWriter *w, const char *name, int ndim, const int64_t *shape, const float *data);
void st_writer_add_as(StWriter *w, const char *name, int ndim, const int64_t *shape, int dtype, const float *data);
size_t st_writer_bytes(const StWriter *w, int i); /* tensor i's bytes in the file */
void st_writer_write(StWriter *w, const char *path, const char *metadata_json);
void st_writer_begin(StWriter *w, const char *path, const char *metadata_json);
void st_writer_put(StWriter *w, const float *data);
void st_writer_end(StWriter *w);
/* fp32 -> bf16 bits, round to nearest even (NaN stays NaN). */
uint16_t st_bf16_of(float x);
/* A small file (newline: and a "\n"), durably: tmp + fsync + rename. */
void hf_write_file(const char *path, const void *data, size_t len, int newline);
void st_writer_free(StWriter *w);

/* ---- Hugging Face folders ---- */
/* Read <dir>/config.json into a ModelConfig (model_type gpt2 or llama).
 * On error: one line, exit(EXIT_USAGE). */
void hf_read_config(const char *dir, ModelConfig *out);
/* The same, and in note (empty when none) one line naming the keys that
 * change the computation and that llmtrain does not implement (dropout
 * probabilities above zero), for the caller to print once. */
void hf_read_config_note(const char *dir, ModelConfig *out, char *note, size_t note_n);
/* Load <dir>/model.safetensors (or the shards its index names; F32, BF16
 * or F16) into m->params (host copy). Missing tensor or wrong shape: one
 * line naming it, exit(EXIT_USAGE). Returns what it read, for the header. */
typedef struct HfLoaded {
    int n_tensors, n_files;
    unsigned dtypes; /* bit ST_F32, ST_BF16, ST_F16 for each dtype read */
} HfLoaded;
HfLoaded hf_load_weights(Model *m, const char *dir);

/* One HF tensor = a block of rows of one of our tensors, or (GPT-2 Conv1D)
 * the whole tensor transposed. */
typedef struct HfPart {
    char name[128];
    int ndim;
    int64_t shape[2]; /* HF shape */
    size_t row0, rows, cols; /* rows [row0, row0+rows) of our [rows_total, cols] tensor */
    int transpose;
} HfPart;
/* The HF tensors of our tensor s (gpt2_prefix "transformer." or "" for
 * GPT2Model files) into p, which has room for hf_parts_max(m): 1 to 3,
 * or a mixture-of-experts tensor's one a expert (two for gate|up). */
int hf_parts(const Model *m, const ParamSpec *s, const char *gpt2_prefix, HfPart *p);
int hf_parts_max(const Model *m);
/* Whether an MoE model takes Qwen3-MoE's names (else Mixtral's). */
int hf_moe_qwen(const ModelConfig *c);
/* dst[c*rows + r] = src[r*cols + c] */
void hf_transpose(float *dst, const float *src, size_t rows, size_t cols);

#endif
