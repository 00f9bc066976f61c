"""A run folder, the one module that knows its files (over 400 lines: each named, read, written).

Everything about one model in one place:

    RUN_DIR/config.json                  the ModelConfig
    RUN_DIR/model.safetensors            the weights (a tied matrix stored once), whose
                                         metadata binds them to their tokenizer's fingerprint
    RUN_DIR/tokenizer.json               the tokenizer, when there is one
    RUN_DIR/tokenizer_fingerprint        the fingerprint the run started with, which every
                                         weights file it writes carries
    RUN_DIR/tokenizer.pretokenize.json   a Transformer run's [pretokenize] steps, applied
                                         before the tokenizer (`attnkit.pretokenize`)
    RUN_DIR/pretokenize.json             a word-vector run's [pretokenize] steps
    RUN_DIR/tokenizer_config.json        an imported tokenizer's settings: its chat template
    RUN_DIR/pooling.json                 how an encoder's sentence vectors are pooled
                                         (a learned mode's weights: in model.safetensors)
    RUN_DIR/run_config.toml              the run config it was trained from
    RUN_DIR/trainer_state.pt             what resuming needs (`attnkit.train.checkpoint`)
    RUN_DIR/metrics.jsonl                one JSON record per logged interval or evaluation
    RUN_DIR/curves.png                   those records drawn
    RUN_DIR/checkpoints/step-0000500/    the weights at each saved step
    RUN_DIR/checkpoints/step-0000500/sharded/  under FSDP, also the weights and the
                                         optimizer's state in one slice per rank
    RUN_DIR/checkpoints/best/            the weights with the best validation metric
    RUN_DIR/train.lock                   held by the training under way (`attnkit.train.lock`)
    RUN_DIR/adapters.safetensors         a model's adapters alone (`attnkit.nn.adapters`)
    RUN_DIR/value_head.safetensors       a PPO run's value head (`attnkit.train.ppo_task`)
    RUN_DIR/vectors.bin                  a word2vec run's vectors, in word2vec's binary format
    RUN_DIR/tensorboard/                 with `train.log_to`, TensorBoard's own files
    RUN_DIR/wandb/                       with `train.log_to`, Weights & Biases' own files

Every command accepts such a folder. Files are written to a temporary name
and renamed, so a crash mid-write never leaves a half-written file behind.
A model with LoRA layers is saved merged, as the plain model its config describes;
one with adapters keeps them, and writes them alone too (adapters.safetensors).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import zipfile
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file, save_model

from attnkit.config import ModelConfig
from attnkit.cut_writes import is_partial
from attnkit.data.section import DataSection
from attnkit.devices import check_device
from attnkit.errors import AttnkitError
from attnkit.files import WriteError, append_line, atomic_write
from attnkit.loading import overridden
from attnkit.models import TransformerModel, build_model
from attnkit.nn.adapters import adapter_state_dict
from attnkit.nn.compute_type import compute_type_of, convert
from attnkit.nn.lora import merged_copy
from attnkit.pooling import Pooling, SentenceEncoder, attach_pooling
from attnkit.tokenizer import TOKENIZER_FILE, Tokenizer, pretokenize_file
from attnkit.weights import check_finite as check_finite  # its old import path, from here
from attnkit.weights import load_weights
from attnkit.weights import read_weights as read_weights  # its old import path, from here

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ADAPTERS_FILE = "adapters.safetensors"  # a model's adapters alone (`attnkit.nn.adapters`)
# The weights' metadata key of the fingerprint of the vocabulary they were trained with: bound
# to the weights, so a tokenizer copied in from another run (with its fingerprint file) is seen.
FINGERPRINT_KEY = "attnkit.tokenizer_fingerprint"
SHARDS = "sharded"  # a step's sharded checkpoint (`attnkit.train.distributed_checkpoint`)
_STEP = "step-"

# The ids `generate` starts and stops on, for each model shape that generates, and the
# tokenizer role each one is.
_DECODING_ROLES = {
    "encoder-decoder": {"eos_id": "eos", "decoder_start_id": "bos"},
    "decoder": {"eos_id": "eos"},
    "encoder": {},
}


class RunFolder:
    """The paths of one run folder's files, and the reading and writing of the simple ones.

    Nothing is read or created until asked; `checkpoints/` is filled by
    `attnkit.train.checkpoint`, which takes its paths from here.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.config = self.root / CONFIG_FILE
        self.weights = self.root / WEIGHTS_FILE
        self.tokenizer = self.root / TOKENIZER_FILE
        self.fingerprint = self.root / "tokenizer_fingerprint"
        self.tokenizer_config = self.root / "tokenizer_config.json"  # Hugging Face's
        self.pooling = self.root / "pooling.json"
        self.run_config = self.root / "run_config.toml"
        self.trainer_state = self.root / "trainer_state.pt"
        self.metrics = self.root / "metrics.jsonl"
        self.curves = self.root / "curves.png"
        self.vectors = self.root / "vectors.bin"  # a word2vec or GloVe run's (word2vec binary)
        self.pretokenize = self.root / "pretokenize.json"  # a word-vector run's [pretokenize]
        self.tokenizer_pretokenize = pretokenize_file(self.tokenizer)  # a Transformer run's
        self.checkpoints = self.root / "checkpoints"
        self.best_weights = self.checkpoints / "best" / WEIGHTS_FILE
        self.lock = self.root / "train.lock"
        self.value_head = self.root / "value_head.safetensors"  # a PPO run's
        self.tensorboard, self.wandb = self.root / "tensorboard", self.root / "wandb"  # log_to

    @property
    def files(self) -> tuple[Path, ...]:
        """The files attnkit writes at the folder's top (beside `checkpoints/` and the lock)."""
        return (
            *(self.config, self.weights, self.tokenizer, self.fingerprint, self.run_config),
            *(self.trainer_state, self.metrics, self.curves, self.vectors, self.pretokenize),
            *(self.tokenizer_pretokenize, self.tokenizer_config, self.pooling, self.value_head),
        )

    def pair_files(self) -> tuple[Path, ...]:
        """The `{split}.jsonl` files a `sampled-pairs` run writes, by its run config's splits
        (none for a folder of any other run, or whose run config does not read)."""
        try:
            data = self.data_defaults()
        except AttnkitError:  # a damaged run config: it says so where it is read for use
            return ()
        if data.get("task") != "sampled-pairs":
            return ()
        splits = (data.get("train_split", "train"), data.get("valid_split", "val"))
        return tuple(self.root / f"{split}.jsonl" for split in splits)

    def inputs(self) -> list[tuple[str, Path]]:
        """Its files that a command using the run reads, each with its name for the user:
        what no output of that command may be written over (`check_writable`)."""
        return [(f"{path.name} of {self.root}", path) for path in self.files if path.is_file()]

    def owns(self, entry: Path) -> bool:
        """Whether `entry` of the folder is one attnkit writes there, or the leftover of a
        write it did not finish (`attnkit.cut_writes.is_partial`)."""
        mine = (*self.files, *self.pair_files(), self.checkpoints, self.lock)
        mine += (self.tensorboard, self.wandb)
        return entry.name in {p.name for p in mine} or is_partial(entry)

    def step_dir(self, step: int) -> Path:
        return self.checkpoints / f"{_STEP}{step:07d}"

    def step_weights(self, step: int) -> Path:
        return self.step_dir(step) / WEIGHTS_FILE

    def step_shards(self, step: int) -> Path:
        return self.step_dir(step) / SHARDS

    def saved_steps(self) -> list[int]:
        """Steps with saved weights, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        n = len(_STEP)
        return sorted(
            int(p.name[n:])
            for p in self.checkpoints.glob(f"{_STEP}*")
            if p.name[n:].isdigit() and (p / WEIGHTS_FILE).is_file()
        )

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records of metrics.jsonl, one dict per line (none if there is no file).

        A last line cut short (a kill or a full disk mid-append) is left out with a
        warning: the records before it are whole. A damaged line before the last is
        refused, naming it.
        """
        if not self.metrics.is_file():
            return []
        lines = self.metrics.read_text(encoding="utf-8", errors="replace").splitlines()
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                if number == len(lines):
                    log.warning("%s: its last line is cut short (%s); left out", self.metrics, err)
                    continue
                raise AttnkitError(
                    f"{self.metrics}, line {number} is not a JSON record ({err}); remove that "
                    "line or restore the file"
                ) from None
        return records

    def write_metrics(self, records: Iterable[dict[str, Any]] = ()) -> None:
        """Replace metrics.jsonl by `records` (none: an empty file)."""
        lines = "".join(json.dumps(r) + "\n" for r in records)
        atomic_write(self.metrics, lambda p: p.write_text(lines))

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Add one record as the last line of metrics.jsonl."""
        try:
            append_line(self.metrics, json.dumps(record) + "\n")
        except WriteError as err:
            steps = self.saved_steps()
            intact = self.intact(steps[-1] if steps else None)
            raise WriteError(err.path, err.reason, intact) from None

    def read_trainer_state(self) -> dict[str, Any]:
        """trainer_state.pt, read without running any pickled code (`weights_only`): a file
        holding Python objects, a damaged one (cut short, overwritten) or one that is not a
        trainer state is refused in one sentence that tells them apart."""
        path = self.trainer_state
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch's own message advises weights_only=False: never
            if zipfile.is_zipfile(path) and "Unsupported global" in str(err):
                raise AttnkitError(
                    f"{path} holds Python objects that attnkit will not unpickle, since "
                    "unpickling can run code; it is not a trainer state attnkit wrote"
                ) from None
            reason = (str(err).splitlines() or [type(err).__name__])[0]
            if "weights_only" in reason or "Weights only" in reason:
                reason = "not a file torch.save wrote"
            raise AttnkitError(
                f"{path} is damaged ({reason}): it cannot be read, so the run cannot resume "
                "from it; restore it from a copy, or start a new run"
            ) from None
        if not isinstance(state, dict) or ("step" not in state and "task" not in state):
            raise AttnkitError(f"{path} is not a trainer state attnkit wrote; remove it")
        return state

    def write_run_config(self, toml: str) -> None:
        atomic_write(self.run_config, lambda p: p.write_text(toml))

    def data_defaults(self) -> dict[str, Any]:
        """The keys of the [data] section of the run config it was trained from, as recorded
        ({} if there is none)."""
        if not self.run_config.is_file():
            return {}
        try:
            return tomllib.loads(self.run_config.read_text(encoding="utf-8-sig")).get("data", {})
        except tomllib.TOMLDecodeError as err:
            raise AttnkitError(
                f"{self.run_config} is not valid TOML ({err}); fix or remove it"
            ) from None

    def data_section(self) -> DataSection:
        """The [data] section it was trained with (`data_defaults`), each key it does not
        record at its default; a key no longer known is not the run's to keep."""
        names = {setting.name for setting in dataclasses.fields(DataSection)}
        return DataSection(**{k: v for k, v in self.data_defaults().items() if k in names})

    def load_tokenizer(self, check: bool = True, allow_rules: Collection[str] = ()) -> Tokenizer:
        """The run's tokenizer; a run folder without one is refused in one sentence.

        A pre-tokenization rule it names that is not attnkit's own is imported only if
        `allow_rules` names it (`Tokenizer.load`): loading a folder never runs its code unasked.

        With `check`, a tokenizer whose vocabulary is not the one the model was
        trained with (the fingerprint in its weights' metadata, `weights_metadata`)
        is refused: another model's tokenizer of the same size would run, and give
        wrong text. A run whose weights record none (saved before attnkit bound
        them) is checked against its tokenizer_fingerprint file if it has one, and
        says once that its tokenizer cannot be checked against its weights.
        """
        if not self.tokenizer.is_file():
            raise AttnkitError(
                f"{self.root} has no {TOKENIZER_FILE}; train the run with a tokenizer or copy "
                "one there"
            )
        tokenizer = Tokenizer.load(self.tokenizer, allow_rules)
        if not check:
            return tokenizer
        recorded = self.bound_fingerprint()
        if recorded is None:
            _warn_unbound(self)
            recorded = self.fingerprint.read_text().strip() if self.fingerprint.is_file() else None
        if recorded is not None and recorded != tokenizer.fingerprint:
            raise AttnkitError(
                f"{self.tokenizer} is not the tokenizer the model of {self.root} was made with "
                f"(its vocabulary's fingerprint is {tokenizer.fingerprint}, the run recorded "
                f"{recorded}); put the run's own {TOKENIZER_FILE} back, or, if you know the ids "
                "agree, pass --ignore-tokenizer-mismatch (check_tokenizer=False)"
            )
        return tokenizer

    def read_pooling(self) -> Pooling:
        """How the model's sentence vectors are pooled: pooling.json's, or mean, normalised."""
        if not self.pooling.is_file():
            return Pooling()
        return Pooling.from_json(self.pooling.read_text(), str(self.pooling))

    def write_pooling(self, pooling: Pooling) -> None:
        atomic_write(self.pooling, lambda p: p.write_text(pooling.to_json()))

    def record_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Record the fingerprint of the vocabulary the model is made with, which loading checks.

        Weights written into the folder from now on carry it (`weights_metadata`);
        weights already there that carry none are bound to it now.
        """
        atomic_write(self.fingerprint, lambda p: p.write_text(tokenizer.fingerprint + "\n"))
        if self.weights.is_file() and self.bound_fingerprint() is None:
            tensors = read_weights(self.weights)
            metadata = self.weights_metadata()
            atomic_write(self.weights, lambda p: save_file(tensors, str(p), metadata=metadata))

    def weights_metadata(self) -> dict[str, str]:
        """The metadata of every weights file attnkit writes into the folder: with the
        fingerprint the run recorded (`record_tokenizer`), which binds them to their tokenizer."""
        metadata = {"format": "pt"}
        if self.fingerprint.is_file():
            metadata[FINGERPRINT_KEY] = self.fingerprint.read_text().strip()
        return metadata

    def bound_fingerprint(self) -> str | None:
        """The fingerprint the weights were written with (None: none, or no readable weights,
        which loading them refuses in its own sentence)."""
        try:
            with safe_open(str(self.weights), "pt") as weights:
                return (weights.metadata() or {}).get(FINGERPRINT_KEY)
        except (SafetensorError, OSError):
            return None

    def intact(self, step: int | None) -> str:
        """What a failed write during training left whole: the checkpoint of `step` (or none)."""
        if step is None:
            return "no checkpoint had been saved yet; free some space and start again"
        return (
            f"the checkpoint of step {step} ({self.step_dir(step)}) is intact: free some space, "
            "then continue with --resume"
        )


_unbound_warned: set[Path] = set()  # the runs `_warn_unbound` has spoken of in this process


def _warn_unbound(folder: RunFolder) -> None:
    """Say once per run that its weights record no tokenizer fingerprint to check by."""
    root = folder.root.resolve()
    if root in _unbound_warned:
        return
    _unbound_warned.add(root)
    log.warning(
        "%s: its weights record no fingerprint of the tokenizer they were trained with (saved "
        "before attnkit bound one, or by save_pretrained alone), so a tokenizer copied in from "
        "another model would go unnoticed; once you know %s is this model's own, bind them with "
        "RunFolder(%r).record_tokenizer(Tokenizer.load(%r))",
        folder.root,
        folder.tokenizer,
        str(folder.root),
        str(folder.tokenizer),
    )


@dataclass(frozen=True)
class Run:
    """A run folder loaded for use: its model (in eval mode), its tokenizer, and the [data]
    section it was trained with, which says how its input is prepared
    (`attnkit.data.section.prepare_sources`)."""

    folder: RunFolder
    model: TransformerModel
    tokenizer: Tokenizer
    data: DataSection = field(default_factory=DataSection)

    @property
    def compute_type(self) -> str:
        """The type the model's linear layers compute in (`attnkit.nn.compute_type`)."""
        return compute_type_of(self.model)

    def sentence_encoder(self) -> SentenceEncoder:
        """Texts to sentence vectors with an encoder run's own pooling (`read_pooling`)."""
        return SentenceEncoder(self.model, self.tokenizer, self.folder.read_pooling())


