"""The speed table (benchmarks/speed_table.py, scripts/gpu-speed.sh): its CPU run at tiny sizes, the same plan a
lent GPU runs, and the record's arithmetic (loss checks, MFU, targets) on rows of known figures."""
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import speed_table
from benchmarks import synthetic_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wmt14_lengths_have_the_stated_distribution():
    rng = random.Random(0)
    pairs = [synthetic_corpus.wmt14_pair(rng) for _ in range(40000)]
    src = [s for s, _ in pairs]
    tgt = [t for _, t in pairs]
    assert abs(sum(src) / len(src) - 28.0) < 0.5  # the stated mean
    assert abs(sum(tgt) / sum(src) - 1.06) < 0.02  # targets about 5% longer (log-normal ratio, mu 0.05)
    assert max(src) > 200 and max(max(src), max(tgt)) <= 250  # a tail toward the cut at 250
    assert all(1 / 1.5 - 0.5 / s <= t / s <= 1.5 + 0.5 / s for s, t in pairs)  # the length-ratio filter (rounded)
    assert sorted(src)[len(src) // 2] in (22, 23, 24)  # the median of log-normal mean 28, sigma 0.6


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """scripts/gpu-speed.sh --tiny, as CI runs it: the record and the script's output."""
    out = tmp_path_factory.mktemp("speed")
    cmd = ["bash", os.path.join(ROOT, "scripts", "gpu-speed.sh"), "--tiny", "--out", str(out / "results"),
           "--work", str(out / "work"), "--commit", "abc1234"]
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = out / "results" / "speed-cpu-tiny-abc1234.json"
    return cmd, env, path, json.loads(path.read_text()), proc.stdout


def test_tiny_run_has_every_planned_row_with_its_fields(tiny_run):
    _, _, path, record, _ = tiny_run
    assert record["commit"] == "abc1234" and record["card"] is None and record["cpu"]
    planned = {(p["name"], p["precision"], p["compiled"], p["max_tokens"]) for p in record["plan"]}
    rows = {speed_table.row_key(r): r for r in record["rows"]}
    # 2 stock, 8 archs and Prime at its WMT recipe's shape (UMST's MUSE), compiled and tf32 rows; at the first batch
    # the transformer of Prime's shape (eager: --tiny compiles the transformer only)
    assert set(rows) == planned and len(planned) == 2 * (2 + 9 + 2) + 1
    assert rows[("prime_muse", "bf16", False, 1024)]["arch"] == "prime_base"
    for key, r in rows.items():
        if r["stock"] and r["precision"] == "fp16":  # fairseq's --fp16 needs CUDA
            assert r["error"].startswith("skipped") and not r.get("words_per_s")
            continue
        assert "error" not in r, (key, r.get("error"))
        for field in ("arch", "stock", "precision", "compiled", "max_tokens", "words_per_s", "mfu", "gpu_busy",
                      "peak_mib", "compile_s", "losses"):
            assert field in r, (key, field)
        assert r["words_per_s"] > 0 and r["updates"] == 8
        # the median after warm-up: of fairseq's wps over the log intervals after the first (which holds the
        # first update's start-up and, compiled, its compiling)
        assert len(r["wps_records"]) == 4 and r["words_per_s"] == round(statistics.median(r["wps_records"][1:]), 1)
        assert 0 < r["target_tokens_per_step"] <= r["max_tokens"]
        assert [u for u, _ in r["losses"]] == [2, 4, 6, 8]  # every logged update
        assert 0 < r["real_tokens_per_step"] <= r["padded_tokens_per_step"] <= 2 * r["max_tokens"]
        # the batch asked for, within 10%, before fairseq rounds a training batch down to a multiple of 8 sentences
        # (--required-batch-size-multiple, default 8: at most 7 sentences fewer; 16 of 18 here, 0.875 at 1,024
        # tokens, where the recipe batch's 1,000-odd sentences lose under 1%)
        n = r["sentences_per_step"]
        assert 0.9 * n / (n + 7) <= r["batch_fill"] <= 1.0, (key, r["batch_fill"], n)
        assert r["flops_per_token"] > 0
        assert r["mfu"] is None and r["gpu_busy"] is None and r["peak_mib"] is None  # no card: no peak, no nvidia-smi
        assert r["between_updates_ms"] >= 0 and r["train_step_ms"] > 0, (key, r)
    transformer = rows[("transformer", "bf16", False, 1024)]
    compiled = rows[("transformer", "bf16", True, 1024)]
    assert compiled["flops_per_token"] == transformer["flops_per_token"]  # the eager row's count (same batches)
    assert compiled["compile_s"] > 0 and compiled["eager_fallbacks"] == []
    # the warm-up compiled every graph cold; the measured row found them in the cache it filled
    warm_cache, row_cache = record["warm_up"]["transformer 1024"]["compile_cache"], compiled["compile_cache_in_row"]
    assert warm_cache["fxgraph_cache_miss"] > 0 and warm_cache["fxgraph_cache_hit"] == 0, warm_cache
    assert row_cache["fxgraph_cache_hit"] == warm_cache["fxgraph_cache_miss"], (warm_cache, row_cache)
    assert row_cache["fxgraph_cache_miss"] == 0 and row_cache["autograd_cache_miss"] == 0, row_cache
    assert f"transformer 1,024: {compiled['compile_s_in_row']:.1f} s; FX graph {row_cache['fxgraph_cache_hit']} / 0" \
        in path.with_suffix(".md").read_text()
    assert record["warm_up"]["transformer 1024"]["losses_dropout_shifted"]
    assert compiled["loss_check"]["ok"] is True, compiled["loss_check"]
    # the contrast batch compiles in the measured process (no warm-up), so its losses are not checked
    assert rows[("transformer", "bf16", True, 256)]["loss_check"]["ok"] is None
    assert rows[("umst", "bf16", False, 1024)]["words_per_flop_vs_transformer"] > 0
    shape = rows[("transformer_prime_shape", "bf16", False, 1024)]
    assert shape["baseline_row"] and rows[("prime", "bf16", False, 1024)]["words_per_flop_vs_own_shape"] > 0
    assert rows[("prime_simple", "bf16", False, 1024)]["words_per_flop_vs_own_shape"] > 0
    assert set(record["targets"]) >= {"transformer_vs_stock_fp16", "transformer_mfu", "bf16_vs_tf32",
                                      "compiled_losses_equal_eager"}
    table = path.with_suffix(".md").read_text()
    assert "## --max-tokens 1,024" in table and "| transformer | bf16 | yes |" in table


def test_the_same_command_again_keeps_the_rows_done(tiny_run):
    cmd, env, path, record, _ = tiny_run
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = sum(1 for r in record["rows"] if not r.get("error"))
    assert f"{kept} rows kept" in proc.stdout
    assert "fairseq-train --arch" not in proc.stdout  # nothing trained again but the skipped row's check
    again = json.loads(path.read_text())
    assert [r.get("words_per_s") for r in again["rows"]] == [r.get("words_per_s") for r in record["rows"]]
    # the first call's warm-up stays: the compiled row's loss check and cold compile seconds with it
    assert again["warm_up"]["transformer 1024"] == record["warm_up"]["transformer 1024"]
    compiled = {speed_table.row_key(r): r for r in again["rows"]}[("transformer", "bf16", True, 1024)]
    assert compiled["loss_check"]["ok"] is True
    assert compiled["compile_s"] == record["warm_up"]["transformer 1024"]["seconds"]
    assert again["started"] == record["started"] and len(again["calls"]) == len(record.get("calls", [])) + 1


def test_a_call_cut_short_resumes_without_compiling_again(tiny_run):
    """A call that stopped before the compiled row: the next one keeps the warm-up (the inductor cache is still
    there), runs no warm-up, measures the row and checks its losses against the kept warm-up's."""
    cmd, env, path, record, _ = tiny_run
    key = ("transformer", "bf16", True, 1024)
    cut = json.loads(path.read_text())
    cut["rows"] = [r for r in cut["rows"] if speed_table.row_key(r) != key]
    path.write_text(json.dumps(cut))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compile warm-up" not in proc.stdout and "transformer bf16 compiled 1,024 tokens: fairseq-train" in \
        proc.stdout
    again = json.loads(path.read_text())
    row = {speed_table.row_key(r): r for r in again["rows"]}[key]
    assert row["words_per_s"] > 0 and row["loss_check"]["ok"] is True
    assert again["warm_up"]["transformer 1024"] == record["warm_up"]["transformer 1024"]


def test_a_call_on_another_machine_keeps_the_first_calls_warm_ups(tiny_run):
    """A second call on a fresh machine (the lent GPU's inductor cache gone) whose own warm-up stops at its cap:
    the first call's finished warm-ups stay in the record, so the rows measured in either call keep their loss
    check and cold compile seconds (the H200 record of c706df0 lost them: every compiled row "not compared")."""
    cmd, env, path, record, _ = tiny_run
    key = ("transformer", "bf16", True, 1024)
    cut = json.loads(path.read_text())
    cut["rows"] = [r for r in cut["rows"] if speed_table.row_key(r) != key]
    path.write_text(json.dumps(cut))
    shutil.rmtree(os.path.join(cmd[cmd.index("--work") + 1], "inductor-cache"))
    proc = subprocess.run(cmd + ["--warm-up-timeout", "3"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compile warm-up transformer 1024: stopped at the warm-up cap" in proc.stdout, proc.stdout[:3000]
    again = json.loads(path.read_text())
    assert again["warm_up"]["transformer 1024"] == record["warm_up"]["transformer 1024"]
    rows = {speed_table.row_key(r): r for r in again["rows"]}
    assert rows[key]["words_per_s"] > 0 and rows[key]["loss_check"]["ok"] is True, rows[key]["loss_check"]
    assert rows[key]["compile_s"] == record["warm_up"]["transformer 1024"]["seconds"]
    assert again["targets"]["compiled_losses_equal_eager"]["met"] is True


def test_a_rows_cache_counts_are_those_of_its_own_run():
    """compile_cache_counts are the process's totals so far; a row's are what its run added (the plugin process
    compiles several rows one after another), and a state from before the counts were kept gives none."""
    before = dict.fromkeys((name for _, name in speed_table.CACHE_COUNTERS), 0)
    before.update(fxgraph_cache_hit=7, fxgraph_cache_miss=3, autograd_cache_hit=4)
    after = dict(before, fxgraph_cache_hit=12, fxgraph_cache_miss=5, autograd_cache_miss=1)
    assert speed_table.cache_difference(before, after) == dict(
        dict.fromkeys(before, 0), fxgraph_cache_hit=5, fxgraph_cache_miss=2, autograd_cache_miss=1)
    assert speed_table.cache_difference(None, after) is None
    assert set(speed_table.compile_cache_counts()) == set(before)


def test_merged_warm_ups_keep_what_finished():
    done = dict(seconds=40.0, losses_dropout_shifted=[[4, 9.5]])
    capped = dict(seconds=None, error="stopped at the warm-up cap (48 s)")
    again = dict(seconds=38.0, losses_dropout_shifted=[[4, 9.4]])
    merged = speed_table.merge_warm_ups({"a 1": done, "b 1": done, "c 1": capped, "d 1": done},
                                        {"a 1": capped, "b 1": again, "c 1": capped, "e 1": capped})
    assert merged == {"a 1": done, "b 1": again, "c 1": capped, "d 1": done, "e 1": capped}


def test_a_warm_up_counts_as_finished_with_its_losses_and_no_error_and_is_kept_only_beside_its_cache(tmp_path):
    done = dict(seconds=40.0, losses_dropout_shifted=[[4, 9.5]])
    failed_late = dict(done, error="RuntimeError: out of memory")  # losses of some updates, then an error
    assert speed_table.warm_up_finished(done)
    assert not speed_table.warm_up_finished(failed_late)
    assert not speed_table.warm_up_finished(dict(seconds=3.0, losses_dropout_shifted=[]))
    assert not speed_table.warm_up_finished(dict(seconds=None, error="no result (rc -9)"))
    warm_ups = {"a 1": done, "b 1": failed_late}
    cache = tmp_path / "inductor-cache"
    assert speed_table.warm_ups_kept(warm_ups, str(cache)) == {}  # another machine: no cache
    cache.mkdir()
    assert speed_table.warm_ups_kept(warm_ups, str(cache)) == {}  # an empty one: nothing compiled here
    (cache / "fxgraph").mkdir()
    assert speed_table.warm_ups_kept(warm_ups, str(cache)) == {"a 1": done}


def test_a_shape_baseline_named_in_archs_is_planned_once():
    """--archs prime_simple,transformer_prime_shape planned the transformer of Prime's shape twice (as an arch and
    as Prime's baseline): one row of each key, the baseline's, at the first batch only."""
    _, plugin = speed_table.plan("data-bin", [1024, 256], 8, 2, ["transformer", "prime_simple", "transformer_prime_shape"],
                                 ["transformer", "prime_simple", "transformer_prime_shape"], tiny=True)
    keys = [speed_table.row_key(r) for r in plugin]
    assert len(keys) == len(set(keys))
    shape = [r for r in plugin if r["name"] == "transformer_prime_shape"]
    assert [(r["compiled"], r["max_tokens"]) for r in shape] == [(False, 1024), (True, 1024)]
    assert all(r.get("baseline_row") for r in shape)
    # alone, it is an arch of its own
    _, alone = speed_table.plan("data-bin", [1024], 8, 2, ["transformer_prime_shape"], [], tiny=True)
    assert [(r["name"], r.get("baseline_row")) for r in alone] == [("transformer_prime_shape", None)]


def _losses(values, start=4, step=4):
    return [[start + step * i, v] for i, v in enumerate(values)]


def _row(name, precision, compiled, losses, wps=1000.0, flops=3e8, tokens=38400, stock=False):
    return dict(name=name, arch=name, stock=stock, precision=precision, compiled=compiled, max_tokens=tokens,
                words_per_s=wps, flops_per_token=None if compiled else flops, losses=_losses(losses))


def _record(compiled_losses, shifted, tf32=(9.50, 9.00, 8.50)):
    rows = [_row("transformer", "bf16", False, [9.50, 9.01, 8.50], wps=400000.0),
            _row("transformer", "tf32", False, list(tf32), wps=150000.0),
            _row("transformer", "bf16", True, compiled_losses, wps=500000.0),
            _row("stock transformer", "fp16", False, [9.5, 9.0, 8.5], wps=250000.0, stock=True)]
    return dict(card="NVIDIA H200", max_tokens=[38400], rows=rows,
                warm_up={"transformer 38400": dict(seconds=40.0, losses_dropout_shifted=_losses(shifted))})


def test_loss_check_tolerance_is_twice_the_measured_dropout_and_bf16_noise():
    # dropout noise 0.02 (the compiled row against its warm-up), bf16 noise 0.01: tolerance 2 x 0.03 = 0.06
    ok = speed_table.finish(_record([9.50, 9.02, 8.55], shifted=[9.52, 9.02, 8.55]))
    check = ok["rows"][2]["loss_check"]
    assert check["dropout_noise"] == 0.02 and check["precision_noise"] == 0.01 and check["tolerance"] == 0.06
    assert check["ok"] is True and check["max_abs_diff"] == 0.05
    # a compiled row that drifts by more than that (0.07 at the last update) is marked
    bad = speed_table.finish(_record([9.50, 9.02, 8.57], shifted=[9.52, 9.02, 8.57]))
    assert bad["rows"][2]["loss_check"]["ok"] is False
    assert bad["targets"]["compiled_losses_equal_eager"]["met"] is False
    assert "**differ**" in speed_table.markdown(bad)


def test_mfu_words_per_flop_and_targets_from_the_rows():
    record = speed_table.finish(_record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50]))
    rows = {speed_table.row_key(r): r for r in record["rows"]}
    compiled = rows[("transformer", "bf16", True, 38400)]
    assert compiled["flops_per_token"] == 3e8  # from its eager row
    assert compiled["mfu"] == pytest.approx(round(500000 * 3e8 / 989.4e12, 4))
    stock = rows[("stock transformer", "fp16", False, 38400)]
    assert stock["mfu"] == pytest.approx(round(250000 * 3e8 / 989.4e12, 4))  # the plugin transformer's FLOPs
    targets = record["targets"]
    assert targets["transformer_vs_stock_fp16"]["value"] == 2.0 and targets["transformer_vs_stock_fp16"]["met"]
    assert targets["transformer_mfu"]["value"] == round(500000 * 3e8 / 989.4e12, 3)
    assert targets["transformer_mfu"]["met"] is False
    assert targets["bf16_vs_tf32"]["value"] == round(400000 / 150000, 3)
    assert targets["bf16_vs_tf32"]["met"] is True
    assert targets["gpu_busy (least plugin row)"]["met"] is None  # no gpu_busy in these rows


def test_mfu_takes_the_cards_own_dense_bf16_peak():
    """The peak is matched by the card's name, the longer name first: an H100 PCIe (756 TFLOP/s) is not taken for
    the SXM H100 (989.4) whose name its own contains. A card not in the table has no MFU, not one against a guess."""
    assert speed_table.peak_flops("NVIDIA H100 PCIe") == 756.0e12
    assert speed_table.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert speed_table.peak_flops("NVIDIA H200") == 989.4e12
    assert speed_table.peak_flops("NVIDIA A100-SXM4-80GB") == 312.0e12
    assert speed_table.peak_flops("cpu") is None and speed_table.peak_flops(None) is None
    record = _record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50])
    record["card"] = "NVIDIA H100 PCIe"
    rows = {speed_table.row_key(r): r for r in speed_table.finish(record)["rows"]}
    assert rows[("transformer", "bf16", True, 38400)]["mfu"] == pytest.approx(round(500000 * 3e8 / 756.0e12, 4))
    record = _record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50])
    record["card"] = "cpu"
    finished = speed_table.finish(record)
    assert all(r["mfu"] is None for r in finished["rows"]) and finished["targets"]["transformer_mfu"]["met"] is None


