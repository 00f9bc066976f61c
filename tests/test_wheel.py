"""A non-editable install works: the wheel, installed in a fresh virtual environment, runs the
demo and a packaged recipe by its bare name, from a folder that is not the repository.

The environment sees the packages of the interpreter running the tests (so torch is not installed
again) and gets the wheel alone (`--no-deps`); nothing points it at the source tree.
"""

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnkit import recipes

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"  # a copy, so that the build leaves nothing in the repository
    shutil.copytree(
        ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp / "dist"), str(tree)], tmp)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("attnkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for name in recipes.names():
        assert f"attnkit/recipes/{name}.toml" in names, name
    assert any(n.startswith("attnkit/kernels/") and n.endswith(".c") for n in names)
    assert any(n.startswith("attnkit/serve/page/") for n in names)
    assert "attnkit/py.typed" in names  # type checkers read the package's annotations
    env = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(env)], tmp)
    python = env / "bin" / "python"
    see_site_packages(python)
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], tmp)
    return env


def see_site_packages(python: Path) -> None:
    """Let the environment of `python` import the packages this interpreter has, after its own.

    Not `--system-site-packages`: inside a virtual environment that sees the base interpreter's
    packages, not the environment's, and so no torch. A `.pth` file's lines are appended to
    `sys.path` without running the `.pth` files they hold, so an editable attnkit there stays
    out of sight, and the wheel, in the environment's own site-packages, comes first.
    """
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(own, "_parent_site_packages.pth").write_text("".join(f"{p}\n" for p in ours))


def run(command: list[str], cwd: Path) -> str:
    """Run `command` in `cwd` as a user's shell would: no PYTHONPATH leading to the sources."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_wheel_is_what_the_environment_imports(venv: Path, tmp_path: Path) -> None:
    where = run(
        [str(venv / "bin" / "python"), "-c", "import attnkit; print(attnkit.__file__)"], tmp_path
    )
    assert Path(where.strip()).is_relative_to(venv)
    listing = run([str(venv / "bin" / "attnkit"), "recipes"], tmp_path)
    assert all(name in listing for name in recipes.names())


def test_the_installed_wheel_runs_the_demo(venv: Path, tmp_path: Path) -> None:
    options = ["--steps", "40", "--eval-examples", "20", "--out", "demo"]
    out = run([str(venv / "bin" / "attnkit"), "demo", *options], tmp_path)
    assert "exact match on 20 held-out strings" in out
    assert (tmp_path / "demo" / "attention.png").is_file()


def test_the_installed_wheel_trains_a_recipe_by_its_name(
    venv: Path, tmp_path: Path, samples: Path
) -> None:
    sets = ["train.steps=3", "eval.every=3", "eval.max_batches=2", "train.threads=1",
            f"data.data_dir={samples}", "train.out_dir=run"]  # fmt: skip
    command = [str(venv / "bin" / "attnkit"), "train", "tinyshakespeare_char"]
    out = run([*command, *(a for s in sets for a in ("--set", s))], tmp_path)
    assert "finished at step 3" in out
    assert (tmp_path / "run" / "model.safetensors").is_file()
