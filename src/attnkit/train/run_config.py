"""A training run's configuration (over 400 lines: the [train] section's many keys, each
documented and checked beside the other sections): one TOML file, one frozen dataclass a section.

    [model]  a preset and `ModelConfig` fields       [data]  task, corpus, tokenizer, batching
                                                     (`attnkit.data.section`)
    [train]  optimisation, precision, checkpoints    [eval]  validation, metrics, early stopping
                                                     (`attnkit.train.metrics`)
    [lora]   low-rank adapters, for fine-tuning a run given as `train.init_from`
    [adapters]  bottleneck adapters (Houlsby), for the same
    [scheduled_sampling]  mixing the decoder's own predictions into its inputs
    [sequence_loss]       training on a sentence reward (BLEU, chrF): self-critical, minimum risk
    [guided_attention]    a loss keeping cross-attention near the diagonal (monotonic tasks)
    [dpo]                 direct preference optimisation (`data.task = "preference"`)
    [segment_recurrence]  a language model read a segment at a time after a memory (Transformer-XL)
    [ppo]                 PPO against a reward model (`data.task = "ppo"`)
    [pairs]               preference pairs from sampled translations (`"sampled-pairs"`)
    [embedding]           sentence vectors: their pooling (`data.task = "sentence-embedding"`)
    [word2vec]            skip-gram or CBOW word vectors (`data.task = "word2vec"`)
    [glove]               GloVe word vectors (`data.task = "glove"`)
    [pretokenize]         words before tokens: a rule, jieba, phrases, stop words, stems

Every key has a default and a check. Values from the file and from
`--set section.key=value` overrides go through the same type check, and an
unknown key is refused with the nearest valid key named. A file must name its
`data.task` at least; the rules that span sections (the task's metric, model
shape and corpus, the run folder's path) are checked by `attnkit.train.validate`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from attnkit import recipes
from attnkit.checks import (
    check,
    choice,
    each,
    finite_fields,
    known,
    lookup,
    non_negative,
    positive,
    seed_value,
    within,
)
from attnkit.config import ModelConfig
from attnkit.data.section import TASKS, DataSection
from attnkit.devices import parse_device
from attnkit.embeddings.glove import GloveConfig
from attnkit.embeddings.word2vec import Word2VecConfig
from attnkit.errors import AttnkitError
from attnkit.files import read_lines
from attnkit.presets import PRESETS
from attnkit.pretokenize import PretokenizeConfig
from attnkit.train.activation_checkpointing import MODES as CHECKPOINTING
from attnkit.train.compilation import MODES as COMPILE_MODES
from attnkit.train.embedding_task import EmbeddingSection
from attnkit.train.fine_tuning import AdaptersSection, LoraSection
from attnkit.train.guided_attention import GuidedAttentionSection
from attnkit.train.loggers import LOGGERS
from attnkit.train.metrics import EvalSection
from attnkit.train.ppo import PPOSection
from attnkit.train.preference import DPOSection
from attnkit.train.sampled_pairs import PairsSection
from attnkit.train.scheduled_sampling import ScheduledSamplingSection
from attnkit.train.segment_recurrence import SegmentRecurrenceSection
from attnkit.train.sequence_level import SequenceLossSection
from attnkit.train.toml_values import apply_overrides, coerce, toml_value

SCHEDULES = ("inverse-sqrt", "cosine", "linear", "constant")
DECAY_OVER = ("steps", "minutes")
DECAYS = ("cosine", "linear")  # the schedules with an end
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
PARALLELS = ("ddp", "fsdp")  # how torchrun's ranks hold the model (`attnkit.train.parallel`)
REDUCE_PRECISIONS = ("fp32", "bf16")
COMPILE_SCOPES, CROSS_ENTROPIES = ("model", "block"), ("fused", "chunked")
# The ModelConfig fields that the tokenizer sets, which the [model] section may not.
TOKENIZER_SIZES = ("vocab_size", "src_vocab_size")


@dataclass(frozen=True)
class ModelSection:
    """A named preset (see `attnkit.presets`) with `ModelConfig` fields overriding it.

    `vocab_size` (and `src_vocab_size`) come from the tokenizer, so they are refused here:
    a size written in [model] would otherwise be replaced without a word.
    """

    preset: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.preset is not None:
            lookup("model.preset", self.preset, PRESETS)
        for name in TOKENIZER_SIZES:
            check(
                name not in self.overrides,
                f"model.{name} comes from the tokenizer, so the [model] section cannot set it; "
                "remove it (data.vocab_size is the size a new tokenizer is trained to)",
            )

    def build(self, **resolved: Any) -> ModelConfig:
        """The ModelConfig: preset, then the file's fields, then values the data dictates."""
        base = PRESETS[self.preset] if self.preset else {}
        return ModelConfig.from_dict({**base, **self.overrides, **resolved})


