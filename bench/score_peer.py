#!/usr/bin/python3
"""The PyTorch peer of bench/score_bench.cpp (docs/performance.md, "How we measure"): the same teacher-forced scoring of
the same model file on the same batch, written the way a careful PyTorch user would — stock
nn.TransformerEncoderLayer / nn.TransformerDecoderLayer modules (batch_first, eval, inference
mode, so the encoder takes PyTorch's fused fast path), weights loaded from our safetensors file
(parsed by hand with numpy), float32, the same thread count, warm-up and repetitions.

Prints one JSON line with the same fields as score_bench, including the per-sentence totals
that must match ours (the proof that both compute the same thing).

Run: /usr/bin/python3 bench/score_peer.py --work-dir DIR   (DIR written by score_bench)
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import bench_util
from bench_util import loaded_blas, read_safetensors, time_median


def sinusoids(max_positions, d, layout):
    """[max_positions, d] float32, computed in float64 as the C++ side does."""
    position = np.arange(max_positions, dtype=np.float64)[:, None]
    table = np.zeros((max_positions, d), dtype=np.float64)
    if layout == "interleaved":
        i = np.arange(0, d, 2, dtype=np.float64)
        angle = position / np.power(10000.0, i / d)
        table[:, 0::2] = np.sin(angle)
        table[:, 1::2] = np.cos(angle[:, : d // 2])
    else:  # concat
        half = d // 2
        angle = position * np.exp(-np.arange(half) * math.log(10000.0) / (half - 1))
        table[:, :half] = np.sin(angle)
        table[:, half:] = np.cos(angle)
    return torch.from_numpy(table.astype(np.float32))


class Scorer(nn.Module):
    """Encoder–decoder of docs/model-file.md on stock PyTorch layers, for log p(target + eos)."""

    def __init__(self, config, params):
        super().__init__()
        c = config
        unsupported = [
            (c.get("position_encoding", "sinusoidal") != "sinusoidal", "position_encoding"),
            (c.get("self_attention_window") is not None, "self_attention_window"),
        ]
        for bad, key in unsupported:
            if bad:
                sys.exit(f"error: score_peer.py does not implement {key}={c.get(key)!r}")
        self.c = c
        d, heads = c["d_model"], c["heads"]
        norm_first = c.get("norm", "post") == "pre"
        common = dict(d_model=d, nhead=heads, dim_feedforward=c["d_ff"], dropout=0.0,
                      activation=c.get("activation", "relu"), layer_norm_eps=c.get("layer_norm_eps", 1e-5),
                      batch_first=True, norm_first=norm_first)
        self.encoder_layers = nn.ModuleList(nn.TransformerEncoderLayer(**common) for _ in range(c["encoder_layers"]))
        self.decoder_layers = nn.ModuleList(nn.TransformerDecoderLayer(**common) for _ in range(c["decoder_layers"]))

        def attention(module, prefix):
            module.in_proj_weight.copy_(torch.cat([params[f"{prefix}.{p}.weight"] for p in "qkv"]))  # [3D, D]
            module.in_proj_bias.copy_(torch.cat([params[f"{prefix}.{p}.bias"] for p in "qkv"]))  # [3D]
            module.out_proj.weight.copy_(params[f"{prefix}.o.weight"])
            module.out_proj.bias.copy_(params[f"{prefix}.o.bias"])

        def copy(module, prefix):
            module.weight.copy_(params[f"{prefix}.weight"])
            module.bias.copy_(params[f"{prefix}.bias"])

        with torch.no_grad():
            for i, layer in enumerate(self.encoder_layers):
                p = f"encoder.layers.{i}"
                attention(layer.self_attn, f"{p}.self_attn")
                copy(layer.linear1, f"{p}.ffn.fc1")
                copy(layer.linear2, f"{p}.ffn.fc2")
                copy(layer.norm1, f"{p}.norm1")
                copy(layer.norm2, f"{p}.norm2")
            for i, layer in enumerate(self.decoder_layers):
                p = f"decoder.layers.{i}"
                attention(layer.self_attn, f"{p}.self_attn")
                attention(layer.multihead_attn, f"{p}.cross_attn")
                copy(layer.linear1, f"{p}.ffn.fc1")
                copy(layer.linear2, f"{p}.ffn.fc2")
                copy(layer.norm1, f"{p}.norm1")
                copy(layer.norm2, f"{p}.norm2")
                copy(layer.norm3, f"{p}.norm3")
        self.encoder_norm = self.decoder_norm = None
        if norm_first:
            self.encoder_norm = nn.LayerNorm(d, eps=common["layer_norm_eps"])
            self.decoder_norm = nn.LayerNorm(d, eps=common["layer_norm_eps"])
            with torch.no_grad():
                copy(self.encoder_norm, "encoder.norm")
                copy(self.decoder_norm, "decoder.norm")

        sharing = c.get("share_embeddings", "all")
        if sharing == "all":
            self.src_embed = self.tgt_embed = self.out_weight = params["embed.weight"]  # [V, D]
        elif sharing == "target":
            self.src_embed, self.tgt_embed = params["src_embed.weight"], params["tgt_embed.weight"]
            self.out_weight = self.tgt_embed
        else:
            self.src_embed, self.tgt_embed = params["src_embed.weight"], params["tgt_embed.weight"]
            self.out_weight = params["out_proj.weight"]
        self.out_bias = params.get("out_proj.bias") if c.get("output_bias", False) else None
        self.positions = sinusoids(c.get("max_positions", 1024) + c.get("position_offset", 0), d,
                                   c.get("sinusoid_layout", "interleaved"))
        self.embed_scale = math.sqrt(d) if c.get("scale_embeddings", True) else 1.0
        self.eval()

    def make_batch(self, sources, targets):
        """Padded id tensors: src [B, S] (+eos), tgt_in [B, T] (bos + target), tgt_out [B, T]."""
        c = self.c
        pad, bos, eos = c.get("pad_id", 0), c.get("bos_id", 1), c.get("eos_id", 2)
        append_eos = c.get("src_append_eos", True)
        src_rows = [s + [eos] if append_eos else list(s) for s in sources]
        s_len = max(len(s) for s in src_rows)
        t_len = max(len(t) for t in targets) + 1
        src = torch.full((len(sources), s_len), pad, dtype=torch.long)
        tgt_in = torch.full((len(targets), t_len), pad, dtype=torch.long)
        tgt_out = torch.full((len(targets), t_len), pad, dtype=torch.long)
        src_valid = torch.zeros(len(sources), s_len, dtype=torch.bool)
        tgt_valid = torch.zeros(len(targets), t_len, dtype=torch.bool)
        for b, (s, t) in enumerate(zip(src_rows, targets)):
            src[b, : len(s)] = torch.tensor(s)
            src_valid[b, : len(s)] = True
            tgt_in[b, : len(t) + 1] = torch.tensor([bos] + t)
            tgt_out[b, : len(t) + 1] = torch.tensor(t + [eos])
            tgt_valid[b, : len(t) + 1] = True
        return src, src_valid, tgt_in, tgt_out, tgt_valid

    def embed(self, table, ids):
        offset = self.c.get("position_offset", 0)
        return table[ids] * self.embed_scale + self.positions[offset: offset + ids.shape[1]]  # [B, L, D]

    def encode(self, src, src_valid):
        x = self.embed(self.src_embed, src)  # [B, S, D]
        src_padding = ~src_valid  # [B, S] True = padding key
        for layer in self.encoder_layers:
            x = layer(x, src_key_padding_mask=src_padding)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def decode(self, memory, src_valid, tgt_in, tgt_valid):
        t = tgt_in.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)  # [T, T]
        x = self.embed(self.tgt_embed, tgt_in)  # [B, T, D]
        for layer in self.decoder_layers:
            x = layer(x, memory, tgt_mask=causal, tgt_key_padding_mask=~tgt_valid,
                      memory_key_padding_mask=~src_valid)
        return self.decoder_norm(x) if self.decoder_norm is not None else x

    def project(self, states, tgt_out, tgt_valid):
        """log p(tgt_out) at each position, 0 at padding: [B, T]."""
        logits = F.linear(states, self.out_weight, self.out_bias)  # [B, T, V]
        logprobs = F.log_softmax(logits, dim=-1)
        picked = logprobs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)  # [B, T]
        return picked.masked_fill(~tgt_valid, 0.0)

    def forward(self, src, src_valid, tgt_in, tgt_out, tgt_valid):
        memory = self.encode(src, src_valid)
        return self.project(self.decode(memory, src_valid, tgt_in, tgt_valid), tgt_out, tgt_valid)


def score_flops(c, batch, s, t):
    """Same count as score_bench.cpp's score_flops (matrix products only, 2 per MAC)."""
    d, f, v = c["d_model"], c["d_ff"], c["tgt_vocab_size"]
    enc = 2 * batch * s * 4 * d * d + 4 * batch * s * s * d + 2 * batch * s * 2 * d * f
    dec = (2 * batch * t * 4 * d * d + 4 * batch * t * t * d + 2 * batch * t * 2 * d * d
           + 2 * batch * s * 2 * d * d + 4 * batch * t * s * d + 2 * batch * t * 2 * d * f)
    return c["encoder_layers"] * enc + c["decoder_layers"] * dec + 2 * batch * t * d * v


