#!/usr/bin/python3
"""Random sampling against CTranslate2's: the same distributions, checked by counting draws.

Why this file exists
    `translate --sampling-topk K --sampling-topp P --sampling-temperature T` is meant to draw
    as CTranslate2's translate_batch(sampling_topk=K, sampling_topp=P, sampling_temperature=T)
    does. Two random samplers cannot be compared draw by draw, so this counts them: on
    CTranslate2's own Arabic→English transliteration test model (../shared/data), each side
    draws the first output token of one source N times per option set (beam 1,
    max_decoding_length 1, min_decoding_length 1 as CTranslate2's default: </s> is kept out),
    and both counts are compared with the distribution the options define over CTranslate2's
    own first-step log-probabilities (its score_batch of each one-token target): the k best,
    softmax(log p / T), then the fewest best whose probability reaches P, renormalised. It
    prints Pearson's chi-square of each side against that distribution, and of the two sides
    against each other (a two-sample test), with their p-values: large p-values on every line
    say both sample the same distribution; a sampler that read the options otherwise (the
    temperature after the nucleus, the nucleus over the whole vocabulary, </s> kept) gives
    p-values of 0 at these sizes.

How to run
    bash scripts/build.sh
    python3 bench/ctranslate2_sampling.py [--draws 20000] [--transformer BIN] [--peer-python PY]
    (the peer, CTranslate2's wheel from PyPI, is installed on first use: bash bench/peers.sh)
    Writes bench/results/ctranslate2_sampling.{md,json}. About a minute on 2 cores.
"""

import argparse
import collections
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile

from peer_python import peer_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
MODEL = os.path.join(ROOT, "..", "shared", "data", "ctranslate2-aren-transliteration",
                     "aren-transliteration")
SOURCE = "آ ت ز م و ن"
CASES = [  # (top-k, top-p, temperature)
    (0, 1.0, 2.0), (10, 1.0, 1.5), (10, 0.8, 3.0), (0, 0.5, 4.0), (5, 1.0, 0.7)]

# The CTranslate2 side, run by the peer's Python: its first-step log-probabilities (score_batch
# of each one-token target), then its draws for each case, as JSON.
PEER = r"""
import collections, json, sys
import ctranslate2
model, source, draws, cases = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), json.loads(sys.argv[4])
translator = ctranslate2.Translator(model, device="cpu", compute_type="float32", intra_threads=2)
vocabulary = [line.rstrip("\n") for line in open(model + "/target_vocabulary.txt", encoding="utf-8")]
scored = translator.score_batch([source] * len(vocabulary), [[t] for t in vocabulary])
logprobs = {t: s.log_probs[0] for t, s in zip(vocabulary, scored)}
counts = []
for index, (topk, topp, temperature) in enumerate(cases):
    ctranslate2.set_random_seed(index + 1)
    result = translator.translate_batch([source], beam_size=1, num_hypotheses=draws,
                                        max_decoding_length=1, sampling_topk=topk,
                                        sampling_topp=topp, sampling_temperature=temperature)[0]
    counts.append(collections.Counter(h[0] if h else "</s>" for h in result.hypotheses))
print(json.dumps({"version": ctranslate2.__version__, "logprobs": logprobs, "counts": counts}))
"""


def fail(message):
    sys.exit("error: " + message)


def expected_distribution(logprobs, topk, topp, temperature):
    """The options' distribution over first tokens: </s> out (min_decoding_length 1), the k
    best, softmax(log p / T), the nucleus, renormalised."""
    ranked = sorted(((lp, t) for t, lp in logprobs.items() if t != "</s>" and lp > -math.inf),
                    key=lambda x: -x[0])
    if topk > 0:
        ranked = ranked[:topk]
    best = ranked[0][0]
    weights = [(math.exp((lp - best) / temperature), t) for lp, t in ranked]
    total = sum(w for w, _ in weights)
    kept, mass = [], 0.0
    for w, t in weights:
        if mass >= topp * total:
            break
        kept.append((w, t))
        mass += w
    return {t: w / mass for w, t in kept}


def regularized_gamma_q(a, x):
    """Q(a, x) = Γ(a, x) / Γ(a): the chi-square survival function at 2x with 2a degrees."""
    if x <= 0:
        return 1.0
    if x < a + 1:  # the series for P, then 1 - P
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a)))
    # Lentz's continued fraction for Q
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return h * math.exp(-x + a * math.log(x) - math.lgamma(a))


def chi_square_fit(counts, expected, draws):
    """Pearson's statistic of counts against probabilities (cells expecting < 5 pooled)."""
    statistic, cells, pooled_seen, pooled_expected = 0.0, 0, 0, 0.0
    for token in set(counts) | set(expected):
        e = expected.get(token, 0.0) * draws
        seen = counts.get(token, 0)
        if e < 5:
            pooled_seen += seen
            pooled_expected += e
            continue
        statistic += (seen - e) ** 2 / e
        cells += 1
    if pooled_expected > 0 or pooled_seen > 0:
        if pooled_expected == 0:
            return math.inf, max(cells - 1, 1)  # drew what the options forbid
        statistic += (pooled_seen - pooled_expected) ** 2 / pooled_expected
        cells += 1
    return statistic, max(cells - 1, 1)


