import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from attnkit import recipes
from attnkit.cli import main
from attnkit.data import CORPORA, cmudict
from attnkit.data.section import TASKS
from attnkit.data.sources import corpus_text
from attnkit.errors import AttnkitError
from attnkit.generation import GenerationConfig
from attnkit.inference import translate
from attnkit.run import RunFolder, load_pretrained
from attnkit.tokenizer import Tokenizer
from attnkit.train import Trainer, decoding_metrics, word2vec_task
from attnkit.train.checkpoint import load_trainer_state
from attnkit.train.decoding_metrics import error_rate_metric
from attnkit.train.run_config import EvalSection, RunConfig, TrainSection
from attnkit.train.scheduled_sampling import ScheduledSampling
from attnkit.train.tasks import BUILDERS, RUNNERS, build_task, train_transformer
from attnkit.train.tasks import train as train_run
from attnkit.train.validate import validate
from tests.helpers import (
    TINY_MODEL,
    tiny_model,
    tiny_run,
    translation_batches,
    translation_config,
)


def test_cli_trains_translation_then_resumes(tmp_path, capsys):
    config = translation_config(tmp_path)
    assert main(["train", config]) == 0
    run = tmp_path / "run"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "trainer_state.pt",
        "metrics.jsonl",
        "curves.png",
        "run_config.toml",
    ):
        assert (run / name).is_file(), name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "bleu" in r] == [2, 4]
    assert RunConfig.load(run / "run_config.toml") == RunConfig.load(config)
    trained, tokenizer = load_pretrained(run).config, Tokenizer.load(run / "tokenizer.json")
    assert (trained.eos_id, trained.decoder_start_id) == (tokenizer.eos_id, tokenizer.bos_id)

    assert main(["train", config, "--set", "train.steps=6", "--resume"]) == 0
    assert load_trainer_state(RunFolder(run))["step"] == 6
    assert "finished at step 6" in capsys.readouterr().out

    assert main(["train", config]) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err


def test_cli_trains_a_pointer_generator_that_copies_unknown_characters(tmp_path):
    config = translation_config(tmp_path)
    assert main(["train", config, "--set", "model.copy_attention=mean"]) == 0
    run = tmp_path / "run"
    model, tokenizer = load_pretrained(run), Tokenizer.load(run / "tokenizer.json")
    assert model.copy is not None and model.config.unk_id == tokenizer.unk_id
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r[k] for r in records for k in ("train_loss", "val_loss") if k in r]
    assert len(losses) >= 4 and all(math.isfinite(x) for x in losses)
    # "ß" is in no training sentence: the source reads it as an id of its own, V + 0.
    setup = build_task(RunConfig.load(config, ["model.copy_attention=mean"]))
    batch = next(iter(setup.train_data))
    assert int(batch.src.max()) < tokenizer.vocab_size  # the training text has no unknown
    out = translate(model, tokenizer, ["ein ß hund"], GenerationConfig(max_new_tokens=6))
    assert len(out) == 1 and isinstance(out[0], str)


def fine_tuned(tmp_path, *options: str) -> tuple[str, list[str]]:
    """Train the translation run, then fine-tune it into tmp_path/fine with `options`;
    return the config and the command line's settings of the fine-tuning."""
    config = translation_config(tmp_path)
    assert main(["train", config]) == 0
    start = [f"train.out_dir={tmp_path / 'fine'}", f"train.init_from={tmp_path / 'run'}"]
    start += ["train.average_last=1", "train.lr=0.05"]
    settings = [arg for option in (*start, *options) for arg in ("--set", option)]
    assert main(["train", config, *settings]) == 0
    return config, settings


def test_cli_fine_tunes_a_run_through_lora_adapters(tmp_path):
    config, settings = fine_tuned(tmp_path, "lora.rank=2", 'lora.targets=["*qkv_proj"]')
    fine = tmp_path / "fine"
    base, tuned = load_pretrained(tmp_path / "run"), load_pretrained(fine)
    tokenizer = "tokenizer.json"
    assert (fine / tokenizer).read_text() == (tmp_path / "run" / tokenizer).read_text()
    adapted = 0
    for name, weight in tuned.state_dict().items():
        delta = weight - base.state_dict()[name]
        if name.endswith("qkv_proj.weight"):
            # The merged model differs from its base by (alpha / r) B A: rank 2 at most.
            assert delta.abs().max() > 0 and torch.linalg.matrix_rank(delta) <= 2, name
            adapted += 1
        else:
            assert torch.equal(delta, torch.zeros_like(delta)), name
    assert adapted == 2  # the encoder's and the decoder's self-attention

    assert main(["train", config, *settings, "--set", "train.steps=6", "--resume"]) == 0
    assert load_trainer_state(RunFolder(fine))["step"] == 6


