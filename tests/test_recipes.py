"""The packaged recipes: listed one line each, found by a bare name, a path still taken first."""

from pathlib import Path

import pytest

from attnkit import recipes
from attnkit.cli import main
from attnkit.errors import AttnkitError
from attnkit.train.run_config import RunConfig


def test_the_recipes_live_in_the_package_and_each_opens_with_its_one_line():
    names = recipes.names()
    assert {"demo", "multi30k_de_en", "tinyshakespeare_char", "word2vec"} <= set(names)
    for name in names:
        first = recipes.path(name).read_text().splitlines()[0]
        assert first.startswith("# "), name  # the line `attnkit recipes` shows
        assert 20 < len(recipes.summary(name)) <= 100, name
        assert "configs/" not in recipes.path(name).read_text(), name  # no folder of a clone


def test_attnkit_recipes_lists_every_recipe_with_its_line(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out.splitlines()
    for name in recipes.names():
        (line,) = [row for row in out if row.split()[:1] == [name]]
        assert line.endswith(recipes.summary(name))


def test_a_bare_name_is_the_recipe_and_a_path_still_works(tmp_path, monkeypatch):
    assert recipes.resolve("tinyshakespeare_char") == recipes.path("tinyshakespeare_char")
    assert recipes.resolve("tinyshakespeare_char.toml") == recipes.path("tinyshakespeare_char")
    own = tmp_path / "tinyshakespeare_char.toml"
    own.write_text('[data]\ntask = "reverse"\n')
    assert recipes.resolve(own) == own
    monkeypatch.chdir(tmp_path)  # a file of that name here is the user's, not the recipe
    assert recipes.resolve("tinyshakespeare_char.toml") == Path("tinyshakespeare_char.toml")
    assert RunConfig.load("tinyshakespeare_char.toml").data.task == "reverse"
    assert RunConfig.load("word2vec").data.task == "word2vec"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "tinyshakespeare_chr",
            "no recipe of that name; did you mean the recipe 'tinyshakespeare_char'",
        ),
        ("nothing_like_it", "`attnkit recipes` lists them"),
        ("some/dir/demo", "no run config at some/dir/demo: no such file"),  # a path is no name
    ],
)
def test_neither_a_file_nor_a_recipe_is_one_sentence(given, message, capsys):
    with pytest.raises(AttnkitError, match="no such file"):
        recipes.resolve(given)
    assert main(["train", given]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
