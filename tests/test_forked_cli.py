"""tests/forked_cli.py, which most tests use to run fairseq's tools: a forked run is the fresh process's run, for
every tool the server serves (fairseq-train, -generate, -interactive, -validate, -preprocess and umst-preprocess:
the same losses, checkpoint, translations, data-bin files, and the same failure), runs of a tool alternate between
string-hash seeds as fresh processes draw their own, a forked run shuts the interpreter down as a fresh one does,
a run in another environment forks from servers started in it, and only known entry points fork."""
import os
import re
import subprocess
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
    log = re.sub(r"\bin [0-9.]+s \([0-9.]+ sentences/s, [0-9.]+ tokens/s\)", "in", log)
    return re.sub(r"\b(took|in) [0-9.]+ seconds", r"\1", log)


def test_a_forked_tool_runs_as_the_fresh_process_does(toy_databin, tmp_path, monkeypatch):
    """fairseq-train (4 updates of the tiny transformer, with the plugin), then fairseq-interactive (stdin),
    fairseq-generate and fairseq-validate on its checkpoint, forked and in fresh processes: the same losses and
    checkpoint, the same translations, the same logs (times aside)."""
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

    # fairseq-generate and fairseq-validate on the same checkpoint: the same output
    generated = e2e.generate(toy_databin, ckpt, "--beam", "1")
    with monkeypatch.context() as m:
        _fresh(m)
        fresh_generated = e2e.generate(toy_databin, ckpt, "--beam", "1")
    assert e2e.hypotheses(generated) == e2e.hypotheses(fresh_generated) != []
    assert _no_times(generated) == _no_times(fresh_generated), (generated[-2000:], fresh_generated[-2000:])

    def validate():
        proc = e2e.fairseq("validate", toy_databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation",
                           "--path", ckpt, "--valid-subset", "valid", "--max-tokens", "1000")
        return proc.stdout + proc.stderr
    validated = validate()
    with monkeypatch.context() as m:
        _fresh(m)
        fresh_validated = validate()
    assert re.search(r"valid on 'valid' subset \| loss [0-9.]+", validated), validated[-2000:]
    assert _no_times(validated) == _no_times(fresh_validated), (validated[-2000:], fresh_validated[-2000:])


def test_forked_preprocessing_writes_the_fresh_process_s_files(toy_raw, tmp_path, monkeypatch):
    """fairseq-preprocess and umst-preprocess (e2e.binarize) forked and in fresh processes: the same files, byte
    for byte (the logs' mention of their own directory aside)."""
    forked, fresh = str(tmp_path / "forked"), str(tmp_path / "fresh")
    e2e.binarize(toy_raw, forked)
    assert ("script", "fairseq-preprocess") in forked_cli._servers and \
        ("module", "umst_plugin.preprocess") in forked_cli._servers
    with monkeypatch.context() as m:
        _fresh(m)
        e2e.binarize(toy_raw, fresh)
    names = sorted(os.listdir(forked))
    assert names == sorted(os.listdir(fresh)) and any(n.endswith(".wordids.bin") for n in names), names
    for name in names:
        with open(os.path.join(forked, name), "rb") as a, open(os.path.join(fresh, name), "rb") as b:
            assert a.read().replace(forked.encode(), fresh.encode()) == b.read(), name


def _failing(argv):
    return e2e.run(argv, check=False)


FAILING = {  # a command of each tool that fails, and the last line of its stderr
    "fairseq-train": (lambda databin, tmp: [os.path.join(e2e.BIN, "fairseq-train"), databin, "--user-dir", e2e.PLUGIN,
                                            "--arch", "transformer"],
                      "AssertionError: Must specify batch size either with --max-tokens or --batch-size"),
    "fairseq-generate": (lambda databin, tmp: [os.path.join(e2e.BIN, "fairseq-generate"), databin, "--path",
                                               os.path.join(tmp, "missing.pt")], "missing.pt"),
    "fairseq-interactive": (lambda databin, tmp: [os.path.join(e2e.BIN, "fairseq-interactive"), databin, "--path",
                                                  os.path.join(tmp, "missing.pt")], "missing.pt"),
    "fairseq-validate": (lambda databin, tmp: [os.path.join(e2e.BIN, "fairseq-validate"), databin, "--task",
                                               "translation", "--max-tokens", "1000", "--path",
                                               os.path.join(tmp, "missing.pt")],
                         "missing.pt"),
    "fairseq-preprocess": (lambda databin, tmp: [os.path.join(e2e.BIN, "fairseq-preprocess"), "--source-lang", "x",
                                                 "--target-lang", "y", "--trainpref", os.path.join(tmp, "none"),
                                                 "--destdir", os.path.join(tmp, "out")], "none.x"),
    "umst-preprocess": (lambda databin, tmp: [sys.executable, "-m", "umst_plugin.preprocess", "--source-lang", "x"],
                        "the following arguments are required"),
}


def test_a_failing_command_of_every_tool_fails_forked_as_in_a_fresh_process(toy_databin, tmp_path, monkeypatch):
    """One failing command per tool the server serves, forked and in a fresh process: the same status, a traceback
    in both or in neither (its frames differ: forked_cli.py says how), and the same last line of stderr, the tool's
    error."""
    for tool, (argv, last) in FAILING.items():
        command = argv(toy_databin, str(tmp_path))
        forked = _failing(command)
        assert hasattr(forked, "hash_seed"), f"{tool}: not forked"
        with monkeypatch.context() as m:
            _fresh(m)
            fresh = _failing(command)
        assert not hasattr(fresh, "hash_seed"), f"{tool}: forked, not fresh"
        assert forked.returncode == fresh.returncode != 0, (tool, forked.returncode, fresh.returncode)
        assert ("Traceback (most recent call last)" in forked.stderr) == ("Traceback (most recent call last)"
                                                                          in fresh.stderr), tool
        lines = [p.stderr.strip().splitlines()[-1] for p in (forked, fresh)]
        assert lines[0] == lines[1] and last in lines[0], (tool, lines, forked.stderr[-2000:])


