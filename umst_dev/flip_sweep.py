"""The flip sweep: where a test is missing, found by flipping operators one at a time in one file.

    python -m umst_dev.flip_sweep FILE TEST [TEST ...] [--json OUT] [--timeout S]

The mutation check (:mod:`umst_dev.mutation`) plants faults someone wrote down; this sweep proposes them. In
``FILE`` (a path in the repository) every comparison, boolean operator, ``not``, ``+ 1``/``- 1`` and ``True``/
``False`` of the code (not of its strings, comments or docstrings) is flipped in turn (``==`` to ``!=``, ``<`` to
``<=``, ``and`` to ``or``, ...), and ``TEST`` (pytest arguments) run against each flip, on a copy of the repository
as the mutation check works (the checkout is never written). A flip the tests pass *survived*: a lead, not a
verdict. Many survivors change nothing a user could see (an equivalent flip: ``x is None or not isinstance(x, int)``
against ``and`` where the value is always an int or None); the others are a test missing. Write that test, then
the fault it catches into the mutation table (``MUTANTS``), so that the check keeps it caught.

It takes a while: one pytest run per flip (a file of 150 lines has 20-50 flips; at 5-40 s a run, 2-30 minutes).
The lines print as each flip is judged; ``--json`` writes every flip's verdict as it comes (a sweep stopped by
Ctrl-C or a kill keeps the verdicts it reached, ``"finished": false``). A first sweep against a file's quick
tests, then ``--survivors-of`` its record against the slower ones (``python -m umst_dev.flip_sweep FILE SLOW_TESTS
--survivors-of quick.json``), judges only the flips the quick tests let through: the slow tests run for a few flips,
not for all of them.
"""
import argparse
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import tokenize

from umst_dev import mutation

# (token, its flips): each flip of a token is one candidate
OPERATOR_FLIPS = {"==": ("!=",), "!=": ("==",), "<": ("<=",), "<=": ("<",), ">": (">=",), ">=": (">",),
                  "and": ("or",), "or": ("and",), "True": ("False",), "False": ("True",), "is": ("is not",)}


def flips(text):
    """Every candidate flip of ``text`` (Python source): (line number, the line, the line flipped, what changed),
    in the order of the file. Strings, comments and docstrings are tokens of their own, so nothing in them is
    flipped; nor are logging calls' lines (their words are not behaviour a test pins)."""
    lines = text.splitlines(keepends=True)
    found = []
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for i, tok in enumerate(tokens):
        (row, col), (end_row, end_col) = tok.start, tok.end
        if row > len(lines) or row != end_row or "logger." in lines[row - 1] or "logging." in lines[row - 1]:
            continue
        line = lines[row - 1]
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if tok.type == tokenize.OP or tok.type == tokenize.NAME:
            if tok.string == "is" and following is not None and following.string == "not":
                replacements = [("is not", "is", following.end[1])]
            elif tok.string == "not" and i > 0 and tokens[i - 1].string == "is":
                continue  # (``is not``: flipped at its ``is``)
            elif tok.string == "not":
                replacements = [("not ", "", col + 4 if line[col + 3:col + 4] == " " else end_col)]
            else:
                replacements = [(tok.string, new, end_col) for new in OPERATOR_FLIPS.get(tok.string, ())]
            for before, after, stop in replacements:
                found.append((row, line, line[:col] + after + line[stop:], f"{before.strip()} -> {after or '(none)'}"))
        elif tok.type == tokenize.NUMBER and tok.string == "1" and i > 0 and tokens[i - 1].string in ("+", "-"):
            sign = tokens[i - 1]
            if sign.start[0] == row:
                flipped = "-" if sign.string == "+" else "+"
                s = sign.start[1]
                found.append((row, line, line[:s] + flipped + line[s + 1:], f"{sign.string} 1 -> {flipped} 1"))
    return found


class RecordMismatch(ValueError):
    """An earlier record (``--survivors-of``) that does not fit the file as it is."""


def survivors_of(record, rel_path, candidates):
    """The flips of ``candidates`` that survived in ``record`` (an earlier sweep's ``--json`` of the same file), each
    matched by its line number, its line's text and the line flipped (a line can have two flips of one kind: ``a or
    b or c``). A survivor the file no longer has (the line moved or changed since) is an error that names it: the
    record is of another version of the file."""
    if record.get("file") != rel_path:
        raise RecordMismatch(f"the record is of {record.get('file')}, not of {rel_path}")
    by_key = {(row, line.strip(), flipped.strip()): (row, line, flipped, change)
              for row, line, flipped, change in candidates}
    chosen = []
    for result in record["results"]:
        if result["verdict"] != "survived":
            continue
        key = (result["line"], result["before"], result["after"])
        if key not in by_key:
            raise RecordMismatch(f"{rel_path} line {result['line']} is no longer {result['before']!r} "
                             f"(recorded at commit {record.get('commit')}): sweep the file again")
        chosen.append(by_key[key])
    return chosen


