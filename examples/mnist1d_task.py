"""MNIST-1D, generated offline, and a model big enough for the network to matter.

The training task of examples/ddp_train.py and bench/time_to_accuracy.py. MNIST-1D
(Greydanus, 2020) is made procedurally by the ``mnist1d`` package's
``make_dataset``: ten 1D digit templates padded, scaled, sheared, translated and
noised into 40-sample sequences. Nothing is downloaded (its ``get_dataset``
downloader is never called). The dataset is a function of ``data_seed`` and the
sizes alone, the same on every rank and every run; it is cached as one ``.npz``
per (seed, sizes) in a directory the caller gives (a run's temporary directory),
written atomically so ranks starting together never read a half-written file.

The model: three small 1D convolutions (translation invariance; few parameters,
little compute) feeding a wide MLP head, 4.4 M parameters in all, so one step's
gradients are 17.6 MB of float32 and communication dominates on the emulated
testbed. Needs mnist1d 0.0.2.post1 (pinned in scripts/test.sh and bench/run.sh;
its numpy/scipy/matplotlib/requests from Debian) and python3-torch.
"""

import os
import tempfile

import numpy as np
import torch

MNIST1D_VERSION = "0.0.2.post1"
LENGTH = 40  # samples per sequence (mnist1d's final_seq_length)
CLASSES = 10
TRAIN = 16_000  # default training samples
TEST = 4_000  # default test samples: one test sample is 0.025 points
DATA_SEED = 42  # the dataset's seed (mnist1d's own default)


def generate(data_seed: int = DATA_SEED, train: int = TRAIN, test: int = TEST) -> dict:
    """The dataset as numpy arrays x, y, x_test, y_test (x float32 [n, 40], y int64)."""
    from mnist1d.data import get_dataset_args, make_dataset  # 0.0.2.post1, pinned by the install steps

    n = train + test
    if n % CLASSES or train % CLASSES:
        raise ValueError(f"train ({train}) and test ({test}) must be multiples of {CLASSES}")
    args = get_dataset_args()  # an ObjectView: make_dataset reads attributes
    args.num_samples = n
    args.train_split = train / n
    args.seed = data_seed
    d = make_dataset(args)
    return {
        "x": d["x"].astype(np.float32),
        "y": d["y"].astype(np.int64),
        "x_test": d["x_test"].astype(np.float32),
        "y_test": d["y_test"].astype(np.int64),
    }


def load(cache_dir: str | None, data_seed: int = DATA_SEED, train: int = TRAIN, test: int = TEST):
    """(x_train, y_train, x_test, y_test) as torch tensors; generated once per cache_dir.

    cache_dir None: a fresh temporary directory (nothing shared between runs)."""
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="mnist1d-")
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"mnist1d-seed{data_seed}-{train}-{test}.npz")
    if not os.path.exists(path):
        d = generate(data_seed, train, test)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **d)
        os.replace(tmp, path)  # atomic: another rank sees the whole file or none
    with np.load(path) as d:
        return tuple(torch.from_numpy(d[k]) for k in ("x", "y", "x_test", "y_test"))


class Net(torch.nn.Module):
    """Conv1d ×3 (32 channels, kernel 5, same length) → flatten 1280 → 1536 → 1536 → 10."""

    def __init__(self, channels: int = 32, hidden: int = 1536):
        super().__init__()
        c = channels
        self.features = torch.nn.Sequential(
            torch.nn.Conv1d(1, c, 5, padding=2),
            torch.nn.ReLU(),
            torch.nn.Conv1d(c, c, 5, padding=2),
            torch.nn.ReLU(),
            torch.nn.Conv1d(c, c, 5, padding=2),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Sequential(
            torch.nn.Linear(c * LENGTH, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)).flatten(1))


def model(hidden: int = 1536) -> torch.nn.Module:
    """The task's model (4.4 M parameters at the default width)."""
    return Net(hidden=hidden)


def parameters(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


if __name__ == "__main__":
    import time

    t = time.perf_counter()
    x, y, xt, yt = load(None)
    print(f"generated {len(x)} train / {len(xt)} test in {time.perf_counter() - t:.1f} s")
    net = model()
    print(f"parameters {parameters(net)} ({4 * parameters(net) / 1e6:.1f} MB of float32 gradients)")
