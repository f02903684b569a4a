#ifndef TBOARD_H
#define TBOARD_H
/* TensorBoard event files (log.tensorboard_dir): the records TensorBoard's
 * reader expects, written by hand so llmtrain needs no protobuf or
 * TensorFlow library. A file is TFRecord framing around serialized
 * tensorflow.Event messages: the first holds file_version "brain.Event:2",
 * each later one a step's scalars as Summary.Value{tag, simple_value}.
 * Every buffer is inside the struct: a step allocates nothing. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TB_VALUES_MAX 8192 /* a step's encoded Summary.Value entries (about 30 bytes each) */

typedef struct TBoard {
    FILE *f;                   /* NULL: off, or closed after a failed write */
    char path[1400];
    int err;                   /* the errno of a failed write or close (0: none) */
    long long good;            /* the end of the last whole record (log_record_end) */
    int64_t step;
    double wall;
    size_t nval;
    unsigned char val[TB_VALUES_MAX];
    unsigned char rec[TB_VALUES_MAX + 64]; /* the Event being framed */
} TBoard;

/* Create dir (mkdir -p) and events.out.tfevents.<unix s>.<host>.<pid> in
 * it, and write the file_version record. 0, or -1 with errno set (the
 * caller says what failed; tb->path names the file when it got that far). */
int tb_open(TBoard *tb, const char *dir);
/* Begin the Event of one step: tb_scalar adds to it, tb_write writes it. */
void tb_begin(TBoard *tb, int64_t step, double wall_time);
/* One scalar: v as metrics.jsonl prints it (%.9g) read back and rounded to
 * float32, TensorBoard's simple_value. A non-finite v (null in
 * metrics.jsonl) is left out. */
void tb_scalar(TBoard *tb, const char *tag, double v);
/* Frame the Event, write it and fflush (a crash keeps every step so far).
 * 0, or the errno of a failed write (a full disk): the file is cut back to
 * its last whole event and closed, and later calls do nothing (tb->err). */
int tb_write(TBoard *tb);
/* 0, or fclose's errno (also kept in tb->err). */
int tb_close(TBoard *tb);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's masked form of a CRC. */
uint32_t tb_crc32c(const void *p, size_t n);
uint32_t tb_mask_crc(uint32_t crc);

#endif
