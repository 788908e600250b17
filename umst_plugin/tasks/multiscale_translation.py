"""The ``multiscale_translation`` task: translation plus aligned source side data.

Extends fairseq's ``translation`` task (every translation flag keeps working)
and adds ``src_word_ids`` / ``src_word_heads`` to ``net_input`` (see
``umst_plugin.data.side_data_dataset``). Training, validation and
fairseq-generate read the binarized side files written by ``umst-preprocess``;
fairseq-interactive (which only has tokens) derives word ids from the subword
markers of the source dictionary and heads from ``--source-parser``, or the
no-edge fallback graph with a one-time warning.

Raw text (fairseq-interactive, ``from_pretrained(...).translate``, ``umst-inspect --sentence``) is
prepared as the data-bin's ``preprocessing.json`` says (``umst_plugin.text_preprocessing``): the task
reads the record at set-up, and ``build_tokenizer`` / ``build_bpe`` return its pipeline.
"""
import itertools
import logging
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from fairseq import utils
from fairseq.data import ConcatDataset, LanguagePairDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from omegaconf import II
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from umst_plugin import text_preprocessing as textprep  # (the config field takes the plain name)
from umst_plugin import mixed_precision
from umst_plugin.data.side_data_dataset import SideDataLanguagePairDataset
from umst_plugin.data.side_inputs import (HINT_KEYS, SIDE_INPUT_KEYS, BatchHints,  # noqa: F401
                                          encoder_accepts_side_inputs, keep_named_inputs)
from umst_plugin.data.word_boundaries import boundary_table, word_ids_from_tokens, words_from_pieces
from umst_plugin.data.side_files import (HEADS, WORD_IDS, SideDataError, check_side_alignment,  # noqa: F401
                                         load_side, side_prefix_of)
from umst_plugin.data.word_boundaries import moses_unescape

logger = logging.getLogger(__name__)


@dataclass
class MultiscaleTranslationConfig(TranslationConfig):
    subword_scheme: ChoiceEnum(["auto", "subword-nmt", "sentencepiece"]) = field(
        default="auto", metadata={"help": "subword marker convention of the source dictionary, used to rebuild "
                                  "words from tokens when no side file exists (fairseq-interactive); auto = "
                                  "sentencepiece if more entries start with U+2581 than end with @@, else "
                                  "subword-nmt"})
    source_parser: str = field(
        default="none", metadata={"help": "dependency parser for source sentences that come without side files "
                                  "(fairseq-interactive): a umst-preprocess --parser backend name, or none for "
                                  "the fallback graph without edges"})
    source_parser_model: str = field(
        default="", metadata={"help": "model name or path for --source-parser (e.g. a spaCy pipeline or a "
                              "stanza language code)"})
    source_parser_package: str = field(
        default="", metadata={"help": "stanza's model package for --source-parser stanza (umst-preprocess "
                              "--stanza-package; empty: stanza's default package). from_pretrained takes it "
                              "from the data-bin's record with the parser"})
    text_preprocessing: ChoiceEnum(list(textprep.MODES)) = field(
        default="record", metadata={"help": "how raw input (fairseq-interactive, from_pretrained(...).translate, "
                                    "umst-inspect --sentence) is prepared: record = as the data-bin's "
                                    "preprocessing.json says (normalisation, lowercasing, Moses options, BPE "
                                    "codes; --tokenizer/--bpe, if given, must agree with it); arguments = only "
                                    "by --tokenizer/--bpe as given, the record ignored"})
    # --amp-dtype is one of fairseq's common options (umst_plugin/training/amp_dtype_flag.py), for every task;
    # the task keeps the key, following it, so that configs and checkpoints that set task.amp_dtype (before the
    # flag was common, or +task.amp_dtype=... under fairseq-hydra-train) keep their meaning. oc.select, not II:
    # fairseq-hydra-train composes its config before the plugin adds common.amp_dtype, so the key may be absent
    # there (II would then fail to resolve: InterpolationKeyError). Like II, an interpolation default is not
    # made an argparse option (fairseq skips it; --amp-dtype is the common one)
    amp_dtype: Optional[ChoiceEnum(list(mixed_precision.AMP_DTYPES))] = "${oc.select:common.amp_dtype,null}"
    amp: bool = II("common.amp")
    fp16_init_scale: int = II("common.fp16_init_scale")


