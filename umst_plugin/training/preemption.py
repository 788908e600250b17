"""Training stops cleanly on a signal -- it saves ``checkpoint_last.pt`` at the next update boundary and
exits -- so that a Slurm job warned before its time limit (``#SBATCH --signal=B:USR1@180``) or preempted
(SIGTERM) can be requeued and resume where it stopped (docs/wmt-on-gpus.md, "Preemption and resume").

fairseq has no signal handling: SIGTERM kills a run at once, SIGUSR1 too, and everything since the last
``--save-interval-updates`` checkpoint is lost. With the plugin loaded, while a ``Trainer`` exists in the process, the
signals of ``--stop-on-signals`` (default ``SIGUSR1,SIGTERM``) only set a flag; the update in progress finishes,
and at the update boundary where every rank knows of the flag training saves ``checkpoint_last.pt`` through
fairseq's own ``checkpoint_utils.save_checkpoint`` -- mid-epoch, with the data iterator's position, so that
fairseq resumes from it in the middle of the epoch, on the same batches -- logs one line and stops as
``--max-update`` stops it (exit status 0). At most the updates between the signal and that boundary run twice
after a resume; none is lost.

Where the ranks agree, without a collective of its own: every update, fairseq all-reduces the logging outputs and
its own extra statistics (``Trainer._aggregate_logging_outputs``: sample size, OOMs, training time, one buffer in
one collective). The plugin adds one number to that list: this rank's flag. Every rank reads the same sum at the
same update and stops at the same boundary (``fairseq_cli.train.validate_and_save``), even when only one rank got
the signal. Rank 0 also writes ``SAVE_DIR/stopped-on-signal.json``: the job script requeues the job only then (not
when the signal came after the last update). The summed flag is a CPU value where fairseq reduces on the CPU
(gloo); on a GPU it is copied to pinned host memory behind the all-reduce (``non_blocking``) and read through a
CUDA event at the update boundary. fairseq itself waits for that all-reduce's result later in the same update
(``sample_size or 1.0``, ``isfinite(grad_norm)``), so the event has completed by then: no host-device sync is
added to an update (that branch has not run on a GPU yet; the gloo/CPU one is tested). One process (no
all-reduce): its own flag.

Outside training the handlers do what the signal did before (the previous handler, or the default action), so
a program that imports the plugin and never trains is not changed. ``--stop-on-signals none`` turns it
off for a run.
"""
import atexit
import dataclasses
import logging
import os
import signal
import threading
import time
import weakref

from fairseq.dataclass import FairseqDataclass

from umst_plugin import common_options
from umst_plugin.patches import wrap

logger = logging.getLogger(__name__)

OPTIONS = "`--stop-on-signals`"
TARGET = ("fairseq.dataclass.configs.CommonConfig (common_options); fairseq.trainer.Trainer.__init__, "
          "Trainer._aggregate_logging_outputs; fairseq_cli.train.validate_and_save")
SYMPTOM = ("a Slurm job warned before its time limit (SIGUSR1) or preempted (SIGTERM) dies without saving: every "
           "update since the last checkpoint is lost, and a requeued job repeats them")
REMOVE_WHEN = "fairseq saves a mid-epoch checkpoint and stops on a signal (it has no signal handling as of 0.12.3)"

DEFAULT_SIGNALS = "SIGUSR1,SIGTERM"
HELP = ("comma-separated signals on which training finishes the update in progress, saves checkpoint_last.pt "
        "(mid-epoch, with the data position) at the next update boundary all ranks agree on, and stops (exit "
        "status 0; run the same command to resume). 'none': the signals' default actions")


@dataclasses.dataclass
class _PreemptionFields(FairseqDataclass):
    """Only here to have dataclasses build the field that CommonConfig receives."""
    stop_on_signals: str = dataclasses.field(default=DEFAULT_SIGNALS, metadata={"help": HELP})


def parse_signals(text):
    """"SIGUSR1,TERM" -> [SIGUSR1, SIGTERM]; "none" or "" -> []. Raises ValueError naming a bad entry."""
    if text is None or str(text).strip().lower() in ("", "none"):
        return []
    out = []
    for item in str(text).split(","):
        name = item.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if not hasattr(signal, name) or name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"--stop-on-signals: {item.strip()!r} is not a signal a process can catch "
                             f"(e.g. {DEFAULT_SIGNALS}, or none)")
        out.append(getattr(signal, name))
    return out


# ---- the flag: set by the handlers, read at update boundaries --------------------------------------------------

_trainers = weakref.WeakSet()  # the Trainers of this process; the handlers act only while one exists
_trained = False  # a Trainer was built in this process: with none alive after it, its training is over
_previous = {}  # signal number -> the handler before ours
_received = []  # (signal name, time.time(), the update the trainer was in) in arrival order


