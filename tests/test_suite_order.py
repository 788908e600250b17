"""The suite's schedule (tests/file_seconds.py, conftest.longest_files_first): the longest files first, each
file's tests together and in order, from a record that names only files that exist."""
import os
import types

import conftest
import file_seconds

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_record_names_existing_test_files_longest_first():
    seconds = file_seconds.load()
    assert len(seconds) >= 10 and all(os.path.exists(os.path.join(HERE, name)) for name in seconds), seconds
    assert list(seconds.values()) == sorted(seconds.values(), reverse=True)


def test_longest_files_first_keeps_each_files_tests_together_and_in_order(monkeypatch):
    monkeypatch.setattr(file_seconds, "load", lambda: {"test_slow.py": 300.0, "test_mid.py": 20.0})
    names = ["test_a.py::x", "test_mid.py::p", "test_a.py::y", "test_slow.py::q", "test_b.py::z", "test_slow.py::r",
             "test_mid.py::s"]
    items = [types.SimpleNamespace(path=types.SimpleNamespace(name=n.split("::")[0]), nodeid=n) for n in names]
    conftest.longest_files_first(items)
    assert [i.nodeid for i in items] == ["test_slow.py::q", "test_slow.py::r", "test_mid.py::p", "test_mid.py::s",
                                         "test_a.py::x", "test_a.py::y", "test_b.py::z"]


def test_seconds_per_file_from_a_junit_report(tmp_path):
    report = tmp_path / "suite.xml"
    report.write_text('<testsuites><testsuite name="pytest">'
                      '<testcase classname="tests.test_one" name="a" time="1.5"/>'
                      '<testcase classname="tests.test_two.TestGroup" name="b" time="4"/>'
                      '<testcase classname="tests.test_one" name="c" time="2.25"/>'
                      '</testsuite></testsuites>')
    assert file_seconds.from_junit(str(report)) == {"test_two.py": 4.0, "test_one.py": 3.8}


def test_seconds_per_file_from_a_cpu_log(tmp_path):
    log = tmp_path / "cpu.jsonl"
    log.write_text('{"test": "tests/test_one.py::a", "wall": 1.5, "self": 1.0, "children": 0.0}\n'
                   '{"test": "tests/test_two.py::b[x]", "wall": 4, "self": 0.1, "children": 3.0}\n\n'
                   '{"test": "tests/test_one.py::c", "wall": 2.25, "self": 2.0, "children": 0.0}\n')
    assert file_seconds.from_cpu_log(str(log)) == {"test_two.py": 4.0, "test_one.py": 3.8}


def test_the_cpu_log_gives_each_test_its_own_and_its_processes_cpu(tmp_path):
    """UMST_TEST_CPU_LOG (conftest.py): a test that computes in the worker is charged ``self``, one whose work runs in
    a process it starts and waits for is charged ``children``; ``file_seconds.py --cpu`` sums them per file."""
    import json
    import subprocess
    import sys

    (tmp_path / "test_work.py").write_text(
        "import subprocess, sys\n"
        "def test_in_the_worker():\n    sum(i * i for i in range(6_000_000))\n"
        "def test_in_a_child():\n    subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(6_000_000))'],"
        " check=True)\n")
    log = tmp_path / "cpu.jsonl"
    env = dict(os.environ, UMST_TEST_CPU_LOG=str(log), PYTHONPATH=HERE)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_work.py")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = {r["test"].split("::")[1]: r for r in map(json.loads, log.read_text().splitlines())}
    worker, child = records["test_in_the_worker"], records["test_in_a_child"]
    # the same loop, 0.32 s of CPU on an AMD EPYC (Zen 4): each charged where it ran, not where it did not
    assert worker["self"] > 0.1 and worker["children"] < 0.02, worker
    assert child["children"] > 0.1 and child["self"] < child["children"] / 2, child
    report = file_seconds.cpu_report(str(log))
    assert report[0].startswith("2 tests, ") and "test_work.py" in report[1], report
    assert any(line.endswith("test_work.py::test_in_a_child") for line in report), report
