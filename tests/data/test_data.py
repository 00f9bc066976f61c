"""Data: readers, datasets, known corpora, token-budget batching and collation."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import attnkit.data.corpora as corpora
from attnkit.data import (
    CORPORA,
    LanguageModelDataset,
    ParallelDataset,
    SentenceDataset,
    TokenBudgetSampler,
    corpus_files,
    load_corpus,
    padding_efficiency,
    read_lines,
    read_parallel,
)
from attnkit.data.batch import pad
from attnkit.errors import AttnkitError
from attnkit.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from tests import helpers


@pytest.fixture(scope="module")
def tok(samples: Path) -> Tokenizer:
    files = [samples / "multi30k" / f"val.{lang}.gz" for lang in ("de", "en")]
    return Tokenizer.train("byte-bpe", files=files, vocab_size=1000)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


# -- readers -----------------------------------------------------------------


def test_gzip_is_read_transparently(tmp_path: Path) -> None:
    text = "Zwei Männer.\r\nEin Hund\n\nüber\n".encode()
    plain, packed = write(tmp_path / "a.txt", text), write(tmp_path / "a.txt.gz", text)
    expected = ["Zwei Männer.", "Ein Hund", "", "über"]
    assert list(read_lines(plain)) == list(read_lines(packed)) == expected
    assert "".join(read_lines(packed, keepends=True)) == text.decode()


@pytest.mark.parametrize("name", ["bad.txt", "bad.txt.gz"])
def test_invalid_utf8_names_the_file_and_line(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, b"fine\nalso fine\nbroken \xff\xfe here\n")
    with pytest.raises(AttnkitError, match=rf"{name} line 3 is not valid UTF-8"):
        list(read_lines(path))


def test_corrupt_gzip_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.txt.gz"
    packed = gzip.compress("".join(f"line {i}\n" for i in range(1000)).encode())
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(AttnkitError, match=r"cut\.txt\.gz could not be read after line \d+"):
        list(read_lines(path))


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AttnkitError, match="no text file at"):
        list(read_lines(tmp_path / "nope.txt"))


@pytest.mark.parametrize(("n_src", "n_tgt"), [(3, 2), (2, 4)])
def test_line_count_mismatch_names_both_files_and_counts(
    tmp_path: Path, n_src: int, n_tgt: int
) -> None:
    src = write(tmp_path / "x.de", b"satz\n" * n_src)
    tgt = write(tmp_path / "x.en.gz", b"sentence\n" * n_tgt)
    pattern = rf"{src} has {n_src} lines but {tgt} has {n_tgt}"
    with pytest.raises(AttnkitError, match=pattern):
        list(read_parallel(src, tgt))


def test_pairs_from_tsv_and_jsonl(tmp_path: Path) -> None:
    pairs = [("Ein Hund.", "A dog."), ("Zwei\u00a0Katzen", "Two cats")]
    tsv = write(tmp_path / "p.tsv.gz", "".join(f"{s}\t{t}\n" for s, t in pairs).encode())
    objects = [json.dumps({"src": s, "tgt": t}) for s, t in pairs[:1]]
    lists = [json.dumps([s, t]) for s, t in pairs[1:]]
    jsonl = write(tmp_path / "p.jsonl", "\n".join(objects + lists).encode())
    assert list(read_parallel(tsv)) == list(read_parallel(jsonl)) == pairs


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("p.tsv", "a\tb\nno tab here\n", "p.tsv line 2 is not a pair"),
        ("p.tsv", "a\tb\tc\n", "p.tsv line 1 is not a pair"),
        ("p.jsonl", '{"src": "a", "tgt": "b"}\n{"src": "a"}\n', "p.jsonl line 2 is not a pair"),
        ("p.jsonl", "not json\n", "p.jsonl line 1 is not a pair"),
        ("p.csv", "a,b\n", r"p.csv is neither \.tsv nor \.jsonl"),
    ],
)
def test_bad_pair_files_are_errors(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = write(tmp_path / name, content.encode())
    with pytest.raises(AttnkitError, match=message):
        list(read_parallel(path))


# -- datasets ------------------------------------------------------------------


def test_parallel_dataset_marks_sides_and_skips_empty_and_long_lines(
    tok: Tokenizer, tmp_path: Path
) -> None:
    long = "a very long sentence " * 20
    src = write(tmp_path / "s.de", f"Ein Hund.\n\n{long}\nZwei Katzen.\n  \n".encode())
    tgt = write(tmp_path / "s.en", b"A dog.\nNothing\nlong\nTwo cats.\nblank\n")
    data = ParallelDataset.from_files(src, tgt, tokenizer=tok, max_len=20)
    assert len(data) == 2
    assert data.skipped == {"empty": 2, "too_long": 1}
    source, target = data[1]
    assert source.tolist() == [*tok.encode("Zwei Katzen."), EOS_ID]
    assert target.tolist() == [BOS_ID, *tok.encode("Two cats."), EOS_ID]
    assert data.lengths.tolist() == [[len(s), len(t)] for s, t in (data[0], data[1])]


def test_parallel_dataset_with_nothing_usable_is_an_error(tok: Tokenizer, tmp_path: Path) -> None:
    pairs = write(tmp_path / "empty.tsv", b"\n\t\n")
    with pytest.raises(AttnkitError, match=r"empty.tsv has no usable sentences \(2 empty"):
        ParallelDataset.from_files(pairs, tokenizer=tok)


def test_parallel_dataset_takes_one_tokenizer_per_side(tok: Tokenizer) -> None:
    chars = Tokenizer.train("char", texts=["two cats"])
    data = ParallelDataset([("Ein Hund.", "two cats")], tok, chars)
    assert data[0][1].tolist() == [BOS_ID, *chars.encode("two cats"), EOS_ID]


def test_translation_batches_have_both_sides_padded_and_masked(tok: Tokenizer) -> None:
    data = ParallelDataset([("Ein großer Hund.", "A dog."), ("Ja.", "Yes, a big dog.")], tok)
    batch = data.collate([data[0], data[1]])
    assert batch.src.shape == batch.src_mask.shape and batch.tgt.shape == batch.tgt_mask.shape
    assert batch.src_mask.sum(1).tolist() == data.lengths[:, 0].tolist()
    assert batch.tgt_mask.sum(1).tolist() == data.lengths[:, 1].tolist()
    assert (batch.src[~batch.src_mask] == PAD_ID).all() and (batch.tgt[:, 0] == BOS_ID).all()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 2**40), max_size=9), max_size=7),
    kind=st.sampled_from(["list", "int32", "int64"]),
)
def test_pad_puts_each_row_first_and_padding_after_it(rows: list[list[int]], kind: str) -> None:
    if kind == "int32":
        rows = [[i % 2**31 for i in row] for row in rows]
    given_rows = rows if kind == "list" else [np.array(r, dtype=kind) for r in rows]
    ids, real = pad(given_rows, 7)
    longest = max(map(len, rows), default=0)
    assert ids.dtype == torch.long and ids.shape == real.shape == (len(rows), longest)
    assert ids.tolist() == [row + [7] * (longest - len(row)) for row in rows]
    assert real.tolist() == [[j < len(row) for j in range(longest)] for row in rows]


def test_sentence_dataset_makes_encoder_batches(tok: Tokenizer) -> None:
    data = SentenceDataset(["A dog.", "", "Two big cats run."], tok)
    assert len(data) == 2 and data.skipped["empty"] == 1
    batch = data.collate([data[0], data[1]])
    assert batch.tgt is None and batch.tgt_mask is None
    assert batch.src[0].tolist()[: int(batch.src_mask[0].sum())] == [
        BOS_ID,
        *tok.encode("A dog."),
        EOS_ID,
    ]


def test_language_model_blocks_overlap_by_one_and_splits_partition_the_stream(
    tmp_path: Path,
) -> None:
    text = "".join(f"line {i}\n" for i in range(50)) + "\nlast paragraph\n"
    path = write(tmp_path / "lm.txt", text.encode())
    chars = Tokenizer.train("char", texts=[text])
    stream = chars.encode(text)
    train = LanguageModelDataset.from_files(path, tokenizer=chars, block_size=16, val_fraction=0.2)
    val = LanguageModelDataset.from_files(
        path, tokenizer=chars, block_size=16, split="val", val_fraction=0.2
    )
    assert np.concatenate([train.stream, val.stream]).tolist() == stream
    assert len(val.stream) == len(stream) - int(len(stream) * 0.8)
    assert len(train) == (len(train.stream) - 1) // 16
    assert all(len(train[i]) == 17 for i in range(len(train)))
    assert train[0][-1] == train[1][0]
    assert chars.decode(np.concatenate([train[i][:-1] for i in range(3)])) == text[:48]
    batch = train.collate([train[0], train[1]])
    # Blocks of one length carry no mask; a shorter one is padded and masked.
    assert batch.src is None and batch.tgt.shape == (2, 17) and batch.tgt_mask is None
    batch = train.collate([train[0], train[1][:5]])
    assert batch.tgt_mask.sum(1).tolist() == [17, 5]


def test_language_model_split_too_short_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "tiny.txt", b"abcdefghij\n")
    chars = Tokenizer.train("char", texts=["abcdefghij\n"])
    with pytest.raises(AttnkitError, match=r"val split of .* has 2 tokens, fewer than"):
        LanguageModelDataset.from_files(path, tokenizer=chars, block_size=4, split="val")
    with pytest.raises(AttnkitError, match="split 'test' is not one of train, val"):
        LanguageModelDataset.from_files(path, tokenizer=chars, block_size=4, split="test")


# -- known corpora ---------------------------------------------------------------


def test_multi30k_loads_from_data_dir(tok: Tokenizer, data_dir: Path, isolated_cache: Path) -> None:
    data = load_corpus("multi30k", "val", tokenizer=tok, langs=("en", "fr"), data_dir=data_dir)
    assert len(data) == 1014 and data.skipped == {"empty": 0, "too_long": 0}
    first_en = next(read_lines(data_dir / "multi30k" / "val.en.gz"))
    assert tok.decode(data[0][0]) == first_en
    assert not isolated_cache.exists()


def test_tinyshakespeare_loads_through_attnkit_data(
    samples: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNKIT_DATA", str(samples))
    text = (samples / "tinyshakespeare" / "input.txt").read_text()
    chars = Tokenizer.train("char", texts=[text])
    val = load_corpus("tinyshakespeare", "val", tokenizer=chars, block_size=256)
    assert chars.decode(val.stream) == text[-len(val.stream) :]
    assert len(val) == (len(val.stream) - 1) // 256
    with pytest.raises(AttnkitError, match="give block_size"):
        load_corpus("tinyshakespeare", "val", tokenizer=chars)


def test_data_dir_comes_before_attnkit_data_which_comes_before_the_cache(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    places = {name: tmp_path / name / "tinyshakespeare" for name in ("given", "env")}
    places["cache"] = isolated_cache / "tinyshakespeare"
    for folder in places.values():
        folder.mkdir(parents=True)
        (folder / "input.txt").write_text("text")
    monkeypatch.setenv("ATTNKIT_DATA", str(tmp_path / "env"))
    given_dir = tmp_path / "given"
    assert corpus_files("tinyshakespeare", "train", data_dir=given_dir) == [
        places["given"] / "input.txt"
    ]
    assert corpus_files("tinyshakespeare", "train") == [places["env"] / "input.txt"]
    monkeypatch.delenv("ATTNKIT_DATA")
    assert corpus_files("tinyshakespeare", "train") == [places["cache"] / "input.txt"]


def test_without_files_or_network_the_error_names_files_and_place(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(url: str, timeout: float) -> None:
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(corpora, "urlopen", offline)
    empty = tmp_path / "empty"
    empty.mkdir()
    pattern = (
        r"multi30k needs train\.de\.gz, train\.en\.gz, .* the download failed: no network; "
        rf"put them in {empty / 'multi30k'}/ and pass --data-dir {empty}"
    )
    with pytest.raises(AttnkitError, match=pattern):
        corpus_files("multi30k", "train", langs=("de", "en"), data_dir=empty)
    with pytest.raises(AttnkitError, match=r"tinyshakespeare needs input\.txt.*downloads are off"):
        corpus_files("tinyshakespeare", "train", data_dir=empty, download=False)
    assert list(isolated_cache.rglob("*")) == [isolated_cache / "multi30k"]
    # A relative data_dir with "..", such as "../shared/data", is named normalized.
    monkeypatch.chdir(empty)
    with pytest.raises(AttnkitError) as refused:
        corpus_files("tinyshakespeare", "train", data_dir="../shared", download=False)
    assert "/../" not in str(refused.value)
    assert f"put them in {tmp_path / 'shared' / 'tinyshakespeare'}/" in str(refused.value)


def serve(payloads: dict[str, bytes], requested: list[str]):
    def fake_urlopen(url: str, timeout: float) -> io.BytesIO:
        requested.append(url)
        return io.BytesIO(payloads[url.rsplit("/", 1)[1]])

    return fake_urlopen


def test_download_is_checked_then_kept_in_the_cache(
    data_dir: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = (data_dir / "multi30k" / "val.fr.gz").read_bytes()
    requested: list[str] = []
    monkeypatch.setattr(corpora, "urlopen", serve({"val.fr.gz": good}, requested))
    [path] = corpus_files("multi30k", "val", langs=("fr",))
    assert path == isolated_cache / "multi30k" / "val.fr.gz" and path.read_bytes() == good
    assert requested == [
        "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/val.fr.gz"
    ]
    assert corpus_files("multi30k", "val", langs=("fr",)) == [path]
    assert len(requested) == 1, "a cached file is not downloaded again"
    assert [p.name for p in path.parent.iterdir()] == ["val.fr.gz"]


def test_download_with_wrong_checksum_is_an_error_and_leaves_nothing(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpora, "urlopen", serve({"input.txt": b"not shakespeare"}, []))
    wrong = hashlib.sha256(b"not shakespeare").hexdigest()
    with pytest.raises(AttnkitError, match=f"has SHA-256 {wrong}, not the expected"):
        corpus_files("tinyshakespeare", "train")
    assert list((isolated_cache / "tinyshakespeare").iterdir()) == []


def test_checksum_table_matches_the_shared_copies(data_dir: Path) -> None:
    for corpus in CORPORA.values():
        for name, digest in corpus.sha256.items():
            path = data_dir / corpus.name / name
            assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, name


def test_the_tests_find_whole_corpora_as_the_library_does(
    data_dir: Path, isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone without ../shared/data beside it: the corpora come from $ATTNKIT_DATA and the
    cache, as a recipe finds them, and nothing is downloaded that either holds."""
    monkeypatch.setattr(helpers, "SHARED_DATA", tmp_path / "no such folder")
    monkeypatch.setattr(corpora, "urlopen", serve({}, []))  # a download would be a KeyError
    mine = tmp_path / "mine"
    (mine / "multi30k").mkdir(parents=True)
    for path in (data_dir / "multi30k").iterdir():
        (mine / "multi30k" / path.name).symlink_to(path)
    monkeypatch.setenv("ATTNKIT_DATA", str(mine))
    (isolated_cache / "tinyshakespeare").mkdir(parents=True)
    (isolated_cache / "tinyshakespeare" / "input.txt").symlink_to(
        data_dir / "tinyshakespeare" / "input.txt"
    )
    found = helpers.whole_corpora(tmp_path / "links")
    assert found == tmp_path / "links"  # two folders: one of links to both
    assert (found / "multi30k" / "val.de.gz").resolve() == (
        mine / "multi30k" / "val.de.gz"
    ).resolve()
    assert (found / "tinyshakespeare" / "input.txt").read_text().startswith("First Citizen:")
    assert len(list((found / "multi30k").iterdir())) == 9
    (mine / "tinyshakespeare").mkdir()
    (mine / "tinyshakespeare" / "input.txt").symlink_to(data_dir / "tinyshakespeare" / "input.txt")
    assert helpers.whole_corpora(tmp_path / "unused") == mine  # one folder: that one


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("wmt14", "train"), "unknown corpus 'wmt14'; the known corpora are multi30k"),
        (("multi30k", "test"), "multi30k has no split 'test'; its splits are train, val"),
        (("multi30k", "train", ("de", "cs")), "multi30k has no language 'cs'"),
    ],
)
def test_unknown_corpus_split_or_language_is_an_error(args: tuple, message: str) -> None:
    name, split, *langs = args
    with pytest.raises(AttnkitError, match=message):
        corpus_files(name, split, langs=langs[0] if langs else ())


