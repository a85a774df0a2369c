#!/usr/bin/python3
"""The PyTorch peer of bench/attention_scaling_bench.cpp: the same layers as a PyTorch 1.13 user
writes them — nn.MultiheadAttention (eval, no_grad; restricted attention as a boolean band mask,
since PyTorch has no banded kernel: it still computes all n×n scores) and nn.RNN (tanh) — on the
same lengths, width and thread count, timed the same way (median of at least 3 calls and
--min-centis/100 s after one warm-up). One JSON line per (n, variant), fields as ours.

Run: /usr/bin/python3 bench/attention_scaling_peer.py [--max-n N] [--window W] [--min-centis C]
"""
import argparse
import json
import statistics
import time

import torch
from torch import nn


def time_case(fn, min_seconds):
    fn()
    seconds = []
    while len(seconds) < 3 or sum(seconds) < min_seconds:
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-n", type=int, default=4096)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--min-centis", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(7)
    d = args.d_model
    min_seconds = args.min_centis / 100
    attention = nn.MultiheadAttention(d, args.heads, batch_first=True).eval()
    rnn = nn.RNN(d, d, nonlinearity="tanh", batch_first=True).eval()
    n = 64
    with torch.no_grad():
        while n <= args.max_n:
            x = torch.randn(1, n, d)  # [1, n, D]
            position = torch.arange(n)
            band = (position[:, None] - position[None, :]).abs() > args.window  # True: masked
            for variant, mask in (("full", None), ("restricted", band)):
                seconds = time_case(
                    lambda: attention(x, x, x, attn_mask=mask, need_weights=False), min_seconds)
                print(json.dumps({"variant": variant, "n": n,
                                  "window": None if mask is None else args.window,
                                  "layer_s": seconds, "core_s": None}), flush=True)
            seconds = time_case(lambda: rnn(x), min_seconds)
            print(json.dumps({"variant": "recurrent", "n": n, "window": None,
                              "layer_s": seconds, "core_s": None}), flush=True)
            n *= 2


if __name__ == "__main__":
    main()
