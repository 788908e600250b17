"""Every checkpoint resumes, and resuming changes nothing; a stock fairseq run is the same with the plugin loaded.

Real fairseq-train command lines (``tests/train_driver.py``: each in-process as fairseq-train runs it, several per
process) on the toy corpus, fairseq's own ``--task translation --arch transformer`` at tiny width:

* **saved by** stock fairseq (a process that never imports the plugin), the plugin with ``--use-old-adam``
  (fairseq's adam), or the plugin's adam: an uninterrupted run of ``N`` updates that writes a checkpoint at
  update ``K`` (what a run stopped there would have saved);
* **precision** fp32, ``--amp`` (fp16; with the plugin, the CPU grad scaler) and ``--amp --amp-dtype bfloat16``
  (the plugin's flag: no stock cell). ``--fp16`` is not in the matrix: fairseq's FP16Optimizer needs CUDA
  (``torch.cuda.current_device()``). Stock fairseq's ``--amp`` is CUDA autocast and a CUDA grad scaler, which
  do nothing on a CPU: its losses there are its fp32 losses bit for bit (``test_stock_amp_is_fp32_on_a_cpu``),
  so the --amp fp16 cells with stock fairseq as saver or resumer are GPU cells (``test_stock_amp_fp16_resume``,
  marked ``cuda``); on a CPU the --amp fp16 cells are the plugin's (its adam and fairseq's) among themselves;
* **resumed by** each of the three (``--restore-file``), for updates ``K+1 .. N``: its losses equal those of the
  resumer's own uninterrupted run (bit for bit where saver and resumer are the same, to float32 rounding carried
  by the forward pass's precision where they differ). Stock fairseq loads the plugin's checkpoints without the
  plugin -- with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, without which stock fairseq 0.12 resumes no checkpoint
  of a legacy arch under torch>=2.6, its own included.

A control cell resumes with ``--reset-optimizer`` (Adam's moments lost): its losses part from the uninterrupted
run by far more than the tolerance, so a resume that dropped the optimizer's state would fail here.

A resume 5 batches into epoch 2 (the 50-update runs' checkpoint at update 12): with the plugin every later loss
is the uninterrupted run's, bit for bit; stock fairseq parts from its own uninterrupted run at the first update,
having cut its batches from another example order (the fairseq bug of ``patches/resume_batch_order.py``).

``test_stock_run_unchanged``: stock fairseq's fp32 transformer, 50 updates, in a process without the plugin and in
one with ``--user-dir umst_plugin``: the same losses (the plugin's patches that touch this run -- the fused adam,
the grad norm -- compute fairseq's numbers to float32 rounding).
"""
import glob
import json
import os
import subprocess
import sys

import pytest

import e2e

K, N, STOCK_UPDATES = 4, 8, 50
# a resume in epoch 2: the toy corpus makes 7 batches an epoch at --max-tokens 1000, so the 50-update runs'
# checkpoint at update 12 is 5 batches into epoch 2 (patches/resume_batch_order.py; asserted from the checkpoint)
K_EPOCH_2, EPOCH_2_POSITION = 12, {"epoch": 2, "iterations_in_epoch": 5}
WHO = ("stock", "old", "plugin")
PRECISIONS = {"fp32": [], "amp-fp16": ["--amp"], "amp-bf16": ["--amp", "--amp-dtype", "bfloat16"]}
# relative, of each loss, where saver and resumer differ (the same one resumes bit for bit); measured on the
# toy corpus: fp32 0, --amp fp16 1.1e-5, bf16 7.4e-5 (a checkpoint of fairseq's adam stepped on by the fused
# kernel, or the other way round: float32 rounding that a low-precision forward pass carries on)
TOLERANCE = {"fp32": 1e-6, "amp-fp16": 5e-5, "amp-bf16": 3e-4}


def _who_args(who):
    if who == "stock":
        return []
    return ["--user-dir", e2e.PLUGIN] + (["--use-old-adam"] if who == "old" else [])


def _common(databin, max_update, device="cpu"):
    return [databin, "--task", "translation", "--arch", "transformer", *e2e.TINY, "--share-all-embeddings",
            "--optimizer", "adam", "--adam-betas", "(0.9,0.997)", "--adam-eps", "1e-8", "--weight-decay", "0.01",
            "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "1000",
            "--max-update", str(max_update), "--seed", "1", *(["--cpu"] if device == "cpu" else []),
            "--num-workers", "0", "--no-progress-bar", "--log-format", "simple", "--log-interval", "1",
            "--disable-validation", "--no-epoch-checkpoints", "--required-batch-size-multiple", "1"]


def _all_cells():
    for precision in PRECISIONS:
        for saver in WHO:
            for resumer in WHO:
                if "stock" in (saver, resumer) and precision == "amp-bf16":
                    continue  # --amp-dtype is the plugin's
                yield precision, saver, resumer