# -- token-budget batching -----------------------------------------------------


def batches_of(sampler: TokenBudgetSampler) -> list[list[int]]:
    return list(sampler)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=300),
    max_tokens=st.integers(40, 400),
    max_batch_size=st.none() | st.integers(1, 16),
    seed=st.integers(0, 3),
)
def test_batches_stay_within_budget_and_cover_each_example_once(
    lengths: list[tuple[int, int]], max_tokens: int, max_batch_size: int | None, seed: int
) -> None:
    sampler = TokenBudgetSampler(lengths, max_tokens, max_batch_size=max_batch_size, seed=seed)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = batches_of(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for batch in batches:
            assert batch and len(batch) <= (max_batch_size or len(lengths))
            for side in (0, 1):
                assert len(batch) * max(lengths[i][side] for i in batch) <= max_tokens


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=8, max_size=200),
    # At least two of the longest fit, so batches can be halved until the count
    # divides by world_size (the sampler raises where no even share exists).
    max_tokens=st.integers(60, 200),
    world_size=st.integers(2, 8),
)
def test_ranks_get_disjoint_shards_that_cover_the_epoch_in_equal_steps(
    lengths: list[int], max_tokens: int, world_size: int
) -> None:
    shards = [
        batches_of(TokenBudgetSampler(lengths, max_tokens, seed=7, rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    seen = [i for shard in shards for batch in shard for i in batch]
    assert sorted(seen) == list(range(len(lengths)))
    assert len({len(shard) for shard in shards}) == 1
    for shard in shards:
        assert all(len(b) * max(lengths[i] for i in b) <= max_tokens for b in shard)


def test_order_is_fixed_by_seed_and_epoch() -> None:
    lengths = np.random.default_rng(0).integers(1, 50, size=500)

    def plan(seed: int, epoch: int) -> list[list[int]]:
        sampler = TokenBudgetSampler(lengths, 200, seed=seed)
        sampler.set_epoch(epoch)
        return batches_of(sampler)

    assert plan(1, 0) == plan(1, 0)
    assert plan(1, 0) != plan(1, 1) and plan(1, 0) != plan(2, 0)
    assert len(plan(1, 0)) == len(plan(1, 1))


def test_without_shuffle_batches_come_shortest_first() -> None:
    lengths = [5, 1, 9, 3, 7, 2]
    batches = batches_of(TokenBudgetSampler(lengths, 10, shuffle=False))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths)
    assert batches == [[1, 5, 3], [0], [4], [2]]


@pytest.mark.parametrize(
    ("lengths", "kwargs", "message"),
    [
        ([3, 12], {}, "an example has 12 tokens, over max_tokens 10"),
        ([3, 4], {"rank": 2, "world_size": 2}, r"rank 2 is not in 0\.\.1"),
        ([3], {"world_size": 2}, "1 examples cannot be shared among 2 ranks"),
        ([9, 9, 9], {"world_size": 2}, "single-example batches cannot be shared evenly"),
        ([], {}, "lengths must be a non-empty list"),
    ],
)
def test_bad_sampler_settings_are_errors(lengths: list[int], kwargs: dict, message: str) -> None:
    with pytest.raises(AttnkitError, match=message):
        batches_of(TokenBudgetSampler(lengths, 10, **kwargs))


def test_dataloader_batches_by_token_budget_with_little_padding(
    tok: Tokenizer, data_dir: Path
) -> None:
    data = load_corpus("multi30k", "test_2016_flickr", tokenizer=tok, data_dir=data_dir)
    sampler = TokenBudgetSampler(data.lengths, 1024, seed=3)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=data.collate)
    batches = list(loader)
    assert sum(b.size for b in batches) == len(data) == 1000
    assert max(max(b.src.numel(), b.tgt.numel()) for b in batches) <= 1024
    assert padding_efficiency(batches) == pytest.approx(sampler.padding_efficiency())
    generator = torch.Generator().manual_seed(3)
    shuffled = list(
        DataLoader(data, batch_size=32, shuffle=True, collate_fn=data.collate, generator=generator)
    )
    assert padding_efficiency(batches) > 0.85 > padding_efficiency(shuffled)