def test_step_probe_counts_real_and_padded_tokens_and_the_flops_of_one_update():
    pad = 1
    src = torch.tensor([[pad, 5, 6, 2], [7, 8, 9, 2]])
    tgt = torch.tensor([[5, 2, pad], [7, 8, 2]])
    sample = dict(net_input=dict(src_tokens=src), target=tgt, ntokens=5)
    probe = speed_table.StepProbe(measured_from=1, count_flops=True, pad_index=pad)
    weight = torch.randn(4, 3)

    def train_step(samples, raise_oom=False):
        return torch.randn(2, 4) @ weight  # 2 x 4 x 3 multiply-adds: 48 FLOPs

    for _ in range(3):
        probe.step(train_step, [sample], False)
    assert probe.tokens == [(12, 14, 8, 2)] * 2  # updates 1, 2 (0-based): 7 + 5 real of 8 + 6; 2 x 4 budgeted; 2 sentences
    assert probe.flops == 48 and probe.flops_tokens == 5  # the second update (speed_table.FLOPS_UPDATE)
    assert probe.t0 is not None and probe.t1 >= probe.t0


def test_step_probe_times_the_host_between_measured_updates_and_inside_them():
    """The host's time between one measured update's train_step and the next one's (fairseq's loop waiting for the
    data loader's next batch) and inside train_step, per measured update: 30 ms of waiting, 10 ms of stepping here,
    each measured within the sleep's own resolution (the timer plus a loaded runner's scheduling, 15 ms allowed)."""
    import time

    sample = dict(net_input=dict(src_tokens=torch.tensor([[5, 6, 2]])), target=torch.tensor([[5, 2]]), ntokens=2)
    probe = speed_table.StepProbe(measured_from=1, count_flops=False, pad_index=1)

    def train_step(samples, raise_oom=False):
        time.sleep(0.010)

    for update in range(4):
        probe.step(train_step, [sample], False)
        time.sleep(0.030 if update else 0.2)  # the wait before the first measured update is not counted
    assert len(probe.gaps) == 2 and len(probe.inside) == 3  # gaps between updates 1-2 and 2-3 (0-based)
    assert all(0.030 <= g < 0.045 for g in probe.gaps), probe.gaps
    assert all(0.010 <= t < 0.025 for t in probe.inside), probe.inside


def test_an_update_that_amp_retried_is_not_the_one_whose_flops_are_counted():
    """fairseq's --amp retries a batch after an overflow by calling Trainer.train_step again from inside it: the
    retry passes through (one update, its tokens once), and the FLOPs come from the next update, which ran once."""
    pad = 1
    sample = dict(net_input=dict(src_tokens=torch.tensor([[5, 6, 2]])), target=torch.tensor([[5, 2]]), ntokens=2)
    probe = speed_table.StepProbe(measured_from=3, count_flops=True, pad_index=pad)
    weight = torch.randn(4, 3)
    calls = []

    def train_step(samples, raise_oom=False):
        calls.append(probe.calls)
        if probe.calls == 2 and calls.count(2) == 1:  # update 1 (0-based) overflows once: fairseq recurses
            probe.step(train_step, samples, raise_oom)
        return torch.randn(2, 4) @ weight  # 48 FLOPs

    for _ in range(5):
        probe.step(train_step, [sample], False)
    assert probe.retries == 1 and probe.calls == 5
    assert probe.flops == 48 and probe.flops_tokens == 2  # update 2's: update 1 ran the model twice (96)
    assert len(probe.tokens) == 2  # updates 3 and 4, once each


