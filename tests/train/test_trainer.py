import itertools
import json
import math
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from attnkit.errors import AttnkitError
from attnkit.run import RunFolder, load_pretrained
from attnkit.train import Trainer
from attnkit.train.checkpoint import load_checkpoint, load_trainer_state
from attnkit.train.run_config import EvalSection, TrainSection
from attnkit.train.stopping import BestMetric
from tests.helpers import merge, tiny_model, translation_batches


def settings(tmp_path, **changes) -> TrainSection:
    base = {
        "out_dir": str(tmp_path),
        "steps": 8,
        "lr": 3e-3,
        "schedule": "cosine",
        "warmup": 2,
        "weight_decay": 0.1,
        "label_smoothing": 0.1,
        "log_every": 2,
        "save_every": 100,
        "threads": 1,
    }
    return TrainSection(**{**base, **changes})


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    """Stop at step 3 (mid-epoch, with dropout drawing randoms), resume, reach step 8."""
    data = translation_batches(5)
    evaluation = EvalSection(every=4)
    val = translation_batches(2, seed=9)
    straight = Trainer(
        tiny_model(dropout=0.1),
        data,
        train=settings(tmp_path / "a"),
        eval=evaluation,
        val_data=val,
    ).fit()
    assert straight.step == 8 and straight.stopped == "finished"

    first = Trainer(
        tiny_model(dropout=0.1), data, train=settings(tmp_path / "b"), eval=evaluation, val_data=val
    )
    first.callbacks.append(lambda info: info["step"] == 3 and first.request_stop())
    stopped = first.fit()
    assert stopped.stopped == "interrupted" and stopped.step == 3
    assert load_trainer_state(RunFolder(tmp_path / "b"))["step"] == 3

    # A different initialisation: everything must come from the checkpoint.
    resumed = Trainer(
        tiny_model(seed=5, dropout=0.1),
        data,
        train=settings(tmp_path / "b"),
        eval=evaluation,
        val_data=val,
    ).fit(resume=True)
    assert resumed.step == 8
    assert_identical(params(straight.model), params(resumed.model))
    a = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]

    def evaluations(records: list[dict]) -> list[dict]:  # all but the clock
        return [{k: v for k, v in r.items() if k != "minutes"} for r in records if "val_loss" in r]

    assert evaluations(a) == evaluations(b)
    assert [r["step"] for r in b if "train_loss" in r] == [2, 3, 4, 6, 8]
    assert (tmp_path / "b" / "curves.png").stat().st_size > 0


def test_ctrl_c_saves_and_returns(tmp_path):
    # What the process had before (SIG_IGN, for one, under nohup or in a background job).
    previous = signal.getsignal(signal.SIGINT)
    trainer = Trainer(tiny_model(), translation_batches(3), train=settings(tmp_path))
    trainer.callbacks.append(lambda info: info["step"] == 2 and os.kill(os.getpid(), signal.SIGINT))
    result = trainer.fit()
    assert result.stopped == "interrupted" and result.step == 2
    assert load_trainer_state(RunFolder(tmp_path))["step"] == 2 and RunFolder(
        tmp_path
    ).saved_steps() == [2]
    assert signal.getsignal(signal.SIGINT) is previous  # the trainer's handler is gone


def test_accumulation_equals_one_big_batch(tmp_path):
    """Two micro-batches of different token counts step exactly like their concatenation."""
    small = translation_batches(4, batch_size=3)
    merged = [merge(a, b) for a, b in zip(small[0::2], small[1::2], strict=True)]
    # No biases: the key bias has an exactly zero gradient, whose rounding noise Adam would
    # blow up to full-size steps.
    no_dropout = {"dropout": 0.0, "embedding_dropout": 0.0, "bias": False}
    one = Trainer(tiny_model(**no_dropout), merged, train=settings(tmp_path / "1", steps=4)).fit()
    two = Trainer(
        tiny_model(**no_dropout), small, train=settings(tmp_path / "2", steps=4, accumulate=2)
    ).fit()
    for name, value in params(one.model).items():
        torch.testing.assert_close(value, params(two.model)[name], rtol=1e-5, atol=1e-6)


