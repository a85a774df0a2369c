#!/usr/bin/python3
"""Builds the quickstart's English→Spanish parallel corpus from Debian's SWORD Bible modules.

Source texts (both public domain, both packaged by Debian):
  English  sword-text-web    World English Bible with Deuterocanon (module engWEB2015eb, NRSVA versification)
  Spanish  sword-text-sparv  Reina-Valera 1909 (module spaRV1909eb, KJV versification)

Verses are paired by reference (book.chapter.verse) and cleaned:
  * all OSIS markup is removed: Strong's tags, footnotes and cross-references (with their text),
    Song of Songs speaker labels, book titles, and the glossary WEB attaches to Revelation 22:21;
    Psalm superscriptions are kept, because the Spanish verse 1 contains them too;
  * a footnote that sat between two words ("God<note/>created") becomes a space;
  * RV1909's words added by the translators (<transChange>) are glued to their neighbours in the
    source ("díjo<le>Dios"): an enclitic pronoun is attached to its verb ("díjole Dios"), any other
    added text gets spaces around it ("ejército se llamaba Sísara");
  * RV1909 writes each chapter's first word(s) in capitals ("EN el principio", "Y ACONTECIÓ"):
    those words get the casing they have elsewhere in the text ("En el principio", "Y aconteció");
  * RV1909's subscriptions after an epistle's last "Amén." ("Fué escrita á los Hebreos desde
    Italia…") are cut, since WEB has no such text.
Chapters whose Spanish verse numbering differs from the English one (RV1909 follows the Hebrew
numbering in e.g. Numbers 13, Jonah 2, Hosea 12, Job 39–40) are detected and dropped: a word
translation table is estimated from the whole corpus (Dice coefficient of co-occurring words), and
a chapter is misaligned when its verses match their neighbours' translations better than their
own (a run of at least 3 such verses, or on average), or match their own hardly at all. Pairs
whose character-length ratio is extreme are dropped too.

Split by book: test = Acts, dev = Ruth + Philippians, train = the rest; training pairs whose
English or Spanish side equals (ignoring case and punctuation) a dev or test sentence are removed.

Output in --out (default out/corpus): train/dev/test .en/.es (one verse a line, parallel), .ref
(the verse reference of each line), SHA256SUMS and corpus.json (counts, dropped chapters, sources).
The printed checksum is the sha256 of SHA256SUMS; the same inputs give the same bytes.
The work is skipped when the files are present, match SHA256SUMS and were made by this version of
this script from the same module versions (--force rebuilds).

Exit status: 0 done, 1 error, 77 the SWORD modules are not available and could not be installed.
"""

import argparse
import collections
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import unicodedata

MODULES = {"en": "engWEB2015eb", "es": "spaRV1909eb"}
PACKAGES = ["diatheke", "python3-sword", "sword-text-web", "sword-text-sparv"]
TEST_BOOKS = ("Acts",)
DEV_BOOKS = ("Ruth", "Phil")
SPLITS = ("train", "dev", "test")
EXIT_UNAVAILABLE = 77
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Character-length ratio Spanish/English (each length + 10) outside which a pair is dropped. The
# median is 0.96; 99.9% of the pairs in well-aligned chapters lie inside these bounds, and the
# pairs outside them are mostly verse-boundary differences (text of the neighbouring verse on one
# side only, e.g. WEB's Romans 16:25-27 doxology printed after 14:23).
MIN_LENGTH_RATIO, MAX_LENGTH_RATIO = 0.5, 2.0


