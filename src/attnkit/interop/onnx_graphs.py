"""The graphs a decoding loop needs, as torch modules over a model's own layers, for ONNX.

    encoder-only      model(ids, mask) -> logits, last_hidden_state
    decoder-only      decoder(ids, mask, past K_i, V_i) -> logits, present K_i, V_i
    encoder-decoder   encoder(src, src_mask) -> memory, cross-attention K_i, V_i
                      decoder(ids, src_mask, past K_i, V_i, cross K_i, V_i)
                          -> logits, present K_i, V_i

A decoder graph is one cached step of `KVCache` made a pure function: the past
keys and values come in as tensors and leave joined with the new position's,

    K_{<=t} = [K_{<t}; x_t W^K],   V_{<=t} = [V_{<t}; x_t W^V]

so the graph holds no state and its caller keeps the cache, as Optimum and
CTranslate2 split a decoder. One graph serves both the prompt and the steps
after it: a past of length 0 is the prompt's step. The cross-attention keys
and values depend on the source alone, so the encoder graph computes them once
and every step reads them (the encoder part of Optimum's past).

`TensorCache` stands where a `KVCache` does (`Stack.forward` reads its `mask`,
`memory_mask`, `layers` and `distance`; attention reads each layer's `update`
and `memory`), so the model's own embedding,
blocks and head run unchanged: nothing is copied or recomputed differently.
A step's logits are those of its last position, as `decode_step`'s are: a
decoding loop reads no others, and a prompt of n tokens would otherwise
project n rows onto the vocabulary.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor, nn
from torch.export import Dim

from attnkit.models import DecoderOnly, EncoderDecoder, EncoderOnly, TransformerModel
from attnkit.nn.kv_cache import HeldKV
from attnkit.nn.masks import causal_mask, padding_mask, self_attention_mask, slot_distance

# The example sizes the exporter traces at: all distinct and none 0 or 1, so that no axis is
# specialised to its example (torch.export fixes an axis whose example is 0 or 1, or equal to
# another's where the code compares them). The graphs then run at any size.
BATCH, LENGTH, PAST, SOURCE = 2, 3, 4, 5

# The axes' names in the graphs, Optimum's.
AXES = {
    "batch": "batch_size",
    "length": "sequence_length",
    "past": "past_sequence_length",
    "total": "total_sequence_length",
    "source": "encoder_sequence_length",
}


class _TensorLayer:
    """One layer's past keys and values as tensors, in place of a `LayerKV`."""

    def __init__(self, past: tuple[Tensor, Tensor], memory: tuple[Tensor, Tensor] | None):
        self.past, self.cross = past, memory
        self.present: tuple[Tensor, Tensor] | None = None

    def update(self, k: Tensor, v: Tensor) -> HeldKV:
        """The past keys and values joined with the new positions' (the present)."""
        self.present = (torch.cat((self.past[0], k), 2), torch.cat((self.past[1], v), 2))
        return HeldKV(*self.present)

    def memory(self) -> tuple[Tensor, Tensor] | None:
        return self.cross


