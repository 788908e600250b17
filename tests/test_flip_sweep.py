"""umst_dev/flip_sweep.py, the flip sweep (``python -m umst_dev.flip_sweep FILE TESTS``: minutes, not run in the
suite): what it flips, and a sweep of a small repository whose test pins one flip and misses another."""
import re
import subprocess
import sys

import pytest

from umst_dev import flip_sweep

SOURCE = '''"""A docstring: a == b and c < d are words here."""
import logging

logger = logging.getLogger(__name__)


def clip(x, low, high):
    # a comment: x <= high or not
    if x < low and not x is None:
        return low
    if x is not None and x >= high:
        logger.info("x == high or above")
        return high
    return x + 1 if "a < b" == "c" else x - 1
'''


def test_flips_are_the_code_s_operators_only():
    found = [(row, change, after.strip()) for row, _, after, change in flip_sweep.flips(SOURCE)]
    assert found == [
        (9, "< -> <=", "if x <= low and not x is None:"),
        (9, "and -> or", "if x < low or not x is None:"),
        (9, "not -> (none)", "if x < low and x is None:"),
        (9, "is -> is not", "if x < low and not x is not None:"),
        (11, "is not -> is", "if x is None and x >= high:"),
        (11, "and -> or", "if x is not None or x >= high:"),
        (11, ">= -> >", "if x is not None and x > high:"),
        (14, "+ 1 -> - 1", 'return x - 1 if "a < b" == "c" else x - 1'),
        (14, "== -> !=", 'return x + 1 if "a < b" != "c" else x - 1'),
        (14, "- 1 -> + 1", 'return x + 1 if "a < b" == "c" else x + 1'),
    ]
    # each flip changes its own line only, and leaves valid Python
    for row, line, after, _ in flip_sweep.flips(SOURCE):
        lines = SOURCE.splitlines(keepends=True)
        compile("".join(lines[:row - 1] + [after] + lines[row:]), "flipped", "exec")