def test_cli_fine_tunes_a_run_through_houlsby_adapters(tmp_path):
    fine_tuned(tmp_path, "adapters.size=3")
    fine = tmp_path / "fine"
    base, tuned = load_pretrained(tmp_path / "run"), load_pretrained(fine)
    assert tuned.config.adapter_size == 3 and base.config.adapter_size == 0
    adapters = 0
    for name, weight in tuned.state_dict().items():
        if "adapter." in name:
            adapters += 1
        else:  # the base stays frozen
            assert torch.equal(weight, base.state_dict()[name]), name
    assert adapters == 5 * 4  # 5 adapters, each two weights and two biases
    assert (fine / "adapters.safetensors").is_file()


def test_cli_trains_with_scheduled_sampling_then_fine_tunes_on_bleu(tmp_path):
    config = translation_config(tmp_path)
    sampling = ["scheduled_sampling.decay=linear", "scheduled_sampling.slope=0.2"]
    assert main(["train", config, *(a for s in sampling for a in ("--set", s))]) == 0
    setup = build_task(RunConfig.load(config, [*sampling, f"train.out_dir={tmp_path}/x"]))
    assert isinstance(setup.objective, ScheduledSampling)
    fine = tmp_path / "fine"
    options = [
        f"train.out_dir={fine}",
        f"train.init_from={tmp_path / 'run'}",
        "train.average_last=1",
        "sequence_loss.kind=self-critical",
        "sequence_loss.reward=chrf",
    ]
    assert main(["train", config, *(a for s in options for a in ("--set", s))]) == 0
    records = [json.loads(line) for line in (fine / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "train_loss" in r]
    assert len(trained) == 2 and all(0 <= r["train_reward"] <= 1 for r in trained)
    assert "[sequence_loss]" in (fine / "run_config.toml").read_text()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["data.task=masked-lm", "eval.metric=val_loss", "scheduled_sampling.decay=constant"],
            "which data.task .masked-lm. has not",
        ),
        (
            ["scheduled_sampling.decay=constant", "sequence_loss.kind=risk"],
            "do not combine",
        ),
        (
            ["scheduled_sampling.decay=constant", "model.copy_attention=mean"],
            "which a\\s+pointer-generator",
        ),
        (
            ["sequence_loss.kind=risk", "model.copy_attention=head"],
            "which a\\s+pointer-generator",
        ),
        (
            [
                "scheduled_sampling.decay=constant",
                "scheduled_sampling.mix=softmax",
                "train.compile=true",
            ],
            "which a compiled model does not see",
        ),
    ],
)
def test_training_beyond_teacher_forcing_is_refused_where_it_cannot_run(tmp_path, options, message):
    with pytest.raises(AttnkitError, match=message):
        build_task(RunConfig.load(translation_config(tmp_path), options))


def test_cli_names_the_nearest_key(tmp_path, capsys):
    assert main(["train", translation_config(tmp_path), "--set", "train.lr_rate=1"]) == 2
    assert "did you mean 'train.lr'" in capsys.readouterr().err


