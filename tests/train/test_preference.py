"""DPO: the log-probabilities of both model shapes and the loss computed by hand, the reference
frozen (a copy, or the model with its LoRA update off), and `data.task = "preference"` runs
through `attnkit train` whose margin grows on held-out pairs."""

import copy
import json
import math

import pytest
import torch

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.data.preference import preference_batch
from attnkit.nn.lora import apply_lora
from attnkit.run import RunFolder, load_pretrained
from attnkit.train.preference import DPO, dpo_loss, dpo_margins, response_log_probs
from attnkit.train.run_config import EvalSection, RunConfig
from attnkit.train.tasks import build_task, train
from tests.helpers import tiny_model, tiny_run, write_preference_pairs

PAIRS = [([3, 4, 5], [6, 7], [9, 10, 11]), ([8, 9], [12, 13, 14], [15])]
# For an encoder-decoder: sources and responses end in </s> (2); the decoder starts at <s> (1).
SEQ2SEQ_PAIRS = [([3, 4, 5, 2], [6, 7, 2], [9, 10, 11, 2]), ([8, 2], [12, 13, 14, 2], [15, 2])]


def by_hand(model, prompt, response):
    """log pi(y|x) of a decoder-only model: each response token's log-softmax after the prompt
    and the tokens before it, one forward pass a token."""
    total, ids = 0.0, list(prompt)
    for token in response:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        total += logits.log_softmax(-1)[token].item()
        ids.append(token)
    return total


def by_hand_seq2seq(model, prompt, response, start=1):
    """log pi(y|x) of an encoder-decoder: the prompt its source, the decoder reading <s> and
    the response's tokens before each."""
    total, ids = 0.0, [start]
    for token in response:
        with torch.no_grad():
            logits = model(torch.tensor([prompt]), torch.tensor([ids])).logits[0, -1].double()
        total += logits.log_softmax(-1)[token].item()
        ids.append(token)
    return total


def test_response_log_probs_of_a_decoder_are_sums_over_the_response_only():
    model = tiny_model("decoder").eval()
    with torch.no_grad():
        scores = response_log_probs(model, preference_batch(PAIRS, pad_id=0))
    for row, (prompt, good, bad) in enumerate(PAIRS):
        assert scores[row].item() == pytest.approx(by_hand(model, prompt, good), abs=1e-5)
        assert scores[2 + row].item() == pytest.approx(by_hand(model, prompt, bad), abs=1e-5)


def test_response_log_probs_of_an_encoder_decoder_read_the_prompt_as_the_source():
    model = tiny_model("encoder-decoder").eval()
    batch = preference_batch(SEQ2SEQ_PAIRS, pad_id=0, decoder_start_id=1)
    with torch.no_grad():
        scores = response_log_probs(model, batch)
    for row, (prompt, good, bad) in enumerate(SEQ2SEQ_PAIRS):
        assert scores[row].item() == pytest.approx(by_hand_seq2seq(model, prompt, good), abs=1e-5)
        assert scores[2 + row].item() == pytest.approx(
            by_hand_seq2seq(model, prompt, bad), abs=1e-5
        )


def test_a_batch_made_for_the_other_shape_is_refused():
    with pytest.raises(AttnkitError, match="reads the prompt as its source"):
        response_log_probs(tiny_model("encoder-decoder"), preference_batch(PAIRS, pad_id=0))
    seq2seq = preference_batch(SEQ2SEQ_PAIRS, pad_id=0, decoder_start_id=1)
    with pytest.raises(AttnkitError, match="reads prompt and response in one sequence"):
        response_log_probs(tiny_model("decoder"), seq2seq)
    with pytest.raises(AttnkitError, match="not of an encoder one"):
        response_log_probs(tiny_model("encoder"), seq2seq)