def test_nan_loss_stops_and_keeps_the_last_checkpoint(tmp_path):
    model = tiny_model()
    trainer = Trainer(model, translation_batches(3), train=settings(tmp_path, save_every=2))

    def poison(info):
        if info["step"] == 5:
            with torch.no_grad():
                model.tgt_embed.token.weight[7] = float("nan")

    trainer.callbacks.append(poison)
    with pytest.raises(AttnkitError, match=r"nan at step 6.*, of step 4, is intact") as err:
        trainer.fit()
    assert "\n" not in str(err.value)
    assert load_trainer_state(RunFolder(tmp_path))["step"] == 4
    restored = tiny_model(seed=3)
    load_checkpoint(RunFolder(tmp_path), restored)
    assert all(torch.isfinite(p).all() for p in restored.parameters())


def test_empty_dataset_is_refused(tmp_path):
    with pytest.raises(AttnkitError, match="the training data yields no batches"):
        Trainer(tiny_model(), [], train=settings(tmp_path)).fit()


def test_resume_with_a_config_that_does_not_fit(tmp_path):
    Trainer(tiny_model(), translation_batches(2), train=settings(tmp_path, steps=2)).fit()
    with pytest.raises(AttnkitError, match=r"model\.d_model is 16 there but 32 here"):
        Trainer(
            tiny_model(d_model=32), translation_batches(2), train=settings(tmp_path, steps=4)
        ).fit(resume=True)


def test_a_run_saved_without_decoding_ids_resumes_and_records_them(tmp_path):
    """Runs trained before models recorded eos_id and decoder_start_id saved None for both."""
    Trainer(tiny_model(), translation_batches(2), train=settings(tmp_path, steps=2)).fit()
    ids = {"eos_id": 2, "decoder_start_id": 1}
    legacy = json.loads(RunFolder(tmp_path).config.read_text())
    for name in ids:
        assert load_trainer_state(RunFolder(tmp_path))["model_config"][name] is None
        del legacy[name]
    RunFolder(tmp_path).config.write_text(json.dumps(legacy))
    old = load_pretrained(tmp_path).config  # config.json without the ids loads: they default
    assert (old.eos_id, old.decoder_start_id) == (None, None)

    resumed = Trainer(
        tiny_model(**ids), translation_batches(2), train=settings(tmp_path, steps=4)
    ).fit(resume=True)
    assert resumed.step == 4
    saved = load_trainer_state(RunFolder(tmp_path))["model_config"]
    assert {name: saved[name] for name in ids} == ids
    assert load_pretrained(tmp_path).config == resumed.model.config
    # Once recorded, an id must match: another one means another tokenizer.
    with pytest.raises(AttnkitError, match=r"model\.eos_id is 2 there but 3 here"):
        Trainer(
            tiny_model(eos_id=3, decoder_start_id=1),
            translation_batches(2),
            train=settings(tmp_path, steps=6),
        ).fit(resume=True)


def test_a_used_run_folder_needs_resume(tmp_path):
    Trainer(tiny_model(), translation_batches(2), train=settings(tmp_path, steps=2)).fit()
    with pytest.raises(AttnkitError, match="already holds a run; pass --resume"):
        Trainer(tiny_model(), translation_batches(2), train=settings(tmp_path, steps=2)).fit()


def test_early_stopping_and_best_checkpoint(tmp_path):
    calls = iter([0.5, 0.7, 0.6, 0.4])

    def metric(model):
        return {"score": next(calls)}

    result = Trainer(
        tiny_model(),
        translation_batches(2),
        train=settings(tmp_path, steps=20),
        eval=EvalSection(every=2, metric="score", patience=2),
        metrics=[metric],
    ).fit()
    assert result.stopped == "early-stopped" and result.step == 8
    assert result.best == 0.7
    assert (tmp_path / "checkpoints" / "best" / "model.safetensors").is_file()


