"""scripts/gpu-check.sh (benchmarks/gpu_check.py): what it reads from its steps, what it writes, and its dry run.

The dry run is what CI runs in place of a GPU: the plan, a wheelhouse for this Python (PyPI), a fresh venv that
sees only torch from this one, an install from the wheelhouse alone (--no-index), the light fairseq build, and
every planned command parsed by its own program's parser."""
import json
import os
import subprocess
import sys

import pytest

import e2e
from benchmarks import gpu_check
from umst_dev import fairseq_source

FAIRSEQ_JSON = """2026-11-26 14:41:42 | INFO | train_inner | {"epoch": 1, "loss": "11.731", "num_updates": "10", "wps": "28063.2"}
2026-11-26 14:41:43 | INFO | train | {"epoch": 1, "train_loss": "11.01", "train_num_updates": "14"}
2026-11-26 14:41:44 | INFO | train_inner | {"epoch": 2, "loss": "8.482", "num_updates": "20", "wps": "20304.3"}
"""


def test_training_losses_are_read_from_fairseq_json_logs():
    points = gpu_check.train_losses(FAIRSEQ_JSON)
    assert points == [(10, 11.731), (20, 8.482)]  # train_inner records only, not the epoch summary
    assert gpu_check.tail_mean(points, last=50) == pytest.approx((11.731 + 8.482) / 2)
    assert gpu_check.tail_mean(points, last=10) == pytest.approx(8.482)


def test_pytest_summary_line():
    assert gpu_check.pytest_summary("3 failed, 150 passed, 2 skipped in 40.1s") == \
        {"failed": 3, "passed": 150, "skipped": 2}


def _train_rows(name, points_by_precision):
    return [dict(name=name, precision=p, wps=1000.0, loss=points) for p, points in points_by_precision.items()]


def test_results_are_written_after_every_step_and_render(tmp_path):
    steady = [(u, 4.0) for u in range(5, 201, 5)]
    cut = [(u, 4.05 if u > 120 else 9.0) for u in range(5, 171, 5)]  # bf16 cut short at 170: compared there
    result = dict(started="now", device="NVIDIA H100 80GB HBM3",
                  steps=[dict(name="install", budget_s=60, what="w", status="ok", seconds=1.0),
                         dict(name="tests", budget_s=90, what="t", status="failed (rc 1)", seconds=9.0,
                              summary={"failed": 1, "passed": 3}, failures=["tests/x.py::y"],
                              failure_messages=["tests/x.py::y - AssertionError: fell back to eager"],
                              concurrent_with=["data"])],
                  env=dict(device="NVIDIA H100 80GB HBM3", torch="2.11", cuda="13.0", python="3.12", fairseq="0.12"),
                  tables={"bench-4096": "| arch | time/FLOP |\n|---|---|\n| umst_base | 1.10 |"},
                  **{"train-speed": dict(rows=_train_rows("umst", {"fp32": steady, "bf16": cut})),
                     "compile": dict(rows=_train_rows("umst_compile", {"bf16": [(u, 4.0) for u in range(5, 201, 5)]}))})
    base = gpu_check.write_results(result, str(tmp_path), start=0)
    assert base.endswith("gpu-nvidia-h100-80gb-hbm3")
    data = json.loads(open(base + ".json").read())
    assert data["train_compared_updates"] == [125, 170]
    assert data["train_loss_within_2pct"] is True and abs(data["train_loss_rel_diff"] - 0.0125) < 1e-9
    assert data["compile_compared_updates"] == [125, 170]  # eager bf16 stopped at 170
    assert data["compile_loss_within_1pct"] is False  # 4.05 against 4.0: 1.2%
    md = open(base + ".md").read()
    assert "# GPU check: NVIDIA H100 80GB HBM3" in md and "`tests/x.py::y`" in md and "1.25%" in md
    assert "* tests/x.py::y - AssertionError: fell back to eager" in md
    assert "| umst_base | 1.10 |" in md and "(beside data)" in md and "NOT within 1%" in md
    assert sorted(os.listdir(tmp_path)) == ["gpu-nvidia-h100-80gb-hbm3.json", "gpu-nvidia-h100-80gb-hbm3.md"]


def test_a_second_call_joins_the_first_report(tmp_path):
    first = dict(started="t0", device="NVIDIA H100", host_python="py", total_seconds=400.0,
                 steps=[dict(name="install", status="ok"), dict(name="bench", status="ok"),
                        dict(name="compile", status="skipped (deadline)")])
    with open(tmp_path / "gpu-nvidia-h100.json", "w") as f:
        json.dump(first, f)
    result = gpu_check.start_result(str(tmp_path), "NVIDIA H100", "py", ["install", "compile"])
    assert [s["name"] for s in result["steps"]] == ["bench"]  # install and compile are run again
    assert result["calls"][0]["only"] == ["install", "compile"] and result["total_seconds"] == 400.0
    fresh = gpu_check.start_result(str(tmp_path), "NVIDIA H100", "py")
    assert fresh["steps"] == [] and fresh["device"] == "NVIDIA H100"


