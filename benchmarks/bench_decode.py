"""Decoding speed of every architecture against fairseq's transformer: fairseq-generate at beam 1 and 5, and the
kernel launches of one incremental decoding step.

What a user's BLEU costs is fairseq-generate. Per architecture, on the test split of a synthetic corpus with
Multi30k's sentence lengths (``benchmarks/synthetic_corpus.py``: 1,000 sentences, a 10,000-entry joined
vocabulary, gold dependency side files), under ``--task multiscale_translation``:

* **fairseq-generate** (``fairseq_cli.generate.main``) at each beam of ``--beams``, batches by ``--max-tokens``,
  ``--quiet``: sentences/s and milliseconds per sentence, against the transformer of the same run (Prime and
  Prime-simple also against the transformer of Prime's 12+12, d 384 shape). Every call runs in this one process
  (imports and CUDA set-up paid once; fairseq loads each checkpoint once, and a later call of the same checkpoint
  gets the loaded model). Each ``inference_step`` (one batch: encoder, beam search, decoder steps) is timed:
  on CUDA by the wall clock, synchronised; on a CPU by this process's CPU time, one thread by default (steadier
  on a shared machine). Before the first, one batch of the test split (the one of most sentences) is decoded
  untimed, so no clock counts a warm-up; the garbage collector does not run inside a timed batch.
  ``--repeats`` rounds interleave the archs and keep each one's fastest call. fairseq's own "sentences/s" (its
  wall-clock stopwatch around the same calls) is reported too, and each call's parts (loading, warm-up, the
  batches with fairseq's per-sentence output work between them, the rest).
* **Equal work whatever the weights.** The models are random-init checkpoints (built by the task, saved in
  fairseq's checkpoint format), which would stop at random lengths. ``--max-len-a 0 --max-len-b L --min-len L``
  forces every hypothesis to exactly L tokens + ``</s>``: fairseq's SequenceGenerator bans ``</s>`` while
  ``step < min_len`` and allows only ``</s>`` once ``step >= max_len`` (it asserts ``min_len <= max_len``), so
  with ``min_len == max_len == L`` every beam of every sentence runs L + 1 decoder steps (checked on every
  hypothesis). L defaults to 12, Multi30k's mean target length (12.2 tokens, ``multi30k_lengths.json``).
* **Kernel launches per decoding step** (``--launch-sentences`` 8 sentences x ``--launch-beam`` 5, the same
  models): one later incremental step as fairseq's ``EnsembleModel`` runs it -- ``reorder`` (the beam reorder of
  the incremental state and the encoder output) and ``decoder`` (the decoder on the last token and the output
  log-probabilities) -- counted with ``umst_dev.op_counts.KernelLaunches`` on the CPU (every aten op that
  launches a kernel, what a GPU would run); and ``generate``: a whole SequenceGenerator call (beam search
  included) per decoder step, the encoder excluded, counted on the run's device. With ``--device cuda`` the
  step is also counted there both ways: KernelLaunches (the ops CUDA dispatches) and the CUDA kernels
  torch.profiler sees (``benchmarks.common.cuda_profile``), with the step's wall time and GPU busy share
  (``--profile-generate``: the kernels of a whole generate call too).
* **Prime-simple's claim.** The Prime paper (table 3) reports Prime-simple decoding 173 tokens/s against the
  transformer's 132 (+31%, GPU, batch size 1, beam 5, 6+6 layers d 512; the authors' speed command: FFN 1024,
  4 heads, against ``transformer_iwslt_de_en``). The first ``--claim-sentences`` test sentences are decoded that
  way (``--batch-size 1 --beam 5``) by those two models (``benchmarks/paper/prime.py``'s ``DECODE_CLAIM``),
  reported as measured.

Target (issue 57): every arch's time per sentence at most 1.25x the transformer's; Prime's and Prime-simple's
against the transformer of their own shape.

    python -m benchmarks decode --quick                     # tiny widths, few sentences: a smoke run
    python -m benchmarks decode --device cuda --json out.json
    python -m benchmarks decode --sentences 64 --claim-sentences 8 --repeats 2   # base width on a CPU
"""
import argparse
import collections
import contextlib
import gc
import logging
import os
import re
import shutil
import statistics
import tempfile
import time
import warnings

import torch

from benchmarks import common, harness, synthetic_corpus

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PLUGIN = os.path.join(ROOT, "umst_plugin")
SRC, TGT = synthetic_corpus.SRC, synthetic_corpus.TGT
BASELINE = "transformer"
TARGET = 1.25  # time per sentence against the baseline (issue 57)
# not in the default rows: UMST-RPR decodes as UMST does but for its relative positions
LEFT_OUT_BY_DEFAULT = ("umst_rpr",)