def test_validation_loss_and_perplexity(tmp_path):
    val = translation_batches(2, seed=4)
    trainer = Trainer(
        tiny_model(), translation_batches(2), train=settings(tmp_path, steps=2), val_data=val
    )
    result = trainer.fit()
    records = [r for r in result.history if "val_loss" in r]
    record = records[-1]
    assert record["val_ppl"] == pytest.approx(math.exp(record["val_loss"]))
    assert 0 < record["val_loss"] < math.log(24) + 1
    # Each evaluation says when it was due, in minutes of the session (what a budget reads).
    minutes = [r["minutes"] for r in records]
    assert minutes == sorted(minutes) and 0 <= minutes[0] < 1


def test_bf16_autocast_trains_on_cpu(tmp_path):
    result = Trainer(
        tiny_model(), translation_batches(2), train=settings(tmp_path, steps=3, precision="bf16")
    ).fit()
    assert all(
        p.dtype == torch.float32 and torch.isfinite(p).all() for p in result.model.parameters()
    )


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_auto_precision_is_bf16_only_where_the_cpu_multiplies_it(tmp_path, monkeypatch, fast_bf16):
    from attnkit.kernels.cpu import Cpu
    from attnkit.nn import compute_type

    flags = frozenset({"avx2", "avx512f", "avx512_bf16"} if fast_bf16 else {"avx2"})
    monkeypatch.setattr(compute_type, "this_cpu", lambda: Cpu("a CPU", flags))
    cpu = settings(tmp_path, precision="auto", device="cpu")  # a CUDA device would pick bf16
    trainer = Trainer(tiny_model(), [], train=cpu)
    assert trainer.precision == ("bf16" if fast_bf16 else "fp32")


def test_fp16_needs_cuda(tmp_path):
    with pytest.raises(AttnkitError, match="fp16' needs CUDA"):
        Trainer(tiny_model(), [], train=settings(tmp_path, precision="fp16", device="cpu"))


