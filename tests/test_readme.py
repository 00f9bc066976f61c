"""The README is the front door: short, its links resolve, its two commands are the ones CI runs.

Its Python runs as written too (`tests/test_docs.py`, with the docs' examples).
"""

import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

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
    assert "$sudo apt-get install -y chromium" in tests  # the browser test's, root or not
    assert "sudo=$(command -v sudo || true)\n" in tests  # `|| true`: without sudo, -e goes on
    assert tests.strip().endswith("python -m pytest")
    for command in (demo, tests):  # in a virtual environment: Debian's Python refuses pip
        assert "python3 -m venv .venv && . .venv/bin/activate && pip install -e " in command
        assert "torch" not in command  # pip picks the newest torch the project accepts


def test_the_newest_torch_is_accepted() -> None:
    """No upper cap: pip would replace a user's newer torch, several GB on a GPU machine."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch,) = [Requirement(r) for r in project["dependencies"] if r.startswith("torch")]
    assert all(spec.operator == ">=" for spec in torch.specifier), torch
    assert all(torch.specifier.contains(v) for v in ("2.11.0", "2.15.0", "2.16.0")), torch


def test_ci_runs_exactly_the_readme_commands() -> None:
    shown = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True, check=True
    ).stdout
    assert shown == "".join(two_commands())
    script = (ROOT / ".ci" / "run").read_text()
    assert 'bash -euo pipefail -c "$commands"' in script  # run as shown, failing on any error
    assert "\nrm -rf .venv\n" in script  # in a new environment each run
