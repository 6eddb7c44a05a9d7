"""glibc's malloc thresholds pinned: batch-sized blocks come from the heap and stay there."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

# A 20 MiB block (a batch of 1024 rows of x is 17 MB), then how glibc served it: mallinfo2's
# hblkhd counts the bytes in blocks it mapped on their own, which it unmaps on free.
PROBE = """
import ctypes, sys
from kosmoss.run.allocator import pin_malloc_thresholds
pinned = pin_malloc_thresholds() if sys.argv[1] == "pin" else False
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.mallinfo2.restype = MallInfo2
block = libc.malloc(20 * 2**20)
print(pinned, libc.mallinfo2().hblkhd >= 20 * 2**20)
"""


def _probe(mode: str, **env) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | env
    return subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                          env=environment, check=True).stdout.split()


def test_a_batch_sized_block_comes_from_the_heap_once_pinned():
    assert _probe("no") == ["False", "True"]  # glibc's default: a mapping of its own
    assert _probe("pin") == ["True", "False"]


def test_the_users_own_allocator_settings_are_kept():
    assert _probe("pin", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072") == ["False", "True"]
