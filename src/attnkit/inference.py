"""Text in, text out: tokenize, decode on the batching engine, detokenize, keep the order.

    source line -> ids + </s> -> rows of one running batch (`attnkit.LLM`) -> ids -> text

Every source is a request of the one decoding engine (`generation/engine.py`), as
the server's are: greedy and sampled translations decode as rows of one running
batch (each joins when a place is free and leaves when it ends), beam searches as
jobs of sources of like length; `generation.ways.way` says which. A pointer-generator
(`ways.COPY`) decodes here, a batch of like lengths a `generate`. Results return in
the order of the input. Empty lines give empty outputs without running the model,
and inputs over the model's max_len are cut (counted, with a warning) or
refused. A pointer-generator reads the source's unknown words as ids of their
own and writes the ones it copies back as they were. Text that is not valid
UTF-8 is refused with its line, and pieces the tokenizer does not know
(characters outside a character vocabulary) are counted in one warning.

`translate_run` translates with a run folder loaded by `attnkit.run.load_run`,
its input prepared as the run's own (`attnkit.data.section.prepare_sources`:
lowercased, a G2P word spelled out), as `attnkit translate`, `attnkit eval`
and `attnkit serve` prepare it. `read_texts` and `write_lines` are the command
line's input and output: a file, or standard input and output.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from attnkit.checks import with_article
from attnkit.data import extended
from attnkit.data.batch import pad
from attnkit.data.section import prepare_sources
from attnkit.errors import AttnkitError
from attnkit.files import PathLike, atomic_write, check_utf8, decode_lines, read_lines
from attnkit.generation import LLM, GenerationConfig, generate
from attnkit.generation.config import resolve
from attnkit.generation.state import evaluating
from attnkit.generation.ways import COPY, way
from attnkit.models import TransformerModel
from attnkit.run import Run
from attnkit.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def read_texts(path: PathLike | None = None) -> list[str]:
    """The lines of the UTF-8 text file at `path`, or of standard input when None."""
    if path is not None:
        return list(read_lines(path))
    return list(decode_lines(sys.stdin.buffer, "standard input"))


def write_lines(lines: Sequence[str], path: PathLike | None = None) -> None:
    """Each of `lines` and a newline, to the file at `path` (its folder made) or to stdout.

    A file is written whole or not at all, a device or a pipe in place, a link's target
    replaced (`atomic_write`), and a full disk is one sentence.
    """
    text = "".join(f"{line}\n" for line in lines)
    if path is None:
        sys.stdout.write(text)
        return
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def encode_sources(
    tokenizer: Tokenizer, texts: Sequence[str], max_len: int, refuse_long: bool = False
) -> list[list[int]]:
    """Source ids ending in </s> (as in training), cut to `max_len` or refused when longer."""
    if not refuse_long:
        return _warn_unknown(
            tokenizer, tokenizer.encode_batch(texts, add_eos=True, max_length=max_len)
        )
    return _refuse_long(
        _warn_unknown(tokenizer, tokenizer.encode_batch(texts, add_eos=True)), max_len
    )


def _refuse_long(encoded: list[list[int]], max_len: int) -> list[list[int]]:
    for line, ids in enumerate(encoded, start=1):
        if len(ids) > max_len:
            raise AttnkitError(
                f"input line {line} has {len(ids)} tokens, over the model's max_len {max_len}; "
                "shorten it, or allow truncation"
            )
    return encoded


def _encode_copying(
    tokenizer: Tokenizer, texts: Sequence[str], max_len: int, refuse_long: bool
) -> tuple[list[list[int]], list[list[str]]]:
    """`encode_sources` for a pointer-generator: unknown words get extended ids (not warned
    of: the model can copy them), and each source's unknown words come back too."""
    ids, unknown = extended.encode_sources(tokenizer, texts, None if refuse_long else max_len)
    return (_refuse_long(ids, max_len) if refuse_long else ids), unknown


