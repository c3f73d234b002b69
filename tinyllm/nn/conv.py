"""Convolution and pooling as views plus a matmul or a reduction (tinygrad's way): no primitive of their own, so
every runtime and every rewrite gets them, and their gradients come from the primitives' rules.

The patches of x (im2col): for each kernel offset, the strided slice of the zero-padded input that the offset
meets at every output position; stacked, they are (N, C, K, *out) with K = ∏ kernel. A convolution is then a
matmul of the weight, (groups, O/groups, C/groups·K), with the patches, (N, groups, C/groups·K, L), which the
sgemm runs; a pooling is a max or mean over the K axis. Slices of a slice are views, the stack is one copy.
"""
import itertools
import math

from ..graph import build
from ..tensor import Tensor, arange
from .. import factory
from .resize import pad_constant


def _tuple(value, n, what):
    t = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    if len(t) != n or not all(isinstance(v, int) for v in t):
        raise ValueError(f"{what} must be an int or a tuple of {n} ints, got {value!r}")
    return t


def _slice(x, starts, stops, steps):
    d = len(starts)
    arg = tuple((0, s, 1) for s in x.shape[:-d]) + tuple(zip(starts, stops, steps))
    return x._make(build("SHRINK", x._node, arg=arg))


def _patches(x, kernel, stride, padding, dilation, pad_value=0.0, extra=None):
    """(patches (N, C, K, *out), out): every window of x, K = ∏ kernel in row-major order of the offsets. extra:
    more padding after the end of each axis (ceil_mode's last, partial windows)."""
    d = len(kernel)
    x = pad_constant(x, [(p, p + e) for p, e in zip(padding, extra or (0,) * d)], pad_value)
    size = x.shape[-d:]
    out = tuple((s - dl * (k - 1) - 1) // st + 1 for s, k, st, dl in zip(size, kernel, stride, dilation))
    if any(o < 1 for o in out):
        raise RuntimeError(f"the kernel {kernel} (dilation {dilation}) is larger than the padded input {size}")
    views = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = tuple(j * dl for j, dl in zip(offset, dilation))
        stops = tuple(s0 + st * (o - 1) + 1 for s0, st, o in zip(starts, stride, out))
        views.append(_slice(x, starts, stops, stride).unsqueeze(-d - 1))
    return factory.cat(views, -d - 1), out


def _check_input(x, d, name):
    if not isinstance(x, Tensor) or x.ndim not in (d + 1, d + 2):
        raise RuntimeError(f"{name}: expected a {d + 1}-D (unbatched) or {d + 2}-D (batched) input, got shape "
                           f"{getattr(x, 'shape', type(x).__name__)}")
    return (x.unsqueeze(0), True) if x.ndim == d + 1 else (x, False)


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, name="conv"):
    """N-d convolution (cross-correlation, as torch): x (N, C, *S) or (C, *S), weight (O, C/groups, *kernel)."""
    d = weight.ndim - 2
    x, unbatched = _check_input(x, d, name)
    n, c = x.shape[:2]
    o, cg = weight.shape[:2]
    kernel = weight.shape[2:]
    if groups < 1 or c % groups or o % groups or cg * groups != c:
        raise RuntimeError(f"{name}: input has {c} channels and weight {tuple(weight.shape)}: with groups={groups} "
                           f"the weight's second axis must be {c // max(groups, 1)} and both channel counts "
                           "divisible by groups")
    stride, dilation = _tuple(stride, d, "stride"), _tuple(dilation, d, "dilation")
    if padding == "valid":
        padding = (0,) * d
    elif padding == "same":
        if any(s != 1 for s in stride):
            raise ValueError(f"{name}: padding='same' needs stride 1, got {stride}")
        total = [dl * (k - 1) for k, dl in zip(kernel, dilation)]
        if any(t % 2 for t in total):
            raise ValueError(f"{name}: padding='same' with an even kernel extent {total} is asymmetric: pad by hand")
        padding = tuple(t // 2 for t in total)
    padding = _tuple(padding, d, "padding")
    patches, out = _patches(x, kernel, stride, padding, dilation)
    k = math.prod(kernel)
    cols = patches.reshape(n, groups, cg * k, math.prod(out))
    y = weight.reshape(groups, o // groups, cg * k).matmul(cols).reshape(n, o, *out)
    if bias is not None:
        y = y + bias.reshape(o, *(1,) * d)
    return y.squeeze(0) if unbatched else y


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return conv(input, weight, bias, stride, padding, dilation, groups, "conv1d")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return conv(input, weight, bias, stride, padding, dilation, groups, "conv2d")


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return conv(input, weight, bias, stride, padding, dilation, groups, "conv3d")


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The adjoint of conv2d: x's elements spread stride apart (zeros between), padded by dilation·(k-1) - padding,
    convolved with the kernel flipped and its channel axes swapped. weight (C, O/groups, kh, kw), as torch."""
    d = 2
    x, unbatched = _check_input(input, d, "conv_transpose2d")
    n, c = x.shape[:2]
    cw, og = weight.shape[:2]
    kernel = weight.shape[2:]
    if cw != c or groups < 1 or c % groups:
        raise RuntimeError(f"conv_transpose2d: input has {c} channels, weight {tuple(weight.shape)} (groups={groups}): "
                           "the weight's first axis must be the input's channels, divisible by groups")
    stride, dilation = _tuple(stride, d, "stride"), _tuple(dilation, d, "dilation")
    padding, output_padding = _tuple(padding, d, "padding"), _tuple(output_padding, d, "output_padding")
    if any(op >= max(s, dl) for op, s, dl in zip(output_padding, stride, dilation)):
        raise ValueError(f"conv_transpose2d: output_padding {output_padding} must be smaller than stride or dilation")
    size = x.shape[2:]
    spread = tuple((s - 1) * st + 1 for s, st in zip(size, stride))
    if any(st > 1 for st in stride):  # x's elements stride apart: place each at the first of st slots, then trim
        wide = tuple(s * st for s, st in zip(size, stride))
        x = x.reshape(n, c, size[0], 1, size[1], 1)
        shape = (n, c, size[0], stride[0], size[1], stride[1])
        x = x._make(build("PAD", x._node, arg=(shape, ((0, n, 1), (0, c, 1), (0, size[0], 1), (0, 1, 1),
                                                       (0, size[1], 1), (0, 1, 1)))))
        x = _slice(x.reshape(n, c, *wide), (0, 0), spread, (1, 1))
    edge = [dl * (k - 1) - p for k, dl, p in zip(kernel, dilation, padding)]  # negative: crop
    x = pad_constant(x, [(e, e + op) for e, op in zip(edge, output_padding)])
    flip = [arange(k - 1, -1, -1, device=weight.device) for k in kernel]
    w = weight[:, :, flip[0]][:, :, :, flip[1]]  # (C, O/g, kh, kw) flipped in space
    w = w.reshape(groups, c // groups, og, *kernel).permute(0, 2, 1, 3, 4).reshape(groups * og, c // groups, *kernel)
    y = conv(x, w, bias, 1, 0, dilation, groups, "conv_transpose2d")
    return y.squeeze(0) if unbatched else y


def _ceil_extra(size, kernel, stride, padding, dilation):
    """ceil_mode's padding after the end of each axis: the output size rounds up, as torch's, except that a window
    starting past the input (in the right padding) is dropped."""
    extra = []
    for s, k, st, p, dl in zip(size, kernel, stride, padding, dilation):
        span = s + 2 * p - dl * (k - 1) - 1
        out = -(-span // st) + 1
        if (out - 1) * st >= s + p:
            out -= 1
        extra.append(max((out - 1) * st - span, 0))
    return tuple(extra)


def _pool_args(x, kernel_size, stride, padding, dilation, ceil_mode, d, name):
    if ceil_mode and name != "max_pool2d":
        raise NotImplementedError(f"{name}: ceil_mode=True is not supported; pad the input instead")
    kernel = _tuple(kernel_size, d, "kernel_size")
    stride = kernel if stride is None or stride == () else _tuple(stride, d, "stride")
    padding, dilation = _tuple(padding, d, "padding"), _tuple(dilation, d, "dilation")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise RuntimeError(f"{name}: padding {padding} should be at most half of kernel_size {kernel}")
    x, unbatched = _check_input(x, d, name)
    return x, unbatched, kernel, stride, padding, dilation


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """The max of each window (padding counts as -inf). return_indices: each max's flat index in its input plane,
    as torch (ties: the first)."""
    x, unbatched, kernel, stride, padding, dilation = _pool_args(input, kernel_size, stride, padding, dilation,
                                                                 ceil_mode, 2, "max_pool2d")
    extra = _ceil_extra(x.shape[2:], kernel, stride, padding, dilation) if ceil_mode else None
    patches, out = _patches(x, kernel, stride, padding, dilation, pad_value=-math.inf, extra=extra)
    y = patches.amax(2)
    if not return_indices:
        return y.squeeze(0) if unbatched else y
    k = patches.argmax(2)  # (N, C, *out): which offset; its (row, column) in the input from a table
    offsets = factory.tensor([[j0 * dilation[0], j1 * dilation[1]] for j0, j1 in
                              itertools.product(range(kernel[0]), range(kernel[1]))], device=x.device)
    picked = offsets[k]  # (N, C, oh, ow, 2)
    oh = arange(out[0], device=x.device).reshape(out[0], 1) * stride[0] - padding[0]
    ow = arange(out[1], device=x.device).reshape(1, out[1]) * stride[1] - padding[1]
    index = (picked[..., 0] + oh) * x.shape[3] + picked[..., 1] + ow
    return (y.squeeze(0), index.squeeze(0)) if unbatched else (y, index)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """max_pool2d over a (N, C, L) or (C, L) input as a plane of height 1."""
    x, unbatched = _check_input(input, 1, "max_pool1d")
    one = lambda v, name, dflt=None: (1, _tuple(v, 1, name)[0]) if v is not None and v != () else dflt  # noqa: E731
    y = max_pool2d(x.unsqueeze(-2), one(kernel_size, "kernel_size"), one(stride, "stride"),
                   (0, _tuple(padding, 1, "padding")[0]), one(dilation, "dilation"), ceil_mode, return_indices)
    y = tuple(t.squeeze(-2) for t in y) if return_indices else y.squeeze(-2)
    if unbatched:
        return tuple(t.squeeze(0) for t in y) if return_indices else y.squeeze(0)
    return y


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """The mean of each window; padding counts as zeros in it (count_include_pad=True, torch's default)."""
    x, unbatched, kernel, stride, padding, _ = _pool_args(input, kernel_size, stride, padding, 1, ceil_mode, 2,
                                                          "avg_pool2d")
    patches, out = _patches(x, kernel, stride, padding, (1, 1))
    total = patches.sum(2)
    if divisor_override is not None:
        y = total / divisor_override
    elif count_include_pad or not any(padding):
        y = total / math.prod(kernel)
    else:
        ones = factory.ones(1, 1, *x.shape[2:], dtype=x.dtype, device=x.device)
        y = total / _patches(ones, kernel, stride, padding, (1, 1))[0].sum(2)
    return y.squeeze(0) if unbatched else y
