/* hf.h — safetensors reading/writing, Hugging Face GPT-2 / Llama
 * import and export (fused q|k|v and gate|up split back into HF's names).
 * Training checkpoints: ckpt.h. */
#ifndef LLMTRAIN_HF_H
#define LLMTRAIN_HF_H
#include <stddef.h>
#include <stdint.h>
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

/* Writer: add fp32 tensors, then write. Data pointers must stay valid until
 * st_write. Writes to path.tmp, fsyncs, renames. */
typedef struct StWriter {
    int n, cap;
    struct { char name[128]; int ndim; int64_t shape[4]; const float *data; } *t;
} StWriter;
void st_writer_add(StWriter *w, const char *name, int ndim, const int64_t *shape, const float *data);
void st_writer_write(StWriter *w, const char *path, const char *metadata_json);
void st_writer_free(StWriter *w);

/* ---- Hugging Face folders ---- */
/* Read <dir>/config.json into a ModelConfig (model_type gpt2 or llama).
 * On error: one line, exit(EXIT_USAGE). */
void hf_read_config(const char *dir, ModelConfig *out);
/* The same, and in note (empty when none) one line naming the keys that
 * change the computation and that llmtrain does not implement (dropout
 * probabilities above zero), for the caller to print once. */
void hf_read_config_note(const char *dir, ModelConfig *out, char *note, size_t note_n);
/* Load <dir>/model.safetensors (F32 or BF16) into m->params (host copy).
 * Missing tensor or wrong shape: one line naming it, exit(EXIT_USAGE). */
void hf_load_weights(Model *m, const char *dir);
/* Write config.json + model.safetensors from a host fp32 array laid out as
 * m's table (m->params on CPU; pass `flat` to export any array, e.g. grads). */
void hf_export(const Model *m, const float *flat, const char *dir);

#endif
