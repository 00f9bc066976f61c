"""`generate`: one call that decodes greedily, by sampling or by beam search, as the config says.

    greedy:    y_t = argmax_v p(v | y_<t, x)                       (the default)
    sampling:  y_t ~ warp(p(. | y_<t, x))                          (do_sample=True)
    beam:      the num_beams best prefixes by sum_t log p(y_t | y_<t, x)   (num_beams > 1)

Parameter names and beam-search scoring follow Hugging Face `generate`, so
results can be compared token for token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.generation.beam import beam_search
from attnkit.generation.config import GenerateOutput, GenerationConfig, on_ids, resolve
from attnkit.generation.sampling import stream
from attnkit.generation.state import prefix_of
from attnkit.models import TransformerModel


@torch.no_grad()
def generate(
    model: TransformerModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    **options,
) -> GenerateOutput:
    """Decode from `input_ids` (batch, length): sources of an encoder-decoder, prompts of a decoder.

    `attention_mask` (batch, length) is True (or 1) for real tokens; prompts
    may be padded on either side. Options are the fields of
    `GenerationConfig` (HF names), given as keywords or as `config`: greedy by
    default, sampling with `do_sample=True`, beam search with `num_beams > 1`.
    The special ids not given are the model's (`ModelConfig.eos_id`,
    `pad_id`, `decoder_start_id`).
    """
    cfg = on_ids(resolve(config, options, model.config))
    if cfg.num_beams > 1:
        return beam_search(model, input_ids, attention_mask, cfg)
    steps = list(stream(model, input_ids, attention_mask, cfg))
    prefix = prefix_of(model, input_ids, attention_mask, cfg)[0]
    prefix = prefix.repeat_interleave(cfg.num_return_sequences, 0)
    return GenerateOutput(
        torch.cat([prefix, torch.stack(steps, 1)], 1), None, prefix.shape[1], cfg.eos_ids
    )
