"""Helpers for tests and benchmarks: build any registered arch on a synthetic
vocabulary through fairseq's real argument parsing, and make real batches
(collated by the task's own dataset classes) without a data-bin. The batch helpers
that production code uses too live in ``umst_plugin.batches`` (re-exported here).
"""
import copy
import os
import random

import torch
from fairseq import options, tasks
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from umst_dev.argv import overrides_to_argv  # noqa: F401  (re-exported: dev.overrides_to_argv)
import umst_plugin
from umst_plugin.batches import encoder_inputs, model_inputs, move_sample  # noqa: F401  (re-exported)
from umst_plugin.data.side_data_dataset import SideDataLanguagePairDataset
from umst_plugin.data.word_boundaries import word_ids_from_pieces

PLUGIN_DIR = os.path.dirname(os.path.abspath(umst_plugin.__file__))


def make_dictionary(vocab=60):
    """A subword-nmt style dictionary: every third entry continues its word (``@@``)."""
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}@@" if i % 3 == 1 else f"w{i}")
    d.finalize(padding_factor=1)
    return d


def parse_args(arch, overrides=None, task="multiscale_translation", data="/nonexistent-data"):
    parser = options.get_training_parser(default_task=task)
    argv = [data, "--user-dir", PLUGIN_DIR, "--task", task, "--arch", arch] + overrides_to_argv(
        {"source_lang": "src", "target_lang": "tgt", **(overrides or {})})
    return options.parse_args_and_arch(parser, input_args=argv)


_configs = {}  # repr of a parsed Namespace's values -> convert_namespace_to_omegaconf of it


def config_of(args):
    """``convert_namespace_to_omegaconf(args)``, converted once per distinct Namespace (its values) and copied
    for every caller. fairseq composes a hydra config with one override per flag to convert, about 0.5 s a call
    on 2 cores: most of a tiny model's build, and the tests build models by the thousand. The copy is a deep
    one because building a model applies its arch function to the Namespace in place."""
    key = repr(sorted(vars(args).items()))
    if key not in _configs:
        _configs[key] = convert_namespace_to_omegaconf(args)
    return copy.deepcopy(_configs[key])


def setup_task(data, overrides=None, task="multiscale_translation", arch="transformer"):
    """A task set up on a real data-bin, from command-line style overrides."""
    cfg = config_of(parse_args(arch, overrides, task, data))
    return tasks.setup_task(cfg.task)


def _built(arch, overrides, task, vocab, seed, dictionary=None):
    """(cfg, task, model) from one parsed config, the model built after ``torch.manual_seed(seed)``."""
    cfg = config_of(parse_args(arch, overrides, task))
    d = dictionary if dictionary is not None else make_dictionary(vocab)
    task_obj = tasks.TASK_REGISTRY[task](cfg.task, d, d)
    torch.manual_seed(seed)
    return cfg, task_obj, task_obj.build_model(cfg.model)


def build_model(arch, overrides=None, task="multiscale_translation", vocab=60, seed=0, dictionary=None):
    """(model, task) for a registered arch; ``overrides`` maps argparse dests to values."""
    _, task_obj, model = _built(arch, overrides, task, vocab, seed, dictionary)
    return model, task_obj


def training_parts(arch, overrides=None, task="multiscale_translation", vocab=60, seed=0):
    """(cfg, task, model, criterion) as fairseq-train builds them for its ``Trainer`` (one parsed config; the model
    not yet compiled, moved or wrapped: the Trainer does that), on a synthetic vocabulary. Pass
    ``no_save=True`` in ``overrides`` unless a test wants a save_dir: a Trainer with ``--compile`` keeps inductor's
    caches in SAVE_DIR/compile_cache, and fairseq's default is ./checkpoints, in the checkout."""
    cfg, task_obj, model = _built(arch, overrides, task, vocab, seed)
    return cfg, task_obj, model, task_obj.build_criterion(cfg.criterion)


def build_trainer(arch, overrides=None, **kwargs):
    """fairseq's ``Trainer`` on :func:`training_parts` (its ``__init__`` runs the plugin's flags' set-up)."""
    from fairseq.trainer import Trainer

    return Trainer(*training_parts(arch, overrides, **kwargs))


def _random_sentence(rng, dictionary, length):
    symbols = list(range(dictionary.nspecial, len(dictionary)))
    pieces = [rng.choice(symbols) for _ in range(length)]
    whole = [s for s in symbols if not dictionary[s].endswith("@@")]
    pieces[-1] = rng.choice(whole)  # a sentence ends with a complete word
    return pieces


def random_dataset(task, n, src_len, tgt_len, seed=0, left_pad_source=True, min_len=2):
    """A SideDataLanguagePairDataset of ``n`` random sentences with random dependency trees."""
    rng = random.Random(seed)
    return _random_side_dataset(task, rng, n, lambda: rng.randint(min_len, src_len),
                                lambda: rng.randint(min_len, tgt_len), left_pad_source)


def dataset_of_lengths(task, src_lengths, tgt_lengths, seed=0, left_pad_source=True):
    """As :func:`random_dataset`, with exactly these sentence lengths (</s> included)."""
    src_it, tgt_it = (iter(n - 1 for n in lengths) for lengths in (src_lengths, tgt_lengths))
    return _random_side_dataset(task, random.Random(seed), len(src_lengths), lambda: next(src_it),
                                lambda: next(tgt_it), left_pad_source)


def _random_side_dataset(task, rng, n, src_len, tgt_len, left_pad_source):
    """``n`` random sentence pairs, source and target lengths (without </s>) drawn by ``src_len()`` and
    ``tgt_len()`` in that order per pair, each source word with a random head."""
    sd, td = task.source_dictionary, task.target_dictionary
    src, tgt, word_ids, heads = [], [], [], []
    for _ in range(n):
        pieces = _random_sentence(rng, sd, src_len())
        wids = word_ids_from_pieces([sd[p] for p in pieces])
        n_words = wids[-1]
        heads.append(torch.tensor([rng.choice([h for h in range(n_words + 1) if h != w])
                                   for w in range(1, n_words + 1)], dtype=torch.long))
        word_ids.append(torch.tensor(wids, dtype=torch.long))
        src.append(torch.tensor(pieces + [sd.eos()], dtype=torch.long))
        tgt.append(torch.tensor(_random_sentence(rng, td, tgt_len()) + [td.eos()], dtype=torch.long))
    pair = LanguagePairDataset(src, torch.tensor([len(s) for s in src]), sd, tgt,
                               torch.tensor([len(t) for t in tgt]), td, left_pad_source=left_pad_source,
                               shuffle=False)
    return SideDataLanguagePairDataset(pair, word_ids, heads, batch_hints=getattr(task, "batch_hints", None))


def collate(dataset, indices, pad_source_to=None):
    """Collate items of ``dataset`` exactly as fairseq would (re-sorted by length)."""
    pad = {"source": pad_source_to, "target": None} if pad_source_to else None
    return dataset.collater([dataset[i] for i in indices], pad_to_length=pad)


def random_sample(task, bsz, src_len, tgt_len, seed=0, left_pad_source=True):
    return collate(random_dataset(task, bsz, src_len, tgt_len, seed, left_pad_source), range(bsz))
