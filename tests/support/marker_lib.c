/*
 * A library whose constructor appends "TAG EXE ARG1" to the host file MARKER (both set with -D):
 * proof of which host processes loaded it. Inside a container the marker's directory does
 * not exist, so a container process that loads it leaves no trace.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void mark(void)
{
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n < 0 ? 0 : n] = '\0';
    /* argv[1] tells nvhook's roles apart: "runtime" (the shim) from "hook". */
    char cmdline[512] = "";
    int cfd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t c = cfd < 0 ? -1 : read(cfd, cmdline, sizeof cmdline - 1);
    if (cfd >= 0)
        close(cfd);
    cmdline[c < 0 ? 0 : c] = '\0';
    const char *arg1 = cmdline + strlen(cmdline) + 1;
    if (arg1 >= cmdline + (c < 0 ? 0 : c))
        arg1 = "";
    int fd = open(MARKER, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    dprintf(fd, "%s %s %s\n", TAG, exe, arg1);
    close(fd);
}
