#!/usr/bin/python3
"""The PyTorch peers of bench/decode_bench.cpp (docs/performance.md, "How we measure"): greedy and beam decoding of the
same model file on the same sources, every output forced to the same length, float32, inference
mode, the same thread count. Two implementations (--impl):

  nn-transformer  greedy with the stock nn.Transformer as shipped: the encoder once, then at every
                  step the decoder stack re-run on the whole prefix (no cache) and the last
                  position projected — the loop of PyTorch's own tutorials, what most users write.
  cached          a KV-cached loop on torch.nn.functional, what a careful user writes: the stock
                  nn.TransformerEncoder (its fused inference fast path) for the encoder; per
                  decoder layer the self-attention keys/values of past positions kept in
                  preallocated [rows, heads, out_len, head_dim] buffers and only the new position
                  computed, cross-attention keys/values computed once from the encoder output;
                  greedy (--beam 1) or beam search (--beam K: cumulative log-probabilities, top K
                  of K·V per sentence, caches reordered with index_select).

Weights come from our safetensors file (parsed by hand with numpy, as score_peer.py does) and are
mapped onto both implementations: post-norm (or pre-norm), relu (or gelu), one shared embedding
× sqrt(d_model) + sinusoidal positions, tied output projection, eos appended to the sources, the
decoder starting from bos. nn.Transformer's extra final LayerNorms are removed for post-norm
models (ours has none), so both sides compute the same function.

The length rule matches decode_bench: eos is masked out until --out-len tokens and decoding
stops at --out-len tokens, so every sentence gets exactly --out-len tokens.

Prints one JSON line with the same fields as decode_bench, including the generated tokens and
their total log-probability per sentence (the cross-check against ours).

Run: /usr/bin/python3 bench/decode_peer.py --work-dir DIR --impl cached --beam 4
     (DIR written by decode_bench --prepare-only)
"""
import argparse
import json
import math
import os
import resource
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import bench_util
from bench_util import loaded_blas, read_safetensors, time_median


