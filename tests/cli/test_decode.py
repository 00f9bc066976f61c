"""`attnkit translate | generate | eval` on small run folders (`tests.helpers.tiny_run`)."""

import logging
import math

import pytest

from attnkit.cli import main
from attnkit.generation import GenerationConfig
from attnkit.inference import translate
from attnkit.run import load_run
from tests.helpers import RUN_LINES, tiny_run


def test_translate_keeps_order_and_empty_lines_and_counts_truncations(
    mt_run, tmp_path, capsys, caplog
):
    long_line = "zwei kinder spielen im park " * 3
    lines = [RUN_LINES[0], "", RUN_LINES[1], "   ", long_line, RUN_LINES[2]]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        code = main(
            [
                "translate",
                str(mt_run),
                "--input",
                str(source),
                "--max-new-tokens",
                "6",
                "--batch-size",
                "2",
                "--beam",
                "2",
            ]
        )
    assert code == 0
    out = capsys.readouterr().out.split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == ""
    assert out[1] == "" and out[3] == ""
    assert "truncated 1 of 4 sequences" in caplog.text
    run = load_run(mt_run)
    config = GenerationConfig(max_new_tokens=6, num_beams=2)
    alone = [translate(run.model, run.tokenizer, [line], config)[0] for line in lines]
    assert out[:-1] == alone


def test_translate_refuses_long_inputs_when_asked(mt_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n" + "x" * 80 + "\n")
    code = main(["translate", str(mt_run), "--input", str(source), "--refuse-long"])
    assert code == 2
    err = capsys.readouterr().err
    assert "input line 2 has 81 tokens, over the model's max_len 40" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--temperature", "0"], "temperature must be positive"),
    ],
)
def test_generate_rejects_invalid_options_in_one_sentence(lm_run, capsys, args, message):
    assert main(["generate", str(lm_run), "--prompt", "a dog", *args]) == 2
    assert message in capsys.readouterr().err


def test_generate_streams_a_reproducible_continuation(lm_run, capsys):
    args = ["generate", str(lm_run), "--prompt", "a dog", "--max-new-tokens", "8", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert first.startswith("a dog")


def test_wrong_shape_is_a_clear_error(lm_run, mt_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("a dog\n")
    assert main(["translate", str(lm_run), "--input", str(source)]) == 2
    assert "translation needs an encoder-decoder model, but this one is a decoder model" in (
        capsys.readouterr().err
    )
    assert main(["generate", str(mt_run), "--prompt", "x"]) == 2
    assert "needs a decoder (language) model, but this one is an encoder-decoder model" in (
        capsys.readouterr().err
    )


def test_eval_translation_prints_bleu_and_chrf_with_signatures(mt_run, samples, capsys):
    code = main(
        [
            "eval",
            str(mt_run),
            "--split",
            "test",
            "--data-dir",
            str(samples),
            "--limit",
            "4",
            "--max-new-tokens",
            "5",
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "multi30k test_2016_flickr de->en, 4 sentences" in out
    assert "BLEU" in out and "nrefs:1|case:mixed" in out and "chrF" in out
    assert "BLEU (lowercased)" in out and "case:lc" in out


def test_eval_language_model_prints_perplexity_on_val_by_default(lm_run, samples, capsys):
    code = main(
        [
            "eval",
            str(lm_run),
            "--corpus",
            "tinyshakespeare",
            "--data-dir",
            str(samples),
            "--limit",
            "1",
            "--batch-size",
            "2",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "tinyshakespeare val," in out  # no --split: the validation split, as there is no test
    assert "perplexity" in out and "tokens" in out
    ppl = float(next(line.split()[1] for line in out.splitlines() if line.startswith("perplexity")))
    loss = float(next(line.split()[1] for line in out.splitlines() if line.startswith("loss")))
    assert loss == pytest.approx(math.log(ppl), abs=1e-2)


def test_a_run_trained_on_lowercased_text_gets_lowercased_input(tmp_path, capsys):
    run = tiny_run(tmp_path / "lower", "encoder-decoder")
    source = tmp_path / "in.txt"
    source.write_text("EIN HUND LÄUFT\nein hund läuft\n")
    args = ["translate", str(run), "--input", str(source), "--max-new-tokens", "6"]
    assert main(args) == 0
    cased = capsys.readouterr().out.splitlines()
    assert cased[0] != cased[1]  # the char vocabulary has no capitals: they read as <unk>
    (run / "run_config.toml").write_text("[data]\nlowercase = true\n")
    assert main(args) == 0
    lowered = capsys.readouterr().out.splitlines()
    assert lowered[0] == lowered[1] == cased[1]


def test_translate_draws_the_cross_attention_of_the_first_input(mt_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n")
    picture = tmp_path / "attention.png"
    args = ["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "4"]
    assert main([*args, "--attention-plot", str(picture)]) == 0
    assert picture.stat().st_size > 0
    assert str(picture) in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_translate_draws_either_self_attention(mt_run, tmp_path, capsys, kind):
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n")
    picture = tmp_path / f"{kind}.png"
    args = ["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "4"]
    assert main([*args, "--attention-plot", str(picture), "--attention-kind", kind]) == 0
    assert picture.stat().st_size > 0
    assert f"{kind} attention of the first input" in capsys.readouterr().err


def test_generate_draws_the_self_attention_of_its_text(tmp_path, capsys):
    run = tiny_run(tmp_path / "lm", "decoder")
    picture = tmp_path / "self.png"
    args = ["generate", str(run), "--prompt", "a dog", "--greedy", "--max-new-tokens", "5"]
    assert main([*args, "--attention-plot", str(picture)]) == 0
    assert picture.stat().st_size > 0 and "self-attention" in capsys.readouterr().err


def test_eval_and_generate_take_a_compute_type(lm_run, samples, capsys):
    from attnkit.nn.compute_type import refusal, resolve

    chosen = resolve("auto", load_run(lm_run).model.embed.token.weight.device)
    args = ["eval", str(lm_run), "--data-dir", str(samples), "--limit", "2", "--no-progress"]
    assert main([*args, "--block-size", "16", "--compute-type", "auto"]) == 0
    out = capsys.readouterr().out
    assert (f"linear layers in {chosen}" in out) == (chosen != "float32")
    assert load_run(lm_run, compute_type="auto").compute_type == chosen
    if refusal("bf16", load_run(lm_run).model.head.weight.device):
        assert main(["generate", str(lm_run), "--prompt", "a", "--compute-type", "bf16"]) == 2
        assert "AVX512-BF16 or AMX" in capsys.readouterr().err


def test_generate_and_translate_take_a_dtype_and_refuse_it_beside_a_compute_type(
    lm_run, mt_run, tmp_path, capsys
):
    """--dtype casts the whole model (bfloat16 on a GPU, with the static cache by default)."""
    args = ["generate", str(lm_run), "--prompt", "a dog", "--max-new-tokens", "4"]
    assert main([*args, "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.startswith("a dog")
    source = tmp_path / "in.txt"
    source.write_text("ein hund\n", encoding="utf-8")
    translate_args = ["translate", str(mt_run), "--input", str(source), "--no-progress"]
    assert main([*translate_args, "--max-new-tokens", "4", "--dtype", "float16"]) == 0
    assert main([*args, "--dtype", "bfloat16", "--compute-type", "int8"]) == 2
    assert "choose one" in capsys.readouterr().err
