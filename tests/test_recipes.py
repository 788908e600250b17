"""The WMT recipes on local stand-in data (the toy corpus under the WMT file names).

* Both prepare scripts run from their post-download stage (--raw-dir), twice (idempotent).
* The download stage checks the published sizes / checksums of scripts/wmt-sources.txt.
* Every configs/*.yaml composes through fairseq-hydra-train's own path, names a registered
  arch and runs 1 update with tiny overrides; the plain fairseq-hydra-train console script
  trains two argparse-style rows whose checkpoints fairseq-generate / -interactive load.
* Smoke: one row per registered architecture family trained a handful of updates, averaged
  with umst-average-checkpoints, decoded and scored (tokenized + sacreBLEU), collected into
  a markdown table; the En-Ro baseline goes through the shell scripts end to end
  (train.sh -> umst-average-checkpoints -> evaluate.sh -> collect_results.py).
"""
import argparse
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
from types import SimpleNamespace

import e2e
import recipe_toy
import slurm_cluster

ROOT = e2e.ROOT
CONFIGS = os.path.join(ROOT, "configs")
SCRIPTS = os.path.join(ROOT, "scripts")

import umst_plugin  # noqa: E402,F401  (registers the plugin's archs)
from umst_plugin import average_checkpoints  # noqa: E402
from umst_tools import collect_results, score  # noqa: E402
from umst_tools import multi30k as multi30k_table  # noqa: E402
from umst_tools.multi30k import plots as multi30k_plots  # noqa: E402

ROW_NAMES = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CONFIGS, "*.yaml")))
MERGES = 300  # toy BPE

# Tiny model overrides per model family (argparse dests of the family's add_args).
TINY = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16,
            encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
            decoder_attention_heads=2)
TINY_FAMILY = {
    # one kernel size per layer: a 1-element list would be repeated with list * n, which a hydra
    # ListConfig does not support
    "lightconv": dict(encoder_layers=2, decoder_layers=2, encoder_conv_dim=16, decoder_conv_dim=16,
                      encoder_kernel_size_list=[3, 5], decoder_kernel_size_list=[3, 5]),
    "transformer_sf": dict(fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2),
    "msc": dict(encoder_blocks=2, encoder_layers_per_block=1, decoder_layers=2),  # one decoder layer per block
}


def env():
    return e2e.recipe_env()


def sh(*cmd, check=True):
    proc = subprocess.run(list(map(str, cmd)), env=env(), capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n--- stdout\n"
                             f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc.stdout + proc.stderr


# ---- data preparation -------------------------------------------------------------------------

PREPARE = {"wmt14-en-de": ("prepare-wmt14-en-de.sh", "wmt14_en_de", "de"),
           "wmt16-en-ro": ("prepare-wmt16-en-ro.sh", "wmt16_en_ro", "ro")}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, multi30k_standin):
    """The WMT prepare scripts on toy stand-in data, run concurrently, and the Multi30k one on a few hundred lines
    of the shared raw files (spaCy parser; built once per test run, tests/conftest.py's ``multi30k_standin``:
    test_inference.py reads the same data-bin)."""
    top = tmp_path_factory.mktemp("recipes")
    jobs, out = {}, {}
    for dataset, (script, name, tgt) in PREPARE.items():
        raw, conllu, work = top / f"{dataset}-raw", top / f"{dataset}-conllu", top / f"{dataset}-work"
        kept = recipe_toy.write_toy_wmt(dataset, str(raw), str(conllu))
        cmd = ["bash", os.path.join(SCRIPTS, script), "--raw-dir", raw, "--work-dir", work, "--bpe-merges", MERGES,
               "--parser", "conllu", "--conllu-dir", conllu, "--workers", "1"]
        jobs[dataset] = (subprocess.Popen(list(map(str, cmd)), env=env(), cwd=ROOT, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True), cmd)
        out[dataset] = dict(work=str(work), databin=str(work / "data-bin" / f"{name}_bpe{MERGES}"), kept=kept,
                            tgt=tgt, cmd=cmd)
    # Multi30k: the first lines of the real raw files (toy corpus where ../shared is absent), real parser.
    assert recipe_toy.MULTI30K_MERGES == MERGES
    out["multi30k"] = dict(multi30k_standin, tgt="de")
    for dataset, (proc, cmd) in jobs.items():
        log, _ = proc.communicate()
        assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{log[-6000:]}"
        out[dataset]["log"] = log
    return out


@pytest.mark.parametrize("dataset", sorted(PREPARE))
def test_prepare_writes_databin_with_side_data_and_stats(prepared, dataset):
    p = prepared[dataset]
    tgt, db = p["tgt"], p["databin"]
    for split in ("train", "valid", "test"):
        for suffix in ("bin", "idx", "wordids.bin", "heads.bin"):
            assert os.path.exists(os.path.join(db, f"{split}.en-{tgt}.en.{suffix}")), (split, suffix)
        assert os.path.exists(os.path.join(db, f"{split}.en-{tgt}.{tgt}.bin"))
    with open(os.path.join(db, "corpus-stats.json")) as f:
        stats = json.load(f)
    # The toy's deliberately unbalanced pair is cleaned away; the CoNLL-U parses follow.
    assert stats["splits"]["train"]["sentences"] == p["kept"]
    assert stats["splits"]["test"]["sentences"] == 30
    assert stats["joined_dictionary"] > 50
    assert re.search(rf"train\s+{p['kept']} sentence pairs", p["log"]), p["log"][-2000:]
    assert "joined dictionary" in p["log"]
    for ref in ("test.tok", "test.detok"):
        assert os.path.exists(os.path.join(db, "ref", f"{ref}.{tgt}"))
    # what the test BLEU is on, for evaluate.sh's results.json (sacreBLEU's signature names no test set)
    with open(os.path.join(db, "ref", "test.set")) as f:
        assert f.read().startswith({"de": "newstest2014, the full set", "ro": "newstest2016"}[tgt])
    assert_record(p, lowercase=False, aggressive_dash_splits=True, romanian=["ro"] if tgt == "ro" else [])


def assert_record(p, lowercase, aggressive_dash_splits, romanian):
    """DATA_BIN/preprocessing.json says what the tokenize stage did, and its steps reproduce the recipe's
    tokenized and BPE'd test lines from the extracted text, on both sides (docs/inference.md)."""
    from umst_plugin import text_preprocessing as textprep

    record = textprep.read_record(p["databin"])
    assert record is not None, os.listdir(p["databin"])
    assert (record.lowercase, record.aggressive_dash_splits, record.escape, record.romanian) == \
        (lowercase, aggressive_dash_splits, True, romanian)
    assert record.tokenizer == "moses" and record.bpe == "subword_nmt" and record.bpe_merges == MERGES
    assert record.bpe_codes == os.path.join(p["databin"], "bpe.codes")
    bpe = textprep.build_bpe(record, None)
    for lang in ("en", p["tgt"]):
        prepare = record.preparer(lang)
        with open(os.path.join(p["work"], "orig", f"test.{lang}"), encoding="utf-8") as f:
            orig = f.read().splitlines()
        with open(os.path.join(p["work"], "tok", f"test.{lang}"), encoding="utf-8") as f:
            assert [prepare(line) for line in orig] == f.read().splitlines(), lang
        with open(os.path.join(p["work"], f"bpe{MERGES}", f"test.{lang}"), encoding="utf-8") as f:
            assert [bpe.encode(prepare(line)) for line in orig] == f.read().splitlines(), lang


def test_prepare_is_idempotent_and_reparses_for_another_parser(prepared):
    """A re-run skips every finished stage; changing --parser re-runs only the parse stage
    (its stamp records the parser)."""
    p = prepared["wmt14-en-de"]
    before = os.path.getmtime(os.path.join(p["databin"], "train.en-de.en.bin"))
    cmd = list(p["cmd"])
    cmd[cmd.index("--parser") + 1] = "none"
    log = sh(*cmd)
    for stage in ("extract", "tokenize", "clean", "bpe", "binarize"):
        assert re.search(rf"\] {stage}[^\n]*: done before", log), (stage, log[-3000:])
    assert "dependency side data with --parser none" in log
    assert os.path.getmtime(os.path.join(p["databin"], "train.en-de.en.bin")) == before
    with open(os.path.join(p["work"], ".stamps", f"parse{MERGES}")) as f:
        assert f.read().strip() == "none:"


# ---- Multi30k: every recipe stage on a few hundred lines of the real raw files ------------------

M30K_SPLITS = ("train", "valid", "test", "test1", "test2")


def _m30k_run(p, *extra, cmd=None):
    cmd = list(map(str, cmd or p["cmd"])) + list(extra)
    return subprocess.run(cmd, env={**env(), "MULTI30K_SOURCES": p["sources"]}, cwd=ROOT, capture_output=True,
                          text=True)


def test_multi30k_prepare_runs_every_stage(prepared):
    p = prepared["multi30k"]
    db, log, counts = p["databin"], p["log"], p["counts"]
    for line in ("download: skipped (--raw-dir", "tokenize train.en", "tokenize test2.de",
                 f"learn joint BPE, {MERGES} merges", "dependency side data with --parser spacy",
                 "no-parse variant (umst-preprocess --parser none)", "data-bin ready"):
        assert line in log, (line, log[-3000:])
    stamps = os.path.join(p["work"], ".stamps")
    for stamp, value in (("extract", "lower"), ("tokenize", "done"), ("clean", "done"), (f"bpe{MERGES}", "done"),
                         (f"binarize{MERGES}", "done"), (f"parse{MERGES}", "spacy:--parser-model en_core_web_md"),
                         (f"noparse{MERGES}", "done")):
        with open(os.path.join(stamps, stamp)) as f:
            assert f.read().strip() == value, stamp
    noparse = db + "_noparse"
    for split in M30K_SPLITS:
        for d in (db, noparse):
            for suffix in ("bin", "idx", "wordids.bin", "heads.bin"):
                assert os.path.exists(os.path.join(d, f"{split}.en-de.en.{suffix}")), (d, split, suffix)
            assert os.path.exists(os.path.join(d, f"{split}.en-de.de.bin")), (d, split)
    # the no-parse variant: the same binarized text, side data without phrase edges
    for split in M30K_SPLITS:
        with open(os.path.join(db, f"{split}.en-de.en.heads.bin"), "rb") as a, \
                open(os.path.join(noparse, f"{split}.en-de.en.heads.bin"), "rb") as b:
            assert a.read() != b.read(), split
    assert os.path.realpath(os.path.join(noparse, "train.en-de.en.bin")) == \
        os.path.realpath(os.path.join(db, "train.en-de.en.bin"))
    with open(os.path.join(db, "corpus-stats.json")) as f:
        stats = json.load(f)
    assert sorted(stats["splits"]) == sorted(M30K_SPLITS)
    # captions are kept whole: cleaning drops nothing
    assert {s: stats["splits"][s]["sentences"] for s in M30K_SPLITS} == counts
    for split in ("valid", "test", "test1", "test2"):
        for kind in ("tok", "detok"):
            with open(os.path.join(db, "ref", f"{split}.{kind}.de"), encoding="utf-8") as f:
                text = f.read()
            assert text == text.lower() and len(text.splitlines()) == counts[split], (split, kind)
    if p["origin"] == "shared":  # the real captions are cased: the lowercasing above did something
        assert any(c.isupper() for c in recipe_toy.read_gz(os.path.join(p["raw"], "test_2016_flickr.de.gz"))[0])
    assert os.path.exists(os.path.join(db, "bpe.codes"))
    assert os.path.exists(os.path.join(p["work"], "tok", "test.en"))  # the table's sample sources
    assert_record(p, lowercase=True, aggressive_dash_splits=False, romanian=[])
    # the variant's own record: the same text steps, and the parse it was made with (none), not the main one's
    from umst_plugin import text_preprocessing as textprep

    main, variant = textprep.read_record(db), textprep.read_record(noparse)
    assert (main.source_parser, main.source_parser_model) == ("spacy", "en_core_web_md")
    assert (variant.source_parser, variant.source_parser_model) == ("none", None)
    assert variant.bpe_codes_sha256 == main.bpe_codes_sha256 and variant.lowercase == main.lowercase


def test_multi30k_rerun_skips_every_stage(prepared):
    p = prepared["multi30k"]
    heads = os.path.join(p["databin"], "train.en-de.en.heads.bin")
    before = os.path.getmtime(heads), os.path.getmtime(os.path.join(p["databin"], "train.en-de.en.bin"))
    proc = _m30k_run(p)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stage in ("extract", "tokenize", "clean", rf"bpe \({MERGES} merges\)", "binarize", r"parse \(spacy\)",
                  "no-parse variant"):
        assert re.search(rf"\] {stage}: done before", proc.stderr), (stage, proc.stderr[-3000:])
    assert "tokenize train" not in proc.stderr and "learn joint BPE" not in proc.stderr
    assert (os.path.getmtime(heads), os.path.getmtime(os.path.join(p["databin"], "train.en-de.en.bin"))) == before


