"""What a step-by-step aligning cross-attention carries from one decoding step to the next.

Location-aware and monotonic attention (`alignment_attention.py`) make step i's
alignment from step i - 1's:

    alpha_i = Align(q_i, K, state_{i-1})

so a decode keeps, for each decoder layer, the state after its last step:
location-aware attention's alignment alpha_{i-1} (batch, heads, source),
monotonic attention's stop t_{i-1} of each head (batch, heads). It is a policy of
the decode, not keys or values, so it lives beside the KV cache in the decode's
state (`attnkit.models.decoding_state`), which hands it to every layer through
`AttentionInputs.alignment`; its rows follow the cache's rows (beams, finished
rows dropped).
"""

from __future__ import annotations

from torch import Tensor


class AlignmentState:
    """Each decoder layer's state after the last step, by layer index (the index of its
    `LayerKV`), (batch, ...); empty before the first step, when each layer starts from the
    beginning of the source."""

    def __init__(self) -> None:
        self.layers: dict[int, Tensor] = {}

    def get(self, layer: int) -> Tensor | None:
        """Layer `layer`'s state after the last step (None before the first)."""
        return self.layers.get(layer)

    def keep(self, layer: int, state: Tensor) -> None:
        """Keep `state` (batch, ...) for layer `layer`'s next step."""
        self.layers[layer] = state

    def reorder(self, index: Tensor) -> None:
        """Keep the rows `index`, in that order, as the KV cache keeps its rows."""
        self.layers = {layer: state.index_select(0, index) for layer, state in self.layers.items()}
