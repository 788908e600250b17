"""Chunked, resumable, multi-process parsing with a model backend.

A split's lines are cut into fixed chunks of ``--chunk-size`` lines counted
from the start of the file (chunk k = lines [k*C, (k+1)*C)); shards take whole
chunks (``shard_range``), so a sentence is parsed in the same batch whether the
split is sharded or not and merged shards equal an unsharded run byte for byte.

Each finished chunk is written to ``{work_dir}/chunk-{k:06d}.tsv`` (one line per
sentence: heads, labels, fallback reason; tab-separated) under a temporary name
and renamed when complete, so a chunk file that exists is whole. A rerun of the
same command skips existing chunks: an interrupted run (Ctrl-C, kill, crash)
continues from the last completed chunk. ``manifest.json`` records what the
chunks were made from (BPE file size and mtime, parser, model, chunk size);
chunks made from anything else are discarded rather than reused.
"""
import collections
import json
import logging
import math
import multiprocessing
import os
import shutil

from umst_plugin.preprocess import parsers
from umst_plugin.preprocess.errors import SideDataError
from umst_plugin.preprocess.sidefiles import ParseArrays, fallback_kind
from umst_plugin.preprocess.text import iter_parser_words

logger = logging.getLogger("umst_plugin.preprocess")

CHUNK_NAME = "chunk-{:06d}.tsv"
DEFAULT_WORK_ROOT = ".umst-work"


def shard_range(n_lines, chunk_size, shard, n_shards):
    """0-based [start, stop) lines of shard ``shard`` (1-based) of ``n_shards``, on chunk boundaries."""
    n_chunks = math.ceil(n_lines / chunk_size)
    first, last = (shard - 1) * n_chunks // n_shards, shard * n_chunks // n_shards
    return min(first * chunk_size, n_lines), min(last * chunk_size, n_lines)


def batches(sentences, batch_size, batch_tokens):
    """Consecutive batches of at most ``batch_size`` sentences and ``batch_tokens`` words."""
    batch, words = [], 0
    for s in sentences:
        if batch and (len(batch) >= batch_size or (batch_tokens and words + len(s) > batch_tokens)):
            yield batch
            batch, words = [], 0
        batch.append(s)
        words += len(s)
    if batch:
        yield batch


def parse_sentences(backend, sentences, args):
    out = []
    for batch in batches(sentences, getattr(args, "batch_size", 256) or 256, getattr(args, "batch_tokens", 0)):
        out.extend(parsers.safe_parse(backend, batch, getattr(args, "max_words", 0)))
    return out


def write_chunk(path, parses):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for p in parses:
            f.write(f"{' '.join(map(str, p.heads))}\t{' '.join(p.labels)}\t{p.fallback or ''}\n")
    os.replace(tmp, path)


def read_chunk(path, n_expected):
    heads, sizes, labels, fallbacks = [], [], [], collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise SideDataError(path, line_no, "expected 3 tab-separated fields (heads, labels, fallback); "
                                    "delete the file to parse its chunk again")
            h = fields[0].split()
            heads.extend(int(x) for x in h)
            sizes.append(len(h))
            labels.append(fields[1])
            if fields[2]:
                fallbacks[fallback_kind(fields[2])] += 1
    if len(sizes) != n_expected:
        raise SideDataError(path, len(sizes), f"{len(sizes)} sentences; expected {n_expected} (delete the file "
                            "to parse its chunk again)")
    return ParseArrays(heads, sizes, labels, fallbacks, source=path)


# ---- worker processes ------------------------------------------------------------------

_worker_backend = None


def _parse_chunk_in_worker(job):
    """Runs in a worker: parse one chunk and write its file; returns (k, sentences, words)."""
    global _worker_backend
    args, k, path, sentences = job
    if _worker_backend is None:
        _worker_backend = parsers.build_backend(args.parser, args)
    write_chunk(path, parse_sentences(_worker_backend, sentences, args))
    return k, len(sentences), sum(map(len, sentences))


