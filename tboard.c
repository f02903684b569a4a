/* TensorBoard event-file writer (tboard.h): protobuf wire format and
 * TFRecord framing, both small enough to write directly. */
#define _GNU_SOURCE
#include "tboard.h"
#include "util.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- CRC-32C: reflected polynomial 0x82F63B78, as TFRecord uses ---- */

static uint32_t crc_table[256];

static void crc_init(void) {
    if (crc_table[1]) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (c & 1 ? 0x82F63B78u : 0);
        crc_table[i] = c;
    }
}

uint32_t tb_crc32c(const void *p, size_t n) {
    crc_init();
    const unsigned char *b = p;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* TFRecord masks stored CRCs so that a CRC of data holding CRCs stays strong */
uint32_t tb_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

/* ---- protobuf wire format: the few encodings an Event needs ---- */

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

static size_t put_varint(unsigned char *o, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) { o[n++] = (unsigned char)(v | 0x80); v >>= 7; }
    o[n++] = (unsigned char)v;
    return n;
}

static size_t put_le(unsigned char *o, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) o[i] = (unsigned char)(v >> (8 * i));
    return (size_t)bytes;
}

static size_t put_key(unsigned char *o, int field, int wire) { return put_varint(o, (uint64_t)(field << 3 | wire)); }

/* a length-delimited field: key, length, bytes */
static size_t put_bytes(unsigned char *o, int field, const void *p, size_t n) {
    size_t k = put_key(o, field, WIRE_LEN);
    k += put_varint(o + k, n);
    memcpy(o + k, p, n);
    return k + n;
}

/* tensorflow.Event's fields: wall_time (1, double), step (2, int64),
 * file_version (3, string), summary (5, Summary) */
enum { EV_WALL_TIME = 1, EV_STEP = 2, EV_FILE_VERSION = 3, EV_SUMMARY = 5 };
/* Summary { repeated Value value = 1 }, Value { tag = 1; simple_value = 2 } */
enum { SUM_VALUE = 1, VAL_TAG = 1, VAL_SIMPLE = 2 };

static size_t put_event_head(unsigned char *o, double wall, int64_t step) {
    uint64_t bits;
    memcpy(&bits, &wall, sizeof bits);
    size_t n = put_key(o, EV_WALL_TIME, WIRE_I64);
    n += put_le(o + n, bits, 8);
    if (step) { /* proto3 leaves a zero field out */
        n += put_key(o + n, EV_STEP, WIRE_VARINT);
        n += put_varint(o + n, (uint64_t)step);
    }
    return n;
}

/* ---- TFRecord: u64 length, masked crc(length), data, masked crc(data) ---- */

/* 0, or the errno of a failed write: the record is cut off (log_record_end),
 * the file closed and the writer off (tb->err says why) */
static int write_record(TBoard *tb, const unsigned char *data, size_t n) {
    unsigned char head[12], tail[4];
    put_le(head, n, 8);
    put_le(head + 8, tb_mask_crc(tb_crc32c(head, 8)), 4);
    put_le(tail, tb_mask_crc(tb_crc32c(data, n)), 4);
    errno = 0;
    int wrote = fwrite(head, 1, sizeof head, tb->f) == sizeof head && fwrite(data, 1, n, tb->f) == n &&
                fwrite(tail, 1, sizeof tail, tb->f) == sizeof tail;
    int err = log_record_end(tb->f, wrote, &tb->good);
    if (err) {
        fclose(tb->f); /* its buffer dropped: nothing is left to fail */
        tb->f = NULL;
        tb->err = err;
    }
    return err;
}

int tb_open(TBoard *tb, const char *dir) {
    tb->f = NULL;
    tb->path[0] = 0;
    tb->err = 0;
    tb->good = 0;
    if (mkdir_p(dir) != 0) return -1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    /* TensorBoard's name pattern; the pid keeps two starts in a second apart */
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)time(NULL), host,
             (int)getpid());
    tb->f = fopen(tb->path, "wb");
    if (!tb->f) return -1;
    static const char version[] = "brain.Event:2";
    size_t n = put_event_head(tb->rec, unix_time_s(), 0);
    n += put_bytes(tb->rec + n, EV_FILE_VERSION, version, sizeof version - 1);
    int err = write_record(tb, tb->rec, n);
    errno = err;
    return err ? -1 : 0;
}

void tb_begin(TBoard *tb, int64_t step, double wall_time) {
    tb->step = step;
    tb->wall = wall_time;
    tb->nval = 0;
}

void tb_scalar(TBoard *tb, const char *tag, double v) {
    if (!tb->f || !isfinite(v)) return;
    /* metrics.jsonl's text of v, read back: the two files hold one number */
    char text[40];
    snprintf(text, sizeof text, "%.9g", v);
    float x = (float)strtod(text, NULL);
    size_t len = strlen(tag);
    if (len > 200 || tb->nval + len + 16 > sizeof tb->val) die(EXIT_INTERNAL, "tensorboard: too many scalars in a step (%s)", tag);
    unsigned char item[256];
    size_t k = put_bytes(item, VAL_TAG, tag, len);
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    k += put_key(item + k, VAL_SIMPLE, WIRE_I32);
    k += put_le(item + k, bits, 4);
    tb->nval += put_bytes(tb->val + tb->nval, SUM_VALUE, item, k);
}

int tb_write(TBoard *tb) {
    if (!tb->f) return 0;
    size_t n = put_event_head(tb->rec, tb->wall, tb->step);
    n += put_bytes(tb->rec + n, EV_SUMMARY, tb->val, tb->nval);
    return write_record(tb, tb->rec, n);
}

int tb_close(TBoard *tb) {
    if (!tb->f) return 0;
    int err = fclose(tb->f) != 0 ? errno : 0;
    tb->f = NULL;
    if (err) tb->err = err;
    return err;
}
