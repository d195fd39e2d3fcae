/* A fake libcuda.so.1 for the GPU check's test (tests/test_gpucheck.py): the driver API calls
 * the check's worker makes (cuInit, cuDeviceGet, cuCtxCreate_v2, cuMemAlloc_v2) succeed, and
 * each allocation is written to the ledger file FAKE_CUDA_LEDGER names, one line
 * `alloc <pid> <CUDA_VISIBLE_DEVICES or -> <bytes>`, from which the test lists the process on
 * that GPU in the simulator's scenario: a process holding memory, as nvidia-smi would show it. */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int note(const char *what, unsigned long long bytes) {
    const char *ledger = getenv("FAKE_CUDA_LEDGER");
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    char line[512];
    int fd, n;
    if (ledger == NULL)
        return 999; /* CUDA_ERROR_UNKNOWN: nobody to tell */
    n = snprintf(line, sizeof line, "%s %d %s %llu\n", what, (int)getpid(),
                 visible != NULL && *visible ? visible : "-", bytes);
    fd = open(ledger, O_WRONLY | O_APPEND);
    if (fd < 0)
        return 999;
    if (write(fd, line, (size_t)n) != n) {
        close(fd);
        return 999;
    }
    close(fd);
    return 0;
}

int cuInit(unsigned int flags) { (void)flags; return 0; }

int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }

int cuCtxCreate_v2(void **context, unsigned int flags, int device) {
    (void)flags; (void)device;
    *context = (void *)context;
    return 0;
}

int cuMemAlloc_v2(unsigned long long *pointer, size_t bytes) {
    *pointer = 0x7f0000000000ULL;
    return note("alloc", (unsigned long long)bytes);
}
