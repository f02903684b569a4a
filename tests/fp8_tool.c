/* fp8_tool.c — fp8.c on the command line, for tests/test_fp8.py's
 * independent reference to compare with (raw little-endian arrays on
 * stdin and stdout):
 *   fp8_tool decode e4m3|e5m2            256 float32: every code's value
 *   fp8_tool encode e4m3|e5m2            float32 in, one uint8 code each
 *   fp8_tool groups RECIPE WEIGHT KDIM ROWS COLS   prints "gr gc"
 *   fp8_tool quant e4m3|e5m2 ROWS COLS GR GC
 *            ROWS x COLS float32 in; out: the scales (float32, one a
 *            group), then the fake-quantized tensor (float32) */
#include "fp8.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static Fp8Format fmt(const char *s) {
    if (strcmp(s, "e4m3") == 0) return FP8_E4M3;
    if (strcmp(s, "e5m2") == 0) return FP8_E5M2;
    fprintf(stderr, "fp8_tool: format: expected e4m3 or e5m2, got \"%s\"\n", s);
    exit(2);
}

static void *read_all(size_t *n) {
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, stdin)) > 0) {
        len += got;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    if (!buf) { fprintf(stderr, "fp8_tool: out of memory\n"); exit(1); }
    *n = len;
    return buf;
}

static void write_all(const void *p, size_t n) {
    if (fwrite(p, 1, n, stdout) != n) { fprintf(stderr, "fp8_tool: short write\n"); exit(1); }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "decode") == 0) {
        float v[256];
        for (int c = 0; c < 256; c++) v[c] = fp8_decode((uint8_t)c, fmt(argv[2]));
        write_all(v, sizeof v);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "encode") == 0) {
        size_t n;
        float *x = read_all(&n);
        n /= sizeof(float);
        uint8_t *c = malloc(n + 1);
        for (size_t i = 0; i < n; i++) c[i] = fp8_encode(x[i], fmt(argv[2]));
        write_all(c, n);
        return 0;
    }
    if (argc == 7 && strcmp(argv[1], "groups") == 0) {
        int gr, gc;
        fp8_groups(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), &gr, &gc);
        printf("%d %d\n", gr, gc);
        return 0;
    }
    if (argc == 7 && strcmp(argv[1], "quant") == 0) {
        int rows = atoi(argv[3]), cols = atoi(argv[4]), gr = atoi(argv[5]), gc = atoi(argv[6]);
        size_t n;
        float *x = read_all(&n);
        if (n != (size_t)rows * cols * sizeof(float)) { fprintf(stderr, "fp8_tool: expected %d x %d floats\n", rows, cols); return 2; }
        size_t ng = fp8_n_groups(rows, cols, gr, gc);
        float *s = malloc((ng + 1) * sizeof(float)), *y = malloc(n + sizeof(float));
        fp8_fake_quant(y, x, s, rows, cols, gr, gc, fmt(argv[2]));
        write_all(s, ng * sizeof(float));
        write_all(y, n);
        return 0;
    }
    fprintf(stderr, "usage: fp8_tool decode|encode FMT | groups RECIPE WEIGHT KDIM ROWS COLS | quant FMT ROWS COLS GR GC\n");
    return 2;
}
