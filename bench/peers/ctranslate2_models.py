"""CTranslate2 models of the decoding benchmark's twins, converted as its users convert them.

An attnkit model is written as a run folder, exported to the Hugging Face
format by `attnkit.interop.export_hf` (what `attnkit export hf` does), and that
folder goes through CTranslate2's own `TransformersConverter` with the
quantization asked (float32 or int8). The twins have random weights and no
tokenizer, so the converter is given a vocabulary of names `t0`, `t1`, ...
whose ids are the model's ids, and the special tokens at the ids the twins use.
(CTranslate2's Marian converter drops the last row of the embeddings, which
Hugging Face's Marian models append for `<pad>`; so an encoder-decoder's last
id is named `<pad>`, and the benchmark's sources avoid it.)
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import ctranslate2
from ctranslate2.converters import TransformersConverter

from attnkit.interop import export_hf
from attnkit.models import TransformerModel
from attnkit.run import save_pretrained


def token(i: int) -> str:
    return f"t{i}"


class _Vocabulary(SimpleNamespace):
    """What the converter asks of a tokenizer: the vocabulary and the special tokens."""

    def get_vocab(self) -> dict[str, int]:
        names = {token(i): i for i in range(self.size)}
        if self.pad_last:
            names["<pad>"] = names.pop(token(self.size - 1))
        return names


class _TwinConverter(TransformersConverter):
    def __init__(self, folder: Path, vocabulary: _Vocabulary) -> None:
        super().__init__(str(folder))
        self._vocabulary = vocabulary

    def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
        return self._vocabulary


def convert(model: TransformerModel, out: Path, quantization: str) -> Path:
    """`model` as a CTranslate2 model folder at `out`, weights in `quantization`."""
    c = model.config
    vocabulary = _Vocabulary(
        size=c.vocab_size,
        pad_last=c.shape == "encoder-decoder",
        bos_token=token(1),
        eos_token=token(c.eos_id if c.eos_id is not None else 2),
        unk_token=token(3),
    )
    with tempfile.TemporaryDirectory() as scratch:
        run, hf = Path(scratch) / "run", Path(scratch) / "hf"
        save_pretrained(model, run)
        export_hf(run, hf)
        _TwinConverter(hf, vocabulary).convert(str(out), quantization=quantization, force=True)
    return out


def generator(folder: Path, compute_type: str, threads: int) -> ctranslate2.Generator:
    return ctranslate2.Generator(
        str(folder), device="cpu", compute_type=compute_type, intra_threads=threads
    )


def translator(folder: Path, compute_type: str, threads: int) -> ctranslate2.Translator:
    return ctranslate2.Translator(
        str(folder), device="cpu", compute_type=compute_type, intra_threads=threads
    )


def weight_bytes(folder: Path) -> int:
    """The size of the converted weights (model.bin), which CTranslate2 holds resident."""
    return (folder / "model.bin").stat().st_size
