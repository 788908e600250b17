"""umst_dev/mutation.py, the mutation check (``python -m umst_dev.mutation``: minutes, not run in the suite):
its table fits the code -- every snippet occurs exactly once in its file, every test it names exists -- its last
recorded run covers the table and caught every fault, and a planted fault never stays behind in a file."""
import json
import os

import pytest

import e2e
from umst_dev import mutation

RECORD = os.path.join(e2e.ROOT, "docs", "results", "mutation-cpu.json")


def test_every_snippet_occurs_once_and_every_named_test_exists():
    assert mutation.problems(e2e.ROOT) == []
    assert len(mutation.MUTANTS) >= 7
    for m in mutation.MUTANTS:
        assert m.tests and any(a.startswith("tests/") for a in m.tests), m.name


def test_the_table_check_finds_what_does_not_fit(tmp_path):
    """A snippet that occurs twice or not at all, a test that does not exist, a name used twice: each reported."""
    m = mutation.MUTANTS[0]
    target = tmp_path / mutation.FILES[m.file]
    target.parent.mkdir(parents=True)
    target.write_text(m.original + "\n" + m.original + "\n")
    (tmp_path / "tests").mkdir()
    wrong = mutation.problems(str(tmp_path), [m, m])
    assert any("used twice" in w for w in wrong) and any("occurs 2 times" in w for w in wrong), wrong
    assert any("does not exist" in w for w in wrong), wrong
    target.write_text("nothing of it\n")
    assert any("occurs 0 times" in w for w in mutation.problems(str(tmp_path), [m]))


def test_a_planted_fault_is_taken_out_whatever_happens(tmp_path):
    m = mutation.MUTANTS[0]
    target = tmp_path / mutation.FILES[m.file]
    target.parent.mkdir(parents=True)
    text = "before\n" + m.original + "\nafter\n"
    target.write_text(text)
    with pytest.raises(KeyboardInterrupt):
        with mutation.planted(str(tmp_path), m):
            assert target.read_text() == text.replace(m.original, m.faulty)
            raise KeyboardInterrupt
    assert target.read_text() == text
    target.write_text(m.original * 2)  # not exactly once: nothing written
    with pytest.raises(ValueError, match="2 times"):
        with mutation.planted(str(tmp_path), m):
            pass
    assert target.read_text() == m.original * 2


def test_the_record_names_the_commit_it_copied_and_says_when_the_tree_differed(tmp_path):
    """``_commit``: HEAD's hash, marked where the copied tree has changed or untracked files (what the check reads
    at its start, before copying: a checkout that moves on during the run does not change the record)."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    assert mutation._commit(str(tmp_path)) is None  # not a checkout
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "a")
    head = git("rev-parse", "--short", "HEAD")
    assert mutation._commit(str(tmp_path)) == head
    (tmp_path / "b.py").write_text("y = 2\n")  # untracked: copied, so the tree differs
    assert mutation._commit(str(tmp_path)) == head + "+changes"


def test_the_recorded_run_covers_the_table_and_caught_every_fault():
    with open(RECORD) as f:
        record = json.load(f)
    verdicts = {r["name"]: r["verdict"] for r in record["results"]}
    assert set(verdicts) == {m.name for m in mutation.MUTANTS}, sorted(set(verdicts) ^ {m.name for m in
                                                                                       mutation.MUTANTS})
    assert all(v == "caught" for v in verdicts.values()), {n: v for n, v in verdicts.items() if v != "caught"}
    assert all(b["status"] == 0 for b in record["baseline"]), record["baseline"]


def test_an_update_merges_new_results_in_the_table_s_order_each_marked_with_its_run():
    """``--update``: the faults run later replace theirs or join the record in the table's order, each with the
    commit, start and machine of its run; a fault no longer in the table leaves; the markdown names the commit
    beside a result that ran on another."""
    a, b, c = (mutation.Mutant(n, "score", "x", "y", ("tests/t.py",), n) for n in "abc")
    result = dict(file="f", fault="f", tests=["tests/t.py"], seconds=1.0, failed=[])
    record = dict(started="s0", seconds=10, machine="m0", commit="c0", command="cmd", baseline=[{"tests": [1]}],
                  results=[dict(result, name="c", verdict="caught"), dict(result, name="gone", verdict="caught"),
                           dict(result, name="a", verdict="survived")])
    update = dict(started="s1", seconds=5, machine="m1", commit="c1", command="cmd", baseline=[{"tests": [2]}],
                  results=[dict(result, name="a", verdict="caught", failed=["tests/t.py::test_x"]),
                           dict(result, name="b", verdict="caught")])
    merged = mutation.merge(record, update, mutants=(a, b, c))
    assert [(r["name"], r["verdict"], r.get("commit")) for r in merged["results"]] == [
        ("a", "caught", "c1"), ("b", "caught", "c1"), ("c", "caught", None)]
    assert merged["results"][0]["machine"] == "m1" and merged["results"][0]["started"] == "s1"
    assert (merged["commit"], merged["started"], merged["seconds"]) == ("c0", "s0", 10)  # the full run's header
    assert merged["baseline"] == [{"tests": [1]}, {"tests": [2]}]
    assert merged["updates"] == [dict(started="s1", seconds=5, machine="m1", commit="c1", faults=["a", "b"])]
    table = mutation.markdown(merged)
    assert "Updated with `--update`: 2 fault(s) at commit c1, m1, 5 s." in table
    assert "| caught (commit c1) | 1 | test_x |" in table and "| c: f | `f` | caught | 1 |  |" in table


def test_a_fault_at_several_places_is_planted_whole_and_taken_out_whole(tmp_path):
    """``Mutant.also``: every pair planted together (a formula's reference path and its faster twin changed alike),
    the file restored after; a second snippet that does not occur once is reported by the table check and refused
    by the planting, the file untouched."""
    m = mutation.Mutant("two-sites", "score", "alpha = 1", "alpha = 2", ("tests/t.py",), "both",
                        also=(("beta = 1", "beta = 2"),))
    target = tmp_path / mutation.FILES["score"]
    target.parent.mkdir(parents=True)
    text = "alpha = 1\nx\nbeta = 1\n"
    target.write_text(text)
    with mutation.planted(str(tmp_path), m):
        assert target.read_text() == "alpha = 2\nx\nbeta = 2\n"
    assert target.read_text() == text
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("")
    assert mutation.problems(str(tmp_path), [m]) == []
    target.write_text("alpha = 1\nbeta = 1\nbeta = 1\n")
    assert mutation.problems(str(tmp_path), [m]) == ["two-sites: its snippet occurs 2 times in umst_tools/score.py, "
                                                     "not once"]
    with pytest.raises(ValueError, match="2 times"):
        with mutation.planted(str(tmp_path), m):
            pass
    assert target.read_text() == "alpha = 1\nbeta = 1\nbeta = 1\n"