@dataclass(frozen=True)
class TrainSection:
    """Optimisation, precision and checkpoints.

    out_dir: the run folder the training writes (`attnkit.run`).
    seed: seeds the weights, the batches' order, dropout and sampling.
    steps: optimizer steps to train for (the time budget may end the run first).
    lr: the peak learning rate. With `inverse-sqrt` the rate is the paper's
        d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) scaled to peak at
        `lr`; the paper's own peak is (d_model · warmup)^-0.5.
    min_lr: where a `cosine` or `linear` decay ends.
    schedule: the rate after warmup: `inverse-sqrt` (the paper), `cosine` or `linear` decay
        to `min_lr`, or `constant`.
    warmup: steps over which the rate rises linearly from zero to `lr`.
    weight_decay: AdamW's decoupled weight decay, on weight matrices only (not on biases,
        norms or embeddings).
    beta1, beta2, eps: AdamW's moment decays and epsilon (the paper: 0.9, 0.98, 1e-9).
    clip_norm: the largest gradient norm; a larger one is scaled down to it (0 is off).
    label_smoothing: epsilon of label smoothing (the paper: 0.1).
    max_minutes: a wall-clock budget for this session's training; the run
        stops, saves and finishes (averaging, curves) when it is spent; 0 is none.
    decay_over: `steps` ends a cosine or linear decay at `steps`; `minutes`
        ends it when `max_minutes` run out (or at `steps`, if that comes
        first), at the pace measured so far, for runs bounded by time.
    accumulate: micro-batches per optimizer step (gradient accumulation).
    precision: `bf16` autocasts on CPU and CUDA; `fp16` (CUDA only) adds a
        gradient scaler; `auto` is bf16 where the CPU or GPU multiplies
        bfloat16 in hardware (AVX512-BF16, AMX), else fp32.
    compile: wrap the model in `torch.compile` (checkpoints stay plain).
    threads: torch threads for training, in every task (PPO and sampled pairs too); 0 leaves
        torch's default (one per core).
    log_every: steps between the training records of metrics.jsonl (and their log lines).
    save_every: steps between checkpoints (the last step always saves).
    keep_last, average_last: step checkpoints kept on disk; `average_last` of them are
        averaged into the final model (the paper averaged the last 5).
    parallel: under torchrun, `ddp` gives every rank the whole model; `fsdp` shards the
        weights, gradients and AdamW's state over the ranks (FSDP2, `attnkit.train.parallel`;
        in one process too, over a group of one), and checkpoints them sharded.
    rendezvous_timeout: under torchrun, the seconds every rank waits for the others to join
        before it stops, naming who is missing (torch's own wait is 30 minutes, in silence):
        a WORLD_SIZE larger than the ranks started, or a rank that never came.
    reduce_precision: the precision gradients are averaged across ranks in (`bf16`: half
        the traffic); under FSDP with `precision = "bf16"` the weights are gathered in bf16.
    activation_checkpointing: `block` keeps only each Block's input for backward and
        recomputes the rest, `selective` recomputes only the cheap ops between the matrix
        products (`attnkit.train.activation_checkpointing`); `none` keeps everything.
    reuse_freed_memory: on a CPU, let the C library keep freed memory for the
        next step instead of faulting large activations in afresh each time
        (`train/host_memory.py`; it applies to the whole process).
    init_from: a run folder whose model (config and weights) and tokenizer
        start this run, to fine-tune it; the [model] section is then not used.
    init_embeddings: word vectors (a word2vec or GloVe run folder, or a word2vec or GloVe
        file) that start the token embeddings of a new model, for the tokens
        that stand for a word they have (`attnkit.embeddings.pretrained`).
    decay_embeddings: weight decay on the token and position tables too, as nanoGPT decays
        every matrix (its tied embedding included); off, embeddings are exempt with biases
        and norms.
    compile_mode: torch.compile's mode; `auto` replays CUDA graphs (`reduce-overhead`) where
        every batch has one shape (a language model's blocks) on one GPU, which takes the
        launch of each kernel off the host, and is torch's `default` elsewhere.
    compile_scope: with `compile`, `model` compiles the whole model; `block` each Block in
        place (FSDP's units under `fsdp`, whose collectives then run between them).
    init_on_meta: build a new model's weights on `meta`, shard them, then draw each rank's
        slices on the device as a normal build does (`attnkit.train.meta_init`).
    cross_entropy, cross_entropy_chunks: the loss over the model's head: `fused`
        forms the gradient inside the loss; `chunked` runs that many chunks of positions
        through head and loss under autograd, recomputed in backward (no float32 logits).
    peak_tflops: the device's peak for the log's MFU; 0: the GPU's by name (`train.mfu`).
    device: `auto` (a CUDA GPU where there is one, else the CPU) or any torch device:
        `cpu`, `cuda`, `cuda:1`, `mps`, `xpu`, ...; one this machine lacks is refused.
    log_to, log_project, log_name: where metrics.jsonl's records, the curves and an
        attention picture also go
        (`attnkit.train.loggers`): `tensorboard`, `wandb` (offline unless WANDB_MODE says
        otherwise) as the run `log_name` (unset: the run folder's name) of `log_project`.
    """

    out_dir: str = "runs/run"
    init_from: str = ""
    init_embeddings: str = ""
    seed: int = 0
    steps: int = 1000
    max_minutes: float = 0.0
    lr: float = 1e-3
    min_lr: float = 0.0
    schedule: str = "inverse-sqrt"
    decay_over: str = "steps"
    warmup: int = 100
    weight_decay: float = 0.01
    decay_embeddings: bool = False
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    clip_norm: float = 1.0
    accumulate: int = 1
    label_smoothing: float = 0.1
    precision: str = "fp32"
    compile: bool = False
    compile_mode: str = "auto"
    compile_scope: str = "model"
    init_on_meta: bool = False
    cross_entropy: str = "fused"
    cross_entropy_chunks: int = 8
    peak_tflops: float = 0.0
    device: str = "auto"
    threads: int = 0
    parallel: str = "ddp"
    rendezvous_timeout: float = 300.0
    reduce_precision: str = "fp32"
    activation_checkpointing: str = "none"
    reuse_freed_memory: bool = True
    log_every: int = 10
    save_every: int = 500
    keep_last: int = 3
    average_last: int = 1
    log_to: tuple[str, ...] = ()
    log_project: str = "attnkit"
    log_name: str = ""

    def __post_init__(self) -> None:
        finite_fields(self, "train")
        choice("train.schedule", self.schedule, SCHEDULES)
        choice("train.decay_over", self.decay_over, DECAY_OVER)
        choice("train.precision", self.precision, PRECISIONS)
        if self.device != "auto":  # whether this machine has it is checked where it is used
            parse_device(self.device, "train.device")
        choice("train.compile_mode", self.compile_mode, COMPILE_MODES)
        choice("train.parallel", self.parallel, PARALLELS)
        choice("train.compile_scope", self.compile_scope, COMPILE_SCOPES)
        choice("train.cross_entropy", self.cross_entropy, CROSS_ENTROPIES)
        choice("train.reduce_precision", self.reduce_precision, REDUCE_PRECISIONS)
        choice("train.activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)
        each(positive, "train", self, "steps", "lr", "accumulate", "log_every", "save_every")
        each(positive, "train", self, "keep_last", "average_last", "beta1", "eps")
        positive("train.rendezvous_timeout", self.rendezvous_timeout)
        each(positive, "train", self, "cross_entropy_chunks")
        seed_value("train.seed", self.seed)
        each(non_negative, "train", self, "min_lr", "warmup", "weight_decay", "clip_norm")
        each(non_negative, "train", self, "threads", "max_minutes", "peak_tflops")
        known("sink", self.log_to, list(LOGGERS), owner="train.log_to")
        check(self.min_lr <= self.lr, "train.min_lr must not exceed train.lr")
        check(self.beta1 < 1 and 0 < self.beta2 < 1, "train.beta1 and train.beta2 must be < 1")
        within("train.label_smoothing", self.label_smoothing, "[0, 1)")
        check(
            self.parallel != "fsdp" or self.precision != "fp16",
            "train.precision 'fp16' needs a loss scaler, which FSDP's sharded gradients do not "
            "take; use 'bf16' with train.parallel 'fsdp'",
        )
        check(
            not self.init_on_meta or not (self.init_from or self.init_embeddings),
            "train.init_on_meta draws a new model's weights; with init_from or init_embeddings, "
            "set it to false",
        )
        check(
            self.schedule != "inverse-sqrt" or self.warmup > 0,
            "train.schedule 'inverse-sqrt' needs train.warmup > 0",
        )
        check(
            self.decay_over == "steps" or (self.max_minutes > 0 and self.schedule in DECAYS),
            "train.decay_over 'minutes' needs train.max_minutes > 0 and a schedule that ends "
            f"(one of {', '.join(DECAYS)}), not {self.schedule!r}",
        )
        check(
            self.average_last <= self.keep_last,
            f"train.average_last {self.average_last} needs at least as many kept checkpoints; "
            f"raise train.keep_last (now {self.keep_last})",
        )


SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "data": DataSection,
    "train": TrainSection,
    "eval": EvalSection,
    "lora": LoraSection,
    "adapters": AdaptersSection,
    "scheduled_sampling": ScheduledSamplingSection,
    "sequence_loss": SequenceLossSection,
    "guided_attention": GuidedAttentionSection,
    "dpo": DPOSection,
    "segment_recurrence": SegmentRecurrenceSection,
    "ppo": PPOSection,
    "pairs": PairsSection,
    "embedding": EmbeddingSection,
    "word2vec": Word2VecConfig,
    "glove": GloveConfig,
    "pretokenize": PretokenizeConfig,
}
# The sections of plain options; [model] is a preset plus `ModelConfig` fields.
OPTION_SECTIONS = tuple(name for name in SECTIONS if name != "model")


