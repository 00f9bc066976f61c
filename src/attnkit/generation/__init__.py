"""Decoding: turning a model's next-token distribution into sequences.

    config.py      GenerationConfig (HF's option names), GenerateOutput, `resolve`
    processors.py  repetition penalty, no-repeat n-grams, suppressed and forced ids, `warp`
    state.py       the decoding state on the KV cache (or without one), `prefill`, `left_pad`
    sampling.py    greedy and sampled decoding, streamed step by step (`stream`)
    beam.py        batched beam search (`beam_search`)
    decode.py      `generate`, which picks among them

Every strategy runs on the model's KV cache (`new_cache` + `decode_step`,
offered by `EncoderDecoder` and `DecoderOnly`), so each step costs one new
position. Rows (and, in beam search, whole sentences) leave the batch as soon
as they are finished.
"""

from attnkit.generation.beam import beam_search
from attnkit.generation.config import GenerateOutput, GenerationConfig
from attnkit.generation.decode import generate
from attnkit.generation.processors import warp
from attnkit.generation.sampling import stream
from attnkit.generation.state import left_pad

__all__ = [
    "GenerateOutput",
    "GenerationConfig",
    "beam_search",
    "generate",
    "left_pad",
    "stream",
    "warp",
]
