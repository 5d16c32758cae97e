/*
 * The benches' timing wrapper of ipamd-cni (built by bench/cni_timing.py, linked statically as the
 * launcher is). Installed as `ipamd-cni` in a node's CNI bin directory, it is what the runtime
 * executes: it reads CLOCK_MONOTONIC, runs the installed plugin (PLUGIN) with the same arguments,
 * environment and standard streams, waits for it to exit, reads the clock again and appends one
 * line to RECORDS:
 *
 *   {"command": "ADD", "container_id": "...", "ifname": "eth0",
 *    "started_ns": ..., "answered_ns": ..., "status": 0, "cpu_ns": ...}
 *
 * then exits as the plugin did. The plugin's answer is whole when it exits (the runtime reads its
 * stdout to the end and waits for it), so the span is the plugin process's own, from before it
 * exists to after it is gone, plus one fork of this program.
 *
 * It never changes what the plugin sees or answers: it reads no stream, and a record that cannot
 * be written is lost, never the answer. Without a fork the plugin runs in its place, untimed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The value of `name`, kept to the characters a container ID, an ifname or a command has. */
static const char *field(const char *name, char *out, size_t size) {
    const char *value = getenv(name);
    size_t n = 0;
    for (; value != NULL && value[n] != '\0' && n + 1 < size; n++) {
        char c = value[n];
        int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
        out[n] = plain ? c : '?';
    }
    out[n] = '\0';
    return out;
}

static void record(long long started, long long answered, int status, long long cpu) {
    char command[16], container_id[128], ifname[32], line[512];
    int n = snprintf(line, sizeof line,
                     "{\"command\": \"%s\", \"container_id\": \"%s\", \"ifname\": \"%s\", "
                     "\"started_ns\": %lld, \"answered_ns\": %lld, \"status\": %d, \"cpu_ns\": %lld}\n",
                     field("CNI_COMMAND", command, sizeof command),
                     field("CNI_CONTAINERID", container_id, sizeof container_id),
                     field("CNI_IFNAME", ifname, sizeof ifname), started, answered, status, cpu);
    int fd = open(RECORDS, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || n <= 0 || n >= (int)sizeof line) {
        if (fd >= 0) close(fd);
        return;
    }
    /* One write with O_APPEND: the lines of concurrent runs never interleave. */
    if (write(fd, line, (size_t)n) != n) {
        /* lost: the plugin's answer matters, this line does not */
    }
    close(fd);
}

int main(int argc, char **argv) {
    (void)argc;
    long long started = now_ns();
    argv[0] = PLUGIN;
    pid_t child = fork();
    if (child < 0) {
        execv(PLUGIN, argv);
        return 1;
    }
    if (child == 0) {
        execv(PLUGIN, argv);
        _exit(127);
    }
    int status = 0;
    struct rusage usage = {0};
    while (wait4(child, &status, 0, &usage) < 0 && errno == EINTR) {
    }
    long long answered = now_ns();
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    /* The plugin's CPU time, user and system, as the kernel accounts it (its total is exact; the
     * split between the two is sampled). */
    long long cpu = ((long long)usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000LL +
                    ((long long)usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000LL;
    record(started, answered, code, cpu);
    return code;
}
