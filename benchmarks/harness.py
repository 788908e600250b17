"""The benchmarks' one arch table, one model builder and one batch of a length distribution.

**The table.** A row is a name and a :class:`umst_plugin.families.BenchRow`: the registered arch at base and big
width and the model arguments on top (dicts of fairseq ``args`` names). The transformer rows are the harness's own
(:data:`TRANSFORMER_ROWS`: the transformer is not a family); every other row is registered by its family
(``umst_plugin/families.py``), so that a sixth encoder shows in every benchmark by its one registration. Order:
the transformer rows, then UMST's (the project's subject), then the other families in the registry's order.

What each benchmark measures differently from another (a smoke run's depth, a floor in fairseq's post-norm) is an
override in that benchmark, with its reason there; command-line benchmarks (fairseq-train) take the same dicts
through :func:`overrides_to_argv`.

Reading the table imports the plugin (the families register on import) except for the transformer rows: a process
that must stay stock fairseq (``launches``' and ``train``'s stock rows) asks for those only. A process without
fairseq (the speed table's parent, before it installs from a wheelhouse) reads it from a child:
:func:`table_from_child`.
"""
import json
import os
import random
import subprocess
import sys
from types import SimpleNamespace

from umst_dev.argv import overrides_to_argv  # noqa: F401  (the harness's one helper: dict overrides -> CLI flags)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LENGTHS = os.path.join(HERE, "multi30k_lengths.json")
VOCAB = 10000
PRENORM = dict(encoder_normalize_before=True, decoder_normalize_before=True)
# Each arch is compared with the pre-norm transformer at the same attention and activation dropout (its paper's): a
# dropout on the attention weights has no fused kernel on a CPU, so there torch keeps the weights for backward and
# runs the math in fp32 (also in fairseq's MultiheadAttention of every decoder); comparing with a transformer
# without it would charge that CPU artefact to the arch (on a GPU the fused kernels take the dropout).
DROPOUT_01 = dict(attention_dropout=0.1, activation_dropout=0.1)
BIG_TRANSFORMER = "transformer_vaswani_wmt_en_de_big"
# name -> BenchRow's fields: the transformer rows the harness owns ("transformer" first: every ratio's baseline)
TRANSFORMER_ROWS = {
    "transformer": dict(base="transformer", big=BIG_TRANSFORMER, overrides=PRENORM),
    "transformer_dropout": dict(base="transformer", big=BIG_TRANSFORMER, overrides=dict(PRENORM, **DROPOUT_01),
                                label=" (dropout 0.1)", baseline_only=True),
}
FIRST_FAMILY = "umst"  # the project's subject: its rows right after the transformer's
# a smoke run's sizes (--quick): 2+2 layers at width 32, on top of which a row's own ``quick`` (a family's sizes)
QUICK = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
             encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
             decoder_attention_heads=4)
POOL_BATCHES = 9  # lengths_batch draws sentences for at least this many batches and takes the middle one


def _row(fields):
    """A BenchRow of ``fields`` (a plain namespace where the plugin must not be imported: the stock process)."""
    defaults = dict(overrides={}, big_overrides={}, quick={}, baseline="transformer", shape_baseline=None, label="",
                    baseline_only=False, extra=False, recipes=())
    return SimpleNamespace(**dict(defaults, **fields))


def transformer_rows():
    """The harness's own rows (no import of the plugin)."""
    return {name: _row(fields) for name, fields in TRANSFORMER_ROWS.items()}


def table():
    """name -> row: the transformer rows, then every family's (:mod:`umst_plugin.families`), UMST's first."""
    from umst_plugin import families

    registered = families.bench_rows()
    first = {n: r for f in families.all_families() if f.name == FIRST_FAMILY for n, r in f.bench_rows.items()}
    rows = transformer_rows()
    rows.update(first)
    rows.update((n, r) for n, r in registered.items() if n not in first)
    return rows


def row(name):
    """One row by name (the transformer rows without importing the plugin); a KeyError naming the choices."""
    rows = transformer_rows() if name in TRANSFORMER_ROWS else table()
    if name not in rows:
        raise KeyError(f"no benchmark row {name!r}; choices: {', '.join(table())}")
    return rows[name]


def measured_rows(rows=None):
    """The rows a benchmark measures by default: every family's arch rows and the transformer; not a row that is
    only another's baseline, nor an ``extra`` (a trade-off flag's variant, asked for by name)."""
    rows = table() if rows is None else rows
    return [n for n, r in rows.items() if n == "transformer" or not (r.baseline_only or r.extra)]


def recipe_rows(rows=None):
    """The rows the speed table measures by default: :func:`measured_rows`, then every row that is a WMT recipe's
    model at another shape than its arch's defaults (``BenchRow.recipes``), extra or not."""
    rows = table() if rows is None else rows
    measured = measured_rows(rows)
    return measured + [n for n, r in rows.items() if r.recipes and n not in measured]


def shape_baselines(rows=None):
    """row -> the transformer of its own shape (``BenchRow.shape_baseline``), for the rows that have one."""
    rows = table() if rows is None else rows
    return {n: r.shape_baseline for n, r in rows.items() if r.shape_baseline}


