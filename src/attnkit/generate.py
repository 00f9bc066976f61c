"""Decoding: turning a model's next-token distribution into sequences.

    greedy:    y_t = argmax_v p(v | y_<t, x)
    sampling:  y_t ~ softmax(logits / temperature), restricted to the top-k
               tokens and to the smallest set whose probability reaches top_p
    beam:      keep the num_beams best prefixes by sum_t log p(y_t | y_<t, x);
               a finished hypothesis scores sum_t log p / length^length_penalty

Every strategy runs on the model's KV cache (`new_cache` + `decode_step`,
offered by `EncoderDecoder` and `DecoderOnly`), so each step costs one new
position. Parameter names and beam-search scoring follow Hugging Face
`generate`, so results can be compared token for token. Rows (and, in beam
search, whole sentences) leave the batch as soon as they are finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel

log = logging.getLogger(__name__)

# Added to a score to rule a candidate out while keeping arithmetic finite, as HF does.
_EXCLUDED = -1.0e9


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding options, named as in Hugging Face `generate`.

    max_new_tokens / min_new_tokens: bounds on the generated length (EOS
        is suppressed before min_new_tokens).
    do_sample: sample instead of taking the argmax; temperature, top_k
        (0: off), top_p (1: off) shape the distribution sampled from.
    repetition_penalty: divides positive (multiplies negative) scores of
        tokens already in the sequence; 1 is off.
    no_repeat_ngram_size: forbid repeating any n-gram of this size; 0 is off.
    num_beams, length_penalty, early_stopping (True, False or "never"),
        num_return_sequences: beam search as in HF.
    eos_token_id: one id or several; None decodes to max_new_tokens.
    pad_token_id: fills finished rows (default: the model's pad_id).
    decoder_start_token_id: first decoder input of an encoder-decoder (Marian uses its pad id).
    suppress_tokens: ids never generated; forced_eos_token_id: forced at the last step.
    seed: makes sampling reproducible.
    use_cache: False recomputes every position at every step (for comparison only).
    crop_context: a decoder-only model that greedy-decodes or samples past its
        max_len goes on conditioned on the last max_len tokens (nanoGPT's crop);
        False stops it at max_len. Beam search and encoder-decoders always stop.
    """

    max_new_tokens: int = 20
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    eos_token_id: int | tuple[int, ...] | None = 2
    pad_token_id: int | None = None
    decoder_start_token_id: int = 1
    suppress_tokens: tuple[int, ...] = field(default_factory=tuple)
    forced_eos_token_id: int | None = None
    seed: int | None = None
    use_cache: bool = True
    crop_context: bool = True

    def __post_init__(self) -> None:
        checks = [
            (
                self.max_new_tokens >= 1,
                f"max_new_tokens must be at least 1, got {self.max_new_tokens}",
            ),
            (
                0 <= self.min_new_tokens <= self.max_new_tokens,
                f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}",
            ),
            (self.temperature > 0, f"temperature must be positive, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be 0 (off) or a positive integer, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (
                self.repetition_penalty > 0,
                f"repetition_penalty must be positive (1 is off), got {self.repetition_penalty}",
            ),
            (
                self.no_repeat_ngram_size >= 0,
                "no_repeat_ngram_size must be 0 (off) or positive, "
                f"got {self.no_repeat_ngram_size}",
            ),
            (self.num_beams >= 1, f"num_beams must be at least 1, got {self.num_beams}"),
            (
                self.early_stopping in (True, False, "never"),
                f"early_stopping must be True, False or 'never', got {self.early_stopping!r}",
            ),
            (
                not (self.do_sample and self.num_beams > 1),
                "sampling and beam search do not combine here; use do_sample or num_beams > 1",
            ),
            (
                self.num_return_sequences >= 1
                and (self.num_return_sequences <= self.num_beams or self.do_sample),
                f"num_return_sequences {self.num_return_sequences} needs num_beams at least as "
                "large, or do_sample",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise AttnkitError(message)
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        object.__setattr__(self, "suppress_tokens", tuple(self.suppress_tokens))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)