@dataclass(frozen=True)
class RunConfig:
    """One training run: a frozen section for each TOML table (`SECTIONS`), each key with a
    default and a check; read by `load` (a file and `--set` overrides), written back by
    `to_toml` into the run folder, so a run records what it was trained with.

    The rules that span sections (a task's model shape and metric, the run folder) are
    checked by `attnkit.train.validate`.
    """

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    lora: LoraSection = field(default_factory=LoraSection)
    adapters: AdaptersSection = field(default_factory=AdaptersSection)
    scheduled_sampling: ScheduledSamplingSection = field(default_factory=ScheduledSamplingSection)
    sequence_loss: SequenceLossSection = field(default_factory=SequenceLossSection)
    guided_attention: GuidedAttentionSection = field(default_factory=GuidedAttentionSection)
    dpo: DPOSection = field(default_factory=DPOSection)
    segment_recurrence: SegmentRecurrenceSection = field(default_factory=SegmentRecurrenceSection)
    ppo: PPOSection = field(default_factory=PPOSection)
    pairs: PairsSection = field(default_factory=PairsSection)
    embedding: EmbeddingSection = field(default_factory=EmbeddingSection)
    word2vec: Word2VecConfig = field(default_factory=Word2VecConfig)
    glove: GloveConfig = field(default_factory=GloveConfig)
    pretokenize: PretokenizeConfig = field(default_factory=PretokenizeConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The resolved config, every key explicit, as `from_dict` reads it back."""
        out = {name: dataclasses.asdict(getattr(self, name)) for name in OPTION_SECTIONS}
        model = {"preset": self.model.preset} if self.model.preset else {}
        return {"model": {**model, **self.model.overrides}, **out}

    def to_toml(self) -> str:
        lines: list[str] = []
        for section, values in self.to_dict().items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
            lines.append("")
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        for name, values in data.items():
            if name not in SECTIONS and not isinstance(values, dict):
                raise AttnkitError(_outside_sections(name))
            known("section", [name], list(SECTIONS))
            check(isinstance(values, dict), f"[{name}] must be a table of keys, got {values!r}")
        model = dict(data.get("model", {}))
        preset = model.pop("preset", None)
        check(
            preset is None or isinstance(preset, str),
            f"model.preset must be a string, got {preset!r}",
        )
        model_types = typing.get_type_hints(ModelConfig)
        overrides = {
            key: coerce(f"model.{key}", value, _hint("model", key, model_types, ["preset"]))
            for key, value in model.items()
        }
        sections = {"model": ModelSection(preset, overrides)}
        for name in OPTION_SECTIONS:
            cls_ = SECTIONS[name]
            hints = typing.get_type_hints(cls_)
            values = data.get(name, {})
            sections[name] = cls_(
                **{k: coerce(f"{name}.{k}", v, _hint(name, k, hints)) for k, v in values.items()}
            )
        return cls(**sections)

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
        """Read a TOML file, or the packaged recipe of that name, then apply `section.key=value`
        overrides.

        The file (or an override) must name `data.task`: the defaults alone describe no run.
        """
        path = recipes.resolve(path)
        try:
            # TOML is UTF-8; read_lines names the line of any byte that is not.
            data = tomllib.loads("".join(read_lines(path, keepends=True)))
        except tomllib.TOMLDecodeError as err:
            raise AttnkitError(f"{path} is not valid TOML: {err}") from None
        data = apply_overrides(data, overrides)
        config = cls.from_dict(data)
        if "task" not in data.get("data", {}):
            raise AttnkitError(
                f"{path} {'holds no settings' if not data else 'names no data.task'}; a run "
                f"config needs at least [data] task (one of {', '.join(TASKS)}) and, for a task "
                "that reads text, corpus (a known corpus or a path), as every recipe has "
                "(attnkit recipes)"
            )
        return config


def _outside_sections(key: str) -> str:
    """The sentence for a key written before the first [section] header: where it belongs."""
    model_keys = [
        "preset",
        *(k for k in typing.get_type_hints(ModelConfig) if k not in TOKENIZER_SIZES),
    ]
    keys = {"model": model_keys}
    keys.update({name: list(typing.get_type_hints(SECTIONS[name])) for name in OPTION_SECTIONS})
    owners = [f"[{name}]" for name, names in keys.items() if key in names]
    where = " or ".join(owners) or "the section it belongs to, one of " + ", ".join(
        f"[{name}]" for name in SECTIONS
    )
    return (
        f"the key {key!r} comes before any [section] header, but every key belongs to a "
        f"section; put it under {where}"
    )


def _hint(section: str, key: str, hints: dict[str, Any], extra: list[str] = ()) -> Any:
    known("key", [f"{section}.{key}"], [f"{section}.{k}" for k in [*extra, *hints]])
    return hints[key]
