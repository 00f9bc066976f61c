"""An exported ONNX folder run by ONNX Runtime: the encoder's forward, greedy decoding, text.

    greedy:  y_t = argmax_v logits_t(v),  logits_t = decoder(y_{t-1} | past of y_<t)

`OnnxModel` opens what `onnx_export.py` wrote (config.json, tokenizer.json and
the graphs) and needs neither the run folder nor torch's model. Its loop is
attnkit's greedy loop (`generation/sampling.py`) on numpy arrays, so the two
give the same tokens: a decoder-only model's prompts are left-padded, so every
row's last token is the last position; an encoder-decoder's decoder starts on
its start id; a row leaves the batch once it emits EOS. The caller keeps the
cache: each step feeds the `present` keys and values back as the `past`.
Decoding stops at the model's max_len positions; attnkit's own loop can crop
the context of a decoder-only model and go on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attnkit.checks import with_article
from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.generation.config import GenerationConfig, resolve
from attnkit.interop.onnx_export import NOT_INSTALLED
from attnkit.interop.onnx_graphs import kv_names
from attnkit.run import CONFIG_FILE, TOKENIZER_FILE
from attnkit.tokenizer import Tokenizer

if TYPE_CHECKING:
    from onnxruntime import InferenceSession


class _Decoding:
    """A decoder graph's state between steps: the rows' other inputs and their past."""

    def __init__(
        self,
        session: InferenceSession,
        config: ModelConfig,
        past_names: list[str],
        inputs: dict[str, np.ndarray],
        first_ids: np.ndarray,
    ) -> None:
        self.session, self.past_names, self.inputs = session, past_names, inputs
        self.first_ids = first_ids  # the prompt, or the decoder start id
        shape = (len(first_ids), config.n_kv_heads, 0, config.d_head)  # an empty past
        self.past = [np.zeros(shape, np.float32) for _ in past_names]

    def run(self, ids: np.ndarray) -> np.ndarray:
        """Logits (rows, vocab) after the new `ids` (rows, n); the past grows by n."""
        feeds = {
            "input_ids": ids,
            **self.inputs,
            **dict(zip(self.past_names, self.past, strict=True)),
        }
        logits, *self.past = self.session.run(None, feeds)
        return logits

    def step(self, ids: np.ndarray) -> np.ndarray:
        """Logits after one new id (rows,) per row."""
        if "attention_mask" in self.inputs:  # a decoder-only model's mask covers the past
            mask = self.inputs["attention_mask"]
            self.inputs["attention_mask"] = np.pad(mask, ((0, 0), (0, 1)), constant_values=1)
        return self.run(ids[:, None])

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the rows `rows`, in that order."""
        self.inputs = {name: value[rows] for name, value in self.inputs.items()}
        self.past = [past[rows] for past in self.past]


