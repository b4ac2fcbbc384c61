/* The process of the hooked container in tests/attack/run.sh (static: it runs in any image).
 * Prints what a pod would use to reach the machine through the hooks: the params it sees, and
 * whether it can write them (a machine file bound read-write in their place). */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    char buf[4096];
    int fd = open("/proc/driver/nvidia/params", O_RDONLY);
    if (fd < 0) {
        printf("PARAMS none\n");
    } else {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = 0;
        printf("PARAMS %s\n", buf);
        close(fd);
        int w = open("/proc/driver/nvidia/params", O_WRONLY);
        if (w >= 0) printf("PARAMS-WRITABLE\n");
    }
    return 0;
}