def rows():
    """The rows it can decode (the arch table's, at base width: the same models as the training benchmark):
    name -> (arch, overrides)."""
    return {name: harness.model_overrides(name) for name in harness.table()}


def default_rows():
    """The transformer, every family's measured row, and the transformers of a family's shape."""
    shapes = harness.shape_baselines()
    return [n for n in harness.measured_rows() if n not in LEFT_OUT_BY_DEFAULT] + list(dict.fromkeys(shapes.values()))


def shape_baselines():
    """row -> the transformer of its own shape (``BenchRow.shape_baseline``)."""
    return harness.shape_baselines()


def label_of(name):
    """A row's label: the transformer's says pre-norm, a transformer of a family's shape says whose and which."""
    if name == BASELINE:
        return "transformer (pre-norm)"
    from umst_plugin import families

    owner = next((f for f in families.all_families() if name in f.bench_rows), None)
    if owner is not None and harness.row(name).baseline_only:
        o = harness.row(name).overrides
        return (f"transformer, {owner.title}'s shape {o['encoder_layers']}+{o['decoder_layers']} "
                f"d{o['encoder_embed_dim']}")
    return None


def claim_spec():
    """The paper's decoding claim this benchmark measures (``benchmarks/paper``: a table's ``DECODE_CLAIM``)."""
    from benchmarks import paper

    return paper.decode_claim()


def claim_rows():
    """The claim's pair as the authors' speed command builds it: name -> (arch, overrides)."""
    spec = claim_spec()
    return dict(spec["rows"]) if spec else {}


def row_model(name, quick):
    """(arch, overrides) of a row at base width, or tiny widths with ``quick`` (harness.quick_overrides)."""
    if name in harness.table():
        arch, overrides = harness.model_overrides(name)
    else:
        arch, overrides = claim_rows()[name]
    overrides = dict(overrides, share_all_embeddings=True)
    if quick:
        overrides.update(harness.quick_overrides(name) if name in harness.table() else harness.QUICK)
    return arch, overrides


def default_length(path=synthetic_corpus.LENGTHS):
    pairs = synthetic_corpus.read_length_pairs(path)
    return round(statistics.mean(t for _, t in pairs))


# ---- random-init checkpoints ---------------------------------------------------------------------------------

def random_checkpoint(databin, arch, overrides, path, seed=1):
    """Build ``arch`` with the task on ``databin`` (fresh weights, ``seed``) and save it as fairseq's trainer
    does (cfg, model, optimizer history): fairseq-generate ``--path`` loads it. Returns (model, task)."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from umst_dev import dev

    cfg = convert_namespace_to_omegaconf(dev.parse_args(arch, dict(overrides, source_lang=SRC, target_lang=TGT),
                                                        data=databin))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    history = dict(criterion_name="LabelSmoothedCrossEntropyCriterion", optimizer_name="FairseqAdam",
                   lr_scheduler_state={"best": None}, num_updates=0)
    torch.save(dict(cfg=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), args=None,
                    model=model.state_dict(), optimizer_history=[history], last_optimizer_state=None,
                    extra_state={"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True}},
                    criterion=None, task_state={}), path)
    return model, task


# ---- fairseq-generate, timed ---------------------------------------------------------------------------------

TRANSLATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s, "
                        r"([\d.]+) tokens/s\)")


def generate_argv(databin, checkpoint, beam, length, cuda, max_tokens=None, batch_size=None, fp16=False):
    argv = [databin, "--user-dir", PLUGIN, "--task", "multiscale_translation", "--source-lang", SRC,
            "--target-lang", TGT, "--path", checkpoint, "--gen-subset", "test", "--beam", str(beam), "--nbest", "1",
            "--max-len-a", "0", "--max-len-b", str(length), "--min-len", str(length), "--quiet",
            "--num-workers", "0", "--seed", "1", "--no-progress-bar", "--log-format", "simple"]
    argv += ["--batch-size", str(batch_size)] if batch_size else ["--max-tokens", str(max_tokens)]
    if not cuda:
        argv.append("--cpu")
    if fp16:
        argv.append("--fp16")
    return argv


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def sync(cuda):
    if cuda:
        torch.cuda.synchronize()


# argparse dest -> where generate's config keeps it: the fields that differ between this benchmark's calls
_CFG_FIELDS = {"path": ("common_eval", "path"), "beam": ("generation", "beam"), "data": ("task", "data"),
               "max_tokens": ("dataset", "max_tokens"), "max_tokens_valid": ("dataset", "max_tokens_valid"),
               "batch_size": ("dataset", "batch_size"), "batch_size_valid": ("dataset", "batch_size_valid"),
               "max_len_b": ("generation", "max_len_b"), "min_len": ("generation", "min_len")}


class GenerateConfigs:
    """fairseq-generate's (args, config) of a command line. fairseq composes a config with hydra (about a second
    a call here); after the first, a command line that differs from it only in :data:`_CFG_FIELDS` gets a copy
    of the first's config with those fields set."""

    def __init__(self):
        self.base = None

    def __call__(self, argv):
        import copy

        from fairseq import options
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        args = options.parse_args_and_arch(options.get_generation_parser(), input_args=argv)
        if self.base is not None:
            base_args, base_cfg = self.base
            keys = set(vars(args)) | set(vars(base_args))
            diff = {k for k in keys if getattr(args, k, None) != getattr(base_args, k, None)}
            if diff <= set(_CFG_FIELDS):
                cfg = copy.deepcopy(base_cfg)
                for k in diff:
                    section, field = _CFG_FIELDS[k]
                    setattr(cfg[section], field, getattr(args, k))
                return args, cfg
        cfg = convert_namespace_to_omegaconf(args)
        self.base = (args, copy.deepcopy(cfg))
        return args, cfg


