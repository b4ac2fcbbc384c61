/* The racing sidecar of the adversarial CDI-hook suite (tests/attack/run.sh): a second container
 * of the same pod that shares a writable volume with the hooked one and attacks whatever a hook
 * makes in it, as fast as it can, until it is killed.
 *
 *   racer swap DIR TARGET   every entry of DIR that is not ours is exchanged
 *                           (renameat2 RENAME_EXCHANGE) with a symlink of ours to TARGET, and
 *                           exchanged back on the next pass: a hook that names a path in DIR
 *                           sees its own directory or our link, flipping under it.
 *   racer links DIR TARGET  every entry of DIR that is not ours is replaced by a symlink to
 *                           TARGET/<name>.
 *
 * Runs as root or not (the volume is 0777 and not sticky, like a Kubernetes emptyDir). Static,
 * so it runs in an image with nothing else in it. It keeps its counts in DIR/.racer-stats-<pid>
 * ("<mode> <passes> <hits>", written at its start and rewritten in place every 256 passes), so
 * the suite can tell that it ran through the creations and what it found to attack. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static const char OURS[] = ".racer-";

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: racer swap|links DIR TARGET\n");
        return 2;
    }
    int swap = strcmp(argv[1], "swap") == 0;
    const char *target = argv[3];
    int dir = open(argv[2], O_RDONLY | O_DIRECTORY);
    if (dir < 0) {
        perror(argv[2]);
        return 1;
    }
    char link[64];
    snprintf(link, sizeof link, "%s%d", OURS, (int)getpid());
    unsigned long passes = 0, hits = 0;
    char stats_name[64];
    snprintf(stats_name, sizeof stats_name, "%sstats-%d", OURS, (int)getpid());
    int stats = openat(dir, stats_name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (stats < 0) {
        perror(stats_name);
        return 1;
    }
    if (pwrite(stats, argv[1], strlen(argv[1]), 0) < 0) return 1;
    for (;;) {
        DIR *d = fdopendir(dup(dir));
        if (!d) return 1;
        rewinddir(d);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.' && (e->d_name[1] == 0 || e->d_name[1] == '.' ||
                                        strncmp(e->d_name, OURS, sizeof OURS - 1) == 0))
                continue;
            if (swap) {
                if (symlinkat(target, dir, link) < 0 && errno != EEXIST) continue;
                if (syscall(SYS_renameat2, dir, link, dir, e->d_name, RENAME_EXCHANGE) == 0) hits++;
            } else {
                char to[4096];
                snprintf(to, sizeof to, "%s/%s", target, e->d_name);
                unlinkat(dir, e->d_name, 0);
                if (symlinkat(to, dir, e->d_name) == 0) hits++;
            }
        }
        closedir(d);
        if (++passes % 256 == 0) {
            char line[96];
            int n = snprintf(line, sizeof line, "%s %lu %lu\n", argv[1], passes, hits);
            if (pwrite(stats, line, (size_t)n, 0) != n) return 1;
        }
    }
}
