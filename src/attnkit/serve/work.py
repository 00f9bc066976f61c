"""What a batch of work does with a model, beside token-by-token decoding: sentence vectors,
beam search and a pointer-generator's translations, a prompt's log-probabilities, and the
attention views of the page.

Each function is given every item of one batch (`batching.Batcher`) and yields
its results in pieces, (item index, result) pairs, each piece a job of the
decoding thread of its own: the streams under way take a decoding step between
two pieces (a piece may hold no result yet: a slice of work that gives way). A
piece is sized to take about `SLICE_S` by the `Pace` each model's work has shown
so far:

- sentence vectors: a few rows a piece (rows x padded length);
- beam search: a resumable search (`generation.beam.BeamSearch`) of a few texts,
  its prefix one slice, then a few decoding steps a slice (beams x steps), its
  state kept between slices, so a long search (one source, 8 beams, 256 tokens)
  holds a stream for a slice, not for the search; the results are the one-shot
  search's, whatever the slices;
- an attention view: its greedy output a few decoding steps a slice; its weights
  one forward pass, a slice of its own (over at most VIEW_LIMIT tokens a side, it
  costs about a short prompt's prefill; its layers run in one call of the model,
  so the pass is not cut further); then those weights written out as numbers a
  layer a slice (Python's work on each weight, the longest part of a view on a
  large model); a translation's views the same, a pair at a time;
- a prompt's log-probabilities: a prompt a piece (one forward pass, bounded by
  the server's max_input_tokens);
- a pointer-generator's single translations (`attnkit.inference.translate`, which
  writes its copied words back): a few texts a piece, texts x beams x new tokens,
  each a whole decoding.

A beam search's outputs end for a `stop` (the model's end token) or their
`length` (`max_new_tokens` spent), as OpenAI names the two.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import torch

from attnkit.data.batch import pad
from attnkit.generation import GenerationConfig, generate, stream
from attnkit.generation.beam import BeamSearch
from attnkit.generation.config import resolve
from attnkit.generation.rows import Token
from attnkit.generation.text import token_text
from attnkit.inference import translate as translate_texts
from attnkit.serve.runs import Served

SLICE_S = 0.1  # about how long one piece of batch work holds the decoding thread
FIRST_PIECE = 256  # the work units (tokens) of a model's first piece, before any is timed

Pieces = Iterator[list[tuple[int, object]]]  # a batch's results, piece by piece
# Slices of one item's work: each yields [] (no result yet, the thread gives way) and
# the generator returns the item's result.
Slices = Generator[list, None, object]


class Pace:
    """How many units of a kind of work fit in `SLICE_S` on one model, learnt from the
    pieces run so far (a running mean of seconds per unit). `first`: the units of the
    first piece, before any is timed (work counted in decoding steps starts at one)."""

    def __init__(self, first: int | None = None) -> None:
        self.first = first
        self.seconds_per_unit: float | None = None

    def units(self) -> int:
        if self.seconds_per_unit is None:
            return FIRST_PIECE if self.first is None else self.first
        return max(1, int(SLICE_S / self.seconds_per_unit))

    def timed(self, units: int, seconds: float) -> None:
        rate = seconds / max(units, 1)
        last = self.seconds_per_unit
        self.seconds_per_unit = rate if last is None else (last + rate) / 2


_paces: weakref.WeakKeyDictionary[Served, dict[str, Pace]] = weakref.WeakKeyDictionary()


def pace(served: Served, kind: str, first: int | None = None) -> Pace:
    """The pace of `kind` of work (embed, translate, beam, view) on a served model; `first`:
    the units of its first piece."""
    return _paces.setdefault(served, {}).setdefault(kind, Pace(first))


@dataclass(frozen=True)
class Translated:
    """One text's translations (n of them), how each ended, and the tokens read and written."""

    texts: list[str]
    finish: list[str]
    prompt_tokens: int
    completion_tokens: int