def small_repository(tmp_path, module, tests):
    """A git repository with ``pkg/numbers.py`` (``module``) and ``tests/<name>`` for each of ``tests``."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "numbers.py").write_text(module)
    for name, text in tests.items():
        (repo / "tests" / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


def test_a_sweep_finds_the_flip_no_test_pins_and_leaves_the_file_as_it_was(tmp_path):
    module = "def at_least(x, low):\n    return x >= low\n\n\ndef next_one(x):\n    return x + 1\n"
    # pins next_one, and at_least only away from the boundary (x == low): ">= -> >" survives
    repo = small_repository(tmp_path, module, {
        "test_numbers.py": "from pkg.numbers import at_least, next_one\n\n\ndef test_numbers():\n"
                           "    assert next_one(2) == 3 and at_least(5, 1) and not at_least(0, 1)\n"})
    lines = []
    record = flip_sweep.sweep(str(repo), "pkg/numbers.py", ["tests/test_numbers.py"], timeout=120, log=lines.append)
    verdicts = {(r["line"], r["change"]): r["verdict"] for r in record["results"]}
    assert verdicts == {(2, ">= -> >"): "survived", (6, "+ 1 -> - 1"): "caught"}, (verdicts, lines)
    assert lines[-1] == "[flip-sweep] 1 of 2 flips survived"
    assert (repo / "pkg" / "numbers.py").read_text() == module  # the checkout is never written


def test_lines_limit_the_sweep_to_their_ranges(tmp_path):
    """``--lines``: only the flips on the lines named (next_one's here); a range that is not one is refused."""
    module = "def at_least(x, low):\n    return x >= low\n\n\ndef next_one(x):\n    return x + 1\n"
    repo = small_repository(tmp_path, module, {
        "test_numbers.py": "from pkg.numbers import next_one\n\n\ndef test_numbers():\n"
                           "    assert next_one(2) == 3\n"})
    record = flip_sweep.sweep(str(repo), "pkg/numbers.py", ["tests/test_numbers.py"], timeout=120,
                              log=lambda _: None, lines=flip_sweep.parse_lines("3-6"))
    assert [(r["line"], r["verdict"]) for r in record["results"]] == [(6, "caught")] and record["lines"] == [[3, 6]]
    assert flip_sweep.parse_lines("1-2, 7,9-9") == [(1, 2), (7, 7), (9, 9)]
    for bad in ("2-1", "0", "a-b", "3-"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            flip_sweep.parse_lines(bad)
    proc = subprocess.run([sys.executable, "-m", "umst_dev.flip_sweep", "umst_dev/flip_sweep.py", "tests/x.py",
                           "--lines", "5-4"], cwd=flip_sweep.mutation.ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "--lines: '5-4': lines count from 1" in proc.stderr, proc.stderr


def test_the_command_refuses_a_file_that_is_not_there():
    proc = subprocess.run([sys.executable, "-m", "umst_dev.flip_sweep", "umst_plugin/nothing.py", "tests/x.py"],
                          cwd=flip_sweep.mutation.ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "umst_plugin/nothing.py: no such file" in proc.stderr, proc.stderr


def test_survivors_of_an_earlier_sweep_are_judged_again_by_other_tests(tmp_path):
    """``--survivors-of``: the second sweep runs only the flip the first one's tests let through, against a test
    that pins it; a record of another version of the file is refused with the line it no longer has."""
    module = ("def at_least(x, low):\n    return x >= low\n\n\ndef next_one(x):\n    return x + 1\n\n\n"
              "def any_of(a, b, c):\n    return a or b or c\n")
    repo = small_repository(tmp_path, module, {
        "test_quick.py": "from pkg.numbers import any_of, at_least, next_one\n\n\ndef test_quick():\n"
                         "    assert next_one(2) == 3 and at_least(5, 1) and any_of(1, 1, 1) and not any_of(0, 0, 0)\n",
        # pins the boundary, and the second "or" of any_of (a or b and c is false for 0, 0, 1), not the first
        "test_boundary.py": "from pkg.numbers import any_of, at_least\n\n\ndef test_boundary():\n"
                            "    assert at_least(1, 1) and any_of(0, 0, 1)\n"})
    quick = flip_sweep.sweep(str(repo), "pkg/numbers.py", ["tests/test_quick.py"], timeout=120, log=lambda _: None)
    assert [(r["line"], r["verdict"]) for r in quick["results"]] == [
        (2, "survived"), (6, "caught"), (10, "survived"), (10, "survived")]
    lines = []
    again = flip_sweep.sweep(str(repo), "pkg/numbers.py", ["tests/test_boundary.py"], timeout=120,
                             log=lines.append, only_survivors_of=quick)
    assert [(r["line"], r["after"], r["verdict"]) for r in again["results"]] == [
        (2, "return x > low", "caught"), (10, "return a and b or c", "survived"),
        (10, "return a or b and c", "caught")], lines
    assert again["survivors_of"]["tests"] == ["tests/test_quick.py"]
    # the file changed since the record: its survivor's line is gone
    (repo / "pkg" / "numbers.py").write_text(module.replace("x >= low", "low <= x"))
    try:
        flip_sweep.sweep(str(repo), "pkg/numbers.py", ["tests/test_boundary.py"], timeout=120, log=lambda _: None,
                         only_survivors_of=quick)
    except flip_sweep.RecordMismatch as e:
        assert "pkg/numbers.py line 2 is no longer 'return x >= low'" in str(e), e
    else:
        raise AssertionError("a record of another version of the file was taken")


def test_a_sweep_stopped_part_way_keeps_its_verdicts_and_removes_its_copy(tmp_path):
    """SIGTERM (a job stopped, a session's end) after the first verdict: the command stops the pytest run in flight,
    removes its copy of the repository and leaves the verdicts reached in --json, marked unfinished."""
    import json
    import os
    import signal
    import time

    out = tmp_path / "sweep.json"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "umst_dev.flip_sweep", "umst_plugin/data/side_files.py",
                             "tests/test_conllu_reader.py", "--json", str(out)], cwd=flip_sweep.mutation.ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if " line " in line:  # the first verdict
            break
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, lines + [rest]
    assert f"stopped; the verdicts reached are in {out}" in rest
    record = json.loads(out.read_text())
    assert record["finished"] is False and 1 <= len(record["results"]) < 11, record
    assert not [p for p in os.listdir(tmp_path) if p.startswith("umst-flip-sweep-")]
