"""The demo's claim, asserted: the same training code reaches >= 99% exact match."""

import itertools

from attnkit import demo
from attnkit.data.reverse import ReverseTask
from attnkit.train.tasks import build_task, reverse_exact_match, train


def test_demo_training_reverses_unseen_strings(tmp_path):
    """The demo's own config and Trainer, on strings of 4 to 6 digits and 300 steps."""
    config = demo.demo_run_config(
        **{
            "train.out_dir": str(tmp_path / "run"),
            "train.steps": 300,
            "train.threads": 1,
            "data.max_len": 6,
            "eval.every": 300,
            "eval.decode_examples": 100,
        }
    )
    result = train(config)
    assert result.stopped == "finished" and result.step == 300

    seen = {
        tuple(row[mask].tolist())
        for batch in itertools.islice(build_task(config).train_data, 300)
        for row, mask in zip(batch.src, batch.src_mask, strict=True)
    }
    _, results = reverse_exact_match(result.model, ReverseTask(max_len=6), 2000, seed=123)
    unseen = [(src, tgt, hyp) for src, tgt, hyp in results if tuple(src) not in seen]
    assert len(unseen) > 1000
    accuracy = sum(tgt == hyp for _, tgt, hyp in unseen) / len(unseen)
    assert accuracy >= 0.99
    assert (tmp_path / "run" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "curves.png").is_file()


def test_demo_heat_map_is_written(tmp_path) -> None:
    config = demo.demo_run_config(
        **{"train.out_dir": str(tmp_path / "run"), "train.steps": 2, "eval.every": 100}
    )
    report = demo.run_demo(config, tmp_path / "attention.png", eval_examples=4)
    assert report.picture == tmp_path / "attention.png"
    assert report.picture.stat().st_size > 1000
