#!/usr/bin/env python3
"""Load test of `transformer serve` on loopback, next to offline `translate` in the same run.

Sends Acts verses one per request from 1, 8, 32 and 128 concurrent clients (keep-alive
connections, one thread each) to the server with dynamic batching, and to the server with
batching disabled; each level is bounded in requests and in seconds. Reports throughput
(sentences/s, source and target tokens/s) and latency p50/p95/p99 per level, next to:
  - offline: `transformer translate` of the same verses in one process (model load excluded:
    the time of translating an empty input is subtracted);
  - alone: each of the 1-client verses translated by its own `translate` process, minus that
    same start-up time: what translating that sentence alone costs.
Writes a Markdown table and JSON. Only 127.0.0.1 is ever contacted.

  serve_load.py --cli build/transformer --model DIR --verses FILE [--requests 256]
                [--levels 1,8,32,128] [--max-seconds 60] [--threads 2] --out PREFIX
"""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def percentile(values, p):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


class Server:
    def __init__(self, cli, model, threads, extra):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".err", delete=False)
        self.process = subprocess.Popen(
            [cli, "serve", "--model", model, "--port", "0", "--threads", str(threads),
             "--max-connections", "512"] + extra,
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        for _ in range(1200):
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", open(self.log.name).read())
            if found:
                self.port = int(found.group(1))
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        sys.exit("error: serve did not start: " + open(self.log.name).read())

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=120)
        os.unlink(self.log.name)
        if code != 0:
            sys.exit(f"error: serve exited with {code}")