def clock(cuda):
    """The wall clock on CUDA; on a CPU this process's CPU time (steadier on a shared machine: with one thread,
    the work done, whatever else runs there)."""
    return time.perf_counter() if cuda else time.process_time()


def _reuse_models(task, models):
    """What the task's ``build_model`` does besides building, for models built by an earlier call: register the
    host-side batch hints they ask for (``MultiscaleTranslationTask.build_model``, TranSFormer's sizes)."""
    hints = getattr(task, "batch_hints", None)
    for model in models:
        hint = getattr(model, "host_batch_hint", None)
        if hints is not None and callable(hint):
            hints.register(type(model).__name__, hint())


def run_generate(argv, length, cuda, warmup=1, configs=None, loaded=None):
    """fairseq_cli.generate.main on ``argv`` in this process, every ``inference_step`` timed (after ``warmup``
    untimed batches, the test split's batch of most sentences). ``loaded``: a dict that keeps the models fairseq
    loaded, by checkpoint path; a later call with the same ``--path`` gets them instead of building and loading
    them again (the same weights; about a second a call). Returns the measurements, and the seconds spent in
    each part of the call (``parts_s``: loading, warm-up, the timed batches, the rest)."""
    from fairseq import checkpoint_utils, tasks, utils
    from fairseq_cli import generate

    args, cfg = (configs or GenerateConfigs())(argv)
    batches, hyp_lengths, marks = [], set(), {}
    original_setup, original_load = tasks.setup_task, checkpoint_utils.load_model_ensemble

    def load_model_ensemble(filenames, arg_overrides=None, task=None, **kwargs):
        key = tuple(filenames)
        if loaded is None or key not in loaded:
            models, saved_cfg = original_load(filenames, arg_overrides=arg_overrides, task=task, **kwargs)
            if loaded is not None:
                loaded[key] = models, saved_cfg
            return models, saved_cfg
        _reuse_models(task, loaded[key][0])
        return loaded[key]

    def setup_task(cfg, **kwargs):
        task = original_setup(cfg, **kwargs)
        build, step = task.build_generator, task.inference_step

        def build_generator(models, gen_cfg, **kw):
            marks["loaded"] = time.perf_counter()
            generator = build(models, gen_cfg, **kw)
            dataset = task.dataset(args.gen_subset)
            order = dataset.ordered_indices()
            groups = dataset.batch_by_size(order, max_tokens=args.max_tokens, max_sentences=args.batch_size)
            biggest = max(groups, key=len)
            sample = dataset.collater([dataset[int(i)] for i in biggest])
            if cuda:
                sample = utils.move_to_cuda(sample)
            for _ in range(warmup):
                step(generator, models, sample)
            sync(cuda)
            marks["warm"] = time.perf_counter()
            return generator

        def inference_step(generator, models, sample, **kw):
            gc.disable()  # no collector pauses inside the timed batch (it collects between batches)
            try:
                sync(cuda)
                start = clock(cuda)
                hypos = step(generator, models, sample, **kw)
                sync(cuda)
                batches.append((len(hypos), clock(cuda) - start))
            finally:
                gc.enable()
            marks["decoded"] = time.perf_counter()
            hyp_lengths.update(len(h[0]["tokens"]) for h in hypos)
            return hypos

        task.build_generator, task.inference_step = build_generator, inference_step
        return task

    log = logging.getLogger("fairseq_cli.generate")
    capture = _Capture()
    saved = log.level, log.propagate
    log.addHandler(capture)
    log.setLevel(logging.INFO)
    log.propagate = False  # its INFO lines to the capture alone
    tasks.setup_task, checkpoint_utils.load_model_ensemble = setup_task, load_model_ensemble
    start = time.perf_counter()
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # the BLEU of random output
            generate.main(cfg)
    finally:
        tasks.setup_task, checkpoint_utils.load_model_ensemble = original_setup, original_load
        log.removeHandler(capture)
        log.setLevel(saved[0])
        log.propagate = saved[1]
    end = time.perf_counter()
    if hyp_lengths != {length + 1}:
        raise RuntimeError(f"hypotheses of {sorted(hyp_lengths)} tokens, expected {length + 1} (L + </s>) each")
    sentences = sum(n for n, _ in batches)
    seconds = sum(s for _, s in batches)
    out = dict(sentences=sentences, batches=len(batches), seconds=seconds, sentences_per_s=sentences / seconds,
               ms_per_sentence=1000 * seconds / sentences, tokens_per_s=sentences * (length + 1) / seconds,
               wall_s=end - start, parts_s=dict(load=marks["loaded"] - start, warmup=marks["warm"] - marks["loaded"],
                                                batches=marks["decoded"] - marks["warm"], rest=end - marks["decoded"]))
    for message in capture.messages:
        m = TRANSLATED.search(message)
        if m:
            out["fairseq_sentences_per_s"] = float(m.group(4))
            out["fairseq_tokens_per_s"] = float(m.group(5))
    return out