def _register(trainer):
    """``trainer`` stops on the signals from now on (Trainer.__init__, with --stop-on-signals)."""
    global _trained
    if not any(True for _ in _trainers):
        reset()  # a request that stopped an earlier training of this process is done with
    _trainers.add(trainer)
    _trained = True


def _handler(signum, frame):
    if not any(True for _ in _trainers):
        if not _received and not _trained:
            return _pass_on(signum, frame)  # no training in this process: the signal does what it did before
        # A process whose training is over -- it stopped on a request, or it ended and its Trainer is gone -- ignores
        # the stop signals: it saved and is ending, and a repeat (train-job.sh re-sends the warning until training
        # has stopped; Slurm's SIGTERM after the warning), or a time-limit warning that came after the last update,
        # must not kill it on its way out with the signal's status instead of its own (train-job.sh: "training is
        # complete, no requeue").
        return None
    if not _received:  # the first counts; more (Slurm sends SIGTERM to every process, srun forwards it) are noted
        updates = max((t.get_num_updates() for t in _trainers), default=0)
        _received.append((signal.Signals(signum).name, time.time(), updates))


def _pass_on(signum, frame):
    """What the signal did before the plugin took it: the previous Python handler, ignored, or the default action."""
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        return previous(signum, frame)
    if previous == signal.SIG_IGN:
        return None
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    signal.signal(signum, _handler)  # (reached only for signals whose default is to continue)
    return None


def _install_handlers(signals):
    if threading.current_thread() is not threading.main_thread():
        logger.warning("--stop-on-signals: the Trainer is built outside the main thread; no signal handlers "
                       "installed (training stops on a signal as fairseq does)")
        return
    if not _previous:
        atexit.register(_ignore_while_exiting)
    for sig in signals:
        current = signal.getsignal(sig)
        if current is not _handler:
            _previous[sig] = current
            signal.signal(sig, _handler)


def _ignore_while_exiting():
    """At exit, a process that trained ignores the stop signals from then on, as :func:`_handler` does once its
    training is over. Python drops its handlers when the interpreter finalizes, after the exit functions, and
    tearing torch and fairseq down takes a while: the WMT rehearsal's two-node job got its time-limit warning in
    that window, just after its last update, and ended with the signal's status (138, a FAILED job) instead of its
    own. A signal ignored is left ignored by the finalization."""
    if not _trained:
        return  # no training in this process: the signals do at exit what they did before
    for sig in _previous:
        if signal.getsignal(sig) is _handler:
            signal.signal(sig, signal.SIG_IGN)


def local_request():
    """This process's stop request: (signal name, time, update) or None."""
    return _received[0] if _received else None


def reset():
    """Forget a request (tests; a process that trains again after a stop)."""
    _received.clear()


# ---- the agreed flag ----------------------------------------------------------------------------------------------

class _AgreedFlag:
    """The all-reduced sum of every rank's flag from the last synced update, readable without a device sync."""

    def __init__(self):
        self.value = 0.0  # float, or a pinned CPU tensor on a GPU
        self.event = None

    def store(self, summed):
        import torch

        if torch.is_tensor(summed) and summed.device.type == "cuda":
            if not isinstance(self.value, torch.Tensor):
                self.value = torch.zeros((), dtype=summed.dtype, pin_memory=True)
                self.event = torch.cuda.Event()
            self.value.copy_(summed, non_blocking=True)
            self.event.record()
        else:
            self.value = float(summed)

    def read(self):
        if self.event is not None:
            self.event.synchronize()  # complete already: fairseq waited on the same all-reduce's result
            return float(self.value)
        return self.value


def _install_aggregation():
    from fairseq.trainer import Trainer

    def make(original):
        def _aggregate_logging_outputs(self, logging_outputs, *extra_stats_to_sum, ignore=False):
            flag = getattr(self, "_umst_agreed_stop", None)
            if flag is None:  # --stop-on-signals none, or a Trainer built before the plugin: fairseq's call
                return original(self, logging_outputs, *extra_stats_to_sum, ignore=ignore)
            mine = 1.0 if _received else 0.0
            logging_outputs, extra = original(self, logging_outputs, *extra_stats_to_sum, mine, ignore=ignore)
            flag.store(extra[-1])
            return logging_outputs, list(extra[:-1])
        return _aggregate_logging_outputs

    wrap(Trainer, "_aggregate_logging_outputs", make, __name__,
         "(self, logging_outputs: List[Dict[str, Any]], *extra_stats_to_sum, ignore=False)")