def log(message):
    print(f"prepare_corpus: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Reading the modules

def import_sword(install):
    """Returns the Sword module, installing the Debian packages first when needed."""
    try:
        import Sword  # noqa: F401  (python3-sword)
        if all(Sword.SWMgr().getModule(m) for m in MODULES.values()):
            return Sword
    except ImportError:
        pass
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        # python3-sword lives in Debian's interpreter; another one (a venv) cannot import it.
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    if not install:
        return None
    log("installing " + " ".join(PACKAGES))
    result = subprocess.run(["bash", os.path.join(REPO, "scripts", "bootstrap.sh")] + PACKAGES)
    if result.returncode != 0:
        return None
    import importlib
    importlib.invalidate_caches()
    try:
        import Sword
    except ImportError:
        return None
    return Sword if all(Sword.SWMgr().getModule(m) for m in MODULES.values()) else None


def read_module(Sword, manager, name):
    """{(osis_book, chapter, verse): raw OSIS text} for every non-empty verse, in canonical order."""
    module = manager.getModule(name)
    key = Sword.VerseKey()
    key.setVersificationSystem(module.getConfigEntry("Versification"))
    key.setIntros(False)
    key.setAutoNormalize(False)
    verses = {}
    for testament in (1, 2):
        key.setTestament(testament)
        for book in range(1, key.getBookMax() + 1):
            key.setBook(book)
            osis_book = key.getOSISBookName()
            for chapter in range(1, key.getChapterMax() + 1):
                key.setChapter(chapter)
                for verse in range(1, key.getVerseMax() + 1):
                    key.setVerse(verse)
                    module.setKey(key)
                    raw = module.getRawEntry()
                    if raw.strip():
                        verses[(osis_book, chapter, verse)] = raw
    return verses


def module_version(manager, name):
    module = manager.getModule(name)
    return module.getConfigEntry("Version") or "?"


# ---------------------------------------------------------------------------------------------
# Markup removal

NOTE = "\x01"          # where a footnote was
ADDED_OPEN, ADDED_CLOSE = "\x02", "\x03"   # around RV1909's added words
INLINE_TAGS = {"w", "q", "rdg", "seg", "name", "hi", "foreign", "divineName", "catchWord"}
CLITICS = {"le", "les", "lo", "los", "la", "las", "se", "me", "te", "nos", "os"}
LETTER = r"[^\W\d_]"


def strip_markup(raw):
    """OSIS verse text -> plain text (markers for notes and added words still in place)."""
    text = re.split(r'<div\b[^>]*type="glossary"', raw)[0]       # WEB's glossary after Rev 22:21
    text = re.sub(r"<note\b[^>]*/>", "", text)
    text = re.sub(r"<note\b[^>]*>.*?</note>", NOTE, text, flags=re.S)
    text = re.sub(r"<speaker\b[^>]*>.*?</speaker>", " ", text, flags=re.S)
    text = re.sub(r'<title\b(?![^>]*type="psalm")[^>]*>.*?</title>', " ", text, flags=re.S)
    text = re.sub(r"<transChange\b[^>]*>", ADDED_OPEN, text)
    text = text.replace("</transChange>", ADDED_CLOSE)

    def tag(match):  # word-level tags vanish, structural ones (lines, paragraphs, titles) separate
        return "" if match.group(1) in INLINE_TAGS else " "
    text = re.sub(r"</?([A-Za-z]+)\b[^>]*>", tag, text)
    text = html.unescape(text)
    text = re.sub(f"(?<={LETTER}){NOTE}(?={LETTER})", " ", text).replace(NOTE, "")
    return text


def place_added_words(text):
    """Resolves RV1909's added-word markers into spaces (or none, for an enclitic pronoun)."""
    parts = re.split(f"{ADDED_OPEN}([^{ADDED_CLOSE}]*){ADDED_CLOSE}", text)
    result = parts[0]
    for i in range(1, len(parts), 2):
        words, after = parts[i].strip(), parts[i + 1]
        verb = re.search(f"({LETTER}+)$", result)
        attach = False
        if verb and words.lower() in CLITICS:
            verb = verb.group(1)
            # díjo|le, adorándo|le, pagar|la, sellad|lo: an accent before the verb's last letter, or
            # an infinitive / imperative ending; not after a name (Jesús lo…), not after a final
            # accent (Jehová los…)
            first_word = len(result.strip()) == len(verb)
            attach = (verb[0].islower() or first_word) and (
                re.search(r"[áéíóú]", verb[:-1]) is not None or verb[-1] in "rd")
        left = "" if attach or not re.search(f"{LETTER}$", result) else " "
        right = " " if re.match(LETTER, after) else ""
        result += left + words + right + after
    return result.replace(ADDED_OPEN, " ").replace(ADDED_CLOSE, " ")


def tidy(text):
    text = unicodedata.normalize("NFC", text)
    return " ".join(text.split())


def clean_english(raw):
    return tidy(strip_markup(raw))


SUBSCRIPTION = re.compile(r"(Amén\.)\s+[^.]*\b(?:escrita|enviada)\b.*$", re.S)


def clean_spanish(raw, last_verse_of_book):
    text = tidy(place_added_words(strip_markup(raw)))
    if last_verse_of_book:
        text = SUBSCRIPTION.sub(r"\1", text)
    return text


CAPS_WORD = re.compile(r"\b[A-ZÁÉÍÓÚÑÜÂÊÎÔÛ]{2,}\b")


def fix_chapter_openings(spanish):
    """RV1909's capitalised chapter openings ("Y ACONTECIÓ") -> the usual casing of those words."""
    forms = collections.defaultdict(collections.Counter)   # lowercase word -> casings seen
    for text in spanish.values():
        for word in re.findall(r"\w+", text):
            if not (word.isupper() and len(word) > 1):
                forms[word.lower()][word] += 1
    fixed = {}
    for ref, text in spanish.items():
        if ref[2] != 1:
            fixed[ref] = text
            continue
        words = list(CAPS_WORD.finditer(text))
        # the first run of capitalised words that occur elsewhere in ordinary casing
        run = []
        for match in words:
            # a word never seen in ordinary casing (a rare verb form: REASUMIÓ) is still an opening
            # when it is the first capitalised word and runs on into more words
            runs_on = not run and re.match(f"\\s+{LETTER}", text[match.end():]) is not None
            if match.group(0).lower() not in forms and not (runs_on and match is words[0]):
                if run:
                    break
                continue          # ALEPH, JAH: capitals everywhere, left alone
            if run and text[run[-1].end():match.start()].strip(" ,"):
                break
            run.append(match)
        for match in reversed(run):
            word = match.group(0)
            seen = forms.get(word.lower())
            casing = min(seen.items(), key=lambda kv: (-kv[1], kv[0]))[0] if seen else word.capitalize()
            before = text[:match.start()].rstrip()
            if not before or before[-1] in ".!?¡¿\"“(":
                casing = casing[0].upper() + casing[1:]
            text = text[:match.start()] + casing + text[match.end():]
        fixed[ref] = text
    return fixed


# ---------------------------------------------------------------------------------------------
# Alignment checks

def content_words(text):
    return sorted(set(w for w in re.findall(r"\w+", text.lower()) if len(w) >= 3 and not w.isdigit()))


def translation_table(pairs):
    """English word -> its (up to) 3 Spanish words of highest Dice coefficient (>= 0.1)."""
    english = {ref: content_words(en) for ref, (en, es) in pairs.items()}
    spanish = {ref: content_words(es) for ref, (en, es) in pairs.items()}
    en_count = collections.Counter(w for words in english.values() for w in words)
    es_count = collections.Counter(w for words in spanish.values() for w in words)
    verses_of = collections.defaultdict(list)
    for ref, words in english.items():
        for w in words:
            if en_count[w] >= 3:
                verses_of[w].append(ref)
    table = {}
    for word in sorted(verses_of):
        together = collections.Counter()
        for ref in verses_of[word]:
            together.update(w for w in spanish[ref] if es_count[w] >= 3)
        scored = sorted(((2 * n / (en_count[word] + es_count[s]), s) for s, n in together.items() if n >= 2),
                        key=lambda x: (-x[0], x[1]))
        best = frozenset(s for dice, s in scored[:3] if dice >= 0.1)
        if best:
            table[word] = best
    return table


def match_score(table, english, spanish):
    """Share of the English words (those in the table) whose translation occurs in the Spanish."""
    if english is None or spanish is None:
        return None
    words = [w for w in content_words(english) if w in table]
    if not words:
        return None
    present = set(content_words(spanish))
    return sum(1 for w in words if table[w] & present) / len(words)


def misaligned_chapters(pairs, spanish):
    """{(book, chapter): reason} for chapters whose Spanish verses are shifted against the English."""
    table = translation_table(pairs)
    chapters = collections.defaultdict(list)
    for ref in pairs:
        chapters[ref[:2]].append(ref[2])
    bad = {}
    for chapter, verses in chapters.items():
        own_scores, shifted_scores, run, longest_run, previous = [], [], 0, 0, None
        for verse in verses:
            english = pairs[chapter + (verse,)][0]
            own = match_score(table, english, pairs[chapter + (verse,)][1]) or 0.0
            neighbours = [match_score(table, english, spanish.get(chapter + (verse + d,))) or 0.0 for d in (-1, 1)]
            shifted = max(neighbours)
            own_scores.append(own)
            shifted_scores.append(shifted)
            flagged = shifted > own + 0.15
            run = run + 1 if flagged and previous == verse - 1 and run > 0 else (1 if flagged else 0)
            longest_run = max(longest_run, run)
            previous = verse
        own_mean = sum(own_scores) / len(own_scores)
        shifted_mean = sum(shifted_scores) / len(shifted_scores)
        if longest_run >= 3:
            bad[chapter] = f"{longest_run} consecutive verses match a neighbouring verse better"
        elif shifted_mean > own_mean - 0.05:
            bad[chapter] = f"verses match neighbours ({shifted_mean:.2f}) as well as their own ({own_mean:.2f})"
        elif own_mean < 0.3:
            bad[chapter] = f"verses hardly match their own ({own_mean:.2f})"
    return bad


def normalized(text):
    return " ".join(re.findall(r"\w+", text.lower()))


# ---------------------------------------------------------------------------------------------
# Building

def build(Sword):
    manager = Sword.SWMgr()
    raw_en = read_module(Sword, manager, MODULES["en"])
    raw_es = read_module(Sword, manager, MODULES["es"])
    last_verse = {}
    for ref in raw_es:
        last_verse[ref[0]] = max(last_verse.get(ref[0], (0, 0)), ref[1:])
    english = {ref: clean_english(raw) for ref, raw in raw_en.items()}
    spanish = {ref: clean_spanish(raw, ref[1:] == last_verse[ref[0]]) for ref, raw in raw_es.items()}
    spanish = fix_chapter_openings(spanish)
    english = {ref: t for ref, t in english.items() if t}
    spanish = {ref: t for ref, t in spanish.items() if t}
    stats = collections.OrderedDict()
    stats["verses_en"] = len(english)
    stats["verses_es"] = len(spanish)

    pairs = collections.OrderedDict((ref, (english[ref], spanish[ref])) for ref in english if ref in spanish)
    stats["pairs_by_reference"] = len(pairs)
    bad = misaligned_chapters(pairs, spanish)
    kept = collections.OrderedDict()
    dropped_misaligned, dropped_ratio = 0, []
    for ref, (en, es) in pairs.items():
        if ref[:2] in bad:
            dropped_misaligned += 1
            continue
        ratio = (len(es) + 10) / (len(en) + 10)    # +10: one-word verses vary more
        if not MIN_LENGTH_RATIO <= ratio <= MAX_LENGTH_RATIO:
            dropped_ratio.append(ref)
            continue
        kept[ref] = (en, es)
    stats["dropped_misaligned_chapters"] = dropped_misaligned
    stats["dropped_length_ratio"] = len(dropped_ratio)

    split_of = lambda ref: "test" if ref[0] in TEST_BOOKS else "dev" if ref[0] in DEV_BOOKS else "train"
    splits = {name: [] for name in SPLITS}
    for ref, pair in kept.items():
        splits[split_of(ref)].append((ref, pair))
    held_en = {normalized(en) for name in ("dev", "test") for _, (en, es) in splits[name]}
    held_es = {normalized(es) for name in ("dev", "test") for _, (en, es) in splits[name]}
    train, duplicates = [], []
    for ref, (en, es) in splits["train"]:
        if normalized(en) in held_en or normalized(es) in held_es:
            duplicates.append(ref)
        else:
            train.append((ref, (en, es)))
    stats["dropped_duplicating_held_out"] = len(duplicates)
    splits["train"] = train
    for name in SPLITS:
        stats[name] = len(splits[name])
    dropped = {"chapters": bad, "length_ratio": dropped_ratio, "duplicating_held_out": duplicates}
    return splits, stats, dropped


def write_corpus(out, splits, stats, dropped, fingerprint):
    os.makedirs(out, exist_ok=True)
    files = {}
    for name in SPLITS:
        rows = splits[name]
        files[f"{name}.en"] = "".join(en + "\n" for _, (en, es) in rows)
        files[f"{name}.es"] = "".join(es + "\n" for _, (en, es) in rows)
        files[f"{name}.ref"] = "".join(f"{b}.{c}.{v}\n" for (b, c, v), _ in rows)
    sums = "".join(f"{hashlib.sha256(text.encode()).hexdigest()}  {name}\n" for name, text in sorted(files.items()))
    words = {f"{name}.{lang}": sum(len(line.split()) for line in files[f"{name}.{lang}"].splitlines())
             for name in SPLITS for lang in ("en", "es")}
    manifest = {
        "checksum": hashlib.sha256(sums.encode()).hexdigest(),
        "inputs": fingerprint,
        "counts": stats,
        "words": words,
        "splits": {"test": list(TEST_BOOKS), "dev": list(DEV_BOOKS), "train": "all other books with both texts"},
        "dropped_chapters": {f"{b} {c}": reason for (b, c), reason in sorted(dropped["chapters"].items())},
        "dropped_pairs": {kind: [f"{b}.{c}.{v}" for b, c, v in dropped[kind]]
                          for kind in ("length_ratio", "duplicating_held_out")},
    }
    files["SHA256SUMS"] = sums
    files["corpus.json"] = json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"
    for name, text in files.items():           # each file atomically, the manifest last
        handle, temporary = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, os.path.join(out, name))
    return manifest