@dataclass
class GenerateOutput:
    """What `generate` returns.

    sequences: (batch * num_return_sequences, prefix + generated) ids, as HF
        returns them: the prefix is the decoder start token of an
        encoder-decoder or the (left-padded) prompt of a decoder-only model;
        after a row's EOS comes padding.
    sequences_scores: beam search's length-penalised score of each sequence.
    prefix_length: columns of `sequences` before the generated tokens.
    eos_token_ids: where `new_tokens` cuts each sequence.
    """

    sequences: Tensor
    sequences_scores: Tensor | None
    prefix_length: int
    eos_token_ids: tuple[int, ...]

    def new_tokens(self) -> list[list[int]]:
        """The generated ids of each sequence, up to (not including) its first EOS."""
        result = []
        for row in self.sequences[:, self.prefix_length :].tolist():
            cut = next((i for i, t in enumerate(row) if t in self.eos_token_ids), len(row))
            result.append(row[:cut])
        return result


def left_pad(ids: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Move each row's padding to its left, keeping token order, so every prompt ends last."""
    if mask is None:
        return ids, None
    order = torch.argsort(mask.int(), dim=1, stable=True)
    return ids.gather(1, order), mask.gather(1, order)


class _Cached:
    """Decoding on the model's KV cache: each step runs only the new positions."""

    def __init__(self, model, inputs, mask, prefix, prefix_mask, capacity: int) -> None:
        self.model = model
        self.cache = model.new_cache(inputs, mask, capacity)
        self.logits = model.decode_step(prefix, self.cache, prefix_mask)

    def step(self, ids: Tensor) -> Tensor:
        return self.model.decode_step(ids, self.cache)

    def reorder(self, index: Tensor, memory: bool) -> None:
        self.cache.reorder(index, memory)

    def repeat_rows(self, n: int) -> None:
        self.cache.repeat_rows(n)


class _Uncached:
    """Decoding without a cache: every step reruns the decoder over all positions."""

    def __init__(self, model, inputs, mask, prefix, prefix_mask, capacity: int) -> None:
        self.model = model
        self.encoder_decoder = model.config.shape == "encoder-decoder"
        self.memory, self.memory_mask = None, mask
        if self.encoder_decoder:
            self.memory = model.encode(inputs, mask)
        self.ids = prefix
        self.mask = (
            torch.ones_like(prefix, dtype=torch.bool) if prefix_mask is None else prefix_mask
        )
        self.logits = self._logits()

    def _logits(self) -> Tensor:
        if self.encoder_decoder:
            return self.model.decode(self.ids, self.memory, self.memory_mask, self.mask)[:, -1]
        return self.model(self.ids, self.mask).logits[:, -1]

    def step(self, ids: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, ids], dim=1)
        self.mask = torch.cat([self.mask, torch.ones_like(ids, dtype=torch.bool)], dim=1)
        return self._logits()

    def repeat_rows(self, n: int) -> None:
        self.reorder(torch.arange(len(self.ids), device=self.ids.device).repeat_interleave(n), True)

    def reorder(self, index: Tensor, memory: bool) -> None:
        self.ids, self.mask = self.ids.index_select(0, index), self.mask.index_select(0, index)
        if memory and self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, index)