def sinusoids(positions, d, layout):
    """[positions, d] float32 position encodings, computed in float64 as the C++ side does."""
    pos = np.arange(positions, dtype=np.float64)[:, None]
    table = np.zeros((positions, d), dtype=np.float64)
    if layout == "interleaved":  # the paper's: sin on even, cos on odd dimensions
        angle = pos / np.power(10000.0, np.arange(0, d, 2, dtype=np.float64) / d)
        table[:, 0::2] = np.sin(angle)
        table[:, 1::2] = np.cos(angle[:, : d // 2])
    else:  # concat: all sines, then all cosines (tensor2tensor)
        half = d // 2
        angle = pos * np.exp(-np.arange(half) * math.log(10000.0) / (half - 1))
        table[:, :half] = np.sin(angle)
        table[:, half:] = np.cos(angle)
    return torch.from_numpy(table.astype(np.float32))


class Model:
    """The model of docs/model-file.md from our parameters: embeddings, a stock encoder, and the decoder
    both as stock nn.TransformerDecoder layers (no-cache peer) and as raw tensors (cached peer)."""

    def __init__(self, config, params):
        c = config
        for bad, key in [(c.get("position_encoding", "sinusoidal") != "sinusoidal", "position_encoding"),
                         (c.get("self_attention_window") is not None, "self_attention_window")]:
            if bad:
                sys.exit(f"error: decode_peer.py does not implement {key}={c.get(key)!r}")
        self.c, self.p = c, params
        self.d, self.heads = c["d_model"], c["heads"]
        self.pre_norm = c.get("norm", "post") == "pre"
        self.eps = c.get("layer_norm_eps", 1e-5)
        self.activation = F.relu if c.get("activation", "relu") == "relu" else F.gelu
        self.pad, self.bos, self.eos = c.get("pad_id", 0), c.get("bos_id", 1), c.get("eos_id", 2)
        sharing = c.get("share_embeddings", "all")
        if sharing == "all":
            self.src_embed = self.tgt_embed = self.out_weight = params["embed.weight"]  # [V, D]
        else:
            self.src_embed, self.tgt_embed = params["src_embed.weight"], params["tgt_embed.weight"]
            self.out_weight = self.tgt_embed if sharing == "target" else params["out_proj.weight"]
        self.out_bias = params.get("out_proj.bias") if c.get("output_bias", False) else None
        self.offset = c.get("position_offset", 0)
        self.positions = sinusoids(c.get("max_positions", 1024) + self.offset, self.d,
                                   c.get("sinusoid_layout", "interleaved"))  # [P, D]
        self.scale = math.sqrt(self.d) if c.get("scale_embeddings", True) else 1.0

        self.transformer = nn.Transformer(
            d_model=self.d, nhead=self.heads, num_encoder_layers=c["encoder_layers"],
            num_decoder_layers=c["decoder_layers"], dim_feedforward=c["d_ff"], dropout=0.0,
            activation=c.get("activation", "relu"), layer_norm_eps=self.eps, batch_first=True,
            norm_first=self.pre_norm)
        self._load_transformer()
        self.transformer.eval()

    def _load_transformer(self):
        p, t = self.p, self.transformer

        def attention(module, prefix):
            module.in_proj_weight.copy_(torch.cat([p[f"{prefix}.{x}.weight"] for x in "qkv"]))  # [3D, D]
            module.in_proj_bias.copy_(torch.cat([p[f"{prefix}.{x}.bias"] for x in "qkv"]))  # [3D]
            module.out_proj.weight.copy_(p[f"{prefix}.o.weight"])
            module.out_proj.bias.copy_(p[f"{prefix}.o.bias"])

        def copy(module, prefix):
            module.weight.copy_(p[f"{prefix}.weight"])
            module.bias.copy_(p[f"{prefix}.bias"])

        with torch.no_grad():
            for i, layer in enumerate(t.encoder.layers):
                attention(layer.self_attn, f"encoder.layers.{i}.self_attn")
                copy(layer.linear1, f"encoder.layers.{i}.ffn.fc1")
                copy(layer.linear2, f"encoder.layers.{i}.ffn.fc2")
                copy(layer.norm1, f"encoder.layers.{i}.norm1")
                copy(layer.norm2, f"encoder.layers.{i}.norm2")
            for i, layer in enumerate(t.decoder.layers):
                prefix = f"decoder.layers.{i}"
                attention(layer.self_attn, f"{prefix}.self_attn")
                attention(layer.multihead_attn, f"{prefix}.cross_attn")
                copy(layer.linear1, f"{prefix}.ffn.fc1")
                copy(layer.linear2, f"{prefix}.ffn.fc2")
                copy(layer.norm1, f"{prefix}.norm1")
                copy(layer.norm2, f"{prefix}.norm2")
                copy(layer.norm3, f"{prefix}.norm3")
            if self.pre_norm:  # our pre-norm stacks end with a LayerNorm, as nn.Transformer's do
                copy(t.encoder.norm, "encoder.norm")
                copy(t.decoder.norm, "decoder.norm")
        if not self.pre_norm:  # nn.Transformer always adds a final LayerNorm; ours has none
            t.encoder.norm = None
            t.decoder.norm = None

    def source_batch(self, sources):
        """src [B, S] (+ eos), src_padding [B, S] (True = padding)."""
        rows = [s + [self.eos] if self.c.get("src_append_eos", True) else list(s) for s in sources]
        length = max(len(r) for r in rows)
        src = torch.full((len(rows), length), self.pad, dtype=torch.long)
        padding = torch.ones(len(rows), length, dtype=torch.bool)
        for b, r in enumerate(rows):
            src[b, : len(r)] = torch.tensor(r)
            padding[b, : len(r)] = False
        return src, padding

    def embed(self, table, ids, start=0):
        """ids [B, L] at positions start..start+L → [B, L, D]."""
        first = self.offset + start
        return table[ids] * self.scale + self.positions[first: first + ids.shape[1]]

    def encode(self, src, padding):
        return self.transformer.encoder(self.embed(self.src_embed, src), src_key_padding_mask=padding)

    def logprobs(self, states):
        """states [N, D] → log p(next token) [N, V]."""
        return F.log_softmax(F.linear(states, self.out_weight, self.out_bias), dim=-1)


def greedy_no_cache(model, src, padding, out_len):
    """nn.Transformer as shipped: re-run the decoder on the whole prefix at every step."""
    memory = model.encode(src, padding)  # [B, S, D]
    batch = src.shape[0]
    ys = torch.full((batch, 1), model.bos, dtype=torch.long)  # [B, 1 + t]
    total = torch.zeros(batch, dtype=torch.float64)
    causal = nn.Transformer.generate_square_subsequent_mask(out_len)  # [T, T]
    for t in range(out_len):
        states = model.transformer.decoder(model.embed(model.tgt_embed, ys), memory,
                                           tgt_mask=causal[: t + 1, : t + 1],
                                           memory_key_padding_mask=padding)  # [B, t + 1, D]
        logp = model.logprobs(states[:, -1])  # [B, V]
        logp[:, model.eos] = -math.inf  # eos is forbidden before out_len tokens
        best, token = logp.max(dim=-1)
        total += best.double()
        ys = torch.cat([ys, token.unsqueeze(1)], dim=1)
    return ys[:, 1:], total


class CachedDecoder:
    """The decoder as raw tensors, one new position per call, with self-attention keys/values
    of past positions in preallocated caches and cross-attention keys/values computed once."""

    def __init__(self, model):
        self.m = model
        p, d = model.p, model.d
        self.layers = []
        for i in range(model.c["decoder_layers"]):
            prefix = f"decoder.layers.{i}"
            w = lambda name: p[f"{prefix}.{name}"]
            self.layers.append({
                "qkv_w": torch.cat([w(f"self_attn.{x}.weight") for x in "qkv"]).contiguous(),  # [3D, D]
                "qkv_b": torch.cat([w(f"self_attn.{x}.bias") for x in "qkv"]).contiguous(),  # [3D]
                "self_o_w": w("self_attn.o.weight"), "self_o_b": w("self_attn.o.bias"),
                "cross_q_w": w("cross_attn.q.weight"), "cross_q_b": w("cross_attn.q.bias"),
                "kv_w": torch.cat([w(f"cross_attn.{x}.weight") for x in "kv"]).contiguous(),  # [2D, D]
                "kv_b": torch.cat([w(f"cross_attn.{x}.bias") for x in "kv"]).contiguous(),  # [2D]
                "cross_o_w": w("cross_attn.o.weight"), "cross_o_b": w("cross_attn.o.bias"),
                "fc1_w": w("ffn.fc1.weight"), "fc1_b": w("ffn.fc1.bias"),
                "fc2_w": w("ffn.fc2.weight"), "fc2_b": w("ffn.fc2.bias"),
                "norms": [(w(f"norm{j}.weight"), w(f"norm{j}.bias")) for j in (1, 2, 3)],
            })
        self.final_norm = ((p["decoder.norm.weight"], p["decoder.norm.bias"])
                           if model.pre_norm else None)

    def start(self, memory, padding, max_len):
        """memory [B, S, D]: cross keys/values per layer, empty self caches for B rows."""
        m = self.m
        batch, src_len, d = memory.shape
        h, hd = m.heads, d // m.heads
        self.cross = []
        for lw in self.layers:
            kv = F.linear(memory, lw["kv_w"], lw["kv_b"])  # [B, S, 2D]
            k, v = kv.view(batch, src_len, 2, h, hd).permute(2, 0, 3, 1, 4)  # 2 × [B, H, S, hd]
            self.cross.append((k, v))
        # Additive key mask [B, 1, 1, S], or None when no source is padded.
        self.cross_mask = (padding.float().masked_fill(padding, -math.inf).view(batch, 1, 1, src_len)
                           if bool(padding.any()) else None)
        self.self_k = [torch.empty(batch, h, max_len, hd) for _ in self.layers]  # [N, H, T, hd]
        self.self_v = [torch.empty(batch, h, max_len, hd) for _ in self.layers]
        self.t = 0

    def expand(self, times):
        """Each row becomes `times` consecutive rows (after the first beam step)."""
        self.cross = [(k.repeat_interleave(times, 0), v.repeat_interleave(times, 0)) for k, v in self.cross]
        if self.cross_mask is not None:
            self.cross_mask = self.cross_mask.repeat_interleave(times, 0)

    def reorder(self, parents):
        """Keep rows `parents` [N'] of the self-attention caches: index_select of each whole
        preallocated buffer, as Hugging Face's StaticCache reorders its beams."""
        for cache in (self.self_k, self.self_v):
            for i, buf in enumerate(cache):
                cache[i] = buf.index_select(0, parents)

    def _norm(self, x, weight_bias):
        return F.layer_norm(x, (self.m.d,), weight_bias[0], weight_bias[1], self.m.eps)

    def _sublayer(self, x, norm, fn):
        if self.m.pre_norm:
            return x + fn(self._norm(x, norm))
        return self._norm(x + fn(x), norm)

    def step(self, tokens):
        """tokens [N] at position t → log p(next token) [N, V]."""
        m, t = self.m, self.t
        n, d, h = tokens.shape[0], m.d, m.heads
        hd = d // h
        x = m.embed(m.tgt_embed, tokens.view(n, 1), start=t).view(n, d)  # [N, D]
        for lw, (cross_k, cross_v), cache_k, cache_v in zip(self.layers, self.cross, self.self_k, self.self_v):
            def self_attention(y):
                q, k, v = F.linear(y, lw["qkv_w"], lw["qkv_b"]).view(n, 3, h, hd).unbind(1)  # [N, H, hd]
                cache_k[:, :, t] = k
                cache_v[:, :, t] = v
                scores = torch.matmul(q.unsqueeze(2), cache_k[:, :, : t + 1].transpose(2, 3))  # [N, H, 1, t+1]
                probs = torch.softmax(scores / math.sqrt(hd), dim=-1)
                context = torch.matmul(probs, cache_v[:, :, : t + 1]).view(n, d)  # [N, D]
                return F.linear(context, lw["self_o_w"], lw["self_o_b"])

            def cross_attention(y):
                q = F.linear(y, lw["cross_q_w"], lw["cross_q_b"]).view(n, h, 1, hd)  # [N, H, 1, hd]
                scores = torch.matmul(q, cross_k.transpose(2, 3)) / math.sqrt(hd)  # [N, H, 1, S]
                if self.cross_mask is not None:
                    scores = scores + self.cross_mask
                context = torch.matmul(torch.softmax(scores, dim=-1), cross_v).view(n, d)  # [N, D]
                return F.linear(context, lw["cross_o_w"], lw["cross_o_b"])

            def feed_forward(y):
                return F.linear(m.activation(F.linear(y, lw["fc1_w"], lw["fc1_b"])), lw["fc2_w"], lw["fc2_b"])

            x = self._sublayer(x, lw["norms"][0], self_attention)
            x = self._sublayer(x, lw["norms"][1], cross_attention)
            x = self._sublayer(x, lw["norms"][2], feed_forward)
        if self.final_norm is not None:
            x = self._norm(x, self.final_norm)
        self.t += 1
        return m.logprobs(x)


def search_cached(model, decoder, src, padding, out_len, beam):
    """Greedy (beam 1) or beam search with the cached decoder; returns (tokens [B, out_len],
    total log-probability [B]) of each sentence's best hypothesis."""
    memory = model.encode(src, padding)  # [B, S, D]
    batch, vocab = src.shape[0], model.out_weight.shape[0]
    decoder.start(memory, padding, out_len)
    tokens = torch.full((batch,), model.bos, dtype=torch.long)  # [N] the last token of each row
    if beam == 1:
        out = torch.empty(batch, out_len, dtype=torch.long)
        total = torch.zeros(batch, dtype=torch.float64)
        for t in range(out_len):
            logp = decoder.step(tokens)  # [B, V]
            logp[:, model.eos] = -math.inf  # eos is forbidden before out_len tokens
            best, tokens = logp.max(dim=-1)
            total += best.double()
            out[:, t] = tokens
        return out, total

    history = torch.empty(batch, 0, dtype=torch.long)  # [N, t]
    cumulative = torch.zeros(batch, 1)  # [B, k] log p of each live hypothesis
    rows = torch.arange(batch).unsqueeze(1)  # [B, 1]
    for t in range(out_len):
        logp = decoder.step(tokens)  # [B·k, V]
        logp[:, model.eos] = -math.inf
        k = cumulative.shape[1]
        candidates = (cumulative.unsqueeze(2) + logp.view(batch, k, vocab)).view(batch, k * vocab)
        cumulative, index = candidates.topk(beam, dim=1)  # [B, beam], best first
        parents = (rows * k + torch.div(index, vocab, rounding_mode="floor")).view(-1)  # [B·beam]
        tokens = (index % vocab).view(-1)
        history = torch.cat([history.index_select(0, parents), tokens.unsqueeze(1)], dim=1)
        if t + 1 == out_len:
            break
        if t == 0:
            decoder.expand(beam)
        decoder.reorder(parents)
    best = history.view(batch, beam, out_len)[:, 0]
    return best, cumulative[:, 0].double()


def search_flops(c, batch, src_len, out_len, beam):
    """Same count as decode_bench.cpp's search_flops: the useful work of a KV-cached search."""
    d, f, v = c["d_model"], c["d_ff"], c["tgt_vocab_size"]
    rows = batch * src_len
    total = c["encoder_layers"] * (2 * rows * 4 * d * d + 4 * batch * src_len * src_len * d + 2 * rows * 2 * d * f)
    total += c["decoder_layers"] * 2 * rows * 2 * d * d
    for t in range(out_len):
        n = batch if t == 0 else batch * beam
        layer = (2 * n * 4 * d * d + 4 * n * (t + 1) * d + 2 * n * 2 * d * d + 4 * n * src_len * d
                 + 2 * n * 2 * d * f)
        total += c["decoder_layers"] * layer + 2 * n * d * v
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", required=True, help="directory written by decode_bench --prepare-only")
    ap.add_argument("--impl", choices=["nn-transformer", "cached"], required=True)
    ap.add_argument("--beam", type=int, default=1, help="1: greedy (the only choice for nn-transformer)")
    ap.add_argument("--out-len", type=int, default=32, help="generated tokens per sentence")
    ap.add_argument("--repeats", type=int, default=5, help="timed decodes after warm-up")
    ap.add_argument("--warmup", type=int, default=1, help="untimed decodes first")
    ap.add_argument("--warmup-len", type=int, default=0,
                    help="tokens per warm-up decode (default: --out-len; fewer for the slow no-cache peer)")
    ap.add_argument("--gemm-size", type=int, default=2048, help="side of the square GEMM for the peak")
    args = ap.parse_args()
    if args.beam < 1 or (args.impl == "nn-transformer" and args.beam != 1):
        ap.error("--beam must be 1 for nn-transformer and at least 1 for cached")

    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    # The stock encoder's fast path with a padding mask says nested tensors are a prototype.
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")

    load_start = time.perf_counter()
    params, metadata = read_safetensors(os.path.join(args.work_dir, "model.safetensors"))
    config = json.loads(metadata["config"])
    sources = bench_util.read_ids(os.path.join(args.work_dir, "source.ids"), skip_blank=True)
    with torch.inference_mode():
        model = Model(config, params)
        src, padding = model.source_batch(sources)
        if args.impl == "nn-transformer":
            decode = lambda length: greedy_no_cache(model, src, padding, length)
        else:
            decoder = CachedDecoder(model)
            decode = lambda length: search_cached(model, decoder, src, padding, length, args.beam)
        load_seconds = time.perf_counter() - load_start

        for _ in range(args.warmup):
            decode(args.warmup_len or args.out_len)
        result = {}

        def run():
            result["tokens"], result["totals"] = decode(args.out_len)
        median_s, seconds = time_median(0, args.repeats, run)
        rss_mib = bench_util.peak_rss_mib()  # before the GEMM probe
        peak = bench_util.square_gemm_peak(args.gemm_size)

    tokens = result["tokens"]
    generated = tokens.numel()
    flops = search_flops(config, src.shape[0], src.shape[1], args.out_len, args.beam)
    achieved = flops / median_s / 1e9
    print(json.dumps({
        "impl": f"pytorch-{torch.__version__}", "side": f"{args.impl}-{'greedy' if args.beam == 1 else 'beam'}",
        "threads": torch.get_num_threads(), "beam": args.beam,
        "batch": src.shape[0], "src_len": src.shape[1], "out_len": args.out_len,
        "target_tokens": generated, "warmup": args.warmup, "warmup_len": args.warmup_len or args.out_len,
        "repeats": args.repeats,
        "median_s": median_s, "min_s": min(seconds), "run_s": seconds,
        "tokens_per_s": generated / median_s, "peak_rss_mib": rss_mib, "load_s": load_seconds,
        "gflop": flops / 1e9, "gflops": achieved, "gemm_size": args.gemm_size,
        "gemm_peak_gflops": peak, "mfu": achieved / peak, "phases": None,
        "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),  # user + system
        "blas": loaded_blas(),
        "outputs": tokens.tolist(), "logprobs": result["totals"].tolist(),
    }, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
