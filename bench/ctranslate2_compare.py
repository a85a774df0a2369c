#!/usr/bin/python3
"""Our engine and a real CTranslate2 on the same models, in one run (issue: CTranslate2 interchange).

Why this file exists
    README's claims about CTranslate2 interchange are checked against CTranslate2 itself, not
    against our reading of its format:
      1. models in CTranslate2's format (its own test model aren-transliteration, pre-norm, and
         the spec-revision-7 directories of tests/data/ctranslate2-spec7, post- and pre-norm),
         decoded by its CLI and by us after `import-ctranslate2`: greedy and beam 4 outputs
         identical, scores within 1e-3;
      2. our models after `export-ctranslate2` (the quickstart's averaged model when given, and
         the imported aren model exported back) decoded by its CLI: outputs identical to our
         `translate`, greedy and beam 4; exported int8 decoded by its CLI beside ours.
    Both sides run with length penalty 0 (plain log-probabilities: CTranslate2 divides by
    length^penalty, we by ((5+|Y|)/6)^alpha), no minimum length, and the same length cap.

    CTranslate2 is its wheel from PyPI (bench/peers.txt), as users install it, through
    bench/ct2_translate_peer.py (the wheel has no ct2-translator).

How to run
    python3 bench/ctranslate2_compare.py [--peer-python PY] [--quickstart out/quickstart/averaged
        --source out/corpus/test.en]
    PY defaults to the peers' environment that bench/peers.sh installs. Writes
    bench/results/ctranslate2_compare.{md,json}. Needs spm_encode/spm_decode (Debian's
    `sentencepiece`) for the quickstart model.
"""

import argparse
import json
import os
import shutil
import random
import subprocess
import sys
import tempfile

from peer_python import peer_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "transformer")
MAX_LENGTH = 60


def run(cmd, stdin=None, env=None):
    result = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit("error: %s failed:\n%s" % (" ".join(cmd), result.stderr[-2000:]))
    return result.stdout


def ct2_translate(args, model, src_file, beam, compute_type="float32"):
    out = run([args.peer_python, os.path.join(ROOT, "bench", "ct2_translate_peer.py"), "--model",
               model, "--src", src_file, "--beam_size", str(beam), "--length_penalty", "0",
               "--min_decoding_length", "0", "--max_decoding_length", str(MAX_LENGTH),
               "--with_score", "--intra_threads", "2", "--compute_type", compute_type])
    rows = []
    for line in out.splitlines():
        score, _, text = line.partition(" ||| ")
        rows.append((text, float(score)))
    return rows


def our_translate(model, src_file, beam, pieces=True):
    out = run([BIN, "--threads", "2", "translate", "--model", model, "-i", src_file, "--beam", str(beam),
               "--alpha", "0", "--max-length-a", "0", "--max-length-b", str(MAX_LENGTH),
               "--nbest", "1"] + ([] if pieces else []))
    rows = []
    for line in out.splitlines():
        _, text, score = line.split(" ||| ")
        rows.append((text, float(score)))
    return rows


def compare(name, ours, theirs):
    assert len(ours) == len(theirs), (name, len(ours), len(theirs))
    same = sum(o[0] == t[0] for o, t in zip(ours, theirs))
    # Scores compared where the hypothesis ended with eos before the cap (CTranslate2 leaves
    # the eos out of a capped hypothesis' score, we count it).
    deltas = [abs(o[1] - t[1]) for o, t in zip(ours, theirs)
              if o[0] == t[0] and len(t[0].split()) < MAX_LENGTH]
    return {"case": name, "sentences": len(ours), "identical": same,
            "scored": len(deltas), "max_score_delta": max(deltas) if deltas else None}


def random_lines(tokens, count, seed, low=3, high=12):
    r = random.Random(seed)
    return "".join(" ".join(r.choice(tokens) for _ in range(r.randint(low, high))) + "\n"
                   for _ in range(count))


