#!/usr/bin/env python3
"""Every relative link in README.md and docs/ names a file of the repository, and every
#anchor a heading of that file (GitHub's anchor rule: lower case, punctuation dropped, spaces to
hyphens), so that nothing a user reads points to a page that is not there."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
link = re.compile(r"\]\(([^)\s]+)\)")
fence = re.compile(r"^```")


def anchors(page):
    names = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if fence.match(line):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        title = re.sub(r"[^\w\- ]", "", title)
        names.add(title.replace(" ", "-"))
    return names


problems = []
for page in pages:
    in_code = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if fence.match(line):
            in_code = not in_code
        if in_code:
            continue
        for target in link.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: outside links are not checked here
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}:{number}"
            if not resolved.exists():
                problems.append(f"{where}: {target}: no such file")
            elif not resolved.is_relative_to(root):
                problems.append(f"{where}: {target}: outside the repository")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: {target}: no heading #{anchor} in {path or page.name}")
for problem in problems:
    print("error:", problem, file=sys.stderr)
print(f"{len(pages)} pages checked, {len(problems)} broken links")
sys.exit(1 if problems else 0)
