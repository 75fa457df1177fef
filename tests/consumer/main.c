/* A program that uses flashjit as an installed or vendored library: it needs only the header
** and the library, found by CMake, pkg-config or add_subdirectory (tests/install_consumers.sh). */
#include <stdio.h>
#include <string.h>

#include <flashjit.h>

int main(void)
{
    const char *v = fj_version();
    printf("flashjit %s; FJ_ERR_UNSUPPORTED is \"%s\"\n", v, fj_status_string(FJ_ERR_UNSUPPORTED));
    return v && strlen(v) > 0 ? 0 : 1;
}
