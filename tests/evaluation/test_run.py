"""Scoring a run folder on a corpus split from Python, as `attnkit eval` does."""

import gzip
import json
import math

import datasets
import pytest
import torch

from attnkit.cli import main
from attnkit.data import cmudict
from attnkit.data.datasets import LanguageModelDataset
from attnkit.errors import AttnkitError
from attnkit.evaluation.metrics import (
    bleu,
    chrf,
    length_ratio,
    perplexity,
    phoneme_error_rate,
    word_error_rate,
)
from attnkit.evaluation.run import evaluate_run, read_eval_set
from attnkit.files import read_lines
from attnkit.generation import GenerationConfig
from attnkit.inference import translate
from attnkit.run import RunFolder, load_run
from tests.helpers import RUN_LINES, tiny_run

DE = ["ein hund läuft", "zwei kinder spielen im park", "Ein Hund schläft"]
EN = ["a dog runs", "two children play in the park", "A dog sleeps"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A --data-dir holding a three-sentence Multi30k test split and a small Tiny Shakespeare."""
    root = tmp_path_factory.mktemp("data")
    (root / "multi30k").mkdir()
    for lang, lines in (("de", DE), ("en", EN)):
        with gzip.open(root / "multi30k" / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write("".join(f"{line}\n" for line in lines))
    (root / "tinyshakespeare").mkdir()
    (root / "tinyshakespeare" / "input.txt").write_text("\n".join(RUN_LINES * 20))
    return root


def test_a_translation_run_is_scored_by_bleu_and_chrf_as_the_cli_prints(mt_run, data, capsys):
    generation = GenerationConfig(max_new_tokens=5)
    result = evaluate_run(mt_run, generation, split="test", data_dir=data, limit=2)
    assert result.description == "multi30k test_2016_flickr de->en, 2 sentences"
    run = load_run(mt_run)
    hypotheses = translate(run.model, run.tokenizer, DE[:2], generation)
    assert result.hypotheses == hypotheses
    assert result.scores == [
        bleu(hypotheses, EN[:2]),
        bleu(hypotheses, EN[:2], lowercase=True),
        chrf(hypotheses, EN[:2]),
        length_ratio(hypotheses, EN[:2]),
    ]
    args = ["eval", str(mt_run), "--split", "test", "--data-dir", str(data), "--limit", "2"]
    assert main([*args, "--max-new-tokens", "5", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"attnkit eval {mt_run}: {result.description}"
    width = len("BLEU (lowercased)")
    for score in result.scores:
        assert f"{score.name:<{width}}  {score.value:>8.{score.digits}f}  {score.signature}" in out


def test_a_language_model_is_scored_by_perplexity_on_val_by_default(lm_run, data):
    result = evaluate_run(lm_run, data_dir=data, block_size=8, batch_size=2, limit=1)
    assert result.description == "tinyshakespeare val, 1 batches of 9-token blocks"
    ppl, loss = result.scores
    assert (ppl.name, loss.name, loss.digits) == ("perplexity", "loss", 4)
    assert loss.value == pytest.approx(math.log(ppl.value))
    assert result.hypotheses == []
    run = load_run(lm_run)
    test = read_eval_set(run, data_dir=data, block_size=8, batch_size=2, limit=1)
    assert [len(b.tgt) for b in test.batches] == [2]
    assert perplexity(run.model, test.batches) == ppl


def test_the_runs_saved_data_section_chooses_corpus_languages_and_case(tmp_path, data):
    run_dir = tiny_run(tmp_path / "run", "encoder-decoder")
    RunFolder(run_dir).write_run_config(
        '[data]\ncorpus = "multi30k"\nsrc_lang = "en"\ntgt_lang = "de"\n'
        f'lowercase = true\ndata_dir = "{data}"\n'
    )
    test = read_eval_set(load_run(run_dir))
    assert test.description == "multi30k test_2016_flickr en->de, 3 sentences"
    assert test.sources == [line.lower() for line in EN]
    assert test.references == DE  # only the model's input is lowercased


def test_a_language_model_is_not_scored_on_a_parallel_corpus(lm_run, data, tmp_path):
    with pytest.raises(AttnkitError, match="multi30k is a parallel corpus, but a decoder model"):
        evaluate_run(lm_run, corpus="multi30k", data_dir=data)
    encoder = tiny_run(tmp_path / "encoder", "encoder")
    with pytest.raises(AttnkitError, match="but an encoder model is scored by perplexity"):
        evaluate_run(encoder, corpus="multi30k", data_dir=data)


def test_a_language_model_trained_on_a_text_file_is_scored_on_what_training_held_out(
    tmp_path, capsys
):
    """eval said "unknown corpus" for a run whose data.corpus is a path; it must read what
    training read: the file, cut at the run's valid_fraction."""
    text = tmp_path / "my text.txt"
    text.write_text("\n".join(RUN_LINES * 10) + "\n")
    run_dir = tiny_run(tmp_path / "run", "decoder")
    RunFolder(run_dir).write_run_config(
        f'[data]\ntask = "language-model"\ncorpus = "{text}"\nvalid_fraction = 0.25\n'
    )
    run = load_run(run_dir)
    test = read_eval_set(run, block_size=8, batch_size=2)
    held_out = LanguageModelDataset.from_lines(
        read_lines(text, keepends=True),
        tokenizer=run.tokenizer,
        block_size=8,
        split="val",
        val_fraction=0.25,
    )
    assert test.description == f"{text} val, {len(test.batches)} batches of 9-token blocks"
    assert torch.equal(
        torch.cat([b.tgt for b in test.batches]), held_out.collate(list(held_out)).tgt
    )
    assert main(["eval", str(run_dir), "--block-size", "8", "--no-progress"]) == 0
    assert "perplexity" in capsys.readouterr().out
    with pytest.raises(AttnkitError, match=r"split 'test' is not one of train, val"):
        read_eval_set(run, split="test", block_size=8)


def text_files(corpus) -> None:
    """A folder of `{split}.{lang}` files: the test split only."""
    (corpus / "test.de").write_text("".join(f"{line}\n" for line in DE))
    (corpus / "test.en").write_text("".join(f"{line}\n" for line in EN))


def jsonl_dataset(corpus) -> None:
    """A dataset of `{split}.jsonl` files, columns named like the languages; eval once called
    it neither a known corpus, a folder of text files nor a dataset."""
    rows = "".join(json.dumps({"de": de, "en": en}) + "\n" for de, en in zip(DE, EN, strict=True))
    for split in ("train", "test"):
        (corpus / f"{split}.jsonl").write_text(rows)


@pytest.mark.parametrize(
    ("write", "missing"),
    [
        (text_files, r"a folder holding val\.de nor a dataset; .*--split"),
        (jsonl_dataset, r"no split 'val' \(it has test, train\)"),
    ],
)
def test_a_translation_trained_on_its_own_corpus_is_scored_on_its_split(
    tmp_path, write, missing
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write(corpus)
    run_dir = tiny_run(tmp_path / "run", "encoder-decoder")
    RunFolder(run_dir).write_run_config(f'[data]\ncorpus = "{corpus}"\n')
    test = read_eval_set(load_run(run_dir))
    assert (test.sources, test.references) == (DE, EN)
    assert test.description == f"{corpus} test de->en, 3 sentences"
    with pytest.raises(AttnkitError, match=missing):
        read_eval_set(load_run(run_dir), split="val")


def test_a_language_model_trained_on_a_dataset_is_scored_on_the_text_it_held_out(
    tmp_path,
) -> None:
    """A saved dataset's text is cut where training cut it: the same blocks as its lines in a
    text file."""
    lines = RUN_LINES * 10
    text = tmp_path / "text.txt"
    text.write_text("".join(f"{line}\n" for line in lines))
    datasets.Dataset.from_dict({"text": lines}).save_to_disk(str(tmp_path / "saved"))
    run_dir = tiny_run(tmp_path / "run", "decoder")
    got, expected = (
        read_eval_set(load_run(run_dir), corpus=str(corpus), block_size=8, batch_size=2)
        for corpus in (tmp_path / "saved", text)
    )
    assert got.split == expected.split == "val"
    assert len(got.batches) == len(expected.batches) > 0
    for a, b in zip(got.batches, expected.batches, strict=True):
        assert torch.equal(a.tgt, b.tgt)


def test_the_reverse_demos_run_and_one_language_twice_are_refused_before_any_download(
    tmp_path, mt_run, capsys
) -> None:
    """eval on the demo's run tried to download Multi30k; de->de was scored (issue 39)."""
    run_dir = tiny_run(tmp_path / "demo", "encoder-decoder")
    RunFolder(run_dir).write_run_config('[data]\ntask = "reverse"\n')
    with pytest.raises(AttnkitError, match="trained on the reverse demo's random digit strings"):
        read_eval_set(load_run(run_dir))
    RunFolder(run_dir).write_run_config('[data]\ntask = "span-corruption"\ncorpus = "multi30k"\n')
    with pytest.raises(AttnkitError, match=r"pre-trained by span corruption.*train.init_from"):
        read_eval_set(load_run(run_dir))  # not scored as a German->English translation
    RunFolder(run_dir).write_run_config('[data]\ntask = "preference"\ncorpus = "pairs"\n')
    with pytest.raises(AttnkitError, match=r"tuned on preference pairs, .* pass --corpus"):
        read_eval_set(load_run(run_dir))
    with pytest.raises(AttnkitError, match="the source and target languages are both 'en'"):
        read_eval_set(load_run(mt_run), src_lang="en", tgt_lang="en")
    assert main(["eval", str(mt_run), "--src-lang", "de", "--tgt-lang", "de"]) == 2
    assert "the source and target languages are both 'de'" in capsys.readouterr().err


# -- grapheme-to-phoneme on cmudict ---------------------------------------------------------------


def test_a_g2p_run_reads_each_test_word_once_with_all_its_pronunciations(g2p_run):
    test = read_eval_set(load_run(g2p_run), limit=20)
    words = cmudict.entries("test")[:20]
    assert test.description == "cmudict test graphemes->phonemes, 20 sources, 21 references"
    assert test.scores == "error-rates"
    assert test.sources == [src for src, _ in words]
    assert test.reference_sets == [targets for _, targets in words]
    assert test.references == [targets[0] for _, targets in words]
    assert max(map(len, test.reference_sets)) == 2  # a word of two pronunciations, both


def test_a_g2p_run_is_scored_by_wer_and_per_as_the_cli_prints(g2p_run, capsys):
    generation = GenerationConfig(max_new_tokens=6)
    result = evaluate_run(g2p_run, generation, limit=20)
    run = load_run(g2p_run)
    words = cmudict.entries("test")[:20]
    hypotheses = translate(run.model, run.tokenizer, [src for src, _ in words], generation)
    assert result.hypotheses == hypotheses
    references = [targets for _, targets in words]
    assert result.scores == [
        word_error_rate(hypotheses, references),
        phoneme_error_rate(hypotheses, references),
    ]
    args = ["eval", str(g2p_run), "--limit", "20", "--max-new-tokens", "6", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"attnkit eval {g2p_run}: {result.description}"
    assert out[1].split() == ["metric", "score", "signature"]
    assert [line.split()[0] for line in out[2:]] == ["WER", "PER"]
    for score in result.scores:
        assert f"{score.name:<6}  {score.value:>8.2f}  {score.signature}" in out


def test_attnkit_translate_reads_a_word_as_its_letters_for_a_g2p_run(
    g2p_run, tmp_path, capsys, monkeypatch
):
    (tmp_path / "words.txt").write_text("Hello\nh e l l o\n")
    read = []

    def spy(model, tokenizer, texts, *args, **kwargs):
        read.extend(texts)
        return translate(model, tokenizer, texts, *args, **kwargs)

    monkeypatch.setattr("attnkit.inference.translate", spy)
    args = ["translate", str(g2p_run), "--input", str(tmp_path / "words.txt"), "--no-progress"]
    assert main([*args, "--max-new-tokens", "5"]) == 0
    assert read == ["h e l l o"] * 2  # the word and its letters, spaced, read alike
    run = load_run(g2p_run)
    expected = translate(run.model, run.tokenizer, read[:1], GenerationConfig(max_new_tokens=5))
    assert capsys.readouterr().out.splitlines() == expected * 2