def _on_cuda_only(precision, saver, resumer):
    """Stock fairseq's --amp on a CPU is fp32 (CUDA autocast and grad scaler): those cells need a GPU."""
    return precision == "amp-fp16" and "stock" in (saver, resumer)


def _cells():
    """The cells a CPU runs as they claim."""
    return [cell for cell in _all_cells() if not _on_cuda_only(*cell)]


CUDA_CELLS = [cell for cell in _all_cells() if _on_cuda_only(*cell)]


def _cell_id(precision, saver, resumer):
    return f"{precision}-{saver}-to-{resumer}"


def _drive(tmp, batches):
    """Run ``batches`` ({name: (runs, env)}) as driver processes side by side (two cores: two at a time);
    returns every run's result."""
    procs = {}
    for name, (runs, env) in batches.items():
        spec, out = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}-out.json")
        with open(spec, "w") as f:
            json.dump(runs, f)
        procs[name] = (subprocess.Popen([sys.executable, os.path.join(e2e.ROOT, "tests", "train_driver.py"), spec,
                                         out], env=dict(e2e.cli_env(), **(env or {})), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=e2e.ROOT), out)
    results = {}
    for name, (proc, out) in procs.items():
        _, stderr = proc.communicate()
        assert proc.returncode == 0 and os.path.exists(out), stderr[-6000:]
        with open(out) as f:
            results.update(json.load(f))
    return results


def _without_optimizer_state(checkpoint, out):
    """The checkpoint with Adam's state dropped (what a load that loses it would leave): the control cell."""
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["last_optimizer_state"]["state"] = {}
    torch.save(state, out)
    return out


@pytest.fixture(scope="module")
def matrix(toy_databin, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("resume"))

    def save_dir(precision, who):
        return os.path.join(tmp, f"save-{precision}-{who}")

    def saver_run(precision, who):
        return {"name": f"full {precision} {who}",
                "argv": _common(toy_databin, N) + PRECISIONS[precision] + _who_args(who) + [
                    "--save-dir", save_dir(precision, who), "--save-interval-updates", str(K)]}

    def resume_run(precision, saver, resumer, checkpoint=None, name=None):
        checkpoint = checkpoint or "glob:" + os.path.join(save_dir(precision, saver), f"checkpoint_*_{K}.pt")
        return {"name": name or f"resume {precision} {saver}->{resumer}",
                "argv": _common(toy_databin, N) + PRECISIONS[precision] + _who_args(resumer) + [
                    "--restore-file", checkpoint, "--save-dir", os.path.join(tmp, "unused"), "--no-save"]}

    def fp32_saver(who):  # the 50-update run of test_stock_run_unchanged saves at update K too
        return {"name": f"{who} fp32 50", "argv": _common(toy_databin, STOCK_UPDATES) + _who_args(who) + [
            "--save-dir", save_dir("fp32", who), "--save-interval-updates", str(K)]}

    # savers side by side: stock fairseq in a process of its own, the plugin (fairseq's adam and its own) in
    # another; then resumes side by side: the plugin's process resumes every checkpoint, stock fairseq's every
    # checkpoint of fp32 and --amp
    results = _drive(tmp, {
        "stock-saves": ([fp32_saver("stock"), saver_run("amp-fp16", "stock")], None),
        "plugin-saves": ([fp32_saver("plugin"), saver_run("fp32", "old")] + [
            saver_run(p, who) for p in ("amp-fp16", "amp-bf16") for who in ("old", "plugin")], None)})
    stock_checkpoint = glob.glob(os.path.join(save_dir("fp32", "stock"), f"checkpoint_*_{K}.pt"))[0]
    lost = _without_optimizer_state(stock_checkpoint, os.path.join(tmp, "lost-optimizer-state.pt"))
    plugin_resumes = [resume_run(p, s, r) for p, s, r in _cells() if r != "stock"]
    plugin_resumes.append(resume_run("fp32", "stock", "plugin", checkpoint=lost, name="lost optimizer state"))

    def epoch_2_resume(who):  # the 50-update run, stopped 5 batches into epoch 2 and resumed by the same
        checkpoint = "glob:" + os.path.join(save_dir("fp32", who), f"checkpoint_*_{K_EPOCH_2}.pt")
        return {"name": f"{who} resumes in epoch 2", "argv": _common(toy_databin, STOCK_UPDATES) + _who_args(who) + [
            "--restore-file", checkpoint, "--save-dir", os.path.join(tmp, "unused"), "--no-save"]}

    plugin_resumes.append(epoch_2_resume("plugin"))
    # stock fairseq 0.12 cannot resume any checkpoint of a legacy arch (its own included) under torch>=2.6
    # without torch's escape hatch: the model config is an argparse.Namespace, which weights_only refuses
    # (the plugin allow-lists that one class: patches/checkpoint_classes.py)
    results.update(_drive(tmp, {
        "plugin-resumes": (plugin_resumes, None),
        "stock-resumes": ([resume_run(p, s, r) for p, s, r in _cells() if r == "stock"] + [epoch_2_resume("stock")],
                          {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})}))
    import torch

    for who in ("stock", "plugin"):
        (checkpoint,) = glob.glob(os.path.join(save_dir("fp32", who), f"checkpoint_*_{K_EPOCH_2}.pt"))
        position = torch.load(checkpoint, map_location="cpu", weights_only=False)["extra_state"]["train_iterator"]
        results[f"{who} epoch 2 checkpoint"] = {k: position[k] for k in EPOCH_2_POSITION}
    return results


