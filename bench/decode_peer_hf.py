#!/usr/bin/python3
"""Hugging Face transformers' MarianMTModel.generate() as the decoding peer on a GPU: the model
most users of this field translate with from Python, built in the base model's shape (d 512,
6+6 layers, 8 heads, d_ff 2048, ReLU, one shared vocabulary of --vocab tokens, tied output
projection, sinusoidal positions, embeddings scaled by sqrt(d)) with random weights, in
bfloat16 (--dtype) on --device, greedy (--beam 1) or beam search, every output forced to
--out-len new tokens (min_new_tokens = max_new_tokens, no forced eos), so that both sides
generate the same number of tokens as bench/decode_bench does with its lengths forced.

Prints one JSON line: generated tokens/s, median seconds over --repeats after --warmup, and
the settings. Not a cross-check of outputs (random weights of another initialisation): the
work per token is the same shape on both sides.

Run: python3 bench/decode_peer_hf.py --batch 64 --beam 4 [--device cuda] [--dtype bfloat16]
"""
import argparse
import json
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64, help="sentences")
    ap.add_argument("--src-len", type=int, default=32, help="source tokens before eos")
    ap.add_argument("--out-len", type=int, default=32, help="new tokens per sentence")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=37000)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    import transformers
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(args.seed)
    pad, bos, eos = 0, 1, 2
    config = MarianConfig(
        vocab_size=args.vocab, decoder_vocab_size=args.vocab, d_model=512, encoder_layers=6,
        decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="relu",
        max_position_embeddings=1024, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=pad, eos_token_id=eos, bos_token_id=bos, decoder_start_token_id=bos,
        forced_eos_token_id=None)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = MarianMTModel(config).to(device=device, dtype=dtype).eval()

    source = torch.randint(3, args.vocab, (args.batch, args.src_len), device=device)
    source = torch.cat([source, torch.full((args.batch, 1), eos, device=device)], dim=1)
    mask = torch.ones_like(source)

    def run():
        with torch.inference_mode():
            out = model.generate(
                input_ids=source, attention_mask=mask, num_beams=args.beam, do_sample=False,
                min_new_tokens=args.out_len, max_new_tokens=args.out_len, early_stopping=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    for _ in range(args.warmup):
        run()
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = run()
        seconds.append(time.perf_counter() - start)
    generated = args.batch * args.out_len
    new_tokens = out.shape[1] - 1  # the decoder start token first
    median = statistics.median(seconds)
    print(json.dumps({
        "impl": f"transformers-{transformers.__version__} MarianMTModel.generate, "
                f"torch-{torch.__version__}",
        "device": str(device), "dtype": args.dtype, "batch": args.batch, "beam": args.beam,
        "src_len": args.src_len + 1, "out_len": args.out_len, "new_tokens_seen": int(new_tokens),
        "target_tokens": generated, "median_s": median, "run_s": seconds,
        "tokens_per_s": generated / median,
        "gpu_memory_peak_mib": torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda" else None,
    }, sort_keys=True), flush=True)
    return 0 if new_tokens == args.out_len else 1


if __name__ == "__main__":
    raise SystemExit(main())
