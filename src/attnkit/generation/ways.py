"""How one request decodes: rows of the running batch, a job of the decoding thread, or a
pointer-generator's own path. The one decision that `attnkit.LLM`, the command line and the
server's `/v1/translate` share.

    ROWS  greedy or sampled tokens, each output a row of the batching engine
          (`batching.Scheduler`): it joins the running batch and leaves it when it ends
    JOB   one `generate` call on a group of requests, run between two steps of the same
          engine's thread: beam search (it ranks whole hypotheses, not a row's next token),
          several outputs of one request from one call (`num_return_sequences`), a static
          cache (its compiled step holds a fixed batch of rows; the engine's rows
          grow and shrink on the dynamic cache), `use_cache=False`, a monotonic window
    COPY  a pointer-generator: its copied words are ids past the vocabulary that only their
          own source can name, so it decodes through `attnkit.inference.translate`, which
          encodes each source's unknown words and writes them back

`cache_implementation="auto"` takes the static cache where it serves (a CUDA device:
`static_cache.chosen`), so a batch of prompts on a GPU decodes as a job on the compiled
step, the fast path by default; on a CPU it is the dynamic cache, and the rows. A request
streamed token by token (`streamed`) that would take a job only for the static cache decodes
as rows: a `generate` job's tokens are known only at its end.
"""

from __future__ import annotations

import torch

from attnkit.config import ModelConfig
from attnkit.generation import static_cache
from attnkit.generation.config import GenerationConfig

ROWS, JOB, COPY = "rows", "job", "copy"


def way(
    model: ModelConfig,
    config: GenerationConfig,
    device: torch.device | str,
    *,
    streamed: bool = False,
) -> str:
    """`ROWS`, `JOB` or `COPY`: how a request with these options decodes on this model."""
    if model.copy_attention != "none":
        return COPY
    if config.num_beams > 1 or config.num_return_sequences > 1:
        return JOB
    if not config.use_cache or config.monotonic_window is not None:
        return JOB
    if static_cache.chosen(config.cache_implementation, device) == "static" and not streamed:
        return JOB
    return ROWS
