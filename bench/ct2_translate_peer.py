"""CTranslate2's side of bench/ctranslate2_speed.py as its users run it: the `ctranslate2` wheel
from PyPI (bench/peers.txt), a Translator loaded once, one translate_batch over the whole file.

The wheel has no ct2-translator program, so this is the few lines a user writes instead. It
takes ct2-translator's option names, reads pre-tokenized source lines, writes the best
hypothesis of each as tokens, and prints to stderr one JSON line with the seconds spent importing
ctranslate2, loading the model, and translating.

Run with the peers' python: $(bash bench/peers.sh) bench/ct2_translate_peer.py --model DIR --src F
"""
import time

START = time.perf_counter()
import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import ctranslate2  # noqa: E402

IMPORTED = time.perf_counter()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--compute_type", default="default")
    parser.add_argument("--beam_size", type=int, default=2)
    parser.add_argument("--length_penalty", type=float, default=1.0)
    parser.add_argument("--min_decoding_length", type=int, default=1)
    parser.add_argument("--max_decoding_length", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--intra_threads", type=int, default=0)
    parser.add_argument("--inter_threads", type=int, default=1)
    parser.add_argument("--with_score", action="store_true",
                        help="write 'score ||| tokens' lines, as ct2-translator --with_score")
    args = parser.parse_args()
    translator = ctranslate2.Translator(args.model, device="cpu", compute_type=args.compute_type,
                                       inter_threads=args.inter_threads,
                                       intra_threads=args.intra_threads)
    loaded = time.perf_counter()
    with open(args.src, encoding="utf-8") as f:
        source = [line.split() for line in f]
    results = translator.translate_batch(
        source, max_batch_size=args.batch_size, beam_size=args.beam_size,
        length_penalty=args.length_penalty, min_decoding_length=args.min_decoding_length,
        max_decoding_length=args.max_decoding_length, return_scores=args.with_score)
    if args.with_score:
        sys.stdout.write("".join("%.6f ||| %s\n" % (r.scores[0], " ".join(r.hypotheses[0]))
                                 for r in results))
    else:
        sys.stdout.write("".join(" ".join(r.hypotheses[0]) + "\n" for r in results))
    sys.stdout.flush()
    done = time.perf_counter()
    print(json.dumps({"ctranslate2": ctranslate2.__version__,
                      "import_s": IMPORTED - START, "load_s": loaded - IMPORTED,
                      "translate_s": done - loaded}), file=sys.stderr)


if __name__ == "__main__":
    main()
