"""tests/forked_cli.py, which most tests use to run fairseq's tools: a forked run is the fresh process's run
(same losses, same checkpoint, same translations, same failure), and only known entry points fork."""
import os
import re
import sys

import torch

import e2e
import forked_cli


def _fresh(monkeypatch):
    monkeypatch.setenv("UMST_TEST_FRESH_PROCESSES", "1")


def _no_times(log):
    """The log without what differs between two runs of one command, clock times and speeds, and without where a
    warning is attributed (``sys:1`` in a fresh process when its stacklevel passes the script's frame; the
    forked child has frames below the script's)."""
    log = re.sub(r"^\S+:\d+: (\w+Warning)", r"\1", log, flags=re.M).replace("\n  run()\n", "\n")
    log = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| ", "", log, flags=re.M)
    log = re.sub(r"\b(wall|ups|wps|train_wall|gb_free)[ =][0-9.]+", r"\1", log)
    return re.sub(r"\b(took|in) [0-9.]+ seconds", r"\1", log)


def test_a_forked_tool_runs_as_the_fresh_process_does(toy_databin, tmp_path, monkeypatch):
    """fairseq-train (4 updates of the tiny transformer, with the plugin) and fairseq-interactive (stdin), forked
    and in fresh processes: the same losses and checkpoint, the same translations; a command that
    fails gives fairseq's error and status 1."""
    def train(save):
        return e2e.train(toy_databin, str(tmp_path / save), "transformer", *e2e.TINY, "--dropout", "0",
                         max_update=4)
    forked = train("forked")
    assert ("script", "fairseq-train") in forked_cli._servers  # it did fork (this worker's server)
    with monkeypatch.context() as m:
        _fresh(m)
        fresh = train("fresh")
    assert e2e.train_losses(forked) == e2e.train_losses(fresh) != []
    same_dir = _no_times(forked).replace(str(tmp_path / "forked"), str(tmp_path / "fresh"))
    assert same_dir == _no_times(fresh), (forked[-2000:], fresh[-2000:])
    a, b = (torch.load(tmp_path / s / "checkpoint_last.pt", weights_only=False)["model"] for s in ("forked", "fresh"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    ckpt = str(tmp_path / "forked" / "checkpoint_last.pt")
    lines = ["ein mann", "zwei hunde"]
    got = e2e.interactive(toy_databin, ckpt, lines)
    with monkeypatch.context() as m:
        _fresh(m)
        want = e2e.interactive(toy_databin, ckpt, lines)
    assert e2e.hypotheses(got) == e2e.hypotheses(want) and len(e2e.hypotheses(got)) == len(lines), (got, want)

    # a command that fails: fairseq's error, its traceback and status 1, as python gives them (the fresh
    # process's stderr ends with the same line; not run here: its imports cost what this file saves)
    failed = e2e.fairseq("train", toy_databin, "--user-dir", e2e.PLUGIN, "--arch", "transformer", check=False)
    assert failed.returncode == 1 and "Traceback (most recent call last)" in failed.stderr
    assert failed.stderr.strip().splitlines()[-1] == \
        "AssertionError: Must specify batch size either with --max-tokens or --batch-size", failed.stderr[-2000:]


def test_only_known_entry_points_fork():
    python, bin_dir = sys.executable, os.path.dirname(sys.executable)
    assert forked_cli.entry_point([os.path.join(bin_dir, "fairseq-train"), "x"], python) == ("script", "fairseq-train")
    assert forked_cli.entry_point([python, "-m", "umst_plugin.preprocess"], python) == ("module", "umst_plugin.preprocess")
    assert forked_cli.entry_point(["/usr/bin/fairseq-train"], python) is None  # another installation's
    assert forked_cli.entry_point([python, "-c", "pass"], python) is None
    assert forked_cli.entry_point([os.path.join(bin_dir, "fairseq-hydra-train")], python) is None
