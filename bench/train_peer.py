#!/usr/bin/python3
"""The PyTorch peer of bench/train_bench.cpp (docs/performance.md, "How we measure"): the same training step of the same
model shape on the same batch shape, written the way a careful PyTorch user would: the stock
nn.Transformer (post-norm, relu, batch_first), one nn.Embedding shared by source, target and the
output projection (scaled by sqrt(d_model), N(0, d^-1/2) initialisation as usual when tying),
sinusoidal positions with dropout, a causal target mask, F.cross_entropy with label smoothing,
torch.optim.Adam (0.9, 0.98, 1e-9) under the paper's learning-rate schedule, float32, the same
thread count, warm-up and number of timed steps.

Dropout sites match train_bench's tfm::DropoutOptions (dropout 0.1 on the embedding sums and on
every sublayer output before the residual add; attention_dropout 0 and relu_dropout 0), so both
sides draw the same masks' worth of random numbers: nn.Transformer(dropout=0.1) would also drop
attention weights and the feed-forward hidden layer, so those two dropouts are set to 0 after
construction, the way a user reproducing the paper's P_drop would (--stock-dropout keeps them).

Differences it cannot avoid: nn.Transformer always adds a final LayerNorm after the encoder and
after the decoder stacks (two extra layer norms, negligible work), and its own initialisation
and random ids (the loss values are a sanity check, not a cross-check).

Prints one JSON line with the same fields as train_bench; its phases (zero_grad / forward /
backward / optimizer) are timed around each call of every timed step.

On a GPU (--device cuda) the step is timed to its end (torch.cuda.synchronize) and
--autocast bfloat16 runs forward and loss under torch.autocast in bfloat16, the way PyTorch
users train in mixed precision (float32 weights and Adam): the peer of train_bench's
--compute-type bfloat16. Adam is then PyTorch's fused one (fused=True: one kernel over every
parameter, as ours), and the decoder is told its mask is causal (tgt_is_causal) rather than
comparing it with a causal one on every step. --compile runs the model's forward through
torch.compile (its default mode; the backward is compiled with it), compiled during the
warm-up steps, which then take far longer than the timed ones; without tgt_is_causal that
comparison broke its graph in two (a host sync), and it ran no faster than eager.

--batches-file runs the batches train_bench --batch-tokens ... --write-batches wrote (varied
lengths), a step being a pass over them: each padded to its longest source and target, the
padding masked as nn.Transformer takes it (src_key_padding_mask, tgt_key_padding_mask,
memory_key_padding_mask) and left out of the loss (ignore_index), an optimizer step a batch.

Run: /usr/bin/python3 bench/train_peer.py [--steps 5] [--warmup 2] [--device cuda]
     [--autocast bfloat16] [--compile] [--batches-file FILE]
"""
import argparse
import json
import math
import os
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import bench_util
from bench_util import loaded_blas, time_median

D_MODEL, HEADS, D_FF, LAYERS, PAD, BOS, EOS = 512, 8, 2048, 6, 0, 1, 2


