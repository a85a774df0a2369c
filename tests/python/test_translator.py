"""The Python module transformer_cpp against CTranslate2's own Arabic→English transliteration
test model (tests/data, imported with `transformer import-ctranslate2`): the translations and
the score that CTranslate2's test suite expects of it, the n-best list, pre-tokenized input,
errors, and the GIL released while the engine works."""
import os
import pathlib
import subprocess
import threading
import time

import pytest

import transformer_cpp

DATA = pathlib.Path(__file__).resolve().parent.parent / "data" / "ctranslate2-aren-transliteration"
SOURCE = "آ ت ز م و ن"
# CTranslate2's expected outputs for its test model (its tests: translator_test / test_translator).
EXPECTED = {"آ ت ز م و ن": "a t z m o n", "آ ت ش ي س و ن": "a c h i s o n"}
EXPECTED_SCORE = -1.061750  # log p("a t z m o n" + eos | source), CTranslate2's score_batch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("aren") / "model"
    subprocess.run([os.environ["TFM_CLI"], "import-ctranslate2",
                    str(DATA / "aren-transliteration"), "-o", str(out)],
                   check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def translator(model_dir):
    return transformer_cpp.Translator(model_dir, device="cpu", compute_type="float32")


def test_translates_texts_as_ctranslate2_expects(translator):
    sources = list(EXPECTED)
    results = translator.translate_batch(sources, beam_size=4)
    assert [r.hypotheses[0] for r in results] == [EXPECTED[s] for s in sources]
    assert all(len(r.hypotheses) == 1 and len(r.scores) == 1 for r in results)


def test_n_best_are_ranked_and_scored(translator):
    (result,) = translator.translate_batch([SOURCE], beam_size=4, num_hypotheses=3,
                                           length_penalty=0)
    assert len(result.hypotheses) == 3
    assert result.hypotheses[0] == EXPECTED[SOURCE]
    assert result.scores == sorted(result.scores, reverse=True)
    assert result.scores[0] == pytest.approx(EXPECTED_SCORE, abs=1e-5)


def test_pre_tokenized_input_gives_tokens(translator):
    (result,) = translator.translate_batch([SOURCE.split()], beam_size=1)
    assert result.hypotheses[0] == EXPECTED[SOURCE].split()
    (prefixed,) = translator.translate_batch([SOURCE.split()], target_prefix=[["a", "t"]])
    assert prefixed.hypotheses[0][:2] == ["a", "t"]


def test_order_empty_inputs_and_batching(translator):
    sources = ["", SOURCE, "آ ت ش ي س و ن", ""]
    for tokens in (1, 16, 4096):
        results = translator.translate_batch(sources, max_batch_tokens=tokens)
        assert [r.hypotheses for r in results] == [[], ["a t z m o n"], ["a c h i s o n"], []]


def test_attention_rows_are_distributions(translator):
    (result,) = translator.translate_batch([SOURCE], return_attention=True)
    rows = result.attention[0]
    assert len(rows) == len(result.hypotheses[0].split()) + 1  # every token and eos
    for row in rows:
        assert len(row) == len(SOURCE.split())  # source tokens (this model appends no eos)
        assert sum(row) == pytest.approx(1, abs=1e-4)


def test_score_batch_is_ctranslate2_score(translator):
    (scored,) = translator.score_batch([SOURCE], [EXPECTED[SOURCE]])
    assert scored.log_prob == pytest.approx(EXPECTED_SCORE, abs=1e-5)
    assert len(scored.log_probs) == len(EXPECTED[SOURCE].split()) + 1
    assert sum(scored.log_probs) == pytest.approx(scored.log_prob, abs=1e-5)


def test_sampling_draws_repeat_for_a_seed_and_score_as_the_model_does(translator):
    sources = [SOURCE, "آ ت ش ي س و ن"]
    kwargs = dict(beam_size=1, sampling_topk=10, sampling_temperature=2.0, num_hypotheses=8)
    first = translator.translate_batch(sources, sampling_seed=5, **kwargs)
    again = translator.translate_batch(sources, sampling_seed=5, max_batch_tokens=1, **kwargs)
    assert [r.hypotheses for r in first] == [r.hypotheses for r in again]
    other = translator.translate_batch(sources, sampling_seed=6, **kwargs)
    assert [r.hypotheses for r in other] != [r.hypotheses for r in first]
    for result, source in zip(first, sources):
        assert len(result.hypotheses) == 8
        assert len(set(result.hypotheses)) > 1  # a flattened distribution draws varied outputs
        # each draw's score is the model's own log p of it (+ eos), untempered, as scoring gives
        # (a draw cut by the length limit, a · 7 + 50 tokens, has no eos to score)
        for text, score in zip(result.hypotheses, result.scores):
            if len(text.split()) >= len(source.split()) + 50:
                continue
            (scored,) = translator.score_batch([source], [text])
            assert score == pytest.approx(scored.log_prob, abs=1e-3)
    with pytest.raises(ValueError, match="beam_size 1"):
        translator.translate_batch([SOURCE], beam_size=2, sampling_topk=5)
    with pytest.raises(ValueError, match="sampling_topp"):
        translator.translate_batch([SOURCE], beam_size=1, sampling_topk=5, sampling_topp=0)


def test_properties(translator):
    assert translator.device == "cpu"
    assert translator.compute_type == "float32"
    assert translator.parameters > 0
    assert transformer_cpp.__version__.count(".") == 2


def test_errors_are_python_exceptions(model_dir, translator):
    with pytest.raises(ValueError, match="num_hypotheses"):
        translator.translate_batch([SOURCE], beam_size=2, num_hypotheses=3)
    with pytest.raises(ValueError, match="min_decoding_length 6 is greater than max_decoding_length 5"):
        translator.translate_batch([SOURCE], min_decoding_length=6, max_decoding_length=5)
    with pytest.raises(ValueError, match="compute-type"):
        transformer_cpp.Translator(model_dir, compute_type="int4")
    with pytest.raises(RuntimeError, match="nowhere"):
        transformer_cpp.Translator(model_dir + "/nowhere")
    with pytest.raises(RuntimeError, match="unknown device"):
        transformer_cpp.Translator(model_dir, device="tpu")
    too_long = " ".join(["آ"] * 5000)  # more tokens than the model has positions
    with pytest.raises(RuntimeError, match="target 1: .* longer than the model's max_positions"):
        translator.score_batch([SOURCE, SOURCE], [EXPECTED[SOURCE], too_long])


def test_the_gil_is_released_while_translating(translator):
    sources = [SOURCE, "آ ت ش ي س و ن"] * 1500
    done = []
    worker = threading.Thread(target=lambda: done.append(translator.translate_batch(sources)))
    ticks = 0
    worker.start()
    while worker.is_alive():
        ticks += 1  # runs only while the worker's call does not hold the GIL
        time.sleep(0.001)
    worker.join()
    assert len(done[0]) == len(sources)
    assert ticks >= 10