class ChunkedParse:
    """Parse lines [start, stop) of ``bpe_path`` in chunks under ``work_dir``; see the module doc."""

    def __init__(self, args, bpe_path, scheme, start, stop, work_dir):
        self.args, self.bpe_path, self.scheme = args, bpe_path, scheme
        self.start, self.stop, self.work_dir = start, stop, work_dir
        self.chunk_size = args.chunk_size
        first = start // self.chunk_size
        self.chunks = list(range(first, math.ceil(stop / self.chunk_size)))

    def chunk_path(self, k):
        return os.path.join(self.work_dir, CHUNK_NAME.format(k))

    def chunk_lines(self, k):
        return max(k * self.chunk_size, self.start), min((k + 1) * self.chunk_size, self.stop)

    def _manifest(self):
        st = os.stat(self.bpe_path)
        a = self.args
        return {"bpe": os.path.abspath(self.bpe_path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                "scheme": self.scheme, "parser": a.parser, "parser_model": getattr(a, "parser_model", None),
                "spacy_model": getattr(a, "spacy_model", None), "stanza_lang": getattr(a, "stanza_lang", None),
                "stanza_package": getattr(a, "stanza_package", None),
                "stanza_processors": getattr(a, "stanza_processors", None), "chunk_size": self.chunk_size,
                "batch_size": getattr(a, "batch_size", None), "batch_tokens": getattr(a, "batch_tokens", None),
                "max_words": getattr(a, "max_words", None)}

    def prepare(self):
        """Create or validate the work dir; return the chunks still to do."""
        manifest = self._manifest()
        path = os.path.join(self.work_dir, "manifest.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
            if old != manifest:
                changed = sorted(k for k in manifest if old.get(k) != manifest[k])
                logger.warning(f"{self.work_dir}: discarding chunks made with different inputs or settings "
                               f"({', '.join(changed)} changed)")
                shutil.rmtree(self.work_dir)
        os.makedirs(self.work_dir, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
        ours = {CHUNK_NAME.format(k) for k in self.chunks}  # (a work dir given by hand may be shared by shards)
        for name in os.listdir(self.work_dir):  # leftovers of an interrupted write are never whole
            if ".tmp-" in name and name.split(".tmp-")[0] in ours:
                try:
                    os.remove(os.path.join(self.work_dir, name))
                except FileNotFoundError:
                    pass
        return [k for k in self.chunks if not os.path.exists(self.chunk_path(k))]

    def _jobs(self, todo):
        todo_set = set(todo)
        current, sentences = None, []
        for number, words in iter_parser_words(self.bpe_path, self.scheme, self.start, self.stop):
            k = (number - 1) // self.chunk_size
            if k != current:
                if current in todo_set:
                    yield current, sentences
                current, sentences = k, []
            if k in todo_set:
                sentences.append(words)
        if current in todo_set:
            yield current, sentences

    def run(self, progress=None):
        """Parse every missing chunk; returns the ParseArrays of lines [start, stop)."""
        todo = self.prepare()
        done_lines = sum(b - a for a, b in map(self.chunk_lines, self.chunks)) - \
            sum(b - a for a, b in map(self.chunk_lines, todo))
        if done_lines:
            logger.info(f"resuming: {len(self.chunks) - len(todo)} of {len(self.chunks)} chunks "
                        f"({done_lines} sentences) already parsed in {self.work_dir}")
        bar = progress(total=self.stop - self.start, initial=done_lines) if progress else None
        stop_after = getattr(self.args, "stop_after_chunks", None)
        finished = 0
        workers = getattr(self.args, "workers", 1) or 1
        try:
            if todo and workers <= 1:
                logger.info(f"{self.work_dir}: parsing {len(todo)} chunk(s) in this process")
                backend = parsers.build_backend(self.args.parser, self.args)
                for k, sentences in self._jobs(todo):
                    write_chunk(self.chunk_path(k), parse_sentences(backend, sentences, self.args))
                    finished += 1
                    if bar:
                        bar.update(len(sentences))
                    if stop_after is not None and finished >= stop_after:
                        raise KeyboardInterrupt(f"deliberate interrupt after {finished} chunks (--stop-after-chunks)")
            elif todo:
                logger.info(f"{self.work_dir}: parsing {len(todo)} chunk(s) in {workers} worker processes")
                ctx = multiprocessing.get_context("spawn")  # fork + torch/CUDA threads can deadlock
                pool = ctx.Pool(workers)
                try:
                    pending = collections.deque()  # bounded, so a WMT split is never all in memory at once

                    def wait_oldest():
                        nonlocal finished
                        _, n_sent, _ = pending.popleft().get()
                        finished += 1
                        if bar:
                            bar.update(n_sent)
                        if stop_after is not None and finished >= stop_after:
                            raise KeyboardInterrupt(f"deliberate interrupt after {finished} chunks "
                                                    "(--stop-after-chunks)")

                    for k, sentences in self._jobs(todo):
                        pending.append(pool.apply_async(_parse_chunk_in_worker,
                                                        ((self.args, k, self.chunk_path(k), sentences),)))
                        if len(pending) >= 2 * workers:
                            wait_oldest()
                    while pending:
                        wait_oldest()
                    pool.close()
                finally:
                    pool.terminate()
                    pool.join()
        finally:
            if bar:
                bar.close()
        parts = [read_chunk(self.chunk_path(k), b - a) for k in self.chunks for a, b in [self.chunk_lines(k)]]
        return ParseArrays.concatenate(parts, source=f"parser {self.args.parser!r}")

    def cleanup(self):
        """Remove this range's chunk files, and the work dir once no chunk is left in it."""
        for k in self.chunks:
            try:
                os.remove(self.chunk_path(k))
            except FileNotFoundError:
                pass
        try:
            if not any(n.startswith("chunk-") for n in os.listdir(self.work_dir)):
                shutil.rmtree(self.work_dir, ignore_errors=True)
            root = os.path.dirname(self.work_dir)
            if os.path.basename(root) == DEFAULT_WORK_ROOT:
                os.rmdir(root)  # the default work root, once no split is left in it
        except OSError:
            pass
