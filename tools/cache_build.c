/* `flashjit cache build`: compile kernels for a target without its device. */
#include <stdio.h>

#include "tools.h"

int fjt_cache_build(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "flashjit cache build: the CUDA backend is not part of this build\n");
    return 2;
}
