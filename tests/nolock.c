/* tests/nolock.c — an LD_PRELOAD shim for tests/test_ckdir.sh: a file
 * system that implements no file lock (as some network and FUSE file
 * systems do). flock() and fcntl()'s record locks fail with ENOLCK; every
 * other fcntl command goes to the C library's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/file.h>

int flock(int fd, int op) {
    (void)fd;
    (void)op;
    errno = ENOLCK;
    return -1;
}

int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (cmd == F_SETLK || cmd == F_SETLKW || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW) {
        errno = ENOLCK;
        return -1;
    }
    int (*real)(int, int, ...) = (int (*)(int, int, ...))dlsym(RTLD_NEXT, "fcntl");
    return real(fd, cmd, arg);
}