def vocabulary_tokens(directory):
    for name in ("shared_vocabulary", "source_vocabulary"):
        path = os.path.join(directory, name + ".json")
        if os.path.exists(path):
            return json.load(open(path, encoding="utf-8"))
        path = os.path.join(directory, name + ".txt")
        if os.path.exists(path):
            return open(path, encoding="utf-8").read().splitlines()
    sys.exit("error: no vocabulary in " + directory)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer-python",
                        help="python of an environment with the ctranslate2 wheel (default: "
                             "the one bench/peers.sh installs)")
    parser.add_argument("--quickstart", help="our model directory with vocab.spm (e.g. the quickstart's averaged model)")
    parser.add_argument("--source", help="source text for --quickstart (e.g. out/corpus/test.en)")
    parser.add_argument("--lines", type=int, default=200)
    args = parser.parse_args()
    if args.quickstart:
        for tool in ("spm_encode", "spm_decode"):
            if not shutil.which(tool):
                sys.exit("error: --quickstart needs %s (Debian: apt-get install sentencepiece)" % tool)
    if not args.peer_python:
        args.peer_python = peer_python()
    version = run([args.peer_python, "-c", "import ctranslate2; print(ctranslate2.__version__)"])
    work = tempfile.mkdtemp(prefix="ct2_compare_")
    results = []

    # 1. CTranslate2-format models, imported.
    data = os.path.join(ROOT, "tests", "data")
    ct2_models = [("aren-transliteration (CTranslate2's test model, pre-norm)",
                   os.path.join(data, "ctranslate2-aren-transliteration", "aren-transliteration"))]
    for variant, what in (("paper_post", "post-norm, ReLU"), ("pre_gelu_target", "pre-norm, GELU"),
                          ("none_learned", "post-norm, learned positions")):
        ct2_models.append(("spec-7 %s (%s)" % (variant, what),
                           os.path.join(data, "ctranslate2-spec7", variant)))
    for index, (name, directory) in enumerate(ct2_models):
        tokens = [t for t in vocabulary_tokens(directory) if not t.startswith("<")]
        src = os.path.join(work, "src%d.txt" % index)
        open(src, "w", encoding="utf-8").write(random_lines(tokens, args.lines, index))
        ours_dir = os.path.join(work, "imported%d" % index)
        run([BIN, "import-ctranslate2", directory, "-o", ours_dir])
        for beam in (1, 4):
            results.append(compare("import: %s, beam %d" % (name, beam),
                                   our_translate(ours_dir, src, beam),
                                   ct2_translate(args, directory, src, beam)))
        if index == 0:  # our models exported: the imported real model goes back out
            back = os.path.join(work, "aren_exported")
            run([BIN, "export-ctranslate2", "--model", ours_dir, "-o", back])
            for beam in (1, 4):
                results.append(compare("export: aren-transliteration re-exported, beam %d" % beam,
                                       our_translate(ours_dir, src, beam),
                                       ct2_translate(args, back, src, beam)))

    # 2. Our trained model exported (text through SentencePiece pieces for CTranslate2).
    if args.quickstart:
        exported = os.path.join(work, "quickstart_ct2")
        run([BIN, "export-ctranslate2", "--model", args.quickstart, "-o", exported])
        run([BIN, "export-ctranslate2", "--model", args.quickstart, "-o", exported + "_int8",
             "--quantization", "int8"])
        spm = os.path.join(args.quickstart, "vocab.spm")
        lines = open(args.source, encoding="utf-8").read().splitlines()[: args.lines]
        text = os.path.join(work, "quickstart.src")
        open(text, "w", encoding="utf-8").write("\n".join(lines) + "\n")
        pieces = os.path.join(work, "quickstart.pieces")
        open(pieces, "w", encoding="utf-8").write(run(["spm_encode", "--model", spm], stdin="\n".join(lines) + "\n"))
        for beam in (1, 4):
            ours = our_translate(args.quickstart, text, beam)
            for label, model, compute in (("float32", exported, "float32"),
                                          ("int8 export, CTranslate2 int8", exported + "_int8", "int8")):
                theirs = ct2_translate(args, model, pieces, beam, compute)
                decoded = run(["spm_decode", "--model", spm],
                              stdin="".join(t[0] + "\n" for t in theirs)).splitlines()
                theirs = [(d, t[1]) for d, t in zip(decoded, theirs)]
                results.append(compare("export: quickstart model (%s), beam %d" % (label, beam),
                                       ours, theirs))

    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "ctranslate2_compare.json"), "w") as f:
        json.dump(results, f, indent=2)
    lines = ["| case | sentences | identical outputs | scores compared | max score difference |",
             "|---|---:|---:|---:|---:|"]
    for r in results:
        delta = "—" if r["max_score_delta"] is None else "%.2g" % r["max_score_delta"]
        lines.append("| %s | %d | %d | %d | %s |" % (r["case"], r["sentences"], r["identical"],
                                                   r["scored"], delta))
    table = ("CTranslate2 %s (its PyPI wheel, through bench/ct2_translate_peer.py).\n\n"
             % version.strip() + "\n".join(lines) + "\n")
    open(os.path.join(ROOT, "bench", "results", "ctranslate2_compare.md"), "w").write(table)
    print(table)


if __name__ == "__main__":
    main()