def load_run(
    run_dir: str | Path,
    device: str | torch.device = "cpu",
    *,
    check_tokenizer: bool = True,
    overrides: dict[str, Any] | None = None,
    compute_type: str = "float32",
    allow_rules: Collection[str] = (),
) -> Run:
    """The model and tokenizer of a run folder, refusing a folder without either.

    check_tokenizer: refuse a tokenizer.json whose vocabulary is not the one the
        run recorded (`RunFolder.load_tokenizer`); False takes it as it is.
    overrides: model settings to change as it loads (`load_pretrained`).
    compute_type: float32, int8, bf16 or auto, for decoding (`load_pretrained`).
    allow_rules: pre-tokenization rules besides attnkit's own that the folder may name and
        that may be imported for it (`module:function`); none by default, as a folder from
        elsewhere must never run code unasked (`attnkit.pretokenize.rules`).
    """
    folder = RunFolder(run_dir)
    # Read once, and handed to `load_pretrained`, which may need its decoding ids.
    load = functools.partial(folder.load_tokenizer, check=check_tokenizer, allow_rules=allow_rules)
    tokenizer = load() if folder.tokenizer.is_file() else None
    model = load_pretrained(
        folder.root, device, tokenizer=tokenizer, overrides=overrides, compute_type=compute_type
    )
    tokenizer = tokenizer or load()
    return Run(folder, model, tokenizer, folder.data_section())


