#!/usr/bin/python3
"""The committed fixtures are what their generators write today: tests/fixtures/generate.py
(PyTorch float64 oracle) and tests/fixtures/make_ctranslate2_models.py (CTranslate2 model
directories) run into a temporary directory and every file is compared with the committed one, so
that a generator and its fixtures cannot drift apart unnoticed.

The comparison is byte for byte, with one allowance: a float32 value of a safetensors file may
be one unit in the last place away from the committed one. The generators compute in float64
and store float32; the last float64 bits depend on the machine's BLAS kernels, and once in a
great while they carry a value across a float32 rounding boundary. A changed generator moves
values by far more than that. Everything else (file set, headers, metadata, shapes, dtypes,
every byte of the CTranslate2 directories) must be identical.

    /usr/bin/python3 tests/fixtures_regenerate_test.py      (Debian's python3-torch, numpy)
"""
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
GENERATORS = [
    # (generator, committed directory, files that directory holds besides the outputs)
    (ROOT / "tests/fixtures/generate.py", ROOT / "tests/fixtures", {".py"}),
    (ROOT / "tests/fixtures/make_ctranslate2_models.py", ROOT / "tests/data/ctranslate2-spec7",
     set()),
]


def read_safetensors(data):
    """(header without data offsets, {name: raw bytes}) of a safetensors file's bytes."""
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry.pop("data_offsets")
        tensors[name] = body[begin:end]
    return header, tensors


def safetensors_difference(fresh, committed):
    """None when the files agree (float32 values within one ulp), else what differs."""
    header_a, tensors_a = read_safetensors(fresh)
    header_b, tensors_b = read_safetensors(committed)
    if header_a != header_b:
        return "headers differ (names, dtypes, shapes or metadata)"
    one_ulp = 0
    for name, entry in header_a.items():
        if name == "__metadata__" or tensors_a[name] == tensors_b[name]:
            continue
        if entry["dtype"] != "F32" or len(tensors_a[name]) != len(tensors_b[name]):
            return "%s differs" % name
        a = np.frombuffer(tensors_a[name], dtype=np.int32).astype(np.int64)
        b = np.frombuffer(tensors_b[name], dtype=np.int32).astype(np.int64)
        # Same sign and adjacent bit patterns: one float32 ulp apart.
        far = ((a < 0) != (b < 0)) | (np.abs(a - b) > 1)
        if far.any():
            index = int(np.argmax(far))
            values = (np.frombuffer(tensors_a[name], dtype=np.float32)[index],
                      np.frombuffer(tensors_b[name], dtype=np.float32)[index])
            return "%s: %d of %d values differ, e.g. [%d] %r regenerated, %r committed" % (
                name, int(far.sum()), far.size, index, float(values[0]), float(values[1]))
        one_ulp += int((a != b).sum())
    return None if one_ulp == 0 else ("one-ulp", one_ulp)


def files(directory):
    return {p.relative_to(directory) for p in directory.rglob("*") if p.is_file()}


def main():
    problems = []
    with tempfile.TemporaryDirectory(prefix="tfm-fixtures-") as scratch:
        for generator, committed, own_files in GENERATORS:
            out = pathlib.Path(scratch) / committed.name
            run = subprocess.run([sys.executable, str(generator), "--out-dir", str(out)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                problems.append("%s failed:\n%s" % (generator.name, run.stderr[-3000:]))
                continue
            fresh, kept = files(out), {p for p in files(committed) if p.suffix not in own_files}
            for path in sorted(kept - fresh):
                problems.append("%s is committed but %s no longer writes it"
                                % (committed / path, generator.name))
            for path in sorted(fresh - kept):
                problems.append("%s writes %s, which is not committed" % (generator.name, path))
            compared = 0
            for path in sorted(fresh & kept):
                a, b = (out / path).read_bytes(), (committed / path).read_bytes()
                compared += 1
                if a == b:
                    continue
                difference = (safetensors_difference(a, b) if path.suffix == ".safetensors"
                              else "bytes differ")
                if isinstance(difference, tuple):
                    print("%s: %d float32 values one ulp away (float64 rounding of this machine)"
                          % (committed / path, difference[1]))
                elif difference:
                    problems.append("%s: %s" % (committed / path, difference))
            print("%s: %d files compared with %s" % (generator.name, compared, committed))
    for problem in problems:
        print("error: " + problem, file=sys.stderr)
    if problems:
        print("error: re-run the generator and commit what it writes, or find what changed",
              file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