def up_to_date(out, fingerprint):
    """The manifest if the corpus in `out` is complete, intact and made from these inputs."""
    try:
        with open(os.path.join(out, "corpus.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        with open(os.path.join(out, "SHA256SUMS"), encoding="utf-8") as f:
            sums = f.read()
    except (OSError, ValueError):
        return None
    if manifest.get("inputs") != fingerprint or hashlib.sha256(sums.encode()).hexdigest() != manifest.get("checksum"):
        return None
    for line in sums.splitlines():
        digest, name = line.split("  ", 1)
        try:
            with open(os.path.join(out, name), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != digest:
                    return None
        except OSError:
            return None
    return manifest


def report(out, manifest, state):
    counts, words = manifest["counts"], manifest["words"]
    print(f"corpus {state}: {out}")
    print(f"  verses: English {counts['verses_en']}, Spanish {counts['verses_es']}, "
          f"paired by reference {counts['pairs_by_reference']}")
    print(f"  dropped: {counts['dropped_misaligned_chapters']} in {len(manifest['dropped_chapters'])} misaligned chapters "
          f"({', '.join(manifest['dropped_chapters'])}), {counts['dropped_length_ratio']} with an extreme length ratio, "
          f"{counts['dropped_duplicating_held_out']} training pairs duplicating dev/test text")
    for name in SPLITS:
        print(f"  {name:5s} {counts[name]:6d} pairs, {words[name + '.en']:7d} English / {words[name + '.es']:7d} Spanish words")
    print(f"  checksum {manifest['checksum']} (sha256 of SHA256SUMS)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(REPO, "out", "corpus"), help="output directory (default out/corpus)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the corpus is up to date")
    parser.add_argument("--no-install", action="store_true", help="do not install missing Debian packages")
    args = parser.parse_args()

    Sword = import_sword(install=not args.no_install)
    if Sword is None:
        print("error: the SWORD modules (" + ", ".join(PACKAGES) + ") are not available; install them with "
              "`bash scripts/bootstrap.sh " + " ".join(PACKAGES) + "` (as root)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    manager = Sword.SWMgr()
    with open(os.path.abspath(__file__), "rb") as f:
        script_digest = hashlib.sha256(f.read()).hexdigest()
    fingerprint = {"script_sha256": script_digest, "sword": Sword.SWORD_VERSION_STR}
    for lang, name in MODULES.items():
        fingerprint[f"{lang}_module"] = f"{name} {module_version(manager, name)}"

    manifest = None if args.force else up_to_date(args.out, fingerprint)
    if manifest is not None:
        report(args.out, manifest, "up to date")
        return 0
    log(f"building the corpus in {args.out}")
    splits, stats, dropped = build(Sword)
    manifest = write_corpus(args.out, splits, stats, dropped, fingerprint)
    report(args.out, manifest, "written")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
