"""Preference pairs: JSON lines read or refused naming file and line, encoded for either model
shape, batched as chosen rows then rejected rows with the response's tokens marked."""

import json

import pytest
import torch

from attnkit.data import TokenBudgetSampler
from attnkit.data.preference import (
    PreferenceDataset,
    PreferencePair,
    preference_batch,
    read_pairs,
)
from attnkit.errors import AttnkitError
from attnkit.tokenizer import Tokenizer
from tests.helpers import preference_rows, write_preference_pairs


def test_pairs_are_read_with_trls_field_names_and_blank_lines_skipped(tmp_path):
    path = write_preference_pairs(tmp_path / "pairs", "abcdef", train=5, val=2) / "train.jsonl"
    path.write_text(path.read_text() + "\n")
    rows = preference_rows(5, 0, "abcdef")
    assert read_pairs(path) == [PreferencePair(**row) for row in rows]
    # The rule of the helper's pairs: the chosen response goes on from the prompt's last letter.
    for row in rows:
        assert row["chosen"][0] == "abcdef"[("abcdef".index(row["prompt"][-1]) + 1) % 6]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"line 2 is not valid JSON"),
        ('["a", "b", "c"]', r"line 2 holds list, not an object with prompt, chosen, rejected"),
        ('{"prompt": "a", "chosen": "b"}', r"line 2 has no 'rejected'"),
        ('{"prompt": "a", "chosen": ["b"], "rejected": "c"}', r"line 2 has a non-string 'chosen'"),
        ('{"prompt": "a", "chosen": "b", "rejected": "  "}', r"line 2 has an empty 'rejected'"),
    ],
)
def test_a_bad_line_is_refused_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "train.jsonl"
    good = json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"})
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(AttnkitError, match=f"{path}, {message}"):
        read_pairs(path)


def test_a_missing_or_empty_file_is_refused(tmp_path):
    with pytest.raises(AttnkitError, match=r"train\.jsonl is missing; a preference corpus"):
        read_pairs(tmp_path / "train.jsonl")
    (tmp_path / "val.jsonl").write_text("\n")
    with pytest.raises(AttnkitError, match="holds no preference pairs"):
        read_pairs(tmp_path / "val.jsonl")


def test_a_decoder_batch_holds_prompt_and_response_and_scores_the_response():
    batch = preference_batch([([5, 6], [7], [8, 9]), ([10], [11, 12], [13])], pad_id=0)
    assert batch.src is None and batch.pairs == 2
    assert batch.tgt.tolist() == [[5, 6, 7, 0], [10, 11, 12, 0], [5, 6, 8, 9], [10, 13, 0, 0]]
    assert batch.scored.int().tolist() == [[0, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 1], [0, 1, 0, 0]]


def test_an_encoder_decoder_batch_reads_the_prompt_as_the_source():
    batch = preference_batch([([5, 2], [7, 2], [8, 9, 2])], pad_id=0, decoder_start_id=1)
    assert batch.src.tolist() == [[5, 2], [5, 2]]
    assert batch.tgt.tolist() == [[1, 7, 2, 0], [1, 8, 9, 2]]
    assert batch.scored.tolist() == [[False, True, True, False], [False, True, True, True]]
    moved = batch.to("cpu")
    assert torch.equal(moved.scored, batch.scored) and torch.equal(moved.src, batch.src)


def test_the_dataset_encodes_for_its_shape_and_skips_pairs_over_max_len(tmp_path, caplog):
    tokenizer = Tokenizer.train("char", texts=["abcdef"] * 3)
    pairs = [PreferencePair("abc", "de", "f"), PreferencePair("abcdef", "abcdef", "a")]
    ids = tokenizer.encode
    decoder = PreferenceDataset(pairs, tokenizer, max_len=8, name="train.jsonl")
    assert len(decoder) == 1 and "skipped 1 longer than 8 ids" in caplog.text
    assert decoder[0] == (ids("abc"), ids("de"), ids("f"))
    assert decoder.lengths.tolist() == [[5, 4]]  # each response's row: prompt and response
    seq2seq = PreferenceDataset(pairs, tokenizer, decoder_start_id=1, max_len=8, name="t")
    assert len(seq2seq) == 2
    eos = [tokenizer.eos_id]
    assert seq2seq[0] == (ids("abc") + eos, ids("de") + eos, ids("f") + eos)
    assert seq2seq.lengths.tolist() == [[4, 4, 3], [7, 8, 3]]  # source, <s> y </s> twice
    sampler = TokenBudgetSampler(seq2seq.lengths, 8, shuffle=False)
    batches = [seq2seq.collate([seq2seq[i] for i in b]) for b in sampler]
    assert [b.pairs for b in batches] == [1, 1]  # 2 x 8 ids of one side is over the budget
    with pytest.raises(AttnkitError, match="every pair of t is longer than max_len 3 ids"):
        PreferenceDataset(pairs, tokenizer, max_len=3, name="t")
