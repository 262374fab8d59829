/* Runs fn(arg) in a forked child with its standard error captured, for tests of what aborts (a
 * DT_ASSERT that fails where the process is set to abort). Returns the child's wait status (it
 * exits 0 when fn returns) and what it wrote to stderr in out (at most cap - 1 bytes, then NUL).
 * The child is a fork without exec: fn must not use threads the parent started (OpenMP, BLAS), whose
 * locks may be held forever in the copy; an alarm kills a child that hangs all the same (SIGALRM,
 * which a test reading the status sees as a failure rather than a hang). */
#ifndef DT_TESTS_CHILD_H
#define DT_TESTS_CHILD_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static inline int run_child(void (*fn)(void *), void *arg, char *out, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        alarm(30);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    ssize_t got = 0, r;
    while (got < (ssize_t)cap - 1 && (r = read(fd[0], out + got, cap - 1 - (size_t)got)) > 0) got += r;
    out[got] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

#endif