PROBE = """
import os
import sys
import types


class Finalized:
    def __del__(self, write=os.write):  # (os may be gone by then: bound here)
        write(2, b"finalized at shutdown\\n")


if __name__ == "__main__":
    print(hash("umst"))
    # kept in a module of its own: finalized with the modules, when the interpreter shuts down
    state = sys.modules.setdefault("forked_cli_probe_state", types.ModuleType("forked_cli_probe_state"))
    state.kept = Finalized()
    state.unclosed = open(sys.argv[1], "w")  # never closed: its line is written when finalization closes it
    state.unclosed.write("written at shutdown\\n")
"""


def test_forked_runs_hash_and_shut_down_as_fresh_processes(tmp_path, monkeypatch):
    """A module served as umst-preprocess is (``python -m``), run three times forked and once fresh: consecutive
    forked runs hash a string with other seeds, each the hash a fresh python with that run's seed
    (``hash_seed``) gives; each forked run's interpreter shutdown finalizes what the run left (an object's
    ``__del__``, a file never closed: its buffered line written) as the fresh process's does."""
    (tmp_path / "forked_cli_probe.py").write_text(PROBE)
    entry = ("module", "forked_cli_probe")
    monkeypatch.setattr(forked_cli, "MODULES", (*forked_cli.MODULES, "forked_cli_probe"))
    env = dict(e2e.cli_env())
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]

    def command(out):
        return [sys.executable, "-m", "forked_cli_probe", str(tmp_path / out)]
    try:
        forked = [forked_cli.run(command(f"forked{i}"), env, str(tmp_path)) for i in range(3)]
    finally:
        forked_cli.stop(entry)
    fresh = subprocess.run(command("fresh"), env=env, cwd=str(tmp_path), capture_output=True, text=True)
    assert all(hasattr(p, "hash_seed") for p in forked), "not forked"
    hashes = [int(p.stdout) for p in forked]
    assert hashes[0] != hashes[1] != hashes[2], hashes
    for p, h in zip(forked, hashes):
        seeded = subprocess.run([sys.executable, "-c", "print(hash('umst'))"], capture_output=True, text=True,
                                env=dict(env, PYTHONHASHSEED=str(p.hash_seed)))
        assert h == int(seeded.stdout), (p.hash_seed, h, seeded.stdout)
    assert fresh.returncode == 0 and fresh.stderr == "finalized at shutdown\n", fresh.stderr
    assert (tmp_path / "fresh").read_text() == "written at shutdown\n"
    for i, p in enumerate(forked):
        assert p.returncode == 0 and p.stderr == fresh.stderr, p.stderr
        assert (tmp_path / f"forked{i}").read_text() == "written at shutdown\n"


def test_only_known_entry_points_fork():
    python, bin_dir = sys.executable, os.path.dirname(sys.executable)
    assert forked_cli.entry_point([os.path.join(bin_dir, "fairseq-train"), "x"], python) == ("script", "fairseq-train")
    assert forked_cli.entry_point([python, "-m", "umst_plugin.preprocess"], python) == ("module", "umst_plugin.preprocess")
    assert forked_cli.entry_point(["/usr/bin/fairseq-train"], python) is None  # another installation's
    assert forked_cli.entry_point([python, "-c", "pass"], python) is None
    assert forked_cli.entry_point([os.path.join(bin_dir, "fairseq-hydra-train")], python) is None


ENV_PROBE = """
import os
import sys

AT_IMPORT = os.environ.get("FORKED_CLI_PROBE")  # what a module reads from the environment when it is imported

if __name__ == "__main__":
    imported = sys.modules.get("forked_cli_env_probe")  # the server's import of this module, where there is one
    print(getattr(imported, "AT_IMPORT", AT_IMPORT), os.environ.get("FORKED_CLI_PROBE"))
"""


def test_a_run_in_another_environment_forks_from_servers_started_in_it(tmp_path, monkeypatch):
    """A tool's servers keep the environment they started in; a run in another environment (a test's own, or the
    test process's after torch wrote its inductor cache directory into it) ends them and forks from servers
    started in its own: forked, and a variable read at import time has the run's value, there and back."""
    (tmp_path / "forked_cli_env_probe.py").write_text(ENV_PROBE)
    entry = ("module", "forked_cli_env_probe")
    monkeypatch.setattr(forked_cli, "MODULES", (*forked_cli.MODULES, "forked_cli_env_probe"))
    env = dict(e2e.cli_env())
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    command = [sys.executable, "-m", "forked_cli_env_probe"]
    try:
        runs = [forked_cli.run(command, dict(env, FORKED_CLI_PROBE=value), str(tmp_path))
                for value in ("a", "a", "b", "a")]
    finally:
        forked_cli.stop(entry)
    assert [hasattr(p, "hash_seed") for p in runs] == [True] * 4, "not forked"
    assert [p.stdout.split() for p in runs] == [["a", "a"], ["a", "a"], ["b", "b"], ["a", "a"]], \
        [(p.stdout, p.stderr[-500:]) for p in runs]
