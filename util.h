/* util.h — checked-call helpers shared by every file: a failure names the
 * file and line (or the user's file and key) and exits non-zero. */
#ifndef LLMTRAIN_UTIL_H
#define LLMTRAIN_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>

/* Exit codes (documented in the README). */
enum {
    EXIT_OK = 0,
    EXIT_USAGE = 2,        /* bad command line, config, data or weights */
    EXIT_IO = 3,           /* I/O failure while running (disk full, unreadable file) */
    EXIT_NONFINITE = 4,    /* too many consecutive non-finite steps */
    EXIT_TIMEOUT = 5,      /* watchdog: a step or collective exceeded parallel.timeout_s */
    EXIT_PEER = 6,         /* another rank failed; this one aborts */
    EXIT_SLOW_FABRIC = 7,  /* startup health check: bus bandwidth below parallel.min_bus_gbps */
    EXIT_INTERNAL = 70,    /* a bug: an invariant failed */
    EXIT_STOPPED = 143,    /* SIGTERM / SIGUSR1: stopped after writing a checkpoint */
};

/* Print "llmtrain: <message>" on stderr (one line) and exit with code. */
void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
void warnf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One line of text for a message, whatever its arguments hold: printf's
 * formatting into out (n bytes, cut at n - 1), each newline written as \n
 * and each other control character as \xHH (a tensor name read from a
 * damaged file, a peer's text), so a message stays one line. die() and
 * warnf format with it; so do the readers that return their error text. */
void vformat_line(char *out, size_t n, const char *fmt, va_list ap);
/* die()'s line without its newline: "llmtrain: " and vformat_line's text. */
void die_format(char *line, size_t n, const char *fmt, va_list ap);
/* linger = 1 (every rank but 0) while all ranks check the same inputs (the
 * job file, the layout) and so fail alike: die() first waits 3 s, in which
 * mpirun, seeing rank 0 exit, ends this rank, so a job of N ranks prints
 * one line; an error of this rank alone is still printed after the wait. */
void die_replicated(int linger);
/* A function die() calls once, before its line, to take back what the
 * process leaves half-done (ckpt_run.c: the checkpoint folder in flight);
 * NULL: none. */
void die_set_cleanup(void (*fn)(void));

void *malloc_check_(size_t size, const char *file, int line);
void *calloc_check_(size_t n, size_t size, const char *file, int line);
FILE *fopen_check_(const char *path, const char *mode, const char *file, int line);
void fwrite_check_(const void *p, size_t size, size_t n, FILE *f, const char *path, const char *file, int line);
void fclose_check_(FILE *f, const char *path, const char *file, int line);
#define malloc_check(sz) malloc_check_((sz), __FILE__, __LINE__)
#define calloc_check(n, sz) calloc_check_((n), (sz), __FILE__, __LINE__)
#define fopen_check(p, m) fopen_check_((p), (m), __FILE__, __LINE__)
#define fwrite_check(ptr, sz, n, f, path) fwrite_check_((ptr), (sz), (n), (f), (path), __FILE__, __LINE__)
#define fclose_check(f, path) fclose_check_((f), (path), __FILE__, __LINE__)

/* Log files (metrics.jsonl, TensorBoard events) are written a record at a
 * time and never die mid-step: log_end is the end of f's file now (where
 * its next record starts); log_record_end ends a record: wrote = every
 * fwrite of it returned its count (errno then holds the failing call's);
 * it flushes f and returns 0 with *good moved to the new end, or, when a
 * write or the flush failed (a full disk), drops f's buffer, cuts the file
 * back to *good (its last whole record: no half line for a reader, or for
 * a resumed run to append after) and returns the failing call's errno. */
long long log_end(FILE *f);
int log_record_end(FILE *f, int wrote, long long *good);

/* Growable string for JSON written by hand (cJSON would print large
 * offsets as doubles): buf_add appends printf-style; b->s is malloc'd. */
typedef struct Buf { char *s; size_t len, cap; } Buf;
void buf_add(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s appended as a JSON string literal, quotes included: '"' and backslash
 * escaped, control bytes as \u00XX (safetensors names, metrics.jsonl's paths) */
void buf_json_string(Buf *b, const char *s);

/* Levenshtein distance of two strings (99 past 63 bytes): "did you mean". */
int edit_distance(const char *a, const char *b);
/* n bytes of text to f as they are where they are printable UTF-8 (tab and
 * newline included; a character split over two calls is not), each other
 * byte as \xHH: C0 controls, DEL, C1 controls and bytes of no well-formed
 * sequence (the printed sample: stdout stays text for grep and terminals). */
void fwrite_printable(const char *s, size_t n, FILE *f);

/* 64-bit FNV-1a of a string's bytes (tensor names' init streams, the ranks'
 * job texts, the rendezvous job id) */
uint64_t fnv1a64(const char *s);
/* This host's name into out (NUL-terminated; "?" when it cannot be read). */
void host_name(char *out, size_t n);

/* Read a whole small file (configs, json headers) into a NUL-terminated buffer.
 * Returns NULL (and sets *len = 0) when it cannot be read, or is not a
 * regular file (a directory, a FIFO: never waited on); read_text_why()
 * then says why, for a message ("is a directory, expected a file", or
 * strerror's text). */
char *read_text_file(const char *path, size_t *len);
const char *read_text_why(void);
/* mkdir -p; returns 0 or -1 with errno set. */
int mkdir_p(const char *path);
/* mkdir -p where a crash must not lose what it made (checkpoints): each
 * directory it creates has its parent fsynced, so a power loss cannot take
 * a new checkpoint.dir (and the checkpoints in it) with the page cache. */
int mkdir_p_durable(const char *path);
/* fsync a directory (a rename or create in it is durable only then), or
 * the directory holding path; 0, or -1 with errno set (filesystems that
 * cannot sync a directory count as done). */
int sync_dir(const char *dir);
int sync_parent(const char *path);
/* The directory holding path: "a/b" -> "a", "a/b/" -> "a", "b" -> ".", "/b" -> "/". */
void path_parent(char *out, size_t n, const char *path);
/* Wall clock in seconds (monotonic). */
double now_s(void);
/* Seconds since the Unix epoch (metrics.jsonl "time"). */
double unix_time_s(void);

#endif