class TensorCache:
    """What `Stack.forward` reads of a `KVCache`, built from tensors for one step.

    mask: the self-attention mask of the new queries over past and new keys, or None.
    memory_mask: (batch, 1, 1, source length) over the encoder output, or None.
    layers: each layer's past (and cross-attention keys and values); after the
        step, each holds its `present`.
    """

    def __init__(
        self,
        past: list[Tensor],
        n_new: int,
        mask: Tensor | None,
        memory: list[Tensor] | None = None,
        memory_mask: Tensor | None = None,
    ) -> None:
        cross = _pairs(memory) if memory else [None] * (len(past) // 2)
        self.layers = [_TensorLayer(p, m) for p, m in zip(_pairs(past), cross, strict=True)]
        self.n_new, self.mask, self.memory_mask = n_new, mask, memory_mask

    def distance(self) -> Tensor:
        """(new queries, keys) distance from each query to each key, for ALiBi."""
        return slot_distance(self.n_new, self.layers[0].past[0].shape[2] + self.n_new)

    def presents(self) -> list[Tensor]:
        return [t for layer in self.layers for t in layer.present]


def _pairs(flat: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
    return list(zip(flat[0::2], flat[1::2], strict=True))


def kv_names(prefix: str, n_layers: int, part: str = "") -> list[str]:
    """`prefix.{i}[.part].key` and `.value` of every layer, in the graphs' order."""
    part = f".{part}" if part else ""
    return [f"{prefix}.{i}{part}.{kind}" for i in range(n_layers) for kind in ("key", "value")]


class Graph(nn.Module, abc.ABC):
    """A graph to export: its file, named inputs and outputs, example inputs, dynamic axes."""

    file: str
    input_names: list[str]
    output_names: list[str]

    @abc.abstractmethod
    def example(self) -> tuple:
        """Inputs to trace at (sizes `BATCH`, `LENGTH`, `PAST`, `SOURCE`)."""

    @abc.abstractmethod
    def dynamic_shapes(self) -> tuple:
        """The dynamic axes of each input, as `torch.export` takes them."""


def _dims() -> dict[str, Dim]:
    return {key: Dim(name) for key, name in AXES.items()}


def _example_kv(model: TransformerModel, length: int) -> list[Tensor]:
    c = model.config
    shape = (BATCH, c.n_kv_heads, length, c.d_head)
    return [torch.randn(shape) for _ in range(2 * c.n_decoder_layers)]


class EncoderGraph(Graph):
    """An encoder-only model: ids, mask (and token types) -> logits, last hidden states."""

    file = "model.onnx"

    def __init__(self, model: EncoderOnly) -> None:
        super().__init__()
        self.model = model
        self.types = bool(model.config.n_token_types)
        self.input_names = ["input_ids", "attention_mask"] + ["token_type_ids"] * self.types
        self.output_names = ["logits", "last_hidden_state"]

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple:
        out = self.model(input_ids, attention_mask.bool(), token_types=token_type_ids)
        return out.logits, out.hidden

    def example(self) -> tuple:
        ids = torch.randint(0, self.model.config.vocab_size, (BATCH, LENGTH))
        mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
        return (ids, mask, torch.zeros_like(ids)) if self.types else (ids, mask)

    def dynamic_shapes(self) -> tuple:
        d = _dims()
        return ({0: d["batch"], 1: d["length"]},) * len(self.input_names)


class DecoderStep(Graph):
    """A decoder-only model's step: new ids and the mask of every position so far, past keys
    and values -> the last position's logits, present keys and values.

    The mask (batch, past + new), 1 for real tokens, carries a left-padded prompt's
    padding; positions are counted over real tokens, as `KVCache.extend` counts them.
    """

    file = "decoder.onnx"

    def __init__(self, model: DecoderOnly) -> None:
        super().__init__()
        self.model = model
        layers = model.config.n_decoder_layers
        self.input_names = ["input_ids", "attention_mask", *kv_names("past_key_values", layers)]
        self.output_names = ["logits", *kv_names("present", layers)]

    def forward(self, input_ids: Tensor, attention_mask: Tensor, past: list[Tensor]) -> tuple:
        m, n = self.model, input_ids.shape[1]
        real = attention_mask.bool()
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)[:, -n:]
        cache = TensorCache(past, n, self_attention_mask(real, n, causal=True))
        hidden, _ = m.decoder(m.embed(input_ids, positions), positions=positions, cache=cache)
        return (m.head(hidden[:, -1]), *cache.presents())

    def example(self) -> tuple:
        ids = torch.randint(0, self.model.config.vocab_size, (BATCH, LENGTH))
        return (
            ids,
            torch.ones(BATCH, PAST + LENGTH, dtype=torch.long),
            _example_kv(self.model, PAST),
        )

    def dynamic_shapes(self) -> tuple:
        d = _dims()
        kv = {0: d["batch"], 2: d["past"]}
        past = [kv] * (2 * self.model.config.n_decoder_layers)
        return {0: d["batch"], 1: d["length"]}, {0: d["batch"], 1: d["total"]}, past


class SourceEncoder(Graph):
    """An encoder-decoder's encoder: source ids and mask -> memory and, for each decoder
    layer, the cross-attention keys and values over it (computed once per source)."""

    file = "encoder.onnx"

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model
        self.input_names = ["input_ids", "attention_mask"]
        layers = model.config.n_decoder_layers
        self.output_names = ["last_hidden_state", *kv_names("present", layers, "encoder")]

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple:
        memory = self.model.encode(input_ids, attention_mask.bool())
        cross = [t for b in self.model.decoder.blocks for t in b.cross_attn.memory_kv(memory)]
        return (memory, *cross)

    def example(self) -> tuple:
        ids = torch.randint(0, self.model.config.src_vocab_size, (BATCH, SOURCE))
        return ids, torch.ones(BATCH, SOURCE, dtype=torch.long)

    def dynamic_shapes(self) -> tuple:
        d = _dims()
        return ({0: d["batch"], 1: d["source"]},) * 2


class TargetStep(Graph):
    """An encoder-decoder's decoder step: new target ids, the source mask, the past keys and
    values of self-attention and the encoder's cross-attention ones -> the last position's
    logits and the present self-attention keys and values.

    Targets are not padded (every row starts on the decoder start id), so
    positions follow the past and only causality masks self-attention.
    """

    file = "decoder.onnx"

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model
        layers = model.config.n_decoder_layers
        self.input_names = [
            "input_ids",
            "encoder_attention_mask",
            *kv_names("past_key_values", layers, "decoder"),
            *kv_names("past_key_values", layers, "encoder"),
        ]
        self.output_names = ["logits", *kv_names("present", layers, "decoder")]

    def forward(
        self, input_ids: Tensor, encoder_attention_mask: Tensor, past: list[Tensor], cross: list
    ) -> tuple:
        m, n = self.model, input_ids.shape[1]
        start = past[0].shape[2]
        positions = (start + torch.arange(n, device=input_ids.device))[None]
        mask = causal_mask(n, start + n, input_ids.device)
        memory_mask = padding_mask(encoder_attention_mask.bool())
        cache = TensorCache(past, n, mask, cross, memory_mask)
        x = m.tgt_embed(input_ids, positions)
        hidden, _ = m.decoder(x, positions=positions, cache=cache)
        return (m.head(hidden[:, -1]), *cache.presents())

    def example(self) -> tuple:
        ids = torch.randint(0, self.model.config.vocab_size, (BATCH, LENGTH))
        mask = torch.ones(BATCH, SOURCE, dtype=torch.long)
        return ids, mask, _example_kv(self.model, PAST), _example_kv(self.model, SOURCE)

    def dynamic_shapes(self) -> tuple:
        d = _dims()
        layers = 2 * self.model.config.n_decoder_layers
        past = [{0: d["batch"], 2: d["past"]}] * layers
        cross = [{0: d["batch"], 2: d["source"]}] * layers
        return {0: d["batch"], 1: d["length"]}, {0: d["batch"], 1: d["source"]}, past, cross


def graphs(model: TransformerModel) -> list[Graph]:
    """The graphs of `model`'s shape: one for an encoder, encoder and decoder step otherwise."""
    if isinstance(model, EncoderOnly):
        return [EncoderGraph(model)]
    if isinstance(model, DecoderOnly):
        return [DecoderStep(model)]
    return [SourceEncoder(model), TargetStep(model)]
