"""The data pipeline's ceiling on steps per second: batches per second out of fairseq's own epoch iterator, nothing
trained, at the recipe's batch per card.

    python -m benchmarks loader                         # the speed table's corpus and batch, one loader worker
    python -m benchmarks loader --num-workers 2 --json docs/results/loader-cpu.json

fairseq-train reads its batches through a DataLoader with ``--num-workers`` worker processes (default 1) that
index the dataset and collate each batch, ahead of the training step. One worker builds one batch at a time, so
at most 1 / (its seconds per batch) steps run per second, however fast the GPU is: on the H200 a compiled
transformer step at 38,400 tokens takes about 78 ms (docs/results/gpu-speed-nvidia-h200-bcc7a7e.json). Rows:
stock fairseq's ``translation`` task, padded by fairseq's own ``collate_tokens`` (the batches of a process that never
imported the plugin, which puts its own in fairseq's place: umst_plugin/patches/collate_tokens.py), and
the plugin's ``multiscale_translation`` task for each arch, with its model built so that the batch hints it asks
for are computed as in training (word ids and dependency heads for every arch: the task reads the side files
whatever the model). Each row: the median of ``--repeats`` runs of ``--batches`` batches after ``--skip`` (the
workers' start). A CPU figure on the machine that runs it: the loader's CPU work is the same with a GPU beside it.
"""
import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time

from benchmarks import common

def _args(data, arch, max_tokens, stock):
    from fairseq import options

    parser = options.get_training_parser()
    argv = [data, "--arch", arch, "--max-tokens", str(max_tokens), "--share-all-embeddings",
            "--task", "translation" if stock else "multiscale_translation"]
    if not stock:
        argv += ["--user-dir", os.path.join(common.ROOT, "umst_plugin")]
    return options.parse_args_and_arch(parser, argv)


@contextlib.contextmanager
def fairseqs_collate_tokens():
    """fairseq's own ``data_utils.collate_tokens`` in place while the block runs (its data loader workers, forked in
    it, keep it): what a stock fairseq process pads its batches with. The plugin's patch is put back after."""
    from fairseq.data import data_utils

    from umst_plugin.patches import installed, original

    patched = data_utils.collate_tokens
    if installed(patched, "collate_tokens"):
        data_utils.collate_tokens = original(patched)
    try:
        yield
    finally:
        data_utils.collate_tokens = patched


def batches_per_second(data, arch, max_tokens, num_workers, batches, skip, stock):
    """Seconds per batch out of the epoch iterator fairseq-train builds (``task.get_batch_iterator`` with its
    ``--num-workers``, shuffled, seed 1), over ``batches`` batches after the first ``skip``; the sentences of
    a batch (the median); and what was timed: the task's and dataset's classes, a batch's model inputs, the number of
    batches timed and the ``collate_tokens`` that padded them (fairseq's own for the stock row)."""
    from fairseq import tasks

    args = _args(data, arch, max_tokens, stock)
    task = tasks.setup_task(args)
    task.load_dataset("train")
    if not stock:
        task.build_model(args)  # its batch hints, as in training
    dataset = task.dataset("train")
    with fairseqs_collate_tokens() if stock else contextlib.nullcontext():
        from fairseq.data import data_utils

        collate = data_utils.collate_tokens.__module__  # fairseq.data.data_utils, or the plugin's patch
        seconds, sentences, batch = _timed_epoch(task, dataset, data, max_tokens, num_workers, batches, skip)
    timed = dict(task=type(task).__name__, dataset=type(dataset).__name__, inputs=sorted(batch["net_input"]),
                 timed_batches=len(sentences), collate_tokens=collate)
    return seconds, statistics.median(sentences), timed


