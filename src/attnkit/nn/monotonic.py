"""The monotonic window: cross-attention kept near a focus that moves along the source.

Tachibana et al. (2017)'s forcibly incremental attention, widened to a window,
for monotonic tasks (grapheme to phoneme, transliteration): at each decoding
step every decoder layer may attend only to the source positions n with

    f - back <= n <= f + ahead,    then  f <- argmax_n mean_heads A^(last layer)_n

where f, the focus, starts at 0 (the first source token) and A is the last
layer's cross-attention of the step's last query, so f never moves back by
more than `back` a step. Positions are counted over real tokens, so a
left-padded source has its first token at 0 too. The window is fixed when a
step begins (`keys`), so a layer that runs twice in one step sees the same one.
A decode holds one window, beside its cache (`attnkit.models.decoding_state`),
and its rows follow the cache's when beams or finished rows reorder them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.errors import AttnkitError


class MonotonicWindow:
    """Each row's focus on its source and the source keys within `back` behind and `ahead`
    ahead of it.

    real: (batch, source length) True where the row's source has a real token.
    """

    def __init__(self, back: int, ahead: int, real: Tensor) -> None:
        if back < 0 or ahead < 1:
            raise AttnkitError(
                f"a monotonic window reaches back of its focus by zero or more positions and "
                f"ahead by one or more, got back {back} and ahead {ahead}"
            )
        self.back, self.ahead = back, ahead
        self.real = real
        self.position = real.long().cumsum(-1) - 1  # each slot's position over real tokens
        self.focus = torch.zeros(real.shape[0], dtype=torch.long, device=real.device)

    def keys(self) -> Tensor:
        """(batch, 1, 1, source length) True at the real source keys within each row's window."""
        focus = self.focus[:, None]
        near = (self.position >= focus - self.back) & (self.position <= focus + self.ahead)
        return (self.real & near)[:, None, None]

    def move(self, weights: Tensor) -> None:
        """Set each row's focus to the source position its last query attends to most,
        averaged over heads; `weights` (batch, heads, queries, source length) are zero
        outside the window, so the focus stays within it."""
        slot = weights[:, :, -1].mean(1).argmax(-1, keepdim=True)
        self.focus = self.position.gather(1, slot).squeeze(1)

    def reorder(self, index: Tensor) -> None:
        """Keep the rows `index`, in that order, as the cache's rows are kept."""
        self.real = self.real.index_select(0, index)
        self.position = self.position.index_select(0, index)
        self.focus = self.focus.index_select(0, index)