def save_pretrained(model: TransformerModel, run_dir: str | Path) -> Path:
    """Write config.json and model.safetensors into `run_dir`."""
    folder = RunFolder(run_dir)
    # torch.compile wraps the model; save what it wraps so no `_orig_mod.` prefix is stored.
    model = merged_copy(getattr(model, "_orig_mod", model))
    if (kind := compute_type_of(model)) != "float32":
        raise AttnkitError(f"a model converted to {kind} is for decoding; save the float32 model")
    atomic_write(folder.config, lambda p: p.write_text(model.config.to_json()))
    metadata = folder.weights_metadata()
    atomic_write(folder.weights, lambda p: save_model(model, str(p), metadata=metadata))
    if adapters := adapter_state_dict(model):
        # Also alone: what a fine-tuning with adapters adds to its base model.
        atomic_write(folder.root / ADAPTERS_FILE, lambda p: save_file(adapters, str(p)))
    return folder.root


def load_pretrained(
    run_dir: str | Path,
    device: str | torch.device = "cpu",
    *,
    tokenizer: Tokenizer | None = None,
    overrides: dict[str, Any] | None = None,
    compute_type: str = "float32",
) -> TransformerModel:
    """Rebuild the model of a run folder from its config and weights, in eval mode.

    A config without the decoding ids (saved before models recorded them) takes
    them from the folder's tokenizer, when it has one (`with_decoding_ids`):
    `tokenizer` when the caller has read it already, else the folder's file.
    `overrides` change what the weights do not fix (`LOADING_OVERRIDES`: the
    length, RoPE's scaling, the attention window), to evaluate a model trained
    short on longer text. `compute_type` (float32, int8, bf16, auto) converts the
    linear layers for decoding only (`attnkit.nn.compute_type.convert`).
    """
    device = check_device(device)
    folder = RunFolder(run_dir)
    for path in (folder.config, folder.weights):
        if not path.is_file():
            raise AttnkitError(
                f"{folder.root} is not an attnkit run folder: {path.name} is missing "
                "(train a model with `attnkit train` or import one with `attnkit import hf`)"
            )
    _refuse_hf_folder(folder)
    config = overridden(ModelConfig.from_json(folder.config), overrides or {}, folder.root)
    if _unset_decoding_ids(config) and (tokenizer is not None or folder.tokenizer.is_file()):
        # Runs saved before models recorded their decoding ids have them only in the tokenizer.
        ids_of = tokenizer or Tokenizer.load(folder.tokenizer, pretokenizer=False)
        filled = with_decoding_ids(config, ids_of)
        taken = {k: v for k, v in dataclasses.asdict(filled).items() if getattr(config, k) != v}
        if taken:
            ids = ", ".join(f"{name} {value}" for name, value in taken.items())
            log.info("%s: %s from its tokenizer (its config leaves them unset)", folder.root, ids)
        config = filled
    model = build_model(config)
    # A learned pooling's parameters (attention's query) are saved with the model's.
    attach_pooling(model, folder.read_pooling())
    load_weights(model, folder.weights, device)
    model = model.to(device).eval()
    chosen = convert(model, compute_type)
    if compute_type != "float32":
        log.info("%s: linear layers in %s (asked: %s)", folder.root, chosen, compute_type)
    return model


