/* What the driver stub (driver_stub.c) records of a launch, as test_cuda_host.c reads it through
** fjstub_launch_at. */
#ifndef FJ_TESTS_DRIVER_STUB_H
#define FJ_TESTS_DRIVER_STUB_H

#define FJSTUB_PARAM_COPY 2048 /* bytes of a parameter block a launch keeps */

typedef struct fjstub_launch {
    char function[128];
    unsigned grid[3], block[3], shared_bytes;
    void *stream;
    int overlap_previous; /* launched by cuLaunchKernelEx with programmatic stream
                          ** serialisation allowed */
    unsigned char params[FJSTUB_PARAM_COPY]; /* the first FJSTUB_PARAM_COPY bytes */
} fjstub_launch;

#endif