def test_peak_memory_is_taken_across_fairseqs_resets(monkeypatch):
    """fairseq's trainer resets the peak at every logged update; the row's peak is the largest before any reset
    (here a CUDA allocator's two counters, as torch.cuda keeps them, driven by the test: this machine has no GPU)."""
    state = dict(peak=0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: state["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: state.update(peak=0))
    with speed_table.PeakMemory(cuda=True) as peak:
        state["peak"] = 30 * 2 ** 30  # the first interval's peak
        torch.cuda.reset_peak_memory_stats()  # fairseq, logging gb_free
        state["peak"] = 2 ** 30  # after training: parameters and optimizer state
    assert peak.mib == 30 * 1024
    assert torch.cuda.reset_peak_memory_stats is not None and state["peak"] == 2 ** 30
    torch.cuda.reset_peak_memory_stats()  # restored: no longer recorded
    assert peak.mib == 30 * 1024 and speed_table.PeakMemory(cuda=False).mib is None


def test_a_corpus_built_on_another_machine_is_used_and_one_of_other_code_is_built_again(tmp_path, capsys):
    """--corpus-only builds the corpus a lent GPU would build; its data-bin and stamp, carried into another work dir
    without the raw text, spare the call its building. The corpus is the same bytes wherever it is built (what makes
    carrying it sound); a stamp of other generator code, or of other sizes, makes it built again."""
    def corpus_only(work):
        assert speed_table.main(["--tiny", "--corpus-only", "--work", str(work)]) == 0
        return capsys.readouterr().out

    def digests(databin):  # preprocess.log names the machine's paths
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(databin.iterdir())
                if f.name != "preprocess.log"}

    built = corpus_only(tmp_path / "here")
    assert "corpus " in built and "built in" in built, built
    here = tmp_path / "here" / "corpus"
    stamp = json.loads((here / speed_table.CORPUS_STAMP).read_text())
    assert stamp == dict(speed_table.TINY_CORPUS, code=stamp["code"]) and len(stamp["code"]) == 16
    carried = tmp_path / "gpu" / "corpus"
    carried.mkdir(parents=True)
    shutil.copytree(here / "data-bin", carried / "data-bin")
    shutil.copy(here / speed_table.CORPUS_STAMP, carried / speed_table.CORPUS_STAMP)
    assert "built before" in corpus_only(tmp_path / "gpu")
    assert not (carried / "raw").exists()  # not built again

    (carried / speed_table.CORPUS_STAMP).write_text(json.dumps(dict(stamp, code="0" * 16)))
    assert "built in" in corpus_only(tmp_path / "gpu")  # another generator's corpus: built anew, the same bytes
    assert digests(carried / "data-bin") == digests(here / "data-bin")
    assert json.loads((carried / speed_table.CORPUS_STAMP).read_text()) == stamp
    (carried / speed_table.CORPUS_STAMP).write_text(json.dumps(dict(stamp, train=stamp["train"] + 1)))
    assert "built in" in corpus_only(tmp_path / "gpu")


def test_a_warm_up_stopped_at_the_cap_says_where_it_was_compiling(tiny_run, tmp_path, capsys):
    """A compile warm-up still running at the cap writes its training thread's stack (faulthandler, on STACK_SIGNAL)
    before it is killed; the warm-up's result says it was stopped and where (the GPU's TranSFormer warm-up was
    stopped twice with nothing in its log to say how far it had got)."""
    cmd, env, _, _, _ = tiny_run
    data = os.path.join(cmd[cmd.index("--work") + 1], "corpus", "data-bin")
    _, plugin = speed_table.plan(data, [1024], 8, 2, ["transformer"], ["transformer"], tiny=True)
    [row] = [r for r in plugin if r["compiled"]]
    child_env = dict(speed_table.process_env(), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"))  # cold
    # one warm-up at a time (a card of 1 GiB holds one at 1,024 tokens), a broken row first: it fails once its
    # process has imported torch and fairseq (3-10 s), and the row starts in the second wave with the rest of the
    # cap. 20 s: the tiny row's warm-up takes 19-30 s here (a cold compile of 17 s and more), its stack handler is
    # set within a second of its start
    broken = dict(row, name="broken", argv=[str(tmp_path / "no-such-data-bin")] + row["argv"][1:])
    assert speed_table.warm_up_slots([broken, row], 1) == 1
    results = speed_table.warm_up([broken, row], str(tmp_path), child_env, timeout=20, card_gib=1)
    assert results["broken 1024"]["error"].startswith("FileNotFoundError"), results
    result = results["transformer 1024"]
    assert result["seconds"] is None, result
    # the cap counts from the first start: the row had what the broken one left of it
    assert re.match(r"stopped at the warm-up cap \(20 s; it had run \d+ s\), still running", result["error"]), result
    assert 1 <= result["ran_s"] <= 18 and f"it had run {result['ran_s']:.0f} s" in result["error"], result
    stack = result["stack_at_cap"]
    log = (tmp_path / "warm-up-transformer-1024-log.txt").read_text()
    assert stack and f"{speed_table.MAIN_THREAD_LINE} {stack['thread']}" in log, result
    assert re.search(rf"(?:Current thread|Thread) {stack['thread']} \(most recent call first\):", log), result
    assert stack["frames"], result
    assert stack["where"].startswith(stack["frames"][0]) and f"in {stack['where']}" in result["error"]
    assert "stopped at the warm-up cap" in capsys.readouterr().out
    assert result["compile_log"] == speed_table.compile_log(str(tmp_path / "warm-up-transformer-1024-log.txt"))
    print(result["error"], result["compile_log"])


def test_the_stack_at_the_cap_names_the_layer_and_the_compiler_part_it_was_in(tmp_path):
    """stack_at_cap reads faulthandler's dump: the training thread's frames (the id the warm-up logged), not those of
    the thread the signal came to, a compile worker's here; the plugin's innermost frame outside compilation/ and the
    compiler part of the innermost frame that names one; a dump that begins in a garbage collection."""
    site = "/venv/lib/python3.11/site-packages"
    log = tmp_path / "warm-up-log.txt"
    log.write_text(
        f"{speed_table.MAIN_THREAD_LINE} 0x00007f0000000002\n"
        "INFO: training\n"
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        f'  File "{site}/torch/_inductor/compile_worker/subproc_pool.py", line 10 in _read\n'
        "\n"
        "Thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{site}/sympy/core/basic.py", line 5 in subs\n'
        f'  File "{site}/torch/_inductor/sizevars.py", line 7 in simplify\n'
        f'  File "{site}/torch/_dynamo/eval_frame.py", line 9 in _fn\n'
        f'  File "{ROOT}/umst_plugin/compilation/dispatch.py", line 62 in _dispatch\n'
        f'  File "{ROOT}/umst_plugin/modules/transformer_sf/layer.py", line 280 in blocks\n'
        "  ...\n")  # deeper than faulthandler's 100 frames
    stack = speed_table.stack_at_cap(str(log))
    assert stack["thread"] == "0x00007f0000000002"
    assert stack["frames"][0] == "sympy/core/basic.py:5 in subs" and len(stack["frames"]) == 5
    assert stack["layer"] == "umst_plugin/modules/transformer_sf/layer.py:280 in blocks"
    assert stack["phase"] == "symbolic shapes"
    assert stack["where"] == ("sympy/core/basic.py:5 in subs, symbolic shapes, "
                              "under umst_plugin/modules/transformer_sf/layer.py:280 in blocks")
    # the signal came during a garbage collection: faulthandler says so before the frames (a CI run's warm-up)
    log.write_text(f"{speed_table.MAIN_THREAD_LINE} 0x00007f0000000002\n"
                   "Current thread 0x00007f0000000002 (most recent call first):\n"
                   "  Garbage-collecting\n"
                   '  File "/usr/lib/python3.11/copy.py", line 161 in deepcopy\n'
                   f'  File "{site}/omegaconf/nodes.py", line 103 in _deepcopy_impl\n\n')
    stack = speed_table.stack_at_cap(str(log))
    assert stack["frames"] == ["/usr/lib/python3.11/copy.py:161 in deepcopy", "omegaconf/nodes.py:103 in _deepcopy_impl"]
    log.write_text("INFO: training\n")
    assert speed_table.stack_at_cap(str(log)) is None


def test_frames_every_compiler_phase_passes_through_name_none(tmp_path):
    """The H200's warm-up of the transformer of Prime's shape (bcc7a7e's record), stopped at its cap while
    AOTAutograd traced a layer's joint graph: dynamo's disable wrapper (``eval_frame.py ... in _fn``, around every
    decomposition) and the FX interpreter's ``run_node`` sit inside AOTAutograd's frames, and named the phase
    "dynamo". The innermost frames of that stack, in its order."""
    site = "/venv/lib/python3.12/site-packages"
    frames = [("torch/_prims_common/__init__.py", 1552, "number_type"),
              ("torch/_dynamo/eval_frame.py", 1263, "_fn"),
              ("torch/_compile.py", 54, "inner"),
              ("torch/_subclasses/fake_tensor.py", 2788, "_dispatch_impl"),
              ("torch/_decomp/decompositions.py", 1192, "native_dropout"),
              ("torch/fx/interpreter.py", 380, "call_function"),
              ("torch/fx/experimental/symbolic_shapes.py", 8187, "run_node"),
              ("torch/_functorch/_aot_autograd/graph_capture_wrappers.py", 1500, "functional_call"),
              ("torch/_inductor/compile_fx.py", 2850, "_compile_fx_main"),
              ("torch/_dynamo/convert_frame.py", 1827, "_compile")]
    log = tmp_path / "warm-up-log.txt"
    log.write_text(f"{speed_table.MAIN_THREAD_LINE} 0x00007f3a11663140\n"
                   "Current thread 0x00007f3a11663140 (most recent call first):\n"
                   + "".join(f'  File "{site}/{path}", line {line} in {function}\n' for path, line, function in frames))
    stack = speed_table.stack_at_cap(str(log))
    assert len(stack["frames"]) == len(frames)
    assert stack["phase"] == "AOTAutograd", stack["where"]
    assert stack["where"] == "torch/_prims_common/__init__.py:1552 in number_type, AOTAutograd"
    # a symbolic-shapes frame that is not the interpreter's node runner still names its phase
    log.write_text(log.read_text().replace("8187 in run_node", "8187 in evaluate_expr"))
    assert speed_table.stack_at_cap(str(log))["phase"] == "symbolic shapes"


def test_a_warm_up_that_did_not_finish_keeps_its_compile_lines(tmp_path):
    """A warm-up's log stays on the GPU machine; the record keeps the plugin's last ``--compile:`` lines (what had
    compiled, in how long), from ``--compile:`` on whatever the logging format put before it."""
    log = tmp_path / "warm-up-log.txt"
    lines = [f"2026-12-04 18:46:{i:02d} | INFO | umst_plugin.compilation | --compile: Layer{i}.forward compiled in "
             f"{i}.0 s (training, autograd; 1 new graph(s))" for i in range(25)]
    log.write_text("INFO: training\n" + "\n".join(lines) + "\nINFO:umst_plugin.compilation.flags:--compile: update "
                   "1: compile: 9.0 s\n{'loss': 9.1}\n")
    got = speed_table.compile_log(str(log))
    assert len(got) == speed_table.COMPILE_LOG_LINES
    assert got[-1] == "--compile: update 1: compile: 9.0 s"
    assert got[0] == "--compile: Layer6.forward compiled in 6.0 s (training, autograd; 1 new graph(s))"
    assert speed_table.compile_log(str(log), limit=2) == got[-2:]
    assert speed_table.compile_log(str(tmp_path / "missing.txt")) == []


def test_the_cap_waits_for_the_stacks_as_long_as_they_take_to_be_written(tmp_path):
    """wait_for_stacks returns once each log holds its training thread's stack and has stopped growing (a warm-up
    on a loaded machine wrote its dump after the 2 s first waited, and the CI run's result had no stack), and at its
    limit where a log never gets one."""
    import threading
    import time

    late, never = tmp_path / "late-log.txt", tmp_path / "never-log.txt"
    for log in (late, never):
        log.write_text(f"{speed_table.MAIN_THREAD_LINE} 0x00007f0000000002\n")

    def dump():  # as faulthandler does, when the process next runs: the training thread, then the others' stacks
        time.sleep(1.5)
        with open(late, "a") as f:
            f.write("Current thread 0x00007f0000000002 (most recent call first):\n"
                    '  File "/x/torch/_dynamo/eval_frame.py", line 9 in _fn\n'
                    '  File "/x/torch/_inductor/graph.py", line 3 in run\n')
        for worker in range(15):  # a compile worker's stack every 0.1 s until 3 s: the log still grows
            time.sleep(0.1)
            with open(late, "a") as f:
                f.write(f"\nThread 0x00007f00000001{worker:02x} (most recent call first):\n"
                        '  File "/x/concurrent/futures/thread.py", line 81 in _worker\n')

    writer = threading.Thread(target=dump)
    start = time.time()
    writer.start()
    assert speed_table.stack_at_cap(str(late)) is None
    assert speed_table.wait_for_stacks([str(late)], limit=20, poll=0.25)
    waited, stack = time.time() - start, speed_table.stack_at_cap(str(late))
    writer.join()
    # not before the log stopped growing: its stack was whole at 1.5 s, the other threads' were written until 3 s
    assert 3.0 <= waited < 6 and len(stack["frames"]) == 2, (waited, stack)
    start = time.time()
    assert not speed_table.wait_for_stacks([str(late), str(never)], limit=1.0, poll=0.25)
    assert 1.0 <= time.time() - start < 3
    assert speed_table.wait_for_stacks([])


def test_warm_ups_run_as_many_at_once_as_the_card_holds():
    rows = [dict(name=n, max_tokens=38400) for n in ("transformer", "umst", "msc", "prime", "msmsa", "umst_rpr")]
    assert speed_table.warm_up_slots(rows, card_gib=139.8) == 4  # 0.95 x 139.8 GiB over 0.8 GiB x 38.4
    assert speed_table.warm_up_slots(rows, card_gib=None) == 6  # a CPU: all at once
    assert speed_table.warm_up_slots(rows[:2], card_gib=139.8) == 2
    assert speed_table.warm_up_slots(rows, card_gib=20.0) == 1


def test_warm_ups_start_with_the_longest_compile_an_earlier_record_measured(tmp_path):
    (tmp_path / "gpu-speed-card-abc.json").write_text(json.dumps(dict(warm_up={
        "umst 38400": dict(seconds=64.0), "prime 38400": dict(seconds=97.0),
        "transformer_sf 38400": dict(seconds=None, error="no result (rc -9)")},
        rows=[dict(name="prime", arch="prime_base"), dict(name="umst", arch="umst_base")])))
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "gpu-speed-card-def.json").write_text(json.dumps(dict(warm_up={"umst 38400": dict(seconds=70.0)})))
    assert speed_table.compile_seconds_known(str(committed)) == {"umst 38400": 70.0}  # (no rows: no arch)
    # the call's --out and the committed records: a fresh checkout's empty --out still knows the longest
    known = speed_table.compile_seconds_known(str(tmp_path), str(committed), str(tmp_path))
    assert known["prime 38400"] == 97.0 and known["transformer_sf 38400"] == float("inf")
    assert known["umst 38400"] == 70.0
    rows = [dict(name=n, max_tokens=38400) for n in ("transformer", "umst", "prime", "transformer_sf")]
    rows.insert(0, dict(name="msc", max_tokens=38400))  # not known: after the known ones, in the plan's order
    # a row of a measured arch at another shape (UMST's MUSE is prime_base at 6+6 layers): by its arch's seconds
    rows.append(dict(name="prime_muse", arch="prime_base", max_tokens=38400))
    order = speed_table.warm_up_order(rows, known)
    assert [r["name"] for r in order] == ["transformer_sf", "prime", "prime_muse", "umst", "msc", "transformer"]


def test_targets_over_several_rows_name_the_rows_not_measured():
    record = _record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50])
    record["rows"] += [_row("umst", "bf16", False, [9.6, 9.1, 8.6], wps=300000.0, flops=3.3e8),
                       _row("umst", "bf16", True, [9.6, 9.1, 8.6], wps=380000.0),
                       dict(_row("msc", "bf16", True, [9.6]), words_per_s=None, error="not run (deadline)")]
    for r in record["rows"]:
        r["gpu_busy"] = None if r.get("error") else 0.8
    record["rows"][0]["gpu_busy"] = 0.6
    targets = speed_table.finish(record)["targets"]
    per_flop = targets["words_per_flop_vs_transformer (worst compiled)"]
    assert per_flop["value"] == round(380000 * 3.3e8 / (500000 * 3e8), 3) and per_flop["met"] is True
    assert per_flop["rows"] == 1 and per_flop["missing"] == ["msc compiled"]
    busy = targets["gpu_busy (least plugin row)"]
    assert busy["value"] == 0.6 and busy["met"] is False and busy["missing"] == ["msc compiled"]
    assert "not measured: msc compiled" in speed_table.markdown(record)


