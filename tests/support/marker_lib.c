/*
 * A library whose constructor appends "TAG EXE" to the host file MARKER (both set with -D):
 * proof of which host processes loaded it. Inside a container the marker's directory does
 * not exist, so a container process that loads it leaves no trace.
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

__attribute__((constructor)) static void mark(void)
{
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n < 0 ? 0 : n] = '\0';
    int fd = open(MARKER, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    dprintf(fd, "%s %s\n", TAG, exe);
    close(fd);
}
