"""Export to ONNX: a run folder becomes a folder that ONNX Runtime decodes on its own.

    attnkit export onnx RUN OUT

    encoder-only      OUT/model.onnx
    decoder-only      OUT/decoder.onnx                  (one step; a past of length 0 is the prompt)
    encoder-decoder   OUT/encoder.onnx, OUT/decoder.onnx
    every shape       OUT/config.json (the model's `ModelConfig`), OUT/tokenizer.json

The graphs and their named inputs and outputs are `onnx_graphs.py`'s; batch,
sequence, past and source lengths are dynamic axes. The exporter is torch's
dynamo-based one (`torch.onnx.export(..., dynamo=True)`, which needs
onnxscript), at the opset it picks; each file is checked by `onnx.checker`.
`onnx_runtime.py` runs the folder.

Variants the graphs cannot carry are refused, one sentence each: a
pointer-generator's copy distribution, a mixture of experts' routing (its
experts take data-dependent numbers of tokens), local windows (the cache of
a step grows with the past and does not wrap round as `KVCache`'s ring does) and
location-aware or monotonic attention (the alignment each step carries to the next).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from attnkit.config import ModelConfig
from attnkit.cut_writes import is_partial
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write, replace_folder
from attnkit.generation.state import evaluating
from attnkit.interop.folder import tokenizer_file
from attnkit.interop.onnx_graphs import Graph, graphs
from attnkit.models import TransformerModel
from attnkit.nn.compute_type import compute_type_of
from attnkit.run import CONFIG_FILE, TOKENIZER_FILE, load_pretrained

log = logging.getLogger(__name__)

NOT_INSTALLED = "onnx is not installed: pip install 'attnkit[onnx]'"
# Every file an export may write: a folder holding only these may be replaced (--overwrite).
GRAPH_FILES = ("model.onnx", "encoder.onnx", "decoder.onnx")
EXPORTED = {*GRAPH_FILES, *(f"{name}.data" for name in GRAPH_FILES), CONFIG_FILE, TOKENIZER_FILE}
# A protobuf file holds at most 2 GiB; models whose weights come near it keep them beside
# the graph (`decoder.onnx.data`), smaller ones stay one file each.
EXTERNAL_DATA_BYTES = 2**30


def refusal(config: ModelConfig) -> str | None:
    """Why a model of `config` cannot be exported to ONNX, in one sentence; None if it can."""
    if config.copy_attention != "none":
        return (
            "copy_attention (a pointer-generator) is not exported to ONNX: its copy "
            "distribution over the source is not in the graphs; decode it with attnkit"
        )
    if config.n_experts:
        return (
            "n_experts (a mixture of experts) is not exported to ONNX: its experts take "
            "data-dependent numbers of tokens, which the graphs cannot fix; decode it with attnkit"
        )
    if config.attention_window:
        return (
            "attention_window (local attention) is not exported to ONNX: the graphs have no "
            "ring cache and no blockwise path; decode it with attnkit"
        )
    if config.attention_kind in ("location-aware", "monotonic"):
        return (
            f"attention_kind {config.attention_kind!r} is not exported to ONNX: its alignment, "
            "carried from step to step, is not among the graphs' inputs; decode it with attnkit"
        )
    return None


def save_onnx(
    model: TransformerModel,
    out_dir: str | Path,
    tokenizer: str | Path | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Write the ONNX graphs of `model`, its config.json and `tokenizer` into `out_dir`.

    A folder that is not empty is refused unless `overwrite`, and even then
    unless it holds only what an export writes.
    """
    model = getattr(model, "_orig_mod", model)
    if (reason := refusal(model.config)) is not None:
        raise AttnkitError(reason)
    _require_onnx()
    target = _new_folder(Path(out_dir), overwrite)
    if (kind := compute_type_of(model)) != "float32":
        raise AttnkitError(
            f"this model's linear layers are converted to {kind} for attnkit's decoding; "
            "export the float32 model to ONNX"
        )
    if model.device.type != "cpu":
        raise AttnkitError(f"the model is on {model.device}; export it from the CPU (model.cpu())")
    external = sum(p.numel() * p.element_size() for p in model.parameters()) > EXTERNAL_DATA_BYTES

    def write(stage: Path) -> None:
        for graph in graphs(model):
            _export(graph, stage / graph.file, external)
        atomic_write(stage / CONFIG_FILE, lambda p: p.write_text(model.config.to_json()))
        if tokenizer is not None:
            text = Path(tokenizer).read_bytes()
            atomic_write(stage / TOKENIZER_FILE, lambda p: p.write_bytes(text))

    with evaluating(model):  # no dropout in the graphs; the model's mode comes back after
        return replace_folder(target, write)


def export_onnx(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Turn an attnkit run folder into a folder of ONNX graphs (`save_onnx`)."""
    out = Path(out_dir)
    if Path(run_dir).resolve().is_relative_to(out.resolve()):
        raise AttnkitError(
            f"{out} holds {run_dir}, the folder the model is read from; write it elsewhere"
        )
    return save_onnx(load_pretrained(run_dir), out, tokenizer_file(run_dir), overwrite=overwrite)


def _export(graph: Graph, path: Path, external: bool) -> None:
    """Export `graph` to `path` and check the file."""
    import onnx

    graph.eval()  # the wrapper's own flag; `save_onnx` has put the model in eval mode
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            graph,
            graph.example(),
            dynamo=True,
            input_names=graph.input_names,
            output_names=graph.output_names,
            dynamic_shapes=graph.dynamic_shapes(),
            verbose=False,
        )
    program.save(str(path), external_data=external)
    onnx.checker.check_model(str(path), full_check=True)
    log.info("exported %s (opset %d)", path.name, program.model.opset_imports[""])


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's own chatter held back: the optimizer logs each rewrite at INFO, the
    registry warns that torchvision is absent (it exports no torchvision op here), and
    torch warns of axis names it merges and of its own deprecations."""
    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*axis name.*", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise AttnkitError(NOT_INSTALLED) from None


def _new_folder(path: Path, overwrite: bool) -> Path:
    """`path` as a folder to export into, refused where writing would destroy other work."""
    if path.exists() and not path.is_dir():
        raise AttnkitError(f"{path} is a file; give a folder to export the model into")
    entries = sorted(e.name for e in path.iterdir()) if path.is_dir() else []
    if entries and not overwrite:
        raise AttnkitError(
            f"{path} is not empty; choose a new folder, or pass --overwrite (overwrite=True) "
            "to replace an earlier export there"
        )
    foreign = [e for e in entries if e not in EXPORTED and not is_partial(path / e)]
    if foreign:
        raise AttnkitError(
            f"{path} holds {', '.join(foreign[:5])}, which an ONNX export does not write, so "
            "attnkit will not replace that folder, even with --overwrite; choose another folder"
        )
    return path
