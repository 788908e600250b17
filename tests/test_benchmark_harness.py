import json
import re

import pytest
import torch

from benchmarks import common


def test_cpu_peak_memory_sees_a_known_allocation():
    def fn():
        a = torch.ones(1024, 1024)  # 4 MiB live ...
        b = a * 2                   # ... 8 MiB at the peak
        del a, b
    peak = common.peak_memory(fn)
    assert 8 * 2**20 <= peak < 9 * 2**20


def test_train_and_generate_fns_run_on_a_tiny_model():
    model, task = common.dev.build_model("transformer", dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16,
                                                             decoder_embed_dim=16, encoder_ffn_embed_dim=16,
                                                             decoder_ffn_embed_dim=16, encoder_attention_heads=2,
                                                             decoder_attention_heads=2))
    sample = common.dev.random_sample(task, 2, 6, 5)
    common.train_step_fn(model.train(), sample)()
    gen, result = common.generate_fn(model.eval(), task, sample, beam=2, max_len_b=3)
    gen()
    assert result["tokens"] > 0


def test_the_harness_imports_without_the_plugin():
    # bench_launches' stock row profiles its CUDA kernels with common.cuda_profile in a process that must stay
    # stock fairseq (it asserts so): importing the harness must not import umst_plugin (on an H200 it did).
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; from benchmarks import common; from benchmarks.bench_launches import benchmark_common; "
            "benchmark_common().cuda_profile; assert 'umst_plugin' not in sys.modules, sorted(sys.modules); "
            "common.dev; assert 'umst_plugin' in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_cpu_peak_memory_ignores_blocks_allocated_before_the_call():
    # Blocks allocated inside an earlier measurement, freed outside it, and their addresses reused
    # outside any measurement: freeing those inside the next measurement must not count (c10 keeps
    # a stale pointer -> size table, which used to lower the next model's figure).
    kept = {}

    def allocate_small_blocks():
        kept["old"] = [torch.empty(16384) for _ in range(200)]  # 200 x 64 KiB

    common.peak_memory(allocate_small_blocks)
    kept.pop("old")
    kept["reused"] = [torch.empty(16384) for _ in range(200)]  # likely the same addresses

    def free_then_allocate():
        kept.pop("reused")
        big = torch.ones(1024, 1024)  # 4 MiB: the only block this call allocates
        del big

    peak = common.peak_memory(free_then_allocate)
    assert 4 * 2**20 <= peak < 5 * 2**20