def quick_overrides(name, layers=2, rows=None):
    """A smoke run's overrides of a row: :data:`QUICK` at ``layers`` + ``layers`` layers, then the row's own
    ``quick``, every count of layers or blocks in it at most ``layers`` (a one-layer run gets one block)."""
    r = (rows or {}).get(name) or row(name)
    sizes = dict(QUICK, encoder_layers=layers, decoder_layers=layers)
    for key, value in r.quick.items():
        if ("layers" in key or "blocks" in key) and isinstance(value, int):
            value = min(value, layers)
        sizes[key] = value
    return sizes


def model_overrides(name, width="base", quick=False, quick_layers=2, rows=None):
    """(arch, overrides) of a row at ``width`` ("base" or "big"), with :func:`quick_overrides` under ``quick``."""
    r = (rows or {}).get(name) or row(name)
    arch = r.big if width == "big" else r.base
    overrides = dict(r.overrides)
    if width == "big":
        overrides.update(r.big_overrides)
    if quick:
        overrides.update(quick_overrides(name, quick_layers, rows))
    return arch, overrides


def build(name, width="base", quick=False, vocab=VOCAB, overrides=None, seed=0):
    """The one model builder: (arch, model, task) of a row on a synthetic ``vocab``-entry shared vocabulary,
    through fairseq's real argument parsing (``umst_dev.dev.build_model``); ``overrides`` on top of the row's."""
    from umst_dev import dev

    arch, row_overrides = model_overrides(name, width, quick)
    row_overrides.update(share_all_embeddings=True, **(overrides or {}))
    model, task = dev.build_model(arch, row_overrides, dictionary=dev.make_dictionary(vocab), seed=seed)
    return arch, model, task


def table_json():
    """The table as JSON-able dicts (name -> BenchRow's fields)."""
    fields = ("base", "big", "overrides", "big_overrides", "quick", "baseline", "shape_baseline", "label",
              "baseline_only", "extra", "recipes")
    return {n: {f: getattr(r, f) for f in fields} for n, r in table().items()}


def table_from_child(env=None, python=None):
    """:func:`table` read by a child process (``python -m benchmarks.harness``) in ``env``: for a parent that has
    no fairseq of its own (the speed table's, which installs one for its children)."""
    proc = subprocess.run([python or sys.executable, "-m", "benchmarks.harness"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"reading the arch table failed (python -m benchmarks.harness, rc {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return {n: _row(fields) for n, fields in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def lengths_batch(max_tokens, seed=0, lengths=LENGTHS):
    """(source lengths, target lengths) of one full batch as fairseq builds it, drawn from a length distribution
    (``lengths``: a JSON file's pairs, by default Multi30k's, or ``"wmt14"``, ``synthetic_corpus.WMT14``).

    A pool of sentences large enough for at least :data:`POOL_BATCHES` batches is drawn (the file's pairs in seeded
    random orders, as ``synthetic_corpus.py`` draws a split), sorted by (source, target) length and packed while
    bsz x max(len) <= max_tokens (lengths + 1 for </s>), as fairseq's ``batch_by_size`` packs; the batch in the
    middle of that list is taken: sentences of the median length, and a full batch (within one sentence's length
    of the budget), never the short remainder at a list's end."""
    from benchmarks import synthetic_corpus

    rng = random.Random(f"lengths-batch-{seed}")
    probe = synthetic_corpus.draw_lengths(rng, lengths, 200)
    mean = sum(max(s, t) + 1 for s, t in probe) / len(probe)
    pool = probe + synthetic_corpus.draw_lengths(rng, lengths, int(POOL_BATCHES * max_tokens / mean) + 1)
    pairs = sorted((s + 1, t + 1) for s, t in pool)
    batches, current, longest = [], [], 0
    for s, t in pairs:
        longest_next = max(longest, s, t)
        if current and longest_next * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_next = [], max(s, t)
        current.append((s, t))
        longest = longest_next
    if current:
        batches.append(current)
    batch = batches[len(batches) // 2]
    return [s for s, _ in batch], [t for _, t in batch]


def make_sample(task, src_lengths, tgt_lengths, seed=0):
    """A collated batch with exactly these lengths (random tokens and dependency trees)."""
    from umst_dev import dev

    data = dev.dataset_of_lengths(task, src_lengths, tgt_lengths, seed=seed)
    return dev.collate(data, range(len(src_lengths)))


def loss_fn(model, sample, net_input, autocast_dtype, device_type):
    """The label-smoothed (0.1) cross entropy of one forward, under autocast to ``autocast_dtype`` (None: fp32)."""
    import torch
    import torch.nn.functional as F

    pad = model.decoder.dictionary.pad()
    with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        logits = model(**net_input)[0]
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), sample["target"].view(-1),
                           ignore_index=pad, label_smoothing=0.1)


def matmul_flops(model, sample, device_type):
    """Matmul FLOPs of one fp32 forward + backward (``torch.utils.flop_counter``)."""
    from torch.utils.flop_counter import FlopCounterMode

    from umst_dev import dev

    net_input = dev.model_inputs(model, sample)
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        loss_fn(model, sample, net_input, None, device_type).backward()
    return counter.get_total_flops()


if __name__ == "__main__":  # the table as JSON, for table_from_child
    print(json.dumps(table_json()))
