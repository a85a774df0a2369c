#!/usr/bin/env python3
"""Load test of `transformer serve` on loopback, next to offline `translate` in the same run.

Sends Acts verses one per request from 1, 8, 32 and 128 concurrent clients (keep-alive
connections, one thread each) to the server with dynamic batching, and to the server with
batching disabled; each level is bounded in requests and in seconds. Reports throughput
(sentences/s, source and target tokens/s) and latency p50/p95/p99 per level, next to:
  - offline: `transformer translate` of the same verses in one process (model load excluded:
    the time of translating an empty input is subtracted);
  - alone (1 client): the same verses decoded one sentence per batch in one `translate`
    process: what translating each sentence alone costs.
Both servers run side by side, and each level measures batched, unbatched and offline one
right after the other: this machine's speed drifts by tens of percent over minutes, and the
ratios must compare runs made under the same conditions.
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
    parser.add_argument("--alone", type=int, default=48, help="requests of the 1-client level")
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
    beam = ["--beam", str(args.beam)]

    # Start-up (model load) of a `translate` process, measured on an empty input.
    startup = statistics.median(translate_seconds(args.cli, args.model, args.threads, [], beam)
                                for _ in range(3))
    servers = {"batched": Server(args.cli, args.model, args.threads,
                                 beam + args.serve_args.split())}
    if not args.skip_unbatched:
        servers["unbatched"] = Server(args.cli, args.model, args.threads, beam + ["--no-batching"])
    for server in servers.values():
        load(server.port, verses, 4, 8, args.max_seconds)  # warm-up
    results = {"batched": [], "unbatched": [], "offline": []}
    for clients in levels:
        requests = args.alone if clients == 1 else args.requests
        used = verses[:requests]
        for mode, server in servers.items():
            r = load(server.port, used, clients, requests, args.max_seconds)
            results[mode].append(r)
            print(f"{mode:9s} {clients:4d} clients: {r['sentences_per_s']:7.2f} sentences/s, "
                  f"p50 {r['p50_ms']:7.1f} ms, p99 {r['p99_ms']:7.1f} ms, {r['requests']} answers, "
                  f"{r['errors']} errors, client CPU {r['client_cpu_share']:.0%} of a core",
                  file=sys.stderr)
        offline = {"sentences": len(used),
                   "seconds": translate_seconds(args.cli, args.model, args.threads, used, beam)
                   - startup}
        offline["sentences_per_s"] = len(used) / offline["seconds"]
        if clients == 1:  # each sentence alone: a batch budget of one sentence
            alone = translate_seconds(args.cli, args.model, args.threads, used,
                                      beam + ["--batch-tokens", "1"]) - startup
            offline["alone_mean_ms"] = 1000 * alone / len(used)
        results["offline"].append(offline)
        print(f"offline   {clients:4d} clients: {offline['sentences_per_s']:7.2f} sentences/s",
              file=sys.stderr)
    for server in servers.values():
        server.stop()
    out = {"date": time.strftime("%Y-%m-%d"), "model": args.model, "verses": args.verses,
           "beam": args.beam, "threads": args.threads, "cpus": os.cpu_count(),
           "startup_seconds": startup, **results}
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=2)

    lines = [f"`transformer serve` load test, {out['date']}: {args.model}, {args.threads} threads, "
             f"{os.cpu_count()} CPUs, verses of {args.verses} one per request (beam {args.beam}), "
             f"clients on the same machine; each level's offline `translate` of the same verses "
             f"ran right after it (model load of {startup * 1000:.0f} ms excluded).", "",
             "| clients | sentences/s batched | unbatched | offline | source tok/s batched | "
             "target tok/s batched | p50 / p95 / p99 ms batched | p50 / p95 / p99 ms unbatched "
             "| batched vs offline | batched vs unbatched |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, clients in enumerate(levels):
        b, o = results["batched"][i], results["offline"][i]
        u = results["unbatched"][i] if results["unbatched"] else None
        lines.append(
            f"| {clients} | {b['sentences_per_s']:.1f} | "
            f"{u['sentences_per_s']:.1f} | " if u else f"| {clients} | {b['sentences_per_s']:.1f} | – | ")
        lines[-1] += (
            f"{o['sentences_per_s']:.1f} | {b['source_tokens_per_s']:.0f} | "
            f"{b['target_tokens_per_s']:.0f} | {b['p50_ms']:.0f} / {b['p95_ms']:.0f} / "
            f"{b['p99_ms']:.0f} | "
            + (f"{u['p50_ms']:.0f} / {u['p95_ms']:.0f} / {u['p99_ms']:.0f}" if u else "–")
            + f" | {b['sentences_per_s'] / o['sentences_per_s']:.0%} | "
            + (f"{b['sentences_per_s'] / u['sentences_per_s']:.2f}x |" if u else "– |"))
    first = results["offline"][0]
    if "alone_mean_ms" in first:
        b = results["batched"][0]
        lines += ["", f"At 1 client the server answers in {b['mean_ms']:.0f} ms on average (p99 "
                  f"{b['p99_ms']:.0f} ms); the same {first['sentences']} verses decoded alone "
                  f"in `translate` take {first['alone_mean_ms']:.0f} ms each on average (ratio "
                  f"{b['mean_ms'] / first['alone_mean_ms']:.2f})"
                  + (f"; the unbatched server's p99 is {results['unbatched'][0]['p99_ms']:.0f} ms "
                     f"(ratio {b['p99_ms'] / results['unbatched'][0]['p99_ms']:.2f})."
                     if results["unbatched"] else ".")]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