def _refuse_hf_folder(folder: RunFolder) -> None:
    """A Hugging Face model folder (its config.json names a `model_type`) is not a run folder:
    say so, and how to make one, rather than which of its keys ModelConfig lacks."""
    try:
        model_type = json.loads(folder.config.read_text(encoding="utf-8-sig")).get("model_type")
    except (ValueError, AttributeError):  # not JSON, or not an object: ModelConfig says so
        return
    if model_type is not None:
        raise AttnkitError(
            f"{folder.root} is a Hugging Face model folder ({model_type}), not an attnkit run "
            f"folder; import it first with `attnkit import hf {folder.root} RUN_DIR` and give "
            "RUN_DIR"
        )


def with_decoding_ids(config: ModelConfig, tokenizer: Tokenizer) -> ModelConfig:
    """`config` with the decoding ids it leaves unset taken from `tokenizer`.

    A model that generates stops on the tokenizer's EOS (`eos_id`) and an
    encoder-decoder's decoder starts on its BOS (`decoder_start_id`), so that
    `generate` starts and stops on them. Ids the config sets are kept, and an
    id the tokenizer has no token for stays unset.
    """
    ids = {
        name: getattr(tokenizer, f"{role}_id")
        for name, role in _unset_decoding_ids(config).items()
        if tokenizer.has(role)
    }
    return dataclasses.replace(config, **ids)


def _unset_decoding_ids(config: ModelConfig) -> dict[str, str]:
    """The decoding ids of `config`'s shape that it leaves unset, each with its tokenizer role.

    A pointer-generator also embeds the unknown words it copies as the tokenizer's <unk>.
    """
    roles = _DECODING_ROLES[config.shape]
    if config.copy_attention != "none":
        roles = {**roles, "unk_id": "unk"}
    return {name: role for name, role in roles.items() if getattr(config, name) is None}
