#!/usr/bin/python3
"""Decoding speed and memory against CTranslate2, both whole processes, in one run.

Why this file exists
    On CPUs the engine people deploy for translation is CTranslate2, usually in int8. README's
    claims about it are ratios measured here, in the same run on the same machine, never figures
    from elsewhere (docs/performance.md, "How we measure"). One random base model (Table 3: N=6, d_model 512, d_ff 2048,
    h 8; shared 8000-token vocabulary) is written once by `transformer init` and exported with
    `transformer export-ctranslate2`, in float32 and (as users deploy it) quantised to int8; the
    int8 export is read back with `transformer import-ctranslate2`, which keeps its int8 weights
    and row scales as they are, so both sides multiply the very same int8 weights. Then,
    for several rounds, alternating which side goes first, each case runs both command lines:
      ours:  transformer translate --compute-type float32|int8|int8_bfloat16 --beam 1|4
             (int8 and int8_bfloat16: the import)
      CT2:   bench/ct2_translate_peer.py --compute_type float32|int8 --beam_size 1|4 --intra_threads 2
             (ctranslate2.Translator.translate_batch from the wheel users install from PyPI,
             pinned in bench/peers.txt and installed outside the repository by bench/peers.sh)
    Our int8_bfloat16 (int8 products, the decoder's key/value cache in bfloat16) runs against
    CTranslate2's int8: CTranslate2 has no bfloat16 on CPUs (its mayiuse_bfloat16 is false for
    Device::CPU, so it refuses int8_bfloat16 there), and int8 is what its users deploy.
    on the same 32 sentences of 32 random tokens, every output forced to exactly 32 tokens on
    both sides (minimum = maximum length; length penalty 0), one batch of 32 sentences each.
    The time is the whole process (loading the model included; for CTranslate2 also starting
    Python and importing ctranslate2, reported beside it), the memory its peak resident set
    (os.wait4's ru_maxrss). It reports medians, CTranslate2 time / our time (> 1: ours faster),
    both peak RSS, and how many outputs are the same token sequences.

How to run
    bash scripts/build.sh
    python3 bench/ctranslate2_speed.py [--rounds 5] [--work-dir DIR] [--transformer BIN] [--peer-python PY]
    (the peers are installed on first use: bash bench/peers.sh)
    Writes bench/results/ctranslate2_speed.{md,json}. About 4 minutes on 2 cores.
"""

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from peer_python import peer_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "transformer")
RESULTS = os.path.join(ROOT, "bench", "results")
VOCAB = 8000
SENTENCES = 32
TOKENS = 32
THREADS = 2
CASES = [("float32", 1), ("float32", 4), ("int8", 1), ("int8", 4), ("int8_bfloat16", 1),
         ("int8_bfloat16", 4)]
# The compute type CTranslate2 runs against each of ours.
CT2_COMPUTE_TYPE = {"float32": "float32", "int8": "int8", "int8_bfloat16": "int8"}


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def fail(message):
    sys.exit("error: " + message)


