"""Training killed with SIGKILL at random points of its checkpoint writes always recovers:
a few iterations of `python -m bench fault` (bench/fault_injection.py), which runs fifty."""

from bench.fault_injection import run


def test_training_killed_during_checkpoint_writes_always_loads_and_resumes(tmp_path):
    tally = run(tmp_path, iterations=4, seed=3)
    assert tally.failures == [] and tally.recovered == 4
    assert tally.finished  # the last resume, not killed, ran to its end
    assert tally.leftovers == 0  # the partial files of cut writes were removed on resume
    # Each killed training left its lock file behind; the next one took it over.
    assert "took over the lock" in (tmp_path / "child1.log").read_text()
