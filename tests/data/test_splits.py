"""A corpus split named in full, by a prefix, or not at all."""

import pytest

from attnkit.data import split_name


@pytest.mark.parametrize(
    ("corpus", "split", "expected"),
    [
        ("multi30k", "test", "test_2016_flickr"),  # an unambiguous prefix
        ("multi30k", None, "test_2016_flickr"),  # the test split by default
        ("multi30k", "val", "val"),
        ("multi30k", "t", "t"),  # train or test: left for corpus_files to refuse
        ("tinyshakespeare", None, "val"),  # no test split: validation
        ("tinyshakespeare", "train", "train"),
        ("my/folder", None, "test"),  # not a known corpus: names pass unchanged
        ("my/folder", "dev", "dev"),
    ],
)
def test_split_name(corpus, split, expected):
    assert split_name(corpus, split) == expected