def run_checked(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        fail("%s failed:\n%s" % (" ".join(cmd), result.stderr[-2000:]))


def timed(cmd, env, output):
    """Runs cmd to completion; returns (wall seconds, peak RSS MiB). Its stdout goes to output."""
    with open(output, "w") as out, open(output + ".err", "w") as err:
        start = time.perf_counter()
        process = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        with open(output + ".err") as err:
            fail("%s failed:\n%s" % (" ".join(cmd), err.read()[-2000:]))
    return seconds, usage.ru_maxrss / 1024.0


def prepare(work, seed):
    """Our model directories by compute type, the two CTranslate2 exports, and the source file."""
    ours = os.path.join(work, "model")
    os.makedirs(ours, exist_ok=True)
    tokens = ["<blank>", "<s>", "</s>", "<unk>"] + ["t%d" % i for i in range(4, VOCAB)]
    for side in ("source", "target"):
        with open(os.path.join(ours, side + "_vocabulary.txt"), "w") as f:
            f.write("\n".join(tokens) + "\n")
    run_checked([BIN, "init", "--preset", "base", "--vocab", str(VOCAB), "--seed", str(seed),
                 "--force", "-o", os.path.join(ours, "model.safetensors")])
    exports = {}
    for quantization in ("float32", "int8"):
        exports[quantization] = os.path.join(work, "ct2_" + quantization)
        run_checked([BIN, "export-ctranslate2", "--model", ours, "-o", exports[quantization],
                     "--quantization", quantization, "--force"])
    ours_int8 = os.path.join(work, "model_int8")
    shutil.rmtree(ours_int8, ignore_errors=True)
    run_checked([BIN, "import-ctranslate2", exports["int8"], "-o", ours_int8])
    rng = random.Random(seed)
    source = os.path.join(work, "source.txt")
    with open(source, "w") as f:
        for _ in range(SENTENCES):
            f.write(" ".join(tokens[rng.randrange(4, VOCAB)] for _ in range(TOKENS)) + "\n")
    return {"float32": ours, "int8": ours_int8, "int8_bfloat16": ours_int8}, exports, source


def commands(args, ours, exports, source, compute_type, beam):
    our_cmd = [BIN, "--threads", str(THREADS), "translate", "--model", ours[compute_type], "-i", source,
               "--beam", str(beam), "--alpha", "0", "--min-length", str(TOKENS),
               "--max-length-a", "0", "--max-length-b", str(TOKENS),
               "--batch-tokens", str(SENTENCES * (TOKENS + 1) * beam),
               "--compute-type", compute_type]
    ct2_type = CT2_COMPUTE_TYPE[compute_type]
    ct2_cmd = [args.peer_python, os.path.join(ROOT, "bench", "ct2_translate_peer.py"),
               "--model", exports[ct2_type],
               "--src", source, "--beam_size", str(beam), "--length_penalty", "0",
               "--min_decoding_length", str(TOKENS), "--max_decoding_length", str(TOKENS),
               "--batch_size", str(SENTENCES), "--intra_threads", str(THREADS),
               "--inter_threads", "1", "--compute_type", ct2_type]
    return our_cmd, ct2_cmd


def main():
    global BIN
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--transformer", help="our program (default build/transformer)")
    parser.add_argument("--peer-python",
                        help="python with the ctranslate2 wheel (default: bash bench/peers.sh's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--work-dir", help="keep the model and outputs here (default: a temp dir)")
    args = parser.parse_args()
    if args.transformer:
        BIN = os.path.abspath(args.transformer)
    if not os.access(BIN, os.X_OK):
        fail(BIN + " is missing: run bash scripts/build.sh first")
    if not args.peer_python:
        args.peer_python = peer_python()
    work = args.work_dir or tempfile.mkdtemp(prefix="ct2_speed.")
    os.makedirs(work, exist_ok=True)
    ours, exports, source = prepare(work, args.seed)
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))

    samples = {(c, b, side): [] for c, b in CASES for side in ("ours", "ct2")}
    peer_phases = {(c, b): [] for c, b in CASES}  # the peer's own JSON line of each run
    outputs = {}
    for round_index in range(args.rounds):
        for compute_type, beam in CASES:
            our_cmd, ct2_cmd = commands(args, ours, exports, source, compute_type, beam)
            order = [("ours", our_cmd), ("ct2", ct2_cmd)]
            if round_index % 2 == 1:
                order.reverse()
            for side, cmd in order:
                output = os.path.join(work, "%s_%s_beam%d.txt" % (side, compute_type, beam))
                samples[(compute_type, beam, side)].append(timed(cmd, env, output))
                with open(output) as f:
                    outputs[(compute_type, beam, side)] = f.read().splitlines()
                if side == "ct2":
                    with open(output + ".err") as f:
                        peer_phases[(compute_type, beam)].append(json.loads(f.read().splitlines()[-1]))
        print("round %d/%d done" % (round_index + 1, args.rounds), file=sys.stderr)

    report = {"benchmark": "ctranslate2_speed", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "cpu": cpu_name(), "threads": THREADS, "rounds": args.rounds,
              "sentences": SENTENCES, "tokens": TOKENS, "vocab": VOCAB,
              "ctranslate2": peer_phases[CASES[0]][0]["ctranslate2"], "ctranslate2_from": "PyPI wheel",
              "cases": []}
    for compute_type, beam in CASES:
        entry = {"compute_type": compute_type, "ct2_compute_type": CT2_COMPUTE_TYPE[compute_type],
                 "beam": beam}
        for side in ("ours", "ct2"):
            runs = samples[(compute_type, beam, side)]
            entry[side + "_seconds"] = statistics.median(s for s, _ in runs)
            entry[side + "_all_seconds"] = [s for s, _ in runs]
            entry[side + "_peak_rss_mib"] = max(r for _, r in runs)
        entry["speed_ours_over_ct2"] = entry["ct2_seconds"] / entry["ours_seconds"]
        for phase in ("import_s", "load_s", "translate_s"):
            entry["ct2_" + phase] = statistics.median(p[phase] for p in peer_phases[(compute_type, beam)])
        ours_lines, ct2_lines = outputs[(compute_type, beam, "ours")], outputs[(compute_type, beam, "ct2")]
        if len(ours_lines) != SENTENCES or len(ct2_lines) != SENTENCES:
            fail("expected %d output lines, got %d (ours) and %d (CTranslate2)"
                 % (SENTENCES, len(ours_lines), len(ct2_lines)))
        for lines, side in ((ours_lines, "ours"), (ct2_lines, "CTranslate2")):
            if any(len(line.split()) != TOKENS for line in lines):
                fail("%s did not produce exactly %d tokens per sentence" % (side, TOKENS))
        entry["identical_outputs"] = sum(a.split() == b.split() for a, b in zip(ours_lines, ct2_lines))
        report["cases"].append(entry)

    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "ctranslate2_speed.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = ["# Decoding against CTranslate2, same run", "",
             "%s, %s, %d threads, %d rounds (sides alternating), base model, %d sentences x %d tokens, "
             "whole processes; medians, peak RSS the largest of the rounds. CTranslate2 %s, the wheel "
             "from PyPI, through its Python API (its import is in its time; the last column says how much)." %
             (report["date"], report["cpu"], THREADS, args.rounds, SENTENCES, TOKENS, report["ctranslate2"]), "",
             "| case | ours s | CTranslate2 s | speed ours/CT2 | ours peak RSS MiB | CT2 peak RSS MiB | same outputs | CT2 import s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for e in report["cases"]:
        against = "" if e["ct2_compute_type"] == e["compute_type"] else " (CT2 %s)" % e["ct2_compute_type"]
        lines.append("| %s%s, %s | %.3f | %.3f | %.2f | %.0f | %.0f | %d/%d | %.3f |" % (
            e["compute_type"], against, "greedy" if e["beam"] == 1 else "beam %d" % e["beam"], e["ours_seconds"],
            e["ct2_seconds"], e["speed_ours_over_ct2"], e["ours_peak_rss_mib"], e["ct2_peak_rss_mib"],
            e["identical_outputs"], SENTENCES, e["ct2_import_s"]))
    lines += ["", "Reproduce: `python3 bench/ctranslate2_speed.py` (the peer is installed from PyPI by "
              "`bash bench/peers.sh`, pinned in bench/peers.txt)."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(RESULTS, "ctranslate2_speed.md"), "w") as f:
        f.write(text)
    print(text)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