def parse_lines(text):
    """``--lines``' ranges, "A-B,C,D-E" (inclusive, 1-based) -> [(A, B), (C, C), (D, E)]; ValueError on a range
    that is not one."""
    ranges = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a line or a range of lines (A-B)") from None
        if not 1 <= low <= high:
            raise ValueError(f"{part.strip()!r}: lines count from 1, the first of a range before the last")
        ranges.append((low, high))
    return ranges


def sweep(root, rel_path, tests, timeout=900, log=print, only_survivors_of=None, json_path=None, lines=None):
    """Run every flip of ``rel_path`` against ``tests`` on a copy of ``root``; returns the record (``--json``).
    With ``only_survivors_of`` (an earlier record of the same file), only the flips that survived there. With
    ``lines`` (:func:`parse_lines`' ranges), only the flips on those lines (a part of a file whose other parts
    other tests judge, or code written since an earlier sweep). With
    ``json_path``, the record is written there after every flip (``"finished": false`` until the last), so a sweep
    stopped part way keeps the verdicts it reached."""
    started, start = time.strftime("%Y-%m-%d %H:%M:%S"), time.monotonic()
    commit = mutation._commit(root)
    copy = tempfile.mkdtemp(prefix="umst-flip-sweep-")
    results = []

    def record(finished):
        found = dict(started=started, seconds=round(time.monotonic() - start), machine=mutation.machine(),
                     commit=commit, file=rel_path, tests=list(tests), finished=finished, results=results)
        if only_survivors_of is not None:
            found["survivors_of"] = dict(commit=only_survivors_of.get("commit"), tests=only_survivors_of.get("tests"))
        if lines is not None:
            found["lines"] = [list(r) for r in lines]
        if json_path:
            with open(json_path + ".tmp", "w") as f:
                json.dump(found, f, indent=1)
            os.replace(json_path + ".tmp", json_path)
        return found

    try:
        mutation.copy_of_repository(root, copy)
        path = os.path.join(copy, rel_path)
        with open(path, encoding="utf-8") as f:
            original = f.read()
        candidates = flips(original)
        if only_survivors_of is not None:
            candidates = survivors_of(only_survivors_of, rel_path, candidates)
            if only_survivors_of.get("finished") is False:
                log(f"[flip-sweep] the earlier record was stopped part way: its "
                    f"{len(only_survivors_of['results'])} judged flips only")
        if lines is not None:
            candidates = [c for c in candidates if any(low <= c[0] <= high for low, high in lines)]
        status, seconds, _, tail = mutation.run_tests(copy, tests, timeout)
        log(f"[flip-sweep] {len(candidates)} flips in {rel_path}; unchanged code: pytest status {status} in "
            f"{seconds:.0f} s")
        if status != 0:
            raise RuntimeError(f"the tests fail on the unchanged code (status {status}): a flip they catch would mean "
                               f"nothing:\n{tail}")
        original_lines = original.splitlines(keepends=True)
        try:
            for row, line, flipped, change in candidates:
                text = "".join(original_lines[:row - 1] + [flipped] + original_lines[row:])
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                status, seconds, failed, _ = mutation.run_tests(copy, tests, timeout)
                verdict = mutation._verdict(status)
                results.append(dict(line=row, change=change, before=line.strip(), after=flipped.strip(),
                                    verdict=verdict, seconds=round(seconds, 1), failed=failed[:3]))
                log(f"[flip-sweep] {verdict:8s} line {row}: {change}: {flipped.strip()}")
                record(finished=False)
        finally:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    survived = [r for r in results if r["verdict"] == "survived"]
    log(f"[flip-sweep] {len(survived)} of {len(results)} flips survived")
    return record(finished=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m umst_dev.flip_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the file to flip, a path in the repository (umst_plugin/...)")
    parser.add_argument("tests", nargs="+", help="pytest arguments: the tests that should catch the flips")
    parser.add_argument("--json", help="write every flip's verdict here")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per pytest run (default 900)")
    parser.add_argument("--survivors-of", metavar="RECORD",
                        help="only the flips that survived in this earlier record (--json) of the same file")
    parser.add_argument("--lines", metavar="A-B,C",
                        help="only the flips on these lines (inclusive ranges, comma-separated)")
    args = parser.parse_args(argv)
    try:
        lines = parse_lines(args.lines) if args.lines else None
    except ValueError as e:
        parser.error(f"--lines: {e}")
    if not os.path.isfile(os.path.join(mutation.ROOT, args.file)):
        parser.error(f"{args.file}: no such file in {mutation.ROOT}")
    earlier = None
    if args.survivors_of:
        with open(args.survivors_of) as f:
            earlier = json.load(f)
    # a kill (SIGTERM: a job stopped, a session's end) ends the sweep as Ctrl-C does: the pytest run in flight is
    # stopped, the copy removed, the verdicts reached kept in --json
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sweep(mutation.ROOT, args.file, args.tests, args.timeout, log=lambda line: print(line, flush=True),
              only_survivors_of=earlier, json_path=args.json, lines=lines)
    except RecordMismatch as e:
        parser.error(f"{args.survivors_of}: {e}")
    except KeyboardInterrupt:
        print(f"[flip-sweep] stopped; the verdicts reached are in {args.json or '(no --json)'}", flush=True)
        return 130
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