# ---- kernel launches per decoding step -----------------------------------------------------------------------

@contextlib.contextmanager
def _phase(counter, name):
    """Count what runs inside as ``name`` (KernelLaunches) and mark it for the profiler (``phase:<name>``)."""
    with (counter.in_phase(name) if counter is not None else contextlib.nullcontext()), \
            torch.profiler.record_function(common.PHASE_PREFIX + name):
        yield


class IncrementalDecoder:
    """Drive fairseq's EnsembleModel as SequenceGenerator does: the encoder once (its output repeated per beam),
    then decoding steps, each a beam reorder of the incremental state and the encoder output, and the decoder on
    the prefix (its last token) with the output log-probabilities."""

    def __init__(self, model, task, sample, beam):
        from fairseq.sequence_generator import EnsembleModel

        self.ensemble = EnsembleModel([model]).eval()
        self.ensemble.set_decoder_beam_size(beam)  # as SequenceGenerator does (Prime keeps cross keys per sentence)
        self.bsz = sample["net_input"]["src_tokens"].size(0)
        self.beam = beam
        device = sample["net_input"]["src_tokens"].device
        net_input = task._strip_side_inputs(sample, [model])["net_input"] if hasattr(task, "_strip_side_inputs") \
            else sample["net_input"]
        with torch.no_grad():
            order = torch.arange(self.bsz, device=device).repeat_interleave(beam)
            self.encoder_outs = self.ensemble.reorder_encoder_out(self.ensemble.forward_encoder(net_input), order)
        self.states = [{}]
        self.tokens = torch.full((self.bsz * beam, 1), model.decoder.dictionary.eos(), dtype=torch.long,
                                 device=device)
        # a beam reorder: each sentence's hypotheses in reverse order
        self.reorder = torch.arange(self.bsz * beam, device=device).view(self.bsz, beam).flip(1).reshape(-1)
        self.next_token = torch.full((self.bsz * beam, 1), model.decoder.dictionary.nspecial + 1, dtype=torch.long,
                                     device=device)
        self.steps = 0

    @torch.no_grad()
    def step(self, counter=None):
        """One decoding step (reorder, decoder); then the next token is appended (the search's work, uncounted)."""
        if self.steps:
            with _phase(counter, "reorder"):
                self.ensemble.reorder_incremental_state(self.states, self.reorder)
                self.encoder_outs = self.ensemble.reorder_encoder_out(self.encoder_outs, self.reorder)
        with _phase(counter, "decoder"):
            lprobs, _ = self.ensemble.forward_decoder(self.tokens, self.encoder_outs, self.states, 1.0)
        with _phase(None, "search"):
            self.tokens = torch.cat([self.tokens, self.next_token], dim=1)
        self.steps += 1
        return lprobs


