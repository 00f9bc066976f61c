"""ONNX export: ONNX Runtime gives PyTorch's outputs, and its greedy decoding attnkit's tokens.

Three shapes, each exported once per module: a BERT-like encoder (learned positions,
token types), a Llama-like decoder (RoPE, RMSNorm, SwiGLU, grouped-query attention)
and the paper's encoder-decoder (sinusoidal positions, post-LN). They are traced at
batch 2 (`onnx_graphs.BATCH`) and run here at other batches and lengths.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F

from attnkit.cli import main
from attnkit.data.batch import pad
from attnkit.errors import AttnkitError
from attnkit.generation import generate
from attnkit.interop.onnx_export import NOT_INSTALLED, save_onnx
from attnkit.interop.onnx_graphs import kv_names
from attnkit.interop.onnx_runtime import OnnxModel
from attnkit.models import build_model
from attnkit.run import RunFolder, load_pretrained, save_pretrained, with_decoding_ids
from attnkit.tokenizer import Tokenizer
from tests.helpers import RUN_LINES, VARIANTS, padded_batch, tiny_config, tiny_model

SMALL = {"d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 48, "dropout": 0.0}
LLAMA = VARIANTS["llama"]  # RoPE, RMSNorm, SwiGLU, GQA, no biases, pre-LN
NEW = 12  # new tokens per decode


def _fit(model, tokenizer: Tokenizer, steps: int = 60) -> None:
    """A few steps of Adam on `RUN_LINES`: a language model learns them, a translation model
    to copy them; random weights would repeat one token, which tells little."""
    lines = [tokenizer.encode(t, add_bos=True, add_eos=True) for t in RUN_LINES]
    ids, mask = pad(lines, tokenizer.pad_id)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        if model.config.shape == "decoder":
            logits = model(ids[:, :-1], mask[:, :-1]).logits
        else:
            logits = model(ids, ids[:, :-1], mask, mask[:, :-1]).logits
        loss = F.cross_entropy(
            logits.flatten(0, 1), ids[:, 1:].flatten(), ignore_index=tokenizer.pad_id
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _exported_run(root, shape: str, **changes) -> tuple:
    """A run folder of a 2-layer `shape` model with a character tokenizer, briefly trained,
    and its export by `attnkit export onnx`."""
    tokenizer = Tokenizer.train("char", texts=RUN_LINES * 3)
    sizes = {"vocab_size": tokenizer.vocab_size, "embedding_dropout": 0.0, **SMALL}
    config = with_decoding_ids(tiny_config(shape, 2, **sizes, **changes), tokenizer)
    torch.manual_seed(0)
    model = build_model(config)
    _fit(model, tokenizer)
    run = save_pretrained(model, root / "run")
    tokenizer.save(RunFolder(run).tokenizer)
    assert main(["export", "onnx", str(run), str(root / "onnx")]) == 0
    return run, root / "onnx"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _exported_run(tmp_path_factory.mktemp("llama"), "decoder", **LLAMA)


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    return _exported_run(tmp_path_factory.mktemp("paper"), "encoder-decoder")


def _eos_within_reach(model, ids, mask) -> int:
    """An id that greedy decoding emits early in row 1, so that EOS ends rows at several steps."""
    free = generate(model, ids, mask, max_new_tokens=NEW, eos_token_id=()).new_tokens()
    return free[1][3]


def test_encoder_outputs_equal_pytorch_at_other_sizes(tmp_path):
    bert = {"positional": "learned", "activation": "gelu", "n_token_types": 2}
    model = tiny_model("encoder", layers=2, vocab_size=50, embedding_norm=True, **SMALL, **bert)
    out = save_onnx(model.eval(), tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.onnx"]
    runtime = OnnxModel(out, threads=1)
    for lengths, width in (([5], 5), ([11, 4, 8], 11)):
        ids, mask = padded_batch(lengths, width, 50)
        types = (torch.arange(width) >= 2).long().expand_as(ids)
        onnx_out = runtime.forward(ids, mask, types)
        with torch.no_grad():
            ref = model(ids, mask, token_types=types)
        np.testing.assert_allclose(onnx_out["logits"], ref.logits, atol=1e-5, rtol=0)
        np.testing.assert_allclose(onnx_out["last_hidden_state"], ref.hidden, atol=1e-5, rtol=0)


def test_decoder_graph_has_optimums_names_and_dynamic_axes(llama):
    _, out = llama
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "decoder.onnx",
        "tokenizer.json",
    ]
    graph = onnx.load(out / "decoder.onnx").graph

    def axes(values):
        return {
            v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in values
        }

    inputs, outputs = axes(graph.input), axes(graph.output)
    assert list(inputs) == ["input_ids", "attention_mask", *kv_names("past_key_values", 2)]
    assert list(outputs) == ["logits", *kv_names("present", 2)]
    assert inputs["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert inputs["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 8]
    assert outputs["present.0.key"][2] == "past_sequence_length + sequence_length"


def _assert_steps_equal_decode_step(model, folder) -> None:
    """decoder.onnx on left-padded prompts with an empty past, then on one new token with
    the past it gave, gives `decode_step`'s logits on attnkit's cache."""
    c = model.config
    session = onnxruntime.InferenceSession(str(folder / "decoder.onnx"))
    names = kv_names("past_key_values", c.n_decoder_layers)
    ids, mask = padded_batch([6, 3, 1], 6, c.vocab_size)
    ids, mask = ids.flip(1), mask.flip(1)  # left-padded, as decoding pads prompts
    empty = np.zeros((3, c.n_kv_heads, 0, c.d_head), np.float32)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy()}
    feeds |= dict.fromkeys(names, empty)
    cache = model.new_cache(ids, mask, capacity=8)
    for step in range(2):
        logits, *present = session.run(None, feeds)
        with torch.no_grad():
            ref = model.decode_step(ids, cache, mask if step == 0 else None)
        np.testing.assert_allclose(logits, ref, atol=1e-5, rtol=0)
        ids = ref.argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones_like(ids, dtype=torch.bool)], 1)
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy()}
        feeds |= dict(zip(names, present, strict=True))


def test_one_decoder_graph_runs_the_prompt_on_an_empty_past_and_then_each_step(llama):
    run, out = llama
    _assert_steps_equal_decode_step(load_pretrained(run), out)


def test_an_alibi_decoder_steps_as_attnkit(tmp_path):
    model = tiny_model("decoder", layers=1, positional="alibi", dropout=0.0).eval()
    _assert_steps_equal_decode_step(model, save_onnx(model, tmp_path))


def test_greedy_through_the_graphs_gives_generates_tokens(llama):
    run, out = llama
    model = load_pretrained(run)
    ids, mask = padded_batch([7, 4, 2, 5], 7, model.config.vocab_size)
    ids[3], mask[3] = ids[3].flip(0), mask[3].flip(0)  # one prompt left-padded among others
    eos = _eos_within_reach(model, ids, mask)
    ours = generate(model, ids, mask, max_new_tokens=NEW, eos_token_id=eos).new_tokens()
    theirs = OnnxModel(out, threads=1).greedy(ids, mask, max_new_tokens=NEW, eos_token_id=eos)
    assert theirs == ours
    assert len(set(map(len, ours))) > 1  # EOS ended rows at different steps


def test_onnx_completion_is_what_attnkit_generate_prints(llama, capsys):
    run, out = llama
    capsys.readouterr()
    main(["generate", str(run), "--prompt", "a dog", "--greedy", "--max-new-tokens", str(NEW)])
    printed = capsys.readouterr().out
    assert printed == "a dog" + OnnxModel(out, threads=1).complete("a dog", NEW) + "\n"


def test_greedy_translation_through_the_graphs_gives_generates_tokens(paper):
    run, out = paper
    model = load_pretrained(run)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "decoder.onnx",
        "encoder.onnx",
        "tokenizer.json",
    ]
    src, mask = padded_batch([9, 3, 6], 9, model.config.vocab_size)
    eos = _eos_within_reach(model, src, mask)
    ours = generate(model, src, mask, max_new_tokens=NEW, eos_token_id=eos).new_tokens()
    theirs = OnnxModel(out, threads=1).greedy(src, mask, max_new_tokens=NEW, eos_token_id=eos)
    assert theirs == ours
    assert len(set(map(len, ours))) > 1


def test_onnx_translation_is_what_attnkit_translate_prints(paper, tmp_path, capsys):
    run, out = paper
    lines = ["ein hund läuft", "", "zwei kinder spielen im park", "a cat"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    options = ["--input", str(tmp_path / "in.txt"), "--max-new-tokens", str(NEW), "--no-progress"]
    assert main(["translate", str(run), *options]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == OnnxModel(out, threads=1).translate(lines, NEW)


@pytest.mark.parametrize(
    ("option", "changes"),
    [
        ("copy_attention", {"copy_attention": "mean", "unk_id": 3}),
        ("n_experts", {"n_experts": 2}),
        ("attention_window", {"attention_window": 3}),
        ("attention_kind", {"attention_kind": "location-aware"}),
        ("attention_kind", {"attention_kind": "monotonic"}),
    ],
)
def test_variants_the_graphs_cannot_carry_are_refused(option, changes, tmp_path):
    model = tiny_model("encoder-decoder", **changes)
    with pytest.raises(AttnkitError, match=f"^{option} .* not exported to ONNX") as info:
        save_onnx(model, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_an_export_replaces_only_an_earlier_export(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    model = tiny_model("decoder")
    with pytest.raises(AttnkitError, match="is not empty; choose a new folder"):
        save_onnx(model, tmp_path)
    with pytest.raises(AttnkitError, match=r"holds notes\.txt, which an ONNX export does not"):
        save_onnx(model, tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_missing_onnx_packages_are_named_with_the_extra(monkeypatch, tmp_path):
    for name in ("onnx", "onnxruntime"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as when not installed
    with pytest.raises(AttnkitError, match=f"^{re.escape(NOT_INSTALLED)}$"):
        save_onnx(tiny_model("decoder"), tmp_path / "out")
    with pytest.raises(AttnkitError, match=f"^{re.escape(NOT_INSTALLED)}$"):
        OnnxModel(tmp_path)
