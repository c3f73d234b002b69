"""Sorting, as Tensor methods: the ARGSORT primitive gives the order, a gather by it gives the values (so their
gradient goes back to where each value came from, as torch's)."""
from ..graph import build
from . import MaxResult, TensorLike


class Sorting(TensorLike):
    __slots__ = ()

    def argsort(self, dim=-1, descending=False, stable=False):
        """The positions that sort the tensor along `dim`. Always stable (equal values keep their order); NaN sorts
        as the largest value, as torch."""
        d = self._dim(dim, "argsort")
        return self._make(build("ARGSORT", self._node, arg=(d, bool(descending))))

    def sort(self, dim=-1, descending=False, stable=False):
        """(values, indices) sorted along `dim`, as torch.sort."""
        indices = self.argsort(dim, descending)
        return MaxResult(self.gather(dim, indices) if self.ndim else self, indices)

    def topk(self, k, dim=-1, largest=True, sorted=True):
        """(values, indices) of the k largest (or smallest) along `dim`, largest first, as torch.topk; ties in their
        order along `dim`."""
        d = self._dim(dim, "topk")
        n = self.shape[d] if self.ndim else 1
        if not isinstance(k, int) or not 0 <= k <= n:
            raise RuntimeError(f"topk: k={k} is out of range for dim {dim} of size {n} (shape {self.shape}): "
                               f"take 0 <= k <= {n}")
        order = self.argsort(d, descending=largest)
        indices = order._slice(d, 0, k) if self.ndim else order
        return MaxResult(self.gather(d, indices) if self.ndim else self, indices)

    def msort(self):
        """The tensor sorted along its first axis."""
        return self.sort(0).values
