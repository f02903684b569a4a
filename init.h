/* init.h — init.from: what a run starts from. A Hugging Face folder
 * (config.json and safetensors) or an llmtrain checkpoint (a step folder,
 * or a checkpoint.dir: its newest complete step) gives the model section
 * and the weights; a checkpoint gives its weights only (Megatron's
 * --finetune: new optimizer state, step 0, the data from the start), from
 * any layout it was written with into this run's. Also the origin record
 * that checkpoints carry for export: the token ids and tokenizer files. */
#ifndef LLMTRAIN_INIT_H
#define LLMTRAIN_INIT_H
#include <stddef.h>
#include "ckpt.h"
#include "config.h"
#include "model.h"
#include "parallel.h"

enum { INIT_NONE = 0, INIT_HF = 1, INIT_CKPT = 2 };

typedef struct InitFrom {
    int kind;            /* INIT_NONE, INIT_HF, INIT_CKPT */
    char dir[2048];      /* the folder read (a checkpoint's step folder) */
    char *origin;        /* INIT_CKPT: the checkpoint's origin record (NULL: none) */
    int step;            /* INIT_CKPT: the step it was written at */
    CkptLayout layout;   /* INIT_CKPT: the layout that wrote it */
    /* after init_from_load, for the header */
    int n_tensors, n_files;
    char dtype[32];      /* "F32", "BF16", "F32+BF16" ... */
} InitFrom;

/* Which kind c->init_from is, and its model section into c (an explicit
 * job value that disagrees is exit 2); rank 0 prints config.json's note.
 * Neither kind: one line, exit 2. Not collective. */
void init_from_model(Config *c, InitFrom *f, int rank);
/* The weights into m (this rank's TP slices of every tensor). A
 * checkpoint: collective over d, its files' checksums read split over the
 * ranks, every one checked before anything is loaded. */
void init_from_load(InitFrom *f, Model *m, Dist *d);
/* "init.from: DIR | <format> | N tensors | DTYPE", for the header. */
void init_from_describe(const InitFrom *f, char *out, size_t n);
/* c->origin_json: the ids export writes (bos_token_id / eos_token_id from
 * init.from's config.json or its checkpoint's record, else data.eod_token)
 * and the tokenizer files (data.tokenizer's, else init.from's), with their
 * sizes and checksums. data.tokenizer naming no tokenizer: exit 2. */
void init_origin(Config *c, const InitFrom *f);
void init_from_free(InitFrom *f);

#endif