def step_launches(model, task, sample, beam, warm_steps=2):
    """KernelLaunches of one later decoding step by phase (reorder, decoder), after the first and ``warm_steps``."""
    from umst_dev.op_counts import KernelLaunches

    decoder = IncrementalDecoder(model, task, sample, beam)
    for _ in range(1 + warm_steps):
        decoder.step()
    with KernelLaunches() as counter:
        decoder.step(counter)
    reorder, decode = counter.by_phase.get("reorder", 0), counter.by_phase.get("decoder", 0)
    return dict(reorder=reorder, decoder=decode, total=reorder + decode,
                top_ops={p: counter.top_ops(p, 8) for p in ("reorder", "decoder")})


@contextlib.contextmanager
def encoder_phase(model, counter=None):
    """Attribute the encoder's work to phase ``encoder`` (KernelLaunches and the profiler): SequenceGenerator runs
    it through ``encoder.forward_torchscript`` (which calls ``forward`` directly: no module hooks fire)."""
    encoder = model.encoder
    inner = encoder.forward_torchscript

    def forward_torchscript(net_input):
        with _phase(counter, "encoder"):
            return inner(net_input)

    encoder.forward_torchscript = forward_torchscript
    try:
        yield
    finally:
        del encoder.forward_torchscript


def generator_for(model, task, beam, length):
    from fairseq.sequence_generator import SequenceGenerator

    return SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=length,
                             min_len=length)


def generate_launches(model, task, sample, beam, length):
    """KernelLaunches of one SequenceGenerator call (beam search included) over ``sample``: per decoder step
    (``length`` + 1 steps), the encoder excluded, and the encoder's."""
    from umst_dev.op_counts import KernelLaunches

    generator = generator_for(model, task, beam, length)
    with torch.no_grad():
        task.inference_step(generator, [model], sample)  # warm
        counter = KernelLaunches()
        with encoder_phase(model, counter), counter:
            task.inference_step(generator, [model], sample)
    encoder = counter.by_phase.get("encoder", 0)
    return dict(per_step=(counter.total - encoder) / (length + 1), encoder=encoder, total=counter.total)


def cuda_counts(model, task, sample, beam, length, profile_generate=False):
    """On CUDA: one later decoding step as KernelLaunches counts it there (the ops CUDA dispatches) and as the
    profiler sees the GPU's kernels, with the step's wall time and GPU busy share (``common.cuda_profile``);
    with ``profile_generate`` also the kernels of a whole generate call per decoder step."""
    decoder = IncrementalDecoder(model, task, sample, beam)
    for _ in range(3):
        decoder.step()
    counted = step_launches(model, task, sample, beam)
    profile = common.cuda_profile(decoder.step, repeats=5)
    by_phase = profile["kernels_by_phase"]
    out = dict(step_dispatch=dict(reorder=counted["reorder"], decoder=counted["decoder"], total=counted["total"]),
               step_kernels=dict(reorder=by_phase.get("reorder", 0), decoder=by_phase.get("decoder", 0),
                                 total=by_phase.get("reorder", 0) + by_phase.get("decoder", 0),
                                 search=by_phase.get("search", 0)),
               step_wall_ms=profile["wall_ms"], step_busy=profile["busy"])
    if profile_generate:
        generator = generator_for(model, task, beam, length)

        def generate_call():
            with torch.no_grad(), encoder_phase(model):
                task.inference_step(generator, [model], sample)
        generate_call()
        whole = common.cuda_profile(generate_call, repeats=2)
        encoder = whole["kernels_by_phase"].get("encoder", 0)
        out.update(generate_kernels=dict(per_step=(whole["kernels"] - encoder) / (length + 1), encoder=encoder,
                                         total=whole["kernels"]),
                   generate_wall_ms=whole["wall_ms"], generate_busy=whole["busy"])
    return out


def launch_counts(model, task, beam, sentences, length, device, profile_generate=False):
    """The launch counts of one model: a decoding step on the CPU (a copy there if the model is on CUDA), a whole
    generate call on the model's device; on CUDA the step there too (:func:`cuda_counts`)."""
    from umst_dev import dev

    sample = dev.random_sample(task, sentences, 12, 12, seed=1)  # as bench_op_counts.py: 8 x <= 12 subwords
    model = model.eval()
    on_cuda = str(device).startswith("cuda")
    cpu_model = model
    if on_cuda:
        import copy

        cpu_model = copy.deepcopy(model).float().cpu()
    out = dict(step=step_launches(cpu_model, task, sample, beam))
    del cpu_model
    device_sample = dev.move_sample(sample, device)
    out["generate"] = dict(generate_launches(model, task, device_sample, beam, length), device=str(device))
    if on_cuda:
        out["cuda"] = cuda_counts(model, task, device_sample, beam, length, profile_generate)
    return out


# ---- the run -------------------------------------------------------------------------------------------------