def test_test_summary_comes_from_the_junit_report(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="172" failures="1" errors="0" '
                   'skipped="1"></testsuite></testsuites>')
    assert gpu_check.junit_summary(str(xml)) == {"passed": 170, "failed": 1, "skipped": 1}
    entry = {}
    gpu_check.collect("tests", entry, "170 passed, 1570 warnings in 60s\nstderr noise after the summary\n",
                      str(tmp_path / "nowhere"), {})
    assert entry["summary"] == {"passed": 170}  # no XML: the last summary line printed, not the last line


def test_the_plan_fits_the_time_a_gpu_is_lent_and_names_every_step():
    assert gpu_check.plan_wall_seconds() <= 8 * 60
    assert gpu_check.plan_wall_seconds(gpu_check.SECOND_CALL) <= 8 * 60
    commands = gpu_check.commands("python3", "/w", "/o")
    assert set(commands) == {name for name, _, _ in gpu_check.STEPS} - {"install"}
    groups = gpu_check.stages([name for name, _, _ in gpu_check.STEPS])
    assert ["data", "tests", "compile-tests", "op-counts"] in groups and groups[0] == ["install"]


def test_a_wheelhouse_without_fairseq_is_a_clear_error(tmp_path):
    with pytest.raises(fairseq_source.BuildError, match="no fairseq-fixed source archive"):
        fairseq_source.find_sdist(str(tmp_path))


