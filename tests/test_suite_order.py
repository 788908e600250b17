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
