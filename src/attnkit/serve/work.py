"""What a batch does with a model: continue prompts, translate sources, embed texts.

Each function runs on the decoding thread with every request of one batch:
the prompts (or sources) padded together and decoded by one `generate` call
with the batch's options, each output cut at its end-of-sequence token. A
continuation ends for a `stop` (the model's end token) or its `length`
(`max_tokens` spent), as OpenAI names the two.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from attnkit.data.batch import pad
from attnkit.data.section import DataSection
from attnkit.generation import GenerationConfig, generate, stream
from attnkit.inference import TextPieces
from attnkit.inference import translate as translate_texts
from attnkit.models import TransformerModel
from attnkit.pooling import sentence_embeddings
from attnkit.tokenizer import Tokenizer


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, a part of batch keys
class Served:
    """A run folder being served under a name, with the [data] section it was trained with
    (how its sources are prepared, `prepare_sources`)."""

    name: str
    model: TransformerModel
    tokenizer: Tokenizer
    data: DataSection = field(default_factory=DataSection)

    @property
    def shape(self) -> str:
        return self.model.config.shape


@dataclass(frozen=True)
class Decoding:
    """A request's decoding options: requests with equal ones share a batch (a hashable key)."""

    max_new_tokens: int = 16
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    num_beams: int = 1
    length_penalty: float = 1.0
    n: int = 1  # outputs a request gets: samples, or the n best of the beam
    seed: int | None = None

    def config(self, tokenizer: Tokenizer) -> GenerationConfig:
        eos = tokenizer.eos_id if tokenizer.has("eos") else None
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=self.do_sample,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            num_beams=self.num_beams,
            length_penalty=self.length_penalty,
            num_return_sequences=self.n,
            seed=self.seed,
            eos_token_id=() if eos is None else eos,
            pad_token_id=tokenizer.pad_id,
            decoder_start_token_id=tokenizer.bos_id if tokenizer.has("bos") else None,
        )


@dataclass(frozen=True)
class Output:
    """One request's outputs (n of them), how each ended, and the tokens it read and wrote."""

    texts: list[str]
    finish: list[str]
    prompt_tokens: int
    completion_tokens: int


def complete(served: Served, decoding: Decoding, prompts: list[list[int]]) -> list[Output]:
    """Continue each prompt (ids) with a decoder."""
    ids, mask = pad(prompts, served.tokenizer.pad_id)
    result = generate(served.model, ids, mask, decoding.config(served.tokenizer))
    return _outputs(served, decoding, result.new_tokens(), [len(p) for p in prompts])


def translate(served: Served, decoding: Decoding, sources: list[str]) -> list[Output]:
    """Translate each source text with an encoder-decoder; an empty text gives an empty one.

    A pointer-generator translates through `attnkit.inference.translate`, which
    writes its copied words back; its token counts are those of its output re-read.
    """
    tokenizer, config = served.tokenizer, decoding.config(served.tokenizer)
    todo = [i for i, s in enumerate(sources) if s.strip()]
    outputs = [Output([""] * decoding.n, ["stop"] * decoding.n, 0, 0) for _ in sources]
    if not todo:
        return outputs
    texts = [sources[i] for i in todo]
    sources_ids = [tokenizer.encode(t, add_eos=True) for t in texts]
    if served.model.config.copy_attention != "none" and decoding.n == 1:
        done = translate_texts(served.model, tokenizer, texts, config, batch_size=len(texts))
        new = [tokenizer.encode(t) for t in done]
    else:
        ids, mask = pad(sources_ids, tokenizer.pad_id)
        new = generate(served.model, ids, mask, config).new_tokens()
    lengths = [len(row) for row in sources_ids]
    for i, out in zip(todo, _outputs(served, decoding, new, lengths), strict=True):
        outputs[i] = out
    return outputs


def embed(served: Served, decoding: None, texts: list[list[int]]) -> list[list[float]]:
    """Unit-length mean-pooled sentence vectors of an encoder."""
    ids, mask = pad(texts, served.tokenizer.pad_id)
    return sentence_embeddings(served.model, ids, mask).tolist()