def ratios(rows, beams):
    """Per row and beam: time per sentence against the transformer (and against the transformer of the row's own
    shape), the target check."""
    by_name = {r["name"]: r for r in rows}
    shapes = shape_baselines()
    for r in rows:
        r["vs"] = {}
        for beam in beams:
            key = str(beam)
            if key not in r.get("generate", {}):
                continue
            entry = {}
            for label, base in (("transformer", BASELINE), ("shape", shapes.get(r["name"]))):
                if base and base in by_name and key in by_name[base].get("generate", {}):
                    entry[label] = r["generate"][key]["ms_per_sentence"] / by_name[base]["generate"][key][
                        "ms_per_sentence"]
            compare = entry.get("shape", entry.get("transformer"))
            if r["name"] not in {BASELINE, *shapes.values()} and compare is not None:
                entry["target_met"] = compare <= TARGET
            r["vs"][key] = entry
        if "launches" in r and BASELINE in by_name and "launches" in by_name[BASELINE]:
            base = by_name[BASELINE]["launches"]
            r["launches"]["step_vs_transformer"] = r["launches"]["step"]["total"] / base["step"]["total"]
    return rows


def claim(result):
    rows = {r["name"]: r for r in result.get("claim_rows", [])}
    if len(rows) < 2:
        return None
    return claim_spec()["summary"](rows)


def git_state():
    """The checkout measured: commit, and the files of the plugin and benchmarks changed since it."""
    import subprocess

    def git(*argv):
        proc = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return proc.stdout if proc.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "umst_plugin", "benchmarks")
    return dict(commit=git("rev-parse", "--short", "HEAD").strip() or None,
                changed=[line[3:] for line in changed.splitlines() if line.strip()])


def build_rows(args, databin, ckpt_dir, log):
    """Every row's random-init checkpoint (and with ``args.launches`` its launch counts): (rows, checkpoints)."""
    cuda = args.device.startswith("cuda")
    rows, checkpoints = [], {}
    for name in args.archs + (list(claim_rows()) if args.claim_sentences else []):
        arch, overrides = row_model(name, args.quick)
        checkpoints[name] = os.path.join(ckpt_dir, f"{name}.pt")
        model, task = random_checkpoint(databin, arch, overrides, checkpoints[name])
        row = dict(name=name, arch=arch, label=label_of(name) or arch, params=common.n_params(model))
        if name in args.archs and args.launches:
            t = time.time()
            model = model.to(args.device)
            if cuda and args.fp16:
                model = model.half()
            row["launches"] = launch_counts(model, task, args.launch_beam, args.launch_sentences, args.length,
                                            args.device, args.profile_generate)
            step = row["launches"]["step"]
            log(f"  {name}: {row['params'] / 1e6:.1f}M parameters; launches per decoding step {step['total']} "
                f"(reorder {step['reorder']}, decoder {step['decoder']}), per generate step "
                f"{row['launches']['generate']['per_step']:.1f} ({time.time() - t:.1f} s)")
        rows.append(row)
    return rows, checkpoints


def time_rows(args, rows, checkpoints, databin, claim_data, log):
    """fairseq-generate of every row at every beam, then the claim's pair at batch size 1, beam 5: ``args.repeats``
    rounds, the archs interleaved within each beam (and the pair within the claim), the fastest call kept."""
    cuda = args.device.startswith("cuda")
    configs, loaded = GenerateConfigs(), {}
    by_name = {r["name"]: r for r in rows}
    groups = [[(name, str(beam), generate_argv(databin, checkpoints[name], beam, args.length, cuda,
                                               max_tokens=args.max_tokens, fp16=args.fp16)) for name in args.archs]
              for beam in args.beams]
    if args.claim_sentences:
        groups.append([(name, "claim", generate_argv(claim_data, checkpoints[name], 5, args.length, cuda,
                                                     batch_size=1, fp16=args.fp16)) for name in claim_rows()])
    for group in groups:
        runs = collections.defaultdict(list)
        for _ in range(args.repeats):
            for name, key, argv in group:
                m = run_generate(argv, args.length, cuda, configs=configs, loaded=loaded)
                runs[name, key].append(m)
                fairseq_rate = m.get("fairseq_sentences_per_s", float("nan"))
                log(f"  {'beam ' + key if key != 'claim' else 'claim (batch size 1, beam 5)'} {name}: "
                    f"{m['sentences']} sentences in {m['batches']} batches, {m['ms_per_sentence']:.2f} ms/sentence, "
                    f"{m['sentences_per_s']:.1f} sentences/s (fairseq: {fairseq_rate:.1f}), wall {m['wall_s']:.1f} s")
        for (name, key), ms in runs.items():
            best = dict(min(ms, key=lambda m: m["seconds"]))
            if len(ms) > 1:
                best["repeats_ms_per_sentence"] = [m["ms_per_sentence"] for m in ms]
            if key == "claim":
                by_name[name]["generate"] = best
            else:
                by_name[name].setdefault("generate", {})[key] = best


