/* The pause program of the end-to-end tests' pod sandboxes: PID 1 of the sandbox, it holds the pod's
 * namespaces, reaps orphans, and exits 0 on SIGTERM or SIGINT. Built static (gcc -static -Os) so
 * that the image needs no libc. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigaction(SIGTERM, &on_stop, NULL);
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;) {
        pause();
    }
}