def stream_completion(
    served: Served, decoding: Decoding, prompt: list[int]
) -> Iterator[str | Output]:
    """The continuation of one prompt (a decoder's) or the translation of one source (an
    encoder-decoder's, its ids ending in </s>), piece by piece as its text grows, then its
    `Output`."""
    tokenizer, config = served.tokenizer, decoding.config(served.tokenizer)
    eos = config.eos_token_id
    pieces = TextPieces(tokenizer, set(eos) if isinstance(eos, tuple) else {eos})
    steps = stream(served.model, torch.tensor([prompt]), None, config)
    yield from pieces.feed(int(step[0]) for step in steps)
    finish = "stop" if pieces.stopped else "length"
    yield Output([tokenizer.decode(pieces.ids)], [finish], len(prompt), len(pieces.ids))


VIEW_TOKENS = 24  # the most tokens the attention viewer decodes after the text
VIEW_LIMIT = 64  # the most tokens a side of an attention view shows: weights grow as its square


@torch.no_grad()
def attention(served: Served, decoding: None, items: list[tuple[str, str | None]]) -> list[dict]:
    """For the viewer: for each (text, output) the output (given, or the model's greedy one of
    up to VIEW_TOKENS), their tokens (up to VIEW_LIMIT a side) and every attention weight, as
    `{kind: [layer][head][query][key]}` (kinds "encoder", "decoder", "cross", as the model has)."""
    return [_attention(served, text, output) for text, output in items]


@torch.no_grad()
def translation_attention(
    served: Served, decoding: None, pairs: list[tuple[str, str]]
) -> list[dict]:
    """The attention of each (source, translation) pair, the translation given as text."""
    tokenizer, limit = served.tokenizer, served.model.config.max_len - 1
    views = []
    for source, translation in pairs:
        src = tokenizer.encode(source, add_eos=True)[-min(limit, VIEW_LIMIT) :]
        tgt = [tokenizer.bos_id, *tokenizer.encode(translation)][: min(limit, VIEW_LIMIT)]
        out = served.model(torch.tensor([src]), torch.tensor([tgt]), need_weights=True)
        views.append(_view(served, out.attentions, tgt, src, translation))
    return views


def _attention(served: Served, text: str, output: str | None) -> dict:
    model, tokenizer = served.model, served.tokenizer
    config = Decoding(max_new_tokens=VIEW_TOKENS).config(tokenizer)
    limit = min(model.config.max_len - 1, VIEW_LIMIT)
    if served.shape == "encoder-decoder":
        if output is None:
            src = tokenizer.encode(text, add_eos=True)[-limit:]
            new = generate(model, torch.tensor([src]), config=config).new_tokens()[0]
            output = tokenizer.decode(new)
        return translation_attention(served, None, [(text, output)])[0]
    ids = (tokenizer.encode(text) or [tokenizer.bos_id])[-limit:]
    if served.shape == "encoder":
        new = []
    elif output is not None:
        new = tokenizer.encode(output)
    else:
        new = generate(model, torch.tensor([ids]), config=config).new_tokens()[0]
    ids = (ids + new)[:limit]
    out = model(torch.tensor([ids]), need_weights=True)
    return _view(served, out.attentions, ids, ids, tokenizer.decode(new))


def _view(served: Served, attentions: dict, queries: list[int], keys: list[int], text: str) -> dict:
    name = served.tokenizer.id_to_token
    weights = {
        kind: [
            [[[round(x, 4) for x in row] for row in head] for head in layer[0].tolist()]
            for layer in layers
        ]
        for kind, layers in attentions.items()
    }
    return {
        "text": text,
        "tokens": {"queries": [name(i) for i in queries], "keys": [name(i) for i in keys]},
        "attention": weights,
    }


def _outputs(
    served: Served, decoding: Decoding, new: list[list[int]], prompt_lengths: list[int]
) -> list[Output]:
    n, limit = decoding.n, decoding.max_new_tokens
    texts = served.tokenizer.decode_batch(new)
    return [
        Output(
            texts[i * n : (i + 1) * n],
            ["length" if len(t) >= limit else "stop" for t in new[i * n : (i + 1) * n]],
            length,
            sum(len(t) for t in new[i * n : (i + 1) * n]),
        )
        for i, length in enumerate(prompt_lengths)
    ]
