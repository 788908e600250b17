"""python -m benchmarks loader: batches/s out of fairseq's own epoch iterator, stock task against the plugin's."""
import json
import re
import sys

import e2e


def test_the_loader_bench_times_fairseqs_iterator_for_stock_and_each_arch(toy_databin, tmp_path):
    out = tmp_path / "loader.json"
    proc = e2e.run([sys.executable, "-m", "benchmarks", "loader", "--data", toy_databin, "--max-tokens", "200",
                    "--num-workers", "0", "--archs", "transformer,umst,transformer_sf", "--batches", "3", "--skip", "1",
                    "--repeats", "2", "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["max_tokens"] == 200 and record["num_workers"] == 0 and record["cpu"]
    assert [(r["name"], r["arch"], r["stock"]) for r in record["rows"]] == [
        ("stock transformer", "transformer", True), ("transformer", "transformer", False), ("umst", "umst_base", False),
        ("transformer_sf", "transformer_sf_base", False)]
    # what was timed: stock fairseq's task and dataset, the plugin's with its side data and, for TranSFormer, the
    # batch hint its model registers when the task builds it (as fairseq-train does)
    stock, transformer, umst, transformer_sf = record["rows"]
    assert (stock["task"], stock["dataset"]) == ("TranslationTask", "LanguagePairDataset")
    assert "src_word_ids" not in stock["inputs"]
    # stock fairseq pads with its own collate_tokens, as a process without the plugin does; the plugin's rows with
    # the plugin's (umst_plugin/patches/collate_tokens.py)
    assert stock["collate_tokens"] == "fairseq.data.data_utils"
    assert {r["collate_tokens"] for r in (transformer, umst, transformer_sf)} == {"umst_plugin.patches.collate_tokens"}
    for r in (transformer, umst, transformer_sf):
        assert (r["task"], r["dataset"]) == ("MultiscaleTranslationTask", "SideDataLanguagePairDataset"), r
        assert {"src_tokens", "src_word_ids", "src_word_heads"} <= set(r["inputs"]), r
    assert "src_char_len" in transformer_sf["inputs"] and "src_char_len" not in umst["inputs"]
    stock = record["rows"][0]
    for r in record["rows"]:
        assert len(r["ms_runs"]) == 2 and r["ms_per_batch"] > 0 and r["sentences_per_batch"] > 0
        assert r["timed_batches"] == 3  # --batches, after --skip
        assert r["batches_per_s"] == round(1000 / r["ms_per_batch"], 2)
        assert r["vs_stock"] == round(stock["ms_per_batch"] / r["ms_per_batch"], 3)
        assert f"| {r['name']} |" in proc.stdout


def test_too_few_batches_for_the_timing_is_a_clear_error(toy_databin):
    proc = e2e.run([sys.executable, "-m", "benchmarks", "loader", "--data", toy_databin, "--max-tokens", "200",
                    "--num-workers", "0", "--archs", "transformer", "--batches", "100000", "--repeats", "1"],
                   check=False)
    assert proc.returncode != 0
    assert "fewer than the 5 + 100000 asked for (--skip, --batches)" in proc.stderr, proc.stderr[-2000:]
    # exactly as many batches as asked for is enough
    available = int(re.search(r": (\d+) batches of 200 tokens", proc.stderr).group(1))
    e2e.run([sys.executable, "-m", "benchmarks", "loader", "--data", toy_databin, "--max-tokens", "200",
             "--num-workers", "0", "--archs", "transformer", "--batches", str(available - 5), "--repeats", "1"])