def load(port, verses, clients, requests, max_seconds):
    """`clients` threads send verses[i] (i = 0, 1, ...) until `requests` answers or the deadline."""
    lock = threading.Lock()
    state = {"next": 0}
    latencies, source_tokens, target_tokens, errors = [], [0], [0], []
    deadline = time.monotonic() + max_seconds

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                i = state["next"]
                if i >= requests or time.monotonic() > deadline:
                    break
                state["next"] += 1
            body = json.dumps({"text": verses[i % len(verses)]})
            started = time.monotonic()
            try:
                connection.request("POST", "/v1/translate", body,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = json.loads(response.read())
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    errors.append(str(e))
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                continue
            elapsed = time.monotonic() - started
            with lock:
                if response.status != 200:
                    errors.append(f"{response.status}: {answer}")
                    continue
                latencies.append(elapsed)
                t = answer["translations"][0]
                source_tokens[0] += t["source_tokens"]
                target_tokens[0] += t["target_tokens"]
        connection.close()

    started = time.monotonic()
    cpu_started = time.process_time()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    client_cpu = time.process_time() - cpu_started  # this load generator's own CPU time
    n = len(latencies)
    return {"clients": clients, "requests": n, "errors": len(errors), "seconds": seconds,
            "sentences_per_s": n / seconds, "source_tokens_per_s": source_tokens[0] / seconds,
            "target_tokens_per_s": target_tokens[0] / seconds,
            "mean_ms": 1000 * statistics.mean(latencies) if latencies else float("nan"),
            "p50_ms": 1000 * percentile(latencies, 50), "p95_ms": 1000 * percentile(latencies, 95),
            "p99_ms": 1000 * percentile(latencies, 99),
            "client_cpu_share": client_cpu / seconds, "first_error": errors[0] if errors else None}


def translate_seconds(cli, model, threads, lines, extra=()):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(line + "\n" for line in lines))
    started = time.monotonic()
    subprocess.run([cli, "translate", "--model", model, "--threads", str(threads), "-i", f.name,
                    *extra],
                   check=True, stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    os.unlink(f.name)
    return seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--verses", required=True)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--alone", type=int, default=48, help="verses timed alone")
    parser.add_argument("--levels", default="1,8,32,128")
    parser.add_argument("--max-seconds", type=float, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--serve-args", default="", help="more options of the batched server")
    parser.add_argument("--skip-unbatched", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    verses = [v.strip() for v in open(args.verses, encoding="utf-8") if v.strip()]
    levels = [int(x) for x in args.levels.split(",")]
    used = verses[:args.requests]

    beam = ["--beam", str(args.beam)]
    # Offline, same verses, one process; start-up (model load) measured on an empty input.
    startup = statistics.median(translate_seconds(args.cli, args.model, args.threads, [], beam)
                                for _ in range(3))
    offline_seconds = translate_seconds(args.cli, args.model, args.threads, used, beam) - startup
    # The 1-client verses each decoded alone (a batch budget of one sentence), in one process.
    alone = used[:args.alone]
    alone_seconds = translate_seconds(args.cli, args.model, args.threads, alone,
                                      beam + ["--batch-tokens", "1"]) - startup

    results = {"batched": [], "unbatched": []}
    modes = [("batched", beam + args.serve_args.split())]
    if not args.skip_unbatched:
        modes.append(("unbatched", beam + ["--no-batching"]))
    for mode, extra in modes:
        server = Server(args.cli, args.model, args.threads, extra)
        load(server.port, used, 4, 8, args.max_seconds)  # warm-up
        for clients in levels:
            requests = args.alone if clients == 1 else args.requests
            r = load(server.port, used, clients, requests, args.max_seconds)
            results[mode].append(r)
            print(f"{mode:9s} {clients:4d} clients: {r['sentences_per_s']:7.2f} sentences/s, "
                  f"p50 {r['p50_ms']:7.1f} ms, p99 {r['p99_ms']:7.1f} ms, {r['requests']} answers, "
                  f"{r['errors']} errors, client CPU {r['client_cpu_share']:.0%} of a core",
                  file=sys.stderr)
        server.stop()
    tokens = results["batched"][-1]
    per_sentence_source = tokens["source_tokens_per_s"] / tokens["sentences_per_s"]
    per_sentence_target = tokens["target_tokens_per_s"] / tokens["sentences_per_s"]
    offline = {"sentences": len(used), "seconds": offline_seconds,
               "sentences_per_s": len(used) / offline_seconds,
               "startup_seconds": startup,
               "alone_sentences": len(alone), "alone_mean_ms": 1000 * alone_seconds / len(alone)}
    out = {"date": time.strftime("%Y-%m-%d"), "model": args.model, "verses": args.verses,
           "beam": args.beam,
           "threads": args.threads, "cpus": os.cpu_count(), "offline": offline, **results}
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=2)

    lines = [f"`transformer serve` load test, {out['date']}: {args.model}, {args.threads} threads, "
             f"{os.cpu_count()} CPUs, verses of {args.verses} one per request (beam {args.beam}), clients "
             f"on the same machine.", "",
             "| clients | server | sentences/s | source tok/s | target tok/s | p50 ms | p95 ms | "
             "p99 ms | vs offline | vs unbatched |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, clients in enumerate(levels):
        b = results["batched"][i]
        u = results["unbatched"][i] if results["unbatched"] else None
        for name, r in (("batched", b), ("unbatched", u)):
            if r is None:
                continue
            vs_u = f"{b['sentences_per_s'] / u['sentences_per_s']:.2f}x" if name == "batched" and u else ""
            lines.append(
                f"| {clients} | {name} | {r['sentences_per_s']:.1f} | {r['source_tokens_per_s']:.0f} "
                f"| {r['target_tokens_per_s']:.0f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | "
                f"{r['p99_ms']:.0f} | {r['sentences_per_s'] / offline['sentences_per_s']:.0%} | "
                f"{vs_u} |")
    lines += ["", f"Offline `translate` of the same {len(used)} verses: "
              f"{offline['sentences_per_s']:.1f} sentences/s "
              f"({offline['sentences_per_s'] * per_sentence_source:.0f} source tok/s, "
              f"{offline['sentences_per_s'] * per_sentence_target:.0f} target tok/s; "
              f"model load of {startup * 1000:.0f} ms excluded).",
              f"The {len(alone)} verses of the 1-client level, each decoded alone in one "
              f"`translate` process: {offline['alone_mean_ms']:.0f} ms per sentence on average; "
              f"the server at 1 client answers in {results['batched'][0]['mean_ms']:.0f} ms on "
              f"average (ratio {results['batched'][0]['mean_ms'] / offline['alone_mean_ms']:.2f})"
              + (f", p99 {results['batched'][0]['p99_ms']:.0f} ms against the unbatched "
                 f"server's {results['unbatched'][0]['p99_ms']:.0f} ms (ratio "
                 f"{results['batched'][0]['p99_ms'] / results['unbatched'][0]['p99_ms']:.2f})."
                 if results["unbatched"] else ".")]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
