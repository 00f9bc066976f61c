"""What several test modules build: tiny models and run folders, padded batches, weight copies.

Each test keeps the model its numbers were checked on: one builder, `tiny_config`, with the
sizes a test module needs passed to it (`WIDE`, `DECODING`, or its own fields).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save, save_file
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.data import cmudict
from attnkit.data.batch import Batch, pad
from attnkit.data.corpora import CORPORA, corpus_files
from attnkit.interop import save_hf
from attnkit.models import TransformerModel, build_model
from attnkit.nn import LoRALinear, MultiHeadAttention, apply_lora
from attnkit.run import RunFolder, load_run, save_pretrained, with_decoding_ids
from attnkit.tokenizer import Tokenizer
from attnkit.train.run_config import TrainSection

ROOT = Path(__file__).parents[1]  # the repository's
VOCAB = 24

# The corpora. SAMPLES: a few hundred lines of Multi30k and a few speeches of Tiny Shakespeare,
# shipped with the tests as `<corpus>/<file>` (tests/samples/README.md: what, and whence).
# SHARED_DATA: where this project's machines keep the whole corpora, beside the repository.
SAMPLES = Path(__file__).parent / "samples"
SHARED_DATA = ROOT.parent / "shared" / "data"

# The browser the page tests drive (Debian's Chromium, through Playwright), and where they keep
# their screenshots (under $ATTNKIT_TEST_ARTIFACTS, else test-artifacts/, which git ignores).
CHROMIUM = "/usr/bin/chromium"
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking"]  # fmt: skip
ARTIFACTS = Path(
    os.environ.get("ATTNKIT_TEST_ARTIFACTS", Path(__file__).parents[1] / "test-artifacts")
)


def whole_corpora(folder: Path) -> Path:
    """A folder holding every file of the known corpora as `<corpus>/<file>`, each found as the
    library finds it (`attnkit.data.corpora.corpus_files`): in SHARED_DATA where that folder
    exists, then $ATTNKIT_DATA, then the cache, else downloaded into the cache. The folder they
    all lie in, or else `folder`, made of links to them."""
    given = SHARED_DATA if SHARED_DATA.is_dir() else None
    found = [
        path
        for corpus in CORPORA.values()
        if corpus.sha256  # a corpus of files, not one a Python package holds
        for split in corpus.splits[: 1 if not corpus.langs else None]  # one file, every split
        for path in corpus_files(corpus.name, split, langs=corpus.langs, data_dir=given)
    ]
    if len({path.parents[1] for path in found}) == 1:
        return found[0].parents[1]
    for path in found:
        link = folder / path.parent.name / path.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    return folder


# The text of the run folders `tiny_run` builds: German and English, for their tokenizer.
# The RLHF recipes, each reading the one before it: tested as a chain (test_rlhf_recipes.py).
RLHF_RECIPES = (
    "multi30k_de_en_pairs",
    "multi30k_de_en_reward_model",
    "multi30k_de_en_ppo",
    "multi30k_de_en_dpo",
)
RUN_LINES = ["ein hund läuft", "zwei kinder spielen im park", "a dog runs", "the cat sleeps"]

# Sentences that try a sentence encoder's tokenizer and length limit: short, long (over
# all-MiniLM-L6-v2's 256 tokens), German, Japanese, Russian, punctuation alone, accents, an emoji.
EDGE_SENTENCES = [
    "Hi",
    "A man is playing a guitar on the street.",
    "The quick brown fox jumps over the lazy dog. " * 40,
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "?!... -- ;;; ***",
    "café naïve résumé 😀",
]

# Two blocks per stack, d_model 32 in 4 heads: the model tests (parity with torch.nn.Transformer).
WIDE = {"layers": 2, "vocab_size": 50, "d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 64}
# The decoding tests' model: as wide, without dropout, so that cached and full forwards agree.
DECODING = {**WIDE, "vocab_size": 40, "max_len": 48, "dropout": 0.0, "embedding_dropout": 0.0}

# The later variants, each a path of its own through the blocks.
VARIANTS = {
    "paper": {},
    "rope": {"positional": "rope"},
    "alibi": {"positional": "alibi"},
    "xpos": {"positional": "xpos", "xpos_scale_base": 8.0},  # a short B: the decay shows
    "window": {"attention_window": 3},
    "sparse": {"attention_window": 2, "attention_stride": 3},
    "llama": {
        "norm": "rmsnorm",
        "activation": "swiglu",
        "bias": False,
        "positional": "rope",
        "n_kv_heads": 2,
        "norm_position": "pre",
    },
    "deepnorm-geglu": {"norm_position": "deepnorm", "activation": "geglu"},
}

STACKS = {
    "encoder-decoder": ("n_encoder_layers", "n_decoder_layers"),
    "decoder": ("n_decoder_layers",),
    "encoder": ("n_encoder_layers",),
}


WORDS = {"ein": "a", "hund": "dog", "katze": "cat", "rennt": "runs", "schläft": "sleeps"}
# The [model] section of the tiny runs that go through a run config.
TINY_MODEL = """
[model]
d_model = 16
n_heads = 2
d_ff = 32
n_encoder_layers = 1
n_decoder_layers = 1
max_len = 32
"""


def cut_safetensors_save(path: Path) -> Path:
    """What a safetensors save killed halfway leaves in its staging file `path` (`.tmpXXXXXX`):
    the first bytes of a safetensors file."""
    whole = save({"weight": torch.zeros(64)})
    path.write_bytes(whole[: len(whole) // 2])
    return path


def write_corpus(folder: Path, split: str, n: int, seed: int) -> None:
    """`n` German sentences of three words and their English, as `split`.de and .en."""
    rng = random.Random(seed)
    de, en = [], []
    for _ in range(n):
        words = ["ein", rng.choice(["hund", "katze"]), rng.choice(["rennt", "schläft"])]
        de.append(" ".join(words))
        en.append(" ".join(WORDS[w] for w in words))
    folder.mkdir(exist_ok=True)
    (folder / f"{split}.de").write_text("\n".join(de) + "\n")
    (folder / f"{split}.en").write_text("\n".join(en) + "\n")


def preference_rows(n: int, seed: int, alphabet: str) -> list[dict[str, str]]:
    """`n` preference pairs over `alphabet`: a prompt of 3 to 5 symbols, a chosen response
    that goes on through the alphabet from the prompt's last symbol (a rule a model can learn
    and generalise) and a random rejected one, both of 4 symbols."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt = "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 5)))
        start = alphabet.index(prompt[-1])
        chosen = "".join(alphabet[(start + k) % len(alphabet)] for k in range(1, 5))
        rejected = "".join(rng.choice(alphabet) for _ in range(4))
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def write_preference_pairs(folder: Path, alphabet: str, train: int = 48, val: int = 24) -> Path:
    """A preference corpus at `folder`: train.jsonl and val.jsonl of `preference_rows`."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", train, 0), ("val", val, 1)):
        lines = [json.dumps(row) for row in preference_rows(n, seed, alphabet)]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def translation_config(tmp_path: Path) -> str:
    """A run config of a tiny translation (the CLI's tests): 4 steps, BLEU on validation."""
    corpus = tmp_path / "corpus"
    write_corpus(corpus, "train", 60, 0)
    write_corpus(corpus, "val", 8, 1)
    path = tmp_path / "mt.toml"
    path.write_text(
        TINY_MODEL
        + f"""
[data]
task = "translation"
corpus = "{corpus}"
tokenizer = "char"
vocab_size = 100
max_tokens = 200

[train]
out_dir = "{tmp_path / "run"}"
steps = 4
save_every = 2
log_every = 2
threads = 1
average_last = 2

[eval]
every = 2
metric = "bleu"
decode_examples = 4
"""
    )
    return str(path)


def tiny_config(
    shape: str = "encoder-decoder", layers: int | None = None, **changes
) -> ModelConfig:
    """A model of `shape` with d_model 16 in 2 heads, `changes` overriding any field.

    `layers` blocks in each stack; by default two in all (one a stack in an encoder-decoder).
    A single stack ties its output to its embedding.
    """
    per_stack = layers or 2 // len(STACKS[shape])
    tie = {} if shape == "encoder-decoder" else {"tie_embeddings": "decoder"}
    base = {"shape": shape, "vocab_size": VOCAB, "d_model": 16, "n_heads": 2, "d_ff": 32}
    stacks = dict.fromkeys(STACKS[shape], per_stack)
    return ModelConfig.from_dict({**base, "max_len": 32, **tie, **stacks, **changes})


# Attention variants every KV cache must decode as the dynamic one does (`peaked(**variant)`).
ATTENTION_VARIANTS: dict[str, dict] = {
    "plain": {},
    "gqa": {"n_heads": 4, "n_kv_heads": 2},
    "rope": {"positional": "rope"},
    "alibi": {"positional": "alibi"},
    "learned": {"positional": "learned"},
}


def tiny_model(
    shape: str = "encoder-decoder", seed: int = 0, layers: int | None = None, **changes
) -> TransformerModel:
    """`build_model(tiny_config(...))` with its weights drawn from `seed`."""
    torch.manual_seed(seed)
    return build_model(tiny_config(shape, layers, **changes))


def padded_batch(
    lengths: list[int], width: int, vocab_size: int = DECODING["vocab_size"]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids of real tokens, right-padded with 0 to `width`, and the mask of real positions."""
    ids = torch.randint(5, vocab_size, (len(lengths), width))
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, 0), mask


def translation_batches(n: int, batch_size: int = 4, seed: int = 0) -> list[Batch]:
    """Random source sentences whose target is the source plus one (mod the real ids), padded."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        lengths = torch.randint(2, 7, (batch_size,), generator=g).tolist()
        srcs = [torch.randint(5, VOCAB, (k,), generator=g).tolist() for k in lengths]
        tgts = [[1, *[5 + (t - 4) % (VOCAB - 5) for t in s], 2] for s in srcs]
        src, src_mask = pad(srcs, 0)
        tgt, tgt_mask = pad(tgts, 0)
        batches.append(Batch(src, src_mask, tgt, tgt_mask))
    return batches


def global_batches(steps: int, rank: int = 0, world_size: int = 1) -> list[Batch]:
    """`steps` global batches of six sentence pairs, each in two halves of unequal token
    counts: whole for one process, half `rank` of each for one of two ranks."""
    halves = translation_batches(2 * steps, batch_size=3, seed=7)
    pairs = list(zip(halves[0::2], halves[1::2], strict=True))
    if world_size == 1:
        return [merge(a, b) for a, b in pairs]
    return [pair[rank] for pair in pairs]


def parallel_model(lora: bool = False) -> TransformerModel:
    """The data-parallel tests' model, without dropout (each rank would draw its own masks);
    with `lora`, LoRA of rank 2 on its linear layers, B made non-zero."""
    model = tiny_model(dropout=0.0, embedding_dropout=0.0, bias=False)
    if lora:
        apply_lora(model, rank=2, alpha=4.0)
        randomise_updates(model)
    return model


def parallel_settings(out_dir: Path, steps: int = 4, **changes) -> TrainSection:
    """The data-parallel tests' training: a constant rate, a record each step, a checkpoint
    every 2; `changes` replace any of these."""
    settings = dict(
        lr=3e-3,
        schedule="constant",
        warmup=0,
        weight_decay=0.1,
        label_smoothing=0.1,
        device="cpu",
        log_every=1,
        save_every=2,
    )
    return TrainSection(out_dir=str(out_dir), steps=steps, **(settings | changes))


def run_worker(args: list[str], out: Path, check: bool = True) -> subprocess.CompletedProcess:
    """`python ARGS OUT` from the repository root, outside any torchrun of the caller's, with
    one thread a process; with `check`, a failure shows the worker's output."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, *args, str(out)],
        env=env,
        cwd=ROOT,
        timeout=180,
        capture_output=True,
        text=True,
    )
    if check and done.returncode:
        raise AssertionError(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-6000:]}")
    return done


def merge(a: Batch, b: Batch) -> Batch:
    """One batch holding the rows of `a` then `b`, padded to the longer of each side."""

    def cat(x, y):
        width = max(x.shape[1], y.shape[1])
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (x, y)])

    return Batch(
        cat(a.src, b.src),
        cat(a.src_mask, b.src_mask),
        cat(a.tgt, b.tgt),
        cat(a.tgt_mask, b.tgt_mask),
    )


def copy_from_torch(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    """torch's attention weights into ours: the two must then compute the same function."""
    with torch.no_grad():
        d = ref.embed_dim
        if ours.cross:
            ours.q_proj.weight.copy_(ref.in_proj_weight[:d])
            ours.q_proj.bias.copy_(ref.in_proj_bias[:d])
            ours.kv_proj.weight.copy_(ref.in_proj_weight[d:])
            ours.kv_proj.bias.copy_(ref.in_proj_bias[d:])
        else:
            ours.qkv_proj.weight.copy_(ref.in_proj_weight)
            ours.qkv_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.load_state_dict(ref.out_proj.state_dict())


def randomise_updates(model: nn.Module) -> None:
    """B starts at zero; give it values so the update is not trivially nothing."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.normal_(std=0.1)


def peaked(
    shape: str, vocab_size: int = 40, scale: float = 4.0, seed: int = 1, **changes
) -> TransformerModel:
    """A random model whose next-token distributions are far from uniform, EOS included.

    Its config carries the special ids of an attnkit tokenizer (<s> 1, </s> 2), as a trained
    model's does, so decoding starts and stops on them; `changes` override any field.
    """
    model = tiny_model(
        shape,
        seed,
        layers=1,
        **{
            "vocab_size": vocab_size,
            "dropout": 0.0,
            "embedding_dropout": 0.0,
            "tie_embeddings": "none",
            "eos_id": 2,
            "decoder_start_id": 1,
            **changes,
        },
    ).eval()
    with torch.no_grad():
        model.head.weight.mul_(scale)
        model.head.weight[2].mul_(1.5)  # EOS within reach
    return model


def source_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Four sources (or prompts) of 7, 4, 2 and 5 tokens, right-padded to 7."""
    torch.manual_seed(1)
    return padded_batch([7, 4, 2, 5], 7)


def tiny_run(
    path: Path, shape: str, max_len: int = 40, kind: str = "char", **changes: object
) -> Path:
    """A run folder at `path`: a one-block-a-stack model of `shape` (`changes` to its config),
    a `kind` tokenizer (characters by default) of `RUN_LINES`.

    Its config records the tokenizer's decoding ids, as a trained run's does.
    """
    tokenizer = Tokenizer.train(kind, texts=RUN_LINES * 3)
    config = tiny_config(
        shape,
        1,
        vocab_size=tokenizer.vocab_size,
        max_len=max_len,
        dropout=0.0,
        embedding_dropout=0.0,
        **changes,
    )
    torch.manual_seed(0)
    model = build_model(with_decoding_ids(config, tokenizer))
    save_pretrained(model, path)
    tokenizer.save(RunFolder(path).tokenizer)
    return path


def served_models(tmp: Path) -> dict[str, SimpleNamespace]:
    """Tiny loaded runs as the batching engine serves them (a model and its tokenizer): a
    decoder, an encoder-decoder, and a decoder whose window of 4 keys makes its cache a ring."""
    out = {}
    for name, shape, changes in (
        ("decoder", "decoder", {}),
        ("encoder-decoder", "encoder-decoder", {}),
        ("window", "decoder", {"attention_window": 4}),
    ):
        run = load_run(tiny_run(tmp / name, shape, max_len=24, **changes))
        out[name] = SimpleNamespace(model=run.model, tokenizer=run.tokenizer)
    return out


def tiny_g2p_run(path: Path) -> Path:
    """A tiny untrained G2P run folder at `path`: a word tokenizer of cmudict's letters and
    phonemes, and the [data] section of a run trained on cmudict. Its weights (seed 1) give
    different words different outputs, and a word typed whole another output than its letters.
    """
    pairs = cmudict.pairs("val")
    tokenizer = Tokenizer.train("word", texts=[side for pair in pairs for side in pair])
    config = tiny_config(
        "encoder-decoder",
        1,
        vocab_size=tokenizer.vocab_size,
        max_len=32,
        dropout=0.0,
        embedding_dropout=0.0,
    )
    torch.manual_seed(1)
    save_pretrained(build_model(with_decoding_ids(config, tokenizer)), path)
    folder = RunFolder(path)
    tokenizer.save(folder.tokenizer)
    folder.write_run_config(
        '[data]\ncorpus = "cmudict"\nsrc_lang = "graphemes"\ntgt_lang = "phonemes"\n'
    )
    return path


def gpt2_folder(path: Path) -> Path:
    """A GPT-2 Hugging Face folder at `path` (written by attnkit's export) with a tokenizer."""
    tokenizer = Tokenizer.train("char", texts=RUN_LINES * 3)
    small = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_decoder_layers": 1, "max_len": 16}
    torch.manual_seed(0)
    model = build_model(
        ModelConfig.from_preset("gpt-tiny", vocab_size=tokenizer.vocab_size, **small)
    )
    tokenizer.save(save_hf(model, path))
    return path


def rewrite_weights(run: Path, change: Callable[[dict[str, Tensor]], None]) -> None:
    """Rewrite a run folder's model.safetensors after `change` edits its tensors in place."""
    tensors = load_file(run / "model.safetensors")
    change(tensors)
    save_file(tensors, str(run / "model.safetensors"))


def hashtags_apart(text: str) -> str:
    """A user's pre-tokenization rule, as `pretokenize.rule = "tests.helpers:hashtags_apart"`
    names it: "#NewYork" becomes "# NewYork"."""
    return text.replace("#", "# ")