def _warn_unknown(tokenizer: Tokenizer, encoded: list[list[int]]) -> list[list[int]]:
    """`encoded`, after one warning that counts its <unk> ids, if it has any.

    A character vocabulary knows only the characters of its training text; any other
    becomes <unk>, and the model reads nothing of it.
    """
    if tokenizer.has("unk"):
        unk = tokenizer.unk_id
        count = sum(ids.count(unk) for ids in encoded)
        if count:
            log.warning(
                "%d tokens of the input became %s: the tokenizer's vocabulary lacks those "
                "characters",
                count,
                tokenizer.id_to_token(unk),
            )
    return encoded


class Hypothesis(NamedTuple):
    """One translation of an n-best list: its text and its score, beam search's
    length-penalised log-probability (None where greedy decoding gives no score)."""

    text: str
    score: float | None


def translate(
    model: TransformerModel,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    config: GenerationConfig | None = None,
    *,
    batch_size: int = 32,
    refuse_long: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """One output line per input line, in order; `progress(n)` is told of each n lines done."""
    best = translate_n_best(
        model, tokenizer, texts, 1, config,
        batch_size=batch_size, refuse_long=refuse_long, progress=progress,
    )  # fmt: skip
    return [hypotheses[0].text for hypotheses in best]


def translate_n_best(
    model: TransformerModel,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    n: int,
    config: GenerationConfig | None = None,
    *,
    batch_size: int = 32,
    refuse_long: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[list[Hypothesis]]:
    """The `n` best translations of each input line, best first, with their scores; beam
    search (`config.num_beams`) must keep at least `n` hypotheses. An empty line gets `n`
    empty translations; `progress(k)` is told of each k lines done."""
    if model.config.shape != "encoder-decoder":
        raise AttnkitError(
            f"translation needs an encoder-decoder model, but this one is "
            f"{with_article(model.config.shape)} model; use `attnkit generate` for a language model"
        )
    if batch_size < 1:
        raise AttnkitError(f"batch_size must be at least 1, got {batch_size}")
    for line, text in enumerate(texts, start=1):
        check_utf8(text, f"input line {line}")
    config = dataclasses.replace(
        resolve(config, {}, model.config, tokenizer),
        num_return_sequences=n,  # checked here: at most num_beams
    )
    outputs = [[Hypothesis("", None)] * n for _ in texts]
    todo = [i for i, text in enumerate(texts) if text.strip()]
    if progress is not None and len(todo) < len(texts):
        progress(len(texts) - len(todo))
    if not todo:
        return outputs
    sources = [texts[i] for i in todo]
    if way(model.config, config) == COPY:
        ids, unknown = _encode_copying(tokenizer, sources, model.config.max_len, refuse_long)
        done = _translate_copying(model, tokenizer, ids, unknown, config, batch_size, progress)
    else:
        ids = encode_sources(tokenizer, sources, model.config.max_len, refuse_long)
        done = _translate_on_engine(model, tokenizer, ids, sources, config, batch_size, progress)
    for j, hypotheses in enumerate(done):
        outputs[todo[j]] = hypotheses
    return outputs


def _translate_on_engine(
    model: TransformerModel,
    tokenizer: Tokenizer,
    ids: list[list[int]],
    sources: list[str],
    config: GenerationConfig,
    batch_size: int,
    progress: Callable[[int], None] | None,
) -> list[list[Hypothesis]]:
    """Each source's hypotheses from the batching engine (`attnkit.LLM`): greedy and sampled
    translations as rows of one running batch of `batch_size`, beam searches as jobs of
    `batch_size` sources of like length."""
    done = []
    with evaluating(model), LLM.of(model, tokenizer, max_batch=batch_size) as llm:
        for request in llm.submit_ids(ids, [config] * len(ids), sources, streamed=False):
            result = request.result()
            best = result.n_best or [(result.text, None)]
            done.append([Hypothesis(text, score) for text, score in best])
            if progress is not None:
                progress(1)
    return done


def _translate_copying(
    model: TransformerModel,
    tokenizer: Tokenizer,
    ids: list[list[int]],
    unknown: list[list[str]],
    config: GenerationConfig,
    batch_size: int,
    progress: Callable[[int], None] | None,
) -> list[list[Hypothesis]]:
    """A pointer-generator's translations (`ways.COPY`): one `generate` a batch of sources of
    like length, its copied words (ids past the vocabulary, which only their source can
    name) written back as they were."""
    n = config.num_return_sequences
    done: list[list[Hypothesis]] = [[] for _ in ids]
    order = sorted(range(len(ids)), key=lambda j: len(ids[j]), reverse=True)
    device = model.device
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src, src_mask = pad([ids[j] for j in chunk], tokenizer.pad_id)
        result = generate(model, src.to(device), src_mask.to(device), config)
        new = result.new_tokens()  # n rows a source, best first
        texts_out = extended.decode(tokenizer, new, [unknown[j] for j in chunk for _ in range(n)])
        scores = result.sequences_scores
        scores = [None] * len(new) if scores is None else scores.tolist()
        for k, j in enumerate(chunk):
            rows = range(k * n, (k + 1) * n)
            done[j] = [Hypothesis(texts_out[r], scores[r]) for r in rows]
        if progress is not None:
            progress(len(chunk))
    return done


def translate_run(
    run: Run,
    texts: Sequence[str],
    config: GenerationConfig | None = None,
    *,
    batch_size: int = 32,
    refuse_long: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """`translate` with the model and tokenizer of `run`, each text prepared as the run
    reads its sources (`prepare_sources`: lowercased, a G2P word spelled out)."""
    sources = prepare_sources(run.data, texts)
    return translate(
        run.model,
        run.tokenizer,
        sources,
        config,
        batch_size=batch_size,
        refuse_long=refuse_long,
        progress=progress,
    )


def complete(
    model: TransformerModel,
    tokenizer: Tokenizer,
    prompt: str,
    config: GenerationConfig | None = None,
) -> Iterator[str]:
    """Continue `prompt` with a language model: an iterator over the new text, piece by piece.

    The model and prompt are checked by the call itself, before any text is shown.
    A piece is yielded whenever the decoded text grows, so byte-level tokens
    that split a character appear once the character is complete.
    """
    (ids,) = _prompt_ids(model, tokenizer, [prompt])
    return _pieces(model, tokenizer, ids, config or GenerationConfig())


def complete_all(
    model: TransformerModel,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: GenerationConfig | None = None,
    *,
    batch_size: int = 32,
) -> list[str]:
    """The continuation of each prompt, in order: the prompts decoded together, rows of one
    running batch of `batch_size` (or jobs of like lengths: `ways.way`), as `complete`
    decodes one."""
    ids = _prompt_ids(model, tokenizer, prompts)
    config = config or GenerationConfig()
    with evaluating(model), LLM.of(model, tokenizer, max_batch=batch_size) as llm:
        requests = llm.submit_ids(ids, [config] * len(ids), list(prompts), streamed=False)
        return [request.result().text for request in requests]


def _prompt_ids(
    model: TransformerModel, tokenizer: Tokenizer, prompts: Sequence[str]
) -> list[list[int]]:
    """Each prompt's ids (the start token for an empty one), its last max_len - 1 kept."""
    if model.config.shape != "decoder":
        raise AttnkitError(
            f"text completion needs a decoder (language) model, but this one is "
            f"{with_article(model.config.shape)} model; use `attnkit translate` for translation"
        )
    name = "the prompt" if len(prompts) == 1 else "prompt {}"
    checked = [check_utf8(p, name.format(n)) for n, p in enumerate(prompts, start=1)]
    encoded = _warn_unknown(tokenizer, [tokenizer.encode(p) for p in checked])
    kept, out = model.config.max_len - 1, []
    for ids in encoded:
        ids = ids or [tokenizer.bos_id]
        if len(ids) > kept:
            log.warning("the prompt has %d tokens; keeping its last %d", len(ids), kept)
            ids = ids[-kept:]
        out.append(ids)
    return out


def _pieces(
    model: TransformerModel, tokenizer: Tokenizer, prompt_ids: list[int], config: GenerationConfig
) -> Iterator[str]:
    """The new text of `complete`, yielded as it grows: one request of the batching engine
    (its row of the running batch)."""
    with evaluating(model), LLM.of(model, tokenizer, max_batch=1) as llm:
        (request,) = llm.submit_ids([prompt_ids], [config])
        yield from request