class OnnxModel:
    """A folder of `attnkit export onnx` opened in ONNX Runtime with `threads` threads (0:
    ONNX Runtime's choice) on `providers`."""

    def __init__(
        self,
        folder: str | Path,
        threads: int = 0,
        providers: Sequence[str] = ("CPUExecutionProvider",),
    ) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise AttnkitError(NOT_INSTALLED) from None
        self.folder = Path(folder)
        if not (self.folder / CONFIG_FILE).is_file():
            raise AttnkitError(
                f"{self.folder} has no {CONFIG_FILE}; give a folder written by "
                "`attnkit export onnx`"
            )
        self.config = c = ModelConfig.from_json(self.folder / CONFIG_FILE)
        files = {"encoder": ["model"], "decoder": ["decoder"]}.get(c.shape, ["encoder", "decoder"])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.sessions = {}
        for name in files:
            path = self.folder / f"{name}.onnx"
            if not path.is_file():
                raise AttnkitError(
                    f"{self.folder} has no {path.name} for its {c.shape} model; export the run "
                    "again with `attnkit export onnx`"
                )
            self.sessions[name] = onnxruntime.InferenceSession(
                str(path), options, providers=list(providers)
            )
        tokenizer = self.folder / TOKENIZER_FILE
        self.tokenizer = Tokenizer.load(tokenizer) if tokenizer.is_file() else None

    def forward(
        self,
        input_ids: Sequence,
        attention_mask: Sequence | None = None,
        token_type_ids: Sequence | None = None,
    ) -> dict[str, np.ndarray]:
        """An encoder-only model's `logits` and `last_hidden_state` of ids (batch, length)."""
        if self.config.shape != "encoder":
            raise AttnkitError(
                f"forward runs an encoder-only model's graph; this is "
                f"{with_article(self.config.shape)} model, which decodes with `greedy`"
            )
        ids, mask = _ids_and_mask(input_ids, attention_mask, self.config.max_len)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.config.n_token_types:
            types = np.zeros_like(ids) if token_type_ids is None else token_type_ids
            feeds["token_type_ids"] = np.asarray(types, np.int64)
        session = self.sessions["model"]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, feeds), strict=True))

    def greedy(
        self,
        input_ids: Sequence,
        attention_mask: Sequence | None = None,
        *,
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        decoder_start_token_id: int | None = None,
    ) -> list[list[int]]:
        """The new ids of each row, up to (not including) its first EOS.

        `input_ids` (batch, length) are prompts of a decoder-only model, sources of an
        encoder-decoder, padded on either side as `attention_mask` (1 for real tokens)
        says. EOS and the start id default to the model's (`eos_id`, `decoder_start_id`);
        `eos_token_id=()` decodes `max_new_tokens` in every row.
        """
        c = self.config
        ids, mask = _ids_and_mask(input_ids, attention_mask, c.max_len)
        if c.shape not in ("decoder", "encoder-decoder"):
            raise AttnkitError("an encoder-only model does not decode; run it with `forward`")
        special = self._special(eos_token_id, decoder_start_token_id)
        eos = np.array(special.eos_ids, np.int64)
        if c.shape == "decoder":
            state = self._prompt(ids, mask)
        else:
            state = self._source(ids, mask, special.decoder_start_token_id)
        prefix = state.first_ids.shape[1]
        if prefix >= c.max_len:
            raise AttnkitError(
                f"the prompt has {prefix} tokens, which leaves no room under this model's "
                f"max_len {c.max_len}; shorten it"
            )
        steps = min(max_new_tokens, c.max_len - prefix)
        logits = state.run(state.first_ids)
        rows, active = [[] for _ in ids], np.arange(len(ids))
        for step in range(steps):
            next_ids = logits.argmax(-1)
            going = ~np.isin(next_ids, eos)
            for row, token in zip(active[going], next_ids[going], strict=True):
                rows[row].append(int(token))
            if step == steps - 1 or not going.any():
                break
            if not going.all():
                active, next_ids = active[going], next_ids[going]
                state.keep(np.flatnonzero(going))
            logits = state.step(next_ids)
        return rows

    def _prompt(self, ids: np.ndarray, mask: np.ndarray) -> _Decoding:
        """A decoder-only model's state over its prompts, left-padded."""
        c = self.config
        order = np.argsort(mask, axis=1, kind="stable")  # padding first, tokens in order
        ids, mask = np.take_along_axis(ids, order, 1), np.take_along_axis(mask, order, 1)
        names = kv_names("past_key_values", c.n_decoder_layers)
        return _Decoding(self.sessions["decoder"], c, names, {"attention_mask": mask}, ids)

    def _special(
        self,
        eos: int | Sequence[int] | None,
        start: int | None,
        tokenizer: Tokenizer | None = None,
    ) -> GenerationConfig:
        """The end and start ids given, the others resolved as every decoding resolves them
        (`generation.config.resolve`: the tokenizer's, when given, else the model's)."""
        if eos is not None:
            eos = tuple(int(i) for i in np.atleast_1d(np.asarray(eos, np.int64)))
        given = GenerationConfig(eos_token_id=eos, decoder_start_token_id=start)
        return resolve(given, {}, self.config, tokenizer)

    def _source(self, src: np.ndarray, mask: np.ndarray, start: int) -> _Decoding:
        """An encoder-decoder's state after encoding the sources once."""
        c = self.config
        _, *cross = self.sessions["encoder"].run(None, {"input_ids": src, "attention_mask": mask})
        names = kv_names("past_key_values", c.n_decoder_layers, "encoder")
        inputs = {"encoder_attention_mask": mask, **dict(zip(names, cross, strict=True))}
        past = kv_names("past_key_values", c.n_decoder_layers, "decoder")
        first = np.full((len(src), 1), start, np.int64)
        return _Decoding(self.sessions["decoder"], c, past, inputs, first)

    def complete(self, prompt: str, max_new_tokens: int) -> str:
        """The text a decoder-only model continues `prompt` with, as `attnkit generate
        --greedy` prints it after the prompt."""
        tokenizer = self._tokenizer()
        ids = tokenizer.encode(prompt) or [tokenizer.bos_id]
        ids = ids[-(self.config.max_len - 1) :]
        special = self._special(None, None, tokenizer)
        new = self.greedy([ids], max_new_tokens=max_new_tokens, eos_token_id=special.eos_ids)[0]
        return tokenizer.decode_continuation(ids, new)

    def translate(
        self, texts: Sequence[str], max_new_tokens: int, batch_size: int = 32
    ) -> list[str]:
        """An encoder-decoder's translation of each line, as `attnkit translate` (greedy)."""
        from attnkit.inference import encode_sources

        tokenizer = self._tokenizer()
        special = self._special(None, None, tokenizer)
        outputs = [""] * len(texts)
        todo = [i for i, text in enumerate(texts) if text.strip()]
        ids = encode_sources(tokenizer, [texts[i] for i in todo], self.config.max_len)
        for start in range(0, len(todo), batch_size):
            chunk = ids[start : start + batch_size]
            width = max(map(len, chunk))
            src = np.array([row + [tokenizer.pad_id] * (width - len(row)) for row in chunk])
            mask = np.array([[1] * len(row) + [0] * (width - len(row)) for row in chunk])
            new = self.greedy(
                src,
                mask,
                max_new_tokens=max_new_tokens,
                eos_token_id=special.eos_ids,
                decoder_start_token_id=special.decoder_start_token_id,
            )
            for i, text in zip(
                todo[start : start + batch_size], tokenizer.decode_batch(new), strict=True
            ):
                outputs[i] = text
        return outputs

    def _tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise AttnkitError(
                f"{self.folder} has no {TOKENIZER_FILE}, so it takes ids, not text; "
                "pass ids to `greedy`, or export a run folder that has a tokenizer"
            )
        return self.tokenizer


def _ids_and_mask(
    ids: Sequence, mask: Sequence | None, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """ids (batch, length) and their mask as int64 arrays; no mask: every token is real."""
    ids = np.asarray(ids, np.int64)
    if ids.ndim != 2 or ids.size == 0:
        raise AttnkitError(
            f"input_ids must be a non-empty (batch, length) array of ids, got shape {ids.shape}"
        )
    if ids.shape[1] > max_len:
        raise AttnkitError(
            f"input_ids has length {ids.shape[1]}, over max_len {max_len} of this model; "
            "truncate the input"
        )
    mask = np.ones_like(ids) if mask is None else np.asarray(mask).astype(np.int64)
    if mask.shape != ids.shape:
        raise AttnkitError(
            f"attention_mask has shape {mask.shape} but input_ids {ids.shape}; give one flag "
            "per token, 1 for real tokens"
        )
    return ids, mask