# kernel names as the H200's and H100's profiles of fairseq-train updates printed them (cuBLAS, cuDNN, ATen, inductor)
KERNEL_NAMES = {
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel":
        "matmul",
    "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT": "matmul",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>": "matmul",
    "triton_tem_fused_mm_0": "matmul",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>":
        "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention",
    "triton_per_fused__log_softmax_native_layer_norm_0": "fused (inductor)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
    "namespace)::LogSoftMaxForwardEpilogue>": "softmax and loss",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": "layer norm",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>>": "optimizer",
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int>":
        "dropout",
    "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#1}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >": "copy and cast",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>>>":
        "reduction",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >": "elementwise",
    "void dynamic_conv_forward_kernel<float>": "convolution",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "communication",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>":
        "copy and cast",
    "some_kernel_nobody_named": "other",
}


def test_kernels_are_put_in_the_category_their_names_say():
    from benchmarks import common

    assert {name: common.kernel_category(name) for name in KERNEL_NAMES} == KERNEL_NAMES


def test_kernel_time_of_a_profile_by_category_and_by_kernel():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks import common

    def op(*kernels, device=DeviceType.CPU):
        return SimpleNamespace(device_type=device, kernels=[SimpleNamespace(name=n, duration=us) for n, us in kernels])
    gemm, norm = "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "vectorized_layer_norm_kernel"
    events = [op((gemm, 3000.0), ("Memcpy HtoD (Pageable -> Device)", 900.0)), op((norm, 500.0)),
              op((gemm, 1000.0), (norm, 250.0)), op((gemm, 77.0), device=DeviceType.CUDA)]  # a device event: not an op
    out = common.kernel_breakdown(events, top=1)
    assert out["kernels"] == 4 and out["kernel_ms"] == 4.75  # the copy is not a kernel
    assert out["by_category"] == {"matmul": 4.0, "layer norm": 0.75}
    assert out["top"] == [[gemm, 4.0, 2]]


def test_one_update_before_the_measured_ones_is_profiled():
    """The probe runs PROFILE_UPDATE under torch.profiler (on a CPU no kernels: the breakdown is empty), and that
    update only: not the FLOP-counted one, not a measured one."""
    sample = dict(net_input=dict(src_tokens=torch.tensor([[5, 6, 2]])), target=torch.tensor([[5, 2]]), ntokens=2)
    probe = speed_table.StepProbe(measured_from=4, count_flops=True, pad_index=1, profile=True)
    profiled = []

    def train_step(samples, raise_oom=False):
        import torch.autograd.profiler as autograd_profiler

        profiled.append(autograd_profiler._is_profiler_enabled)
        return torch.randn(2, 4) @ torch.randn(4, 3)

    for _ in range(6):
        probe.step(train_step, [sample], False)
    assert profiled == [False, False, True, False, False, False]  # update 2 (0-based), inside the dropped interval
    assert probe.kernels["update"] == speed_table.PROFILE_UPDATE and probe.kernels["target_tokens"] == 2
    assert probe.kernels["kernels"] == 0 and probe.flops == 48


def test_kernel_mfu_and_the_kernel_table_from_a_profiled_row():
    record = _record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50])
    record["rows"][0]["kernels"] = dict(kernels=1500, kernel_ms=50.0, target_tokens=20000, update=2,
                                        by_category={"matmul": 30.0, "softmax and loss": 5.0, "elementwise": 15.0},
                                        top=[])
    finish = speed_table.finish(record)
    k = finish["rows"][0]["kernels"]
    assert k["kernel_mfu"] == round(3e8 * 20000 / 0.05 / 989.4e12, 4)  # FLOPs of the update over kernel time
    table = "\n".join(speed_table.kernel_markdown(finish, 38400))
    assert "| transformer bf16 | no | 1,500 | 50.0 | 0.121 | 60 |" in table  # matmul 60% of kernel time
    assert "Kernel time of update 3" in speed_table.markdown(finish)