def _full(matrix, precision, who):
    """The uninterrupted run's result (fp32 stock and plugin: the 50-update runs, which saved at update K)."""
    if precision == "fp32" and who != "old":
        return matrix[f"{who} fp32 50"]
    return matrix[f"full {precision} {who}"]


@pytest.mark.slow
@pytest.mark.parametrize("precision,saver,resumer", [pytest.param(*c, id=_cell_id(*c)) for c in _cells()])
def test_resume(matrix, precision, saver, resumer):
    full, resumed = _full(matrix, precision, resumer), matrix[f"resume {precision} {saver}->{resumer}"]
    assert full["error"] is None and resumed["error"] is None, (resumed["error"], full["error"])
    assert len(full["losses"]) >= N and len(resumed["losses"]) == N - K, (full, resumed)
    expected = full["losses"][K:N]
    if saver == resumer:
        assert resumed["losses"] == expected
    for got, want in zip(resumed["losses"], expected):
        assert got == pytest.approx(want, rel=TOLERANCE[precision]), (resumed["losses"], expected)


@pytest.mark.slow
def test_a_lost_optimizer_state_would_show(matrix):
    """The control: a resume from a checkpoint whose Adam state was dropped parts from the uninterrupted run by
    more than 10x the --amp fp16 tolerance (measured: 4.6e-3)."""
    full, lost = matrix["plugin fp32 50"], matrix["lost optimizer state"]
    assert lost["error"] is None and len(lost["losses"]) == N - K
    worst = max(abs(a - b) / b for a, b in zip(lost["losses"], full["losses"][K:N]))
    assert worst > 10 * TOLERANCE["amp-fp16"], worst


@pytest.mark.slow
def test_stock_run_unchanged(matrix):
    """Stock --task translation --arch transformer, fp32, 50 updates: the same losses without and with the plugin."""
    stock, plugin = matrix["stock fp32 50"], matrix["plugin fp32 50"]  # one process without the plugin, one with
    assert stock["error"] is None and plugin["error"] is None
    assert len(stock["losses"]) == STOCK_UPDATES == len(plugin["losses"])
    for a, b in zip(plugin["losses"], stock["losses"]):
        assert a == pytest.approx(b, rel=1e-5), (plugin["losses"], stock["losses"])


@pytest.mark.slow
def test_a_resume_in_epoch_2_gives_the_uninterrupted_losses(matrix):
    """fairseq orders a resumed process's training examples with the resume epoch's seed (the uninterrupted process
    built its batches in epoch 1 and reuses them): with the plugin (patches/resume_batch_order.py) the run resumed
    5 batches into epoch 2 trains on the uninterrupted run's batches, every loss bit for bit, to update 50."""
    assert matrix["plugin epoch 2 checkpoint"] == EPOCH_2_POSITION
    full, resumed = matrix["plugin fp32 50"], matrix["plugin resumes in epoch 2"]
    assert resumed["error"] is None and len(resumed["losses"]) == STOCK_UPDATES - K_EPOCH_2
    assert resumed["losses"] == full["losses"][K_EPOCH_2:]


@pytest.mark.slow
def test_stock_fairseq_resumed_in_epoch_2_trains_on_other_batches(matrix):
    """The fairseq bug the patch fixes, at the command line: stock fairseq resumed from its own checkpoint 5 batches
    into epoch 2 parts from its uninterrupted run at the first update (when this fails, fairseq has been fixed:
    the patch can go)."""
    assert matrix["stock epoch 2 checkpoint"] == EPOCH_2_POSITION
    full, resumed = matrix["stock fp32 50"], matrix["stock resumes in epoch 2"]
    assert resumed["error"] is None and len(resumed["losses"]) == STOCK_UPDATES - K_EPOCH_2
    first, want = resumed["losses"][0], full["losses"][K_EPOCH_2]
    assert abs(first - want) / want > 100 * TOLERANCE["fp32"], (first, want)