@pytest.mark.slow  # ~60 s on 2 loaded cores: three spaCy shard processes as Slurm jobs, then a whole prepare run
def test_the_parse_as_a_slurm_array_then_a_merge_that_parses_nothing(prepared, tmp_path):
    """docs/wmt-on-gpus.md, "The parse as a Slurm array", on Slurm itself (a local cluster, tests/slurm_cluster.py):
    prepare --parse-shards 2 stops before the parse and prints the sbatch line; that line, submitted with a throttle
    (--array=1-2%1: one task at a time), with shard 2's task failing (a planted fault: its Python exits at start),
    parses shard 1 and says which shard failed and how to parse it again; the next prepare names the missing shard
    and the sbatch line for it alone; that line parses shard 2 only (shard 1's files untouched); the prepare after it
    merges with spaCy unimportable (so it cannot parse) and finishes. The side data equal the unsharded parse's byte
    for byte."""
    p = prepared["multi30k"]
    work = tmp_path / "work"
    shutil.copytree(p["work"], work, symlinks=True)
    # the copy as it was before its parse: binarized, no side data, no parse stamp
    db = work / "data-bin" / f"multi30k_en_de_bpe{MERGES}"
    os.remove(work / ".stamps" / f"parse{MERGES}")
    shutil.rmtree(work / f"bpe{MERGES}" / "side")
    for f in glob.glob(str(db / "*.wordids.*")) + glob.glob(str(db / "*.heads.*")) + [str(db / "source-parse.json")]:
        os.remove(f)
    args = [str(a) for a in p["cmd"][2:]]
    args[args.index("--work-dir") + 1] = str(work)
    args += ["--parse-shards", "2"]
    m30k_env = {**env(), "MULTI30K_SOURCES": p["sources"]}
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "prepare-multi30k.sh"), *args], env=m30k_env, cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stopped before the parse: shard(s) 1,2 of 2 not parsed yet" in proc.stderr, proc.stderr[-3000:]
    printed = re.search(r"(sbatch --wait --array=1,2 scripts/slurm/parse-array\.sbatch multi30k .*?)\(or:", proc.stderr)
    assert printed, proc.stderr[-3000:]
    assert not glob.glob(str(db / "*.heads.*"))
    # the printed line, as a user submits it (from the repository root), with a throttle; shard 2's task fails
    line = shlex.split(printed.group(1))  # (printed with printf %q: the shell's quoting)
    assert line[:3] == ["sbatch", "--wait", "--array=1,2"] and line[3:5] == ["scripts/slurm/parse-array.sbatch",
                                                                              "multi30k"]
    fault = tmp_path / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text("import os, sys\nif os.environ.get('SLURM_ARRAY_TASK_ID') == '2':\n"
                                            "    sys.exit('planted fault: shard 2 of this test fails')\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    with slurm_cluster.cluster() as slurm:
        slurm_env = {**m30k_env, "SLURM_CONF": slurm["SLURM_CONF"]}
        submit = ["sbatch", "--wait", "--cpus-per-task=1", f"--output={logs}/%x-%A_%a.out"]
        faulty = {**slurm_env, "PYTHONPATH": f"{fault}{os.pathsep}{slurm_env['PYTHONPATH']}"}
        proc = subprocess.run(submit + ["--array=1-2%1", *line[3:]], env=faulty, cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode != 0, proc.stdout + proc.stderr  # sbatch --wait: the highest exit status of the tasks
        first = {os.path.basename(f): open(f).read() for f in glob.glob(str(logs / "*.out"))}
        (ok, ok_log), (bad, bad_log) = sorted(first.items())
        assert ok.endswith("_1.out") and "parse shard 1 of 2: done" in ok_log, first
        assert bad.endswith("_2.out") and "planted fault" in bad_log, first
        assert "parse-array.sbatch: shard 2 of 2 FAILED (exit 1" in bad_log and "--array=2" in bad_log, bad_log
        shard1 = sorted(glob.glob(str(work / f"bpe{MERGES}" / "side" / "*shard1of2*")))
        assert shard1 and not glob.glob(str(work / f"bpe{MERGES}" / "side" / "*2of2.done"))
        kept = {f: os.path.getmtime(f) for f in shard1}
        # the prepare run after the array: the missing shard and the line for it
        proc = subprocess.run(["bash", os.path.join(SCRIPTS, "prepare-multi30k.sh"), *args], env=m30k_env,
                              cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "stopped before the parse: shard(s) 2 of 2 not parsed yet" in proc.stderr, proc.stderr[-3000:]
        again = re.search(r"(sbatch --wait --array=2 scripts/slurm/parse-array\.sbatch multi30k .*?)\(or:",
                          proc.stderr).group(1)
        again = shlex.split(again)
        proc = subprocess.run(submit + again[2:], env=slurm_env, cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    second = sorted(set(glob.glob(str(logs / "*.out"))) - {str(logs / name) for name in first})
    assert len(second) == 1 and second[0].endswith("_2.out"), second  # shard 2 only
    assert "parse shard 2 of 2: done" in open(second[0]).read()
    assert {f: os.path.getmtime(f) for f in shard1} == kept  # shard 1 not parsed again
    # the merge run cannot parse: importing spaCy fails in it
    blocker = tmp_path / "no-spacy"
    (blocker / "spacy").mkdir(parents=True)
    (blocker / "spacy" / "__init__.py").write_text("raise ImportError('the merge run must not parse')\n")
    merge_env = {**m30k_env, "PYTHONPATH": f"{blocker}{os.pathsep}{m30k_env['PYTHONPATH']}"}
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "prepare-multi30k.sh"), *args[:-2]], env=merge_env,
                          cwd=ROOT, capture_output=True, text=True)  # without --parse-shards: the shards are found
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "merging the 2 parse shards" in proc.stderr and "data-bin ready" in proc.stderr, proc.stderr[-3000:]
    for split in M30K_SPLITS:
        for name in (f"{split}.en-de.en.heads.bin", f"{split}.en-de.en.heads.idx", f"{split}.en-de.en.wordids.bin"):
            with open(db / name, "rb") as a, open(os.path.join(p["databin"], name), "rb") as b:
                assert a.read() == b.read(), name
        for kind in ("heads", "labels", "wordids"):
            name = os.path.join(f"bpe{MERGES}", "side", f"{split}.en.{kind}")
            with open(work / name, "rb") as a, open(os.path.join(p["work"], name), "rb") as b:
                assert a.read() == b.read(), name
    with open(db / "preprocessing.json", encoding="utf-8") as f:
        assert json.load(f)["source_parse"] == {"parser": "spacy", "model": "en_core_web_md",
                                                "written_by": "umst-preprocess"}
    # stamped with the parser, as an unsharded parse is: a re-run skips the stage
    assert (work / ".stamps" / f"parse{MERGES}").read_text() == "spacy:--parser-model en_core_web_md\n"


def test_multi30k_cased_on_a_lowercased_work_dir_stops(prepared):
    p = prepared["multi30k"]
    stamps = os.path.join(p["work"], ".stamps")
    before = {n: open(os.path.join(stamps, n)).read() for n in os.listdir(stamps)}
    proc = _m30k_run(p, "--cased")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"{p['work']} was prepared with case 'lower', not 'cased'" in proc.stderr, proc.stderr[-3000:]
    assert {n: open(os.path.join(stamps, n)).read() for n in os.listdir(stamps)} == before
    assert not glob.glob(os.path.join(p["work"], "data-bin", "multi30k_en_de_cased*"))


def test_multi30k_table_runner_end_to_end(prepared, tmp_path):
    """scripts/multi30k_table.py on the stand-in data-bin: 2 rows (one on the no-parse variant), 1 seed,
    2 updates, averaged, the three test sets decoded and scored, the table written into a docs page;
    a second run reuses the trainings and decodes; --close-seeds then adds seed 2 to the close rows."""
    p = prepared["multi30k"]
    docs = tmp_path / "page.md"
    docs.write_text(f"# page\n\n{multi30k_table.MARK_BEGIN}\nold table\n{multi30k_table.MARK_END}\n\ntail\n")
    rows = ["m30k-transformer", "m30k-umst-noparse"]
    tiny = tiny_overrides("umst_base")  # same model flags for transformer and umst_base
    assert tiny == tiny_overrides("transformer")
    cmd = [sys.executable, os.path.join(SCRIPTS, "multi30k_table.py"), "--data", p["databin"], "--rows",
           ",".join(rows), "--seeds", "1", "--max-update", "2", "--save-every", "1", "--average", "2",
           "--max-tokens", "1000", "--cpu", "--jobs", "2", "--threads", "1", "--beam", "2",
           "--out", tmp_path / "runs", "--docs", docs, "--status-every", "5",
           "dataset.data_buffer_size=0", *tiny]  # validation on: the table reads its perplexity
    def run_table():
        proc = subprocess.run(list(map(str, cmd)), env=env(), capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:  # show the runner's log and the end of every run's logs
            logs = "".join(f"\n--- {f}\n" + open(f, errors="replace").read()[-3000:]
                           for f in sorted(glob.glob(str(tmp_path / "runs" / "*" / "seed1" / "*.log"))))
            raise AssertionError(f"multi30k_table.py failed ({proc.returncode})\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-3000:]}{logs}")
        return proc.stdout + proc.stderr

    def run_table_with(*extra):
        cmd.extend(extra)
        try:
            return run_table()
        finally:
            del cmd[-len(extra):]

    log = run_table()
    table = (tmp_path / "runs" / "table.md").read_text()
    for row in rows:
        line = next((x for x in table.splitlines() if f"(`{row}`)" in x), None)
        assert line, table
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert re.fullmatch(r"0\.\d\dM", cells[1]), line  # params of the tiny model
        for cell in cells[2:6]:  # three tokenized BLEU columns and sacreBLEU
            assert re.fullmatch(r"\d+\.\d\d", cell), line
        assert re.fullmatch(r"\d+\.\d\d", cells[6]), line  # hypothesis / reference length
        assert re.fullmatch(r"\d+\.\d\d", cells[7]), line  # validation perplexity of the last validation
        assert re.fullmatch(r"\d+\.\d min", cells[8]), line  # CPU time (recorded for every segment: no †)
        assert ("41.02" in cells[9]) == (row == "m30k-transformer"), line
        for subset in ("test", "test1", "test2"):
            with open(tmp_path / "runs" / row / "seed1" / f"eval-{subset}" / "results.json") as f:
                assert json.load(f)["sentences"] == p["counts"][subset]
    assert "sacreBLEU signature: `nrefs:1|case:mixed" in table
    assert "| train CPU time / run |" in table and "†" not in table
    with open(tmp_path / "runs" / "runs.json") as f:  # the same numbers per seed, machine-readable
        runs = json.load(f)
    assert runs["budget"]["max_update"] == 2 and [(r["row"], r["seed"]) for r in runs["runs"]] == [(r, 1) for r in rows]
    for r in runs["runs"]:
        with open(tmp_path / "runs" / r["row"] / "seed1" / "eval-test1" / "results.json") as f:
            assert r["bleu"]["test1"] == json.load(f)["tok_bleu"]
        assert r["parameters"] > 0 and r["valid_ppl"] > 1 and r["train_wall_s"] > 0
        assert r["valid_curve"][-1] == [2, r["valid_ppl"]]  # the curve the picture draws ends at the table's ppl
    assert (tmp_path / "runs" / "valid-ppl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the curves picture
    for i in range(5):
        assert f"**{i}.** source: " in table and "source: ?" not in table
    assert table.count("UMST, `--parser none` (no phrase edges): ") == 5, table
    assert table.startswith("Budget: 2 updates of 1000 tokens per row and seed (reference: 8,000 x 8,192), lr 5e-3 "
                            "(the configs'), "), table.splitlines()[0]  # less than an epoch: no epoch count
    assert "with 1 thread(s) each, glibc malloc with mmap off (--malloc reuse); hardware:" in table
    page = docs.read_text()
    picture = "\n![Validation perplexity against updates, every run of this table](img/multi30k-table-valid-ppl.png)\n"
    assert (docs.parent / "img" / "multi30k-table-valid-ppl.png").read_bytes() == \
        (tmp_path / "runs" / "valid-ppl.png").read_bytes()  # the block's picture, beside the page
    assert page == f"# page\n\n{multi30k_table.MARK_BEGIN}\n{table}{picture}{multi30k_table.MARK_END}\n\ntail\n"
    assert "trained before" not in log
    again = run_table()
    for row in rows:
        assert f"{row} seed 1: trained before" in again, again[-3000:]
    assert "training started" not in again
    assert (tmp_path / "runs" / "table.md").read_text() == table
    # --curve-every: BLEU of the average ending at every N-th update, and its (captioned) picture
    curved = run_table_with("--table-only", "--curve-every", "2", "--rows", rows[0])  # one row: decodes cost
    for row in rows[:1]:
        with open(tmp_path / "runs" / row / "seed1" / "budget-curve.json") as f:
            [point] = json.load(f)
        assert point["update"] == 2 and 0 <= point["valid"] <= 100 and 0 <= point["test"] <= 100, point
        assert f"{row} seed 1: average of 2 ending at update 2: valid BLEU " in curved, curved[-3000:]
    assert (tmp_path / "runs" / "bleu-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --archive: a finished run's logs, scores and hypotheses (no checkpoint, no per-token scores) are kept
    # outside OUT; a runner that lost OUT (a fresh machine) takes them as done and writes the same table
    archive = tmp_path / "archive"
    assert "archived to" in run_table_with("--archive", archive)
    for row in rows:
        kept = archive / row / "seed1"
        assert not list(kept.rglob("*.pt")) and (kept / "train.log").read_text() == \
            (tmp_path / "runs" / row / "seed1" / "train.log").read_text()
        gen = (kept / "eval-test" / "generate-test.txt").read_text()
        full = (tmp_path / "runs" / row / "seed1" / "eval-test" / "generate-test.txt").read_text()
        assert [x for x in full.splitlines(True) if not x.startswith(("S-", "D-", "P-"))] == gen.splitlines(True)
        assert "H-0\t" in gen and "T-0\t" in gen and "\nP-0\t" in full and "\nS-0\t" in full
    shutil.rmtree(tmp_path / "runs")
    restored = run_table_with("--archive", archive)
    for row in rows:
        assert f"{row} seed 1: restored from {archive / row / 'seed1'}" in restored, restored[-3000:]
    assert "training started" not in restored and "archived to" not in restored
    assert (tmp_path / "runs" / "table.md").read_text() == table
    archived_log = archive / rows[0] / "seed1" / "train.log"
    original = archived_log.read_text()
    archived_log.write_text(original.replace("common.seed=1", "common.seed=7"))  # other settings: stop
    shutil.rmtree(tmp_path / "runs")
    proc = subprocess.run(list(map(str, cmd + ["--archive", archive])), env=env(), capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode != 0 and "was trained with other settings: ['common.seed=1', 'common.seed=7']" \
        in proc.stderr, proc.stderr[-2000:]
    archived_log.write_text(original)
    assert "training started" not in run_table_with("--archive", archive)
    assert (tmp_path / "runs" / "table.md").read_text() == table
    # --table-only --docs-block NAME: a second table on the same page, the first block untouched
    begin, end = multi30k_table.markers("longer")
    docs.write_text(page + f"\n{begin}\nold\n{end}\n")
    cmd += ["--table-only", "--docs-block", "longer"]
    assert "training started" not in run_table()
    assert docs.read_text() == page + f"\n{begin}\n{table}{picture.replace('-table-', '-longer-')}{end}\n"
    docs.write_text(page)  # no such block: a clear error, the page unchanged
    proc = subprocess.run(list(map(str, cmd)), env=env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and f"no {begin} ... {end} markers" in proc.stderr, proc.stderr[-2000:]
    assert docs.read_text() == page

    # --close-seeds: the main rows within --close-within of the pre-norm transformer (all, at 100 BLEU; not
    # the parse ablations) train seed 2 after seed 1, the pre-norm row with them; every row's cells, time
    # ratio and significance cover its seeds
    cmd = [c for c in cmd[:cmd.index("--table-only")] if c != "--docs-block"]
    cmd[cmd.index("--rows") + 1] = f"m30k-transformer,{multi30k_table.BASELINE},m30k-umst-noparse"
    cmd[cmd.index("--docs") + 1] = tmp_path / "unused.md"
    (tmp_path / "unused.md").write_text(f"{multi30k_table.MARK_BEGIN}\n{multi30k_table.MARK_END}\n")
    cmd += ["--close-seeds", "2", "--close-within", "100", "--significance", "--bootstrap-samples", "20"]
    log = run_table()
    assert f"within 100 BLEU of {multi30k_table.BASELINE} on 2016 Flickr: m30k-transformer, " \
        f"{multi30k_table.BASELINE}: seeds 2 too" in log, log[-3000:]
    assert "m30k-transformer seed 1: trained before" in log and "m30k-transformer seed 2: training started" in log
    assert "m30k-umst-noparse seed 2" not in log
    table = (tmp_path / "runs" / "table.md").read_text()
    assert "seeds 1 (and 2 for the main rows within 100 BLEU of the pre-norm transformer" in table, table
    cells = {row: next(x for x in table.splitlines() if f"(`{row}`)" in x).split("|") for row in cmd[
        cmd.index("--rows") + 1].split(",")}
    line = "|".join(cells["m30k-transformer"])
    assert " ± " in cells["m30k-transformer"][3] and "seeds)" not in line, line
    assert re.search(r"s1 [+-]\d.* / \**s2 [+-]\d", line), line
    assert re.fullmatch(r" \d+\.\d min \(\d+\.\d\dx\) ", cells["m30k-transformer"][9]), line
    assert cells[multi30k_table.BASELINE][9].endswith(" (1.00x) ") and cells[multi30k_table.BASELINE][11] == " baseline "
    assert " ± " not in cells["m30k-umst-noparse"][3] and re.fullmatch(r" s1 [+-]\d\S* \(p=\S+\) ",
                                                                       cells["m30k-umst-noparse"][11].replace("*", ""))


def test_table_only_skips_a_decoding_another_runner_is_writing(tmp_path):
    """--table-only beside a running runner: a test decoding without its results.json is still being
    written (here: cut off mid-file) and is neither read nor an error."""
    data, out = tmp_path / "data-bin", tmp_path / "runs"
    data.mkdir()
    partial = out / multi30k_table.BASELINE / "seed1" / "eval-test"
    partial.mkdir(parents=True)
    (partial / "generate-test.txt").write_text("S-3\tx\nH-3\t-0.1\tein mann\n")  # ids not 0..N-1
    assert multi30k_table.main(["--data", str(data), "--rows", multi30k_table.BASELINE, "--seeds", "1",
                                "--out", str(out), "--table-only"]) == 0
    assert "(0 of 1 seeds)" in (out / "table.md").read_text()


def test_budget_line_counts_epochs_from_the_training_log(tmp_path):
    save = tmp_path / multi30k_table.BASELINE / "seed1"
    save.mkdir(parents=True)
    args = SimpleNamespace(out=str(tmp_path))
    summary = "[2026-11-23 01:05:30,438][train][INFO] - epoch 001 | loss 9.248 | num_updates 2 | lr 0.0035\n"
    (save / "train.log").write_text(summary)  # the budget stopped epoch 1: its length is unknown
    assert multi30k_table.updates_per_epoch(args, [multi30k_table.BASELINE], [1]) is None
    (save / "train.log").write_text(summary + "[2026-11-23 01:05:31,000][fairseq.trainer][INFO] - begin training epoch 2\n")
    assert multi30k_table.updates_per_epoch(args, [multi30k_table.BASELINE], [1]) == 2
    (save / "train.log").write_text("[...][train_inner][INFO] - epoch 031:    150 / 240 loss=3.51, num_updates=7350\n")
    assert multi30k_table.updates_per_epoch(args, [multi30k_table.BASELINE], [1]) == 240


def test_progress_line_gives_each_trainings_pace_and_when_the_queue_is_done(tmp_path):
    """The pace is the current process's (a resumed one counts from the checkpoint it loaded, not from
    the killed process's later updates); the queue's estimate adds the waiting runs' updates left."""
    import datetime
    import time

    def stamp(t):
        return datetime.datetime.fromtimestamp(t).strftime("[%Y-%m-%d %H:%M:%S,000]")

    t0 = time.mktime((2026, 11, 24, 2, 0, 0, 0, 0, -1))
    run = tmp_path / "m30k-umst" / "seed1"
    run.mkdir(parents=True)
    (run / "train.log").write_text(
        f"{multi30k_table.SEGMENT_HEADER}2026-11-24T01:00:00 runner pid 1: cmd\n"
        f"{stamp(t0 - 3000)}[train_inner][INFO] - epoch 017: loss=3.9, num_updates=4025\n"  # killed after 3840
        f"{multi30k_table.SEGMENT_HEADER}{datetime.datetime.fromtimestamp(t0):%Y-%m-%dT%H:%M:%S} runner pid 2: cmd\n"
        f"{stamp(t0 + 20)}[fairseq.trainer][INFO] - Loaded checkpoint x (epoch 17 @ 3840 updates)\n"
        f"{stamp(t0 + 100)}[train_inner][INFO] - epoch 017: loss=3.8, num_updates=3890\n")
    waiting = tmp_path / "m30k-msc" / "seed1"  # killed at 600 updates; m30k-prime seed 1 never started
    waiting.mkdir(parents=True)
    (waiting / "train.log").write_text(f"{stamp(t0)}[train_inner][INFO] - epoch 003: loss=5.1, num_updates=600\n")
    args = SimpleNamespace(out=str(tmp_path), max_update=4090, jobs=2)
    line = multi30k_table.progress_line(args, {("m30k-umst", 1): t0}, [("m30k-msc", 1), ("m30k-prime", 1)],
                                        now=t0 + 100)
    # 50 updates in 100 s: 2.00 s/update, 200 updates left: 400 s from 02:01:40
    assert line.startswith("training: m30k-umst/s1 3890/4090 loss 3.8 (100s, 2.00 s/update, done ~02:08);"), line
    # (200 + 3490 + 4090) updates at 2 s/update, 2 at a time: 7,780 s
    assert line.endswith("; 2 waiting (all done in about 2.2 h at 2.00 s/update, 2 at a time)"), line
    # a process that has not logged an update yet: no pace, no estimate
    (run / "train.log").write_text(f"{multi30k_table.SEGMENT_HEADER}2026-11-24T02:00:00 runner pid 3: cmd\n")
    assert multi30k_table.progress_line(args, {("m30k-umst", 1): t0}, [("m30k-msc", 1)], now=t0 + 30) == \
        "training: m30k-umst/s1 0/4090 loss None (30s); 1 waiting"
    # nor a resumed one: its checkpoint's update, and no loss yet (not the killed process's 3.9 at 4025)
    (run / "train.log").write_text(
        f"{multi30k_table.SEGMENT_HEADER}2026-11-24T01:00:00 runner pid 1: cmd\n"
        f"{stamp(t0 - 3000)}[train_inner][INFO] - epoch 017: loss=3.9, num_updates=4025\n"
        f"{multi30k_table.SEGMENT_HEADER}{datetime.datetime.fromtimestamp(t0):%Y-%m-%dT%H:%M:%S} runner pid 4: cmd\n"
        f"{stamp(t0 + 20)}[fairseq.trainer][INFO] - Loaded checkpoint x (epoch 17 @ 3840 updates)\n")
    assert multi30k_table.progress_line(args, {("m30k-umst", 1): t0}, [], now=t0 + 30) == \
        "training: m30k-umst/s1 3840/4090 loss None (30s)"
    # a process paused for 20 minutes (SIGSTOP, or a heavy neighbour) then back at 0.5 s/update: the pace is
    # its last 10 minutes', not the whole process's 1.25 s/update that would put its finish hours late
    lines = [f"{multi30k_table.SEGMENT_HEADER}{datetime.datetime.fromtimestamp(t0):%Y-%m-%dT%H:%M:%S} runner pid 5: cmd\n",
             f"{stamp(t0 + 60)}[train_inner][INFO] - epoch 001: loss=9.0, num_updates=100\n"]
    lines += [f"{stamp(t0 + 1260 + 60 * i)}[train_inner][INFO] - epoch 001: loss=8.0, num_updates={100 + 120 * i}\n"
              for i in range(1, 16)]  # paused from t0 + 60 to t0 + 1260; then 120 updates a minute
    (run / "train.log").write_text("".join(lines))
    line = multi30k_table.progress_line(args, {("m30k-umst", 1): t0}, [], now=t0 + 2160)
    assert line == "training: m30k-umst/s1 1900/4090 loss 8.0 (36 min, 0.50 s/update, done ~02:54)", line
    segment = multi30k_table.training_segments(str(run / "train.log"))[-1]
    assert multi30k_table.recent_pace(segment, window=1e6) == 2160 / 1900  # younger than the window: all of it


def test_close_rows_get_more_seeds_with_the_baseline_once_every_run_is_decoded():
    base = multi30k_table.BASELINE
    args = SimpleNamespace(close_seeds=[3], close_within=1.0)
    bleu = {base: (40.0, 41.0), "m30k-umst": (39.4, 40.6), "m30k-msc": (39.0, 40.0), "m30k-prime": (42.6, 41.0),
            "m30k-umst-noparse": (40.0, 41.0)}
    results = {(r, s + 1): {"bleu": {"test": b[s]}} for r, b in bleu.items() for s in range(2)}
    rows = list(bleu)
    # UMST's mean is 0.5 under, Prime's 1.3 over, MSC's exactly 1.0 under: within means |difference| <= 1;
    # the parse ablation (level with the baseline) keeps its two seeds
    assert multi30k_table.close_rows(args, rows, [1, 2], results) == [base, "m30k-umst", "m30k-msc"]
    assert multi30k_table.close_rows(args, rows[1:], [1, 2], results) == []  # no baseline, nothing to be close to
    del results["m30k-prime", 2]["bleu"]["test"]  # a run not decoded yet: not decided yet
    assert multi30k_table.close_rows(args, rows, [1, 2], results) == []
    assert multi30k_table.close_rows(SimpleNamespace(close_seeds=[], close_within=1.0), rows, [1, 2], results) == []


def test_runner_reads_a_trainings_cpu_time_while_it_runs_and_when_it_ends():
    """reap(): CPU seconds so far of a running training (/proc), the exact user + system time and the exit
    code of a finished one (wait4), whatever the wall clock did meanwhile (here: it slept)."""
    import time

    busy = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
            "print('asleep', flush=True)\ntime.sleep(float(sys.argv[1]))\nsys.exit(3)")
    proc = subprocess.Popen([sys.executable, "-c", busy, "1.5"], stdout=subprocess.PIPE, text=True)
    # Busy 0.4 CPU s (plus start-up), then asleep: wait for it to say so, not for a wall-clock guess that a
    # loaded machine (two trainings beside the suite) overruns.
    assert proc.stdout.readline() == "asleep\n"
    returncode, so_far = multi30k_table.reap(proc)
    assert returncode is None and 0.35 <= so_far < 0.9, so_far
    while returncode is None:
        time.sleep(0.05)
        returncode, cpu = multi30k_table.reap(proc)
    assert returncode == 3 == proc.returncode and so_far <= cpu < 0.9, (so_far, cpu)
    assert multi30k_table.process_cpu_seconds(proc.pid) is None  # gone
    proc.stdout.close()


def test_valid_curves_picture_zooms_on_the_second_half(tmp_path):
    """The validation-curve picture: every run on a log scale, and the second half of training on a linear
    scale, where converged runs differ by tenths of perplexity (the runs' own points, nothing earlier); a
    caption under the legend names the command, budget, seeds, precision and the runs' machines."""
    pytest.importorskip("matplotlib")
    base, umst = multi30k_table.BASELINE, "m30k-umst"
    args = SimpleNamespace(max_update=1000, max_tokens=2048, override=["optimization.lr=[0.0025]"], warmup=150,
                           fp16=False, bf16=True, hardware=None)
    curve = lambda end: [(u, 300.0 / u + end) for u in range(100, 1001, 100)]  # noqa: E731
    results = {(base, 1): {"valid_curve": curve(5.0), "machine": "CPU A"},
               (base, 2): {"valid_curve": curve(5.2), "machine": "CPU B"},
               (umst, 1): {"valid_curve": curve(5.4), "machine": "CPU A"},
               (umst, 2): {"valid_curve": [], "machine": "CPU C"}}  # seed 2 not validated yet: not drawn
    fig = multi30k_table.valid_curves_figure(args, [base, umst], {base: [1, 2], umst: [1, 2]}, results)
    whole, late = fig.axes
    assert whole.get_yscale() == "log" and late.get_yscale() == "linear"
    assert [line.get_label() for line in whole.get_lines()] == [
        "Transformer-tiny (pre-norm) seed 1", "Transformer-tiny (pre-norm) seed 2", "UMST seed 1"]
    assert [list(line.get_xdata()) for line in late.get_lines()] == [list(range(500, 1001, 100))] * 3
    assert late.get_xlim()[0] == 500 and late.get_ylim()[1] < 6.1  # the zoom: 5.0-6.0, not 8-300
    assert [line.get_linestyle() for line in whole.get_lines()] == ["-", "--", "-"]  # style: seed
    assert whole.get_lines()[0].get_color() != whole.get_lines()[2].get_color()  # colour: row
    assert whole.get_legend() is None and len(fig.legends) == 1  # one legend, for the figure
    fig.canvas.draw()
    box = fig.legends[0].get_window_extent()
    assert all(box.y1 < ax.get_tightbbox().y0 for ax in (whole, late))  # below both panels, labels too
    [caption] = fig.texts
    assert caption.get_text() == ("scripts/multi30k_table.py: 1000 updates of 2048 tokens, lr 0.0025, warm-up 150, "
                                  "bf16, seeds 1,2 (1 solid, 2 dashed);\nhardware: CPU A and CPU B")
    assert caption.get_window_extent().y1 < box.y0  # under the legend, inside the figure
    assert caption.get_window_extent().y0 >= 0
    args.hardware = "1 NVIDIA H100"  # --hardware names it, as it does in the table
    [caption] = multi30k_table.valid_curves_figure(args, [base], {base: [1]}, results).texts
    assert caption.get_text().endswith("seeds 1 (1 solid);\nhardware: 1 NVIDIA H100")
    args.hardware = None
    assert multi30k_table.plot_valid_curves(args, [base, umst], {base: [1, 2], umst: [1, 2]}, results,
                                            str(tmp_path / "v.png"))
    assert (tmp_path / "v.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    noparse = "m30k-umst-noparse"  # a label with markdown code in the table: plain text in the picture
    fig = multi30k_table.valid_curves_figure(args, [noparse], {noparse: [1]}, {(noparse, 1): {"valid_curve": curve(5)}})
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["UMST, --parser none (no phrase edges)"]
    empty = {(base, 1): {"valid_curve": []}}
    assert multi30k_table.valid_curves_figure(args, [base], {base: [1]}, empty) is None
    assert not multi30k_table.plot_valid_curves(args, [base], {base: [1]}, empty, str(tmp_path / "none.png"))
    assert not (tmp_path / "none.png").exists()


def test_budget_curve_picture_and_missing_matplotlib(tmp_path, monkeypatch):
    """bleu-curve.png (the budget search's picture) is written from the runs' points; without matplotlib,
    an optional extra, neither picture is drawn and the runner says why instead of failing."""
    pytest.importorskip("matplotlib")
    args = SimpleNamespace(max_update=7200, max_tokens=2048, average=5, override=[], warmup=1500, fp16=False,
                           bf16=False)
    curves = {("m30k-transformer", 1): [dict(update=u, valid=30 + u / 1000, test=29 + u / 1000)
                                        for u in (2400, 4800, 7200)]}
    assert multi30k_table.plot_budget_curves(args, curves, str(tmp_path / "b.png"), "CPU A")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # captioned as the validation curves are; a long hardware line wraps inside the figure, under the plot
    hardware = "2-core AMD EPYC (Zen 3, AVX2), shared with a second training and other jobs, " * 3
    fig = multi30k_table.budget_curves_figure(args, curves, hardware.strip())
    [caption] = fig.texts
    lines = caption.get_text().split("\n")
    assert lines[0] == ("scripts/multi30k_table.py: 7200 updates of 2048 tokens, lr 5e-3 (the configs'), "
                        "warm-up 1500, fp32, seeds 1 (valid solid, test dashed);")
    assert len(lines) == 3 and " ".join(lines[1:]) == "hardware: " + hardware.strip()
    fig.canvas.draw()
    box, width = caption.get_window_extent(), fig.bbox.width
    assert 0 <= box.x0 and box.x1 <= width and 0 <= box.y0 and box.y1 < fig.axes[0].get_tightbbox().y0
    said = []
    monkeypatch.setattr(multi30k_plots, "log", said.append)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert not multi30k_table.plot_budget_curves(args, curves, str(tmp_path / "none.png"), "CPU A")
    base = multi30k_table.BASELINE
    assert multi30k_table.valid_curves_figure(SimpleNamespace(max_update=10, max_tokens=8), [base], {base: [1]},
                                              {(base, 1): {"valid_curve": [(5, 9.0)]}}) is None
    assert not (tmp_path / "none.png").exists()
    assert said == ["matplotlib is not installed: no bleu-curve.png (pip install matplotlib)",
                    "matplotlib is not installed: no valid-ppl.png (pip install matplotlib)"]


def test_redraw_draws_a_tables_picture_from_what_its_runner_wrote(tmp_path, monkeypatch):
    """--redraw draws a picture again, captioned, from a runs.json or a budget-curve record alone (here the
    records docs/ keeps, whose runs are gone): the budget, precision and hardware come from the file."""
    pytest.importorskip("matplotlib")
    results = os.path.join(ROOT, "docs", "results")
    figures = []
    for name in ("valid_curves_figure", "budget_curves_figure"):  # keep what the real functions drew
        draw = getattr(multi30k_plots, name)
        monkeypatch.setattr(multi30k_plots, name, lambda *a, draw=draw: figures.append(draw(*a)) or figures[-1])
    out = tmp_path / "redrawn"
    assert multi30k_table.main(["--redraw", os.path.join(results, "multi30k-cpu-1000x2048.json"),
                                "--out", str(out)]) == 0  # no --data: nothing is trained or decoded
    assert (out / "valid-ppl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [caption] = figures[-1].texts
    assert caption.get_text() == ("scripts/multi30k_table.py: 1000 updates of 2048 tokens, lr 0.0025, warm-up 250, "
                                  "fp32, seeds 1,2 (1 solid, 2 dashed);\nhardware: 2-core x86-64 CPU")
    with open(os.path.join(results, "multi30k-cpu-1000x2048.json")) as f:
        validated = [run for run in json.load(f)["runs"] if run.get("valid_curve")]
    assert len(figures[-1].axes[0].get_lines()) == len(validated) == 12  # every run that logged validation
    gcn = os.path.join(results, "umst-phrase-gcn-forms-400x2048.json")
    assert multi30k_table.main(["--redraw", gcn + ":eq3", "--out", str(out), "--hardware", "1 NVIDIA H100"]) == 0
    [caption] = figures[-1].texts
    assert caption.get_text().startswith("scripts/multi30k_table.py +model.phrase_gcn_form=eq3: 400 updates of "
                                         "2048 tokens, lr 0.0025, warm-up 100, fp32, seeds 1,2")  # the GCN form too
    assert caption.get_text().endswith("\nhardware: 1 NVIDIA H100")  # --hardware overrides the file's
    assert multi30k_table.main(["--redraw", os.path.join(results, "multi30k-converged-budget-postnorm.json"),
                                "--out", str(out)]) == 0
    assert (out / "bleu-curve.png").exists()
    [caption] = figures[-1].texts
    assert caption.get_text().startswith("scripts/multi30k_table.py: 14400 updates of 2048 tokens, lr 0.0025, "
                                         "warm-up 1500, fp32, seeds 1 (valid solid, test dashed);\n"
                                         "hardware: 2-core AMD EPYC (Zen 3, AVX2)")
    with pytest.raises(SystemExit, match=r"umst-phrase-gcn-forms-400x2048.json: expected a runs.json .* found the "
                                         r"keys 'eq3', 'authors'; pick a record with .*:KEY, KEY one of eq3, authors"):
        multi30k_table.main(["--redraw", gcn, "--out", str(out)])
    with pytest.raises(SystemExit, match=r"no record 'eq4' to redraw; it holds 'eq3', 'authors'"):
        multi30k_table.main(["--redraw", gcn + ":eq4", "--out", str(out)])
    (tmp_path / "old.json").write_text(json.dumps({"budget": {"max_update": 400}, "runs": []}))
    with pytest.raises(SystemExit, match=r"old.json: its budget lacks max_tokens, average, fp16, bf16, override, "
                                         r"warmup_updates \(a runs.json of the runner has them all\)"):
        multi30k_table.main(["--redraw", str(tmp_path / "old.json"), "--out", str(out)])
    with pytest.raises(SystemExit) as exit_:
        multi30k_table.main(["--out", str(out)])  # neither --data nor --redraw: the usual argparse error
    assert exit_.value.code == 2


def test_table_gives_cpu_time_and_marks_wall_time_standing_in_for_it(tmp_path):
    """The time column on the CPU: CPU time per update over the segments the runner recorded, times the
    budget, over the runs that recorded it; wall time, marked †, only for a row none of whose runs did."""
    data, out = tmp_path / "data-bin", tmp_path / "runs"
    data.mkdir()
    base = multi30k_table.BASELINE
    old, new = out / base / "seed1", out / base / "seed2"
    for save in (old, new):
        save.mkdir(parents=True)
        (save / "train-done.json").write_text(json.dumps(dict(max_update=100, wall_s=6000.0)))
    inner = "[2026-11-23 01:{:02d}:00,000][train_inner][INFO] - epoch 001:  1 / 9 loss=3.1, num_updates={}\n"
    (new / "train.log").write_text(  # killed at 40 (its CPU time unrecorded), resumed from 30 to 100
        "# started 2026-11-23T01:00:00 runner pid 1: x\n" + inner.format(1, 40)
        + "# started 2026-11-23T01:10:00 runner pid 2: x\n"
        + "[2026-11-23 01:10:05,000][fairseq.checkpoint_utils][INFO] - Loaded checkpoint x (epoch 4 @ 30 updates)\n"
        + inner.format(30, 100))
    multi30k_table.record_cpu_time(str(new), "2026-11-23T01:10:00", 1400.0)  # 70 updates: 20 s each
    assert multi30k_table.training_cpu_time(str(new), 100) == (2000.0, 70)
    assert multi30k_table.training_cpu_time(str(old), 100) == (None, 0)
    assert multi30k_table.main(["--data", str(data), "--rows", base, "--seeds", "1,2", "--max-update", "100",
                                "--out", str(out), "--cpu", "--table-only"]) == 0
    table = (out / "table.md").read_text()
    assert "| train CPU time / run |" in table
    assert "| 33.3 min (1.00x) |" in table and "†" not in table, table  # seed 2's CPU time; not seed 1's wall time
    os.remove(new / multi30k_table.CPU_TIME)
    assert multi30k_table.main(["--data", str(data), "--rows", base, "--seeds", "1,2", "--max-update", "100",
                                "--out", str(out), "--cpu", "--table-only"]) == 0
    table = (out / "table.md").read_text()
    assert "| 100.0 min (1.00x) † |" in table, table  # no CPU time: the mean wall time, marked
    assert "\n†: wall time, no run of the row recorded CPU time" in table
    multi30k_table.record_cpu_time(str(new), "2026-11-23T01:10:00", 1400.0)
    multi30k_table.record_cpu_time(str(old), "2026-11-23T00:00:00", 100.0)  # no such segment in its log
    (old / "train.log").write_text("# started 2026-11-23T00:00:01 runner pid 1: x\n" + inner.format(1, 100))
    multi30k_table.record_cpu_time(str(old), "2026-11-23T00:00:01", 3000.0)
    assert multi30k_table.main(["--data", str(data), "--rows", base, "--seeds", "1,2", "--max-update", "100",
                                "--out", str(out), "--cpu", "--table-only"]) == 0
    table = (out / "table.md").read_text()
    assert "| 41.7 min (1.00x) |" in table and "†" not in table, table
    assert "different machines" not in table
    # runs trained on different CPUs: the table says which ran where (their time ratios compare the CPUs too)
    for save, machine in ((old, "CPU A, AVX2, 2 cores"), (new, "CPU B, AVX-512, 2 cores")):
        (save / "train-done.json").write_text(json.dumps(dict(max_update=100, wall_s=6000.0, machine=machine)))
    assert multi30k_table.main(["--data", str(data), "--rows", base, "--seeds", "1,2", "--max-update", "100",
                                "--out", str(out), "--cpu", "--table-only"]) == 0
    assert (f"\nTrained on different machines: CPU A, AVX2, 2 cores: `{base}` s1; "
            f"CPU B, AVX-512, 2 cores: `{base}` s2. The time column is each run's time over the pre-norm "
            "transformer's on the same machine") in (out / "table.md").read_text()
    assert "; hardware: several machines, listed below the table. " in (out / "table.md").read_text()
    # a time ratio divides by the pre-norm run of the same CPU only (here 3000 s on A, 2000 s on B)
    other = "m30k-umst"
    for seed, machine, cpu_s in ((1, "CPU B, AVX-512, 2 cores", 2200.0), (2, "CPU B, AVX-512, 2 cores", 2200.0),
                                 (3, "CPU C, 2 cores", 1000.0)):
        save = out / other / f"seed{seed}"
        save.mkdir(parents=True)
        (save / "train-done.json").write_text(json.dumps(dict(max_update=100, wall_s=6000.0, machine=machine)))
        (save / "train.log").write_text("# started 2026-11-23T00:00:01 runner pid 1: x\n" + inner.format(1, 100))
        multi30k_table.record_cpu_time(str(save), "2026-11-23T00:00:01", cpu_s)
    def time_cell(seeds):
        assert multi30k_table.main(["--data", str(data), "--rows", f"{base},{other}", "--seeds", seeds,
                                    "--max-update", "100", "--out", str(out), "--cpu", "--table-only"]) == 0
        return next(line for line in (out / "table.md").read_text().splitlines()
                    if line.startswith("| UMST (")).split(" | ")[-2]
    # several machines: the per-machine ratio alone (minutes of different CPUs do not average)
    assert time_cell("1,2") == "1.10x"  # 2200 / 2000 on B; not 2200 / 2500, the mean over A and B
    # seeds 1 and 3: the baseline's seed 1 ran on A, the row's on B and C, where no baseline ran
    assert time_cell("1,3") == "– (no pre-norm run on its machine)"
    (new / "train-done.json").write_text(json.dumps(dict(max_update=100, wall_s=6000.0, machine="CPU A, AVX2, 2 cores")))
    assert multi30k_table.main(["--data", str(data), "--rows", base, "--seeds", "1,2", "--max-update", "100",
                                "--out", str(out), "--cpu", "--table-only"]) == 0
    table = (out / "table.md").read_text()  # one machine: the budget line names it
    assert "; hardware: CPU A, AVX2, 2 cores. " in table and "different machines" not in table
    assert re.fullmatch(r".+ \(family \d+, model \d+\)(, (AMX|AVX-512|AVX2))?, \d+ cores|[^(]+, \d+ cores",
                        multi30k_table.this_machine())


def test_multi30k_runner_resumes_a_killed_training_and_averages_the_final_model(prepared, tmp_path):
    """kill -9 of the runner mid-training kills its training too; a re-run resumes from checkpoint_last.pt
    and finishes at the budget, read from the whole log. The budget ends on an epoch boundary, where
    fairseq writes no update checkpoint: the average must still end at the final model (checkpoint_last.pt).
    A later shorter budget is answered by the longer run's saved models."""
    import signal
    import time

    p = prepared["multi30k"]
    out = tmp_path / "runs"
    save = out / multi30k_table.BASELINE / "seed1"
    train_log = save / "train.log"

    def cmd(max_update):
        return [sys.executable, os.path.join(SCRIPTS, "multi30k_table.py"), "--data", p["databin"], "--rows",
                multi30k_table.BASELINE, "--seeds", "1", "--max-update", str(max_update), "--save-every", "1",
                "--keep", "0", "--warmup", "4", "--average", "3", "--max-tokens", "300", "--cpu", "--threads", "1",
                "--beam", "1", "--out", out, "--status-every", "5", "dataset.data_buffer_size=0",
                "common.log_interval=1", *tiny_overrides("transformer")]

    # 1. start a long budget, kill -9 the runner right after the first epoch ends
    runner = subprocess.Popen(list(map(str, cmd(1000))), env=env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    epoch = None
    while epoch is None and time.time() < deadline and runner.poll() is None:
        time.sleep(0.2)
        if train_log.exists():
            epoch = re.search(r"end of epoch 1 \(average epoch stats below\)\n.*?num_updates (\d+)",
                              train_log.read_text(errors="replace"), re.S)
    assert epoch, f"no epoch end in time\n{train_log.read_text(errors='replace')[-3000:] if train_log.exists() else ''}"
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    per_epoch = int(epoch.group(1))
    budget = 2 * per_epoch  # ends on the second epoch's boundary
    for _ in range(50):  # the training dies with its runner (PR_SET_PDEATHSIG)
        if str(save) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the training outlived its killed runner")
    killed_at = multi30k_table.last_update(str(train_log))[0]
    assert per_epoch <= killed_at < budget, (per_epoch, killed_at)
    assert not (save / "train-done.json").exists()
    # the kill as it can land (and did in CI): in fairseq's non-atomic copy of a save to checkpoint_last.pt
    last = save / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:last.stat().st_size // 3])

    # 2. re-run with the two-epoch budget: resumes, finishes at the budget, the final model averaged
    proc = subprocess.run(list(map(str, cmd(budget))), env=env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"removed checkpoint_last.pt \(truncated .*\n.*checkpoint_last.pt rebuilt from checkpoint",
                     proc.stdout), proc.stdout[-3000:]
    assert "training resumed from checkpoint_last.pt" in proc.stdout, proc.stdout[-3000:]
    text = train_log.read_text(errors="replace")
    assert text.count(multi30k_table.SEGMENT_HEADER) == 2
    assert re.search(r"\(epoch 2 @ \d+ updates", text)  # fairseq loaded checkpoint_last.pt
    assert multi30k_table.last_update(str(train_log))[0] == budget
    segments = multi30k_table.training_segments(str(train_log))
    assert [s["to_update"] for s in segments] == [killed_at, budget] and segments[1]["from_update"] <= killed_at
    assert not (save / f"checkpoint_{2}_{budget}.pt").exists()  # fairseq's epoch-boundary gap
    with open(save / "checkpoint_avg3.json") as f:
        averaged = json.load(f)
    assert averaged == [dict(update=budget - 2, file=f"checkpoint_2_{budget - 2}.pt"),
                        dict(update=budget - 1, file=f"checkpoint_2_{budget - 1}.pt"),
                        dict(update=budget, file="checkpoint_last.pt")]
    with open(out / "runs.json") as f:
        run = json.load(f)["runs"][0]
    validated = [u for u, _ in run["valid_curve"]]  # fairseq validates at every save: both segments' points
    assert per_epoch in validated and validated[-1] == budget and min(validated) < killed_at
    assert run["train_wall_s"] > 0 and set(run["bleu"]) == {"test", "test1", "test2"}
    with open(save / multi30k_table.CPU_TIME) as f:  # the resumed segment's CPU time, recorded at its end
        assert json.load(f)[segments[1]["started"]] > 0
    # measured over the resumed segment, and the killed one if a progress line recorded it (redone updates too)
    assert run["train_cpu_s"] > 0 and run["train_cpu_measured_updates"] in (
        budget - segments[1]["from_update"], budget - segments[1]["from_update"] + killed_at)

    # 3. a shorter budget is the longer run's prefix: no training, its saved models up to that update
    proc = subprocess.run(list(map(str, cmd(budget - 1))), env=env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"trained to update {budget} before" in proc.stdout and "training started" not in proc.stdout
    with open(save / "checkpoint_avg3.json") as f:
        assert [a["update"] for a in json.load(f)] == [budget - 3, budget - 2, budget - 1]
    # ... but not with other settings
    other = list(map(str, cmd(budget - 2)))
    other[other.index("--warmup") + 1] = "5"
    proc = subprocess.run(other, env=env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "trained past --max-update" in proc.stderr and "warmup_updates" in proc.stderr
    # ... and a longer budget continues the training only with its settings
    other[other.index("--max-update") + 1] = str(budget + 1)
    proc = subprocess.run(other, env=env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "was trained with other settings" in proc.stderr, proc.stderr[-2000:]
    assert multi30k_table.last_update(str(train_log))[0] == budget


def test_runner_repairs_checkpoints_a_kill_cut_short(tmp_path):
    """fairseq copies a save's first file to checkpoint_last.pt (and checkpoint_E_U.pt, checkpoint_best.pt)
    non-atomically: a kill mid-copy leaves a truncated file that fairseq's next start dies on (EOFError,
    seen in CI). Before a resume the runner removes every truncated checkpoint and leftover .tmp and rebuilds
    checkpoint_last.pt from the newest whole checkpoint; whole files are left alone."""
    def save_at(name, updates, cut=False):
        path = tmp_path / name
        torch.save({"optimizer_history": [{"num_updates": updates}], "model": {"w": torch.full((256,), updates)}},
                   path)
        if cut:
            data = path.read_bytes()
            path.write_bytes(data[:len(data) // 2])
        return path

    whole = {n: save_at(n, u).read_bytes() for n, u in [("checkpoint1.pt", 40), ("checkpoint_2_60.pt", 60),
                                                        ("checkpoint2.pt", 80)]}
    save_at("checkpoint_2_80.pt", 80, cut=True)  # the kill: copying update 80's save to its other names
    save_at("checkpoint_best.pt", 80, cut=True)
    save_at("checkpoint_last.pt", 80, cut=True)
    (tmp_path / "checkpoint3.pt.tmp").write_bytes(b"PK")
    (tmp_path / "train.log").write_text("x\n")
    done = multi30k_table.repair_checkpoints(str(tmp_path))
    assert "checkpoint_last.pt rebuilt from checkpoint2.pt (update 80)" in done, done
    assert sum("truncated" in d for d in done) == 3 and any("checkpoint3.pt.tmp" in d for d in done), done
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*whole, "checkpoint_last.pt", "train.log"])
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == whole["checkpoint2.pt"]
    assert all((tmp_path / n).read_bytes() == b for n, b in whole.items())
    assert multi30k_table.models_to_average(str(tmp_path), 3, 80)[-1][0] == 80  # the average works again
    # a missing checkpoint_last.pt (killed before the copy began) is rebuilt from the newest by update count
    (tmp_path / "checkpoint_last.pt").unlink()
    (tmp_path / "checkpoint2.pt").unlink()
    assert multi30k_table.repair_checkpoints(str(tmp_path)) == [
        "checkpoint_last.pt rebuilt from checkpoint_2_60.pt (update 60)"]
    # whole files: nothing to do; an empty (new) run directory: nothing to do
    assert multi30k_table.repair_checkpoints(str(tmp_path)) == []
    (tmp_path / "new").mkdir()
    assert multi30k_table.repair_checkpoints(str(tmp_path / "new")) == []


def test_runner_writes_its_files_whole_or_not_at_all(tmp_path):
    """train-done.json, params.json, checkpoint_avgN.json, runs.json, cpu-time.json, table.md and the docs
    page: a write that stops half-way (here at a character UTF-8 cannot encode, after the file was opened;
    on the machine, a kill) leaves the old file, readable, and no .tmp behind."""
    path = str(tmp_path / "train-done.json")
    multi30k_table.write_json(path, {"max_update": 80})
    with pytest.raises(UnicodeEncodeError):
        multi30k_table.write_file(path, '{"max_update": 160, "note": "\ud800"}')
    with pytest.raises(TypeError):
        multi30k_table.write_json(path, {"max_update": 160, "wall_s": object()})
    assert multi30k_table.read_json(path) == {"max_update": 80}
    assert os.listdir(tmp_path) == ["train-done.json"]
    multi30k_table.write_json(path, {"max_update": 160}, indent=1)
    assert multi30k_table.read_json(path) == {"max_update": 160}


def _write_generate(path, hyps):
    path.write_text("".join(f"S-{i}\tx\nT-{i}\tx\nH-{i}\t-0.1\t{h}\n" for i, h in enumerate(hyps)))
    return str(path)


def test_runner_trainings_reuse_freed_memory_on_the_cpu(monkeypatch):
    """The runner's subprocesses on the CPU keep freed memory for reuse (glibc mmap off): warm training
    steps with a Multi30k-sized output layer (1,750 target tokens x 10,000 types: 70 MB logits) mostly
    fault no fresh pages in; with --malloc system every step faults its logits and their gradient in again."""
    probe = ("import resource, torch\n"
             "torch.set_num_threads(1)\n"
             "w = torch.randn(10000, 128, requires_grad=True)\n"
             "x = torch.randn(1750, 128, requires_grad=True)\n"
             "for step in range(20):\n"
             "    if step == 12:  # warm: the heap has grown to the working set\n"
             "        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
             "    torch.log_softmax(x @ w.t(), -1)[:, 0].sum().backward()\n"
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    for key in multi30k_table.REUSE_FREED_MEMORY:
        monkeypatch.delenv(key, raising=False)
    faults = {}
    for malloc in ("reuse", "system"):
        args = SimpleNamespace(cpu=True, malloc=malloc, threads=1)
        env = multi30k_table.subprocess_env(args)
        assert env["OMP_NUM_THREADS"] == "1" and multi30k_table.ROOT in env["PYTHONPATH"]
        faults[malloc] = int(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                            check=True).stdout)
    # 8 warm steps: with mmap off most reuse the heap, with the system's malloc each faults its logits and their
    # gradient in again (measured 8 x 68,000 pages). The heap reaches its size after 2-18 steps (10 runs on an
    # Intel Xeon, 17,090 pages per late step): 0-34,179 pages faulted in steps 12-19, where steps 4-11 gave up to
    # 102,539 here and 119,630 in a whole-suite run (over the bound below, 109,600)
    assert faults["system"] > 8 * 30000, faults
    assert faults["reuse"] * 5 < faults["system"], faults
    gpu = multi30k_table.subprocess_env(SimpleNamespace(cpu=False, malloc="reuse", threads=0))
    assert "MALLOC_MMAP_MAX_" not in gpu


def test_paired_bootstrap_against_the_baseline(tmp_path):
    """sacreBLEU's paired bootstrap on tokenized BLEU: two systems that each garble a different sixth of
    the sentences are level (no difference, p well above 0.05); the reference itself beats a system that
    garbles every sentence with p < 0.05."""
    refs = [f"ein hund läuft {i} mal durch den schnee ." for i in range(60)]
    ref = tmp_path / "ref.tok.de"
    ref.write_text("\n".join(refs) + "\n")
    garbled = [f"eine katze sitzt {i} auf dem tisch" for i in range(60)]
    one = [garbled[i] if i % 6 == 0 else r for i, r in enumerate(refs)]
    other = [garbled[i] if i % 6 == 3 else r for i, r in enumerate(refs)]
    diff, p = multi30k_table.paired_bootstrap(_write_generate(tmp_path / "one.txt", one),
                                              _write_generate(tmp_path / "other.txt", other), str(ref), 200)
    assert diff == 0 and p > 0.2
    diff, p = multi30k_table.paired_bootstrap(_write_generate(tmp_path / "garbled.txt", garbled),
                                              _write_generate(tmp_path / "good.txt", refs), str(ref), 200)
    assert diff > 50 and p < 0.05
    sig = {("m30k-umst", 1): (1.234, 0.01), ("m30k-umst", 2): (-0.5, 0.3)}
    assert multi30k_table.significance_cell("m30k-umst", [1, 2], sig) == "**s1 +1.23 (p=0.010)** / s2 -0.50 (p=0.300)"
    assert multi30k_table.significance_cell("m30k-umst", [1, 3], sig).endswith(" / s3 –")
    assert multi30k_table.significance_cell(multi30k_table.BASELINE, [1, 2], sig) == "baseline"
    # identical outputs: sacreBLEU gives p = 1 / (samples + 1); no difference is never bold
    assert multi30k_table.significance_cell("m30k-umst", [1], {("m30k-umst", 1): (0.0, 0.001)}) == "s1 +0.00 (p=0.001)"
    assert multi30k_table.significance_cell("m30k-umst", [1], {("m30k-umst", 1): (-0.0, 0.4)}) == "s1 +0.00 (p=0.400)"
    # significant means p < 0.05: p = 0.05 itself is not bold
    assert multi30k_table.significance_cell("m30k-umst", [1], {("m30k-umst", 1): (0.8, 0.05)}) == "s1 +0.80 (p=0.050)"


def test_paired_bootstrap_scores_tokenized_text_without_the_detokenize_warning(tmp_path, caplog):
    """The table's BLEU is tokenized on purpose: sacreBLEU's "forgot to detokenize" warning (100 hypotheses ending
    in " .") would be wrong under it."""
    refs = [f"ein hund läuft {i} mal durch den schnee ." for i in range(120)]
    ref = tmp_path / "ref.tok.de"
    ref.write_text("\n".join(refs) + "\n")
    system = _write_generate(tmp_path / "system.txt", refs)
    with caplog.at_level("WARNING"):
        assert multi30k_table.paired_bootstrap(system, system, str(ref), 20)[0] == 0
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]


def test_table_compares_the_ablation_pairs_directly(tmp_path):
    """--significance with --compare (default: UMST against its parse ablations, Prime against Prime-simple):
    a line per pair whose rows are both in the table, per seed both decoded, first row minus second; a bad
    pair is a clear argparse error."""
    data, out = tmp_path / "data-bin", tmp_path / "runs"
    (data / "ref").mkdir(parents=True)
    (tmp_path / "data-bin_noparse").mkdir()  # the no-parse row's data-bin must exist
    refs = [f"ein hund läuft {i} mal durch den schnee ." for i in range(60)]
    (data / "ref" / "test.tok.de").write_text("\n".join(refs) + "\n")
    garbled = [f"eine katze sitzt {i} auf dem tisch" for i in range(60)]
    outputs = {multi30k_table.BASELINE: refs, "m30k-umst": refs,  # UMST: the references; no-parse garbles half
               "m30k-umst-noparse": [garbled[i] if i % 2 else r for i, r in enumerate(refs)]}
    for row, hyps in outputs.items():
        for seed in (1, 2) if row != "m30k-umst-noparse" else (1,):
            decoded = out / row / f"seed{seed}" / "eval-test"
            decoded.mkdir(parents=True)
            _write_generate(decoded / "generate-test.txt", hyps)
            (decoded / "results.json").write_text(json.dumps({"tok_bleu": 50.0}))
    argv = ["--data", str(data), "--rows", ",".join(outputs), "--seeds", "1,2", "--out", str(out), "--table-only",
            "--significance", "--bootstrap-samples", "50"]
    assert multi30k_table.main(argv) == 0
    table = (out / "table.md").read_text()
    line = next(x for x in table.splitlines() if x.startswith("- UMST (`m30k-umst`) minus "))
    assert re.fullmatch(r"- UMST \(`m30k-umst`\) minus UMST, `--parser none` \(no phrase edges\) "
                        r"\(`m30k-umst-noparse`\): \*\*s1 \+\d+\.\d\d \(p=0\.0\d\d\)\*\* / s2 –", line), line
    assert table.count("\n- ") == 1  # the other default pairs lack a row of this table
    assert multi30k_table.main(argv + ["--compare", ""]) == 0
    assert "Paired comparisons" not in (out / "table.md").read_text()
    assert multi30k_table.main(argv + ["--compare", "m30k-umst-noparse:m30k-umst"]) == 0
    assert "\n- UMST, `--parser none` (no phrase edges) (`m30k-umst-noparse`) minus UMST (`m30k-umst`): **s1 -" \
        in (out / "table.md").read_text()
    for bad in ("m30k-umst", "m30k-umst:m30k-umst", "m30k-umst:nope"):
        with pytest.raises(SystemExit):
            multi30k_table.main(argv + ["--compare", bad])


def test_archive_trims_only_the_generate_files(tmp_path):
    """archive_run drops the S-/D-/P- lines of fairseq-generate's output and nothing of the detokenized
    hypotheses, whose lines may begin the same way in cased text ("S-Bahn ..."): one line per sentence. The
    test references and tokenized sources go beside the runs (a table rebuilt from the archive reads them)."""
    data = tmp_path / "work" / "data-bin" / "bpe"
    (data / "ref").mkdir(parents=True)
    (data / "ref" / "test.tok.de").write_text("die s-bahn\n")
    (tmp_path / "work" / "tok").mkdir()
    (tmp_path / "work" / "tok" / "test.en").write_text("the train\n")
    args = SimpleNamespace(out=str(tmp_path / "runs"), archive=str(tmp_path / "archive"), average=5, data=str(data))
    save = tmp_path / "runs" / "m30k-umst" / "seed1"
    for subset, _ in multi30k_table.TEST_SETS:
        (save / f"eval-{subset}").mkdir(parents=True)
        (save / f"eval-{subset}" / "results.json").write_text("{}")
        (save / f"eval-{subset}" / f"generate-{subset}.txt").write_text(
            "S-0\tthe train\nT-0\tdie s-bahn\nH-0\t-0.1\tdie s-bahn\nD-0\t-0.1\tDie S-Bahn\nP-0\t-0.1\n")
        (save / f"eval-{subset}" / "hyp.detok.txt").write_text("S-Bahn fährt .\nD-Zug hält .\n")
    (save / "params.json").write_text('{"parameters": 1}')
    (save / "train-done.json").write_text('{"max_update": 10}')
    multi30k_table.archive_run(args, "m30k-umst", 1)
    kept = tmp_path / "archive" / "m30k-umst" / "seed1" / "eval-test1"
    assert (kept / "hyp.detok.txt").read_text() == "S-Bahn fährt .\nD-Zug hält .\n"
    assert (kept / "generate-test1.txt").read_text() == "T-0\tdie s-bahn\nH-0\t-0.1\tdie s-bahn\n"
    assert (tmp_path / "archive" / "ref" / "test.tok.de").read_text() == "die s-bahn\n"
    assert (tmp_path / "archive" / "tok" / "test.en").read_text() == "the train\n"


def test_archive_cut_off_mid_copy_is_not_taken_for_finished(tmp_path, monkeypatch):
    """Every archived file is written atomically, results.json last: a copy that dies on the last file
    (a kill, a full disk) leaves no half-written file and an archive that does not count as finished, so
    the next archive_run copies it again; a re-archived run's old results.json files go first."""
    args = SimpleNamespace(out=str(tmp_path / "runs"), archive=str(tmp_path / "archive"), average=5, data=None)
    save, dest = (tmp_path / d / "m30k-umst" / "seed1" for d in ("runs", "archive"))
    for subset, _ in multi30k_table.TEST_SETS:
        (save / f"eval-{subset}").mkdir(parents=True)
        (save / f"eval-{subset}" / "results.json").write_text('{"tok_bleu": 40.0}')
        (save / f"eval-{subset}" / f"generate-{subset}.txt").write_text("T-0\tein hund\nH-0\t-0.1\tein hund\n")
    (save / "params.json").write_text('{"parameters": 1}')
    (save / "train-done.json").write_text('{"max_update": 10}')
    last = os.path.join(str(dest), "eval-" + multi30k_table.TEST_SETS[-1][0], "results.json")
    real_replace = os.replace

    def dies_on_last(src, dst):
        if dst == last:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(multi30k_table.os, "replace", dies_on_last)
    with pytest.raises(OSError):
        multi30k_table.archive_run(args, "m30k-umst", 1)
    assert not os.path.exists(last) and not os.path.exists(last + ".tmp")
    assert not multi30k_table.evaluated(str(dest))
    monkeypatch.setattr(multi30k_table.os, "replace", real_replace)
    multi30k_table.archive_run(args, "m30k-umst", 1)
    assert multi30k_table.evaluated(str(dest)) and json.loads(open(last).read()) == {"tok_bleu": 40.0}
    # Re-trained (train-done.json differs): dying on the last file again leaves no old results.json to trust.
    (save / "train-done.json").write_text('{"max_update": 20}')
    monkeypatch.setattr(multi30k_table.os, "replace", dies_on_last)
    with pytest.raises(OSError):
        multi30k_table.archive_run(args, "m30k-umst", 1)
    assert not multi30k_table.evaluated(str(dest))


def _fake_archive(path, member):
    import tarfile
    import zipfile

    src = path.parent / "payload.txt"
    src.write_text("toy\n")
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path, "w") as z:
            z.write(src, member)
    else:
        with tarfile.open(path, "w:gz") as t:
            t.add(src, member)


def _download(dataset, raw, mirror, sources=None):
    e = {**env(), "WMT_MIRROR": f"file://{mirror}"}
    if sources:
        e["WMT_SOURCES"] = str(sources)
    return subprocess.run(["bash", os.path.join(SCRIPTS, "download-wmt.sh"), dataset, str(raw)], env=e,
                          capture_output=True, text=True)


def _sha256(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_stage_verifies_published_checksums(tmp_path):
    """Through a file:// mirror holding stand-in archives: the published size (tfds) and md5
    (sacrebleu) reject them, and a rejected archive is not extracted; SETIMES, the one archive
    without a published checksum, has its sha256 recorded on first download and enforced after."""
    mirror, raw = tmp_path / "mirror", tmp_path / "raw"
    mirror.mkdir()
    for name in ("training-parallel-ep-v8.tgz", "SETIMES.en-ro.txt.zip", "wmt16-dev.tgz", "wmt16-test.tgz"):
        _fake_archive(mirror / name, f"fake/{name}.txt")
    proc = _download("wmt16-en-ro", raw, mirror)
    assert proc.returncode == 1, proc.stderr
    size = (mirror / "training-parallel-ep-v8.tgz").stat().st_size
    assert f"training-parallel-ep-v8.tgz has {size} bytes, expected 225018324" in proc.stderr
    assert "wmt16-dev.tgz: md5" in proc.stderr and "expected 4a3dc2760bb077f4308cce96b06e6af6" in proc.stderr
    assert "FAILED verification: training-parallel-ep-v8.tgz wmt16-dev.tgz wmt16-test.tgz" in proc.stderr
    assert not (raw / "fake" / "training-parallel-ep-v8.tgz.txt").exists()  # rejected: not extracted
    recorded = (raw / "CHECKSUMS.recorded").read_text()
    assert recorded == f"SETIMES.en-ro.txt.zip sha256:{_sha256(raw / 'SETIMES.en-ro.txt.zip')}\n"
    assert (raw / "fake" / "SETIMES.en-ro.txt.zip.txt").exists()  # recorded, then extracted
    # A changed archive no longer matches what the first download recorded.
    _fake_archive(raw / "SETIMES.en-ro.txt.zip", "fake/other.txt")
    proc = _download("wmt16-en-ro", raw, mirror)
    assert proc.returncode == 1 and "SETIMES.en-ro.txt.zip has sha256:" in proc.stderr, proc.stderr


def test_download_stage_accepts_matching_size_and_sha256(tmp_path):
    """The size + sha256 path with values that match (a sources list for the stand-in archive),
    then a same-size archive with another sha256."""
    mirror, raw = tmp_path / "mirror", tmp_path / "raw"
    mirror.mkdir()
    archive = mirror / "corpus.tgz"
    _fake_archive(archive, "fake/corpus.txt")
    sources = tmp_path / "sources.txt"
    line = f"toy corpus.tgz https://example.invalid/corpus.tgz sha256:{_sha256(archive)} {archive.stat().st_size} test"
    sources.write_text("# test list\n" + line + "\n")
    proc = _download("toy", raw, mirror, sources)
    assert proc.returncode == 0, proc.stderr
    assert (raw / "fake" / "corpus.txt").exists() and not (raw / "CHECKSUMS.recorded").read_text()
    assert _download("toy", raw, mirror, sources).stdout.count("extracting") == 0  # idempotent
    wrong = line.replace(f"sha256:{_sha256(archive)}", "sha256:" + "0" * 64)
    sources.write_text(wrong + "\n")
    proc = _download("toy", tmp_path / "raw2", mirror, sources)
    assert proc.returncode == 1 and f"corpus.tgz: sha256 {_sha256(archive)}, expected {'0' * 64}" in proc.stderr


def test_download_without_network_says_what_to_do(tmp_path):
    """An archive that cannot be fetched (a host that does not resolve: curl's exit 6, what a node without
    internet gets) stops the download stage with the reason and the offline way: the archives of
    wmt-sources.txt fetched elsewhere, or --raw-dir; no partial file is left."""
    sources = tmp_path / "sources.txt"
    sources.write_text("toy corpus.tgz https://host.invalid/corpus.tgz sha256:" + "0" * 64 + " 10 test\n")
    e = {**env(), "WMT_SOURCES": str(sources)}
    e.pop("WMT_MIRROR", None)
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "download-wmt.sh"), "toy", str(tmp_path / "raw")], env=e,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "download-wmt: could not fetch https://host.invalid/corpus.tgz (curl exit 6: the host name does not " \
           "resolve; no network here?)" in proc.stderr, proc.stderr
    assert "--raw-dir DIR" in proc.stderr and str(sources) in proc.stderr
    assert sorted(os.listdir(tmp_path / "raw")) == ["CHECKSUMS.recorded"]


def test_sources_list_cites_published_checksums():
    """Every archive has a published checksum and source, the training archives sha256 and size;
    only the documented SETIMES zip falls back to record-on-first-download."""
    rows = []
    with open(os.path.join(SCRIPTS, "wmt-sources.txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                rows.append(line.split())
    assert len(rows) == 9 and all(len(r) == 6 for r in rows), rows
    fallback = [r[1] for r in rows if r[3] == "-"]
    assert fallback == ["SETIMES.en-ro.txt.zip"] and all(r[4] == r[3] == "-" and r[5] == "none"
                                                          for r in rows if r[1] in fallback)
    for dataset, name, url, checksum, size, source in rows:
        if name in fallback:
            continue
        if name.startswith("training-"):
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", checksum) and int(size) > 10**7, name
            assert source == {"wmt14-en-de": "tfds-wmt14", "wmt16-en-ro": "tfds-wmt16"}[dataset], name
        else:  # test / dev sets: sacrebleu's md5 of the same URL
            assert re.fullmatch(r"md5:[0-9a-f]{32}", checksum) and source == "sacrebleu", name
            from sacrebleu.dataset import DATASETS

            assert any(url in d.data and checksum[4:] in d.md5 for d in DATASETS.values()), url


# ---- configs ----------------------------------------------------------------------------------

def test_every_row_has_a_config_and_paper_numbers():
    assert ROW_NAMES == sorted(collect_results.ROWS), "configs/*.yaml and collect_results.ROWS differ"
    from omegaconf import OmegaConf

    for row in ROW_NAMES:
        cfg = OmegaConf.load(os.path.join(CONFIGS, row + ".yaml"))
        meta = collect_results.ROWS[row]
        assert cfg.model._name == meta["arch"], row
        assert cfg.task.target_lang == {"wmt16_en_ro": "ro", "iwslt14_de_en": "en"}.get(meta["dataset"], "de"), row
        assert cfg.distributed_training.distributed_world_size == meta["gpus"], row
        if meta["dataset"] == "multi30k_en_de":
            # one published number (Wu et al. 2021, Transformer-tiny); the other rows are ours to measure
            assert meta["gpus"] == 1 and cfg.task.target_lang == "de", row
            assert meta["bleu"] == (41.02 if row == "m30k-transformer" else None), row
        else:
            assert isinstance(meta["bleu"], float) and 10 < meta["bleu"] < 40, row  # Fast Only h32: 17.90
    # the table runner covers exactly the Multi30k rows
    assert sorted(multi30k_table.ROWS) == sorted(r for r, m in collect_results.ROWS.items()
                                                 if m["dataset"] == "multi30k_en_de")


def model_family(arch):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    return ARCH_MODEL_NAME_REGISTRY[arch]


def require_arch(arch):
    from fairseq.models import ARCH_MODEL_REGISTRY

    assert arch in ARCH_MODEL_REGISTRY, f"arch {arch!r} of a configs/ row is not registered by fairseq or the plugin"


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(map(str, v)) + "]"
    return str(v)


def tiny_overrides(arch):
    family = model_family(arch)
    model = {**TINY, **TINY_FAMILY.get(family, {})}
    if family == "msc":  # the depth is blocks x layers per block (a row may also state the product)
        model["encoder_layers"] = model["encoder_blocks"] * model["encoder_layers_per_block"]
    return [f"++model.{k}={_value(v)}" for k, v in model.items()]


def compose_row(row, overrides):
    """What fairseq-hydra-train --config-dir configs --config-name ROW does before training."""
    from fairseq.dataclass.initialize import hydra_init
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    hydra_init(row)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.1"):
        return compose(config_name=row, overrides=overrides)


def cpu_overrides(row, databin, save_dir, max_update):
    """Hydra overrides that train ROW on the CPU with a tiny model for ``max_update`` updates."""
    return [f"task.data={databin}", f"common.user_dir={e2e.PLUGIN}", "common.cpu=true", "common.fp16=false",
            "common.log_interval=1", "common.seed=1", "distributed_training.distributed_world_size=1",
            "dataset.max_tokens=500", "dataset.num_workers=0", "dataset.disable_validation=true",
            # no background prefetch thread: most rows train in-process, where a run that stops mid-epoch
            # would leave fairseq's prefetch thread behind in the test process (the abort at exit it used
            # to cause is gone: umst_plugin.patches.prefetch_thread_exit)
            "dataset.data_buffer_size=0", "optimization.update_freq=[1]", f"optimization.max_update={max_update}",
            f"checkpoint.save_dir={save_dir}", *tiny_overrides(collect_results.ROWS[row]["arch"]),
            # IWSLT14 De-En (prime-t2-prime-base) has no recipe here: the WMT stand-in's languages
            *(["task.source_lang=en", "task.target_lang=de"] if collect_results.ROWS[row]["dataset"] == "iwslt14_de_en"
              else [])]


def train_row(row, databin, save_dir, max_update=1, extra=()):
    """Train ROW in-process via fairseq_cli.hydra_train with tiny overrides; returns checkpoint_last's state."""
    from fairseq_cli.hydra_train import _hydra_main

    cfg = compose_row(row, cpu_overrides(row, databin, save_dir, max_update) + list(extra))
    assert cfg.model._name == collect_results.ROWS[row]["arch"]
    _hydra_main(cfg)
    state = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu")
    assert state["optimizer_history"][-1]["num_updates"] == max_update
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    return state


def databin_for(prepared, row):
    dataset = collect_results.ROWS[row]["dataset"]
    if dataset == "multi30k_en_de":  # the no-parse row reads the recipe's DATA_BIN_noparse variant
        p = prepared["multi30k"]
        return dict(p, databin=p["databin"] + multi30k_table.DATA_VARIANT.get(row, ""))
    return prepared["wmt16-en-ro" if dataset == "wmt16_en_ro" else "wmt14-en-de"]


@pytest.mark.parametrize("row", ROW_NAMES)
def test_config_composes_and_trains_one_update(prepared, row, tmp_path):
    meta = collect_results.ROWS[row]
    require_arch(meta["arch"])
    state = train_row(row, databin_for(prepared, row)["databin"], str(tmp_path), max_update=1,
                      extra=["checkpoint.no_epoch_checkpoints=true"])
    model_cfg = state["cfg"]["model"]
    # every row's arch is argparse-style: the checkpoint holds fairseq-train's Namespace
    assert isinstance(model_cfg, argparse.Namespace), type(model_cfg)
    assert model_cfg._name == model_cfg.arch == meta["arch"]
    # The row's own settings survived composition (and were not replaced by arch defaults).
    from omegaconf import OmegaConf

    yaml_model = OmegaConf.load(os.path.join(CONFIGS, row + ".yaml")).model
    for key in ("dropout", "attention_dropout", "share_all_embeddings"):
        if key in yaml_model:
            assert getattr(model_cfg, key) == yaml_model[key], (key, getattr(model_cfg, key), yaml_model[key])
    assert list(state["cfg"]["optimizer"]["adam_betas"])[1] in (0.997, 0.98, 0.998)
    assert state["cfg"]["criterion"]["label_smoothing"] == 0.1


# Legacy archs of both kinds: a TransformerModel subclass with flags of its own (transformer_sf),
# and an add_args model whose YAML leaves most flags to their add_args defaults (lightconv).
CONSOLE_ROWS = ["sf-t1-transformer-sf-base", "prime-t1-dynamicconv-big"]


@pytest.mark.parametrize("row", CONSOLE_ROWS)
def test_plain_fairseq_hydra_train_console_script(prepared, row, tmp_path):
    """The console script with only the plugin as common.user_dir (no wrapper), 1 update; the
    checkpoint is fairseq-train-shaped and fairseq-generate / fairseq-interactive load it."""
    databin = prepared["wmt14-en-de"]["databin"]
    e2e.run([os.path.join(e2e.BIN, "fairseq-hydra-train"), "--config-dir", CONFIGS, "--config-name", row,
             *cpu_overrides(row, databin, str(tmp_path), max_update=1), "checkpoint.no_epoch_checkpoints=true",
             f"hydra.run.dir={tmp_path}"])
    ckpt = str(tmp_path / "checkpoint_last.pt")
    state = torch.load(ckpt, map_location="cpu")
    assert isinstance(state["cfg"]["model"], argparse.Namespace)
    assert state["cfg"]["model"].arch == collect_results.ROWS[row]["arch"]
    assert not hasattr(state["cfg"]["model"], "handlers")  # hydra's job_logging_cfg is not a model flag
    out = e2e.generate(databin, ckpt, "--beam", "2", "--max-len-a", "1.2", "--max-len-b", "5",
                       "--required-batch-size-multiple", "1", "--cpu")
    assert "Translated 30 sentences" in out, out[-3000:]
    with open(os.path.join(prepared["wmt14-en-de"]["work"], f"bpe{MERGES}", "test.en"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(2)]
    out = e2e.fairseq("interactive", databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation",
                      "--path", ckpt, "--beam", "2", "--source-lang", "en", "--target-lang", "de", "--cpu",
                      "--max-len-b", "5", input="".join(lines)).stdout
    assert len(e2e.hypotheses(out)) == 2, out[-3000:]


def test_hydra_and_fairseq_train_build_the_same_legacy_model(prepared):
    """For a legacy arch, the hydra YAML route and fairseq-train's argparse route give the model the
    same flags: same parameters, same shapes, same add_args values for what neither sets."""
    from fairseq import options, tasks

    from umst_plugin.patches.hydra_legacy_models import model_config_for_build

    databin = prepared["wmt14-en-de"]["databin"]
    row = "sf-t1-transformer-sf-base"
    tiny = {**TINY, **TINY_FAMILY["transformer_sf"]}
    cfg = compose_row(row, [f"task.data={databin}", f"common.user_dir={e2e.PLUGIN}",
                            *(f"++model.{k}={_value(v)}" for k, v in tiny.items())])
    from fairseq.dataclass.initialize import add_defaults

    add_defaults(cfg)
    hydra_ns = model_config_for_build(cfg.model)
    assert cfg.model is hydra_ns  # written back into the run config: the trainer saves the Namespace
    argv = [databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--arch", "transformer_sf_base",
            "--source-lang", "en", "--target-lang", "de", "--share-all-embeddings", "--dropout", "0.1",
            "--attention-dropout", "0.1", "--activation-dropout", "0.1",
            *[x for k, v in tiny.items() for x in (f"--{k.replace('_', '-')}", str(v))]]
    train_ns = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    task = tasks.setup_task(train_ns)
    # build_model applies the arch function to the Namespace in place, as parse_args_and_arch did
    hydra_model, train_model = task.build_model(hydra_ns), task.build_model(train_ns)
    assert {k: v.shape for k, v in hydra_model.state_dict().items()} == \
        {k: v.shape for k, v in train_model.state_dict().items()}
    # every flag fairseq-train gives the model has the same value, except the run-wide ones the YAML
    # sets (optimizer, schedule, batch, ...) and that this argv leaves out
    from omegaconf import OmegaConf

    yaml = OmegaConf.load(os.path.join(CONFIGS, row + ".yaml"))
    run_wide = {k for group, node in yaml.items() if group not in ("model", "hydra") for k in node} | {
        "data", "user_dir", "optimizer", "lr_scheduler", "criterion", "no_seed_provided", "batch_size",
        "batch_size_valid", "max_tokens_valid"}
    differ = {k: (getattr(hydra_ns, k, "<missing>"), v) for k, v in vars(train_ns).items()
              if k not in run_wide and k in vars(hydra_ns) and getattr(hydra_ns, k) != v}
    missing = sorted(k for k in vars(train_ns) if k not in vars(hydra_ns))
    assert not differ, differ
    model_keys = {a.dest for a in _model_parser_actions("transformer_sf")}
    assert not model_keys & set(missing), sorted(model_keys & set(missing))
    # and a Namespace passes through the wrapper untouched (fairseq-train, generate, interactive)
    assert model_config_for_build(train_ns) is train_ns


def _model_parser_actions(model_name):
    from fairseq.models import MODEL_REGISTRY

    parser = argparse.ArgumentParser()
    MODEL_REGISTRY[model_name].add_args(parser)
    return [a for a in parser._actions if a.dest != "help"]


# ---- smoke: one row per architecture, train -> average -> evaluate -> collect ------------------

def smoke_rows():
    """The first En-De row of every registered model family (covers new archs as they land)."""
    rows, seen = [], set()
    for row, meta in collect_results.ROWS.items():
        if meta["dataset"] != "wmt14_en_de":
            continue
        try:
            family = model_family(meta["arch"])
        except KeyError:
            continue
        if family not in seen:
            seen.add(family)
            rows.append(row)
    return rows


def generate_in_process(databin, ckpt, out_dir, beam, lenpen):
    from fairseq import options
    from fairseq_cli.generate import main as generate_main

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, input_args=[
        databin, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--path", ckpt, "--gen-subset",
        "test", "--beam", str(beam), "--lenpen", str(lenpen), "--max-tokens", "4000", "--remove-bpe",
        "--results-path", out_dir, "--required-batch-size-multiple", "1", "--max-len-a", "1.2", "--max-len-b", "5",
        "--num-workers", "0", "--cpu"])
    generate_main(args)
    return os.path.join(out_dir, "generate-test.txt")


def test_smoke_one_row_per_architecture(prepared, tmp_path):
    p = prepared["wmt14-en-de"]
    db = p["databin"]
    rows = smoke_rows()
    assert "umst-t2-transformer-base" in rows
    for row in rows:
        meta = collect_results.ROWS[row]
        save = tmp_path / row
        # 4 updates, a checkpoint every 2: average the two update checkpoints
        train_row(row, db, str(save), max_update=4, extra=["checkpoint.save_interval_updates=2",
                                                           "checkpoint.no_epoch_checkpoints=true"])
        assert len(glob.glob(str(save / "checkpoint_*_*.pt"))) == 2
        avg = str(save / "checkpoint_avg2.pt")
        assert average_checkpoints.main(["--inputs", str(save), "--num-update-checkpoints", "2",
                                         "--output", avg]) == 0
        gen = generate_in_process(db, avg, str(save), meta["beam"], meta["lenpen"])
        assert score.main(["--generate", gen, "--lang", "de", "--compound-split",
                           "--tok-ref", os.path.join(db, "ref", "test.tok.de"),
                           "--detok-ref", os.path.join(db, "ref", "test.detok.de"),
                           "--json", str(save / "results.json"), "--extra", f"row={row}",
                           "--extra", "checkpoint_name=checkpoint_avg2.pt"]) == 0
        with open(save / "results.json") as f:
            res = json.load(f)
        assert res["sentences"] == 30  # every test sentence translated
        # (4 updates: the score itself says nothing; tests/test_recipes.py's tokenized-BLEU tests check it)
        assert isinstance(res["tok_bleu"], float) and "tok:13a" in res["sacrebleu_signature"]
    table = collect_results.markdown_table(collect_results.find_results([str(tmp_path)]))
    for row in rows:
        assert re.search(rf"^\| {re.escape(row)} \| .* \| checkpoint_avg2\.pt \|", table, flags=re.M), table
    print("\n" + table)


def test_shell_scripts_end_to_end_en_ro(prepared, tmp_path):
    """train.sh -> umst-average-checkpoints -> evaluate.sh -> collect_results.py on the En-Ro baseline."""
    p = prepared["wmt16-en-ro"]
    row = "umst-t3-transformer-base"
    save = tmp_path / "runs" / row
    tiny = tiny_overrides(collect_results.ROWS[row]["arch"])
    sh("bash", os.path.join(SCRIPTS, "train.sh"), row, "--data", p["databin"], "--save-dir", save, "--gpus", "0",
       "--", "optimization.max_epoch=2", "dataset.max_tokens=1500", "dataset.disable_validation=true",
       "dataset.num_workers=0", *tiny)
    # (in-process: the same main() as the console script, without another torch import)
    assert average_checkpoints.main(["--inputs", str(save), "--num-epoch-checkpoints", "2",
                                     "--output", str(save / "checkpoint_avg2.pt")]) == 0
    log = sh("bash", os.path.join(SCRIPTS, "evaluate.sh"), "--data", p["databin"], "--checkpoint",
             save / "checkpoint_avg2.pt", "--row", row, "--", "--max-len-a", "1.2", "--max-len-b", "5", "--cpu")
    assert "signature: nrefs:1|case:mixed" in log and "tokenized BLEU:" in log  # no compound split for Ro
    with open(save / "results.json") as f:
        res = json.load(f)
    assert res["sentences"] == 30 and res["row"] == row and res["beam"] == "4" and res["lenpen"] == "0.6"
    # several subsets, one process (umst_tools.generate_subsets): each subset's file and scores are those of
    # its own fairseq-generate process, the log lines fairseq writes into the file included
    sh("bash", os.path.join(SCRIPTS, "evaluate.sh"), "--data", p["databin"], "--checkpoint",
       save / "checkpoint_avg2.pt", "--row", row, "--subset", "valid,test", "--out", tmp_path / "both" / "{subset}",
       "--", "--max-len-a", "1.2", "--max-len-b", "5", "--cpu")
    def lines(path):  # without the timings
        return [x for x in open(path).read().splitlines() if not re.search(r"\d+\.\d+s|sentences/s|wps", x)]
    single, both = save / "generate-test.txt", tmp_path / "both" / "test" / "generate-test.txt"
    assert lines(both) == lines(single) and any(x.startswith("H-") for x in lines(both)), (lines(both), lines(single))
    assert sum(x.startswith("Generate test with beam=4") for x in lines(both)) == 1
    with open(tmp_path / "both" / "test" / "results.json") as f:
        again = json.load(f)
    assert {k: v for k, v in again.items() if k != "row"} == {k: v for k, v in res.items() if k != "row"}
    with open(tmp_path / "both" / "valid" / "results.json") as f:
        assert json.load(f)["subset"] == "valid"
    assert "Generate valid with beam=4" in (tmp_path / "both" / "valid" / "generate-valid.txt").read_text()
    table = sh(sys.executable, os.path.join(SCRIPTS, "collect_results.py"), tmp_path / "runs", "--all-rows")
    line = next(x for x in table.splitlines() if x.startswith(f"| {row} |"))
    assert "| 34.21 |" in line and f"| {res['tok_bleu']:.2f} |" in line
    assert "| umst-t2-umst-base |" in table and "not run" in table


# ---- unit checks of the scoring and averaging -------------------------------------------------

def test_several_subsets_need_a_results_dir_per_subset_and_well_formed_pairs(tmp_path):
    from umst_tools import generate_subsets

    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "evaluate.sh"), "--data", str(tmp_path), "--checkpoint",
                           str(tmp_path / "c.pt"), "--subset", "test,test1", "--dry-run"], env=env(),
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "several subsets need --out with {subset} in it" in proc.stderr, proc.stderr
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "evaluate.sh"), "--data", str(tmp_path), "--checkpoint",
                           str(tmp_path / "c.pt"), "--subset", "test,test1", "--out", str(tmp_path / "e-{subset}"),
                           "--dry-run", "--", "--cpu"], env=env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert f" -m umst_tools.generate_subsets test={tmp_path}/e-test test1={tmp_path}/e-test1 -- {tmp_path} " \
        in proc.stdout and proc.stdout.rstrip().endswith("--required-batch-size-multiple 1 --cpu"), proc.stdout
    assert generate_subsets.parse(["test=a", "valid=b", "--", "data", "--beam", "4"]) == \
        ([("test", "a"), ("valid", "b")], ["data", "--beam", "4"])
    for argv, message in ((["test=a", "data"], "usage"), (["test", "--", "data"], "expected SUBSET=RESULTS_DIR"),
                          (["--", "data"], "no SUBSET=RESULTS_DIR"),
                          (["test=a", "--", "data", "--gen-subset", "x"], "--gen-subset comes from"),
                          (["test=a", "--", "data", "--results-path=x"], "--results-path comes from")):
        with pytest.raises(SystemExit, match=message):
            generate_subsets.parse(argv)


def test_legacy_model_gets_the_namespace_fairseq_train_builds(prepared):
    """A legacy arch's hydra model config becomes fairseq-train's flat Namespace: YAML values kept,
    add_args defaults added (lightconv's weight_softmax), other groups' keys visible."""
    from fairseq.dataclass.utils import omegaconf_no_object_check

    from umst_plugin.patches.hydra_legacy_models import is_legacy_arch, use_legacy_namespace

    cfg = compose_row("prime-t1-dynamicconv-big", [f"task.data={prepared['wmt14-en-de']['databin']}",
                                                   f"common.user_dir={e2e.PLUGIN}"])
    with omegaconf_no_object_check():
        use_legacy_namespace(cfg)
    ns = cfg.model
    assert isinstance(ns, argparse.Namespace)
    assert ns.arch == ns._name == "lightconv_wmt_en_de_big"
    assert ns.encoder_glu is True and ns.dropout == 0.3 and ns.encoder_conv_type == "dynamic"  # from the YAML
    assert ns.weight_softmax is True  # lightconv's add_args default, not in the YAML
    assert ns.max_source_positions == 1024 and ns.share_all_embeddings is True  # task group / model
    assert is_legacy_arch("lightconv_wmt_en_de_big") and not is_legacy_arch("transformer_lm")  # dataclass model


def test_compound_splitting_matches_the_perl_regex():
    assert score.compound_split("state @-@ of") == "state @ ##AT##-##AT## @ of"
    assert score.compound_split("Gesundheits-Reform a-b-c") == "Gesundheits ##AT##-##AT## Reform a ##AT##-##AT## b-c"


def test_compound_split_bleu_splits_hypotheses_and_references():
    """fairseq's compound_split_bleu.sh splits both sides: a hyphenated compound the hypothesis matches whole scores
    as its three tokens, and one it writes apart as two words misses the ##AT##-##AT## token on the reference side."""
    ref = ["die Gesundheits-Reform ist da und gut"]
    assert score.tokenized_bleu(ref, ref, compound=True).score == pytest.approx(100.0)
    apart = ["die Gesundheits Reform ist da und gut"]
    expected = score.tokenized_bleu(apart, [score.compound_split(ref[0])]).score
    assert score.tokenized_bleu(apart, ref, compound=True).score == pytest.approx(expected)
    assert expected != pytest.approx(score.tokenized_bleu(apart, ref).score)


def test_tokenized_bleu_is_multi_bleu_style():
    hyp, ref = ["the cat sat on the mat"], ["the cat sat on the mat"]
    assert score.tokenized_bleu(hyp, ref).score == pytest.approx(100.0)
    # no smoothing: a missing 4-gram order gives 0 like multi-bleu.perl
    assert score.tokenized_bleu(["the cat"], ["the cat sat"]).score == 0.0
    # case-sensitive and no re-tokenization
    assert score.tokenized_bleu(["The cat sat on the mat"], ref).score < 100.0
    assert score.tokenized_bleu(["the cat sat on the mat ."], ["the cat sat on the mat."]).score < 100.0


def test_average_checkpoints_averages_and_picks_the_newest(tmp_path):
    for epoch in (1, 2, 3):
        torch.save({"model": {"w": torch.full((2,), float(epoch)), "step": torch.tensor(7)},
                    "cfg": {"epoch": epoch}, "extra_state": {}, "optimizer_history": [],
                    "last_optimizer_state": {"x": 1}}, tmp_path / f"checkpoint{epoch}.pt")
    torch.save({"model": {}}, tmp_path / "checkpoint_last.pt")
    paths = average_checkpoints.last_n_checkpoints(str(tmp_path), 2)
    assert [os.path.basename(x) for x in paths] == ["checkpoint3.pt", "checkpoint2.pt"]
    out = tmp_path / "avg.pt"
    assert average_checkpoints.main(["--inputs", str(tmp_path), "--num-epoch-checkpoints", "2",
                                     "--output", str(out)]) == 0
    state = torch.load(out, map_location="cpu")
    assert torch.equal(state["model"]["w"], torch.full((2,), 2.5))
    assert state["model"]["step"].item() == 7 and state["cfg"]["epoch"] == 3
    assert state["last_optimizer_state"] is None
    assert average_checkpoints.main(["--inputs", str(tmp_path), "--num-epoch-checkpoints", "5",
                                     "--output", str(out)]) == 2
    # a save dir that is not there is named as missing (not as a count of directories)
    missing = tmp_path / "no-such-run"
    proc = subprocess.run([sys.executable, "-m", "umst_plugin.average_checkpoints", "--inputs", str(missing),
                           "--num-update-checkpoints", "2", "--output", str(out)], capture_output=True, text=True,
                          env=e2e.cli_env())
    assert proc.returncode == 2 and f"--inputs {missing} does not exist" in proc.stderr, proc.stderr
    # files in any order (the runner lists them oldest first): the average carries the newest one's state
    for epoch in (1, 2, 3):
        state = torch.load(tmp_path / f"checkpoint{epoch}.pt", map_location="cpu")
        state["optimizer_history"] = [{"num_updates": 100 * epoch}]
        torch.save(state, tmp_path / f"checkpoint{epoch}.pt")
    assert average_checkpoints.main(["--inputs", *[str(tmp_path / f"checkpoint{e}.pt") for e in (1, 3, 2)],
                                     "--output", str(out)]) == 0
    state = torch.load(out, map_location="cpu")
    assert state["cfg"]["epoch"] == 3 and state["optimizer_history"] == [{"num_updates": 300}]
    assert torch.equal(state["model"]["w"], torch.full((2,), 2.0))
    assert state["averaged_from"] == ["checkpoint1.pt", "checkpoint3.pt", "checkpoint2.pt"]


def _checkpoint(path, weight, num_updates=None):
    history = [] if num_updates is None else [{"num_updates": num_updates}]
    torch.save({"model": {"w": torch.full((2,), float(weight))}, "cfg": {"weight": weight}, "extra_state": {},
                "optimizer_history": history, "last_optimizer_state": None}, path)


def test_average_checkpoints_bounds_counts_and_options(tmp_path, capsys):
    """--checkpoint-upper-bound keeps the checkpoint at the bound; exactly N checkpoints found are enough; a
    checkpoint that records its updates is newer than one that records none; the count must be at least 1; errors
    name the flag given; --inputs and --output are required."""
    for epoch in (1, 2, 3, 4):
        _checkpoint(tmp_path / f"checkpoint{epoch}.pt", epoch)
    for update in (100, 200):
        _checkpoint(tmp_path / f"checkpoint_1_{update}.pt", update)
    names = lambda paths: [os.path.basename(p) for p in paths]  # noqa: E731
    assert names(average_checkpoints.last_n_checkpoints(str(tmp_path), 2, upper_bound=3)) == [
        "checkpoint3.pt", "checkpoint2.pt"]
    assert names(average_checkpoints.last_n_checkpoints(str(tmp_path), 2, update_based=True)) == [
        "checkpoint_1_200.pt", "checkpoint_1_100.pt"]
    with pytest.raises(ValueError, match="found 1 update checkpoints .* at or below 150, need 2"):
        average_checkpoints.last_n_checkpoints(str(tmp_path), 2, update_based=True, upper_bound=150)

    recorded, unrecorded = tmp_path / "recorded.pt", tmp_path / "unrecorded.pt"
    _checkpoint(recorded, 10, num_updates=0)
    _checkpoint(unrecorded, 20)
    out = tmp_path / "avg.pt"
    assert average_checkpoints.main(["--inputs", str(recorded), str(unrecorded), "--output", str(out)]) == 0
    assert torch.load(out, map_location="cpu")["cfg"] == {"weight": 10}

    assert average_checkpoints.main(["--inputs", str(tmp_path), "--num-epoch-checkpoints", "1",
                                     "--output", str(out)]) == 0  # one checkpoint: its weights, no optimizer
    assert torch.equal(torch.load(out, map_location="cpu")["model"]["w"], torch.full((2,), 4.0))
    capsys.readouterr()
    for flag in ("--num-epoch-checkpoints", "--num-update-checkpoints"):
        assert average_checkpoints.main(["--inputs", str(tmp_path), flag, "0", "--output", str(out)]) == 2
        assert f"error: {flag} 0: expected at least 1 checkpoint" in capsys.readouterr().err
        assert average_checkpoints.main(["--inputs", str(tmp_path), str(tmp_path), flag, "2",
                                         "--output", str(out)]) == 2
        assert f"error: {flag} needs exactly one directory in --inputs" in capsys.readouterr().err
    for missing, argv in (("--output", ["--inputs", str(recorded)]), ("--inputs", ["--output", str(out)])):
        with pytest.raises(SystemExit) as exit_:
            average_checkpoints.main(argv)
        assert exit_.value.code == 2
        assert f"the following arguments are required: {missing}" in capsys.readouterr().err


@pytest.mark.slow
def test_the_documented_rebuild_reproduces_the_converged_table(tmp_path):
    """docs/multi30k.md's converged table is what its own documented command (the fenced block after
    ``<!-- rebuild-converged -->``) writes from the archive alone, run in a copy of the repository at another
    path (its own code first on the path): the block it writes equals the page's, so neither the archive's
    portability nor the page can drift."""
    page = os.path.join(ROOT, "docs", "multi30k.md")
    text = open(page, encoding="utf-8").read()
    block = text.split("<!-- rebuild-converged -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    argv = [a.strip("\"'") for a in re.split(r"\s+", block.replace("\\\n", " ").strip()) if a]
    assert argv[:2] == ["python", "scripts/multi30k_table.py"] and "--table-only" in argv, argv
    clone = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".whl", "runs", "data", "checkpoints", "__pycache__", "*.egg-info", ".ruff_cache"))
    argv[argv.index("--out") + 1] = str(tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=str(clone))
    proc = subprocess.run([sys.executable] + argv[1:], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    def converged(t):
        return t.split("<!-- multi30k-table:converged:begin -->")[1].split("<!-- multi30k-table:converged:end -->")[0]

    assert "| row |" in converged(text) and "m30k-prime" in converged(text)
    assert converged((clone / "docs" / "multi30k.md").read_text(encoding="utf-8")) == converged(text)
