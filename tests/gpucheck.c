/*
 * gpucheck: runs inside test containers and reports, one machine-readable line
 * per check, what a CUDA program would see. Compiled by the e2e tests with the
 * host's cc so that it is a genuine glibc binary using the image's loader and
 * ld.so.cache, which is exactly the path nvhook's library injection must serve.
 *
 * Usage: gpucheck [--dev PATH] [--stat PATH] [--write PATH] [--exec PATH]
 *                 [--ls DIR] [--kernel COUNT] [--dlopen NAME] [--owner PATH] ...
 * The dlopen check always runs first; the other checks run in argument order.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
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
    case ENODEV:
        printf("%s %s ENODEV\n", check, path);
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
    /* Which file the loader resolved the name to: the path it took (from its cache, or
     * a default directory), then the file at the end of that path's links. */
    struct link_map *map = NULL;
    if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map != NULL) {
        char real[PATH_MAX];
        printf("dlopen libcuda.so.1 path %s\n", map->l_name);
        if (realpath(map->l_name, real) != NULL)
            printf("dlopen libcuda.so.1 file %s\n", real);
    }
    int (*cu_init)(unsigned int) = (int (*)(unsigned int))dlsym(lib, "cuInit");
    if (cu_init == NULL) {
        printf("cuInit missing %s\n", dlerror());
        return;
    }
    printf("cuInit %d\n", cu_init(0));
}

/* Loads a library the way a graphics loader does (by the name or path its config
 * gives) and reports the file the loader resolved it to. */
static void check_dlopen_name(const char *name)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("dlopen %s fail %s\n", name, dlerror());
        return;
    }
    struct link_map *map = NULL;
    if (dlinfo(lib, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) {
        printf("dlopen %s ok ?\n", name);
    } else {
        printf("dlopen %s ok %s\n", name, map->l_name);
    }
    dlclose(lib);
}

/* On a simulated node no driver sits behind the nodes, so the open result
 * tells the cgroup verdict: ENXIO (ENODEV for a misc node such as WSL2's
 * /dev/dxg) means allowed, EPERM means refused. */
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

/* Whose a file is, as the container sees it (its own user namespace's ids). */
static void check_owner(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        print_errno("owner", path, errno);
        return;
    }
    printf("owner %s %u:%u\n", path, (unsigned)st.st_uid, (unsigned)st.st_gid);
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

/* A kernel in PTX, JIT-compiled by the driver for whatever GPU it has: out[i] = 3 * i + 1. */
static const char FILL_PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry fill(.param .u64 out, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<7>;\n"
    "  .reg .b64 %rd<4>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %p, %r5, %r1;\n"
    "  @%p bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd2, %rd2, %rd3;\n"
    "  mul.lo.s32 %r6, %r5, 3;\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  st.global.u32 [%rd2], %r6;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

/* The driver API entry points the kernel check needs, by the names libcuda exports. */
struct cuda_api {
    int (*init)(unsigned int);
    int (*device_get)(int *, int);
    int (*ctx_create)(void **, unsigned int, int);
    int (*module_load_data)(void **, const void *);
    int (*module_get_function)(void **, void *, const char *);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                  void *, void **, void **);
    int (*ctx_synchronize)(void);
    int (*memcpy_dtoh)(void *, unsigned long long, size_t);
    int (*mem_free)(unsigned long long);
    int (*ctx_destroy)(void *);
};

/* Looks up every entry point; names the first one missing. */
static const char *load_cuda_api(void *lib, struct cuda_api *api)
{
    struct {
        const char *name;
        void **slot;
    } table[] = {
        {"cuInit", (void **)&api->init},
        {"cuDeviceGet", (void **)&api->device_get},
        {"cuCtxCreate_v2", (void **)&api->ctx_create},
        {"cuModuleLoadData", (void **)&api->module_load_data},
        {"cuModuleGetFunction", (void **)&api->module_get_function},
        {"cuMemAlloc_v2", (void **)&api->mem_alloc},
        {"cuLaunchKernel", (void **)&api->launch},
        {"cuCtxSynchronize", (void **)&api->ctx_synchronize},
        {"cuMemcpyDtoH_v2", (void **)&api->memcpy_dtoh},
        {"cuMemFree_v2", (void **)&api->mem_free},
        {"cuCtxDestroy_v2", (void **)&api->ctx_destroy},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        *table[i].slot = dlsym(lib, table[i].name);
        if (*table[i].slot == NULL) {
            return table[i].name;
        }
    }
    return NULL;
}

/* Loads the PTX, launches it over COUNT values on GPU 0, copies the result back and checks
 * every value: one line, "kernel ok COUNT" or where it stopped. */
static void check_kernel(const char *count_text)
{
    unsigned n = (unsigned)strtoul(count_text, NULL, 10);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    struct cuda_api api;
    const char *missing = lib ? load_cuda_api(lib, &api) : "libcuda.so.1";
    if (n == 0 || missing != NULL) {
        printf("kernel unsupported %s\n", n == 0 ? "count" : missing);
        return;
    }
    int device, rc;
    void *ctx, *module, *function;
    unsigned long long out;
#define STEP(call, what)                                                                   \
    if ((rc = (call)) != 0) {                                                              \
        printf("kernel fail %s %d\n", what, rc);                                           \
        return;                                                                            \
    }
    STEP(api.init(0), "cuInit");
    STEP(api.device_get(&device, 0), "cuDeviceGet");
    STEP(api.ctx_create(&ctx, 0, device), "cuCtxCreate");
    STEP(api.module_load_data(&module, FILL_PTX), "cuModuleLoadData");
    STEP(api.module_get_function(&function, module, "fill"), "cuModuleGetFunction");
    STEP(api.mem_alloc(&out, (size_t)n * 4), "cuMemAlloc");
    void *params[] = {&out, &n};
    STEP(api.launch(function, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL),
         "cuLaunchKernel");
    STEP(api.ctx_synchronize(), "cuCtxSynchronize");
    unsigned *host = malloc((size_t)n * 4);
    if (host == NULL) {
        printf("kernel fail malloc\n");
        return;
    }
    STEP(api.memcpy_dtoh(host, out, (size_t)n * 4), "cuMemcpyDtoH");
#undef STEP
    unsigned wrong = 0;
    for (unsigned i = 0; i < n; i++) {
        wrong += host[i] != 3 * i + 1;
    }
    free(host);
    api.mem_free(out);
    api.ctx_destroy(ctx);
    if (wrong == 0) {
        printf("kernel ok %u\n", n);
    } else {
        printf("kernel wrong %u of %u\n", wrong, n);
    }
}

struct check {
    const char *flag;
    void (*run)(const char *arg);
};

static const struct check checks[] = {
    {"--dev", check_dev},     {"--stat", check_stat}, {"--write", check_write},
    {"--exec", check_exec},   {"--ls", check_ls},     {"--kernel", check_kernel},
    {"--dlopen", check_dlopen_name}, {"--owner", check_owner},
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
