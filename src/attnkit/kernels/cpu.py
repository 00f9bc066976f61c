"""What the CPU is and can do: its model name and the instruction sets that pick a path.

torch's float32, bfloat16 and int8 kernels each run at very different speeds
depending on a few x86 extensions: AVX2 (the vector floor every fast path
needs), AVX-512, AVX512-BF16 and AMX (bfloat16 dot products in hardware; without
them bfloat16 products run through a fallback hundreds of times slower) and
AVX512-VNNI (int8 dot products). Read once from /proc/cpuinfo; elsewhere (no
such file) the flags are empty and only the portable paths are taken.
"""

from __future__ import annotations

import functools
import platform
import re
from dataclasses import dataclass
from pathlib import Path

# The instruction sets that decide torch's float32, bfloat16 and int8 paths on x86.
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


@dataclass(frozen=True)
class Cpu:
    model: str
    flags: frozenset[str]

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def bf16_dot(self) -> bool:
        """bfloat16 products in hardware (AVX512-BF16 or AMX), not through a slow fallback."""
        return self.has("avx512_bf16") or self.has("amx_bf16")

    def describe(self) -> str:
        """One line: the model and, for each flag of `FLAGS`, yes or no."""
        marks = ", ".join(f"{name} {'yes' if self.has(name) else 'no'}" for name in FLAGS)
        return f"{self.model} ({platform.machine()}); flags: {marks}"


@functools.cache
def this_cpu() -> Cpu:
    """The CPU this process runs on (read once)."""
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return Cpu(model, flags)
    if found := re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE):
        model = found.group(1).strip()
    if found := re.search(r"^flags\s*:\s*(.+)$", info, re.MULTILINE):
        flags = frozenset(found.group(1).split())
    return Cpu(model, flags)
