/* init.h — init.from: what a run starts from. A Hugging Face folder
 * (config.json and safetensors) gives the model section and the weights.
 * Also the origin record that checkpoints carry for export: the token ids
 * and tokenizer files. */
#ifndef LLMTRAIN_INIT_H
#define LLMTRAIN_INIT_H
#include <stddef.h>
#include "ckpt.h"
#include "config.h"
#include "model.h"
#include "parallel.h"

enum { INIT_NONE = 0, INIT_HF = 1 };

typedef struct InitFrom {
    int kind;            /* INIT_NONE, INIT_HF */
    char dir[2048];      /* the folder read */
} InitFrom;

/* c->init_from's model section into c (an explicit job value that
 * disagrees is exit 2); rank 0 prints config.json's note. Not collective. */
void init_from_model(Config *c, InitFrom *f, int rank);
/* The weights into m (this rank's TP slices of every tensor). */
void init_from_load(InitFrom *f, Model *m, Dist *d);
/* c->origin_json: the ids export writes (bos_token_id / eos_token_id from
 * init.from's config.json, else data.eod_token) and the tokenizer files
 * (data.tokenizer's, else init.from's), with their sizes and checksums.
 * data.tokenizer naming no tokenizer: exit 2. */
void init_origin(Config *c, const InitFrom *f);

#endif
