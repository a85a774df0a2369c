#!/usr/bin/env python3
"""Renders encoder-decoder attention as an HTML page of heat maps, one per head, in the spirit
of the paper's attention figures. Input: the JSON lines `transformer translate --attention-file`
writes ({line, source, target, layer, attention[head][target step][source position]}).

usage: attention_html.py ATTENTION.jsonl OUT.html [--references REF.txt] [--title TEXT] [--max N]
"""
import argparse
import html
import json
import os
import sys
import tempfile


def piece_text(piece):
    # SentencePiece marks word starts with U+2581; show it as a visible space marker.
    return str(piece).replace("\u2581", "\u00b7")


def heat_map(weights, source, target, head):
    rows = []
    header = "".join(f'<th class="src"><span>{html.escape(piece_text(s))}</span></th>' for s in source)
    rows.append(f"<tr><th class=\"corner\">head {head}</th>{header}</tr>")
    for t, row in enumerate(weights):
        label = html.escape(piece_text(target[t])) if t < len(target) else ""
        cells = "".join(
            f'<td style="background: rgba(20, 80, 200, {min(max(w, 0.0), 1.0):.3f})" title="{w:.3f}"></td>'
            for w in row)
        rows.append(f'<tr><th class="tgt">{label}</th>{cells}</tr>')
    return f'<table class="map">{"".join(rows)}</table>'


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attention")
    parser.add_argument("output")
    parser.add_argument("--references", help="reference translations, one per input line")
    parser.add_argument("--title", default="Encoder-decoder attention")
    parser.add_argument("--max", type=int, default=5, help="sentences to show (default 5)")
    args = parser.parse_args()

    references = None
    if args.references:
        with open(args.references, encoding="utf-8") as f:
            references = f.read().split("\n")
    sections = []
    with open(args.attention, encoding="utf-8") as f:
        for number, text in enumerate(f):
            if number >= args.max:
                break
            item = json.loads(text)
            source, target = item["source"], item["target"]
            maps = "".join(heat_map(weights, source, target, head) for head, weights in enumerate(item["attention"]))
            reference = ""
            if references is not None and item["line"] < len(references):
                reference = f'<p><b>reference</b> {html.escape(references[item["line"]])}</p>'
            sections.append(
                f'<section><h2>line {item["line"] + 1}</h2>'
                f'<p><b>source</b> {html.escape(" ".join(piece_text(s) for s in source))}</p>'
                f'<p><b>translation</b> {html.escape(" ".join(piece_text(t) for t in target))}</p>{reference}'
                f'<p class="note">decoder layer {item["layer"] + 1}, {len(item["attention"])} heads: '
                f'rows are output tokens, columns source tokens, darker = more attention</p>'
                f'<div class="maps">{maps}</div></section>')
    if not sections:
        sys.exit(f"error: {args.attention}: no attention records")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(args.title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
section {{ margin-bottom: 3em; }}
.maps {{ display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }}
table.map {{ border-collapse: collapse; font-size: 11px; }}
table.map td {{ width: 14px; height: 14px; border: 1px solid #eee; }}
th.src {{ height: 7em; vertical-align: bottom; font-weight: normal; }}
th.src span {{ writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }}
th.tgt {{ text-align: right; font-weight: normal; padding-right: 4px; white-space: nowrap; }}
th.corner {{ text-align: left; vertical-align: bottom; }}
.note {{ color: #666; font-size: 0.9em; }}
</style></head><body><h1>{html.escape(args.title)}</h1>{"".join(sections)}</body></html>
"""
    directory = os.path.dirname(os.path.abspath(args.output))
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, delete=False, suffix=".tmp") as out:
        out.write(page)
    os.chmod(out.name, 0o644)
    os.replace(out.name, args.output)


if __name__ == "__main__":
    main()
