"""scripts/rehearse-wmt.sh end to end: the WMT14 En-De recipe as a cluster user runs it, through the Slurm shim, on
the Multi30k stand-in corpus -- prepare with the parse as a Slurm array, UMST and the transformer baseline on 2
"nodes", the time limit mid-epoch, requeue, resume to the uninterrupted run's numbers, average, evaluate, collect,
translate from Python.

One run (about 3 minutes on 2 busy cores), every assertion on what it wrote. It also replaces the former
tests/test_multinode.py: the uninterrupted reference is one process with the same batch as the two "nodes"'
(update_freq 2 against 2 x 1), so equal losses there are also "two machines train like one"."""
import json
import os
import re
import subprocess
import time

import pytest

import e2e

pytestmark = pytest.mark.slow

MULTI30K = os.path.join(e2e.ROOT, "..", "shared", "data", "multi30k")
UPDATES = 72  # rehearse-wmt.sh's default: 2 epochs and 10 updates of the stand-in corpus; the stop aimed at 36
SCRIPT = os.path.join(e2e.ROOT, "scripts", "rehearse-wmt.sh")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    if not os.path.exists(os.path.join(MULTI30K, "train.en.gz")):
        pytest.skip(f"no Multi30k raw files in {MULTI30K} (the stand-in corpus is built from them)")
    work = tmp_path_factory.mktemp("rehearsal")
    # whatever the calling shell has active must not matter: the script starts over from `env -i`
    env = {**os.environ, "PYTHON": "/nonexistent/python", "VIRTUAL_ENV": "/nonexistent",
           "PYTHONPATH": "/nonexistent", "SLURM_SHIM_STATE": "/nonexistent"}
    start = time.monotonic()
    proc = subprocess.run(["bash", SCRIPT, "--work-dir", str(work), "--multi30k", MULTI30K], env=env, cwd=str(work),
                          capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    with open(work / "rehearsal.json") as f:
        summary = json.load(f)
    print(f"\nrehearsal: {seconds:.0f} s; steps {summary['steps_seconds']}")
    return work, summary


def log(work, pattern):
    paths = sorted((work / "logs").glob(pattern))
    assert paths, f"no log {pattern} in {work / 'logs'}"
    return "\n".join(p.read_text(errors="replace") for p in paths)


def test_prepare_parses_as_a_slurm_array_and_merges_without_parsing_again(rehearsal):
    work, summary = rehearsal
    for shard in (1, 2):
        assert f"parse shard {shard} of 2: done" in log(work, f"umst-parse-*_{shard}.out")
    second = log(work, "prepare-2.log")
    assert "merging the 2 parse shards" in second and "dependency side data with --parser" not in second
    databin = work / "data" / "data-bin" / "wmt14_en_de_bpe1000"
    assert (databin / "preprocessing.json").exists() and (databin / "ref" / "test.detok.de").exists()


def test_the_time_limit_stops_training_mid_epoch_and_the_job_requeues_and_resumes(rehearsal):
    work, summary = rehearsal
    umst = log(work, f"umst-2nodes-{summary['jobs']['umst_2nodes']}.out")
    runs = re.findall(r"\[train-job\] job \d+ \(restart (\d)\)", umst)
    assert runs == ["0", "1"], runs  # one run, requeued once
    assert "[train-job] SIGUSR1 (the time limit is near)" in umst
    stop = re.search(r"Stopping training on SIGUSR1 \(received during update (\d+).*?saved at update (\d+), epoch (\d+) "
                     r"\((\d+) batches in\)", umst)
    assert stop, umst[-3000:]
    received, saved, epoch, batches = map(int, stop.groups())
    per_epoch = int(re.search(r"epoch 001: +\d+ / (\d+) ", umst).group(1))
    # in the epoch its update falls in, aimed mid-epoch in the second (where a resume needs
    # patches/resume_batch_order.py). The stand-in corpus's epoch lasts about 1.5 s (some 20 updates a second) and
    # the warning's way from the rehearsal's scontrol update to training took 1-2 s on a loaded machine, so the stop
    # may also come in the epoch's last update: then the checkpoint is the epoch's end, and the resumed run starts
    # the next epoch (a fresh iterator in epoch 3: patches/resume_batch_order.py's case as well)
    assert saved - received in (0, 1) and 0 < batches <= per_epoch, (stop.groups(), per_epoch)
    assert epoch == 1 + (saved - batches) // per_epoch and epoch >= 2, (stop.groups(), per_epoch)
    resume_epoch, resume_batch = (epoch, batches + 1) if batches < per_epoch else (epoch + 1, 1)
    assert "requeueing job" in umst and f"Loaded checkpoint {work}/checkpoints/umst-2nodes/checkpoint_last.pt " \
                                      f"(epoch {resume_epoch} @ {saved} updates)" in umst
    resumed = umst[umst.index("Loaded checkpoint"):]
    assert re.search(r"epoch %03d: +%d / " % (resume_epoch, resume_batch), resumed)  # on from the next batch
    resume = summary["resume"]
    assert resume["stopped_at_update"] == saved and resume["stops"] == 1 and resume["ranks_logging_the_stop"] == 2


def test_the_resumed_run_equals_the_uninterrupted_one(rehearsal):
    """Every logged loss (before and after the resume point) equals the 1-node reference's, and the final
    weights agree within 1e-4 (test_multinode's bound for 2 machines against 1; measured: equal)."""
    work, summary = rehearsal
    two = log(work, f"umst-2nodes-{summary['jobs']['umst_2nodes']}.out")
    one = log(work, f"umst-reference-{summary['jobs']['umst_reference']}.out")
    assert "2 process(es) x update_freq 1" in two and "machine 1 of 2" in two, two[-3000:]
    port = 20000 + summary["jobs"]["umst_2nodes"] % 20000  # launch.sh's: the job's first node, 20000 + job id
    assert f"distributed init (rank 1): tcp://127.0.0.1:{port}" in two, two[-3000:]
    assert "1 process(es) x update_freq 2" in one, one[-3000:]  # the same batch in one process
    resume = summary["resume"]
    assert resume["updates"]["preempted"] == resume["updates"]["reference"] == UPDATES
    assert resume["logged_updates"]["preempted"] >= UPDATES and resume["logged_updates"]["reference"] == UPDATES
    assert not resume["logged_losses_differing"], resume["logged_losses_differing"]
    after = resume["logged_losses_after_resume"]
    assert len(after) == UPDATES - resume["stopped_at_update"] and all(a == b for a, b in after.values()), after
    assert resume["max_abs_weight_diff"] <= 1e-4
    print(f"\nresumed at update {resume['stopped_at_update']}: {len(after)} logged losses after it equal; "
          f"final weights at most {resume['max_abs_weight_diff']:.3g} apart")


def test_both_rows_trained_on_two_nodes_are_averaged_evaluated_and_collected(rehearsal):
    work, summary = rehearsal
    baseline = log(work, f"transformer-2nodes-{summary['jobs']['transformer_2nodes']}.out")
    assert "on 2 node(s)" in baseline and "world size 2" in baseline
    for row in ("umst-t2-umst-base", "umst-t2-transformer-base"):
        result = summary["results"][row]
        assert result["checkpoint_name"] == "checkpoint_avg2.pt" and str(result["beam"]) == "4", result
        assert result["subset"] == "test" and result["sentences"] == 40, result
        assert result["compound_split"] and "tok_bleu" in result and result["sacrebleu_signature"].startswith("nrefs:1")
        assert f"| {row} |" in summary["table"]


def test_a_raw_sentence_translates_with_the_recorded_parser(rehearsal):
    work, summary = rehearsal
    translation = summary["translation"]
    assert translation["translation"].strip(), translation
    assert translation["source_parser"] == "spacy", translation  # from preprocessing.json, no argument given
