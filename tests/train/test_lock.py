import logging

from attnkit.run import RunFolder
from attnkit.train import lock


def test_without_fcntl_the_folder_is_not_locked_and_a_warning_says_so(
    tmp_path, monkeypatch, caplog
):
    """Windows has no fcntl: training goes on, unlocked, and says so."""
    monkeypatch.setattr(lock, "fcntl", None)
    folder = RunFolder(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="attnkit.train"), lock.hold(folder):
        assert not folder.lock.exists()
    assert "this platform cannot lock" in caplog.text


def test_the_lock_names_its_holder_while_held_and_is_gone_after(tmp_path):
    folder = RunFolder(tmp_path / "run")
    with lock.hold(folder):
        assert folder.lock.read_text().startswith('{"pid": ')
    assert not folder.lock.exists()
    lock.check_free(folder)  # a free folder passes