def chi_square_two_samples(a, b):
    """The two-sample statistic of equal-sized samples (cells with < 10 draws in all pooled)."""
    statistic, cells, pooled_a, pooled_b = 0.0, 0, 0, 0
    for token in set(a) | set(b):
        x, y = a.get(token, 0), b.get(token, 0)
        if x + y < 10:
            pooled_a += x
            pooled_b += y
            continue
        statistic += (x - y) ** 2 / (x + y)
        cells += 1
    if pooled_a + pooled_b:
        statistic += (pooled_a - pooled_b) ** 2 / (pooled_a + pooled_b)
        cells += 1
    return statistic, max(cells - 1, 1)


def p_value(statistic, degrees):
    return 0.0 if math.isinf(statistic) else regularized_gamma_q(degrees / 2, statistic / 2)


def our_draws(binary, model_dir, work, draws, topk, topp, temperature, seed):
    source = os.path.join(work, "source.txt")
    with open(source, "w", encoding="utf-8") as f:
        f.write(SOURCE + "\n")
    cmd = [binary, "--threads", "2", "translate", "--model", model_dir, "-i", source, "--beam", "1",
           "--nbest", str(draws), "--max-length", "1", "--min-length", "1",
           "--sampling-topk", str(topk), "--sampling-topp", str(topp),
           "--sampling-temperature", str(temperature), "--seed", str(seed)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        fail("%s failed:\n%s" % (" ".join(cmd), result.stderr[-2000:]))
    counts = collections.Counter()
    for line in result.stdout.splitlines():
        text = line.split(" ||| ")[1]
        counts[text.split()[0] if text else "</s>"] += 1
    if sum(counts.values()) != draws:
        fail("expected %d draws, read %d" % (draws, sum(counts.values())))
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--draws", type=int, default=20000)
    parser.add_argument("--transformer", default=os.path.join(ROOT, "build", "transformer"))
    parser.add_argument("--peer-python",
                        help="python with the ctranslate2 wheel (default: bash bench/peers.sh's)")
    args = parser.parse_args()
    if not os.path.isdir(MODEL):
        fail("CTranslate2's test model is not at " + MODEL)
    if not args.peer_python:
        args.peer_python = peer_python()
    work = tempfile.mkdtemp(prefix="ct2_sampling.")
    ours = os.path.join(work, "model")
    imported = subprocess.run([args.transformer, "import-ctranslate2", MODEL, "-o", ours],
                              capture_output=True, text=True)
    if imported.returncode != 0:
        fail("import-ctranslate2 failed:\n" + imported.stderr[-2000:])
    peer = subprocess.run([args.peer_python, "-c", PEER, MODEL, SOURCE, str(args.draws),
                           json.dumps(CASES)], capture_output=True, text=True)
    if peer.returncode != 0:
        fail("the CTranslate2 side failed:\n" + peer.stderr[-2000:])
    theirs = json.loads(peer.stdout)

    rows = []
    for index, (topk, topp, temperature) in enumerate(CASES):
        expected = expected_distribution(theirs["logprobs"], topk, topp, temperature)
        mine = our_draws(args.transformer, ours, work, args.draws, topk, topp, temperature,
                         index + 1)
        ct2 = collections.Counter(theirs["counts"][index])
        fit_ours, df_ours = chi_square_fit(mine, expected, args.draws)
        fit_ct2, df_ct2 = chi_square_fit(ct2, expected, args.draws)
        both, df_both = chi_square_two_samples(mine, ct2)
        rows.append({"topk": topk, "topp": topp, "temperature": temperature,
                     "tokens_possible": len(expected), "tokens_ours": len(mine),
                     "tokens_ct2": len(ct2),
                     "ours_vs_definition": [fit_ours, df_ours, p_value(fit_ours, df_ours)],
                     "ct2_vs_definition": [fit_ct2, df_ct2, p_value(fit_ct2, df_ct2)],
                     "ours_vs_ct2": [both, df_both, p_value(both, df_both)],
                     "ours": dict(mine), "ct2": dict(ct2)})

    when = datetime.datetime.now().isoformat(timespec="seconds")
    lines = ["# Sampling against CTranslate2's, same run", "",
             "%s, CTranslate2 %s (the wheel from PyPI), its transliteration test model, source "
             "\"%s\", %d draws of the first token a side and case (beam 1, max length 1, min "
             "length 1). Chi-square statistic / degrees of freedom (p-value) of each side against "
             "the distribution the options define over CTranslate2's own first-step "
             "log-probabilities, and of the two sides against each other." %
             (when, theirs["version"], SOURCE, args.draws), "",
             "| top-k | top-p | temperature | tokens possible | ours vs definition | "
             "CTranslate2 vs definition | ours vs CTranslate2 |",
             "|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        cell = lambda v: "%.1f / %d (p %.2f)" % (v[0], v[1], v[2])
        lines.append("| %d | %g | %g | %d | %s | %s | %s |" % (
            r["topk"], r["topp"], r["temperature"], r["tokens_possible"],
            cell(r["ours_vs_definition"]), cell(r["ct2_vs_definition"]), cell(r["ours_vs_ct2"])))
    lines += ["", "Reproduce: `python3 bench/ctranslate2_sampling.py` (the peer is installed from "
              "PyPI by `bash bench/peers.sh`, pinned in bench/peers.txt)."]
    report = "\n".join(lines) + "\n"
    print(report)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "ctranslate2_sampling.md"), "w") as f:
        f.write(report)
    with open(os.path.join(RESULTS, "ctranslate2_sampling.json"), "w") as f:
        json.dump({"date": when, "ctranslate2": theirs["version"], "draws": args.draws,
                   "source": SOURCE, "cases": rows}, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
