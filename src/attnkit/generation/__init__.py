"""Decoding: turning a model's next-token distribution into sequences. The one engine that
`generate`, `attnkit.LLM`, the command line and the server call.

    config.py      GenerationConfig (HF's option names), GenerateOutput, `resolve`
    processors.py  logit bias, penalties, no-repeat n-grams, suppressed and forced ids, `warp`
    state.py       the decoding state on the KV cache (or without one), `prefill`, `left_pad`
    sampling.py    greedy and sampled decoding, streamed step by step (`stream`)
    beam.py        batched beam search (`beam_search`), resumable a few steps a call (`BeamSearch`)
    decode.py      `generate`, which picks among them
    batching.py    iteration-level batching: rows join and leave the running batch every step
    rows.py        one output being decoded (a row) and the events it sends
    chooser.py     each row's next token, by its own GenerationConfig
    cache_rows.py  rows joining and leaving a running KV cache
    text.py        text as tokens come, cut at stop strings
    engine.py      `LLM`: a run loaded once, many prompts decoded together on `batching`
    requests.py    a prompt submitted to `LLM` (`Request`, its handle) and its `Completion`
    ways.py        how one request decodes: rows of the running batch, a job, a copy model's path

Every strategy runs on the model's KV cache (`new_cache` + `decode_step`,
offered by `EncoderDecoder` and `DecoderOnly`), so each step costs one new
position. Rows (and, in beam search, whole sentences) leave the batch as soon
as they are finished.
"""

from attnkit.generation.beam import beam_search
from attnkit.generation.config import GenerateOutput, GenerationConfig
from attnkit.generation.decode import generate
from attnkit.generation.engine import LLM
from attnkit.generation.processors import warp
from attnkit.generation.requests import Completion, Request
from attnkit.generation.sampling import stream
from attnkit.generation.state import left_pad

__all__ = [
    "LLM",
    "Completion",
    "GenerateOutput",
    "GenerationConfig",
    "Request",
    "beam_search",
    "generate",
    "left_pad",
    "stream",
    "warp",
]
