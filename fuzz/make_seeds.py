#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets into fuzz/corpus/<target>/: small valid
inputs of every format (so the fuzzer starts inside the parsers, not at their first check) plus
a few broken ones. Run from the repository root after a build: python3 fuzz/make_seeds.py
(needs build/transformer for the model seeds)."""
import json
import os
import struct
import subprocess
import tempfile

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)


micro = {"d_model": 4, "heads": 2, "d_ff": 4, "encoder_layers": 1, "decoder_layers": 1,
         "src_vocab_size": 6, "tgt_vocab_size": 6, "max_positions": 8}

# config: the micro model, the variants the parser knows, and broken ones.
put("config", "micro.json", json.dumps(micro))
put("config", "variants.json", json.dumps(dict(micro, norm="pre", activation="gelu",
    share_embeddings="none", position_encoding="learned", self_attention_window=2,
    src_vocab_size=7, output_bias=True, sinusoid_layout="concat", position_offset=2)))
put("config", "sinusoid_concat.json", json.dumps(dict(micro, sinusoid_layout="concat",
    share_embeddings="target", tgt_vocab_size=9, scale_embeddings=False, src_append_eos=False)))
put("config", "empty.json", "{}")
put("config", "bad_heads.json", json.dumps(dict(micro, heads=3)))
put("config", "unknown_key.json", json.dumps(dict(micro, colour="blue")))

# safetensors: micro models from `transformer init`, a bare tensor file, broken headers.
with tempfile.TemporaryDirectory() as tmp:
    for name, config in (("micro", micro), ("variants", dict(micro, norm="pre",
                          share_embeddings="none", position_encoding="learned", output_bias=True))):
        config_path = os.path.join(tmp, name + ".json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        model_path = os.path.join(tmp, name + ".safetensors")
        subprocess.run(["build/transformer", "init", "--config", config_path, "-o", model_path],
                       check=True, stdout=subprocess.DEVNULL)
        with open(model_path, "rb") as f:
            put("safetensors", name + ".safetensors", f.read())


def safetensors(header, payload=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + payload


put("safetensors", "dtypes.safetensors", safetensors({
    "__metadata__": {"note": "x"},
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F16", "shape": [1, 2], "data_offsets": [8, 12]},
    "c": {"dtype": "BF16", "shape": [2], "data_offsets": [12, 16]},
    "d": {"dtype": "F64", "shape": [], "data_offsets": [16, 24]},
    "e": {"dtype": "I64", "shape": [1], "data_offsets": [24, 32]},
    "f": {"dtype": "I32", "shape": [1], "data_offsets": [32, 36]}}, bytes(range(36))))
put("safetensors", "overlap.safetensors", safetensors({
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)))
put("safetensors", "huge_shape.safetensors", safetensors({
    "a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}}, bytes(8)))
put("safetensors", "short.safetensors", struct.pack("<Q", 1000) + b"{}")


# ctranslate2: tiny model.bin files of versions 1, 3 and 6, and the real test model's header.
def ct2_string(s):
    data = s.encode() + b"\0"
    return struct.pack("<H", len(data)) + data


def ct2_model(version, variables, aliases=()):
    out = struct.pack("<I", version)
    if version >= 2:
        out += ct2_string("TransformerSpec") + struct.pack("<I", 1)
    out += struct.pack("<I", len(variables))
    for name, shape, dtype, data in variables:
        out += ct2_string(name) + struct.pack("<B", len(shape))
        out += b"".join(struct.pack("<I", d) for d in shape)
        item = {0: 4, 1: 1, 2: 2, 3: 4, 4: 2, 5: 2}[dtype]
        if version >= 4:
            out += struct.pack("<BI", dtype, len(data))
        else:
            out += struct.pack("<BI", item, len(data) // item)
        out += data
    if version >= 3:
        out += struct.pack("<I", len(aliases))
        for alias, target in aliases:
            out += ct2_string(alias) + ct2_string(target)
    return out


f32 = struct.pack("<4f", 0.5, -1.0, 2.0, 0.25)
put("ctranslate2", "v1.bin", ct2_model(1, [("w", [2, 2], 0, f32)]))
put("ctranslate2", "v3_alias.bin", ct2_model(3, [("w", [4], 0, f32)], [("v", "w")]))
put("ctranslate2", "v6_int8.bin", ct2_model(6, [
    ("encoder/layer_0/ffn/linear_0/weight", [2, 2], 1, bytes([1, 2, 3, 250])),
    ("encoder/layer_0/ffn/linear_0/weight_scale", [2], 0, struct.pack("<2f", 2.0, 4.0)),
    ("b", [2], 4, struct.pack("<2H", 0x3C00, 0xC000)),
    ("c", [2], 5, struct.pack("<2H", 0x3F80, 0x4000)),
    ("d", [1], 2, struct.pack("<h", -7)), ("e", [1], 3, struct.pack("<i", 9))],
    [("shared", "b")]))
# Empty variables of every dtype (a [0] shape: no data at all, the tensor has no storage).
put("ctranslate2", "v6_empty.bin", ct2_model(6, [("z" + str(t), [0], t, b"") for t in range(6)]))
with open("tests/data/ctranslate2-aren-transliteration/aren-transliteration-i8/model.bin", "rb") as f:
    put("ctranslate2", "aren_i8_prefix.bin", f.read()[:4096])
# A spec-revision-7 file as CTranslate2 4.x converters write it (aliases, int16 scales).
with open("tests/data/ctranslate2-spec7/pre_gelu_target_int16/model.bin", "rb") as f:
    put("ctranslate2", "spec7_int16.bin", f.read())

# id lines: the first byte picks the vocabulary size (byte * 1000 + 1).
put("id_line", "plain", b"\x01" + b"4 5 6 999")
put("id_line", "spaces", b"\x02" + b"  12   0 1999  ")
put("id_line", "bad", b"\x00" + b"1 -2 x 99999999999999999999")
put("id_line", "empty", b"\x05")

# sentencepiece / bleu: real text in several scripts, and edge cases.
lines = ["In the beginning God created the heavens and the earth.",
         "En el principio crió Dios los cielos y la tierra.",
         "¿Qué es esto? ¡Sí, señor! naïve café — «comillas» 東京 Ελληνικά",
         "  leading and   inner spaces\t\ttabs ",
         "", "0123456789 $5.00 3,000 e.g. U.S.A. don't-stop"]
for i, line in enumerate(lines):
    put("sentencepiece", f"line{i}", line)
    put("bleu", f"pair{i}", line + "\n" + lines[(i + 1) % len(lines)])
put("bleu", "same", lines[0] + "\n" + lines[0])