def test_compiled_training_saves_plain_parameter_names(tmp_path, monkeypatch):
    """torch.compile wraps the model as `_orig_mod`; checkpoints never carry that prefix."""
    real_compile = torch.compile
    compiled = []

    def eager_compile(model, **kwargs):  # dynamo without inductor: fast, same wrapper
        compiled.append(model)
        return real_compile(model, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", eager_compile)
    no_dropout = {"dropout": 0.0, "embedding_dropout": 0.0}
    data = translation_batches(2)
    plain = Trainer(tiny_model(**no_dropout), data, train=settings(tmp_path / "a", steps=3)).fit()
    result = Trainer(
        tiny_model(**no_dropout), data, train=settings(tmp_path / "b", steps=3, compile=True)
    ).fit()
    assert compiled
    names = set(load_file(str(tmp_path / "b" / "model.safetensors")))
    assert names and not any("_orig_mod" in n for n in names)
    assert names == set(load_file(str(tmp_path / "a" / "model.safetensors")))
    for name, value in params(plain.model).items():
        torch.testing.assert_close(params(result.model)[name], value, rtol=1e-4, atol=1e-5)


def test_time_budget_stops_saves_and_averages(tmp_path):
    result = Trainer(
        tiny_model(),
        translation_batches(2),
        train=settings(tmp_path, steps=50, max_minutes=1e-9, keep_last=2, average_last=2),
    ).fit()
    assert result.stopped == "time-limit" and result.step == 1
    assert load_trainer_state(RunFolder(tmp_path))["step"] == 1
    assert (tmp_path / "curves.png").is_file()


def test_decay_over_minutes_reaches_the_floor_when_the_budget_ends(tmp_path):
    """A step budget far too large for 3 s: the linear decay still ends with the time."""
    lr = 3e-3
    train = settings(
        tmp_path,
        steps=100_000,
        max_minutes=0.05,
        schedule="linear",
        decay_over="minutes",
        warmup=0,
        lr=lr,
    )
    rates: list[float] = []
    trainer = Trainer(tiny_model(), translation_batches(4), train=train)
    trainer.callbacks.append(lambda info: rates.append(info["lr"]))
    result = trainer.fit()
    assert result.stopped == "time-limit" and 10 < result.step < 100_000
    assert all(a >= b for a, b in itertools.pairwise(rates))
    # The first step's rate is set before any step is timed: by `train.steps`.
    assert rates[0] == pytest.approx(lr * (1 - 1 / 100_000)) and rates[-1] < 0.1 * lr


def test_a_resumed_session_sets_its_second_rate_by_its_own_pace(tmp_path):
    """Each step's rate is set once the step before it is timed: the second step of a resumed
    session already decays over the new session's budget."""
    lr = 1e-3
    budget = {"schedule": "linear", "decay_over": "minutes", "max_minutes": 0.05, "warmup": 0}
    first = settings(tmp_path, steps=2, lr=lr, **budget)
    Trainer(tiny_model(), translation_batches(4), train=first).fit()
    rates: list[float] = []
    longer = settings(tmp_path, steps=100_000, lr=lr, **budget)
    trainer = Trainer(tiny_model(), translation_batches(4), train=longer)
    trainer.callbacks.append(lambda info: rates.append(info["lr"]))
    trainer.fit(resume=True)
    # Step 3's rate is set as the run resumes, before this session timed a step: by
    # `train.steps`. Step 4's by the pace of step 3, which puts the end of 3 s far before it.
    assert rates[0] == pytest.approx(lr * (1 - 3 / 100_000))
    assert rates[1] < lr * (1 - 10 / 100_000)


def test_objectives_of_several_backward_passes_are_refused_under_ddp(tmp_path, monkeypatch):
    """DDP synchronises the gradient of one forward pass; scheduled sampling with gradient
    through both passes (as sequence-level training) has two, so torchrun refuses it."""
    from attnkit.train import distributed
    from attnkit.train.objectives import TranslationObjective
    from attnkit.train.scheduled_sampling import ScheduledSampling, ScheduledSamplingSection

    monkeypatch.setattr(
        distributed, "setup", lambda device, alone, timeout: distributed.DistInfo(0, 2, 0)
    )
    settings = {"decay": "constant", "k": 0.5, "mix": "softmax"}
    both = ScheduledSamplingSection(**settings, first_pass_grad=True)
    trainer = Trainer(
        tiny_model(),
        translation_batches(2),
        train=TrainSection(out_dir=str(tmp_path / "run"), steps=1, device="cpu"),
        objective=ScheduledSampling(TranslationObjective(), both),
    )
    with pytest.raises(AttnkitError, match="more than one forward pass per step"):
        trainer.fit()
    # Without gradient through the first pass, DDP sees one pass with gradient: allowed.
    one = ScheduledSampling(TranslationObjective(), ScheduledSamplingSection(**settings))
    assert one.one_forward and not trainer.objective.one_forward


@pytest.mark.parametrize(
    ("lower", "values", "best"), [(True, [3, 2, 2.5, 4], 2), (False, [3, 2, 1, 2.5], 3)]
)
def test_the_best_metric_follows_its_direction_and_runs_out_of_patience(lower, values, best):
    tracked = BestMetric(lower_is_better=lower, patience=2)
    news = [tracked.update(v) for v in values]
    assert tracked.best == best and news[0] and not news[-1]
    assert tracked.exhausted  # two evaluations in a row without a better value
    assert not BestMetric(lower, patience=0, bad_evals=9).exhausted  # 0: never stops
