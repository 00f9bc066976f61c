"""Preference pairs from sampled translations: the ranking by hand, the pairs written as the
preference reader reads them, each chosen translation scoring above its rejected one, and the
refusals."""

import pytest
import sacrebleu
import torch

from attnkit import AttnkitError
from attnkit.data.preference import PreferencePair, read_pairs
from attnkit.run import load_run
from attnkit.train.run_config import RunConfig
from attnkit.train.sampled_pairs import PairsSection, rank_candidates, sample_pairs, write_pairs
from attnkit.train.tasks import train
from tests.helpers import RUN_LINES, tiny_run, write_corpus


def test_the_best_and_the_worst_candidate_make_the_pair():
    texts, rewards = ["a", "b", "c", "d"], [0.2, 0.9, 0.1, 0.5]
    assert rank_candidates(texts, rewards, 0.0) == ("b", "c", 0.9, 0.1)
    assert rank_candidates(texts, rewards, 0.8) is None  # 0.8 apart: not more than min_gap
    assert rank_candidates(["x", "x"], [0.3, 0.3], 0.0) is None  # one text twice: no pair
    assert rank_candidates(["x", "y"], [0.3, 0.3], 0.0) is None  # a tie ranks nothing


def test_written_pairs_read_back(tmp_path):
    pairs = [PreferencePair("ein hund", "a dog", "the the"), PreferencePair('"x"', "ü", "\\")]
    write_pairs(tmp_path / "train.jsonl", pairs)
    assert read_pairs(tmp_path / "train.jsonl") == pairs


def test_each_chosen_translation_outscores_its_rejected_one(tmp_path):
    run = load_run(tiny_run(tmp_path / "base", "encoder-decoder"))
    sources = RUN_LINES[:2] * 3
    references = ["a dog runs", "two children play in the park"] * 3
    torch.manual_seed(0)
    section = PairsSection(candidates=4, reward="chrf", max_new_tokens=10)
    pairs, summary = sample_pairs(run.model, run.tokenizer, sources, references, section, 4)
    assert pairs and summary["sources"] == 6 and summary["pairs"] == len(pairs)
    reference = dict(zip(sources, references, strict=True))
    for pair in pairs:
        good = sacrebleu.sentence_chrf(pair.chosen, [reference[pair.prompt]]).score
        bad = sacrebleu.sentence_chrf(pair.rejected, [reference[pair.prompt]]).score
        assert good > bad and pair.chosen != pair.rejected
    assert summary["chosen_chrf"] > summary["rejected_chrf"]


def test_bad_settings_and_a_split_without_pairs_are_refused(tmp_path):
    with pytest.raises(AttnkitError, match="at least 2"):
        PairsSection(candidates=1)
    with pytest.raises(AttnkitError, match=r"pairs\.reward"):
        PairsSection(reward="rouge")
    corpus = tmp_path / "corpus"
    write_corpus(corpus, "train", 4, 0)
    write_corpus(corpus, "val", 2, 1)
    base = tiny_run(tmp_path / "b", "encoder-decoder")
    config = RunConfig.from_dict(
        {
            "data": {"task": "sampled-pairs", "corpus": str(corpus)},
            "pairs": {"min_gap": 1.0, "max_new_tokens": 4},
            "train": {"init_from": str(base), "out_dir": str(tmp_path / "pairs")},
        }
    )
    with pytest.raises(AttnkitError, match=r"lower it, or raise pairs\.candidates"):
        train(config)
    with pytest.raises(AttnkitError, match="nothing to resume"):
        train(config, resume=True)
    decoder = RunConfig.from_dict(
        {
            "data": {"task": "sampled-pairs", "corpus": str(corpus)},
            "train": {
                "init_from": str(tiny_run(tmp_path / "lm", "decoder")),
                "out_dir": str(tmp_path / "p2"),
            },
        }
    )
    with pytest.raises(AttnkitError, match="trains an encoder-decoder model"):
        train(decoder)
