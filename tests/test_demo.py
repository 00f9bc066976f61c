"""The demo's claim, asserted: the same training code reaches >= 99% exact match."""

from attnkit import demo


def test_demo_training_reverses_held_out_strings() -> None:
    task = demo.ReverseTask(min_len=3, max_len=8)
    model = demo.train_reverser(steps=350, batch_size=64, task=task, seed=0)
    accuracy, results = demo.exact_match(model, task, n=500, seed=1)
    assert accuracy >= 0.99, f"only {accuracy:.1%} exact match; first miss: {results[0]}"


def test_demo_heat_map_is_written(tmp_path) -> None:
    model = demo.train_reverser(steps=2)
    path = demo.attention_picture(model, [5, 6, 7, 8], tmp_path / "attention.png")
    assert path.stat().st_size > 1000
