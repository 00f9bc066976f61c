"""The runs a server serves: each loaded once, under a name, with what its requests need.

`served_runs(["runs/multi30k_de_en", "mt=runs/other"])` serves the first under its
folder's name and the second as `mt`. `Served.encode` turns request text into the
ids a model reads: every prompt, chat, input, source and attention text passes
through it, after `Server.texts` has taken it from the request. An encoder-decoder's
source is first prepared as the run's [data] section says (`Served.sources`, the
same `prepare_sources` as `attnkit translate` and `attnkit eval`: lowercased, a
G2P word spelled out).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.data.section import prepare_sources
from attnkit.devices import check_device
from attnkit.errors import AttnkitError
from attnkit.interop.hub_runs import run_folder
from attnkit.models import TransformerModel
from attnkit.pooling import SentenceEncoder
from attnkit.run import Run, load_run
from attnkit.serve.chat import ChatTemplate, read_template
from attnkit.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# --dtype: the type of every weight and activation (a GPU's bf16 or fp16 halves the memory
# and runs on its tensor cores); --compute-type is the CPU's other way, the linear layers only
DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, a part of batch keys
class Served:
    """A run folder being served under a name."""

    name: str
    run: Run
    chat_template: str | None = None  # the operator's (`--chat-template`), over the run's own

    @property
    def model(self) -> TransformerModel:
        return self.run.model

    @property
    def tokenizer(self) -> Tokenizer:
        return self.run.tokenizer

    @property
    def shape(self) -> str:
        return self.model.config.shape

    @property
    def max_len(self) -> int:
        return self.model.config.max_len

    @functools.cached_property
    def chat(self) -> ChatTemplate | None:
        """The model's chat template (its own, or the default); None for a model that cannot
        chat (an encoder, an encoder-decoder)."""
        if self.shape != "decoder":
            return None
        tokenizer = self.tokenizer

        def name(role: str) -> str:
            has = tokenizer.has(role)
            return tokenizer.id_to_token(getattr(tokenizer, f"{role}_id")) if has else ""

        source = self.chat_template
        if source is None:
            source = read_template(self.run.folder)
        return ChatTemplate(source, name("bos"), name("eos"))

    @functools.cached_property
    def longest_token(self) -> int:
        """The most characters one token of the vocabulary spells: a text of more than
        `limit x (longest + 1)` characters is over `limit` tokens, known before tokenizing."""
        vocab = self.tokenizer.backend.get_vocab(with_added_tokens=True)
        return max((len(token) for token in vocab), default=1)

    @functools.cached_property
    def encoder(self) -> SentenceEncoder:
        """Texts to sentence vectors, pooled as the run's own pooling says."""
        return self.run.sentence_encoder()

    def sources(self, texts: Sequence[str]) -> list[str]:
        """Source texts as the run read its own in training (`prepare_sources`)."""
        return prepare_sources(self.run.data, texts)

    def encode(self, texts: Sequence[str], truncate: bool = False) -> list[list[int]]:
        """The ids of request texts as the model reads them: a decoder's prompt as it is (an
        empty one as its start token), a source ending in </s>, an encoder's input as
        `<s> text </s>` (cut at its limit if `truncate`)."""
        tokenizer = self.tokenizer
        if self.shape == "encoder":
            return self.encoder.ids(texts, truncate)
        if self.shape == "encoder-decoder":
            return tokenizer.encode_batch(self.sources(texts), add_eos=True)
        return [row or [tokenizer.bos_id] for row in tokenizer.encode_batch(texts)]


def served_runs(
    specs: Sequence[str],
    compute_type: str = "float32",
    device: str | torch.device = "cpu",
    dtype: str = "float32",
    chat_template: str | None = None,
) -> list[Served]:
    """The runs of `specs`, loaded: each `RUN_DIR` under its folder's name, or `NAME=RUN_DIR`
    under NAME. A name given twice is refused. A RUN_DIR that is not a folder but is shaped
    like a Hub id (ORG/NAME) is that model, imported once into attnkit's cache (`run_folder`)
    and served as NAME.

    compute_type: the linear layers' type for decoding (float32, int8, bf16, auto).
    device: where every model is loaded and decodes (cpu, cuda, cuda:N, ...), checked first.
    dtype: the models' weights and activations (float32, bf16, fp16); with a compute type
        other than float32 it is refused, the two being two answers to one question.
    chat_template: a Jinja chat template for every decoder, over each run's own.

    What is served is checked here, once, so that an operator's mistake (a chat template
    that does not compile, a tokenizer_config.json that is not JSON) stops the start in one
    sentence rather than failing every request.
    """
    if dtype not in DTYPES:
        raise AttnkitError(f"--dtype is one of {', '.join(DTYPES)}, not {dtype!r}")
    if dtype != "float32" and compute_type != "float32":
        raise AttnkitError(
            f"--dtype {dtype} and --compute-type {compute_type} both choose the type the model "
            "computes in; give one of them"
        )
    device = check_device(device, "--device")
    named = [_name_and_path(spec) for spec in specs]
    names = [name for name, _ in named]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AttnkitError(f"two runs are named {twice[0]!r}; name them apart with NAME=RUN_DIR")
    served = []
    for name, path in named:
        folder = run_folder(path)  # a Hub id: its run, imported once into attnkit's cache
        run = load_run(folder, device, compute_type=compute_type)  # logs the type it chose
        if dtype != "float32":
            run.model.to(DTYPES[dtype])
            log.info("%s: weights and activations in %s on %s", name, dtype, device)
        one = Served(name, run, chat_template)
        if one.shape == "decoder":
            try:
                one.chat  # noqa: B018 -- compiled now: a broken template stops the start
            except AttnkitError as err:
                raise AttnkitError(f"model {name!r} cannot be served: {err}") from None
        served.append(one)
    return served


def _name_and_path(spec: str) -> tuple[str, str]:
    name, sep, path = spec.partition("=")
    if not sep or Path(spec).exists():  # a folder whose name holds "=" is a folder
        return Path(spec).resolve().name, spec
    if not _NAME.fullmatch(name):
        raise AttnkitError(
            f"{name!r} cannot name a model: use letters, digits and . _ : - (as in "
            f"mt=runs/multi30k_de_en)"
        )
    return name, path
