"""``umst_plugin.from_pretrained(...)``: any checkpoint, raw text prepared as the training text was.

:func:`from_pretrained` loads a checkpoint of any architecture -- the plugin's, fairseq's own transformer --
trained under ``multiscale_translation`` or fairseq's plain ``translation``, and returns fairseq's hub interface
(:class:`RawTextHubInterface`, a ``GeneratorHubInterface``) with

* the data-bin's recorded text preprocessing: fairseq's ``GeneratorHubInterface`` builds its tokenizer and BPE
  from the arguments alone (``encoders.build_tokenizer(cfg.tokenizer)``), whereas fairseq-interactive asks the
  task (``task.build_tokenizer(cfg.tokenizer)``). :class:`RawTextHubInterface` asks the task too (or, under
  plain ``--task translation``, reads the record from the data directory itself), so
  ``from_pretrained(ckpt_dir, checkpoint_file=..., data_name_or_path=DATA_BIN).translate("...")`` applies the
  data-bin's ``preprocessing.json`` (normalisation, lowercasing, Moses options, BPE codes) exactly as
  fairseq-interactive and ``umst-inspect --sentence`` do, and detokenizes the output;
* the checkpoint's precision rules: decoding in fp32 unless ``amp=True`` (then under autocast in the
  checkpoint's ``--amp-dtype``, or ``amp_dtype=...``), whatever precision it was trained in.
* the data-bin's recorded parser (``preprocessing.json``'s ``source_parse``, written by umst-preprocess): a model
  that reads dependency heads (UMST) parses raw input with the parser and model its training data was parsed
  with, unless ``source_parser=...`` is given;
* the recipes' decoding defaults: ``translate`` uses beam 4 and lenpen 0.6, as ``scripts/evaluate.sh`` does
  (fairseq's hub interface: beam 5, lenpen 1.0). The Prime rows' recipe decodes with lenpen 0.5: pass it.

Every model class of the plugin inherits :class:`RawTextFromPretrained` first, so ``XModel.from_pretrained``
is the same function (with the class's ``hub_models()`` names).
"""
import logging

from omegaconf import open_dict

from fairseq import hub_utils, utils

from umst_plugin import text_preprocessing as textprep  # (the constructor's keyword takes the plain name)

logger = logging.getLogger(__name__)

# scripts/evaluate.sh's defaults (beam 4, lenpen 0.6: the UMST, TranSFormer and MSC recipes), so that a sentence
# translated from Python reads as the test set was scored.
DEFAULT_BEAM = 4
DEFAULT_LENPEN = 0.6
# the parsers raw input can be parsed with on the fly (the other umst-preprocess sources have no model)
MODEL_PARSERS = ("spacy", "stanza")


class RawTextHubInterface(hub_utils.GeneratorHubInterface):
    """GeneratorHubInterface whose tokenizer and BPE come from the task (as in fairseq-interactive).

    ``text_preprocessing``: 'record' (default: the data-bin's preprocessing.json; explicit tokenizer /
    bpe arguments must agree with it) or 'arguments' (only the tokenizer / bpe arguments, as fairseq's
    own interface does)."""

    def __init__(self, cfg, task, models, text_preprocessing=None):
        # The parent would build fairseq's tokenizer and BPE from the arguments alone (and bpe='subword_nmt'
        # without bpe_codes fails there although the record names the codes): let it build none.
        tokenizer_cfg, bpe_cfg = cfg.tokenizer, cfg.bpe
        with open_dict(cfg):
            cfg.tokenizer, cfg.bpe = None, None
        try:
            super().__init__(cfg, task, models)
        finally:
            with open_dict(cfg):
                cfg.tokenizer, cfg.bpe = tokenizer_cfg, bpe_cfg
        self._uses_task_record = hasattr(task, "note_raw_input")
        if self._uses_task_record:  # multiscale_translation: its own record and --text-preprocessing
            if text_preprocessing is not None:
                textprep.check_mode(text_preprocessing)
                with open_dict(task.cfg):  # checkpoints older than the flag lack the key
                    task.cfg.text_preprocessing = text_preprocessing
            self.tokenizer = task.build_tokenizer(tokenizer_cfg)
            self.bpe = task.build_bpe(bpe_cfg)
        else:  # fairseq's plain translation task: the same record, read here
            mode = text_preprocessing or "record"
            self._data_dir = utils.split_paths(task.cfg.data)[0]
            self._record = textprep.read_record(self._data_dir)
            self._mode = mode
            self.tokenizer = textprep.build_tokenizer(
                self._record, tokenizer_cfg, task.cfg.source_lang, task.cfg.target_lang, mode)
            self.bpe = textprep.build_bpe(self._record, bpe_cfg, mode)
        self._noted_raw_input = False

    def _note_raw_input(self):
        if self._noted_raw_input:
            return
        self._noted_raw_input = True
        if self._uses_task_record:
            self.task.note_raw_input()
        elif self._mode == "record":
            if self._record is not None:
                textprep.log_record(self._record, self.task.cfg.source_lang)
            else:
                logger.warning(textprep.missing_record_message(self._data_dir))

    def encode(self, sentence):
        self._note_raw_input()
        return super().encode(sentence)

    def translate(self, sentences, beam=DEFAULT_BEAM, verbose=False, **kwargs):
        """fairseq's ``translate`` with scripts/evaluate.sh's defaults: beam 4 and ``lenpen=0.6`` unless given."""
        kwargs.setdefault("lenpen", DEFAULT_LENPEN)
        return super().translate(sentences, beam, verbose, **kwargs)


