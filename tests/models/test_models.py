"""The three model shapes: parity with torch.nn.Transformer, invariances, gradients, counts."""

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from attnkit import DecoderOnly, EncoderDecoder, EncoderOnly, ModelConfig, build_model
from attnkit.data.batch import pad
from attnkit.models.block import Block
from attnkit.nn import attention, causal_mask, window
from tests.helpers import VARIANTS, WIDE, copy_from_torch, tiny_config

variants = pytest.mark.parametrize("variant", list(VARIANTS))


@torch.no_grad()
def copy_into_torch_transformer(model: EncoderDecoder, ref: nn.Transformer) -> None:
    """Our weights into torch.nn.Transformer: the two must then compute the same function."""
    for ours, theirs in zip(model.encoder.blocks, ref.encoder.layers, strict=True):
        copy_from_torch(ours.self_attn, theirs.self_attn)
        theirs.norm1.load_state_dict(ours.self_attn_residual.norm.state_dict())
        theirs.norm2.load_state_dict(ours.ff_residual.norm.state_dict())
        theirs.linear1.load_state_dict(ours.ff.w_1.state_dict())
        theirs.linear2.load_state_dict(ours.ff.w_2.state_dict())
    for ours, theirs in zip(model.decoder.blocks, ref.decoder.layers, strict=True):
        copy_from_torch(ours.self_attn, theirs.self_attn)
        copy_from_torch(ours.cross_attn, theirs.multihead_attn)
        theirs.norm1.load_state_dict(ours.self_attn_residual.norm.state_dict())
        theirs.norm2.load_state_dict(ours.cross_attn_residual.norm.state_dict())
        theirs.norm3.load_state_dict(ours.ff_residual.norm.state_dict())
        theirs.linear1.load_state_dict(ours.ff.w_1.state_dict())
        theirs.linear2.load_state_dict(ours.ff.w_2.state_dict())
    ref.encoder.norm.load_state_dict(model.encoder.norm.state_dict())
    ref.decoder.norm.load_state_dict(model.decoder.norm.state_dict())


