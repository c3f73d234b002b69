#include "program.h"

typedef void (*generated_kernel)(char **argv);  // the signature of every generated kernel (render/c.py)

void tl_run_kernels(void **fns, char ***argvs, long n) {
    for (long i = 0; i < n; i++) ((generated_kernel)fns[i])(argvs[i]);
}
