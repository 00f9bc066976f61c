"""How one request decodes: rows of the running batch, a job of the decoding thread, or a
pointer-generator's own path. The one decision that `attnkit.LLM`, the command line and the
server's `/v1/translate` share.

    ROWS  greedy or sampled tokens, each output a row of the batching engine
          (`batching.Scheduler`): it joins the running batch and leaves it when it ends,
          on the cache `cache_implementation` takes (`auto`: the static one on a CUDA
          device, where the engine's rows decode on paged memory with a compiled step)
    JOB   a group of requests of one config decoded together between two steps of the same
          engine's thread: a beam search (it ranks whole hypotheses, not a row's next token;
          its n best with `num_return_sequences`), a few steps a job (`beam.sliced`), or the
          steps of `stream` for `use_cache=False` and a monotonic window (options of
          `generate` alone)
    COPY  a pointer-generator: its copied words are ids past the vocabulary that only their
          own source can name, so it decodes through `attnkit.inference.translate`, which
          encodes each source's unknown words and writes them back
"""

from __future__ import annotations

from attnkit.config import ModelConfig
from attnkit.generation.config import GenerationConfig

ROWS, JOB, COPY = "rows", "job", "copy"


def way(model: ModelConfig, config: GenerationConfig) -> str:
    """`ROWS`, `JOB` or `COPY`: how a request with these options decodes on this model."""
    if model.copy_attention != "none":
        return COPY
    if config.num_beams > 1 or config.num_return_sequences > 1:
        return JOB
    if not config.use_cache or config.monotonic_window is not None:
        return JOB
    return ROWS
