/*
A replayed schedule's generated kernels, run back to back from one call (tinyllm/runtime/c/program.py): kernel i
is fns[i](argvs[i]), argvs[i] being its array of buffer pointers. One call from Python instead of n, so the
replay's Python does not run, and touch its cold objects, between kernels that follow one another.

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_PROGRAM_H
#define TINYLLM_PROGRAM_H

void tl_run_kernels(void **fns, char ***argvs, long n);

#endif  // TINYLLM_PROGRAM_H
