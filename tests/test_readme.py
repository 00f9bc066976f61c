"""The README is the front door: short, its links resolve, its two commands are the ones CI runs.

Its Python runs as written too (`tests/test_docs.py`, with the docs' examples).
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"


def two_commands() -> list[str]:
    """The ```bash blocks of the README's "## Two commands" section."""
    section = README.read_text().split("## Two commands\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_every_relative_link_of_the_readme_resolves() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) >= 20  # it sends readers to the docs
    for link in local:
        assert (ROOT / link).exists(), link


def test_the_two_commands_run_the_demo_and_install_what_the_tests_need() -> None:
    demo, tests = two_commands()
    assert demo.strip().endswith("attnkit demo")
    assert "apt-get install -y chromium" in tests  # the browser test's Chromium, from Debian
    assert tests.strip().endswith("python -m pytest")
    for command in (demo, tests):
        assert "pip install torch==2.13.0 &&" in command  # the CPU build first, kept after


def test_ci_runs_exactly_the_readme_commands() -> None:
    shown = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True, check=True
    ).stdout
    assert shown == "".join(two_commands())
    script = (ROOT / ".ci" / "run").read_text()
    assert 'bash -euo pipefail -c "$commands"' in script  # run as shown, failing on any error