@pytest.mark.slow
def test_stock_amp_is_fp32_on_a_cpu(matrix):
    """Why stock fairseq's --amp fp16 cells are GPU cells: on a CPU its --amp run's losses are its fp32 run's, bit for
    bit (torch.cuda.amp's autocast and grad scaler do nothing there), where the plugin's --amp differs from its fp32
    run. When this fails, stock --amp computes in fp16 on a CPU and those cells can come back to this matrix."""
    amp, fp32 = matrix["full amp-fp16 stock"], matrix["stock fp32 50"]
    assert amp["error"] is None and len(amp["losses"]) == N
    assert amp["losses"] == fp32["losses"][:N]
    assert matrix["full amp-fp16 plugin"]["losses"] != matrix["plugin fp32 50"]["losses"][:N]


# ---- on a GPU: the cells with stock fairseq's --amp fp16 -----------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_matrix(toy_databin, tmp_path_factory):
    """The --amp fp16 savers (stock, fairseq's adam, the plugin's) and stock's fp32 run on the GPU, then the cells
    of CUDA_CELLS and a control: stock resuming its own checkpoint with Adam's state dropped."""
    tmp = str(tmp_path_factory.mktemp("resume-cuda"))

    def save_dir(who):
        return os.path.join(tmp, f"save-{who}")

    def common(max_update):
        return _common(toy_databin, max_update, device="cuda") + PRECISIONS["amp-fp16"]

    def saver_run(who):
        return {"name": f"full {who}", "argv": common(N) + _who_args(who) + [
            "--save-dir", save_dir(who), "--save-interval-updates", str(K)]}

    def resume_run(saver, resumer, checkpoint=None, name=None):
        checkpoint = checkpoint or "glob:" + os.path.join(save_dir(saver), f"checkpoint_*_{K}.pt")
        return {"name": name or f"resume {saver}->{resumer}", "argv": common(N) + _who_args(resumer) + [
            "--restore-file", checkpoint, "--save-dir", os.path.join(tmp, "unused"), "--no-save"]}

    stock_fp32 = {"name": "stock fp32", "argv": _common(toy_databin, N, device="cuda") + [
        "--save-dir", os.path.join(tmp, "unused-fp32"), "--no-save"]}
    results = _drive(tmp, {"stock-saves": ([saver_run("stock"), stock_fp32], None),
                           "plugin-saves": ([saver_run("old"), saver_run("plugin")], None)})
    (stock_checkpoint,) = glob.glob(os.path.join(save_dir("stock"), f"checkpoint_*_{K}.pt"))
    lost = _without_optimizer_state(stock_checkpoint, os.path.join(tmp, "lost-optimizer-state.pt"))
    results.update(_drive(tmp, {
        "plugin-resumes": ([resume_run(s, r) for _, s, r in CUDA_CELLS if r != "stock"], None),
        "stock-resumes": ([resume_run(s, r) for _, s, r in CUDA_CELLS if r == "stock"] + [
            resume_run("stock", "stock", checkpoint=lost, name="lost optimizer state")],
            {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})}))
    return results


def _worst_relative(got, want):
    return max(abs(a - b) / b for a, b in zip(got, want))


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("precision,saver,resumer", [pytest.param(*c, id=_cell_id(*c)) for c in CUDA_CELLS])
def test_stock_amp_fp16_resume(cuda_matrix, precision, saver, resumer):
    """The --amp fp16 cells with stock fairseq as saver or resumer, on the GPU (CUDA autocast and grad scaler):
    the resumed losses follow the resumer's uninterrupted run. No GPU run of this test is recorded yet and CUDA
    kernels are not bit for bit repeatable, so the bound is relative to the control in the same fixture: a tenth of
    how far stock's resume with Adam's state dropped parts from its uninterrupted run (on the CPU the control parts
    by 4.6e-3 and the --amp fp16 cells by 1.1e-5 at most: 400x). Stock's --amp is fp16 there: its losses are not
    its fp32 run's."""
    full, resumed = cuda_matrix[f"full {resumer}"], cuda_matrix[f"resume {saver}->{resumer}"]
    control = cuda_matrix["lost optimizer state"]
    for run in (full, resumed, control):
        assert run["error"] is None, run["error"]
    assert len(full["losses"]) == N and len(resumed["losses"]) == len(control["losses"]) == N - K
    assert cuda_matrix["full stock"]["losses"] != cuda_matrix["stock fp32"]["losses"]  # fp16, not fp32
    apart = _worst_relative(resumed["losses"], full["losses"][K:N])
    lost = _worst_relative(control["losses"], cuda_matrix["full stock"]["losses"][K:N])
    print(f"{saver}->{resumer}: resumed apart by {apart:.2e} (relative, worst); the control by {lost:.2e}")
    assert apart < lost / 10, (apart, lost, resumed["losses"], full["losses"][K:N])