def translate(
    served: Served, decoding: GenerationConfig, items: list[tuple[str, list[int]]]
) -> Pieces:
    """Translate each (text, source ids) with an encoder-decoder: a beam search a few texts
    a search, in slices of a few steps (`_beam_search`); a pointer-generator's translations
    or n-best samples a few texts a piece (all at once with a seed, whose draws depend on
    the batch). An empty text gives an empty translation."""
    config = resolve(decoding, {}, served.model.config, served.tokenizer)
    n = config.num_return_sequences
    empty = [(i, Translated([""] * n, ["stop"] * n, 0, 0))
             for i, (text, _) in enumerate(items) if not text.strip()]  # fmt: skip
    if empty:
        yield empty
    todo = [i for i, (text, _) in enumerate(items) if text.strip()]
    if config.num_beams > 1 and not _copies(served, config):
        yield from _beam_search(served, config, items, todo)
        return
    per_text = config.num_beams * n * config.max_new_tokens
    speed, start = pace(served, "translate"), 0
    while start < len(todo):
        size = len(todo) if config.seed is not None else max(1, speed.units() // per_text)
        piece, start = todo[start : start + size], start + size
        began = time.perf_counter()
        done = _translate(served, config, [items[i] for i in piece])
        speed.timed(len(piece) * per_text, time.perf_counter() - began)
        yield list(zip(piece, done, strict=True))


def _copies(served: Served, config: GenerationConfig) -> bool:
    """Whether a pointer-generator translates through `attnkit.inference.translate`, which
    writes its copied words back (one translation a text)."""
    return served.model.config.copy_attention != "none" and config.num_return_sequences == 1


def _beam_search(
    served: Served, config: GenerationConfig, items: list[tuple[str, list[int]]], todo: list[int]
) -> Pieces:
    """Beam searches of as many texts as one step's pace allows (beams x texts), each run a
    slice at a time: its prefix, then as many steps as the pace allows for the rows still
    searched, the thread given way between two slices; a search's texts are answered at
    its end."""
    speed, k, start = pace(served, "beam", first=1), config.num_beams, 0
    tokenizer, device = served.tokenizer, served.model.device
    while start < len(todo):
        size = max(1, speed.units() // k)
        piece, start = todo[start : start + size], start + size
        ids, mask = pad([items[i][1] for i in piece], tokenizer.pad_id)
        search = BeamSearch(served.model, ids.to(device), mask.to(device), config)
        try:
            while not search.done:
                yield []
                rows, ran = len(search.active) * k, search.step
                steps = max(1, speed.units() // rows)
                began = time.perf_counter()
                search.advance(steps)
                speed.timed(rows * (search.step - ran), time.perf_counter() - began)
        finally:  # a batch whose requests have all gone stops here
            search.close()
        new = search.result().new_tokens()
        yield list(
            zip(piece, _translated(served, config, [items[i] for i in piece], new), strict=True)
        )


def _translate(
    served: Served, config: GenerationConfig, items: list[tuple[str, list[int]]]
) -> list[Translated]:
    """A pointer-generator translates through `attnkit.inference.translate`, which writes its
    copied words back; its token counts are those of its output re-read."""
    tokenizer = served.tokenizer
    if _copies(served, config):
        texts = served.sources([text for text, _ in items])
        done = translate_texts(served.model, tokenizer, texts, config, batch_size=len(texts))
        new = [tokenizer.encode(t) for t in done]
    else:
        ids, mask = pad([source for _, source in items], tokenizer.pad_id)
        device = served.model.device
        new = generate(served.model, ids.to(device), mask.to(device), config).new_tokens()
    return _translated(served, config, items, new)


def _translated(
    served: Served,
    config: GenerationConfig,
    items: list[tuple[str, list[int]]],
    new: list[list[int]],
) -> list[Translated]:
    """Each text's `Translated` from the new tokens of its n outputs (rows text * n + i)."""
    texts, n = served.tokenizer.decode_batch(new), config.num_return_sequences
    outputs = []
    for k, (_, source) in enumerate(items):
        rows = range(k * n, (k + 1) * n)
        outputs.append(
            Translated(
                [texts[r] for r in rows],
                ["length" if len(new[r]) >= config.max_new_tokens else "stop" for r in rows],
                len(source),
                sum(len(new[r]) for r in rows),
            )
        )
    return outputs


def embed(served: Served, options: None, ids: list[list[int]]) -> Pieces:
    """Each input's sentence vector, pooled as the model's own pooling says: inputs of like
    length together, as many a piece as its pace allows (rows x padded length)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    speed, start = pace(served, "embed"), 0
    while start < len(order):
        budget, end = speed.units(), start + 1
        while end < len(order) and (end + 1 - start) * len(ids[order[end]]) <= budget:
            end += 1
        piece, start = order[start:end], end
        rows = [ids[i] for i in piece]
        began = time.perf_counter()
        vectors = served.encoder.encode_ids(rows, batch_size=len(rows))
        speed.timed(len(rows) * len(rows[-1]), time.perf_counter() - began)
        yield list(zip(piece, vectors, strict=True))


def prompt_logprobs(served: Served, top: int, prompts: list[list[int]]) -> Pieces:
    """Each prompt token's log-probability after the tokens before it, with the `top` most
    likely there (the first token has none: nothing predicts it); a prompt a piece."""
    for i, ids in enumerate(prompts):
        yield [(i, _prompt_logprobs(served, top, ids))]


@torch.no_grad()
def _prompt_logprobs(served: Served, top: int, ids: list[int]) -> list[Token]:
    tokenizer = served.tokenizer
    logprobs = torch.log_softmax(served.model(_tensor(served, [ids])).logits[0].float(), -1)
    tokens = [Token(token_text(tokenizer, None, ids[0]), None)]
    for i in range(1, len(ids)):
        row = logprobs[i - 1]
        best = row.topk(top) if top else None
        alternatives = (
            ()
            if best is None
            else tuple(
                (token_text(tokenizer, ids[i - 1], t), v)
                for t, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)
            )
        )
        text = token_text(tokenizer, ids[i - 1], ids[i])
        tokens.append(Token(text, float(row[ids[i]]), alternatives))
    return tokens


VIEW_TOKENS = 24  # the most tokens the attention viewer decodes after the text
VIEW_LIMIT = 64  # the most tokens a side of an attention view shows: weights grow as its square


def attention(served: Served, options: None, items: list[tuple[str, str | None]]) -> Pieces:
    """For the viewer: for each (text, output) the output (given, or the model's greedy one of
    up to VIEW_TOKENS), their tokens (up to VIEW_LIMIT a side) and every attention weight, as
    `{kind: [layer][head][query][key]}` (kinds "encoder", "decoder", "cross", as the model has);
    a greedy output a few steps a slice, a view's weights a piece."""
    for i, (text, output) in enumerate(items):
        view = yield from _attention(served, text, output)
        yield [(i, view)]


def translation_attention(served: Served, options: None, pairs: list[tuple[str, str]]) -> Pieces:
    """The attention of each (source, translation) pair, the translation given as text; a
    pair at a time, its weights written out a layer a slice."""
    for i, (source, translation) in enumerate(pairs):
        view = yield from _translation_attention(served, source, translation)
        yield [(i, view)]


def _translation_attention(served: Served, source: str, translation: str) -> Slices:
    tokenizer, limit = served.tokenizer, min(served.max_len - 1, VIEW_LIMIT)
    (src,) = served.encode([source])
    start = resolve(None, {}, served.model.config, tokenizer).decoder_start_token_id
    tgt = [start, *tokenizer.encode(translation)]  # as decoding starts it
    total = {"queries": len(tgt), "keys": len(src)}
    src, tgt = src[:limit], tgt[:limit]
    with torch.no_grad():
        out = served.model(_tensor(served, [src]), _tensor(served, [tgt]), need_weights=True)
    return (yield from _view(served, out.attentions, tgt, src, translation, total))


def _attention(served: Served, text: str, output: str | None) -> Slices:
    """One view: the greedy output in slices (`_greedy`), the forward pass with weights in
    a slice, the weights written out a layer a slice (`_view`)."""
    model, tokenizer = served.model, served.tokenizer
    # an encoder-decoder stops at its max_len: ask no more (`generate` would say so each time)
    most = min(VIEW_TOKENS, served.max_len - 1)
    config = resolve(GenerationConfig(max_new_tokens=most), {}, model.config, tokenizer)
    limit = min(served.max_len - 1, VIEW_LIMIT)
    (ids,) = served.encode([text])
    if served.shape == "encoder-decoder":
        if output is None:
            output = tokenizer.decode((yield from _greedy(served, ids[:limit], config)))
            yield []
        return (yield from _translation_attention(served, text, output))
    if served.shape == "encoder":
        new = []
    elif output is not None:
        new = tokenizer.encode(output)
    else:
        new = yield from _greedy(served, ids[-limit:], config)
        yield []
    ids = ids + new
    total = {"queries": len(ids), "keys": len(ids)}
    ids = ids[:limit]
    with torch.no_grad():
        out = model(_tensor(served, [ids]), need_weights=True)
    return (yield from _view(served, out.attentions, ids, ids, tokenizer.decode(new), total))


def _greedy(served: Served, ids: list[int], config: GenerationConfig) -> Slices:
    """The model's greedy output after `ids` (`generate`'s, up to its end token), as many
    decoding steps a slice as the pace allows (its prefix in the first)."""
    speed, new = pace(served, "view", first=1), []
    steps = stream(served.model, _tensor(served, [ids]), config=config)
    try:
        while True:
            budget, began = speed.units(), time.perf_counter()
            ran = 0
            for token in itertools.islice(steps, budget):
                new.append(int(token[0]))
                ran += 1
            if ran:
                speed.timed(ran, time.perf_counter() - began)
            if ran < budget:
                break
            yield []
    finally:
        steps.close()
    return new[: next((i for i, t in enumerate(new) if t in config.eos_ids), len(new))]


def _view(
    served: Served,
    attentions: dict,
    queries: list[int],
    keys: list[int],
    text: str,
    total: dict[str, int],
) -> Slices:
    """The view's answer; its weights written out as numbers a layer a slice (Python's work
    on every weight: seconds for GPT-2 small's 12 layers x 12 heads x 64 x 64 on a busy CPU)."""
    tokenizer = served.tokenizer
    weights: dict[str, list] = {}
    for kind, layers in attentions.items():
        weights[kind] = []
        for layer in layers:
            heads = layer[0].tolist()
            weights[kind].append([[[round(x, 4) for x in row] for row in head] for head in heads])
            yield []

    def labels(ids: list[int]) -> list[str]:
        """Each token as the text it adds, so pieces read as words (no ▁, Ġ or ##)."""
        return [
            token_text(tokenizer, ids[i - 1] if i else None, t).strip() or "␣"
            for i, t in enumerate(ids)
        ]

    return {
        "text": text,
        "tokens": {
            "queries": [tokenizer.id_to_token(i) for i in queries],
            "keys": [tokenizer.id_to_token(i) for i in keys],
        },
        "labels": {"queries": labels(queries), "keys": labels(keys)},
        "total": total,
        "attention": weights,
    }


def _tensor(served: Served, rows: list[list[int]]) -> torch.Tensor:
    """Token ids on the served model's device."""
    return torch.tensor(rows, device=served.model.device)
