import pytest
import sacrebleu

from attnkit.train.rewards import SentenceReward

PAIRS = [
    ("a dog runs in the park .", "A dog runs in the park."),
    ("two children play", "Two children are playing in a park ."),
    ("the the the the", "The cat sleeps on the sofa."),
    ("", "A man rides a bike."),
    ("A man rides a bike.", "A man rides a bike."),
    ("Ein Hund läuft über die Wiese", "A dog runs across the meadow"),
]


@pytest.mark.parametrize("lowercase", [False, True])
def test_sentence_bleu_is_sacrebleus(lowercase):
    hypotheses, references = zip(*PAIRS, strict=True)
    rewards = SentenceReward("bleu", lowercase)(hypotheses, references)
    expected = [sacrebleu.sentence_bleu(h, [r], lowercase=lowercase).score for h, r in PAIRS]
    assert rewards.tolist() == pytest.approx([e / 100 for e in expected], abs=1e-12)
    assert float(rewards[4]) == pytest.approx(1.0) and float(rewards[3]) == 0.0
    assert (rewards[0] > rewards[1]) and (rewards[1] >= 0)


@pytest.mark.parametrize("lowercase", [False, True])
def test_sentence_chrf_is_sacrebleus(lowercase):
    hypotheses, references = zip(*PAIRS, strict=True)
    rewards = SentenceReward("chrf", lowercase)(hypotheses, references)
    metric = sacrebleu.CHRF(lowercase=lowercase)
    expected = [metric.sentence_score(h, [r]).score / 100 for h, r in PAIRS]
    plain = [sacrebleu.sentence_chrf(h, [r]).score / 100 for h, r in PAIRS]
    assert rewards.tolist() == pytest.approx(expected, abs=1e-12)
    if not lowercase:
        assert rewards.tolist() == pytest.approx(plain, abs=1e-12)
    assert float(rewards[4]) == pytest.approx(1.0)