def gemm_peak(c, rows):
    """Best GFLOP/s of torch's F.linear on the model's own GEMM shapes, measured in this run."""
    best = 0.0
    for m, n, k in [(rows, c["d_ff"], c["d_model"]), (rows, c["d_model"], c["d_ff"]),
                    (rows, c["tgt_vocab_size"], c["d_model"])]:
        a = torch.full((m, k), 0.01)  # [m, k]
        w = torch.full((n, k), 0.02)  # [n, k]
        _, seconds = time_median(1, 5, lambda: F.linear(a, w))
        best = max(best, 2.0 * m * n * k / min(seconds) / 1e9)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", required=True, help="directory written by score_bench")
    ap.add_argument("--repeats", type=int, default=10, help="timed repetitions after warm-up")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions first")
    ap.add_argument("--phase-repeats", type=int, default=3, help="repetitions for the phase split (0 = off)")
    ap.add_argument("--show-totals", type=int, default=3, help="per-sentence totals to print")
    args = ap.parse_args()

    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)

    load_start = time.perf_counter()
    params, metadata = read_safetensors(os.path.join(args.work_dir, "model.safetensors"))
    config = json.loads(metadata["config"])
    sources = bench_util.read_ids(os.path.join(args.work_dir, "source.ids"))
    targets = bench_util.read_ids(os.path.join(args.work_dir, "target.ids"))
    with torch.inference_mode():
        model = Scorer(config, params)
        src, src_valid, tgt_in, tgt_out, tgt_valid = model.make_batch(sources, targets)
        load_seconds = time.perf_counter() - load_start

        result = {}
        def score():
            result["logprobs"] = model(src, src_valid, tgt_in, tgt_out, tgt_valid)  # [B, T]
        median_s, seconds = time_median(args.warmup, args.repeats, score)
        logprobs = result["logprobs"].double()
        totals = logprobs.sum(dim=1)[: args.show_totals].tolist()
        target_tokens = int(tgt_valid.sum())

        phases = None
        if args.phase_repeats > 0:
            memory = model.encode(src, src_valid)
            encoder_s, _ = time_median(0, args.phase_repeats, lambda: model.encode(src, src_valid))
            decoder_s, _ = time_median(0, args.phase_repeats,
                                       lambda: model.decode(memory, src_valid, tgt_in, tgt_valid))
            phases = {"encoder_s": encoder_s, "decoder_s": decoder_s,
                      "projection_s": max(0.0, median_s - encoder_s - decoder_s)}
        rss_mib = bench_util.peak_rss_mib()  # before the GEMM probe
        peak = gemm_peak(config, src.shape[0] * tgt_in.shape[1])

    flops = score_flops(config, src.shape[0], src.shape[1], tgt_in.shape[1])
    achieved = flops / median_s / 1e9
    print(json.dumps({
        "impl": f"pytorch-{torch.__version__}",
        "threads": torch.get_num_threads(),
        "batch": src.shape[0], "src_len": src.shape[1], "tgt_len": tgt_in.shape[1],
        "target_tokens": target_tokens, "warmup": args.warmup, "repeats": args.repeats,
        "median_s": median_s, "min_s": min(seconds), "tokens_per_s": target_tokens / median_s,
        "peak_rss_mib": rss_mib, "load_s": load_seconds,
        "gflop": flops / 1e9, "gflops": achieved, "gemm_peak_gflops": peak, "mfu": achieved / peak,
        "phases": phases, "blas": loaded_blas(), "totals": totals,
    }, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
