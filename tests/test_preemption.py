"""umst_plugin/training/preemption.py: a signal stops training at an update boundary every rank agrees on, with
checkpoint_last.pt saved mid-epoch; outside training the signals act as before; the checkpoint a multi-rank resume
broadcasts loads on the other ranks (patches/broadcast_checkpoint_load.py). The Slurm path (the sbatch scripts'
--signal, requeue, resume to the same losses) is tests/test_rehearsal.py."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import e2e

TRAIN_SH = os.path.join(e2e.ROOT, "scripts", "train.sh")
# tiny width, many short updates (the signal must land mid-epoch: 400 toy pairs at 150 tokens are ~30 updates)
OVERRIDES = ["task.source_lang=kel", "task.target_lang=mor", "model.encoder_layers=1", "model.decoder_layers=1",
             "model.encoder_embed_dim=16", "model.decoder_embed_dim=16", "model.encoder_ffn_embed_dim=32",
             "model.decoder_ffn_embed_dim=32", "model.encoder_attention_heads=2", "model.decoder_attention_heads=2",
             "lr_scheduler.warmup_updates=5", "optimization.max_update=400", "optimization.update_freq=[2]",
             "dataset.max_tokens=150", "dataset.num_workers=0", "dataset.disable_validation=true",
             "checkpoint.no_epoch_checkpoints=true", "common.log_interval=1"]


def run_with_handlers(lines):
    """A fresh Python process that imports the plugin and runs ``lines`` (the handlers installed by a line of them
    or not); its CompletedProcess."""
    code = "\n".join(["import gc, os, signal, time, umst_plugin", "from umst_plugin.training import preemption",
                       *lines]) + "\n"
    return subprocess.run([sys.executable, "-c", code], env=e2e.cli_env(), capture_output=True, text=True, timeout=60)


def test_signals_act_as_before_outside_training():
    """The patch's handlers are installed by a Trainer; with none alive, SIGTERM still ends the process (its
    default action) and an ignored SIGUSR1 stays ignored."""
    proc = run_with_handlers(["signal.signal(signal.SIGUSR1, signal.SIG_IGN)",
                              "preemption._install_handlers([signal.SIGUSR1, signal.SIGTERM])",
                              "assert signal.getsignal(signal.SIGTERM) is preemption._handler",
                              "os.kill(os.getpid(), signal.SIGUSR1)",
                              "print('usr1 ignored', flush=True)",
                              "os.kill(os.getpid(), signal.SIGTERM)",
                              "time.sleep(30)"])
    assert proc.stdout.strip() == "usr1 ignored", proc.stderr[-2000:]
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    from umst_plugin.training.preemption import parse_signals

    assert parse_signals("USR1, sigterm") == [signal.SIGUSR1, signal.SIGTERM] and parse_signals("none") == []
    with pytest.raises(ValueError, match="KILL"):
        parse_signals("KILL")





def test_the_first_signal_during_training_is_the_request():
    """While a Trainer is alive a stop signal only sets the request: the process goes on, the request names the first
    signal and the update it came in; a second signal (Slurm's SIGTERM after the warning, srun forwarding it) is not
    a new request."""
    proc = run_with_handlers(["class Trainer:",
                              "    def get_num_updates(self):",
                              "        return 7",
                              "trainer = Trainer()",
                              "preemption._register(trainer)",
                              "preemption._install_handlers([signal.SIGUSR1, signal.SIGTERM])",
                              "os.kill(os.getpid(), signal.SIGUSR1)",
                              "os.kill(os.getpid(), signal.SIGTERM)",
                              "name, _, update = preemption.local_request()",
                              "print(name, update, len(preemption._received), flush=True)"])
    assert (proc.returncode, proc.stdout.split()) == (0, ["SIGUSR1", "7", "1"]), (proc.returncode, proc.stderr[-2000:])

def test_a_new_training_forgets_the_request_that_stopped_the_last_one():
    """A process that trains again after a stop (a notebook, several runs in one process) starts its next training
    without the old request, which would stop it at its first update; a Trainer built while another is alive (the
    same training's) keeps it."""
    proc = run_with_handlers(["class Trainer:",
                              "    def get_num_updates(self):",
                              "        return 5",
                              "preemption._received.append(('SIGUSR1', time.time(), 3))  # the last training's stop",
                              "first = Trainer()",
                              "preemption._register(first)",
                              "print('first', preemption.local_request(), flush=True)",
                              "preemption._received.append(('SIGTERM', time.time(), 4))",
                              "second = Trainer()",
                              "preemption._register(second)",
                              "print('second', preemption.local_request()[0], flush=True)"])
    assert (proc.returncode, proc.stdout.split()) == (0, ["first", "None", "second", "SIGTERM"]), proc.stderr[-2000:]

@pytest.mark.parametrize("end_of_epoch, epoch, save_interval, updates, every, validate_after, saves", [
    (True, 2, 1, 7, 0, 0, True),       # an epoch's end at the save interval
    (True, 3, 2, 7, 0, 0, False),      # an epoch's end between save intervals
    (False, 2, 1, 7, 0, 0, False),     # mid-epoch, no --save-interval-updates
    (False, 1, 1, 20, 10, 0, True),    # at --save-interval-updates
    (False, 1, 1, 25, 10, 0, False),   # between them
    (False, 1, 1, 20, 10, 20, True),   # at --validate-after-updates itself
    (False, 1, 1, 20, 10, 21, False),  # before --validate-after-updates
    (False, 1, 1, 0, 10, 0, False),    # update 0
])
def test_a_stop_lets_fairseq_save_where_it_saves_anyway(end_of_epoch, epoch, save_interval, updates, every,
                                                        validate_after, saves):
    """Where fairseq's validate_and_save saves at this update anyway (fairseq_cli/train.py's ``do_save`` without
    its ``should_stop``), a stop runs it as it was, with its validation and epoch checkpoint, and saves nothing
    more; everywhere else the stop saves checkpoint_last.pt itself. Each term of fairseq's condition, pinned."""
    from types import SimpleNamespace

    from umst_plugin.training.preemption import _fairseq_saves

    cfg = SimpleNamespace(checkpoint=SimpleNamespace(save_interval=save_interval, save_interval_updates=every),
                          dataset=SimpleNamespace(validate_after_updates=validate_after))
    assert _fairseq_saves(cfg, SimpleNamespace(epoch=epoch), updates, end_of_epoch) is saves


@pytest.mark.parametrize("end_of_epoch, epoch, save_interval, updates, every, saves", [
    (True, 2, 1, 7, 0, True),     # an epoch's end at the save interval: fairseq validates and saves
    (True, 3, 2, 7, 0, False),    # an epoch's end between save intervals: fairseq validates, saves nothing
    (False, 1, 1, 20, 10, True),  # at --save-interval-updates: fairseq validates and saves
    (False, 1, 1, 25, 10, False),  # between them: fairseq does nothing
])
def test_a_stop_runs_fairseqs_validate_and_save_where_it_acts_and_saves_nothing_after_it(
        end_of_epoch, epoch, save_interval, updates, every, saves, tmp_path):
    """The stop itself (``_stop``) around fairseq's ``validate_and_save``, the function it is given: called at an
    epoch's end or where fairseq saves anyway (its validation losses returned), not elsewhere; where it saved, the
    stop writes no second checkpoint (a save here would need a real Trainer: this one has none of its parts) and
    rank 0 writes the marker. Where fairseq saves nothing the stop saves checkpoint_last.pt itself: the training
    runs above check that, so these cases run with --no-save."""
    from types import SimpleNamespace

    from umst_plugin.training import preemption

    calls = []

    def validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        calls.append(end_of_epoch)
        return [0.5], False  # fairseq's (valid losses, should_stop): not at --max-update

    cfg = SimpleNamespace(checkpoint=SimpleNamespace(save_interval=save_interval, save_interval_updates=every,
                                                     no_save=not saves, save_dir=str(tmp_path)),
                          dataset=SimpleNamespace(validate_after_updates=0))
    trainer = SimpleNamespace(get_num_updates=lambda: updates, data_parallel_rank=0)
    epoch_itr = SimpleNamespace(epoch=epoch, iterations_in_epoch=3)
    saved = list(preemption._received)
    try:
        preemption._received[:] = [("SIGUSR1", time.time(), updates - 1)]
        out = preemption._stop(validate_and_save, cfg, trainer, None, epoch_itr, ["valid"], end_of_epoch)
    finally:
        preemption._received[:] = saved
    acts = end_of_epoch or saves
    assert calls == ([end_of_epoch] if acts else [])
    assert out == ([0.5] if acts else [None], True)
    assert (tmp_path / preemption.MARKER).exists() is saves  # (--no-save: no marker)


def test_the_agreed_flag_is_the_ranks_sum_and_one_process_reads_its_own():
    """With more than one rank the stop is the all-reduced sum of the ranks' flags (> 0 on every rank alike, also
    where this rank got no signal); one process reads its own request; a Trainer without the flag (--stop-on-signals
    none) never stops on one. On a CPU the stored sum is a float (gloo reduces on the CPU)."""
    from types import SimpleNamespace

    from umst_plugin.training import preemption

    flag = preemption._AgreedFlag()
    assert flag.read() == 0.0
    flag.store(torch.tensor(2.0))
    assert flag.read() == 2.0 and flag.event is None
    flag.store(0.0)
    assert flag.read() == 0.0
    saved = list(preemption._received)
    try:
        preemption.reset()
        two_ranks = SimpleNamespace(_umst_agreed_stop=flag, data_parallel_world_size=2)
        one = SimpleNamespace(_umst_agreed_stop=flag, data_parallel_world_size=1)
        assert not preemption.agreed_request(two_ranks) and not preemption.agreed_request(one)
        flag.store(torch.tensor(1.0))  # another rank's signal
        assert preemption.agreed_request(two_ranks) and not preemption.agreed_request(one)
        flag.store(0.0)
        preemption._received.append(("SIGUSR1", time.time(), 3))  # this process's own signal
        assert preemption.agreed_request(one) and not preemption.agreed_request(two_ranks)
        assert preemption.local_request()[0] == "SIGUSR1"
        assert not preemption.agreed_request(SimpleNamespace(data_parallel_world_size=1))  # --stop-on-signals none
    finally:
        preemption._received[:] = saved

@pytest.mark.cuda
def test_on_a_gpu_the_agreed_flag_is_copied_to_pinned_memory_without_a_sync():
    """On a GPU the all-reduced sum stays on the device: ``store`` copies it to one pinned host buffer, kept from
    update to update, with no host-device sync (the hot path's rule), and ``read`` waits for that copy's event."""
    from umst_plugin.training import preemption

    flag = preemption._AgreedFlag()
    summed = torch.tensor(2.0, device="cuda")  # (made before the check: a copy from pageable memory syncs)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # a blocking copy to the host raises
    try:
        flag.store(summed)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    buffer = flag.value
    assert isinstance(buffer, torch.Tensor) and buffer.device.type == "cpu" and buffer.is_pinned()
    assert flag.event is not None and flag.read() == 2.0
    flag.store(torch.tensor(0.0, device="cuda"))
    assert flag.value is buffer and flag.read() == 0.0


def test_a_process_that_stopped_on_a_signal_ignores_repeats_on_its_way_out():
    """After training stopped on a signal and its Trainer is gone, the same signals again (train-job.sh re-sends
    the warning every 5 s until training has stopped; Slurm's SIGTERM may follow) no longer end the process with the
    signal's status: it exits as it would have. A process without a stop request still gets the default action
    (test above)."""
    proc = run_with_handlers(["preemption._install_handlers([signal.SIGUSR1, signal.SIGTERM])",
                              "preemption._received.append(('SIGUSR1', time.time(), 333))  # what a stopped training "
                              "leaves",
                              "os.kill(os.getpid(), signal.SIGUSR1)",
                              "os.kill(os.getpid(), signal.SIGTERM)",
                              "print('still here', preemption.local_request()[0], flush=True)"])
    assert (proc.returncode, proc.stdout.strip()) == (0, "still here SIGUSR1"), (proc.returncode, proc.stderr[-2000:])


def test_a_warning_after_the_last_update_does_not_kill_the_ending_process():
    """A Trainer was built and its training ended (the Trainer is gone, no stop request): the time-limit warning that
    comes now (slurmctld's check landed between the last update and the process's exit: the WMT rehearsal's third
    run, which ended with status 138 and a FAILED job before) and a SIGTERM after it are ignored, and the process
    exits with its own status."""
    proc = run_with_handlers(["class Trainer:",
                              "    def get_num_updates(self):",
                              "        return 746",
                              "trainer = Trainer()",
                              "preemption._register(trainer)  # what Trainer.__init__ does",
                              "preemption._install_handlers([signal.SIGUSR1, signal.SIGTERM])",
                              "del trainer",
                              "gc.collect()",
                              "assert not list(preemption._trainers)",
                              "os.kill(os.getpid(), signal.SIGUSR1)",
                              "os.kill(os.getpid(), signal.SIGTERM)",
                              "print('still here', preemption.local_request(), flush=True)"])
    assert (proc.returncode, proc.stdout.strip()) == (0, "still here None"), (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("trained", [True, False], ids=["trained", "never-trained"])
def test_a_warning_while_the_interpreter_tears_down_does_not_kill_a_process_that_trained(trained):
    """Python drops its signal handlers when the interpreter finalizes, after the exit functions; tearing torch and
    fairseq down takes a while, and the WMT rehearsal's two-node job got its time-limit warning there, just after
    its last update (status 138, a FAILED job). A process that trained exits with its own status (its exit function
    left the stop signals ignored); one that never trained still gets the signal's default action. The signal is
    sent while an object's finalizer runs in the teardown, after the exit functions."""
    lines = ["class Trainer:",
             "    def get_num_updates(self):",
             "        return 746",
             "trainer = Trainer()",
             "preemption._register(trainer)" if trained else "pass",
             "preemption._install_handlers([signal.SIGUSR1, signal.SIGTERM])",
             "del trainer",
             "gc.collect()",
             "class Teardown:",
             "    def __del__(self):",
             "        print('tearing down', flush=True)",
             "        time.sleep(3)",
             "teardown = Teardown()",
             "print('ready', flush=True)"]
    code = "\n".join(["import gc, os, signal, time, umst_plugin", "from umst_plugin.training import preemption",
                      *lines]) + "\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env=e2e.cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out = []
    for line in proc.stdout:
        out.append(line.strip())
        if line.startswith("tearing down"):
            time.sleep(0.5)  # (inside the finalizer's sleep: the interpreter is finalizing)
            proc.send_signal(signal.SIGUSR1)
    status = proc.wait(timeout=60)
    assert out == ["ready", "tearing down"], (out, proc.stderr.read()[-2000:])
    assert status == (0 if trained else -signal.SIGUSR1), (status, proc.stderr.read()[-2000:])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_signal_to_a_no_save_run_stops_it_and_says_nothing_was_saved(toy_databin, tmp_path):
    """--no-save (a benchmark's run): SIGTERM mid-epoch stops training at an update boundary and exits 0, saying
    that nothing was saved and the run cannot be resumed; no stopped-on-signal.json is written (a job script that
    found one would requeue a run that starts over)."""
    env = {**e2e.cli_env(), "PYTHON": os.path.join(e2e.BIN, "python")}
    save = tmp_path / "ck"
    with open(tmp_path / "train.log", "w+") as log:
        run = subprocess.Popen(["bash", TRAIN_SH, "m30k-umst", "--data", toy_databin, "--save-dir", str(save),
                                "--gpus", "0", "--", *OVERRIDES, "checkpoint.no_save=true"], env=env, cwd=e2e.ROOT,
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while not re.search(r"num_updates=3,", (tmp_path / "train.log").read_text()):
                assert time.monotonic() < deadline and run.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
                time.sleep(0.1)
            run.send_signal(signal.SIGTERM)
            code = run.wait(timeout=120)
        finally:
            run.kill() if run.poll() is None else None
    out = (tmp_path / "train.log").read_text()
    assert code == 0, out[-3000:]
    assert re.search(r"Stopping training on SIGTERM \(received during update \d+.*\): nothing saved at update \d+, "
                     r"epoch 1 \(\d+ batches in\) \(--no-save\): the run cannot be resumed", out), out[-3000:]
    assert not (save / "stopped-on-signal.json").exists() and not (save / "checkpoint_last.pt").exists()


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_update(toy_databin, tmp_path):
    """Two "machines" (train.sh --nnodes 2, gloo over 127.0.0.1); SIGUSR1 to rank 1 alone, mid-epoch: both stop at
    the same update, rank 0 saves checkpoint_last.pt there with the data iterator's position inside the epoch and
    writes stopped-on-signal.json, and both exit 0."""
    port = str(free_port())
    env = {**e2e.cli_env(), "PYTHON": os.path.join(e2e.BIN, "python")}
    logs = [open(tmp_path / f"rank{rank}.log", "w+") for rank in (0, 1)]
    ranks = [subprocess.Popen(["bash", TRAIN_SH, "m30k-umst", "--data", toy_databin, "--save-dir", str(tmp_path / "ck"),
                               "--gpus", "0", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                               "--master-port", port, "--", *OVERRIDES], env=env, cwd=e2e.ROOT, stdout=logs[rank],
                              stderr=subprocess.STDOUT) for rank in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while not re.search(r"num_updates=5,", (tmp_path / "rank0.log").read_text()):  # (rank 0 logs the updates)
            assert time.monotonic() < deadline and ranks[1].poll() is None, (tmp_path / "rank0.log").read_text()[-3000:]
            time.sleep(0.1)
        ranks[1].send_signal(signal.SIGUSR1)  # train.sh exec'd python: the rank itself
        codes = [p.wait(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            p.kill() if p.poll() is None else None
    out = [(tmp_path / f"rank{rank}.log").read_text() for rank in (0, 1)]
    assert codes == [0, 0], [o[-3000:] for o in out]
    stops = [re.findall(r"Stopping training on (.+?) \(received during update (\d+).*?saved at update (\d+), epoch (\d+) "
                        r"\((\d+) batches in\)", o) for o in out]
    assert len(stops[0]) == len(stops[1]) == 1, stops
    # (fairseq's other ranks log warnings only: the stop line is one)
    (name0, _, *where0), (name1, received, *where1) = stops[0][0], stops[1][0]
    assert name1 == "SIGUSR1" and name0 == "a signal on another rank", stops
    assert where0 == where1, stops  # the same update, epoch and position on both ranks
    update, epoch, batches = map(int, where1)
    per_epoch = int(re.search(r"epoch 001: +\d+ / (\d+) ", out[0]).group(1))
    # the update the signal came in, or the next (the flag joins the all-reduce of the update after it came)
    assert update - int(received) in (0, 1), stops
    assert epoch == 1 and batches == update < per_epoch, (stops, per_epoch)  # mid-epoch
    ckpt = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert ckpt["optimizer_history"][-1]["num_updates"] == update
    iterator = ckpt["extra_state"]["train_iterator"]
    assert iterator["epoch"] == 1 and iterator["iterations_in_epoch"] == batches  # resumes there, mid-epoch
    marker = (tmp_path / "ck" / "stopped-on-signal.json").read_text()  # written by rank 0
    assert f'"num_updates": {update}' in marker and '"signal": "a signal on another rank"' in marker, marker
    # what a resume of these 2 ranks broadcasts (patches/broadcast_checkpoint_load.py): rank 0 loads the checkpoint
    # and pickles its non-tensor part; the other ranks' torch.load refuses it (weights_only) unless the patch allows
    # the classes it holds, which it does for that call only
    import io
    import pickle

    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    from umst_plugin.patches.broadcast_checkpoint_load import broadcast_classes

    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "ck" / "checkpoint_last.pt"))
    buffer = io.BytesIO()
    torch.save(distributed_utils._split_tensors_from_obj(state, []), buffer)
    with pytest.raises(pickle.UnpicklingError, match="omegaconf"):
        torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu")
    with torch.serialization.safe_globals(broadcast_classes()):
        received = torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu")
    assert received["cfg"]["checkpoint"]["save_dir"] == str(tmp_path / "ck")
    # fairseq's receiving side itself, as the plugin leaves it: _broadcast_object_slow on rank 1 of 2, fed rank 0's
    # bytes (its rank and the two broadcasts answered as a gloo group would) returns the state; fairseq's own
    # function (the patch's __wrapped__) stops with the error of a multi-rank resume under torch>=2.6
    received = _received_on_rank_1(distributed_utils._broadcast_object_slow, buffer.getvalue())
    assert received["cfg"]["checkpoint"]["save_dir"] == str(tmp_path / "ck")
    with pytest.raises(pickle.UnpicklingError, match="omegaconf"):
        _received_on_rank_1(distributed_utils._broadcast_object_slow.__wrapped__, buffer.getvalue())


def _received_on_rank_1(broadcast_object_slow, sent):
    """What ``broadcast_object_slow`` returns on rank 1 when rank 0 broadcasts the bytes ``sent``: fairseq's
    ``get_rank`` and ``broadcast`` (module globals it calls) answered here, the length first, then the bytes."""
    from unittest import mock

    from fairseq.distributed import utils as distributed_utils

    messages = [torch.tensor([len(sent)]), torch.frombuffer(bytearray(sent), dtype=torch.uint8)]

    def broadcast(tensor, src, group):
        assert src == 0
        tensor.copy_(messages.pop(0))
    with mock.patch.object(distributed_utils, "get_rank", lambda group: 1), \
            mock.patch.object(distributed_utils, "broadcast", broadcast):
        out = broadcast_object_slow(None, 0, None, torch.device("cpu"))
    assert not messages
    return out
