"""What each task of a check printed is counted exactly, wherever the pipe's reads split
the end marks the checker's processes write between tasks."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kosmoss.exercises import distributed

# What tasks print, hostile ones included: bytes that look like the start of a mark.
PRINTED = [b"a" * 100, b"", b"\x1e" * 7 + b"xyz", b"b" * 5000, distributed.END_MARK_START,
           distributed.END_MARK_START + b"12x\n", distributed.END_MARK_START + b"3\x1e"]
AFTER_THE_LAST = b"exit noise\n"
STREAM = b"".join(printed + distributed.END_MARK_START + str(task).encode() +
                  distributed.END_MARK_END for task, printed in enumerate(PRINTED)) + AFTER_THE_LAST


class Pipe:
    """A pipe whose reads return the stream cut at the given places."""

    def __init__(self, data: bytes, cuts):
        edges = [0, *sorted(set(cuts)), len(data)]
        self.chunks = [data[a:b] for a, b in zip(edges, edges[1:]) if b > a]

    def read1(self, _size):
        return self.chunks.pop(0) if self.chunks else b""

    def close(self):
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, len(STREAM) - 1), max_size=80))
def test_every_byte_is_charged_to_the_task_that_printed_it(cuts):
    tail = distributed._Tail(Pipe(STREAM, cuts))
    tail._thread.join()
    wanted = {task: len(printed) for task, printed in enumerate(PRINTED) if printed}
    wanted[len(PRINTED)] = len(AFTER_THE_LAST)
    assert {task: n for task, n in tail.by_task.items() if n} == wanted
    assert tail.last_line() == "exit noise"  # the marks are not part of what is shown


def test_torchs_rank_prefixes_do_not_hide_the_message():
    said = b"[rank1]: [rank1]: [rank1]: RuntimeError: Connection closed by peer\n"
    tail = distributed._Tail(Pipe(said * 3 + b"[rank1]: \n", []))
    tail._thread.join()
    assert tail.last_line() == "RuntimeError: Connection closed by peer"
