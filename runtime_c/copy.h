/*
Strided copies for the C runtime's data movement: CONTIGUOUS, CAT, PAD and the reshapes that cannot be views
move values from one strided array into another. NumPy copies on one thread, element by element through short
runs (the 32-float rows of attention's heads); here each innermost run is one memcpy (a short one, as those
rows, 16 bytes at a time inline: the call would cost more) and the outer axes are split among the threads.

    tl_copy(elem, n0..n3, dst, dst strides, src, src strides)

copies the [n0, n1, n2, n3] index space (the caller merges axes down to four) of elements of `elem` bytes,
strides in bytes, either sign. tl_zero(dst, nbytes) clears the border a PAD leaves.

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_COPY_H
#define TINYLLM_COPY_H

void tl_copy(long elem, long n0, long n1, long n2, long n3, char *dst, long d0, long d1, long d2, long d3,
             const char *src, long s0, long s1, long s2, long s3);

void tl_zero(char *dst, long nbytes);

#endif  // TINYLLM_COPY_H
