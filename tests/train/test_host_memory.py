import json
import subprocess
import sys

import pytest

MIB = 2**20

# A child process allocates a 256 MiB tensor and frees it, and prints glibc's own accounting
# (mallinfo2, in bytes) before, while the tensor lives and after it is freed: `hblkhd` is memory
# in blocks mapped on their own (given back to the kernel on free), `arena` the heap's size and
# `fordblks` free memory kept in the heap. The allocator's accounting is asserted rather than
# page faults, whose counting differs between kernels and virtual machines.
CHILD = """
import ctypes, json, sys, torch
from attnkit.train.host_memory import reuse_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd",
        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "reuse":
    assert reuse_freed_memory()
def sizes():
    info = libc.mallinfo2()
    return {"mapped": info.hblkhd, "heap": info.arena, "free_in_heap": info.fordblks}
before = sizes()
tensor = torch.ones(64 * 2**20)
alive = sizes()
del tensor
print(json.dumps({"before": before, "alive": alive, "freed": sizes()}))
"""


def _mallinfo(mode: str) -> dict[str, dict[str, int]]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_default_malloc_maps_a_large_block_and_gives_it_back():
    info = _mallinfo("default")
    assert info["alive"]["mapped"] - info["before"]["mapped"] >= 256 * MIB
    assert info["freed"]["mapped"] == info["before"]["mapped"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_freed_memory_stays_in_the_heap_for_reuse():
    info = _mallinfo("reuse")
    assert info["alive"]["mapped"] == info["before"]["mapped"]  # taken from the heap
    assert info["freed"]["heap"] == info["alive"]["heap"]  # and kept: the heap is not trimmed,
    # and free for reuse, but for the few KiB the child allocates after the tensor is freed
    assert info["freed"]["free_in_heap"] - info["before"]["free_in_heap"] >= 255 * MIB