def test_nvidia_smi_lines_are_read_as_percentages():
    assert speed_table.parse_utilization("87\n") == 87.0
    assert speed_table.parse_utilization("[N/A]") is None
    assert speed_table.parse_utilization("Failed to initialize NVML") is None
    busy = speed_table.GpuBusy(enabled=False)
    busy.samples = [(1.0, 20.0), (2.0, 80.0), (3.0, 100.0)]
    assert busy.between(1.5, 3.0) == 0.9 and not busy.available
    assert busy.per_interval([0.5, 1.5, 3.0]) == [0.2, 0.9]  # per log interval: a row's gpu_busy is their median
    # an interval that recompiled (20% busy) among steady ones: the median is the steady card's, as words/s is
    busy.samples += [(4.0, 70.0), (5.0, 80.0)]
    assert busy.of_intervals([0.5, 1.5, 2.5, 3.5, 4.5, 5.5]) == ([0.2, 0.8, 1.0, 0.7, 0.8], 0.8)  # (mean 0.7)
    assert busy.of_intervals([10.0, 11.0]) == ([None], None)  # no sample in the span


def test_the_cudagraph_plan_runs_at_tiny_sizes_on_a_cpu(tiny_run, tmp_path):
    """``--cudagraphs`` (docs/compile.md): the transformer in bf16 eager, compiled on 8 length buckets, and the same
    with --compile-cudagraphs (which a CPU leaves out, with a warning), into a record of its own; the bucketed
    rows take the eager row's FLOPs per token; the CUDA graph row's losses are compared with the bucketed row's,
    the rows a variant of the transformer that no target counts. In the tiny run's work folder, as a second call
    on a GPU machine would be: its corpus, and its inductor cache, which holds the transformer's compiled layers."""
    table_cmd, env, table_path, _, _ = tiny_run
    work = Path(table_cmd[table_cmd.index("--work") + 1])
    table_before = table_path.read_bytes()
    cmd = ["bash", os.path.join(ROOT, "scripts", "gpu-speed.sh"), "--tiny", "--cudagraphs", "--archs", "transformer",
           "--updates", "4", "--out", str(table_path.parent), "--work", str(work), "--commit", "abc1234"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((table_path.parent / "speed-cudagraphs-cpu-tiny-abc1234.json").read_text())
    assert table_path.read_bytes() == table_before  # the table's record untouched
    rows = {r["name"]: r for r in record["rows"]}
    assert list(rows) == ["transformer", "transformer buckets", "transformer cudagraphs"]
    assert [p["max_tokens"] for p in record["plan"]] == [1024] * 3 and not any(r["stock"] for r in rows.values())
    eager, buckets, graphs = rows.values()
    assert "--num-batch-buckets" not in eager["argv"] and "--compile" not in eager["argv"]
    assert buckets["argv"][-3:] == ["--compile", "--num-batch-buckets", "8"]
    assert graphs["argv"][-4:] == ["--compile", "--num-batch-buckets", "8", "--compile-cudagraphs"]
    for r in rows.values():
        assert "error" not in r and r["words_per_s"] > 0 and r["updates"] == 4, r
    assert buckets["flops_per_token"] == graphs["flops_per_token"] == eager["flops_per_token"] > 0
    assert graphs["cudagraph_shapes"] == {} and "cudagraph_shapes" not in buckets  # (a CPU records none)
    assert buckets["loss_check"]["ok"] is None and "bucketed batches" in buckets["loss_check"]["why"]
    assert graphs["loss_check"]["precision_noise"] == 0.0 and graphs["loss_check"]["ok"] is True, graphs["loss_check"]
    assert "| transformer cudagraphs | bf16 | yes |" in speed_table.markdown(record)
    assert "= transformer buckets" in speed_table.markdown(record)
    # the rows' log and the CUDA graph row's warm-up: a CPU has none
    for log in ("plugin-log.txt", "warm-up-transformer-cudagraphs-1024-log.txt"):
        assert "--compile-cudagraphs: CUDA graphs need a CUDA device" in (work / log).read_text(), log
    assert record["targets"]["compiled_losses_equal_eager"]["rows"] == 0  # variants: no target counts them


# ---- a row's record from what its run measured, and the loop that runs the rows (found by a flip sweep) ----------

def _records(updates=(2, 4, 6, 8), wps=(100.0, 200.0, 300.0, 400.0), wpb=(500.0, 600.0, 700.0, 800.0)):
    """fairseq's train_inner records as --log-format json logs them (values as strings), each stamped when logged."""
    return [dict(num_updates=str(u), wps=str(w), wpb=str(b), loss=str(10.0 - u / 10), logged_at=float(i))
            for i, (u, w, b) in enumerate(zip(updates, wps, wpb))]


class _SampledBusy(speed_table.GpuBusy):
    """nvidia-smi's samples as the sampler keeps them, given by the test (this machine has no GPU)."""
    available = True

    def __init__(self, samples):
        super().__init__(enabled=False)
        self.samples = samples


def _probe(tokens=((10, 12, 14, 2), (20, 22, 24, 4), (30, 32, 34, 6))):
    probe = speed_table.StepProbe(measured_from=1, count_flops=True, pad_index=1)
    probe.tokens = list(tokens)
    probe.flops, probe.flops_tokens = 480.0, 4
    probe.gaps, probe.inside = [0.001, 0.003, 0.002], [0.010, 0.030, 0.020]
    return probe


def _plan_row(compiled=False, extra=(), updates=8, max_tokens=100):
    return dict(name="transformer", arch="transformer", stock=False, precision="bf16", compiled=compiled,
                max_tokens=max_tokens, argv=["data-bin", "--max-update", str(updates), *extra])


def test_a_rows_figures_are_the_medians_after_its_first_log_interval():
    """words/s and target tokens per step: the medians over the log intervals after the first (which holds the
    start-up); tokens per step over the probe's measured updates; FLOPs per token of the counted update; the host's
    ms; the GPU busy fraction per interval after the first, and its median; the peak as given."""
    busy = _SampledBusy([(0.5, 20.0), (1.5, 80.0), (2.5, 60.0)])
    out = speed_table.row_result(_plan_row(), _records(), 12.34, _probe(), 2048, busy)
    assert out["seconds"] == 12.3 and out["updates"] == 8 and "error" not in out
    assert out["words_per_s"] == 300.0 and out["target_tokens_per_step"] == 700.0  # not 250 / 650 (with the first)
    assert out["wps_records"] == [100.0, 200.0, 300.0, 400.0]
    assert out["losses"] == [[2, 9.8], [4, 9.6], [6, 9.4], [8, 9.2]]
    assert (out["real_tokens_per_step"], out["padded_tokens_per_step"], out["sentences_per_step"]) == (20, 22, 4)
    assert out["batch_fill"] == 0.24  # 24 budgeted of --max-tokens 100
    assert out["flops_per_token"] == 120.0
    assert out["between_updates_ms"] == 2.0 and out["train_step_ms"] == 20.0
    assert out["gpu_busy_intervals"] == [0.2, 0.8, 0.6] and out["gpu_busy"] == 0.6
    assert out["peak_mib"] == 2048
    assert "amp_retries" not in out and "kernels" not in out and "compile_s_in_row" not in out


def test_a_row_with_one_record_or_without_a_gpu_or_a_count_has_none_of_those_figures():
    one = speed_table.row_result(_plan_row(updates=2), _records()[:1], 1.0, _probe(tokens=()), None,
                                 _SampledBusy([(0.5, 20.0)]))
    assert one["words_per_s"] is None and one["target_tokens_per_step"] is None and one["gpu_busy"] is None
    assert "real_tokens_per_step" not in one and "error" not in one  # --max-update 2, reached
    assert "gpu_busy_intervals" not in one  # (no interval after the first)
    probe = _probe()
    probe.flops_tokens = 0  # a counted update of no target tokens: no figure, not a division by zero
    no_gpu = speed_table.row_result(_plan_row(), _records(), 1.0, probe, None, speed_table.GpuBusy(enabled=False))
    assert no_gpu["gpu_busy"] is None and "gpu_busy_intervals" not in no_gpu and "flops_per_token" not in no_gpu
    probe.flops, probe.flops_tokens = None, 4  # a compiled row counts none (it takes its eager row's)
    no_count = speed_table.row_result(_plan_row(), _records(), 1.0, probe, None, speed_table.GpuBusy(enabled=False))
    assert "flops_per_token" not in no_count
    no_wpb = [{k: v for k, v in r.items() if k != "wpb"} for r in _records()]
    assert speed_table.row_result(_plan_row(), no_wpb, 1.0, _probe(), None,
                                  speed_table.GpuBusy(enabled=False))["target_tokens_per_step"] is None


def test_a_row_that_stopped_early_says_where_and_one_that_ran_through_does_not():
    stopped = speed_table.row_result(_plan_row(updates=12), _records(), 1.0, _probe(), None,
                                     speed_table.GpuBusy(enabled=False))
    assert stopped["error"] == "stopped at update 8 of 12"
    none = speed_table.row_result(_plan_row(updates=8), [], 1.0, _probe(tokens=()), None,
                                  speed_table.GpuBusy(enabled=False))
    assert none["updates"] == 0 and none["error"] == "stopped at update 0 of 8" and none["losses"] == []
    assert speed_table.max_update(["data-bin", "--max-update", "24", "--seed", "1"]) == 24


def test_a_compiled_row_keeps_what_its_own_run_compiled_and_its_cuda_graph_shapes():
    cache = dict.fromkeys((name for _, name in speed_table.CACHE_COUNTERS), 0)
    before = dict(seconds=10.0, graphs=3, fallbacks=["a: why"], cache=cache, graph_shapes={})
    after = dict(seconds=25.5, graphs=7, fallbacks=["a: why", "b: why not"], cache=dict(cache, fxgraph_cache_hit=4),
                 graph_shapes={"TransformerEncoderLayerBase": (3, 1)})
    probe = _probe()
    probe.retries, probe.kernels = 2, dict(kernels=10)
    out = speed_table.row_result(_plan_row(compiled=True), _records(), 1.0, probe, None,
                                 speed_table.GpuBusy(enabled=False), before, after)
    assert out["compile_s_in_row"] == 15.5 and out["compiled_graphs_in_row"] == 4
    assert out["eager_fallbacks"] == ["b: why not"] and out["compile_cache_in_row"]["fxgraph_cache_hit"] == 4
    assert out["amp_retries"] == 2 and out["kernels"] == dict(kernels=10)
    assert "cudagraph_shapes" not in out
    graphs = speed_table.row_result(_plan_row(compiled=True, extra=["--compile-cudagraphs"]), _records(), 1.0,
                                    probe, None, speed_table.GpuBusy(enabled=False), before, after)
    assert graphs["cudagraph_shapes"] == {"TransformerEncoderLayerBase": dict(recorded=3, beyond_cap=1)}


def test_the_row_loop_records_rows_past_the_deadline_skips_fp16_without_cuda_and_records_a_failed_row(
        tmp_path, capsys):
    """``child``: with no time left before the deadline (less than MIN_ROW_SECONDS) a row is recorded "not run";
    without a deadline, stock --fp16 on a machine without CUDA is recorded skipped; a row whose fairseq-train fails
    is recorded with the error, and the loop goes on. Nothing here trains."""
    stock, plugin = speed_table.plan(str(tmp_path / "no-data-bin"), [1024], 4, 2, ["transformer"], [], tiny=True)
    fp16 = stock[0]
    assert fp16["precision"] == "fp16"

    def run(rows, deadline, is_stock):
        plan_path, record_path = tmp_path / "plan.json", tmp_path / "record.json"
        plan_path.write_text(json.dumps(dict(stock=is_stock, rows=rows, measured_from=1)))
        record_path.write_text(json.dumps(dict(rows=[], plan=rows, max_tokens=[1024])))
        assert speed_table.child(str(plan_path), str(record_path), deadline) == 0
        return {speed_table.row_key(r): r for r in json.loads(record_path.read_text())["rows"]}, capsys.readouterr().out

    rows, out = run(stock, time.time() + speed_table.MIN_ROW_SECONDS - 2, True)
    assert [r["error"] for r in rows.values()] == ["not run (deadline)"] * 2
    assert "[speed] stock transformer fp16 1,024 tokens: not run (deadline)" in out
    rows, out = run([fp16], 0, True)  # no deadline
    assert rows[speed_table.row_key(fp16)]["error"] == "skipped: fairseq's --fp16 (FP16Optimizer) needs CUDA"
    rows, out = run([plugin[0], fp16], time.time() + 3600, False)
    failed = rows[speed_table.row_key(plugin[0])]
    assert failed["error"].startswith("FileNotFoundError: ") and "no-data-bin" in failed["error"], failed["error"]
    assert rows[speed_table.row_key(fp16)]["error"].startswith("skipped")
    assert "[speed] transformer bf16 1,024 tokens: fairseq-train" in out


def test_a_row_recorded_again_replaces_its_own_key_only(tmp_path):
    path = tmp_path / "record.json"
    a, b = _row("transformer", "bf16", False, [9.5]), _row("umst", "bf16", False, [9.6])
    path.write_text(json.dumps(dict(rows=[a, b], plan=[a, b], max_tokens=[38400])))
    speed_table.update_record(str(path), dict(a, words_per_s=123.0))
    rows = json.loads(path.read_text())["rows"]
    assert [(r["name"], r["words_per_s"]) for r in rows] == [("transformer", 123.0), ("umst", 1000.0)]
    assert (tmp_path / "record.md").exists() and not (tmp_path / "record.json.tmp").exists()


def test_the_plan_s_stock_rows_are_stock_fairseq_and_its_variants_compile():
    """Both stock rows run fairseq's own task without the plugin; a shape baseline is compiled only where an arch
    of that shape is (not because some other arch compiles); the CUDA graph plan's bucketed rows compile; without
    --tiny the rows keep the arch's own depth."""
    stock, plugin = speed_table.plan("data-bin", [1024], 8, 2, ["transformer", "prime"], ["transformer"])
    assert [(r["name"], r["precision"], r["stock"]) for r in stock] == [
        ("stock transformer", "fp16", True), ("stock transformer", "fp16-amp", True)]
    for r in stock:
        assert r["argv"][r["argv"].index("--task") + 1] == "translation" and "--user-dir" not in r["argv"]
    for r in plugin:
        assert not r["stock"] and r["argv"][r["argv"].index("--task") + 1] == "multiscale_translation"
    baseline = [(r["name"], r["compiled"]) for r in plugin if r.get("baseline_row")]
    assert baseline == [("transformer_prime_shape", False)]  # prime is not compiled: its shape's row neither
    _, compiled = speed_table.plan("data-bin", [1024], 8, 2, ["transformer", "prime"], ["transformer", "prime"])
    assert [(r["name"], r["compiled"]) for r in compiled if r.get("baseline_row")] == [
        ("transformer_prime_shape", False), ("transformer_prime_shape", True)]
    assert all("--encoder-layers" not in r["argv"] or r["argv"][r["argv"].index("--encoder-layers") + 1] != "1"
               for r in plugin)  # (--tiny's one layer only where asked)
    _, graphs = speed_table.plan("data-bin", [1024], 8, 2, ["transformer"], [], cudagraph_buckets=8)
    assert [(r["name"], r["compiled"]) for r in graphs] == [
        ("transformer", False), ("transformer buckets", True), ("transformer cudagraphs", True)]


def test_the_probe_profiles_and_counts_only_before_the_measured_updates_and_prints_nothing(capsys):
    """No profile unless asked; not a measured update's, where the profiled update would be measured
    (``measured_from`` at PROFILE_UPDATE); an update retried at FLOPS_UPDATE leaves none counted where the next
    one is measured; the FLOP counter prints no table; ``t0`` is the first measured update's start."""
    sample = dict(net_input=dict(src_tokens=torch.tensor([[5, 6, 2]])), target=torch.tensor([[5, 2]]), ntokens=2)
    profiled, starts = [], []

    def train_step(samples, raise_oom=False):
        import torch.autograd.profiler as autograd_profiler

        profiled.append(autograd_profiler._is_profiler_enabled)
        return torch.randn(2, 4) @ torch.randn(4, 3)

    probe = speed_table.StepProbe(measured_from=4, count_flops=True, pad_index=1)  # profile: its default
    for _ in range(5):
        starts.append(time.monotonic())
        probe.step(train_step, [sample], False)
    assert not any(profiled) and probe.kernels is None
    assert starts[4] <= probe.t0 <= probe.t1 and probe.flops == 48
    assert capsys.readouterr().out == ""  # (FlopCounterMode's table not printed)
    profiled.clear()
    at = speed_table.StepProbe(measured_from=speed_table.PROFILE_UPDATE, count_flops=False, pad_index=1, profile=True)
    for _ in range(4):
        at.step(train_step, [sample], False)
    assert not any(profiled) and at.kernels is None

    def retried_once(samples, raise_oom=False):
        if retry.calls == 2 and not retry.retries:  # update 1 (0-based) overflows once: fairseq recurses
            retry.step(retried_once, samples, raise_oom)
        return torch.randn(2, 4) @ torch.randn(4, 3)
    retry = speed_table.StepProbe(measured_from=2, count_flops=True, pad_index=1)
    for _ in range(4):
        retry.step(retried_once, [sample], False)
    assert retry.retries == 1 and retry.flops is None  # update 2 is measured: not run under the FLOP counter


def test_gpu_busy_reads_nvidia_smi_in_a_daemon_thread_and_stops_it(tmp_path, monkeypatch):
    """The sampler runs ``nvidia-smi`` (here a script of that name on PATH, which prints what the real one prints
    with ``-lms``: this machine has no GPU) for the device and period asked, keeps each percentage with its time,
    and ``close`` stops it; without nvidia-smi it is not available."""
    args = tmp_path / "args.txt"
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {args}\necho 40\necho "[N/A]"\necho 60\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    busy = speed_table.GpuBusy(device_index=3, period_ms=20)  # enabled by default
    try:
        assert busy.available and busy.thread.daemon
        deadline = time.monotonic() + 30
        while len(busy.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [v for _, v in busy.samples] == [40.0, 60.0]
        assert busy.between(busy.samples[0][0], busy.samples[1][0]) == 0.5  # both ends kept
        assert args.read_text().split() == ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i",
                                            "3", "-lms", "20"]
    finally:
        busy.close()
    assert busy.proc.returncode is not None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert not speed_table.GpuBusy().available


def test_an_error_inside_the_peak_memory_window_goes_through():
    with pytest.raises(RuntimeError, match="inside"):
        with speed_table.PeakMemory(cuda=False):
            raise RuntimeError("inside")


def test_the_cpu_is_named_from_cpuinfo_or_else_by_the_platform(monkeypatch):
    name = speed_table.cpu_name()
    assert name.endswith(f"{os.cpu_count()} cores") and ("AVX-512" in name or "AVX2" in name)
    import builtins
    import platform

    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: (_ for _ in ()).throw(OSError(path))
                        if path == "/proc/cpuinfo" else real_open(path, *a, **k))
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert speed_table.cpu_name() == "unknown CPU"
    monkeypatch.setattr(platform, "processor", lambda: "x86_64")
    assert speed_table.cpu_name() == "x86_64"


