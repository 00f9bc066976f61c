import pytest
import torch

from attnkit.data.batch import Batch, pad
from attnkit.errors import AttnkitError
from attnkit.train.cross_entropy import IGNORE, linear_cross_entropy
from attnkit.train.objectives import (
    LanguageModelObjective,
    MaskedLMObjective,
    TranslationObjective,
)
from tests.helpers import VOCAB, tiny_model


def test_translation_loss_ignores_padding():
    """Padding a batch with an extra long sentence leaves the other rows' loss sums unchanged."""
    model = tiny_model().eval()
    objective = TranslationObjective(label_smoothing=0.1)
    src = [[5, 6, 7], [8, 9]]
    tgt = [[1, 10, 11, 2], [1, 12, 2]]
    alone = objective(model, Batch(*pad(src, 0), *pad(tgt, 0)))
    padded = Batch(*pad([*src, [5] * 9], 0), *pad([*tgt, [1, *[6] * 10, 2]], 0))
    with torch.no_grad():
        hidden, targets = objective.predict(model, padded)
        first_two = linear_cross_entropy(
            hidden[:2], model.head.weight, model.head.bias, targets[:2], 0.1
        )
    assert int(alone.tokens) == int(first_two.tokens) == 5
    torch.testing.assert_close(alone.loss, first_two.loss, rtol=1e-5, atol=1e-5)


def test_language_model_predicts_the_next_token():
    model = tiny_model("decoder").eval()
    tgt, mask = pad([[1, 5, 6, 7, 8], [1, 9, 10]], 0)
    hidden, targets = LanguageModelObjective().predict(model, Batch(tgt=tgt, tgt_mask=mask))
    assert hidden.shape[:2] == (2, 4)
    assert targets.tolist() == [[5, 6, 7, 8], [9, 10, IGNORE, IGNORE]]


def test_masked_lm_predicts_only_chosen_real_tokens():
    objective = MaskedLMObjective(mask_id=4, vocab_size=VOCAB, mask_prob=0.5)
    torch.manual_seed(0)
    ids = torch.randint(5, VOCAB, (64, 20))
    ids[:, 15:] = 0
    ids[:, 0] = 1
    inputs, targets = objective.corrupt(ids, ids != 0)
    chosen = targets != IGNORE
    assert not chosen[:, 15:].any() and not chosen[:, 0].any()
    assert 0.4 < chosen[:, 1:15].float().mean() < 0.6
    assert torch.equal(targets[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])
    masked = (inputs == 4)[chosen].float().mean()
    assert 0.72 < masked < 0.88
    model = tiny_model("encoder")
    terms = objective(model, Batch(src=ids[:, :15], src_mask=torch.ones(64, 15, dtype=torch.bool)))
    assert terms.loss.requires_grad and 0 < int(terms.tokens) < 64 * 14


def test_objective_refuses_a_batch_of_the_wrong_task():
    with pytest.raises(AttnkitError, match="needs `src`"):
        TranslationObjective()(tiny_model(), Batch(tgt=torch.ones(2, 3, dtype=torch.long)))
