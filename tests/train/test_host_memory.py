import subprocess
import sys

import pytest

# A child process allocates and frees a 256 MB tensor, then allocates and fills one of the
# same size again, and prints the minor page faults of that second allocation.
CHILD = """
import resource, sys, torch
from attnkit.train.host_memory import reuse_freed_memory
if sys.argv[1] == "reuse":
    assert reuse_freed_memory()
n = 64 * 2**20
torch.ones(n)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.ones(n)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_freed_memory_is_reused_without_new_page_faults():
    pages = 256 * 2**20 // 4096
    assert _faults("default") > pages // 2  # glibc maps the second tensor afresh
    assert _faults("reuse") < pages // 20  # the freed block is reused