def test_finish_fills_flops_mfu_and_ratios_only_from_rows_that_have_them():
    """A compiled row with no eager row keeps no FLOPs (not the transformer's) and no MFU; a row with words/s but
    no FLOPs has no MFU; the stock row, which counts no FLOPs, takes the plugin transformer's eager bf16 count (the
    same model), also where the compiled transformer comes later in the plan; every row's ratio to stock --fp16."""
    record = _record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50])
    stock = record["rows"][3]
    stock["flops_per_token"] = None
    record["plan"] = [dict(r) for r in [stock] + record["rows"][:3]]  # stock first, as the plan runs it
    record["rows"].append(_row("umst", "bf16", True, [9.6, 9.1, 8.6], wps=380000.0))  # its eager row not run
    rows = {speed_table.row_key(r): r for r in speed_table.finish(record)["rows"]}
    umst = rows[("umst", "bf16", True, 38400)]
    assert umst["flops_per_token"] is None and umst["mfu"] is None and "words_per_flop_vs_transformer" not in umst
    stock = rows[("stock transformer", "fp16", False, 38400)]
    assert stock["flops_per_token"] == 3e8 and stock["mfu"] == pytest.approx(round(250000 * 3e8 / 989.4e12, 4))
    assert rows[("transformer", "bf16", True, 38400)]["vs_stock_fp16"] == 2.0
    assert rows[("transformer", "tf32", False, 38400)]["vs_stock_fp16"] == 0.6
    slow = _record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50])
    slow["rows"][3].update(flops_per_token=None, words_per_s=None, error="skipped")
    slow["rows"][1]["flops_per_token"] = None  # words/s, no FLOPs: no MFU
    rows = {speed_table.row_key(r): r for r in speed_table.finish(slow)["rows"]}
    assert rows[("stock transformer", "fp16", False, 38400)]["flops_per_token"] is None
    assert rows[("transformer", "tf32", False, 38400)]["mfu"] is None
    assert "vs_stock_fp16" not in rows[("transformer", "bf16", True, 38400)]