def use_recorded_parser(task, models, given):
    """Parse raw input as the training data was parsed: when no ``source_parser`` was ``given`` and a model reads
    dependency heads, set the task's ``source_parser`` / ``source_parser_model`` / ``source_parser_package`` from
    the data-bin's record.
    Returns the (parser, model) now in use, or None."""
    if given or not hasattr(getattr(task, "cfg", None), "source_parser"):
        return None
    from umst_plugin.data.side_inputs import encoder_accepts_side_inputs

    record = getattr(task, "text_record", None)
    parser = getattr(record, "source_parser", None)
    if parser is None or not any(encoder_accepts_side_inputs(m) for m in models):
        return None
    if parser == "none":  # trained on the no-edge fallback graph: raw input gets the same
        return None
    if parser not in MODEL_PARSERS:
        logger.warning(f"{record.path}: the source side was parsed by {parser!r}, which cannot parse raw input; "
                       "raw sentences get the fallback graph unless source_parser='spacy' or 'stanza' is given")
        return None
    model = record.source_parser_model or ""
    package = record.source_parser_package or ""  # stanza's model package, as in training
    with open_dict(task.cfg):
        task.cfg.source_parser, task.cfg.source_parser_model = parser, model
        task.cfg.source_parser_package = package
    logger.info(f"raw input is parsed with {parser} {model}{f' (package {package})' if package else ''} "
                f"({record.path} records it)")
    return parser, model


def from_pretrained(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", archive_map=None,
                    **kwargs):
    """fairseq's ``from_pretrained`` for any checkpoint (same arguments: ``model_name_or_path`` a directory, an
    archive or a URL, ``checkpoint_file`` in it, ``data_name_or_path`` the data-bin; further keyword arguments
    override the checkpoint's config, e.g. ``beam=5``, ``cpu=True``, ``source_parser='stanza'`` for UMST, which
    otherwise parses raw input with the parser the data-bin records) that
    returns a :class:`RawTextHubInterface`: raw input prepared as the data-bin's preprocessing.json says
    (``text_preprocessing='arguments'``: only ``tokenizer=`` / ``bpe=`` as given, fairseq's own behaviour).
    Decoding runs in fp32 unless ``amp=True``: then under autocast in ``amp_dtype`` ('float16' or 'bfloat16'),
    by default the dtype the checkpoint was trained in (its ``--amp-dtype``), else float16. ``archive_map``:
    short names for ``model_name_or_path`` (a model class's ``hub_models()``)."""
    from umst_plugin import mixed_precision

    amp = bool(kwargs.get("amp", False))
    kwargs["amp"] = amp  # the task config's amp: this call's choice, not the training run's
    amp_dtype = kwargs.pop("amp_dtype", None)
    if amp_dtype is not None:
        amp_dtype = mixed_precision.check_amp_dtype(amp_dtype)
    text_preprocessing = kwargs.get("text_preprocessing")
    if text_preprocessing is not None:
        textprep.check_mode(text_preprocessing)
    x = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, archive_map=archive_map,
                                  **kwargs)
    task = x["task"]
    task.inference_amp = amp
    # None: the dtype the checkpoint was trained in (patches/checkpoint_precision.py), else float16
    task.inference_amp_dtype = amp_dtype
    use_recorded_parser(task, x["models"], given="source_parser" in kwargs)
    logger.info(x["args"])
    return RawTextHubInterface(x["args"], task, x["models"], text_preprocessing=text_preprocessing)


class RawTextFromPretrained:
    """Mixin for the plugin's model classes: ``from_pretrained`` is :func:`from_pretrained` (returns a
    :class:`RawTextHubInterface`), with the class's ``hub_models()`` names."""

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
        """:func:`umst_plugin.from_pretrained` (the same for every checkpoint): fairseq's ``from_pretrained``
        (same arguments, e.g. ``source_parser='spacy'`` for UMST), with raw input prepared as the data-bin's
        preprocessing.json says; ``text_preprocessing='arguments'`` ignores the record and uses only
        ``tokenizer=`` / ``bpe=`` as given. Decoding runs in fp32 unless ``amp=True`` (then under autocast in the
        checkpoint's ``--amp-dtype``, or ``amp_dtype=...``), whatever precision the checkpoint was trained in."""
        return from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                               archive_map=cls.hub_models(), **kwargs)