def test_the_loss_is_eq_7_on_hand_computed_log_probabilities():
    chosen, rejected = torch.tensor([-3.0, -7.5]), torch.tensor([-4.0, -2.0])
    ref_chosen, ref_rejected = torch.tensor([-3.5, -6.0]), torch.tensor([-3.0, -2.5])
    margins = dpo_margins(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    # Pair 1: 0.5 ((-3 + 3.5) - (-4 + 3)) = 0.75; pair 2: 0.5 ((-7.5 + 6) - (-2 + 2.5)) = -1.
    assert margins.tolist() == [0.75, -1.0]
    expected = [math.log1p(math.exp(-0.75)), math.log1p(math.exp(1.0))]
    torch.testing.assert_close(dpo_loss(margins), torch.tensor(expected))


@pytest.mark.parametrize(
    ("shape", "pairs", "start"), [("decoder", PAIRS, None), ("encoder-decoder", SEQ2SEQ_PAIRS, 1)]
)
def test_at_the_start_the_policy_is_its_reference(shape, pairs, start):
    model = tiny_model(shape).eval()
    batch = preference_batch(pairs, pad_id=0, decoder_start_id=start)
    dpo = DPO(model, beta=0.1)
    torch.testing.assert_close(dpo.margins(model, batch), torch.zeros(2), atol=1e-6, rtol=0)
    terms = dpo(model, batch)
    assert terms.tokens.item() == 2  # the Trainer's mean is over pairs
    assert (terms.loss / terms.tokens).item() == pytest.approx(math.log(2), abs=1e-6)


def test_with_lora_the_reference_is_the_model_without_its_update():
    model = tiny_model("decoder").eval()
    apply_lora(model, rank=2)
    without = copy.deepcopy(model)
    torch.nn.init.normal_(model.decoder.blocks[0].self_attn.qkv_proj.lora_B)  # an update
    batch = preference_batch(PAIRS, pad_id=0)
    dpo = DPO(model)
    assert dpo.reference is None  # no second copy
    with torch.no_grad():
        policy = response_log_probs(model, batch)
        reference = dpo.reference_log_probs(model, batch)
        torch.testing.assert_close(reference, response_log_probs(without, batch))
        assert not torch.allclose(policy, reference)
        # The update is back afterwards.
        torch.testing.assert_close(response_log_probs(model, batch), policy)


def pairs(n: int, seed: int):
    """Prompts of 3 to 5 tokens; the chosen response counts up from the prompt's last token,
    the rejected one is random: a preference the model can learn and generalise."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(3, 20, (int(torch.randint(3, 6, (1,), generator=g)),), generator=g)
        start = int(prompt[-1])
        chosen = [3 + (start + k - 2) % 21 for k in range(1, 5)]
        rejected = torch.randint(3, 24, (4,), generator=g).tolist()
        out.append((prompt.tolist(), chosen, rejected))
    return out


def test_training_through_lora_widens_the_margin_on_held_out_pairs():
    torch.manual_seed(0)
    model = tiny_model("decoder", layers=2, dropout=0.0, embedding_dropout=0.0)
    apply_lora(model, rank=4, alpha=8.0)
    dpo = DPO(model, beta=0.5)
    held_out = preference_batch(pairs(32, seed=99), pad_id=0)
    with torch.no_grad():
        before = dpo.margins(model.eval(), held_out)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for step in range(40):
        loss = dpo_loss(dpo.margins(model, preference_batch(pairs(16, seed=step), pad_id=0)))
        optimizer.zero_grad()
        loss.mean().backward()
        optimizer.step()
    with torch.no_grad():
        after = dpo.margins(model.eval(), held_out)
    assert before.abs().max() < 1e-6  # LoRA's B starts at zero: the policy is the reference
    assert after.mean() > 1.0 and (after > 0).float().mean() > 0.9
    # The reference did not move: only the adapters trained.
    assert model.decoder.blocks[0].self_attn.qkv_proj.base.weight.grad is None


def test_a_merged_lora_model_is_refused_as_its_own_reference():
    model = tiny_model("decoder")
    apply_lora(model, rank=2)
    dpo = DPO(model)
    for layer in model.modules():
        if hasattr(layer, "merge"):
            layer.merge()
    with pytest.raises(AttnkitError, match="merged"):
        dpo(model, preference_batch(PAIRS, pad_id=0))


def test_bad_pairs_and_beta_are_refused_in_one_sentence():
    with pytest.raises(AttnkitError, match="needs a prompt, a chosen and a rejected"):
        preference_batch([([3], [], [4])], pad_id=0)
    with pytest.raises(AttnkitError, match="beta must be positive"):
        DPO(tiny_model("decoder"), beta=0.0)
    with pytest.raises(AttnkitError, match=r"dpo\.beta must be positive"):
        RunConfig.from_dict({"data": {"task": "preference"}, "dpo": {"beta": -1.0}})


# -- data.task = "preference" through attnkit train ---------------------------------------------

LETTERS = "abcdefghij"
DIGITS = "0123456789"


def language_model(tmp_path) -> str:
    """A tiny character language model trained 10 steps on random letters: the run that
    preference tuning starts from, which knows the letters but not the chosen responses' rule."""
    rng = torch.Generator().manual_seed(0)
    lines = [
        "".join(LETTERS[i] for i in torch.randint(10, (24,), generator=rng)) for _ in range(60)
    ]
    text = tmp_path / "letters.txt"
    text.write_text("\n".join(lines) + "\n")
    out = tmp_path / "lm"
    config = RunConfig.from_dict(
        {
            "model": {
                "preset": "gpt-tiny",
                "d_model": 32,
                "n_heads": 2,
                "d_ff": 64,
                "n_decoder_layers": 2,
                "max_len": 32,
            },
            "data": {
                "task": "language-model",
                "corpus": str(text),
                "tokenizer": "char",
                "block_size": 16,
                "batch_size": 8,
            },
            "train": {"out_dir": str(out), "steps": 10, "threads": 1, "warmup": 5},
            "eval": {"every": 10},
        }
    )
    train(config)
    return str(out)


def preference_config(tmp_path, base: str, alphabet: str, out: str = "dpo") -> str:
    corpus = write_preference_pairs(tmp_path / f"pairs-{alphabet[0]}", alphabet)
    path = tmp_path / f"{out}.toml"
    path.write_text(
        f"""
[data]
task = "preference"
corpus = "{corpus}"
max_tokens = 200

[dpo]
beta = 0.5

[train]
init_from = "{base}"
out_dir = "{tmp_path / out}"
steps = 30
lr = 0.01
schedule = "constant"
warmup = 0
threads = 1
log_every = 10
save_every = 30

[eval]
every = 10
metric = "reward_accuracy"
"""
    )
    return str(path)


def test_the_rewards_are_better_higher_and_dpos_loss_lower():
    assert not EvalSection(metric="reward_margin").lower_is_better
    assert not EvalSection(metric="reward_accuracy").lower_is_better
    assert EvalSection(metric="val_loss").lower_is_better


def evaluations(run) -> list[dict]:
    return [r for r in RunFolder(run).read_metrics() if "reward_margin" in r]


def assert_margin_grew(run) -> None:
    """The held-out pairs' margin grew from the first evaluation to the last, and most of
    them prefer the chosen response at the end."""
    evals = evaluations(run)
    assert [r["step"] for r in evals] == list(range(10, 10 * len(evals) + 1, 10))
    first, last = evals[0], evals[-1]
    assert len(evals) >= 3
    assert last["reward_margin"] > first["reward_margin"] > 0
    assert last["reward_accuracy"] >= 0.8
    assert last["reward_chosen"] > last["reward_rejected"]
    assert last["val_loss"] < math.log(2)


@pytest.mark.parametrize("lora", [False, True])
def test_cli_tunes_a_language_model_on_preference_pairs(tmp_path, lora):
    base = language_model(tmp_path)
    config = preference_config(tmp_path, base, LETTERS)
    # LoRA's few weights learn more slowly: a higher rate, and 40 steps.
    options = ["lora.rank=4", "lora.alpha=8", "train.lr=0.03", "train.steps=40"] if lora else []
    assert main(["train", config, *(a for o in options for a in ("--set", o))]) == 0
    run = tmp_path / "dpo"
    assert_margin_grew(run)
    records = RunFolder(run).read_metrics()
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    assert losses[-1] < losses[0] < math.log(2) + 0.1  # DPO's loss, per pair
    # The tuned run is a run like its base: same tokenizer, and it loads.
    assert (run / "tokenizer.json").read_text() == (tmp_path / "lm" / "tokenizer.json").read_text()
    tuned, start = load_pretrained(run), load_pretrained(base)
    assert tuned.config.shape == "decoder"
    changed = [
        name
        for name, weight in tuned.state_dict().items()
        if not torch.equal(weight, start.state_dict()[name])
    ]
    if lora:  # only the attention projections LoRA adapted moved
        assert changed and all("qkv_proj" in n or "out_proj" in n for n in changed), changed
    else:
        assert len(changed) > 10


def test_a_stopped_preference_run_resumes_where_an_unbroken_one_would_be(tmp_path):
    """The reference stays train.init_from's model, not the checkpoint a resume starts from."""
    base = language_model(tmp_path)
    steps = ["--set", "train.save_every=4", "--set", "eval.every=4"]
    whole, halves = (preference_config(tmp_path, base, LETTERS, out) for out in ("a", "b"))
    assert main(["train", whole, *steps, "--set", "train.steps=8"]) == 0
    assert main(["train", halves, *steps, "--set", "train.steps=4"]) == 0
    assert main(["train", halves, *steps, "--set", "train.steps=8", "--resume"]) == 0
    a, b = (
        load_pretrained(tmp_path / "a").state_dict(),
        load_pretrained(tmp_path / "b").state_dict(),
    )
    assert all(torch.equal(a[name], b[name]) for name in a)
    margins = [[r["reward_margin"] for r in evaluations(tmp_path / out)] for out in ("a", "b")]
    assert margins[0] == margins[1] and len(margins[0]) == 2


def test_cli_tunes_an_encoder_decoder_on_preference_pairs(tmp_path):
    base = tmp_path / "reverse"
    reverse = RunConfig.from_dict(
        {
            "model": {
                "d_model": 32,
                "n_heads": 2,
                "d_ff": 64,
                "n_encoder_layers": 1,
                "n_decoder_layers": 1,
                "max_len": 32,
            },
            "data": {"task": "reverse", "max_len": 6, "batch_size": 16},
            "train": {"out_dir": str(base), "steps": 10, "threads": 1, "warmup": 5},
            "eval": {"every": 10, "metric": "exact_match", "decode_examples": 4},
        }
    )
    train(reverse)
    config = preference_config(tmp_path, str(base), DIGITS)
    assert main(["train", config]) == 0
    assert_margin_grew(tmp_path / "dpo")
    assert load_pretrained(tmp_path / "dpo").config.shape == "encoder-decoder"
    # The sources end in </s> and the decoder starts at <s>, as the reverse run was trained.
    setup = build_task(RunConfig.load(config, [f"train.out_dir={tmp_path / 'again'}"]))
    batch = next(iter(setup.train_data))
    lengths = batch.src_mask.sum(1)
    assert batch.src[torch.arange(len(lengths)), lengths - 1].eq(2).all()
    assert batch.tgt[:, 0].eq(1).all() and not batch.scored[:, 0].any()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train": {"init_from": ""}}, "set train.init_from to that run's folder"),
        ({"data": {"corpus": ""}}, "set data.corpus to that folder"),
        ({"eval": {"metric": "bleu"}}, "choose one of val_loss, reward_margin, reward_accuracy"),
    ],
)
def test_a_preference_run_is_refused_without_what_it_needs(tmp_path, change, message):
    base = tiny_run(tmp_path / "base", "decoder")
    data = {"task": "preference", "corpus": str(write_preference_pairs(tmp_path / "p", "abc"))}
    settings = {
        "data": data,
        "train": {"init_from": str(base), "out_dir": str(tmp_path / "out")},
    }
    for section, values in change.items():
        settings[section] = {**settings.get(section, {}), **values}
    with pytest.raises(AttnkitError, match=message):
        build_task(RunConfig.from_dict(settings))


