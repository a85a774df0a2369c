"""Helpers shared by the PyTorch peers (score_peer.py, train_peer.py, decode_peer.py).

They used to be copied into each peer; one copy here keeps the three peers loading models,
timing, and reporting memory and the BLAS in use the same way. The peers run as
`/usr/bin/python3 bench/X_peer.py`, which puts bench/ first on sys.path, so `import bench_util`
finds this file.
"""

import json
import os
import resource
import statistics
import struct
import sys
import time

import torch


def read_safetensors(path):
    """Returns ({name: float32 tensor}, metadata dict). Only F32, as our writer produces."""
    import numpy as np  # only the peers that read a model file need numpy

    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = np.fromfile(f, dtype=np.uint8)  # the whole data section, writable
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        if entry["dtype"] != "F32":
            sys.exit(f"error: {path}: tensor {name} has dtype {entry['dtype']}, expected F32")
        begin, end = entry["data_offsets"]
        array = data[begin:end].view(np.float32).reshape(entry["shape"])
        tensors[name] = torch.from_numpy(array)  # shares memory with `data`
    return tensors, metadata


def read_ids(path, skip_blank=False):
    """One sentence of space-separated ids per line; skip_blank drops empty lines."""
    with open(path) as f:
        return [[int(w) for w in line.split()] for line in f if not skip_blank or line.strip()]


def time_median(warmup, repeats, fn):
    """(median seconds, every time) of `repeats` calls of fn after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), seconds


def square_gemm_peak(n, repeats=5):
    """Best GFLOP/s of torch.mm on an n×n×n float32 product, measured in this process."""
    a = torch.full((n, n), 0.01)  # [n, n]
    b = torch.full((n, n), 0.02)  # [n, n]
    _, seconds = time_median(1, repeats, lambda: torch.mm(a, b))
    return 2.0 * n * n * n / min(seconds) / 1e9


def loaded_blas():
    """Which BLAS library torch's dense GEMMs on the CPU go to: "mkl" for PyPI's wheel (MKL is
    inside libtorch, as its build configuration says); Debian's torch uses libblas.so.3, the
    slow netlib reference unless OpenBLAS or similar provides that alternative. The BLAS that
    numpy's wheel brings and CUDA's cuBLAS do not count."""
    if "BLAS_INFO=mkl" in torch.__config__.show():
        return "mkl"
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f
                 if "blas" in line.lower() and "/" in line and "cublas" not in line.lower()
                 and "numpy" not in line}
    if any("openblas" in p for p in paths):
        return "openblas"
    if any("/blas/libblas" in p for p in paths):
        return "netlib-reference"
    return ",".join(sorted(os.path.basename(p) for p in paths)) or "unknown"


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB
