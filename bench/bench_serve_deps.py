"""The packages `attnkit serve` needs beyond torch and transformers, copied into one folder that
travels to a GPU machine which has only those two (`bench/gpu_checks.sh serve-deps`, then
`serve` with the folder on PYTHONPATH).

    python bench/bench_serve_deps.py runs/serve-deps

Each distribution's files (its modules and its .dist-info, which version checks read) are
copied from this interpreter's installation; the compiled ones (pydantic-core) fit the same
Python version and platform only. Afterwards the folder is checked alone: a Python that sees
no site-packages imports FastAPI, uvicorn, prometheus-client, httpx and Jinja from it.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

ROOTS = ("fastapi", "uvicorn", "prometheus-client", "httpx", "jinja2")


def closure(roots: tuple[str, ...] = ROOTS) -> list[importlib.metadata.Distribution]:
    """The installed distributions of `roots` and of all they require (no extras)."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in found:
            continue
        try:
            found[name] = dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def pack(dest: Path) -> list[str]:
    """Copy the installed files of `closure()` into `dest`; the names copied."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for dist in closure():
        for file in dist.files or []:
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue  # console scripts outside site-packages, caches
            source = Path(dist.locate_file(file))
            if source.is_file():
                (dest / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / file)
        copied.append(f"{dist.metadata['Name']} {dist.version}")
    return copied


def main() -> None:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/serve-deps")
    print("copied:", ", ".join(pack(dest)))
    check = "import fastapi, uvicorn, prometheus_client, httpx, jinja2; print('imports alone: ok')"
    subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(dest)!r}); "
                    + check], check=True)  # fmt: skip
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"{dest}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