def agreed_request(trainer):
    """True when training stops at this update boundary: on every rank alike."""
    flag = getattr(trainer, "_umst_agreed_stop", None)
    if flag is None:
        return False
    if trainer.data_parallel_world_size > 1:
        return flag.read() > 0
    return bool(_received)


# ---- where training starts and where it stops -------------------------------------------------------------------

def _install_trainer():
    from fairseq.trainer import Trainer

    def make(original):
        def __init__(self, cfg, task, model, criterion, quantizer=None):
            original(self, cfg, task, model, criterion, quantizer)
            signals = parse_signals(getattr(cfg.common, "stop_on_signals", DEFAULT_SIGNALS))
            if signals:
                self._umst_agreed_stop = _AgreedFlag()
                _register(self)
                _install_handlers(signals)
        return __init__

    wrap(Trainer, "__init__", make, __name__,
         "(self, cfg: fairseq.dataclass.configs.FairseqConfig, task, model, criterion, quantizer=None)")


def _fairseq_saves(cfg, epoch_itr, num_updates, end_of_epoch):
    """Whether fairseq's validate_and_save writes checkpoints at this update anyway (end of an epoch at the save
    interval, or --save-interval-updates)."""
    ckpt = cfg.checkpoint
    return bool((end_of_epoch and epoch_itr.epoch % ckpt.save_interval == 0)
                or (ckpt.save_interval_updates > 0 and num_updates > 0
                    and num_updates % ckpt.save_interval_updates == 0
                    and num_updates >= cfg.dataset.validate_after_updates))


MARKER = "stopped-on-signal.json"


def _write_marker(save_dir, name, num_updates, epoch_itr):
    """SAVE_DIR/stopped-on-signal.json: what tells the job script that training stopped on the signal, not at
    its end (a run requeued after its last update would train one update more: fairseq resumes without checking
    --max-update first)."""
    import json

    with open(os.path.join(save_dir, MARKER), "w") as f:
        json.dump({"signal": name, "num_updates": num_updates, "epoch": epoch_itr.epoch,
                   "iterations_in_epoch": epoch_itr.iterations_in_epoch, "time": time.time()}, f)
        f.write("\n")


def _install_stop():
    import fairseq_cli.train as train_cli

    def make(original):
        def validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
            if not agreed_request(trainer):
                return original(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
            return _stop(original, cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
        return validate_and_save

    wrap(train_cli, "validate_and_save", make, __name__,
         "(cfg: omegaconf.dictconfig.DictConfig, trainer: fairseq.trainer.Trainer, "
         "task: fairseq.tasks.fairseq_task.FairseqTask, epoch_itr, valid_subsets: List[str], "
         "end_of_epoch: bool) -> Tuple[List[Optional[float]], bool]")


def _stop(validate_and_save, cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
    """fairseq's ``validate_and_save`` at the update boundary where every rank stops: what fairseq does at this
    update anyway (validation, an epoch checkpoint), ``checkpoint_last.pt`` saved mid-epoch, the marker, one
    line; returns (validation losses, stop)."""
    from fairseq import checkpoint_utils

    num_updates = trainer.get_num_updates()
    saves = _fairseq_saves(cfg, epoch_itr, num_updates, end_of_epoch)
    if end_of_epoch or saves:  # what fairseq does at this update (validation, epoch checkpoint) stays as it was
        valid_losses, stopped = validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
        saved = saves or stopped
    else:
        valid_losses, saved = [None], False
    # --no-save: fairseq saves nothing, so there is nothing to resume: no marker either (a job script that
    # found one would requeue a run that starts over)
    no_save = bool(getattr(cfg.checkpoint, "no_save", False))
    if not saved and not no_save:  # checkpoint_last.pt, mid-epoch: the iterator's position goes with it
        checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
    name, when, update = local_request() or ("a signal on another rank", time.time(), num_updates)
    if trainer.data_parallel_rank == 0 and not no_save:
        _write_marker(cfg.checkpoint.save_dir, name, num_updates, epoch_itr)
    where = (f"update {num_updates}, epoch {epoch_itr.epoch} ({epoch_itr.iterations_in_epoch} batches in)")
    logger.warning(f"Stopping training on {name} (received during update {update + 1}, {time.time() - when:.1f} s "
                   f"ago): " + (f"nothing saved at {where} (--no-save): the run cannot be resumed" if no_save else
                                f"checkpoint_last.pt saved at {where}; the same command resumes from it (a job of "
                                "scripts/slurm/train-*.sbatch requeues itself on the time limit's warning, and "
                                "Slurm requeues a preempted one)"))
    return valid_losses, True


def install():
    common_options.add_fields(__name__, _PreemptionFields)
    _install_trainer()
    _install_aggregation()
    _install_stop()
