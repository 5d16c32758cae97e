/*
 * ipamd-cni launcher: the file installed as `ipamd-cni` in the node's CNI bin directory.
 *
 * The container runtime executes CNI plugins on the node itself, outside any container. ipamd's
 * plugin is Python (ipamd.cni.plugin, stdlib only), and the node may have no Python, another
 * version, or an older C library than the image's. So the plugin runs on a private runtime that the
 * DaemonSet's init container copies next to this file (see build_cni_bundle.py and install-cni.sh):
 *
 *     <bin dir>/ipamd-cni                  this program, linked statically: no shell, no library
 *     <bin dir>/ipamd-cni.d/current        symlink to the runtime in use
 *     <bin dir>/ipamd-cni.d/<id>/          bin/python3, lib/ld.so, lib/lib*.so.N, lib/pythonX.Y/
 *
 * It resolves `current` once (an upgrade may switch it meanwhile; this run keeps the runtime it
 * resolved, which the installer keeps until the next upgrade), then becomes the runtime's loader
 * running its interpreter, with the runtime's libraries only: `ld.so --library-path lib
 * bin/python3 -I -S -B -c <plugin main>`: isolated from the node's PYTHON* variables, user site and
 * working directory, without `site` (the plugin is in the stdlib directory, which needs none; it
 * saves every ADD and DEL the milliseconds `site` takes), and never writing bytecode into the bin
 * directory (the runtime ships it compiled). The plugin's main ends in `os._exit` once its answer
 * is flushed: the interpreter's teardown frees nothing the process's end does not.
 * stdin, stdout, stderr and the CNI_* environment pass through.
 *
 * If the runtime is missing, the answer follows the plugin's own rules: DEL succeeds with a warning
 * on stderr (a DEL that fails keeps pods Terminating; ipamd's leak GC frees the address later), any
 * other command prints a CNI error with code 110 and exits 1.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENTRY                                                                  \
    "import os, sys\nfrom ipamd.cni.plugin import main\ncode = main()\n"          \
    "sys.stdout.flush()\nsys.stderr.flush()\nos._exit(code)\n"
#define ERR_RUNTIME_MISSING 110

static int fail(const char *what, const char *path) {
    const char *command = getenv("CNI_COMMAND");
    if (command != NULL && strcmp(command, "DEL") == 0) {
        fprintf(stderr, "ipamd-cni: %s: %s; DEL succeeds, ipamd's leak GC frees the address\n",
                what, path);
        return 0;
    }
    printf("{\"cniVersion\": \"1.0.0\", \"code\": %d, \"msg\": \"ipamd-cni: %s\", "
           "\"details\": \"%s; restart the ipamd pod on this node to reinstall\"}\n",
           ERR_RUNTIME_MISSING, what, path);
    return 1;
}

static int join(char *out, const char *dir, const char *rest) {
    int n = snprintf(out, PATH_MAX, "%s/%s", dir, rest);
    return n > 0 && n < PATH_MAX;
}

int main(void) {
    char self[PATH_MAX], link[PATH_MAX], root[PATH_MAX];
    char loader[PATH_MAX], lib[PATH_MAX], python[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        return fail("cannot read /proc/self/exe", "/proc/self/exe");
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL) {
        return fail("cannot tell the CNI bin directory", self);
    }
    *slash = '\0';
    if (!join(link, self, "ipamd-cni.d/current")) {
        return fail("path too long", self);
    }
    if (realpath(link, root) == NULL) {
        return fail("the plugin's runtime is not installed", link);
    }
    if (!join(loader, root, "lib/ld.so") || !join(lib, root, "lib") ||
        !join(python, root, "bin/python3")) {
        return fail("path too long", root);
    }
    char *argv[] = {loader, "--library-path", lib, python, "-I", "-S", "-B", "-c", ENTRY, NULL};
    execv(loader, argv);
    return fail("cannot start the plugin's runtime", loader);
}