def sinusoids(length, d):
    """[length, d] encodings of the paper: sin on even, cos on odd dimensions."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # [L, 1]
    rate = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))  # [d/2]
    table = torch.zeros(length, d)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table


class Seq2Seq(nn.Module):
    def __init__(self, vocab, dropout, stock_dropout):
        super().__init__()
        self.embedding = nn.Embedding(vocab, D_MODEL)  # [V, D], shared everywhere
        nn.init.normal_(self.embedding.weight, std=D_MODEL ** -0.5)
        self.scale = math.sqrt(D_MODEL)
        self.register_buffer("positions", sinusoids(1024, D_MODEL), persistent=False)  # [1024, D]
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model=D_MODEL, nhead=HEADS, num_encoder_layers=LAYERS, num_decoder_layers=LAYERS,
            dim_feedforward=D_FF, dropout=dropout, batch_first=True)
        if not stock_dropout:  # keep only the paper's residual dropouts, as train_bench does
            for layer in self.transformer.encoder.layers:
                layer.dropout.p = 0.0          # feed-forward hidden layer (relu dropout)
                layer.self_attn.dropout = 0.0  # attention weights
            for layer in self.transformer.decoder.layers:
                layer.dropout.p = 0.0
                layer.self_attn.dropout = 0.0
                layer.multihead_attn.dropout = 0.0

    def embed(self, ids):
        return self.dropout(self.embedding(ids) * self.scale + self.positions[: ids.shape[1]])  # [B, L, D]

    def forward(self, src, tgt_in, causal, src_pad=None, tgt_pad=None):
        # tgt_is_causal says what the mask is: without it the decoder compares the mask with a causal
        # one on every call (a host sync, and a graph break under torch.compile); src_pad, tgt_pad:
        # [B, S], [B, T], True at padding (varied lengths), or None
        states = self.transformer(self.embed(src), self.embed(tgt_in), tgt_mask=causal,
                                  tgt_is_causal=True, src_key_padding_mask=src_pad,
                                  tgt_key_padding_mask=tgt_pad,
                                  memory_key_padding_mask=src_pad)  # [B, T, D]
        return F.linear(states, self.embedding.weight)  # [B, T, V], tied output projection


def forward_flops(batch, s, t, vocab):
    """Same count as train_bench.cpp's forward_flops (matrix products only, 2 per MAC)."""
    d, f = D_MODEL, D_FF
    enc = 2 * batch * s * 4 * d * d + 4 * batch * s * s * d + 2 * batch * s * 2 * d * f
    dec = (2 * batch * t * 4 * d * d + 4 * batch * t * t * d + 2 * batch * t * 2 * d * d
           + 2 * batch * s * 2 * d * d + 4 * batch * t * s * d + 2 * batch * t * 2 * d * f)
    return LAYERS * enc + LAYERS * dec + 2 * batch * t * d * vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps after warm-up")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=64, help="sentence pairs")
    ap.add_argument("--src-len", type=int, default=31, help="raw source tokens (eos appended)")
    ap.add_argument("--tgt-len", type=int, default=31, help="raw target tokens (bos / eos added)")
    ap.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size")
    ap.add_argument("--gemm-size", type=int, default=2048, help="side of the square GEMM for the peak")
    ap.add_argument("--stock-dropout", action="store_true",
                    help="keep nn.Transformer's attention and feed-forward dropout too (more work than ours)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--autocast", choices=["none", "bfloat16"], default="none",
                    help="forward and loss under torch.autocast in this type")
    ap.add_argument("--compile", action="store_true",
                    help="the model through torch.compile (default mode)")
    ap.add_argument("--batches-file",
                    help="a pass over these batches a step (train_bench --write-batches)")
    args = ap.parse_args()
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"

    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)

    setup_start = time.perf_counter()
    model = Seq2Seq(args.vocab, 0.1, args.stock_dropout).to(device)
    model.train()
    step_model = torch.compile(model) if args.compile else model
    warmup_steps = 4000
    # on a GPU the fused Adam (one kernel over every parameter, as ours) is PyTorch's fastest
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=on_gpu)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # the paper's rate; LambdaLR counts from 0
        optimizer, lambda i: D_MODEL ** -0.5 * min((i + 1) ** -0.5, (i + 1) * warmup_steps ** -1.5))

    def padded(rows, before, after):  # [B, longest + len(before) + len(after)], PAD after
        rows = [before + r + after for r in rows]
        longest = max(len(r) for r in rows)
        return torch.tensor([r + [PAD] * (longest - len(r)) for r in rows])

    # Each batch: (src, tgt_in, tgt_out, causal, src_pad, tgt_pad) on the device, the pads None
    # where a batch has no padding (the fixed batch).
    batches = []
    if args.batches_file:
        try:
            with open(args.batches_file) as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        pairs = json.loads(line)
                    except ValueError as e:
                        raise ValueError(f"line {number}: {e}")
                    if (not isinstance(pairs, dict) or not isinstance(pairs.get("src"), list) or
                            not pairs["src"] or not isinstance(pairs.get("tgt"), list) or
                            len(pairs["src"]) != len(pairs["tgt"]) or
                            any(not isinstance(ids, list) or not ids or
                                any(type(i) is not int or not 3 <= i < args.vocab for i in ids)
                                for ids in pairs["src"] + pairs["tgt"])):
                        raise ValueError(f"line {number}: not a batch of pairs of ids in [3, {args.vocab})")
                    src = padded(pairs["src"], [], [EOS])        # [B, S] source + eos
                    tgt_in = padded(pairs["tgt"], [BOS], [])     # [B, T] bos + target
                    tgt_out = padded(pairs["tgt"], [], [EOS])    # [B, T] target + eos
                    batches.append((src, tgt_in, tgt_out, src == PAD, tgt_out == PAD))
        except (OSError, ValueError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
            raise SystemExit(f"error: --batches-file {args.batches_file}: {e}")
        if not batches:
            raise SystemExit(f"error: {args.batches_file} holds no batch")
    else:
        b = args.batch
        source = torch.randint(3, args.vocab, (b, args.src_len))  # raw ids, 0..2 = pad, bos, eos
        target = torch.randint(3, args.vocab, (b, args.tgt_len))
        src = torch.cat([source, torch.full((b, 1), EOS)], dim=1)     # [B, S] source + eos
        tgt_in = torch.cat([torch.full((b, 1), BOS), target], dim=1)   # [B, T] bos + target
        tgt_out = torch.cat([target, torch.full((b, 1), EOS)], dim=1)  # [B, T] target + eos
        batches.append((src, tgt_in, tgt_out, None, None))
    def causal_mask(length, padded):  # [T, T]: float -inf above the diagonal, or True there
        # beside boolean padding masks (one type for both, as nn.MultiheadAttention asks)
        if padded:
            return torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        return nn.Transformer.generate_square_subsequent_mask(length)

    batches = [(src.to(device), tgt_in.to(device), tgt_out.to(device),
                causal_mask(tgt_in.shape[1], src_pad is not None).to(device),
                None if src_pad is None else src_pad.to(device),
                None if tgt_pad is None else tgt_pad.to(device))
               for src, tgt_in, tgt_out, src_pad, tgt_pad in batches]
    target_tokens = sum(int((tgt_out != PAD).sum()) for _, _, tgt_out, _, _, _ in batches)
    source_tokens = sum(int((src != PAD).sum()) for src, _, _, _, _, _ in batches)
    setup_s = time.perf_counter() - setup_start

    losses = []
    parts = {"zero_grad_s": [], "forward_s": [], "backward_s": [], "optimizer_s": []}  # per step

    def train_step():  # a pass over the batches, an optimizer step each
        spent = [0.0] * 4
        for src, tgt_in, tgt_out, causal, src_pad, tgt_pad in batches:
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                enabled=args.autocast == "bfloat16"):
                logits = step_model(src, tgt_in, causal, src_pad, tgt_pad)  # [B, T, V]
                loss = F.cross_entropy(logits.reshape(-1, args.vocab), tgt_out.reshape(-1),
                                       ignore_index=PAD, label_smoothing=0.1)
            losses.append(loss.item())
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            optimizer.step()
            schedule.step()
            if on_gpu:
                torch.cuda.synchronize()
            t4 = time.perf_counter()
            for n, seconds in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                spent[n] += seconds
        for key, seconds in zip(parts, spent):
            parts[key].append(seconds)

    median_s, seconds = time_median(args.warmup, args.steps, train_step)
    rss = bench_util.peak_rss_mib()  # the training steps' peak, before the GEMM probe's buffers
    # Medians over the timed steps of each call: PyTorch's forward and backward are separate
    # calls, so unlike ours no extra forward-only run is needed.
    phases = {key: statistics.median(v[args.warmup:]) for key, v in parts.items()}

    flops = sum(3.0 * forward_flops(src.shape[0], src.shape[1], tgt_in.shape[1], args.vocab)
                for src, tgt_in, _, _, _, _ in batches)  # padded positions included, as ours
    first_src, first_tgt_in = batches[0][0], batches[0][1]
    peak = float("nan") if on_gpu else bench_util.square_gemm_peak(args.gemm_size)
    achieved = flops / median_s / 1e9
    print(json.dumps({
        "impl": f"pytorch-{torch.__version__}" + (" torch.compile" if args.compile else ""),
        "threads": torch.get_num_threads(), "compiled": args.compile,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": first_src.shape[0], "src_len": first_src.shape[1], "tgt_len": first_tgt_in.shape[1],
        "source_tokens": source_tokens, "target_tokens": target_tokens,
        "batches": len(batches),
        "batch_shapes": [[src.shape[0], src.shape[1], tgt_in.shape[1]]
                         for src, tgt_in, _, _, _, _ in batches],
        "warmup": args.warmup, "steps": args.steps,
        "median_s": median_s, "min_s": min(seconds), "step_s": seconds,
        "tokens_per_s": target_tokens / median_s, "peak_rss_mib": rss, "setup_s": setup_s,
        "gflop": flops / 1e9, "gflops": achieved, "gemm_size": args.gemm_size,
        "gemm_peak_gflops": peak, "mfu": achieved / peak, "phases": phases,
        "dropout_sites": "stock" if args.stock_dropout else "residual+embedding",
        "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),  # user + system
        "loss_first": losses[0], "loss_last": losses[-1], "blas": loaded_blas(),
        "device": str(device), "autocast": args.autocast,
        "gpu_memory_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if on_gpu else None,
        "gpu_memory_reserved_peak_mib":
            torch.cuda.max_memory_reserved() / 2**20 if on_gpu else None,
    }, sort_keys=True), flush=True)
    return 0 if math.isfinite(losses[-1]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
