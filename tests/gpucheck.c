/*
 * gpucheck: runs inside test containers and reports, one machine-readable line
 * per check, what a CUDA program would see. Compiled by the e2e tests with the
 * host's cc so that it is a genuine glibc binary using the image's loader and
 * ld.so.cache, which is exactly the path nvhook's library injection must serve.
 *
 * Usage: gpucheck [--dev PATH] [--stat PATH] [--write PATH] [--exec PATH]
 *                 [--ls DIR] ...
 * The dlopen check always runs first; the other checks run in argument order.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

/* Errnos the tests distinguish get their name; anything else stays numeric so
 * that an unexpected failure is still visible in the output. */
static void print_errno(const char *check, const char *path, int err)
{
    switch (err) {
    case ENOENT:
        printf("%s %s absent\n", check, path);
        break;
    case ENXIO:
        printf("%s %s ENXIO\n", check, path);
        break;
    case EPERM:
        printf("%s %s EPERM\n", check, path);
        break;
    case EACCES:
        printf("%s %s EACCES\n", check, path);
        break;
    case EROFS:
        printf("%s %s EROFS\n", check, path);
        break;
    default:
        printf("%s %s err%d\n", check, path, err);
    }
}

static void check_dlopen(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("dlopen libcuda.so.1 fail %s\n", dlerror());
        return;
    }
    printf("dlopen libcuda.so.1 ok\n");
    int (*cu_init)(unsigned int) = (int (*)(unsigned int))dlsym(lib, "cuInit");
    if (cu_init == NULL) {
        printf("cuInit missing %s\n", dlerror());
        return;
    }
    printf("cuInit %d\n", cu_init(0));
}

/* On a simulated node no driver sits behind the nodes, so the open result
 * tells the cgroup verdict: ENXIO means allowed, EPERM means refused. */
static void check_dev(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        print_errno("dev", path, errno);
        return;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        print_errno("dev", path, errno);
        return;
    }
    close(fd);
    printf("dev %s open-ok\n", path);
}

/* Reports the node's type and numbers, proving the right minor was created. */
static void check_stat(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        print_errno("stat", path, errno);
        return;
    }
    const char *kind = S_ISCHR(st.st_mode)   ? "char"
                       : S_ISBLK(st.st_mode) ? "block"
                       : S_ISREG(st.st_mode) ? "file"
                       : S_ISDIR(st.st_mode) ? "dir"
                                             : "other";
    printf("stat %s %s %u:%u\n", path, kind, major(st.st_rdev), minor(st.st_rdev));
}

/* O_WRONLY without O_TRUNC: probes writability without changing the file. */
static void check_write(const char *path)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        print_errno("write", path, errno);
        return;
    }
    close(fd);
    printf("write %s ok\n", path);
}

static void check_exec(const char *path)
{
    /* Flush first so the child's output lands after ours, not before. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        printf("exec %s fork-err%d\n", path, errno);
        return;
    }
    if (pid == 0) {
        char *const argv[] = {(char *)path, NULL};
        execv(path, argv);
        fprintf(stderr, "gpucheck: execv %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) {
        printf("exec %s wait-err%d\n", path, errno);
    } else if (WIFEXITED(status)) {
        printf("exec %s rc=%d\n", path, WEXITSTATUS(status));
    } else {
        printf("exec %s signal=%d\n", path, WTERMSIG(status));
    }
}

static int not_dot(const struct dirent *entry)
{
    return strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0;
}

static void check_ls(const char *dir)
{
    struct dirent **entries;
    int n = scandir(dir, &entries, not_dot, alphasort);
    if (n < 0) {
        print_errno("ls", dir, errno);
        return;
    }
    for (int i = 0; i < n; i++) {
        printf("ls %s %s\n", dir, entries[i]->d_name);
        free(entries[i]);
    }
    free(entries);
}

struct check {
    const char *flag;
    void (*run)(const char *arg);
};

static const struct check checks[] = {
    {"--dev", check_dev},     {"--stat", check_stat}, {"--write", check_write},
    {"--exec", check_exec},   {"--ls", check_ls},
};

static const struct check *find_check(const char *flag)
{
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        if (strcmp(checks[i].flag, flag) == 0) {
            return &checks[i];
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    /* Line buffering keeps our lines and --exec children's lines in order. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    check_dlopen();
    for (int i = 1; i < argc; i += 2) {
        const struct check *check = find_check(argv[i]);
        if (check == NULL || i + 1 >= argc) {
            fprintf(stderr, "gpucheck: bad argument %s\n", argv[i]);
            return 2;
        }
        check->run(argv[i + 1]);
    }
    return 0;
}