def randomize_norms(model: nn.Module) -> None:
    """Give every LayerNorm non-trivial weights so a swapped norm cannot go unnoticed."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_decoder_equals_torch_transformer(norm_position: str, dtype: torch.dtype) -> None:
    # torch.nn.Transformer always closes both stacks with a LayerNorm, so we do too here.
    config = tiny_config(**WIDE, norm_position=norm_position, final_norm=True)
    model = EncoderDecoder(config).to(dtype).eval()
    randomize_norms(model)
    ref = nn.Transformer(
        d_model=32,
        nhead=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=64,
        dropout=0.0,
        batch_first=True,
        norm_first=norm_position == "pre",
    ).to(dtype)
    ref.eval()
    copy_into_torch_transformer(model, ref)

    src = torch.randint(4, 50, (3, 9))
    tgt = torch.randint(4, 50, (3, 6))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    tgt_mask = torch.ones_like(tgt, dtype=torch.bool)
    src_mask[1, 6:] = src_mask[2, 4:] = False
    tgt_mask[1, 4:] = tgt_mask[2, 2:] = False
    with torch.no_grad():
        ours = model(src, tgt, src_mask, tgt_mask).logits
        hidden = ref(
            model.src_embed(src),
            model.tgt_embed(tgt),
            tgt_mask=~causal_mask(6, 6),
            src_key_padding_mask=~src_mask,
            tgt_key_padding_mask=~tgt_mask,
            memory_key_padding_mask=~src_mask,
        )
        theirs = model.head(hidden)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(ours[tgt_mask], theirs[tgt_mask], atol=tol, rtol=tol)


def with_padding(
    ids: torch.Tensor, n_pad: int, left: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    fill = torch.full((ids.shape[0], n_pad), 0)
    mask = torch.cat([torch.ones_like(ids), torch.zeros_like(fill)], 1).bool()
    if left:
        return torch.cat([fill, ids], 1), mask.flip(1)
    return torch.cat([ids, fill], 1), mask


@variants
@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_a_causal_model_never_looks_ahead(shape: str, variant: str) -> None:
    model = build_model(tiny_config(shape, **WIDE, **VARIANTS[variant])).eval()
    ids = torch.randint(4, 50, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(4, 50, (2, 4))
    src = torch.randint(4, 50, (2, 7))
    with torch.no_grad():
        if shape == "decoder":
            a, b = model(ids).logits, model(changed).logits
        else:
            a, b = model(src, ids).logits, model(src, changed).logits
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@variants
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("shape", ["decoder", "encoder"])
def test_padding_never_changes_real_positions_of_single_stack_models(
    shape: str, left: bool, variant: str
) -> None:
    model = build_model(tiny_config(shape, **WIDE, **VARIANTS[variant])).eval()
    ids = torch.randint(4, 50, (1, 8))
    padded, mask = with_padding(ids, 5, left=left)
    with torch.no_grad():
        alone = model(ids).logits
        batched = model(padded, mask).logits
    torch.testing.assert_close(batched[mask].view_as(alone), alone, atol=1e-5, rtol=1e-5)


@variants
def test_padding_never_changes_real_positions_of_encoder_decoder(variant: str) -> None:
    # Source padding touches encoder self-attention and cross-attention; target
    # padding touches decoder self-attention.
    model = EncoderDecoder(tiny_config(**WIDE, **VARIANTS[variant])).eval()
    src, tgt = torch.randint(4, 50, (1, 7)), torch.randint(4, 50, (1, 5))
    src_padded, src_mask = with_padding(src, 4)
    tgt_padded, tgt_mask = with_padding(tgt, 3)
    with torch.no_grad():
        alone = model(src, tgt).logits
        padded = model(src_padded, tgt_padded, src_mask, tgt_mask).logits
    torch.testing.assert_close(padded[tgt_mask].view_as(alone), alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", ["window", "sparse"])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("shape", ["decoder", "encoder"])
def test_a_window_over_a_long_sequence_runs_blockwise_as_the_mask_would(
    shape: str, left: bool, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beyond two windows (of a long enough sequence: here any) the stack drops the mask for
    # `local_attention`; asking for the weights takes the masked path, which must agree.
    blockwise = []
    monkeypatch.setattr(attention, "local_attention", spy(attention.local_attention, blockwise))
    monkeypatch.setattr(window, "BLOCKWISE_MIN_LENGTH", 0)
    monkeypatch.setattr(window, "STRIDED_MIN_LENGTH", 0)
    model = build_model(tiny_config(shape, **WIDE, **VARIANTS[variant])).eval()
    ids, mask = with_padding(torch.randint(4, 50, (2, 8)), 3, left=left)
    with torch.no_grad():
        out = model(ids, mask).logits
        assert len(blockwise) == 2  # one call per layer
        masked = model(ids, mask, need_weights=True).logits
        assert len(blockwise) == 2
        model(ids[:, :4], mask[:, :4])  # no longer than two windows: the masked path
        assert len(blockwise) == 2
    torch.testing.assert_close(out[mask], masked[mask], atol=1e-5, rtol=1e-5)


def spy(fn: Callable, calls: list) -> Callable:
    """`fn`, appending to `calls` each time it is called."""

    def wrapper(*args, **kwargs):
        calls.append(fn)
        return fn(*args, **kwargs)

    return wrapper


@variants
@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder", "encoder"])
def test_each_sequence_in_a_batch_gives_the_same_result_as_alone(shape: str, variant: str) -> None:
    model = build_model(tiny_config(shape, **WIDE, **VARIANTS[variant])).eval()
    lengths = [3, 8, 5]
    seqs = [torch.randint(4, 50, (n,)) for n in lengths]
    src_seqs = [torch.randint(4, 50, (n + 2,)) for n in lengths]
    ids, mask = pad(seqs, 0)
    src, src_mask = pad(src_seqs, 0)
    with torch.no_grad():
        if shape == "encoder-decoder":
            batched = model(src, ids, src_mask, mask).logits
            alone = [model(s[None], t[None]).logits[0] for s, t in zip(src_seqs, seqs, strict=True)]
        else:
            batched = model(ids, mask).logits
            alone = [model(t[None]).logits[0] for t in seqs]
    for row, (n, expected) in enumerate(zip(lengths, alone, strict=True)):
        torch.testing.assert_close(batched[row, :n], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "config",
    [
        tiny_config(**WIDE),
        tiny_config(
            **WIDE, norm_position="pre", tie_embeddings="none", positional="learned", n_kv_heads=2
        ),
        tiny_config("decoder", **WIDE, activation="gelu"),
        tiny_config("encoder", **WIDE, bias=False, tie_embeddings="none"),
        *(tiny_config(**WIDE, **VARIANTS[v]) for v in list(VARIANTS)[1:]),
    ],
    ids=["paper", "pre-ln-untied-gqa", "decoder", "encoder-no-bias", *list(VARIANTS)[1:]],
)
def test_every_parameter_receives_a_gradient(config: ModelConfig) -> None:
    model = build_model(config).train()
    ids = torch.randint(4, 50, (2, 6))
    out = model(ids, ids) if config.shape == "encoder-decoder" else model(ids)
    out.logits.logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} got no gradient"


@pytest.mark.parametrize(("preset", "paper"), [("paper-base", 65e6), ("paper-big", 213e6)])
def test_paper_models_have_the_papers_parameter_counts(preset: str, paper: float) -> None:
    # Table 3 of the paper, with its shared source-target vocabulary of 37,000 tokens.
    with torch.device("meta"):  # shapes only: no memory, no time
        model = build_model(ModelConfig.from_preset(preset))
    assert abs(model.num_parameters() - paper) / paper < 0.05
    counts = model.parameter_counts()
    assert counts["total"] == model.num_parameters()
    assert counts["tgt_embed"] == counts["head"] == 0  # tied to the source embedding


def test_weight_tying_shares_one_matrix() -> None:
    all_tied = EncoderDecoder(tiny_config(**WIDE, tie_embeddings="all"))
    assert (
        all_tied.src_embed.token.weight is all_tied.tgt_embed.token.weight is all_tied.head.weight
    )
    decoder_tied = EncoderDecoder(tiny_config(**WIDE, tie_embeddings="decoder"))
    assert decoder_tied.head.weight is decoder_tied.tgt_embed.token.weight
    assert decoder_tied.src_embed.token.weight is not decoder_tied.head.weight
    untied = DecoderOnly(tiny_config("decoder", **WIDE, tie_embeddings="none"))
    assert untied.head.weight is not untied.embed.token.weight


def test_attention_weights_of_every_layer_and_head() -> None:
    model = EncoderDecoder(tiny_config(**WIDE)).eval()
    src, tgt = torch.randint(4, 50, (2, 7)), torch.randint(4, 50, (2, 5))
    out = model(src, tgt, need_weights=True)
    assert [w.shape for w in out.attentions["encoder"]] == [(2, 4, 7, 7)] * 2
    assert [w.shape for w in out.attentions["decoder"]] == [(2, 4, 5, 5)] * 2
    assert [w.shape for w in out.attentions["cross"]] == [(2, 4, 5, 7)] * 2
    # Asking for weights switches to the reference path; the logits must not change.
    torch.testing.assert_close(out.logits, model(src, tgt).logits, atol=1e-5, rtol=1e-5)
    encoder = EncoderOnly(tiny_config("encoder", **WIDE)).eval()
    assert len(encoder(src, need_weights=True).attentions["encoder"]) == 2


def test_cross_weights_of_chosen_layers_only() -> None:
    model = EncoderDecoder(tiny_config(**WIDE)).eval()
    src, tgt = torch.randint(4, 50, (2, 7)), torch.randint(4, 50, (2, 5))
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    every = model(src, tgt, src_mask, need_weights=True)
    chosen = model(src, tgt, src_mask, cross_weights=[1])
    assert list(chosen.attentions) == ["cross"] and len(chosen.attentions["cross"]) == 1
    torch.testing.assert_close(chosen.attentions["cross"][0], every.attentions["cross"][1])
    assert chosen.attentions["cross"][0][1, :, :, 4:].abs().max() == 0  # padding unread
    torch.testing.assert_close(chosen.logits, every.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder", "encoder"])
def test_each_shape_compiles_to_one_graph(shape: str) -> None:
    """A graph break (a value read back to Python) would split `train.compile`'s graph."""
    model = build_model(tiny_config(shape, **WIDE)).eval()
    ids = torch.randint(4, 50, (2, 9))
    args = (torch.randint(4, 50, (2, 7)), ids) if shape == "encoder-decoder" else (ids,)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args).logits, model(*args).logits)


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_gpt2s_initialisation(shape: str) -> None:
    torch.manual_seed(0)
    model = build_model(tiny_config(shape, 3, d_model=128, d_ff=512, n_heads=4, init="gpt2"))
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    residual = {id(w) for b in blocks for w in b.residual_projections()}
    assert len(residual) == 2 * len(blocks) + (
        len(blocks) // 2 if shape == "encoder-decoder" else 0
    )
    for name, p in model.named_parameters():
        if p.dim() < 2 or "norm" in name or "positions" in name:
            continue
        std = 0.02 / math.sqrt(2 * len(blocks)) if id(p) in residual else 0.02
        assert float(p.detach().std()) == pytest.approx(std, rel=0.08), name
    biases = [p for n, p in model.named_parameters() if n.endswith("bias") and "norm" not in n]
    assert all(torch.equal(b, torch.zeros_like(b)) for b in biases)