@register_task("multiscale_translation", dataclass=MultiscaleTranslationConfig)
class MultiscaleTranslationTask(TranslationTask):
    """Translation whose batches also carry source word ids and dependency heads."""

    cfg: MultiscaleTranslationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        scheme = None if cfg.subword_scheme == "auto" else cfg.subword_scheme
        self.boundaries = boundary_table(src_dict, scheme)
        self._parser = None
        self._parse_cache = {}
        self._warned_fallback = False
        self.text_record_dir = utils.split_paths(cfg.data)[0] if cfg.data else None
        # A broken record stops set-up (training included) with the file named; a missing one is only
        # reported where raw input is prepared (note_raw_input).
        self.text_record = textprep.read_record(self.text_record_dir) if self.text_record_dir else None
        self._noted_raw_input = False
        # host-side sizes the models ask for (data/side_inputs.py), computed by the collater per batch
        self.batch_hints = BatchHints()

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        hint = getattr(model, "host_batch_hint", None)
        if callable(hint):
            self.batch_hints.register(type(model).__name__, hint())
        return model

    # ---- raw text: the data-bin's preprocessing record -----------------------------------------

    def _text_mode(self):
        return str(getattr(self.cfg, "text_preprocessing", None) or "record")  # ChoiceEnum -> its string

    def build_tokenizer(self, args):
        """The data-bin's recorded text steps (normalisation, lowercasing, Moses options) for raw source
        text, and the target's Moses detokenizer for output; fairseq's own tokenizer when there is no
        record or with --text-preprocessing arguments. Explicit --tokenizer options must agree with the
        record (PreprocessingMismatch names those that do not)."""
        return textprep.build_tokenizer(self.text_record, args, self.cfg.source_lang, self.cfg.target_lang,
                                                  self._text_mode())

    def build_bpe(self, args):
        """The data-bin's recorded BPE codes (explicit --bpe/--bpe-codes must agree), or fairseq's own."""
        return textprep.build_bpe(self.text_record, args, self._text_mode())

    def note_raw_input(self):
        """Once per task, where raw text is about to be prepared: say which record applies, or that the
        data-bin has none."""
        if self._noted_raw_input:
            return
        self._noted_raw_input = True
        if self._text_mode() == "arguments":
            logger.info("--text-preprocessing arguments: raw input is prepared only by --tokenizer/--bpe as given")
        elif self.text_record is not None:
            textprep.log_record(self.text_record, self.cfg.source_lang)
        elif self.text_record_dir:
            logger.warning(textprep.missing_record_message(self.text_record_dir))

    def get_interactive_tokens_and_lengths(self, lines, encode_fn):
        self.note_raw_input()
        return super().get_interactive_tokens_and_lengths(lines, encode_fn)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        data_path = paths[(epoch - 1) % len(paths)]
        src, tgt = self.cfg.source_lang, self.cfg.target_lang
        word_id_sets, head_sets = [], []
        for k in itertools.count():  # the same shards fairseq concatenated (train, train1, ...)
            split_k = split + (str(k) if k > 0 else "")
            prefix = side_prefix_of(data_path, split_k, src, tgt, self.cfg.dataset_impl)
            if prefix is None:
                break
            src_raw = data_utils.load_indexed_dataset(prefix, None, self.cfg.dataset_impl)
            src_sizes = np.array(src_raw.sizes)  # copy while src_raw (and its mmap) is alive
            word_ids, heads = load_side(prefix, WORD_IDS), load_side(prefix, HEADS)
            check_side_alignment(prefix, src_sizes, word_ids, heads)
            word_id_sets.append(word_ids)
            head_sets.append(heads)
            if not combine:
                break
        if len(word_id_sets) == 1:
            word_ids, heads = word_id_sets[0], head_sets[0]
        else:
            ratios = [self.cfg.upsample_primary] + [1] * (len(word_id_sets) - 1)
            word_ids, heads = ConcatDataset(word_id_sets, ratios), ConcatDataset(head_sets, ratios)
        self.datasets[split] = SideDataLanguagePairDataset(self.datasets[split], word_ids, heads,
                                                           batch_hints=self.batch_hints)

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq-fixed drops a last batch that is not a multiple of --required-batch-size-multiple
        (default 8), i.e. up to 7 sentences of every valid/test set, silently. Outside training we
        ask for multiples of 1, so generate/validate/interactive see every sentence."""
        if dataset is not self.datasets.get(self.cfg.train_subset):
            if len(args) >= 5:  # passed positionally (after max_tokens ... ignore_invalid_inputs)
                args = args[:4] + (1,) + args[5:]
            else:
                kwargs["required_batch_size_multiple"] = 1
        return super().get_batch_iterator(dataset, *args, **kwargs)

    # ---- models that take no side inputs (e.g. fairseq's own transformer) ------------------

    def _strip_side_inputs(self, sample, models):
        """Hand each encoder the side inputs and hints its forward names, no other (data/side_inputs.py)."""
        if not sample or "net_input" not in sample:
            return sample
        return {**sample, "net_input": keep_named_inputs(sample["net_input"], models)}

    # ---- mixed precision (umst_plugin/mixed_precision.py) --------------------------------------

    # FairseqTask's train_step, valid_step and inference_step autocast under --amp in --amp-dtype on the model's
    # device, for every task (umst_plugin/patches/task_autocast.py); these two say what they decide here

    def _amp(self):
        """Autocast validation and decoding? The command line of this process decides, not the checkpoint
        (``mixed_precision.inference_amp``)."""
        return mixed_precision.inference_amp(self)

    def _amp_dtype(self):
        """In which dtype (``mixed_precision.inference_amp_dtype``)."""
        return mixed_precision.inference_amp_dtype(self)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        return super().train_step(self._strip_side_inputs(sample, [model]), model, criterion, optimizer,
                                  update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        return super().valid_step(self._strip_side_inputs(sample, [model]), model, criterion)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        sample = self._add_missing_side_inputs(sample, models)
        return super().inference_step(generator, models, self._strip_side_inputs(sample, models),
                                      prefix_tokens=prefix_tokens, constraints=constraints)

    # ---- inference without side files (fairseq-interactive) -----------------------------

    def _add_missing_side_inputs(self, sample, models):
        """fairseq-interactive rebuilds net_input from src_tokens/src_lengths only, dropping what
        build_dataset_for_inference collated: derive word ids from the tokens again (vectorised) and
        heads from --source-parser (or the no-edge fallback)."""
        net_input = sample.get("net_input") if sample else None
        if not net_input or "src_tokens" not in net_input or "src_word_ids" in net_input:
            return sample
        if not any(encoder_accepts_side_inputs(m) for m in models):
            return sample
        src_tokens = net_input["src_tokens"]
        scheme, continues, begins = self.boundaries
        word_ids = word_ids_from_tokens(src_tokens, self.src_dict.pad(), self.src_dict.eos(), continues, begins,
                                        scheme)
        n_words = word_ids.max(dim=1).values  # includes the </s> word (head 0)
        slots = torch.arange(int(n_words.max()), device=src_tokens.device)
        heads = torch.where(slots.unsqueeze(0) < n_words.unsqueeze(1), 0, -1)
        parsed = self._parse_tokens(src_tokens)
        if parsed is not None:
            for row, row_heads in enumerate(parsed):  # parser output is per-sentence host data
                heads[row, : len(row_heads)] = row_heads.to(heads.device)
        return {**sample, "net_input": {**net_input, "src_word_ids": word_ids, "src_word_heads": heads}}

    def _parse_tokens(self, src_tokens):
        """Heads for raw input sentences from --source-parser, or None (fallback graph)."""
        if self.cfg.source_parser == "none":
            if not self._warned_fallback:
                logger.warning("multiscale_translation: no --source-parser configured; interactive input gets "
                               "the fallback graph (every word its own phrase, no dependency edges). "
                               "Set --source-parser (e.g. spacy or stanza) to parse the input.")
                self._warned_fallback = True
            return None
        from umst_plugin.preprocess import parsers

        if self._parser is None:
            options = Namespace(parser_model=self.cfg.source_parser_model or None,
                                stanza_package=getattr(self.cfg, "source_parser_package", "") or None)
            self._parser = parsers.build_backend(self.cfg.source_parser, options)
        # fairseq-interactive builds the inference dataset and then drops its side inputs, so the same
        # sentences come through here twice: parse each distinct sentence once.
        eos, pad = self.src_dict.eos(), self.src_dict.pad()
        keys = [tuple(int(t) for t in tokens if int(t) not in (eos, pad)) for tokens in src_tokens]
        todo = [k for k in dict.fromkeys(keys) if k not in self._parse_cache]
        if todo:
            scheme = self.boundaries[0]
            sentences = [[moses_unescape(w) for w in words_from_pieces([self.src_dict[t] for t in key], scheme)]
                         for key in todo]
            if len(self._parse_cache) > 10000:
                self._parse_cache.clear()
            for key, parse in zip(todo, parsers.safe_parse(self._parser, sentences)):
                self._parse_cache[key] = torch.tensor(parse.heads, dtype=torch.long)
        return [self._parse_cache[k] for k in keys]

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        dataset = LanguagePairDataset(src_tokens, src_lengths, self.source_dictionary,
                                      tgt_dict=self.target_dictionary, constraints=constraints)
        return SideDataLanguagePairDataset(dataset, word_ids=None, heads=self._parse_tokens(src_tokens),
                                           batch_hints=self.batch_hints,
                                           boundaries=self.boundaries)
