"""What `mutmut run` left, per checker module: mutants killed, survived, untested, and the
survivors split into those that change only a message's words (a hint included) and those
that change what the checker computes or feeds it (the ones to read). Run from the
repository root after `mutmut run` (docs/exercises.md, "Mutation testing"); `--logic`
prints those diffs.

mutmut's own `results` lists every survivor by name; this groups them, because most
survivors of a checker rewrite a hint's text, which no catalogued mistake reads.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

STRING = re.compile(r"""[rbuf]*("([^"\\]|\\.)*"|'([^'\\]|\\.)*')""", re.I)
COMPARED = re.compile(r"""(==|!=|\bin)\s*[rbuf]*["']|["']\s*(==|!=|\bin\b)""", re.I)
KINDS = ("killed", "words", "logic", "no tests")
MESSAGE_CALL = re.compile(r"\b(failed|passed|_line)\(None\)")  # a verdict's words dropped


def changed_lines(diff: str) -> tuple:
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-")
               and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+")
             and not line.startswith("+++")]
    return removed, added


def only_words(name: str, diff: str) -> bool:
    """True when the mutant changes a string's words, drops a verdict's message, or changes
    which hint a `*_hint` function adds to a verdict that rejects anyway."""
    if re.search(r"\.x_\w*_hint__mutmut_\d+$", name):
        return True
    removed, added = changed_lines(diff)
    if any(MESSAGE_CALL.search(line) for line in added):
        return True
    if any(COMPARED.search(line) for line in removed):  # a string compared is logic
        return False
    bare = [STRING.sub('""', line).strip() for line in removed], \
           [STRING.sub('""', line).strip() for line in added]
    return bare[0] == bare[1]


def main(argv=None) -> int:
    # mutmut 3 (the `mutation` extra; its module names are not an API, hence the pin),
    # imported here: only_words needs none of it
    from mutmut.__main__ import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logic", action="store_true", help="print each logic survivor's diff")
    args = parser.parse_args(argv)
    metas = sorted(Path("mutants").glob("kosmoss/exercises/lesson*.py.meta"))
    if not metas:
        print("no mutants/ here: run `mutmut run` from the repository root first",
              file=sys.stderr)
        return 2
    print(f"{'module':<12}{'mutants':>8}{'killed':>8}{'words':>7}{'logic':>7}{'untested':>9}"
          f"{'other':>7}")  # other: timed out, not run yet, ...
    logic_diffs = []
    for meta in metas:
        module = SourceFileMutationData(path=Path(str(meta)[len("mutants/"):-len(".meta")]))
        module.load()
        counts = collections.Counter()
        for name, code in module.exit_code_by_key.items():
            status = status_by_exit_code[code]
            if status == "survived":
                diff = get_diff_for_mutant(name, path=module.path)
                words = only_words(name, diff)
                counts["words" if words else "logic"] += 1
                if not words:
                    logic_diffs.append((name, diff))
            else:
                counts[status] += 1
        print(f"{module.path.stem:<12}{len(module.exit_code_by_key):>8}{counts['killed']:>8}"
              f"{counts['words']:>7}{counts['logic']:>7}{counts['no tests']:>9}"
              f"{len(module.exit_code_by_key) - sum(counts[k] for k in KINDS):>7}")
    if args.logic:
        for name, diff in logic_diffs:
            removed, added = changed_lines(diff)
            print(f"\n{name}\n" + "\n".join([f"-{line}" for line in removed]
                                            + [f"+{line}" for line in added]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