def _start(
    model: TransformerModel,
    input_ids: Tensor,
    mask: Tensor | None,
    cfg: GenerationConfig,
    crop: bool = False,
):
    """Run the prefix; return (decoder state, prefix ids, prefix mask, max_new_tokens).

    With `crop` the caller slides the context past max_len, so max_new_tokens is not cut.
    """
    shape = model.config.shape
    if shape not in ("encoder-decoder", "decoder"):
        raise AttnkitError(f"a {shape} model cannot generate; use an encoder-decoder or decoder")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise AttnkitError(
            "input_ids must be a non-empty (batch, length) tensor, "
            f"got shape {tuple(input_ids.shape)}"
        )
    if mask is not None:
        mask = mask.bool()
        empty = (~mask.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise AttnkitError(
                f"input row {empty[0]} is all padding; give every row at least one token"
            )
    if shape == "encoder-decoder":
        prefix = torch.full(
            (input_ids.shape[0], 1), cfg.decoder_start_token_id, device=input_ids.device
        )
        prefix_mask = None
    else:
        prefix, prefix_mask = left_pad(input_ids, mask)
    max_len = model.config.max_len
    if prefix.shape[1] >= max_len:
        raise AttnkitError(
            f"the prompt has {prefix.shape[1]} tokens, which leaves no room under this model's "
            f"max_len {max_len}; shorten it"
        )
    max_new = cfg.max_new_tokens
    if prefix.shape[1] + max_new > max_len and not crop:
        max_new = max_len - prefix.shape[1]
        log.warning(
            "max_new_tokens %d does not fit max_len %d after a prefix of %d; generating at most %d",
            cfg.max_new_tokens,
            max_len,
            prefix.shape[1],
            max_new,
        )
    state = (_Cached if cfg.use_cache else _Uncached)(
        model, input_ids, mask, prefix, prefix_mask, min(prefix.shape[1] + max_new, max_len)
    )
    return state, prefix, prefix_mask, max_new


@contextlib.contextmanager
def _evaluating(model: TransformerModel) -> Iterator[None]:
    """Eval mode (no dropout) while decoding; the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _config(config: GenerationConfig | None, options: dict) -> GenerationConfig:
    config = config or GenerationConfig()
    unknown = set(options) - {f.name for f in dataclasses.fields(GenerationConfig)}
    if unknown:
        raise AttnkitError(f"generate has no option {sorted(unknown)[0]!r}; see GenerationConfig")
    return dataclasses.replace(config, **options) if options else config


def _process(
    scores: Tensor,
    seqs: Tensor | None,
    real: Tensor | None,
    step: int,
    max_new: int,
    cfg: GenerationConfig,
) -> Tensor:
    """HF's logits processors, on logits (greedy, sampling) or log-probabilities (beam search).

    `seqs` (rows, length) are the ids so far (prefix included) and `real` marks
    their real tokens; both are None when no processor reads them.
    """
    if cfg.repetition_penalty != 1.0:
        seen = scores.new_zeros(scores.shape).scatter_add_(1, seqs, real.to(scores.dtype)) > 0
        penalised = torch.where(
            scores < 0, scores * cfg.repetition_penalty, scores / cfg.repetition_penalty
        )
        scores = torch.where(seen, penalised, scores)
    n = cfg.no_repeat_ngram_size
    if n and seqs.shape[1] >= n:
        grams = seqs.unfold(1, n, 1)  # (rows, windows, n)
        follows = (grams[:, :, :-1] == seqs[:, seqs.shape[1] - n + 1 :][:, None]).all(-1)
        banned = scores.new_zeros(scores.shape).scatter_add_(1, grams[:, :, -1], follows.float())
        scores = scores.masked_fill(banned > 0, float("-inf"))
    if step < cfg.min_new_tokens and cfg.eos_ids:
        scores = scores.index_fill(
            1, torch.tensor(cfg.eos_ids, device=scores.device), float("-inf")
        )
    if cfg.suppress_tokens:
        index = torch.tensor(cfg.suppress_tokens, device=scores.device)
        scores = scores.index_fill(1, index, float("-inf"))
    if cfg.forced_eos_token_id is not None and step == max_new - 1:
        forced = torch.full_like(scores, float("-inf"))
        forced[:, cfg.forced_eos_token_id] = 0.0
        scores = forced
    return scores


def warp(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Logits of the sampling distribution: divided by temperature, cut to top-k and top-p.

    Top-p keeps the smallest set of most likely tokens whose probability
    reaches `top_p` (at least one token); the others get -inf.
    """
    if temperature != 1.0:
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # A token stays if the tokens ranked above it do not yet reach top_p.
        before = probs.cumsum(-1) - probs
        drop_sorted = before >= top_p
        drop = drop_sorted.scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _needs_history(cfg: GenerationConfig) -> bool:
    return cfg.repetition_penalty != 1.0 or cfg.no_repeat_ngram_size > 0


def _token_steps(
    model: TransformerModel, input_ids: Tensor, attention_mask: Tensor | None, cfg: GenerationConfig
) -> Iterator[Tensor]:
    """Greedy or sampled decoding; yields each step's ids (batch,), padding for finished rows."""
    if cfg.num_return_sequences > 1:
        input_ids = input_ids.repeat_interleave(cfg.num_return_sequences, 0)
        if attention_mask is not None:
            attention_mask = attention_mask.repeat_interleave(cfg.num_return_sequences, 0)
    crop = cfg.crop_context and model.config.shape == "decoder"
    state, prefix, prefix_mask, max_new = _start(model, input_ids, attention_mask, cfg, crop)
    pad = model.config.pad_id if cfg.pad_token_id is None else cfg.pad_token_id
    batch, start = prefix.shape
    device = prefix.device
    max_len = model.config.max_len
    crops = start + max_new > max_len
    history = _needs_history(cfg) or crops
    if history:
        seqs = torch.full((batch, start + max_new), pad, dtype=torch.long, device=device)
        seqs[:, :start] = prefix
        real = torch.ones_like(seqs, dtype=torch.bool)
        if prefix_mask is not None:
            real[:, :start] = prefix_mask
    eos = torch.tensor(cfg.eos_ids, dtype=torch.long, device=device)
    generator = None
    if cfg.do_sample and cfg.seed is not None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    active = torch.arange(batch, device=device)
    logits = state.logits
    for step in range(max_new):
        cur = start + step
        ctx = (seqs[active, :cur], real[active, :cur]) if history else (None, None)
        scores = _process(logits.float(), *ctx, step, max_new, cfg)
        if cfg.do_sample:
            probs = warp(scores, cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
            next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            next_ids = scores.argmax(-1)
        if history:
            seqs[active, cur] = next_ids
        out = torch.full((batch,), pad, dtype=torch.long, device=device)
        out[active] = next_ids
        yield out
        if step == max_new - 1:
            return
        finished = torch.isin(next_ids, eos)
        if bool(finished.any()):
            keep = (~finished).nonzero().flatten()
            if keep.numel() == 0:
                return
            active, next_ids = active[keep], next_ids[keep]
            state.reorder(keep, memory=True)
        if cur + 1 > max_len:
            # The cache is full: rerun the last max_len tokens, as nanoGPT does at every step.
            # Learned positions stop at max_len, so the cache cannot simply roll on.
            lo = cur + 1 - max_len
            ids, mask = seqs[active, lo : cur + 1], real[active, lo : cur + 1]
            state = type(state)(model, ids, mask, ids, mask, max_len)
            logits = state.logits
        else:
            logits = state.step(next_ids[:, None])


def stream(
    model: TransformerModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    **options,
) -> Iterator[Tensor]:
    """Greedy or sampled decoding as an iterator: yields (batch,) new ids per step.

    Finished rows yield padding; the iterator ends when every row is finished
    or after max_new_tokens steps. Options are those of `GenerationConfig`.
    """
    cfg = _config(config, options)
    if cfg.num_beams > 1:
        raise AttnkitError(
            "beam search cannot stream: its best hypothesis is known only at the end"
        )
    with _evaluating(model), torch.no_grad():
        yield from _token_steps(model, input_ids, attention_mask, cfg)


@torch.no_grad()
def beam_search(
    model: TransformerModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    **options,
) -> GenerateOutput:
    """Batched beam search with HF's candidate selection, scoring and stopping rules.

    `generate` calls it when num_beams > 1; called directly it also runs with one beam.
    """
    cfg = _config(config, options)
    with _evaluating(model):
        return _beam_search(model, input_ids, attention_mask, cfg)


def _beam_search(
    model: TransformerModel, input_ids: Tensor, attention_mask: Tensor | None, cfg: GenerationConfig
) -> GenerateOutput:
    state, prefix, prefix_mask, max_new = _start(model, input_ids, attention_mask, cfg)
    pad = model.config.pad_id if cfg.pad_token_id is None else cfg.pad_token_id
    n_sent, start = prefix.shape
    k, device = cfg.num_beams, prefix.device
    total = start + max_new
    n_keep = max(2, 1 + len(cfg.eos_ids)) * k
    top_k_mask = torch.arange(n_keep, device=device) < k
    eos = torch.tensor(cfg.eos_ids, dtype=torch.long, device=device)
    lp, early = cfg.length_penalty, cfg.early_stopping

    # Running beams of the sentences still searched; finished hypotheses of all sentences.
    run_seq = torch.full((n_sent, k, total), pad, dtype=torch.long, device=device)
    run_seq[:, :, :start] = prefix[:, None]
    run_score = torch.zeros(n_sent, k, device=device)
    run_score[:, 1:] = _EXCLUDED  # all beams start equal: only the first may expand at step 0
    fin_seq = run_seq.clone()
    fin_score = torch.full((n_sent, k), _EXCLUDED, device=device)
    fin_done = torch.zeros(n_sent, k, dtype=torch.bool, device=device)
    fin_len = torch.zeros(n_sent, k, dtype=torch.long, device=device)
    # Beams of a sentence share its prompt, so `real` (rows sentence * k + beam) never reorders.
    real = None
    if _needs_history(cfg):
        real = torch.ones(n_sent * k, total, dtype=torch.bool, device=device)
        if prefix_mask is not None:
            real[:, :start] = prefix_mask.repeat_interleave(k, 0)

    # The prefix ran once per sentence; its beams share it.
    logits = state.logits.repeat_interleave(k, 0)
    state.repeat_rows(k)
    active = torch.arange(n_sent, device=device)
    for step in range(max_new):
        cur, a = start + step, len(active)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        if real is not None:
            rows = (active[:, None] * k + torch.arange(k, device=device)).flatten()
            seqs = run_seq[active].flatten(0, 1)[:, :cur]
            log_probs = _process(log_probs, seqs, real[rows, :cur], step, max_new, cfg)
        else:
            log_probs = _process(log_probs, None, None, step, max_new, cfg)
        vocab = log_probs.shape[-1]
        scores = (log_probs.view(a, k, vocab) + run_score[active][:, :, None]).view(a, k * vocab)
        cand_score, cand = scores.topk(n_keep, dim=1)
        parent, token = cand // vocab, cand % vocab
        seq_a = run_seq[active]
        cand_seq = seq_a.gather(1, parent[:, :, None].expand(-1, -1, total))
        cand_seq[:, :, cur] = token
        hits = torch.isin(token, eos) | (cur + 1 >= total)

        # Beams that go on: the best k candidates that did not just finish.
        go_score = cand_score + hits.float() * _EXCLUDED
        go = go_score.topk(k, dim=1).indices
        new_run_seq = cand_seq.gather(1, go[:, :, None].expand(-1, -1, total))
        new_run_score = go_score.gather(1, go)
        new_parent = parent.gather(1, go)

        # Hypotheses that finish now: only among the best k candidates, length-penalised.
        just = hits & top_k_mask
        length = cur + 1 - start
        scored = cand_score / (length**lp) + (~just).float() * _EXCLUDED
        merged_score = torch.cat([fin_score[active], scored], dim=1)
        best = merged_score.topk(k, dim=1).indices
        fin_score[active] = merged_score.gather(1, best)
        merged_seq = torch.cat([fin_seq[active], cand_seq], dim=1)
        fin_seq[active] = merged_seq.gather(1, best[:, :, None].expand(-1, -1, total))
        fin_done[active] = torch.cat([fin_done[active], just], dim=1).gather(1, best)
        new_len = torch.full_like(cand, length)
        fin_len[active] = torch.cat([fin_len[active], new_len], dim=1).gather(1, best)
        run_seq[active], run_score[active] = new_run_seq, new_run_score

        # A sentence is done when no running beam can beat its worst finished hypothesis
        # (HF's heuristic), or, with early_stopping=True, once it has k of them.
        best_length = total - start if early == "never" and lp > 0 else cur + 1 - start
        best_running = new_run_score[:, :1] / (best_length**lp)
        done_a = fin_done[active]
        worst = torch.where(done_a, fin_score[active].min(1, keepdim=True).values, _EXCLUDED)
        open_ = (best_running > worst).any(-1) & ~(done_a.all(-1) & (early is True))
        if step == max_new - 1 or not bool(open_.any()) or bool(hits.all()):
            break
        keep = open_.nonzero().flatten()
        dropping = len(keep) < a
        rows = (keep[:, None] * k + new_parent[keep]).flatten()
        active = active[keep]
        state.reorder(rows, memory=dropping)
        logits = state.step(run_seq[active][:, :, cur].flatten()[:, None])

    n_ret = cfg.num_return_sequences
    length = start + int(fin_len[:, :n_ret].max())
    return GenerateOutput(
        fin_seq[:, :n_ret, :length].flatten(0, 1),
        fin_score[:, :n_ret].flatten(),
        start,
        cfg.eos_ids,
    )


@torch.no_grad()
def generate(
    model: TransformerModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    **options,
) -> GenerateOutput:
    """Decode from `input_ids` (batch, length): sources of an encoder-decoder, prompts of a decoder.

    `attention_mask` (batch, length) is True (or 1) for real tokens; prompts
    may be padded on either side. Options are the fields of
    `GenerationConfig` (HF names), given as keywords or as `config`: greedy by
    default, sampling with `do_sample=True`, beam search with `num_beams > 1`.
    """
    cfg = _config(config, options)
    if cfg.num_beams > 1:
        return beam_search(model, input_ids, attention_mask, cfg)
    steps = list(stream(model, input_ids, attention_mask, cfg))
    rows = input_ids.shape[0] * cfg.num_return_sequences
    prefix = _prefix_for_output(model, input_ids, attention_mask, cfg, rows)
    return GenerateOutput(
        torch.cat([prefix, torch.stack(steps, 1)], 1), None, prefix.shape[1], cfg.eos_ids
    )


def _prefix_for_output(model, input_ids, attention_mask, cfg, rows: int) -> Tensor:
    if model.config.shape == "encoder-decoder":
        return torch.full((rows, 1), cfg.decoder_start_token_id, device=input_ids.device)
    ids = left_pad(input_ids, attention_mask)[0]
    return ids.repeat_interleave(cfg.num_return_sequences, 0)
