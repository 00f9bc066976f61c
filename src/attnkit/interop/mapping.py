"""The mapping between an attnkit model and a Hugging Face checkpoint of one family.

A checkpoint is a dict of named tensors. A `Rule` ties one attnkit tensor to
the one or more tensors that hold it in the other layout, with the transform
each way:

    ours = join(theirs_1, ..., theirs_n)        (theirs_1, ..., theirs_n) = split(ours)

The kinds: `copy`; `transpose` (GPT-2's Conv1D stores W^T); `concat` (separate
Q, K, V projections into attnkit's fused one, along the output rows, or
LLaMA's gate and up projections into its gated `w_1`); `per-head` (BLOOM's
fused projection, whose rows run head by head, q k v within each head, into
attnkit's q, k, v blocks); `row`
(a (1, vocab) buffer into a (vocab,) bias); `fixed` (a table attnkit computes,
such as sinusoidal positions: checked on import, not written on export).

A `Family` is one model_type: its config translation both ways and its rules.
The expected shape of every tensor of the checkpoint is `split` applied to the
attnkit tensor, so a misshaped tensor is reported with both shapes.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel, build_model

log = logging.getLogger(__name__)

KINDS = ("copy", "transpose", "concat", "row", "fixed", "per-head")


@dataclass(frozen=True)
class Rule:
    """One attnkit tensor and the checkpoint tensors that hold it.

    `aliases` are other names under which some checkpoints store the same
    tensor a second time (a tied embedding saved under each of its names).
    `fallback` is a tensor read in place of the only one of `theirs` when a checkpoint
    lacks it (transformers 5 saves T5's lm_head only where it differs from `shared`).
    An `optional` tensor that a checkpoint lacks keeps attnkit's initial value.
    `sizes` are the rows of each part of a `concat` of unequal parts (the
    queries, keys and values of grouped-query attention); empty is equal parts.
    `heads` is the number of heads of a `per-head` fused projection.
    """

    ours: str
    theirs: tuple[str, ...]
    kind: str = "copy"
    aliases: tuple[str, ...] = ()
    fallback: str = ""
    optional: bool = False
    sizes: tuple[int, ...] = ()
    heads: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"rule kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def join(self, tensors: list[Tensor]) -> Tensor:
        if self.kind == "transpose":
            return tensors[0].t()
        if self.kind == "concat":
            return torch.cat(tensors, dim=0)
        if self.kind == "row":
            return tensors[0].reshape(-1)
        if self.kind == "per-head":
            return tensors[0].unflatten(0, (self.heads, 3, -1)).transpose(0, 1).flatten(0, 2)
        return tensors[0]

    def split(self, tensor: Tensor) -> list[Tensor]:
        if self.kind == "transpose":
            return [tensor.t()]
        if self.kind == "concat":
            parts = tensor.split(self.sizes) if self.sizes else tensor.chunk(len(self.theirs))
            return list(parts)
        if self.kind == "row":
            return [tensor[None]]
        if self.kind == "per-head":
            return [tensor.unflatten(0, (3, self.heads, -1)).transpose(0, 1).flatten(0, 2)]
        return [tensor]


def module(
    ours: str,
    theirs: str | tuple[str, ...],
    kind: str = "copy",
    *,
    bias: bool = True,
    sizes: tuple[int, ...] = (),
    heads: int = 0,
) -> list[Rule]:
    """Rules for a module's weight and, with `bias`, its bias (a Linear or a norm).

    A transposed Conv1D keeps its bias as it is; concatenated projections
    concatenate their biases too.
    """
    names = (theirs,) if isinstance(theirs, str) else theirs
    bias_kind = "copy" if kind == "transpose" else kind
    shape = {"sizes": sizes, "heads": heads}
    weight = Rule(f"{ours}.weight", tuple(f"{n}.weight" for n in names), kind, **shape)
    if not bias:
        return [weight]
    return [weight, Rule(f"{ours}.bias", tuple(f"{n}.bias" for n in names), bias_kind, **shape)]


def lm_head(config: ModelConfig, embedding: str) -> tuple[Rule, list[Rule]]:
    """A decoder's token embedding (checkpoint name `embedding`) and its output head.

    Tied, the head is the embedding, which checkpoints may store again as
    `lm_head.weight`; untied, the head has its own rule.
    """
    if config.tie_embeddings == "decoder":
        return Rule("embed.token.weight", (embedding,), aliases=("lm_head.weight",)), []
    return Rule("embed.token.weight", (embedding,)), [Rule("head.weight", ("lm_head.weight",))]


@dataclass(frozen=True)
class Family:
    """One Hugging Face model_type and how it maps onto attnkit.

    Canonical names are those of `architecture`, the class written on export.
    `prefix` is that family's base-model prefix (`transformer.`, `bert.`,
    `model.`): checkpoints of the base model omit it, checkpoints of a model
    with a head carry it, and `prefixed` says which of the two is canonical;
    names in `top_level` (a head's own tensors) never carry it. `derived` are
    patterns of buffers that attnkit recomputes (position ids, causal masks):
    they are not weights, so they are skipped rather than reported unused.
    `written_as` gives, for a model the family writes in another form that computes the
    same function, the config of that form (T5 writes an output layer tied to both
    embeddings as an `lm_head` of its own, a copy); None: every model as it is.
    """

    model_type: str
    architecture: str
    shape: str
    prefix: str
    prefixed: bool
    top_level: frozenset[str]
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    config_to_hf: Callable[[ModelConfig], dict[str, Any]]
    rules: Callable[[ModelConfig], list[Rule]]
    derived: tuple[str, ...] = ()
    written_as: Callable[[ModelConfig], ModelConfig] | None = None

    def written(self, config: ModelConfig) -> ModelConfig:
        """The config of `config`'s model as a checkpoint of this family holds it."""
        return config if self.written_as is None else self.written_as(config)

    def canonical(self, name: str) -> str:
        # Checkpoints converted from TensorFlow call a norm's weight and bias gamma and beta.
        name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
        bare = name.removeprefix(self.prefix)
        if not self.prefixed or bare in self.top_level:
            return bare
        return self.prefix + bare

    def hf_config(self, config: ModelConfig) -> dict[str, Any]:
        """The config.json of `config`, refused when the family cannot express it.

        Translating there and back must give the config as written (`written`) again;
        every field that comes back different is one this family has no place for.
        """
        if config.shape != self.shape:
            raise AttnkitError(
                f"a {self.model_type} checkpoint holds a {self.shape} model, "
                f"but this model is {config.shape}"
            )
        config = self.written(config)
        hf = self.config_to_hf(config)
        back = self.config_from_hf(hf)
        differ = [
            f"{f.name} is {getattr(config, f.name)!r} but {self.model_type} "
            f"has {getattr(back, f.name)!r}"
            for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(back, f.name)
        ]
        if differ:
            raise AttnkitError(
                f"this model cannot be written as {self.model_type}: {'; '.join(differ)}; "
                f"only a model with {self.model_type}'s architecture can be exported"
            )
        return {"model_type": self.model_type, "architectures": [self.architecture], **hf}


def _as_written(model: TransformerModel, family: Family) -> TransformerModel:
    """`model`, or where the family writes it in another form (`Family.written`) the model of
    that form holding the same weights: a tied matrix is copied to each of its places."""
    config = family.written(model.config)
    if config == model.config:
        return model
    out = build_model(config).to(next(model.parameters()).dtype)
    out.load_state_dict(model.state_dict())
    return out


def _target(model: TransformerModel, name: str) -> Tensor:
    try:
        return model.get_parameter(name)
    except AttributeError:
        return model.get_buffer(name)


def _check_coverage(model: TransformerModel, rules: list[Rule], family: Family) -> None:
    """Every distinct parameter of the model has exactly one rule."""
    params = {name for name, _ in model.named_parameters()}
    covered = {r.ours for r in rules if r.kind != "fixed"}
    if params != covered:
        extra = sorted(params - covered) or sorted(covered - params)
        raise AttnkitError(
            f"the {family.model_type} layout has no place for the tensor {extra[0]!r} of this "
            "model; its config uses a feature the family does not have"
        )


def load_tensors(
    model: TransformerModel, family: Family, tensors: dict[str, Tensor], source: str
) -> list[str]:
    """Copy a checkpoint's tensors into `model`; return the checkpoint names left unused."""
    canonical: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        canonical.setdefault(family.canonical(name), tensor)
    rules = family.rules(model.config)
    _check_coverage(model, rules, family)
    used: set[str] = set()
    with torch.no_grad():
        for rule in rules:
            if rule.optional and not any(n in canonical for n in rule.theirs):
                continue
            target = _target(model, rule.ours)
            parts = [
                _find(canonical, name, rule, expected.shape, source, used)
                for name, expected in zip(rule.theirs, rule.split(target), strict=True)
            ]
            value = rule.join(parts).to(target.dtype)
            if rule.kind == "fixed":
                if not torch.allclose(value, target, atol=1e-5):
                    raise AttnkitError(
                        f"the tensor {rule.theirs[0]!r} in {source} does not match the table "
                        f"attnkit computes for {rule.ours!r}; the checkpoint's positional "
                        "encoding is not the one its config.json describes"
                    )
                continue
            target.copy_(value)
    patterns = [re.compile(p) for p in family.derived]
    derived = {n for n in canonical if any(p.fullmatch(n) for p in patterns)}
    if derived:
        log.debug("skipped %d buffers that attnkit recomputes: %s", len(derived), sorted(derived))
    return sorted(set(canonical) - used - derived)


def _find(
    tensors: dict[str, Tensor],
    name: str,
    rule: Rule,
    expected: torch.Size,
    source: str,
    used: set[str],
) -> Tensor:
    """The tensor `name` (or a tied alias of it), checked against its expected shape."""
    present = [n for n in (name, *rule.aliases) if n in tensors]
    if not present and rule.fallback in tensors:
        present = [rule.fallback]
    if not present:
        raise AttnkitError(
            f"{source} has no tensor {name!r} (expected shape {tuple(expected)}); "
            "the checkpoint does not hold the model its config.json describes"
        )
    tensor = tensors[present[0]]
    for other in present[1:]:
        if not torch.equal(tensors[other], tensor):
            raise AttnkitError(
                f"{source} holds {present[0]!r} and {other!r} as one tied tensor but their "
                "values differ; set tie_word_embeddings to false in its config.json"
            )
    if tuple(tensor.shape) != tuple(expected):
        raise AttnkitError(
            f"the tensor {present[0]!r} in {source} has shape {tuple(tensor.shape)} but the "
            f"config needs {tuple(expected)}; check that config.json belongs to these weights"
        )
    used.update(present)
    return tensor


def dump_tensors(model: TransformerModel, family: Family) -> dict[str, Tensor]:
    """The model's weights under the family's canonical names, each in its own storage."""
    model = _as_written(model, family)
    rules = family.rules(model.config)
    _check_coverage(model, rules, family)
    out: dict[str, Tensor] = {}
    for rule in rules:
        if rule.kind == "fixed":
            continue
        parts = rule.split(_target(model, rule.ours).detach())
        for name, part in zip(rule.theirs, parts, strict=True):
            # A fresh contiguous copy: safetensors refuses views that share storage.
            out[name] = part.to("cpu", copy=True).contiguous()
    return out