def test_the_loss_check_of_a_variant_row_and_its_edges():
    """A bucketed row without a reference is not compared (its batches are its own); a CUDA-graph row is compared
    with its compiled reference row, at no precision noise; a gap equal to the tolerance passes; a missing noise
    is named, the other not."""
    by = {("transformer", "bf16", False, 100): dict(losses=_losses([9.5, 9.0])),
          ("transformer", "tf32", False, 100): dict(losses=_losses([9.5, 9.0])),
          ("t buckets", "bf16", True, 100): dict(losses=_losses([9.5, 9.0]))}
    bucketed = dict(name="t buckets", variant_of="t", precision="bf16", compiled=True, max_tokens=100,
                    losses=_losses([9.5, 9.0]))
    assert speed_table.loss_check(bucketed, by, {}) == dict(
        ok=None, why="bucketed batches: no eager row trained the same batches")
    graphs = dict(bucketed, name="t graphs", loss_reference="t buckets", losses=_losses([9.5, 9.0 + 2 ** -8]))
    shifted = _losses([9.5, 9.0 + 2 ** -8 - 2 ** -9])  # its dropout noise 2^-9: tolerance 2 x 2^-9, the gap exactly
    check = speed_table.loss_check(graphs, by, {"t graphs 100": dict(losses_dropout_shifted=shifted)})
    assert check == dict(ok=True, max_abs_diff=round(2 ** -8, 4), tolerance=round(2 ** -8, 4),
                         dropout_noise=round(2 ** -9, 4), precision_noise=0.0)
    compiled = dict(name="transformer", precision="bf16", compiled=True, max_tokens=100, losses=_losses([9.5, 9.0]))
    assert speed_table.loss_check(compiled, by, {})["why"] == "noise not measured (no warm-up losses)"
    del by[("transformer", "tf32", False, 100)]
    assert speed_table.loss_check(compiled, by, {"transformer 100": dict(losses_dropout_shifted=_losses([9.5]))})[
        "why"] == "noise not measured (no transformer bf16 / tf32 rows)"
    assert speed_table.loss_check(dict(compiled, name="umst"), by, {})["why"] == "no eager row's losses to compare with"


def test_targets_at_their_bounds_and_over_the_recipe_batch_s_own_rows():
    """A figure equal to its bound meets it; a ratio whose row is missing is None, not an error; the rows a target
    takes are the plugin's own at the recipe batch: no shape baseline, no variant, no other batch; the loss check's
    verdict is met only when every compiled row compared and passed, None while one was not compared."""
    record = _record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50])
    record["rows"][2]["words_per_s"] = 375000.0  # 1.5 x stock's 250,000: the bound exactly
    for r in record["rows"]:
        r["gpu_busy"] = 0.7
    record["rows"] += [dict(_row("transformer_prime_shape", "bf16", False, [9.5]), baseline_row=True, gpu_busy=0.1),
                       dict(_row("transformer buckets", "bf16", True, [9.5]), variant_of="transformer",
                            gpu_busy=0.1),
                       dict(_row("transformer", "bf16", False, [9.5], tokens=4096), gpu_busy=0.1)]
    targets = speed_table.finish(record)["targets"]
    assert targets["transformer_vs_stock_fp16"] == dict(value=1.5, target=1.5, met=True)
    assert targets["gpu_busy (least plugin row)"]["value"] == 0.7 and targets["gpu_busy (least plugin row)"]["met"]
    assert targets["gpu_busy (least plugin row)"]["rows"] == 3  # transformer bf16 eager, compiled and tf32
    checks = targets["compiled_losses_equal_eager"]
    assert checks == dict(met=True, rows=1, compared=1, missing=[])
    alone = dict(card="NVIDIA H200", max_tokens=[38400],
                 rows=[_row("transformer", "bf16", True, [9.5]), dict(_row("umst", "bf16", True, [9.6]),
                                                                      words_per_s=None, error="not run (deadline)")])
    targets = speed_table.finish(alone)["targets"]
    assert targets["transformer_vs_stock_fp16"]["value"] is None and targets["bf16_vs_tf32"]["value"] is None
    assert targets["compiled_losses_equal_eager"] == dict(met=None, rows=1, compared=0, missing=["umst compiled"])


def test_the_markdown_names_a_cpu_run_its_calls_and_the_rows_that_compiled_in_their_run():
    record = speed_table.finish(_record([9.50, 9.01, 8.50], shifted=[9.50, 9.01, 8.50]))
    record.update(card=None, cpu="Intel Xeon, AVX-512, 2 cores", calls=[dict(command="a", started="t0")])
    text = speed_table.markdown(record)
    assert text.startswith("# fairseq-train speed: CPU (Intel Xeon, AVX-512, 2 cores)\n") and "Measured in" not in text
    record["calls"].append(dict(command="b", started="t1"))
    assert "Measured in 2 calls (the same plan; each call after the first ran the rows not yet done): `a` at t0; " \
           "`b` at t1." in speed_table.markdown(record)
    record["rows"][0]["compile_s_in_row"] = 3.0  # an eager row: never listed
    record["rows"][2].update(compile_s_in_row=1.5, compile_cache_in_row=None)
    assert speed_table.in_row_compiling(record) == ["transformer 38,400: 1.5 s"]