def test_language_model_on_a_text_file(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    config = RunConfig.from_dict(
        {
            "model": {
                "preset": "gpt-tiny",
                "d_model": 16,
                "n_heads": 2,
                "d_ff": 32,
                "n_decoder_layers": 1,
                "max_len": 16,
            },
            "data": {
                "task": "language-model",
                "corpus": str(text),
                "tokenizer": "char",
                "block_size": 16,
                "batch_size": 4,
            },
            "train": {"out_dir": str(tmp_path / "run"), "steps": 3, "threads": 1},
        }
    )
    setup = build_task(config)
    # The model keeps the tokenizer's EOS, so `generate` stops where training taught it to.
    assert setup.model.config.eos_id == setup.tokenizer.eos_id
    batch = next(iter(setup.train_data))
    assert batch.tgt.shape == (4, 17) and batch.src is None
    result = Trainer(
        setup.model, setup.train_data, train=config.train, val_data=setup.val_data
    ).fit()
    assert result.step == 3 and "val_loss" in result.history[-1]


def test_task_and_model_shape_must_agree(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("some text to learn from\n" * 20)
    config = RunConfig.from_dict(
        {"data": {"task": "language-model", "corpus": str(text), "tokenizer": "char"}}
    )
    with pytest.raises(AttnkitError, match="trains a decoder model, but the \\[model\\] section"):
        build_task(config)


def test_empty_training_text_is_refused(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train.de", "train.en", "val.de", "val.en"):
        (corpus / name).write_text("")
    config = RunConfig.from_dict(
        {
            "data": {"corpus": str(corpus), "tokenizer": "char"},
            "train": {"out_dir": str(tmp_path / "run")},
        }
    )
    with pytest.raises(AttnkitError, match="no text to train the tokenizer on"):
        build_task(config)


def test_unknown_corpus_names_what_is_expected(tmp_path):
    config = RunConfig.from_dict({"data": {"corpus": str(tmp_path / "nowhere")}})
    with pytest.raises(AttnkitError, match="neither a known corpus"):
        build_task(config)


def test_masked_lm_on_a_text_file(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("".join(f"the cat number {i} sat on the mat\n" for i in range(60)))
    config = RunConfig.from_dict(
        {
            "model": {
                "preset": "bert-mini",
                "d_model": 16,
                "n_heads": 2,
                "d_ff": 32,
                "n_encoder_layers": 1,
                "max_len": 32,
            },
            "data": {
                "task": "masked-lm",
                "corpus": str(text),
                "tokenizer": "wordpiece",
                "vocab_size": 60,
                "max_tokens": 128,
            },
            "train": {"out_dir": str(tmp_path / "run"), "steps": 3, "threads": 1},
        }
    )
    setup = build_task(config)
    batch = next(iter(setup.train_data))
    assert batch.src is not None and batch.tgt is None
    assert setup.objective.mask_id == setup.tokenizer.mask_id == 4
    result = Trainer(
        setup.model,
        setup.train_data,
        train=config.train,
        objective=setup.objective,
        val_data=setup.val_data,
    ).fit()
    assert result.step == 3 and "val_loss" in result.history[-1]


def test_decoding_ids_the_model_section_sets_are_kept(tmp_path):
    config = RunConfig.load(translation_config(tmp_path), ["model.eos_id=3"])
    setup = build_task(config)
    assert setup.tokenizer.eos_id != 3
    assert (setup.model.config.eos_id, setup.model.config.decoder_start_id) == (
        3,
        setup.tokenizer.bos_id,
    )


def test_fine_tuning_a_run_saved_without_decoding_ids_records_them(tmp_path):
    base = tiny_run(tmp_path / "base", "encoder-decoder")
    saved = json.loads(RunFolder(base).config.read_text())
    RunFolder(base).config.write_text(
        json.dumps({**saved, "eos_id": None, "decoder_start_id": None})
    )
    options = [f"train.init_from={base}", f"train.out_dir={tmp_path / 'fine'}"]
    setup = build_task(RunConfig.load(translation_config(tmp_path), options))
    tokenizer = Tokenizer.load(RunFolder(base).tokenizer)
    assert (setup.model.config.eos_id, setup.model.config.decoder_start_id) == (
        tokenizer.eos_id,
        tokenizer.bos_id,
    )


# -- validation by error rates (grapheme-to-phoneme) ----------------------------------------------


@pytest.mark.parametrize(
    ("metric", "lower"),
    [
        ("val_loss", True),
        ("val_ppl", True),
        ("per", True),
        ("wer", True),
        ("bleu", False),
        ("exact_match", False),
    ],
)
def test_the_direction_of_each_validation_metric_is_explicit(metric, lower):
    assert EvalSection(metric=metric).lower_is_better is lower


def test_the_best_checkpoint_and_patience_follow_a_falling_error_rate(tmp_path):
    """PER 30, 20, 25, 26: the best is 20, of step 2, and two evaluations without a lower PER
    stop the run at step 4."""
    pers, snapshots = iter([30.0, 20.0, 25.0, 26.0, 10.0]), []

    def metric(model):
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"per": next(pers), "wer": 50.0}

    result = Trainer(
        tiny_model(),
        translation_batches(3),
        train=TrainSection(
            out_dir=str(tmp_path), steps=10, save_every=10, log_every=1, device="cpu"
        ),
        eval=EvalSection(every=1, metric="per", patience=2),
        metrics=[metric],
    ).fit()
    assert (result.best, result.stopped, result.step) == (20.0, "early-stopped", 4)
    best = load_file(RunFolder(tmp_path).best_weights)
    assert all(torch.equal(best[name], snapshots[1][name]) for name in best)
    assert not all(torch.equal(best[name], snapshots[0][name]) for name in best)


def g2p_config(tmp_path) -> RunConfig:
    path = tmp_path / "g2p.toml"
    path.write_text(
        TINY_MODEL
        + f"""
[data]
task = "translation"
corpus = "cmudict"
src_lang = "graphemes"
tgt_lang = "phonemes"
tokenizer = "word"
vocab_size = 128
max_len = 31

[train]
out_dir = "{tmp_path / "run"}"

[eval]
metric = "per"
decode_examples = 40
"""
    )
    return RunConfig.load(path)


@pytest.fixture
def decoded(monkeypatch):
    """What the task hands `error_rate_metric`: the validation sources and reference sets."""
    seen = {}

    def spy(tokenizer, sources, reference_sets, **options):
        seen.update(sources=sources, reference_sets=reference_sets)
        return error_rate_metric(tokenizer, sources, reference_sets, **options)

    monkeypatch.setattr(decoding_metrics, "error_rate_metric", spy)
    return seen


def test_cmudict_trains_on_every_pronunciation_and_validates_each_word_once(
    tmp_path, decoded, monkeypatch
):
    config = g2p_config(tmp_path)
    sides = corpus_text(config.data, "train", ("graphemes", "phonemes"))
    assert list(zip(*sides, strict=True)) == cmudict.pairs("train")
    # The task on the first 3,000 pairs of each split, which keeps the test fast.
    corpus = CORPORA["cmudict"]
    some = dataclasses.replace(corpus, pairs=lambda split: corpus.pairs(split)[:3000])
    monkeypatch.setitem(CORPORA, "cmudict", some)
    setup = build_task(config)
    assert len(setup.train_data.dataset) == 3000
    words = cmudict.entries("val")[:40]
    assert decoded["sources"] == [src for src, _ in words]
    assert decoded["reference_sets"] == [targets for _, targets in words]
    assert sum(len(targets) > 1 for targets in decoded["reference_sets"]) == 5
    scores = setup.metrics[0](setup.model.eval())
    assert set(scores) == {"per", "wer"} and 0 <= scores["wer"] <= 100 and scores["per"] >= 0


def test_eval_metric_per_on_text_files_accepts_any_target_of_a_repeated_source(tmp_path, decoded):
    config = RunConfig.load(translation_config(tmp_path), ["eval.metric=per"])
    setup = build_task(config)
    lines = (tmp_path / "corpus" / "val.de").read_text().splitlines()
    assert len(set(lines)) < len(lines)  # the validation text repeats sentences
    assert decoded["sources"] == list(dict.fromkeys(lines))[: config.eval.decode_examples]
    assert all(len(targets) == 1 for targets in decoded["reference_sets"])
    assert set(setup.metrics[0](setup.model.eval())) == {"per", "wer"}


def test_cmudict_is_validated_by_error_rates_not_bleu():
    recipe = recipes.path("cmudict_g2p")
    with pytest.raises(AttnkitError, match="choose one of val_loss, val_ppl, per, wer"):
        validate(RunConfig.load(recipe, ["eval.metric=bleu"]))


def test_every_data_task_has_a_runner_and_only_transformer_tasks_build_a_setup():
    assert set(RUNNERS) == set(TASKS)
    assert RUNNERS["word2vec"] is word2vec_task.train
    assert {task for task, runner in RUNNERS.items() if runner is train_transformer} == set(
        BUILDERS
    )


def test_span_corruption_pre_trains_what_translation_fine_tunes(tmp_path):
    path = translation_config(tmp_path)
    pre = RunConfig.load(
        path,
        ["data.task=span-corruption", f"train.out_dir={tmp_path / 'pre'}", "eval.metric=val_loss"],
    )
    setup = build_task(pre)
    batch = next(iter(setup.train_data))
    tokenizer = setup.tokenizer
    sentinels = {tokenizer.token_to_id(f"<extra_id_{i}>") for i in range(7)}  # max_len 128
    assert None not in sentinels
    # Each input holds a sentinel a span; each target starts with <s> and the first sentinel.
    assert (batch.tgt[:, 1] == tokenizer.token_to_id("<extra_id_0>")).all()
    assert torch.isin(batch.src, torch.tensor(sorted(sentinels))).any(-1).all()
    result = train_transformer(pre)
    assert result.step == 4 and math.isfinite(result.history[-1]["val_loss"])
    fine_tune = RunConfig.load(path, [f"train.init_from={tmp_path / 'pre'}"])
    tuned = build_task(fine_tune)
    weights = load_pretrained(tmp_path / "pre").state_dict()
    for name, value in tuned.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert tuned.tokenizer.fingerprint == tokenizer.fingerprint  # the sentinels come along


@pytest.mark.parametrize("task", sorted(RUNNERS))
def test_every_task_runs_on_train_threads(task, monkeypatch):
    """`train.threads` holds for the tasks that run outside the Trainer too (PPO sampled on every
    core while the config said 1)."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setitem(RUNNERS, task, lambda config, **_: calls.append("ran"))
    config = RunConfig.from_dict({"data": {"task": task}, "train": {"threads": 3}})
    train_run(config)
    assert calls == [3, "ran"]
