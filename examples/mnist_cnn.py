"""A small CNN on handwritten digits: conv, pool, linear, trained with AdamW.

    pip install scikit-learn       # ships the 8x8 digits (1,797 images) in the wheel: no download
    python examples/mnist_cnn.py   # about 2 s on two CPU cores (C runtime; under 1 s of training); ~99 % test accuracy

The data is scikit-learn's bundled `load_digits` (the UCI 8x8 version of the MNIST idea), split 80/20 with a fixed
seed, and batched by tinyllm.utils.data.DataLoader as torch's would be. The model is LeNet's shape scaled to 8x8
inputs.
"""
import argparse
import sys
import time

import numpy as np

import tinyllm as tl
from tinyllm import nn
import tinyllm.nn.functional as F
from tinyllm.utils.data import DataLoader, TensorDataset


def load(seed):
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("mnist_cnn.py: error: the digits come with scikit-learn: pip install scikit-learn")
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0 - 0.5)[:, None]  # (N, 1, 8, 8), centred
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


class CNN(nn.Module):
    def __init__(self):
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16 x 4 x 4
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 32 x 2 x 2
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def accuracy(model, loader):
    correct = 0
    with tl.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum().item())
    return correct / len(loader.dataset)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runtime", help="the tinyllm runtime (numpy, c, wgsl); default: $TINYLLM_RUNTIME, else c")
    p.add_argument("--fail-under", type=float, help="exit 1 if the final test accuracy is below this (0-1)")
    args = p.parse_args(argv)
    (xtr, ytr), (xte, yte) = load(args.seed)
    tl.manual_seed(args.seed)
    device = args.runtime or tl.tensor(0.0).device
    model = CNN().to(device)
    opt = tl.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    # a new order each epoch from the seeded generator; drop_last: whole batches only, one shape, one compiled step
    train = DataLoader(TensorDataset(tl.tensor(xtr, device=device), tl.tensor(ytr, device=device)),
                       batch_size=args.batch_size, shuffle=True, drop_last=True,
                       generator=tl.Generator().manual_seed(args.seed))
    test = DataLoader(TensorDataset(tl.tensor(xte, device=device), tl.tensor(yte, device=device)), batch_size=512)

    @tl.jit
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    print(f"{len(xtr)} training and {len(xte)} test images of 8x8; {sum(q.numel() for q in model.parameters()):,} "
          f"parameters; runtime {device}")
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        losses = [step(x, y) for x, y in train]
        mean = float(np.mean([loss.item() for loss in losses]))
        print(f"epoch {epoch:2d}  loss {mean:.4f}  test accuracy {accuracy(model, test):.2%}  "
              f"{time.perf_counter() - start:5.1f} s", flush=True)
    acc = accuracy(model, test)
    print(f"final test accuracy {acc:.2%} in {time.perf_counter() - start:.2f} s")
    if args.fail_under is not None and acc < args.fail_under:
        sys.exit(f"mnist_cnn.py: test accuracy {acc:.2%} is below --fail-under {args.fail_under:.2%}")
    return acc


if __name__ == "__main__":
    main()