def test_the_commit_is_git_s_short_hash_or_unknown_outside_a_checkout():
    git = subprocess.run(["git", "-C", speed_table.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True)
    assert speed_table.git_commit() == (git.stdout.strip() if git.returncode == 0 else "unknown")


def test_a_corpus_that_fails_to_build_stops_the_call(tmp_path):
    sizes = dict(speed_table.TINY_CORPUS, lengths="no-such-distribution")
    with open(tmp_path / "log.txt", "w") as log, pytest.raises(subprocess.CalledProcessError):
        speed_table.build_corpus(str(tmp_path / "corpus"), sizes, log, speed_table.process_env())
    logged = (tmp_path / "log.txt").read_text()
    assert f"--workers {min(8, os.cpu_count())}" in logged and not (tmp_path / "corpus" / speed_table.CORPUS_STAMP).exists()


def test_the_probed_trainer_keeps_fairseqs_defaults_and_the_compile_state_is_read_where_the_plugin_is_loaded():
    """fairseq-train calls ``train_step(samples)``: the probed trainer's ``raise_oom`` default is fairseq's (False:
    an out-of-memory batch is skipped, not raised); with the plugin loaded (this process) a compiled row reads
    --compile's counters."""
    import inspect

    from fairseq.trainer import Trainer

    import umst_plugin  # noqa: F401  (as the plugin rows' process imports it)

    probed = speed_table._trainer_with(speed_table.StepProbe(measured_from=1, count_flops=False, pad_index=1))
    assert issubclass(probed, Trainer)
    assert inspect.signature(probed.train_step).parameters["raise_oom"].default is \
        inspect.signature(Trainer.train_step).parameters["raise_oom"].default is False
    state = speed_table._compile_state()
    assert set(state) == {"seconds", "graphs", "fallbacks", "graph_shapes", "cache"}
    assert set(state["cache"]) == {name for _, name in speed_table.CACHE_COUNTERS}


# ---- the call's own steps, without training: the plan's settings, resuming, the warm-ups' scheduling, the row
# process; what only the tiny run drove (its tests take minutes), checked here in seconds

def _args(*argv):
    return speed_table.build_parser().parse_args(list(argv))


@pytest.fixture(scope="module")
def arch_table():
    from benchmarks import harness

    return harness.table()


def test_the_settings_default_to_the_recipe_rows_and_batches_and_take_what_is_given(arch_table):
    from benchmarks import harness

    recipe = harness.recipe_rows(arch_table)
    how = speed_table.settings(_args(), arch_table, "/w")
    assert how.archs == how.compile_archs == recipe and "transformer_sf" in recipe
    assert how.max_tokens == [speed_table.RECIPE_MAX_TOKENS, speed_table.CONTRAST_MAX_TOKENS] == [38400, 4096]
    assert (how.updates, how.log_interval, how.data) == (24, 4, "/w/corpus/data-bin")
    tiny = speed_table.settings(_args("--tiny"), arch_table, "/w")
    assert tiny.archs == recipe and tiny.compile_archs == ["transformer"]
    assert (tiny.max_tokens, tiny.updates, tiny.log_interval) == ([1024, 256], 8, 2)
    graphs = speed_table.settings(_args("--cudagraphs", "8", "--max-tokens", "2048,512"), arch_table, "/w")
    assert graphs.archs == speed_table.CUDAGRAPH_ARCHS.split(",") and graphs.max_tokens == [2048]
    assert graphs.updates == speed_table.CUDAGRAPH_UPDATES
    given = speed_table.settings(_args("--archs", "msc,,prime", "--compile-archs", "", "--max-tokens", "512", "--updates",
                                       "6", "--log-interval", "3", "--data", "/d", "--tiny", "--cudagraphs", "4"), arch_table, "/w")
    assert (given.archs, given.compile_archs, given.max_tokens) == (["msc", "prime"], [], [512])
    assert (given.updates, given.log_interval, given.data) == (6, 3, "/d")
    with pytest.raises(ValueError, match=r"unknown arch\(s\) nope, zz; choices: transformer, "):
        speed_table.settings(_args("--archs", "zz,msc", "--compile-archs", "nope"), arch_table, "/w")


def test_a_dry_run_prints_the_plan_and_an_unknown_arch_is_a_usage_error(arch_table, capsys):
    assert speed_table.main(["--dry-run", "--tiny", "--archs", "msc", "--no-stock", "--work", "/w"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in out] == ["msc bf16 1,024 tokens", "msc bf16 256 tokens"]
    assert "fairseq-train /w/corpus/data-bin --arch" in out[0]
    with pytest.raises(SystemExit) as stop:
        speed_table.main(["--dry-run", "--archs", "nope"])
    assert stop.value.code == 2 and "unknown arch(s) nope" in capsys.readouterr().err


def test_the_record_is_named_by_card_or_cpu_and_the_cuda_graph_plan_apart():
    assert speed_table.record_name("NVIDIA H200", "abc") == "gpu-speed-nvidia-h200-abc.json"
    assert speed_table.record_name(None, "abc") == "speed-cpu-abc.json"
    assert speed_table.record_name(None, "abc", tiny=True) == "speed-cpu-tiny-abc.json"
    assert speed_table.record_name("NVIDIA H200", "abc", cudagraphs=8) == "gpu-speed-cudagraphs-nvidia-h200-abc.json"
    assert speed_table.record_name(None, "abc", tiny=True, cudagraphs=8) == "speed-cudagraphs-cpu-tiny-abc.json"


def test_a_resumed_call_keeps_the_same_plans_finished_rows_its_start_and_its_calls():
    a = dict(_row("transformer", "bf16", False, [9.5]), argv=["data-bin", "--arch", "transformer"])
    b = dict(_row("umst", "bf16", False, [9.6]), argv=["data-bin", "--arch", "umst"])
    plan_rows = [dict(a), dict(b)]

    def fresh():
        return dict(started="now", command="cmd", install_s=3.0)

    earlier = dict(started="then", calls=[dict(started="then")], warm_up={"x": 1},
                   rows=[a, dict(b, error="not run (deadline)")])
    record = fresh()
    assert speed_table.resume(record, earlier, plan_rows) is earlier
    assert record["rows"] == [a] and record["started"] == "then"
    assert record["calls"] == [dict(started="then"), dict(started="now", command="cmd", install_s=3.0)]
    # another plan's record (a row's command differs) or none: nothing kept, this call's start
    for other in (dict(earlier, rows=[dict(a, argv=a["argv"] + ["--seed", "2"])]), {}):
        record = fresh()
        assert speed_table.resume(record, other, plan_rows) == {}
        assert record["rows"] == [] and record["started"] == "now"
        assert record["calls"] == [dict(started="now", command="cmd", install_s=3.0)]


def test_the_warm_ups_compile_the_compiled_rows_of_the_first_batch_not_kept_ones():
    rows = [dict(name=n, compiled=c, max_tokens=t) for n, c, t in (
        ("transformer", True, 38400), ("transformer", False, 38400), ("umst", True, 38400), ("umst", True, 4096),
        ("msc", True, 38400))]
    picked = speed_table.warm_up_rows(rows, 38400, kept={"umst 38400": {}})
    assert [(r["name"], r["max_tokens"]) for r in picked] == [("transformer", 38400), ("msc", 38400)]
    assert speed_table.warm_up_rows(rows, 4096, kept={}) == [rows[3]]


# a warm-up's process for the scheduling tests: what warm_up_child does before and after its training (the stack
# handler, the thread line, the result file), a sleep in its place; it logs its start, end and environment
SLEEPING_WARM_UP = """
import faulthandler, json, os, signal, sys, threading, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
row = json.load(open(args["--warm-up-row"]))
faulthandler.register(signal.Signals[row["signal"]], file=sys.stdout, all_threads=True)
print(row["thread_line"] + f" 0x{threading.get_ident():016x}", flush=True)
started = time.time()
time.sleep(row["sleep"])
with open(row["events"], "a") as f:
    f.write(json.dumps([row["name"], started, time.time(), os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"),
                        os.environ.get("PYTORCH_CUDA_ALLOC_CONF")]) + "\\n")
if "result" in row:
    json.dump(row["result"], open(args["--warm-up-out"], "w"))
sys.exit(row.get("rc", 0))
"""


def _sleeping_rows(tmp_path, *specs):
    script = tmp_path / "sleeping_warm_up.py"
    script.write_text(SLEEPING_WARM_UP)
    common = dict(max_tokens=1000, signal=speed_table.STACK_SIGNAL.name, thread_line=speed_table.MAIN_THREAD_LINE,
                  events=str(tmp_path / "events.jsonl"))
    return [sys.executable, str(script)], [dict(common, name=name, **spec) for name, spec in specs]


def _events(tmp_path):
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_warm_ups_run_the_longest_first_no_more_at_once_than_the_slots_and_each_reports(tmp_path, capsys):
    command, rows = _sleeping_rows(
        tmp_path, ("short", dict(sleep=0.1, result=dict(seconds=5.0))),
        ("long", dict(sleep=5.0, result=dict(seconds=7.0, graphs=3))),
        ("last", dict(sleep=0.1, result=dict(seconds=1.0))),
        ("silent", dict(sleep=0.1, rc=3)))  # ends without a result
    stale = tmp_path / "warm-up-silent-1000.json"
    stale.write_text(json.dumps(dict(seconds=99.0)))  # an earlier call's: not this call's result
    assert speed_table.warm_up_slots(rows, card_gib=2.0) == 2  # 1.9 GiB over 0.8 GiB a warm-up at 1,000 tokens
    results = speed_table.warm_up(rows, str(tmp_path), dict(os.environ), timeout=60, card_gib=2.0,
                                  order={"long 1000": 50.0, "short 1000": 10.0}, child_command=command)
    concurrent = "2 compiled rows at a time"
    assert results["long 1000"] == dict(seconds=7.0, graphs=3, concurrent=concurrent)
    assert results["short 1000"] == dict(seconds=5.0, concurrent=concurrent)
    assert results["last 1000"] == dict(seconds=1.0, concurrent=concurrent)
    silent = results["silent 1000"]
    assert silent["seconds"] is None and silent["compile_log"] == []
    assert silent["error"] == f"no result (rc 3; see {tmp_path / 'warm-up-silent-1000-log.txt'})"
    events = _events(tmp_path)
    for name, start, end, threads, alloc in events:  # never more than two at once: at any start, two running
        assert sum(1 for e in events if e[1] <= start < e[2]) <= 2, events
        assert threads == str(max(1, (os.cpu_count() or 2) // 2)) and alloc == "expandable_segments:True"
    long_end = next(e[2] for e in events if e[0] == "long")
    assert all(e[1] < long_end for e in events if e[0] in ("short", "last"))  # the second slot's, meanwhile
    out = capsys.readouterr().out
    assert "[speed] compile warm-up long 1000: 7 s of compiling" in out
    assert "[speed] compile warm-up silent 1000: no result (rc 3;" in out
    assert json.loads((tmp_path / "warm-up-long-1000-row.json").read_text())["name"] == "long"
    assert speed_table.warm_up([], str(tmp_path), {}, timeout=1) == {}


def test_warm_ups_one_at_a_time_start_with_the_longest_known_compile(tmp_path):
    """(One slot: each starts once the one before has ended, so their starts show the order.)"""
    command, rows = _sleeping_rows(tmp_path, *[(name, dict(sleep=0.1, result=dict(seconds=1.0)))
                                               for name in ("unknown", "second", "first", "also-unknown")])
    speed_table.warm_up(rows, str(tmp_path), dict(os.environ), timeout=60, card_gib=1.0,
                        order={"first 1000": 50.0, "second 1000": 10.0}, child_command=command)
    assert [e[0] for e in sorted(_events(tmp_path), key=lambda e: e[1])] == [
        "first", "second", "unknown", "also-unknown"]  # the longest known first, then the plan's order


def test_warm_ups_on_a_cpu_all_start_at_once_with_the_cores_shared(tmp_path):
    command, rows = _sleeping_rows(tmp_path, *[(f"r{i}", dict(sleep=0.5, result=dict(seconds=1.0)))
                                               for i in range(3)])
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    results = speed_table.warm_up(rows, str(tmp_path), env, timeout=60, child_command=command)
    assert {r["concurrent"] for r in results.values()} == {"all compiled rows at once"}
    events = _events(tmp_path)
    assert len(events) == 3 and max(e[1] for e in events) < min(e[2] for e in events)  # all running together
    assert {e[3] for e in events} == {str(max(1, (os.cpu_count() or 2) // 3))} and {e[4] for e in events} == {None}


def test_a_warm_up_running_at_the_cap_is_stopped_with_its_stack_and_one_not_started_says_so(tmp_path, capsys):
    command, rows = _sleeping_rows(tmp_path, ("stuck", dict(sleep=120, result=dict(seconds=1.0))),
                                   ("waiting", dict(sleep=0.1, result=dict(seconds=1.0))))
    start = time.time()
    results = speed_table.warm_up(rows, str(tmp_path), dict(os.environ), timeout=2, card_gib=1.0,
                                  child_command=command)
    assert time.time() - start < 2 + speed_table.STACK_WAIT_S  # stopped at the cap, not waited for
    stuck = results["stuck 1000"]
    assert stuck["seconds"] is None and 1.5 <= stuck["ran_s"] <= 2.5, stuck
    stack = stuck["stack_at_cap"]
    assert stack and stack["frames"][0].endswith(" in <module>") and "sleeping_warm_up.py" in stack["frames"][0]
    assert stuck["error"] == (f"stopped at the warm-up cap (2 s; it had run {stuck['ran_s']:.0f} s), still running "
                              f"in {stack['where']}; see {tmp_path / 'warm-up-stuck-1000-log.txt'}")
    assert results["waiting 1000"] == dict(seconds=None, error="not started (warm-up timeout)")
    assert _events(tmp_path) == []  # the stuck one was killed in its sleep, the other never ran
    out = capsys.readouterr().out
    assert "[speed] compile warm-up waiting 1000: not started (timeout)" in out
    assert "[speed] compile warm-up stuck 1000: stopped at the warm-up cap" in out


def test_the_row_process_relays_its_lines_records_its_rows_and_is_stopped_at_the_deadline(tmp_path, capsys):
    """run_child: the plan goes to WORK/TAG-plan.json, the process's ``[speed]`` lines reach this output and its
    whole output WORK/TAG-log.txt; a process still running at the deadline is killed and says where its finished
    rows are; one that fails says its rc."""
    stock, plugin = speed_table.plan(str(tmp_path / "no-data-bin"), [1024], 4, 2, ["transformer"], [], tiny=True)
    record = tmp_path / "record.json"
    record.write_text(json.dumps(dict(rows=[], plan=stock + plugin, max_tokens=[1024])))
    env = speed_table.process_env()
    # under MIN_ROW_SECONDS left: both rows "not run", and the process ends before the deadline
    speed_table.run_child(stock, "stock", str(tmp_path), str(record), env,
                          time.time() + speed_table.MIN_ROW_SECONDS - 2, measured_from=2)
    plan = json.loads((tmp_path / "stock-plan.json").read_text())
    assert plan == dict(stock=True, rows=stock, measured_from=2)
    assert [r["error"] for r in json.loads(record.read_text())["rows"]] == ["not run (deadline)"] * 2
    out = capsys.readouterr().out
    assert out.splitlines() == [f"[speed] stock transformer {p} 1,024 tokens: not run (deadline)"
                                for p in ("fp16", "fp16-amp")]
    assert "[speed] stock transformer fp16 1,024 tokens: not run (deadline)" in (tmp_path / "stock-log.txt").read_text()
    start = time.time()  # the plugin's process is still importing at the deadline: killed, its row not run
    speed_table.run_child(plugin, "plugin", str(tmp_path), str(record), env, time.time() + 1, measured_from=2)
    assert time.time() - start < 10
    assert not [r for r in json.loads(record.read_text())["rows"] if not r["stock"]]
    assert f"[speed] the plugin process stopped at the deadline; its finished rows are in {record}" in \
        capsys.readouterr().out
    speed_table.run_child(stock, "stock", str(tmp_path), str(tmp_path / "no-record.json"), env, 0, measured_from=2)
    assert f"[speed] the stock process ended with rc 1 (see {tmp_path / 'stock-log.txt'})" in capsys.readouterr().out
    assert "FileNotFoundError" in (tmp_path / "stock-log.txt").read_text()
    speed_table.run_child([], "none", str(tmp_path), str(record), env, 0, measured_from=2)
    assert not (tmp_path / "none-plan.json").exists()