def test_bench_archs_quick_run_and_its_tables(tmp_path):
    """bench_archs at tiny widths: every baseline an asked arch needs is measured (Prime's own-shape transformer
    too), the ratios are against the right one, and compare_runs renders the JSON it writes; a run compared with
    itself shows no change."""
    import json
    from benchmarks import bench_archs, compare_runs
    out = tmp_path / "quick.json"
    assert bench_archs.main(["--quick", "--archs", "umst,prime", "--precisions", "fp32", "--max-tokens", "64",
                             "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["name"] for r in result["rows"]] == ["transformer", "transformer_dropout", "transformer_prime_shape",
                                                   "umst", "prime"]
    ratios = {r["name"]: r for r in result["ratios"]}
    assert ratios["umst"]["baseline"] == "transformer_dropout" and ratios["prime"]["baseline"] == "transformer"
    rows = {r["name"]: r for r in result["rows"]}
    shape = ratios["prime"]["fp32"]["vs_shape"]
    assert abs(shape["flops"] - rows["prime"]["flops"] / rows["transformer_prime_shape"]["flops"]) < 1e-9
    assert all(r["flops"] > 0 and r["saved"]["fp32"] > 0 and r["time"]["fp32"] > 0 for r in rows.values())
    same = compare_runs.render(["steps", str(out), str(out)])
    assert "| umst_base |" in same and "→" not in same
    assert "the transformer of its shape" in compare_runs.render(["shape", str(out)])
    assert "| transformer (Prime's shape) |" in compare_runs.render(["table", str(out)])


def test_bench_loss_quick_run_compares_fairseq_s_loss_with_the_compiled_one(tmp_path):
    """``python -m benchmarks loss --quick``: a row per dtype, the compiled loss within tests/test_compiled_loss.py's
    bounds of fairseq's eager one, the eager ops' traffic counted, the JSON and the table written."""
    import json

    import test_compiled_loss as bounds
    from benchmarks import bench_loss

    out, table = tmp_path / "loss.json", tmp_path / "loss.md"
    result = bench_loss.main(["--quick", "--json", str(out), "--markdown", str(table)])
    rows = {r["dtype"]: r for r in result["rows"]}
    assert set(rows) == {"fp32", "bf16"} and json.loads(out.read_text())["rows"] == result["rows"]
    for r in rows.values():
        assert r["eager_s"] > 0 and r["compiled_s"] > 0 and r["loss_rel_diff"] <= bounds.LOSS_RTOL, r
        # eager: the cast, the log-softmax, the sums and their backward, each a pass over the logits (24-26 ops,
        # 49-61 bytes per logit measured at this size)
        assert r["eager_ops"] >= 20 and r["eager_bytes_per_logit"] >= 40, r
    assert rows["fp32"]["grad_max_diff"] <= bounds.F32_GRAD_ATOL
    assert rows["bf16"]["grad_max_diff"] <= bounds.BF16_GRAD_STEPS * 2 ** -8  # gradients of at most 1 in size
    assert "| bf16 | 128 x 100 |" in table.read_text()


def test_kernels_are_attributed_to_the_phase_that_launched_them():
    """benchmarks.common.kernels_by_phase on an event tree shaped like torch.profiler's (CPU events with their
    kernels and children): the innermost phase range wins, the autograd engine's thread is backward, memory
    copies are not kernels."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks import common

    def kernel(name="k", us=10.0):
        return SimpleNamespace(name=name, duration=us)

    def op(name, thread=1, kernels=(), children=()):
        event = SimpleNamespace(name=name, thread=thread, device_type=DeviceType.CPU, cpu_parent=None,
                                kernels=list(kernels), cpu_children=list(children))
        for child in children:
            child.cpu_parent = event
        return event

    forward = op("phase:forward", children=[op("aten::mm", kernels=[kernel(), kernel()]),
                                            op("aten::copy_", kernels=[kernel("Memcpy HtoD")])])
    step = op("phase:amp", children=[op("aten::mul", kernels=[kernel()]),
                                     op("phase:optimizer", children=[op("aten::_fused_adamw_",
                                                                        kernels=[kernel(us=5.0)] * 3)])])
    backward = op("autograd::engine::evaluate_function", thread=2, kernels=[kernel()] * 4)
    loose = op("aten::add", kernels=[kernel()])
    events = [forward, *forward.cpu_children, step, *step.cpu_children, backward, loose]
    counts, times = common.kernels_by_phase(events)
    assert dict(counts) == {"forward": 2, "amp": 1, "optimizer": 3, "backward": 4, "rest": 1}
    assert times["optimizer"] == 15.0


@pytest.mark.slow
def test_bench_train_runs_fairseq_train_for_stock_and_plugin_rows(toy_databin, tmp_path, capsys):
    """bench_train at tiny widths on the toy data-bin: the stock process (fairseq alone) and the plugin process
    each run real fairseq-train mains; every row has words/s from fairseq's own records, the loss rows their
    longer runs, the ratios their baselines; a failing row is recorded, not fatal. Each row's start and end
    reach this process's output from the child as they happen (the GPU check keeps only that output)."""
    import json

    from benchmarks import bench_train

    out = tmp_path / "train.json"
    assert bench_train.main(["--data", toy_databin, "--quick", "--updates", "5", "--archs", "transformer,umst",
                             "--precisions", "fp32", "--loss-archs", "umst", "--loss-updates", "10",
                             "--work", str(tmp_path / "work"), "--json", str(out),
                             "--markdown", str(tmp_path / "train.md")]) == 0
    result = json.loads(out.read_text())
    rows = {(r["name"], r["precision"]): r for r in result["rows"]}
    assert set(rows) == {("stock", "fp32"), ("stock", "fp16"), ("transformer", "fp32"), ("umst", "fp32")}
    for key in [("stock", "fp32"), ("transformer", "fp32"), ("umst", "fp32")]:
        assert rows[key]["wps"] > 0 and not rows[key].get("error"), rows[key]
    # fairseq logs every 5th update (bench_train's --log-interval): 5 and 10 updates end on a record
    assert rows[("umst", "fp32")]["updates"] == 10 and rows[("transformer", "fp32")]["updates"] == 5
    assert rows[("stock", "fp32")]["wps_vs_stock_fp32"] == 1.0
    assert "--user-dir" not in rows[("stock", "fp32")]["argv"]
    assert rows[("umst", "fp32")]["flops_per_token_ratio"] > 0
    assert "| umst | fp32 |" in (tmp_path / "train.md").read_text()
    printed = capsys.readouterr().out
    assert "[bench_train] stock fp32: fairseq-train" in printed, printed
    assert "[bench_train] umst fp32: 10 updates in" in printed, printed
    assert "| INFO |" not in printed  # fairseq's own log stays in the child's log file


def test_bench_launches_keeps_the_rows_counted_before_it_was_stopped_and_names_eager_fallbacks(tmp_path, monkeypatch):
    """bench_launches writes its JSON and table after every row: the GPU check's compile step stops it at the
    step's budget, and the rows counted by then (on an H200, minutes of compiling each) must not be lost. The
    stock row and the first arch are real counts; the second arch's count is stopped (raises) as a limit would.

    With --compile, a layer whose compile fails runs eager (umst_plugin.compilation.fallback) and its kernels are
    eager ones: the row must say so, in the JSON and the table, not only in a log warning the benchmark silences
    (an H200's TranSFormer row once counted its encoder's eager kernels as compiled). Here dynamo's backend fails
    for the layers' graphs (a backend that raises: dynamo's real failure path, no inductor needed)."""
    import json

    from benchmarks import bench_launches

    def failing_backend(gm, example_inputs):
        if len(gm.graph.nodes) > 8:  # a layer's graph, not probe.check_available's three-op smoke test
            raise RuntimeError("planted: this backend cannot compile a layer")
        return gm.forward

    real_measure = bench_launches.measure

    def measure_then_stop(name, *args, **kwargs):
        if name == "msmsa":
            raise KeyboardInterrupt("stopped at the step's budget")
        return real_measure(name, *args, **kwargs)

    monkeypatch.setattr(bench_launches, "measure", measure_then_stop)
    monkeypatch.setattr(bench_launches, "COMPILE_BACKEND", failing_backend)
    from umst_plugin.compilation.state import STATE

    monkeypatch.setattr(STATE, "eager_variants", {})  # this process's other tests compile these classes
    monkeypatch.setattr(STATE, "fallback_tracebacks", {})
    out, table = tmp_path / "launches.json", tmp_path / "launches.md"
    with pytest.raises(KeyboardInterrupt):
        bench_launches.main(["--quick", "--compile", "--archs", "transformer,msmsa", "--json", str(out),
                             "--markdown", str(table)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == ["stock", "transformer"]
    assert rows[1]["launches"] > 0 and rows[1]["launches_per_flop_ratio"] > 0
    fallbacks = rows[1]["eager_fallbacks"]
    assert any(f.startswith("TransformerEncoderLayerBase.forward (training, autograd): forward:") for f in fallbacks)
    assert all("planted: this backend cannot compile a layer" in f for f in fallbacks), fallbacks
    assert rows[1]["generated_kernels"] == 0
    tracebacks = rows[1]["eager_fallback_tracebacks"]
    assert len(tracebacks) == len(fallbacks) and all("failing_backend" in t and "planted" in t for t in tracebacks)
    text = table.read_text()
    assert "| transformer (plugin loaded) (partly eager: below) |" in text
    assert "* transformer (plugin loaded): TransformerEncoderLayerBase.forward (training, autograd)" in text


def test_bench_train_shows_where_its_runs_were_when_they_hit_the_time_limit(tmp_path, capsys):
    """A process of runs stopped at --timeout: the end of its log is printed (the GPU check keeps only the
    caller's output; on an H200 a step ran out of time and said nothing of where)."""
    from benchmarks import bench_train

    runs = [dict(name="stock", precision="fp32", argv=["fairseq-train", str(tmp_path / "no-data"),
                                                         "--max-update", "1"])]
    rows = bench_train._run_process(runs, str(tmp_path / "plan.json"), str(tmp_path / "out.json"), str(tmp_path),
                                    "stock", timeout=1)
    printed = capsys.readouterr().out
    assert "the stock runs stopped at their 1 s limit" in printed
    assert f"the end of {tmp_path / 'stock-log.txt'}:" in printed, printed
    assert rows[0]["error"].startswith(("no result", "not run")), rows


def test_bench_train_deadline_splits_the_callers_budget_between_its_processes(tmp_path, capsys):
    """--deadline S: the stock process gets at most 40% of S less the reserve, the plugin process what is left;
    both stop at their share, and the results (rows marked not run) are written within S. The GPU check's
    train-speed step gives it its budget: with a fixed --timeout per process, the two processes outlasted the step
    on an H200 and nothing was written."""
    import json
    import time

    from benchmarks import bench_train

    out = tmp_path / "train.json"
    start = time.time()
    bench_train.main(["--data", str(tmp_path / "no-data"), "--archs", "transformer", "--precisions", "fp32",
                      "--quick", "--updates", "1", "--deadline", str(bench_train.DEADLINE_RESERVE + 10),
                      "--work", str(tmp_path / "work"), "--json", str(out)])
    took = time.time() - start
    printed = capsys.readouterr().out
    # 40% of the 10 s left (less the moment it took to start): the stock process cannot import fairseq in it
    assert re.search(r"the stock runs stopped at their [34] s limit", printed), printed
    assert took < bench_train.DEADLINE_RESERVE + 10 + 20, took  # the FLOP count of a tiny model, the write
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows][:2] == ["stock", "stock"] and "transformer" in [r["name"] for r in rows], rows
    assert all(r.get("error") for r in rows), rows  # no data: every row failed or did not run


def test_bench_train_resumes_after_the_rows_of_the_same_plan(tmp_path):
    """Re-running the same bench_train command keeps the rows already done (same argv, in plan order, no error,
    every planned update) and runs the rest; a changed plan, a failed row or one cut short is run again."""
    import json

    from benchmarks import bench_train

    runs = [dict(name=n, argv=["fairseq-train", n, "--max-update", "10"]) for n in ("a", "b", "c")]
    out = tmp_path / "plugin-results.json"
    out.write_text(json.dumps([dict(runs[0], wps=1.0, updates=10), dict(runs[1], error="killed"),
                               dict(runs[2], wps=3.0, updates=10)]))
    assert [r["name"] for r in bench_train.rows_done(runs, str(out))] == ["a"]
    out.write_text(json.dumps([dict(runs[0], wps=1.0, updates=10), dict(runs[1], wps=2.0, updates=5)]))
    assert [r["name"] for r in bench_train.rows_done(runs, str(out))] == ["a"]  # b was cut short (a signal)
    out.write_text(json.dumps([dict(runs[0], wps=1.0, updates=10), dict(runs[1], wps=2.0, updates=10)]))
    assert [r["name"] for r in bench_train.rows_done(runs, str(out))] == ["a", "b"]
    assert bench_train.rows_done([dict(runs[0], argv=["fairseq-train", "a", "--compile"])] + runs[1:], str(out)) == []
    assert bench_train.rows_done(runs, str(tmp_path / "none.json")) == []
    kept = bench_train.run_process(runs[:2], str(tmp_path), "plugin", timeout=1)  # all done: nothing runs
    assert [r["wps"] for r in kept] == [1.0, 2.0]


def test_addbmm_counts_its_flops():
    """torch's FLOP counter has no addbmm formula; op_counts registers one (MSC's lean path uses addbmm)."""
    from torch.utils.flop_counter import FlopCounterMode

    from umst_dev import op_counts  # noqa: F401

    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 6)
    with FlopCounterMode(display=False) as counter:
        torch.addbmm(torch.zeros(4, 6), a, b)
    assert counter.get_total_flops() == 2 * 3 * 4 * 5 * 6


def test_bench_train_compares_compiled_and_eager_losses_of_one_precision():
    """--compile rows against their eager row of the same precision: the mean loss over their last common updates;
    rows without an eager twin, or of another precision, are not compared."""
    from benchmarks import bench_train

    def losses(values):
        return [[5 * (i + 1), v] for i, v in enumerate(values)]
    rows = [dict(name="umst", precision="fp32", loss=losses([4.0, 3.0, 2.0])),
            dict(name="umst_compile", precision="fp32", loss=losses([4.0, 3.1, 2.2])),
            dict(name="umst_compile", precision="bf16", loss=losses([4.0, 3.0])),
            dict(name="transformer_compile", precision="fp32", loss=losses([1.0]))]
    compared = bench_train.compile_loss_comparisons(rows)
    assert list(compared) == ["umst fp32"]
    c = compared["umst fp32"]
    assert c["updates"] == [5, 15] and c["a"] == 3.0 and abs(c["b"] - 3.1) < 1e-12
    assert abs(c["rel_diff"] - 0.1 / 3.0) < 1e-12


def _every_benchmark():
    from benchmarks import __main__ as dispatch, paper

    return [[what] for what in dispatch.COMMANDS] + [["paper", family] for family in paper.tables()]


@pytest.mark.parametrize("what", _every_benchmark(), ids=" ".join)
def test_every_benchmark_prints_its_help(what, capsys, monkeypatch):
    """``python -m benchmarks WHAT --help`` prints every flag's help and exits 0 (argparse expands ``%`` in help
    strings: bench_train's ``--deadline`` help once held a bare one and ``--help`` died with a TypeError)."""
    from benchmarks.__main__ import main

    monkeypatch.setattr("sys.argv", ["python"])
    with pytest.raises(SystemExit) as stopped:
        main(what + ["--help"])
    assert stopped.value.code == 0
    assert "usage: python -m benchmarks " + " ".join(what) in capsys.readouterr().out


def test_the_dispatcher_lists_the_benchmarks_and_names_an_unknown_one(capsys):
    from benchmarks.__main__ import main

    assert main([]) == 0
    listed = capsys.readouterr().out
    assert "archs" in listed and "paper FAMILY" in listed
    assert main(["no-such-benchmark"]) == 2
    assert "no benchmark 'no-such-benchmark'" in capsys.readouterr().err
    assert main(["paper", "no-such-family"]) == 2


def test_a_debugging_tool_prints_its_help(capsys):
    from umst_dev import find_nonfinite

    with pytest.raises(SystemExit) as stopped:
        find_nonfinite.main(["--help"])
    assert stopped.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("lengths", ["multi30k", "wmt14"])
def test_a_token_budget_gives_a_full_batch_of_the_length_distribution(lengths):
    """bench_archs' batch at every budget is within 10% of it (bsz x the longer side's padded length, what fairseq's
    --max-tokens bounds), drawn from the distribution: at 16,384 tokens the 1,000 Multi30k pairs once packed into
    two batches and the middle one was the short remainder (181 sentences, 3,514 target tokens)."""
    from benchmarks import harness

    source = harness.LENGTHS if lengths == "multi30k" else "wmt14"
    for budget in (1024, 4096, 16384, 38400, 65536):
        src, tgt = harness.lengths_batch(budget, lengths=source)
        assert len(src) == len(tgt)
        filled = len(src) * max(max(src), max(tgt))
        assert 0.9 * budget <= filled <= budget, (budget, len(src), filled)
    # the middle batch of an epoch's list is the median update's: longer sentences than the median sentence's
    # (about 24 with </s>; long sentences fill more batches), far from the tail toward 250
    src, tgt = harness.lengths_batch(38400, lengths="wmt14")
    assert 28 <= sorted(src)[len(src) // 2] <= 45


def _names_in_code(path):
    """The NAME tokens and the strings that are not docstrings of a Python file (comments and docstrings left out)."""
    import io
    import tokenize

    out, previous = [], None
    with open(path, encoding="utf-8") as f:
        for tok in tokenize.generate_tokens(io.StringIO(f.read()).readline):
            if tok.type == tokenize.NAME or (tok.type == tokenize.STRING and previous not in (
                    None, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL)):
                out.append(tok.string)
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                previous = tok.type
    return out


def test_no_benchmark_outside_the_paper_tables_names_a_family():
    """The benchmarks' rows come from the family registry: outside ``benchmarks/paper/<family>.py`` no benchmark
    module (nor the GPU check) names a family in code -- an identifier or a string, not a comment or a docstring,
    the name as a whole word or a word's start (``prime_base``, ``"m30k-prime"``). UMST, the project's subject, is
    the exception the harness names to order the rows first."""
    import glob
    import os
    import re

    from benchmarks import harness
    from umst_plugin import families

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = [f.name for f in families.all_families() if f.name != harness.FIRST_FAMILY]
    assert len(names) >= 4, names
    paths = sorted(glob.glob(os.path.join(root, "benchmarks", "*.py")))
    found = []
    for path in paths:
        tokens = _names_in_code(path)
        for name in names:
            hits = [t for t in tokens if re.search(rf"(?i)(^|[^a-z]){name}", t)]
            if hits:
                found.append(f"{os.path.relpath(path, root)}: {name} in {hits[:3]}")
    assert not found, "benchmark code naming a family (read it from the registry):\n" + "\n".join(found)



def test_the_family_name_scan_sees_code_and_not_comments_or_docstrings(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""About msc."""\nROWS = ("prime_base", transformer_sf)  # msmsa\n\n\ndef f():\n'
                    '    """msmsa."""\n    return "x"\n')
    assert _names_in_code(str(path)) == ["ROWS", '"prime_base"', "transformer_sf", "def", "f", "return", '"x"']


def test_a_recipe_row_is_the_model_its_configs_train():
    """A benchmark row that stands for a WMT recipe's model (``BenchRow.recipes``: UMST's MUSE) has that config's
    arch and the same value of every model argument the config or the row sets, at base and big width; the speed
    table measures it by default, the other benchmarks do not (it is ``extra``)."""
    import os

    import yaml

    from benchmarks import harness
    from umst_tools import batch_table

    rows = harness.table()
    with_recipes = {n: r for n, r in rows.items() if r.recipes}
    assert "prime_muse" in with_recipes
    for name, row in with_recipes.items():
        assert name in harness.recipe_rows(rows) and (row.extra or name in harness.measured_rows(rows))
        for width, recipe in zip(("base", "big"), row.recipes):
            with open(os.path.join(harness.ROOT, "configs", f"{recipe}.yaml")) as f:
                model = yaml.safe_load(f)["model"]
            arch, overrides = harness.model_overrides(name, width)
            assert arch == model.pop("_name"), (name, width, recipe)
            model.pop("share_all_embeddings", None)  # every benchmark row shares them (WMT's joined dictionary)
            keys = set(model) | set(overrides)
            config, measured = batch_table.arch_args(arch, model), batch_table.arch_args(arch, overrides)
            different = {k: (config.get(k), measured.get(k)) for k in keys if config.get(k) != measured.get(k)}
            assert not different, f"{name} at {width} width against configs/{recipe}.yaml: {different}"
    assert "prime_muse" not in harness.measured_rows(rows)


# The host-device syncs fairseq-fixed 0.12.3.1's own Trainer.train_step makes in every update (file:line under
# site-packages/fairseq): the gradient-norm check before the optimizer step (trainer.py:963), the logging's
# isfinite(grad_norm) (trainer.py:1522), three smoothed values of the legacy logging output each update returns,
# rounded through .item() (logging/meters.py:58, safe_round); under --amp also the AMP
# optimizer's overflow check (optim/amp_optimizer.py:56) and the logged loss scale (trainer.py:1120, get_scale)
FAIRSEQ_UPDATE_SYNCS = {
    "fp32": {"trainer.py:963": 1, "trainer.py:1522": 1, "logging/meters.py:58": 3},
    "bf16": {"trainer.py:963": 1, "trainer.py:1522": 1, "logging/meters.py:58": 3, "optim/amp_optimizer.py:56": 1,
             "trainer.py:1120": 1},
}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_whole_update_syncs_only_where_fairseq_s_trainer_does(precision):
    """One update as fairseq-train runs it (Trainer.train_step: forward, loss, backward, gradient norm, the fused
    optimizer, the trainer's logging), UMST with the plugin's task: no sync from the plugin's lines, and fairseq's
    are exactly the ones its trainer makes (a new one anywhere in the update fails this)."""
    from benchmarks import bench_op_counts

    assert bench_op_counts.UPDATE_PRECISIONS == tuple(FAIRSEQ_UPDATE_SYNCS)
    counter = bench_op_counts.update_syncs("umst", precision)
    assert counter.plugin_lines() == {}, counter.locations
    assert set(counter.by_owner()) == {"fairseq"}, counter.locations
    lines = {loc.split("/site-packages/fairseq/")[-1]: n for loc, n in counter.locations.items()}
    assert lines == FAIRSEQ_UPDATE_SYNCS[precision], counter.locations


def test_the_matmul_record_holds_each_precisions_gflops_and_their_ratio(tmp_path):
    """``python -m benchmarks matmul``: a row per thread count and shape, each precision's GFLOP/s and bf16's over
    fp32's, written with the machine it ran on."""
    from benchmarks import bench_matmul

    record_path = tmp_path / "matmul.json"
    assert bench_matmul.main(["--quick", "--threads", "1,2", "--json", str(record_path)]) == 0
    record = json.loads(record_path.read_text())
    assert record["command"] == f"python -m benchmarks matmul --quick --threads 1,2 --json {record_path}"
    assert record["device"] and record["torch"] == torch.__version__
    assert [(r["threads"], r["m"], r["k"], r["n"]) for r in record["rows"]] == [
        (t, *shape) for t in (1, 2) for shape in bench_matmul.QUICK_SHAPES]
    for row in record["rows"]:
        assert row["fp32_gflops"] > 0 and row["bf16_gflops"] > 0
        assert row["bf16_over_fp32"] == row["bf16_gflops"] / row["fp32_gflops"]


def test_the_matmul_benchmark_multiplies_in_the_precision_it_names():
    """Each precision's products run in that dtype: a bf16 figure of fp32 products would say nothing."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks import bench_matmul

    class ProductDtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.matmul):
                self.dtypes.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    for dtype in (torch.float32, torch.bfloat16):
        with ProductDtypes() as seen:
            assert bench_matmul.gflops(8, 4, 8, dtype, rounds=1, per_round=2, warmup=1) > 0
        assert seen.dtypes == [dtype] * 3
