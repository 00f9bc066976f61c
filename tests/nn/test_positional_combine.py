"""Positions concatenated to the embeddings: [E x; PE] W_c, which with W_c = [I; I] is addition."""

import pytest
import torch

from attnkit import AttnkitError
from tests.helpers import padded_batch, tiny_config, tiny_model


def test_concat_projects_the_joined_vectors_back_to_d_model():
    model = tiny_model(positional_combine="concat").eval()
    embed = model.src_embed
    ids, _ = padded_batch([5, 5], 5, vocab_size=24)
    tokens = embed.token(ids)
    joined = torch.cat((tokens, embed.positions.table[:5].expand_as(tokens)), -1)
    torch.testing.assert_close(embed(ids), embed.combine.proj(joined))


def test_concat_with_two_identities_is_addition():
    added = tiny_model(seed=3).eval()
    joined = tiny_model(seed=3, positional_combine="concat").eval()
    joined.load_state_dict(added.state_dict(), strict=False)
    with torch.no_grad():
        for embed in (joined.src_embed, joined.tgt_embed):
            embed.combine.proj.weight.copy_(torch.cat((torch.eye(16), torch.eye(16)), 1))
            embed.combine.proj.bias.zero_()
    src, src_mask = padded_batch([6, 3], 6, vocab_size=24)
    tgt, tgt_mask = padded_batch([4, 2], 4, vocab_size=24)
    torch.testing.assert_close(
        joined(src, tgt, src_mask, tgt_mask).logits, added(src, tgt, src_mask, tgt_mask).logits
    )


def test_concat_needs_absolute_positions():
    with pytest.raises(AttnkitError, match="positional 'rope' has none"):
        tiny_config(positional="rope", positional_combine="concat")