def _timed_epoch(task, dataset, data, max_tokens, num_workers, batches, skip):
    iterator = task.get_batch_iterator(dataset, max_tokens=max_tokens, seed=1, num_workers=num_workers)
    epoch = iterator.next_epoch_itr(shuffle=True)
    if len(epoch) < skip + batches:
        raise ValueError(f"{data}: {len(epoch)} batches of {max_tokens} tokens, fewer than the {skip} + {batches} "
                         "asked for (--skip, --batches)")
    # the previous run's iterator, garbage now, shuts its worker down when collected (torch's DataLoader joins it,
    # seconds); collected here, not by a collection that falls inside the timed batches
    gc.collect()
    sentences, start = [], None
    for i, batch in enumerate(epoch):
        if i == skip:
            start = time.perf_counter()
        if i >= skip:
            sentences.append(int(batch["nsentences"]))
        if i == skip + batches - 1:
            break
    return (time.perf_counter() - start) / batches, sentences, batch


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a data-bin (default: the speed table's synthetic corpus of WMT14 lengths, "
                                       "built in --work if missing)")
    parser.add_argument("--work", default=os.path.join(common.ROOT, "bench-out", "speed"),
                        help="where the speed table's corpus is, or is built")
    parser.add_argument("--max-tokens", type=int, default=38400, help="the batch per card (the recipe's)")
    parser.add_argument("--num-workers", type=int, default=1, help="fairseq's --num-workers (its default: 1)")
    parser.add_argument("--archs", help="the plugin's rows, comma-separated (default: the transformer and every "
                                        "family's arch, harness.measured_rows; python -m benchmarks.harness lists them)")
    parser.add_argument("--batches", type=int, default=40, help="batches timed per run")
    parser.add_argument("--skip", type=int, default=5, help="batches not timed first (the workers' start)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row: the median")
    parser.add_argument("--json", help="write the record here")
    args = parser.parse_args(argv)

    from benchmarks import harness, speed_table

    data = args.data
    if data is None:
        with open(os.devnull, "w") as log:
            data, _ = speed_table.build_corpus(os.path.join(args.work, "corpus"), speed_table.CORPUS, log,
                                               speed_table.process_env())
    import umst_plugin  # noqa: F401  (the plugin's archs; the stock row's task and batches are fairseq's own)

    rows = [("stock transformer", "transformer", True)]
    for name in (args.archs.split(",") if args.archs else harness.measured_rows()):
        arch, _ = harness.model_overrides(name)
        rows.append((name, arch, False))
    record = dict(benchmark="loader", cpu=speed_table.cpu_name(), data=os.path.relpath(data, common.ROOT),
                  max_tokens=args.max_tokens, num_workers=args.num_workers, batches=args.batches, skip=args.skip,
                  repeats=args.repeats, command="python -m benchmarks loader " + " ".join(argv or sys.argv[1:]),
                  rows=[])
    print(f"| row | task | ms per batch | batches/s | sentences per batch | vs stock |\n|---|---|---|---|---|---|")
    stock_ms = None
    for name, arch, stock in rows:
        runs = [batches_per_second(data, arch, args.max_tokens, args.num_workers, args.batches, args.skip, stock)
                for _ in range(args.repeats)]
        ms = round(1000 * statistics.median(s for s, _, _ in runs), 3)  # the figures below from the recorded one
        stock_ms = ms if stock else stock_ms
        row = dict(name=name, arch=arch, stock=stock, ms_per_batch=ms,
                   ms_runs=[round(1000 * s, 2) for s, _, _ in runs], batches_per_s=round(1000 / ms, 2),
                   sentences_per_batch=runs[0][1], vs_stock=round(stock_ms / ms, 3) if stock_ms else None,
                   **runs[0][2])
        record["rows"].append(row)
        print(f"| {name} | {'translation' if stock else 'multiscale_translation'} | {row['ms_per_batch']:.1f} | "
              f"{row['batches_per_s']:.1f} | {row['sentences_per_batch']:.0f} | "
              f"{row['vs_stock'] if row['vs_stock'] is not None else '-'} |", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