def measure(args, log=print):
    cuda = args.device.startswith("cuda")
    result = dict(device=common.device_name(args.device), device_type="cuda" if cuda else "cpu",
                  torch=torch.__version__, threads=None if cuda else torch.get_num_threads(), quick=args.quick,
                  beams=args.beams, max_tokens=args.max_tokens, length=args.length, fp16=args.fp16,
                  launch_sentences=args.launch_sentences, launch_beam=args.launch_beam, git=git_state(),
                  clock="wall (CUDA-synchronised)" if cuda else "process CPU time")
    start = time.time()
    work = args.work or tempfile.mkdtemp(prefix="bench-decode-")
    try:
        databin = args.data
        if not databin:
            t = time.time()
            databin = synthetic_corpus.build(os.path.join(work, "corpus"), dict(train=0, valid=0, test=args.sentences),
                                             workers=args.workers)
            log(f"synthetic corpus: {args.sentences} test sentences of Multi30k lengths in {time.time() - t:.1f} s")
        result["data"] = databin
        os.makedirs(os.path.join(work, "checkpoints"), exist_ok=True)
        rows, checkpoints = build_rows(args, databin, os.path.join(work, "checkpoints"), log)
        claim_data = databin
        if args.timing and args.claim_sentences and (args.claim_sentences < args.sentences or args.data):
            # the first sentences of the same test split, binarized with the same dictionary
            claim_data = synthetic_corpus.build(os.path.join(work, "claim-corpus"),
                                                dict(train=0, valid=0, test=args.claim_sentences),
                                                dictionary=os.path.join(databin, f"dict.{SRC}.txt"))
        if args.timing:
            gc.collect()
            gc.freeze()  # what exists now (fairseq, hydra, the models) is never scanned by the collector again
            time_rows(args, rows, checkpoints, databin, claim_data, log)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    result["rows"] = [r for r in rows if r["name"] in args.archs]
    result["claim_rows"] = [r for r in rows if r["name"] not in args.archs]
    ratios(result["rows"], args.beams)
    result["claim"] = claim(result)
    result["seconds"] = round(time.time() - start, 1)
    return result


