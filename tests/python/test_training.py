"""transformer_cpp.train(): the library's training entry point from Python. The same run through
the module and through `transformer train` writes byte-identical models (one code path, one set
of defaults), the trained model translates through transformer_cpp.Translator, and bad options
raise ValueError / RuntimeError with the command line's messages."""
import math
import os
import pathlib
import random
import subprocess

import pytest

import transformer_cpp

# A copy task over words w0..w11 with pad/bos/eos/unk at ids 0-3 (a token-list vocabulary).
WORDS = [f"w{i}" for i in range(12)]
RUN = dict(preset="tiny", max_steps=30, warmup=10, lr_factor=2.0, batch_tokens=256, seed=7,
           log_every=10, save_every=0, valid_every=0, keep=0, dropout=0.0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy")
    (root / "vocab.txt").write_text("\n".join(["<pad>", "<s>", "</s>", "<unk>"] + WORDS) + "\n")
    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(200)]
    (root / "train.src").write_text("\n".join(lines) + "\n")
    (root / "train.tgt").write_text("\n".join(lines) + "\n")
    return root


def cli_flags(options):
    flags = []
    for key, value in options.items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    return flags


def test_module_and_command_line_train_the_same_model(corpus, tmp_path):
    vocab = str(corpus / "vocab.txt")
    result = transformer_cpp.train(str(tmp_path / "module"), str(corpus / "train.src"),
                                   str(corpus / "train.tgt"), vocabs=[vocab], **RUN)
    assert result.steps == RUN["max_steps"] and not result.interrupted
    # Better than a uniform guess over the 16 tokens (an untrained model starts near 3.1).
    assert 0 < result.last_loss < math.log(16)
    subprocess.run([os.environ["TFM_CLI"], "train", "--model-dir", str(tmp_path / "cli"),
                    "--train-src", str(corpus / "train.src"), "--train-tgt",
                    str(corpus / "train.tgt"), "--vocabs", vocab] + cli_flags(RUN),
                   check=True, capture_output=True)
    module_model = (tmp_path / "module" / "model.safetensors").read_bytes()
    assert module_model == (tmp_path / "cli" / "model.safetensors").read_bytes()

    translator = transformer_cpp.Translator(str(tmp_path / "module"), compute_type="float32")
    assert translator.parameters > 0
    (translated,) = translator.translate_batch([["w1", "w2", "w3"]], beam_size=2)
    assert all(token in WORDS for token in translated.hypotheses[0])


def test_options_are_checked(corpus, tmp_path):
    files = (str(tmp_path / "run"), str(corpus / "train.src"), str(corpus / "train.tgt"))
    vocabs = [str(corpus / "vocab.txt")]
    with pytest.raises(ValueError, match="no option \"max_step\""):
        transformer_cpp.train(*files, vocabs=vocabs, preset="tiny", max_step=3)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        transformer_cpp.train(*files, vocabs=vocabs, preset="tiny", compute_type="int8")
    with pytest.raises(ValueError, match="max_steps"):
        transformer_cpp.train(*files, vocabs=vocabs, preset="tiny", max_steps="many")
    with pytest.raises(RuntimeError, match="dropout probabilities must be in"):
        transformer_cpp.train(*files, vocabs=vocabs, preset="tiny", dropout=1.5)
    with pytest.raises(RuntimeError, match="--optimizer must be adam or sgd"):
        transformer_cpp.train(*files, vocabs=vocabs, preset="tiny", optimizer="adagrad")
    with pytest.raises(ValueError, match="preset"):
        transformer_cpp.train(*files, vocabs=vocabs, preset="tiny", config="c.json")
    assert not pathlib.Path(files[0]).exists()  # nothing written by a refused run
