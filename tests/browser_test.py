#!/usr/bin/env python3
"""The page `transformer serve` shows at `/`, in a real headless browser (Debian's chromium,
driven through chromedriver by Selenium): load it, type a sentence, press Translate, and check
that the translation equals `transformer translate`'s, that the n-best table lists the asked
number of hypotheses with scores, and that one attention heat map per head is drawn (with ink on
it). Saves a screenshot. Exits 77 (skipped, with the reason printed) where chromium, chromedriver
or Selenium is missing.

  browser_test.py --cli build/transformer (--model DIR | --ctranslate2-model DIR)
                  --text SENTENCE --screenshot out.png [--nbest 4]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(77)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--model")
    parser.add_argument("--ctranslate2-model")
    parser.add_argument("--text", required=True)
    parser.add_argument("--nbest", type=int, default=4)
    parser.add_argument("--screenshot", required=True)
    args = parser.parse_args()

    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        skip("Selenium is not installed (apt-get install python3-selenium)")

    work = tempfile.mkdtemp(prefix="browser_test_")
    model = args.model
    if args.ctranslate2_model:
        model = os.path.join(work, "model")
        subprocess.run([args.cli, "import-ctranslate2", args.ctranslate2_model, "-o", model],
                       check=True)
    expected = subprocess.run([args.cli, "translate", "--model", model, "--beam", "4"],
                              input=args.text + "\n", capture_output=True, text=True,
                              check=True).stdout.strip()

    log_path = os.path.join(work, "serve.err")
    log = open(log_path, "w")
    server = subprocess.Popen([args.cli, "serve", "--model", model, "--port", "0"],
                              stderr=log, stdout=subprocess.DEVNULL)
    browser = None
    try:
        port = None
        for _ in range(600):
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", open(log_path).read())
            if found:
                port = int(found.group(1))
                break
            if server.poll() is not None:
                sys.exit("error: the server exited: " + open(log_path).read())
            time.sleep(0.05)
        if port is None:
            sys.exit("error: the server did not start")
        url = f"http://127.0.0.1:{port}/"
        model_info = json.load(urllib.request.urlopen(url + "v1/model"))
        heads = model_info["config"]["heads"]

        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1500", "--no-first-run", "--disable-extensions"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service(executable_path=driver), options=options)
        wait = WebDriverWait(browser, 60)
        browser.get(url)
        wait.until(lambda b: "parameters" in b.find_element(By.ID, "model").text)
        nbest = browser.find_element(By.ID, "nbest")
        nbest.clear()
        nbest.send_keys(str(args.nbest))
        browser.find_element(By.ID, "source").send_keys(args.text)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#output .translation"))
        failures = []
        shown = browser.find_element(By.CSS_SELECTOR, "#output .translation").text
        if shown != expected:
            failures.append(f"the page shows {shown!r}, translate prints {expected!r}")
        rows = browser.find_elements(By.CSS_SELECTOR, "#output table.nbest tr")
        if len(rows) != args.nbest + 1:  # a header row and one per hypothesis
            failures.append(f"{len(rows) - 1} n-best rows, not {args.nbest}")
        scores = [float(r.text) for r in
                  browser.find_elements(By.CSS_SELECTOR, "#output table.nbest td.score")]
        if scores != sorted(scores, reverse=True) or any(s > 0 for s in scores):
            failures.append(f"n-best scores are not log-probabilities, best first: {scores}")
        maps = browser.find_elements(By.CSS_SELECTOR, "#output canvas.heatmap")
        if len(maps) != heads:
            failures.append(f"{len(maps)} heat maps, not one per head ({heads})")
        # Each heat map has dark cells: the attention weights were drawn.
        inked = browser.execute_script("""
            return Array.from(document.querySelectorAll('canvas.heatmap')).map((c) => {
              const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
              let dark = 0;
              for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && d[i] < 128) ++dark;
              return dark;
            });""")
        if not inked or min(inked) == 0:
            failures.append(f"a heat map has no dark pixels: {inked}")
        status = browser.find_element(By.ID, "status").text
        browser.save_screenshot(args.screenshot)
        print(f"page: {shown!r}; {len(rows) - 1} hypotheses; {len(maps)} heat maps; {status}")
        print(f"screenshot: {args.screenshot}")
        if failures:
            print("error: " + "; ".join(failures), file=sys.stderr)
            sys.exit(1)
    finally:
        if browser is not None:
            browser.quit()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        if code != 0:
            print(f"error: serve exited with {code} after SIGTERM", file=sys.stderr)
            sys.exit(1)
    print("browser test passed")


if __name__ == "__main__":
    main()