def markdown(result):
    beams = result["beams"]
    lines = []
    timed = [r for r in result["rows"] if "generate" in r]
    if timed:
        head = ["arch", "params"]
        for b in beams:
            head += [f"beam {b} ms/sent", "sent/s", "fairseq sent/s", "x transformer", "x own shape"]
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for r in timed:
            cells = [r["label"], f"{r['params'] / 1e6:.1f}M"]
            for b in beams:
                g, v = r["generate"].get(str(b)), r["vs"].get(str(b), {})
                if g is None:
                    cells += ["-"] * 5
                    continue
                mark = "" if "target_met" not in v else (" ok" if v["target_met"] else " **over**")
                shape = f"{v['shape']:.2f}" if "shape" in v else ""
                cells += [f"{g['ms_per_sentence']:.2f}", f"{g['sentences_per_s']:.1f}",
                          f"{g.get('fairseq_sentences_per_s', float('nan')):.1f}",
                          f"{v.get('transformer', float('nan')):.2f}" + ("" if "shape" in v else mark),
                          shape + (mark if "shape" in v else "")]
            lines.append("| " + " | ".join(cells) + " |")
    counted = [r for r in result["rows"] if "launches" in r]
    if counted:
        cuda = any("cuda" in r["launches"] for r in counted)
        head = ["arch", "step: reorder", "decoder", "total", "x transformer", "generate per step", "encoder"]
        if cuda:
            head += ["CUDA: step dispatch", "step kernels", "step ms", "GPU busy"]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for r in counted:
            s, g = r["launches"]["step"], r["launches"]["generate"]
            cells = [r["label"], str(s["reorder"]), str(s["decoder"]), str(s["total"]),
                     f"{r['launches'].get('step_vs_transformer', float('nan')):.2f}", f"{g['per_step']:.1f}",
                     str(g["encoder"])]
            if cuda:
                c = r["launches"].get("cuda")
                cells += [str(c["step_dispatch"]["total"]), str(c["step_kernels"]["total"]), f"{c['step_wall_ms']:.2f}",
                          f"{c['step_busy']:.2f}"] if c else ["-"] * 4
            lines.append("| " + " | ".join(cells) + " |")
    c = result.get("claim")
    if c:
        lines += ["", claim_spec()["line"](c)]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--archs", default=None, help="comma-separated rows (the transformer and, for a family's rows, "
                   "the transformer of its shape are always added; default: every family's measured row)")
    p.add_argument("--beams", default="1,5", help="comma-separated beam sizes (default 1,5)")
    p.add_argument("--max-tokens", type=int, default=None, help="fairseq-generate batches (default 4096 CUDA, "
                   "1024 CPU)")
    p.add_argument("--sentences", type=int, default=None, help="test sentences (default 1000: Multi30k's test "
                   "lengths; --quick 24)")
    p.add_argument("--length", type=int, default=None, help="forced hypothesis length L in tokens (default: "
                   "Multi30k's mean target length, 12)")
    p.add_argument("--claim-sentences", type=int, default=None, help="sentences for a paper's batch-size-1 "
                   "decoding claim (a DECODE_CLAIM of benchmarks/paper; default 50; --quick 4; 0 skips)")
    p.add_argument("--repeats", type=int, default=1, help="fairseq-generate calls per arch and beam (the fastest "
                   "is kept; default 1)")
    p.add_argument("--launch-sentences", type=int, default=8)
    p.add_argument("--launch-beam", type=int, default=5)
    p.add_argument("--no-launches", dest="launches", action="store_false", help="skip the launch counts")
    p.add_argument("--profile-generate", action="store_true", help="on CUDA also profile a whole generate call "
                   "of the launch sample (kernels per decoder step; a few seconds an arch)")
    p.add_argument("--no-timing", dest="timing", action="store_false", help="skip fairseq-generate")
    p.add_argument("--fp16", action="store_true", help="fairseq-generate --fp16 (CUDA)")
    p.add_argument("--data", default=None, help="a data-bin written by synthetic_corpus.py to decode (its test "
                   "split) instead of a new one")
    p.add_argument("--work", default=None, help="keep the corpus and checkpoints here (default: a temporary folder)")
    p.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers for the corpus")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on a CPU: its times are "
                   "this process's CPU time)")
    p.add_argument("--quick", action="store_true", help="tiny widths, few sentences: a smoke run")
    p.add_argument("--json", default=None, help="write the measurements here")
    p.add_argument("--markdown", default=None, help="write the tables here")
    p.add_argument("--dry-run", action="store_true", help="check the arguments, measure nothing")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    known, shapes = rows(), shape_baselines()
    asked = [n for n in (args.archs if args.archs is not None else ",".join(default_rows())).split(",") if n]
    unknown = [n for n in asked if n not in known]
    if unknown:
        p.error(f"unknown arch(s) {unknown}; choices: {', '.join(known)}")
    baselines = [BASELINE] + sorted({shapes[n] for n in asked if n in shapes})
    args.archs = baselines + [n for n in asked if n not in baselines]
    try:
        args.beams = [int(b) for b in args.beams.split(",") if b]
    except ValueError:
        p.error(f"--beams {args.beams!r}: expected comma-separated integers")
    args.max_tokens = args.max_tokens or (4096 if cuda else 1024)
    args.sentences = args.sentences or (24 if args.quick else 1000)
    args.length = args.length or default_length()
    if args.claim_sentences is None:
        args.claim_sentences = 4 if args.quick else 50
    if not args.timing:  # the claim is a timing: nothing to measure without fairseq-generate
        args.claim_sentences = 0
    if cuda and not torch.cuda.is_available() and not args.dry_run:
        p.error("--device cuda: no CUDA device")
    if args.fp16 and not cuda:
        p.error("--fp16 decodes on CUDA only")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        print(f"bench_decode: would decode {args.sentences} sentences with {args.archs} at beams {args.beams}, "
              f"{args.max_tokens} max tokens, L = {args.length}, on {args.device}"
              + (f"; claim: {args.claim_sentences} sentences" if args.claim_sentences else ""))
        return 0
    if args.threads or not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads or 1)
    warnings.filterwarnings("ignore")
    import umst_plugin  # noqa: F401  (the archs; fairseq's modules import here, their loggers set below)
    import fairseq_cli.preprocess  # noqa: F401  (configures the root logger at import)

    logging.getLogger().setLevel(logging.WARNING)  # fairseq's INFO chatter
    result = measure(args)
    table = markdown(result)
    print(f"\n{result['device']}, torch {result['torch']}, {'quick widths' if args.quick else 'base width'}, "
          f"L = {args.length}, {args.max_tokens} max tokens, {result['seconds']} s\n\n{table}")
    common.write_results(result, table, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
