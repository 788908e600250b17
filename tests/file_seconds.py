"""Seconds each test file takes, for scheduling the suite: ``tests/file_seconds.json``.

``scripts/test.sh`` runs the files on 3 workers (``--dist loadfile``: a file's tests stay on one worker) in the
order conftest.py gives them: the longest files first (``--no-loadscope-reorder``: xdist would order them by their
number of tests, which put the longest files last, one worker running them alone at the end). Refresh the record
after a whole run:

    bash scripts/test.sh --junitxml=/tmp/suite.xml
    .venv/bin/python tests/file_seconds.py /tmp/suite.xml      # writes tests/file_seconds.json

or from the per-test log below (its wall seconds): ``tests/file_seconds.py --from-cpu-log /tmp/cpu.jsonl``.

Where the suite's CPU goes (per file and the costliest tests; conftest.py writes one line per test):

    UMST_TEST_CPU_LOG=/tmp/cpu.jsonl bash scripts/test.sh
    .venv/bin/python tests/file_seconds.py --cpu /tmp/cpu.jsonl
"""
import collections
import json
import os
import platform
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "file_seconds.json")


def from_junit(path):
    """{test file name: seconds of its tests} from a pytest junit XML report."""
    seconds = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((m for m in module if m.startswith("test_")), None)
        if name:
            seconds[name + ".py"] += float(case.get("time") or 0)
    return _longest_first(seconds)


def from_cpu_log(path):
    """{test file name: wall seconds of its tests} from a UMST_TEST_CPU_LOG file (what a junit report gives)."""
    seconds = collections.Counter()
    for record in read_cpu_log(path):
        seconds[os.path.basename(record["test"].split("::")[0])] += record["wall"]
    return _longest_first(seconds)


def _longest_first(seconds):
    return dict(sorted(((k, round(v, 1)) for k, v in seconds.items()), key=lambda kv: -kv[1]))


def read_cpu_log(path):
    """The records of a UMST_TEST_CPU_LOG file (conftest.py), one per test."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load(path=RECORD):
    try:
        with open(path) as f:
            return json.load(f)["seconds"]
    except (OSError, ValueError, KeyError):
        return {}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_report(path, top=15):
    """The CPU seconds of a UMST_TEST_CPU_LOG file: per test file, then the ``top`` costliest tests (lines)."""
    records = read_cpu_log(path)
    per_file = collections.Counter()
    for r in records:
        per_file[r["test"].split("::")[0]] += r["self"] + r["children"]
    total = sum(per_file.values())
    lines = [f"{len(records)} tests, {total:.1f} s of CPU (workers {sum(r['self'] for r in records):.1f} s, "
             f"the processes they waited for {sum(r['children'] for r in records):.1f} s)"]
    lines += [f"{s:8.1f} s  {name}" for name, s in per_file.most_common()]
    lines.append(f"the {top} costliest tests (CPU s: worker + children; wall s):")
    for r in sorted(records, key=lambda r: -(r["self"] + r["children"]))[:top]:
        cpu = f"{r['self'] + r['children']:8.1f} s  ({r['self']:.1f} + {r['children']:.1f}; wall {r['wall']:.1f})"
        lines.append(f"{cpu}  {r['test']}")
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--cpu":
        print("\n".join(cpu_report(argv[1])))
        return 0
    if len(argv) == 2 and argv[0] == "--from-cpu-log":
        seconds = from_cpu_log(argv[1])
    elif len(argv) == 1:
        seconds = from_junit(argv[0])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    with open(RECORD, "w") as f:
        json.dump({"machine": f"{cpu_name()}, {os.cpu_count()} cores", "total_seconds": round(sum(seconds.values())),
                   "seconds": seconds}, f, indent=1)
        f.write("\n")
    print(f"{RECORD}: {len(seconds)} files, {sum(seconds.values()):.0f} s of tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