@pytest.mark.parametrize(
    ("shape", "changes", "message"),
    [
        (
            "encoder",
            {},
            r"trains a decoder or an encoder-decoder model, but train\.init_from .* holds an "
            r"encoder one",
        ),
        ("encoder-decoder", {"copy_attention": "mean"}, r"which a pointer-generator .* replaces"),
    ],
)
def test_a_run_whose_responses_dpo_cannot_score_is_refused(tmp_path, shape, changes, message):
    base = tiny_run(tmp_path / "base", shape, **changes)
    corpus = write_preference_pairs(tmp_path / "p", "abc")
    config = RunConfig.from_dict(
        {
            "data": {"task": "preference", "corpus": str(corpus)},
            "train": {"init_from": str(base), "out_dir": str(tmp_path / "out")},
        }
    )
    with pytest.raises(AttnkitError, match=message):
        build_task(config)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"prompt": "abc", "chosen": "d"}, "line 2 has no 'rejected'"),
        ({"prompt": "abc", "chosen": "", "rejected": "b"}, "line 2 has an empty 'chosen'"),
        ({"prompt": "abc", "chosen": 3, "rejected": "b"}, "line 2 has a non-string 'chosen'"),
    ],
)
def test_a_bad_line_of_pairs_stops_the_run_naming_file_and_line(tmp_path, line, message):
    base = tiny_run(tmp_path / "base", "decoder")
    corpus = write_preference_pairs(tmp_path / "p", "abc")
    train_file = corpus / "train.jsonl"
    first = train_file.read_text().splitlines()[0]
    train_file.write_text(first + "\n" + json.dumps(line) + "\n")
    config = RunConfig.from_dict(
        {
            "data": {"task": "preference", "corpus": str(corpus)},
            "train": {"init_from": str(base), "out_dir": str(tmp_path / "out")},
        }
    )
    with pytest.raises(AttnkitError, match=f"{train_file}, {message}"):
        build_task(config)