def _archive(path, members):
    """A .tar.gz at ``path`` of (name, text) files; a name ending "->TARGET" is a symbolic link to TARGET."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, text in members:
            if "->" in name:
                name, target = name.split("->")
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
                continue
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.mark.parametrize("data_filter", [True, False], ids=["tarfile-data-filter", "python-without-it"])
def test_the_source_archive_unpacks_only_inside_its_destination(tmp_path, monkeypatch, data_filter):
    """unpack keeps an archive's members inside the destination: with tarfile's ``data`` filter where Python has
    it, else (Debian 12's Python 3.11.2, where ``extractall`` has no ``filter``) by refusing any member that is not
    a plain file or folder at a relative path inside, before anything is written."""
    import tarfile

    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    good = _archive(tmp_path / "fairseq_fixed-0.12.3.1.tar.gz",
                    [("fairseq_fixed-0.12.3.1/fairseq/version.txt", "0.12.3.1\n"),
                     ("fairseq_fixed-0.12.3.1/fairseq_cli/train.py", "")])
    tree = fairseq_source.unpack(good, str(tmp_path / "src"))
    assert tree == str(tmp_path / "src" / "fairseq_fixed-0.12.3.1")
    assert (tmp_path / "src" / "fairseq_fixed-0.12.3.1" / "fairseq" / "version.py").read_text() == \
        '__version__ = "0.12.3.1"\n'
    for bad in ("fairseq_fixed-0.12.3.1/../../outside.txt", "/tmp/absolute-outside.txt",
                "fairseq_fixed-0.12.3.1/fairseq/escape->../../../outside.txt"):
        sdist = _archive(tmp_path / "bad.tar.gz", [("fairseq_fixed-0.12.3.1/fairseq/version.txt", "0.12.3.1\n"),
                                                   (bad, "x")])
        dest = tmp_path / "bad-src"
        with pytest.raises((fairseq_source.BuildError, tarfile.TarError)):
            fairseq_source.unpack(sdist, str(dest))
        assert not (tmp_path / "outside.txt").exists() and not os.path.exists("/tmp/absolute-outside.txt")
        if not data_filter:  # refused before anything was written
            assert not any(dest.rglob("*")), list(dest.rglob("*"))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """bash scripts/gpu-check.sh --dry-run: its output and its work folder (the wheelhouse, the fresh venv)."""
    work = tmp_path_factory.mktemp("gpu-check") / "work"
    proc = subprocess.run(["bash", os.path.join(e2e.ROOT, "scripts", "gpu-check.sh"), "--dry-run", "--work",
                           str(work)], env={**e2e.cli_env(), "PYTHON": os.path.join(e2e.BIN, "python")},
                          cwd=e2e.ROOT, capture_output=True, text=True, timeout=1500)
    return proc, work


@pytest.mark.slow
def test_dry_run_installs_from_the_wheelhouse_alone_and_every_command_parses(dry_run):
    """What CI runs: bash scripts/gpu-check.sh --dry-run (builds a wheelhouse for this Python from PyPI)."""
    proc, _ = dry_run
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for name, _, _ in gpu_check.STEPS:
        assert f"  {name}" in out
    assert "installed from" in out and "alone (--no-index)" in out
    assert "every command parses; the fresh environment imports fairseq and the plugin" in out


@pytest.mark.slow
def test_the_speed_table_installs_from_the_wheelhouse_into_a_python_without_fairseq_and_trains(dry_run, tmp_path):
    """What a lent GPU's first call runs, on a CPU: scripts/gpu-speed.sh in a Python that has torch and nothing
    else (the dry run's fresh venv), given the wheelhouse: it installs fairseq and the plugin's needs from it
    alone, reads the arch table in a child, and its warm-up and row processes train with what it installed."""
    proc, work = dry_run
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    py = str(work / "venv" / "bin" / "python")
    assert subprocess.run([py, "-c", "import fairseq"], capture_output=True).returncode != 0  # torch alone
    out = tmp_path / "results"
    env = {k: v for k, v in e2e.cli_env().items() if k not in ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR")}
    command = ["bash", os.path.join(e2e.ROOT, "scripts", "gpu-speed.sh"), "--wheelhouse", str(work / "wheelhouse"),
               "--tiny", "--archs", "transformer", "--no-stock", "--max-tokens", "256", "--updates", "4", "--work",
               str(tmp_path / "speed"), "--out", str(out), "--commit", "abc1234"]
    run = subprocess.run(command, env=dict(env, PYTHON=py), cwd=e2e.ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert f"[speed] installed from {work / 'wheelhouse'} in " in run.stdout
    record = json.loads((out / "speed-cpu-tiny-abc1234.json").read_text())
    assert record["calls"][0]["install_s"] > 0
    rows = {(r["precision"], r["compiled"]): r for r in record["rows"] if r["name"] == "transformer"}
    assert set(rows) == {("bf16", False), ("bf16", True), ("tf32", False)}, record["rows"]
    for r in rows.values():
        assert "error" not in r and r["words_per_s"] > 0, r
    warm = record["warm_up"]["transformer 256"]
    assert warm["seconds"] > 0 and warm["losses_dropout_shifted"] and rows[("bf16", True)]["compile_s"] > 0
    # the same command again on the same machine (a lent GPU's second call): it installs into the same work folder
    # and keeps the rows done
    again = subprocess.run(command, env=dict(env, PYTHON=py), cwd=e2e.ROOT, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "3 rows kept" in again.stdout and "tokens: fairseq-train" not in again.stdout, again.stdout[-3000:]
    assert len(json.loads((out / "speed-cpu-tiny-abc1234.json").read_text())["calls"]) == 2


def test_a_step_that_runs_out_of_time_stops_its_whole_process_group(tmp_path):
    """A step's command stopped at its budget takes its children with it: on an H200 the train-speed step's
    bench_train was stopped, its fairseq-train child was not, and it went on using the GPU through the decode,
    launches and compile steps that followed (their timings then measured two jobs at once)."""
    import time

    pid_file = tmp_path / "grandchild.pid"
    child = ("import subprocess, sys, time; "
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    status, output, log = gpu_check.run_step("train-speed", 2, [[sys.executable, "-c", child]], dict(os.environ),
                                             time.time())
    assert status == "timed out after 2 s", status
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; its reaping by init can lag
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{grandchild}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):  # a zombie: killed, not yet reaped
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the step's grandchild {grandchild} is still running")


def test_a_planned_command_that_does_not_parse_is_named_and_the_others_pass(tmp_path, capsys):
    """--check-commands runs each benchmark (``python -m benchmarks WHAT``) inside its own process (one import of
    torch and fairseq for all of them): a flag a benchmark lacks fails that command alone, by name; sys.argv and
    sys.path come back."""
    bench = [sys.executable, "-m", "benchmarks"]
    cmds = {"data": [bench + ["synthetic-corpus", str(tmp_path), "--workers", "2"],
                     bench + ["synthetic-corpus", str(tmp_path), "--no-such-flag"]],
            "train-speed": [bench + ["train", "--data", str(tmp_path), "--updates", "40"],
                            bench + ["train", "--data", str(tmp_path), "--updates", "forty"]]}
    path = tmp_path / "commands.json"
    path.write_text(json.dumps(cmds))
    argv, sys_path = list(sys.argv), list(sys.path)
    assert gpu_check.check_commands(str(path)) == 1
    assert sys.argv == argv and sys.path == sys_path
    out = capsys.readouterr()
    assert out.out.count("[dry-run] parses: ") == 2, out.out
    failed = out.err.split("[dry-run] DOES NOT PARSE: ")[1:]
    assert len(failed) == 2 and "--no-such-flag" in failed[0] and "lacks ['--no-such-flag']" in failed[0], failed
    assert "--updates forty" in failed[1] and "invalid int value: 'forty'" in failed[1], failed
