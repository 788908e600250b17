"""How a data-bin's text was prepared, recorded next to its dictionaries, and applied to raw input.

Every recipe (``scripts/prepare-*.sh``) writes ``DATA_BIN/preprocessing.json``: the normalisation,
lowercasing, Moses tokenizer options and BPE codes its text went through. The
``multiscale_translation`` task reads it at set-up; its ``build_tokenizer`` / ``build_bpe`` (which
fairseq-interactive, fairseq-generate and ``umst-inspect --sentence`` call, and which the plugin's
``from_pretrained`` hub interface calls too) then prepare raw input exactly as the training text was
prepared, and detokenize the output. A record looks like this (``order`` is the order of the steps,
fixed; it is written out so that a person reading the file sees it)::

    {"format": "umst_plugin text preprocessing", "version": 1,
     "written_by": "scripts/prepare-multi30k.sh", "languages": ["en", "de"],
     "order": ["moses_punctuation", "remove_non_printing", "romanian", "lowercase", "tokenizer", "bpe"],
     "normalisation": {"moses_punctuation": true, "remove_non_printing": true, "romanian": []},
     "lowercase": true,
     "tokenizer": {"name": "moses", "aggressive_dash_splits": false, "escape": true},
     "bpe": {"name": "subword_nmt", "codes": "bpe.codes", "codes_sha256": "...", "merges": 10000,
             "separator": "@@"}}

``normalisation.romanian`` lists the languages that got Sennrich's normalise-romanian.py and
remove-diacritics.py (``["ro"]`` in the WMT16 En-Ro recipe). ``bpe.codes`` is relative to the data-bin.

``source_parse`` (optional) says what parsed the source side's dependency side data: ``{"parser": "spacy",
"model": "en_core_web_md", ...}`` (``stanza`` with its language and ``stanza_package``, ``conllu``, ``none``). umst-preprocess writes it
as DATA_BIN/source-parse.json and :func:`write_record` folds that file in, so that raw input at inference is
parsed as the training text was (``umst_plugin.from_pretrained``).

The recipes' text preparation (``umst_tools/wmt_prep.py``, behind ``scripts/wmt_prep.py``) runs
:class:`LinePreparer` in its ``tokenize`` stage, so a recipe and inference run the same code. The module imports
neither fairseq nor torch at module level (fairseq's encoders only where a BPE or tokenizer object is built).
"""
import hashlib
import json
import logging
import os

logger = logging.getLogger(__name__)

RECORD_NAME = "preprocessing.json"
SOURCE_PARSE_NAME = "source-parse.json"  # written by umst-preprocess next to its side data
FORMAT = "umst_plugin text preprocessing"
VERSION = 1
ORDER = ["moses_punctuation", "remove_non_printing", "romanian", "lowercase", "tokenizer", "bpe"]
TOKENIZERS = ("moses", "none")
BPES = ("subword_nmt", "none")
# --text-preprocessing: apply the record (default), or only the --tokenizer/--bpe arguments as given.
MODES = ("record", "arguments")
DOCS_HINT = "see docs/inference.md"


# ---- the text steps (the recipes' tokenize stage and inference share them) ---------------------------

def normalise_romanian(text):
    """wmt16-scripts normalise-romanian.py: cedilla forms -> comma-below forms."""
    text = text.replace("\u015e", "\u0218").replace("\u015f", "\u0219")
    return text.replace("\u0162", "\u021a").replace("\u0163", "\u021b")


def remove_romanian_diacritics(text):
    """wmt16-scripts remove-diacritics.py."""
    text = text.replace("\u0218", "S").replace("\u0219", "s")
    text = text.replace("\u021a", "T").replace("\u021b", "t")
    text = text.replace("\u0102", "A").replace("\u0103", "a")
    text = text.replace("\u00c2", "A").replace("\u00e2", "a")
    return text.replace("\u00ce", "I").replace("\u00ee", "i")


def remove_non_printing(text):
    """remove-non-printing-char.perl: every Unicode category C character becomes a space."""
    import unicodedata

    return "".join(" " if unicodedata.category(c).startswith("C") else c for c in text)


class LinePreparer:
    """One line of raw text -> the tokenized text a recipe writes, in the recipe's order:
    normalize-punctuation.perl, remove-non-printing-char.perl, (Romanian) normalise-romanian.py +
    remove-diacritics.py, lowercasing, tokenizer.perl (``-a`` when ``aggressive_dash_splits``; Moses
    escaping of ``& < > ' " [ ] |`` when ``escape``). sacremoses' tokenizer has no lowercase option,
    so lowercasing is its own step, after normalisation and before tokenization."""

    def __init__(self, lang, romanian=False, lowercase=False, tokenizer="moses", aggressive_dash_splits=True,
                 escape=True, moses_punctuation=True, remove_non_printing=True):
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        if tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer {tokenizer!r}: expected one of {', '.join(TOKENIZERS)}")
        self.normaliser = MosesPunctNormalizer(lang=lang) if moses_punctuation else None
        self.remove_non_printing = remove_non_printing
        self.romanian = romanian
        self.lowercase = lowercase
        self.tokenizer = MosesTokenizer(lang=lang) if tokenizer == "moses" else None
        self.aggressive_dash_splits = aggressive_dash_splits
        self.escape = escape

    def __call__(self, line):
        text = line.rstrip("\n")
        if self.normaliser is not None:
            text = self.normaliser.normalize(text)
        if self.remove_non_printing:
            text = remove_non_printing(text)
        if self.romanian:
            text = remove_romanian_diacritics(normalise_romanian(text))
        if self.lowercase:
            text = text.lower()
        if self.tokenizer is None:
            return " ".join(text.split())
        return self.tokenizer.tokenize(text, aggressive_dash_splits=self.aggressive_dash_splits, return_str=True,
                                       escape=self.escape)


# ---- the record ----------------------------------------------------------------------------------

class RecordError(ValueError):
    """A preprocessing.json that cannot be used: names the file and what was expected."""

    def __init__(self, path, message):
        self.path = path
        super().__init__(f"{path}: {message}")


class PreprocessingMismatch(ValueError):
    """--tokenizer / --bpe arguments that contradict the data-bin's record."""

    def __init__(self, path, conflicts):
        self.path, self.conflicts = path, list(conflicts)
        lines = "\n".join(f"  - {c}" for c in self.conflicts)
        super().__init__(
            f"{path} records how the model's training text was prepared, and these arguments contradict it:\n"
            f"{lines}\nDrop them to use the record, or pass --text-preprocessing arguments (Python: "
            f"text_preprocessing='arguments') to ignore the record and prepare input only as the arguments say.")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_record(databin, languages, *, lowercase, aggressive_dash_splits=True, escape=True, romanian=(),
                 moses_punctuation=True, remove_non_printing=True, tokenizer="moses", bpe="subword_nmt",
                 bpe_codes=None, merges=None, separator="@@", written_by=""):
    """Write DATABIN/preprocessing.json (atomically) and return its path. ``bpe_codes``: a path (absolute,
    or relative to the data-bin); recorded relative to the data-bin, with its sha256."""
    path = os.path.join(databin, RECORD_NAME)
    if not os.path.isdir(databin):
        raise RecordError(path, "the data-bin directory does not exist")
    languages = list(languages)
    unknown = sorted(set(romanian) - set(languages))
    if unknown:
        raise RecordError(path, f"Romanian normalisation for {unknown}, which are not among the languages "
                                f"{languages}")
    bpe_entry = {"name": bpe}
    if bpe == "subword_nmt":
        if not bpe_codes:
            raise RecordError(path, "subword_nmt BPE needs its codes file")
        codes = bpe_codes if os.path.isabs(bpe_codes) else os.path.join(databin, bpe_codes)
        if not os.path.isfile(codes):
            raise RecordError(path, f"BPE codes {codes} do not exist")
        bpe_entry.update(codes=os.path.relpath(codes, databin), codes_sha256=sha256_file(codes), merges=merges,
                         separator=separator)
    source_parse = None
    parse_path = os.path.join(databin, SOURCE_PARSE_NAME)
    if os.path.isfile(parse_path):  # what umst-preprocess parsed the source side with
        try:
            with open(parse_path, encoding="utf-8") as f:
                source_parse = json.load(f)
        except json.JSONDecodeError as e:
            raise RecordError(path, f"{parse_path} is not valid JSON ({e}); expected umst-preprocess's record "
                                    "of its parser (run umst-preprocess again)") from None
    record = {
        "format": FORMAT, "version": VERSION, "written_by": written_by, "languages": languages, "order": ORDER,
        "normalisation": {"moses_punctuation": moses_punctuation, "remove_non_printing": remove_non_printing,
                          "romanian": sorted(romanian)},
        "lowercase": lowercase,
        "tokenizer": {"name": tokenizer, "aggressive_dash_splits": aggressive_dash_splits, "escape": escape},
        "bpe": bpe_entry,
    }
    if source_parse is not None:
        record["source_parse"] = source_parse
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


class PreprocessingRecord:
    """A validated preprocessing.json (see the module docstring)."""

    def __init__(self, path, data):
        self.path = path
        self.databin = os.path.dirname(os.path.abspath(path))
        self._check(data)
        norm, tok, bpe = data["normalisation"], data["tokenizer"], data["bpe"]
        self.written_by = data.get("written_by", "")
        self.languages = list(data["languages"])
        self.moses_punctuation = norm["moses_punctuation"]
        self.remove_non_printing = norm["remove_non_printing"]
        self.romanian = list(norm["romanian"])
        self.lowercase = data["lowercase"]
        self.tokenizer = tok["name"]
        self.aggressive_dash_splits = tok["aggressive_dash_splits"]
        self.escape = tok["escape"]
        self.bpe = bpe["name"]
        self.bpe_codes = os.path.join(self.databin, bpe["codes"]) if self.bpe == "subword_nmt" else None
        self.bpe_codes_sha256 = bpe.get("codes_sha256")
        self.bpe_merges = bpe.get("merges")
        self.bpe_separator = bpe.get("separator", "@@")
        parse = data.get("source_parse") or {}
        self.source_parser = parse.get("parser")  # None: the record predates source_parse, or no parse
        self.source_parser_model = parse.get("model")
        self.source_parser_package = parse.get("stanza_package")  # stanza's model package (None: its default)
        if self.bpe_codes is not None:
            if not os.path.isfile(self.bpe_codes):
                raise RecordError(path, f"the BPE codes it names, {self.bpe_codes}, do not exist (bpe.codes is "
                                        f"relative to the data-bin)")
            got = sha256_file(self.bpe_codes)
            if self.bpe_codes_sha256 and got != self.bpe_codes_sha256:
                raise RecordError(path, f"{self.bpe_codes} has sha256 {got}, but the record expects "
                                        f"{self.bpe_codes_sha256}: the codes changed after the data-bin was made")

    def _check(self, data):
        def fail(what):
            raise RecordError(self.path, what)

        if not isinstance(data, dict) or data.get("format") != FORMAT:
            fail(f'not a text-preprocessing record (expected a JSON object with "format": "{FORMAT}")')
        if data.get("version") != VERSION:
            fail(f"version {data.get('version')!r}; this plugin reads version {VERSION}")
        if data.get("order", ORDER) != ORDER:
            fail(f"steps in the order {data['order']}; only {ORDER} is supported")
        expected = {"languages": list, "normalisation": dict, "lowercase": bool, "tokenizer": dict, "bpe": dict}
        for key, kind in expected.items():
            if not isinstance(data.get(key), kind):
                fail(f'"{key}" is {data.get(key)!r}; expected a {kind.__name__}')
        if not data["languages"] or not all(isinstance(x, str) for x in data["languages"]):
            fail(f'"languages" is {data["languages"]!r}; expected language codes such as ["en", "de"]')
        fields = {"normalisation": {"moses_punctuation": bool, "remove_non_printing": bool, "romanian": list},
                  "tokenizer": {"name": str, "aggressive_dash_splits": bool, "escape": bool},
                  "bpe": {"name": str}}
        for group, keys in fields.items():
            for key, kind in keys.items():
                if not isinstance(data[group].get(key), kind):
                    fail(f'"{group}.{key}" is {data[group].get(key)!r}; expected a {kind.__name__}')
        if data["tokenizer"]["name"] not in TOKENIZERS:
            fail(f'"tokenizer.name" is {data["tokenizer"]["name"]!r}; expected one of {", ".join(TOKENIZERS)}')
        if data["bpe"]["name"] not in BPES:
            fail(f'"bpe.name" is {data["bpe"]["name"]!r}; expected one of {", ".join(BPES)}')
        if data["bpe"]["name"] == "subword_nmt" and not isinstance(data["bpe"].get("codes"), str):
            fail('"bpe.codes" is missing; expected the codes file, relative to the data-bin (e.g. "bpe.codes")')
        parse = data.get("source_parse")
        if parse is not None and not (isinstance(parse, dict) and isinstance(parse.get("parser"), str)
                                      and isinstance(parse.get("model"), (str, type(None)))):
            fail(f'"source_parse" is {parse!r}; expected {{"parser": NAME, "model": NAME or null}} '
                 "(umst-preprocess's source-parse.json)")
        if not set(data["normalisation"]["romanian"]) <= set(data["languages"]):
            fail(f'"normalisation.romanian" is {data["normalisation"]["romanian"]!r}; expected a subset of '
                 f'"languages" {data["languages"]!r}')

    def check_language(self, lang):
        if lang not in self.languages:
            raise RecordError(self.path, f"records languages {self.languages}, not {lang!r} (is --source-lang / "
                                         f"--target-lang right, and is this the model's data-bin?)")

    def preparer(self, lang):
        """The LinePreparer of one side (``lang``): the text steps before BPE."""
        self.check_language(lang)
        return LinePreparer(lang, romanian=lang in self.romanian, lowercase=self.lowercase,
                            tokenizer=self.tokenizer, aggressive_dash_splits=self.aggressive_dash_splits,
                            escape=self.escape, moses_punctuation=self.moses_punctuation,
                            remove_non_printing=self.remove_non_printing)

    def describe(self, lang):
        """One line saying what raw ``lang`` text goes through."""
        steps = []
        if self.moses_punctuation:
            steps.append("Moses punctuation normalisation")
        if self.remove_non_printing:
            steps.append("non-printing characters to spaces")
        if lang in self.romanian:
            steps.append("Romanian normalisation and diacritics removal")
        if self.lowercase:
            steps.append("lowercasing")
        if self.tokenizer == "moses":
            steps.append(f"Moses tokenizer ({lang}, {'aggressive' if self.aggressive_dash_splits else 'no aggressive'}"
                         f" dash splits, {'escaping' if self.escape else 'no escaping'})")
        if self.bpe == "subword_nmt":
            merges = f", {self.bpe_merges} merges" if self.bpe_merges else ""
            steps.append(f"subword-nmt BPE ({os.path.relpath(self.bpe_codes, self.databin)}{merges})")
        return ", ".join(steps) or "nothing (whitespace only)"


def read_record(data_dir):
    """The PreprocessingRecord of a data-bin, or None when it has none. A record that is there but
    broken raises RecordError naming the file."""
    path = os.path.join(data_dir, RECORD_NAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise RecordError(path, f"not valid JSON ({e}); expected the record a recipe writes "
                                f"(python scripts/wmt_prep.py record ...)") from None
    return PreprocessingRecord(path, data)


# ---- inference: the tokenizer and BPE fairseq asks the task for ---------------------------------------

class RecordedTokenizer:
    """fairseq's tokenizer interface (encode: raw source text -> tokens; decode: tokens -> target text)
    for the steps a record names: the recipe's LinePreparer on the source side, the Moses detokenizer of
    the target language on output (lowercased output stays lowercase)."""

    def __init__(self, record, source_lang, target_lang):
        self.record = record
        self.source_lang, self.target_lang = source_lang, target_lang
        self.prepare = record.preparer(source_lang)
        record.check_language(target_lang)
        self.detok = None
        if record.tokenizer == "moses":
            from sacremoses import MosesDetokenizer

            self.detok = MosesDetokenizer(lang=target_lang)

    def encode(self, x):
        return self.prepare(x)

    def decode(self, x):
        return self.detok.detokenize(x.split()) if self.detok is not None else x


def registry_choice(cfg, kind):
    """The name fairseq's build_tokenizer / build_bpe would pick from ``cfg`` (a DictConfig with _name, a
    Namespace with .tokenizer / .bpe, a string, or None)."""
    if cfg is None:
        return None
    if isinstance(cfg, str):
        return cfg
    name = getattr(cfg, "_name", None)
    if name is None and not hasattr(cfg, "_name"):
        name = getattr(cfg, kind, None)
    return name


def tokenizer_conflicts(record, tokenizer_cfg):
    name = registry_choice(tokenizer_cfg, "tokenizer")
    if name is None:
        return []
    if name != record.tokenizer:
        return [f"tokenizer: recorded {record.tokenizer!r}, given {name!r}"]
    conflicts = []
    # fairseq's defaults (dash splits on, escaping on) cannot be told from an explicit choice; only an
    # option switched away from its default can contradict the record.
    if getattr(tokenizer_cfg, "moses_no_dash_splits", False) and record.aggressive_dash_splits:
        conflicts.append("moses_no_dash_splits: recorded aggressive dash splits (tokenizer.perl -a), given "
                         "moses_no_dash_splits=True")
    if getattr(tokenizer_cfg, "moses_no_escape", False) and record.escape:
        conflicts.append("moses_no_escape: recorded Moses escaping, given moses_no_escape=True")
    return conflicts


def bpe_conflicts(record, bpe_cfg):
    name = registry_choice(bpe_cfg, "bpe")
    if name is None:
        return []
    if name != record.bpe:
        return [f"bpe: recorded {record.bpe!r}, given {name!r}"]
    conflicts = []
    if record.bpe == "subword_nmt":
        codes = getattr(bpe_cfg, "bpe_codes", None)
        if codes:
            if not os.path.isfile(codes):
                conflicts.append(f"bpe_codes: {codes} does not exist (the record's codes are {record.bpe_codes})")
            elif sha256_file(codes) != sha256_file(record.bpe_codes):
                conflicts.append(f"bpe_codes: given {codes}, whose content differs from the recorded "
                                 f"{record.bpe_codes}")
        separator = getattr(bpe_cfg, "bpe_separator", record.bpe_separator)
        if separator != record.bpe_separator:
            conflicts.append(f"bpe_separator: recorded {record.bpe_separator!r}, given {separator!r}")
    return conflicts


def build_tokenizer(record, tokenizer_cfg, source_lang, target_lang, mode="record"):
    """The tokenizer for raw input: the record's steps (explicit arguments must agree), or, without a
    record or with mode 'arguments', fairseq's own build from the arguments."""
    from fairseq.data import encoders

    check_mode(mode)
    if record is None or mode == "arguments":
        return encoders.build_tokenizer(tokenizer_cfg)
    conflicts = tokenizer_conflicts(record, tokenizer_cfg)
    if conflicts:
        raise PreprocessingMismatch(record.path, conflicts)
    return RecordedTokenizer(record, source_lang, target_lang)


def build_bpe(record, bpe_cfg, mode="record"):
    """The BPE for raw input: the record's codes (explicit arguments must agree), or fairseq's own build."""
    from fairseq.data import encoders

    check_mode(mode)
    if record is None or mode == "arguments":
        return encoders.build_bpe(bpe_cfg)
    conflicts = bpe_conflicts(record, bpe_cfg)
    if conflicts:
        raise PreprocessingMismatch(record.path, conflicts)
    if record.bpe == "none":
        return None
    from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE, SubwordNMTBPEConfig

    return SubwordNMTBPE(SubwordNMTBPEConfig(bpe_codes=record.bpe_codes, bpe_separator=record.bpe_separator))


def check_mode(mode):
    if mode not in MODES:
        raise ValueError(f"text_preprocessing={mode!r}: expected one of {', '.join(MODES)}")


def missing_record_message(data_dir):
    return (f"{data_dir} has no {RECORD_NAME}: raw input is prepared only by the --tokenizer / --bpe arguments "
            f"given, which may differ from how the training text was prepared (lowercasing, normalisation, "
            f"Moses options). A data-bin made by a recipe of this repository before the record existed gets one "
            f"by re-running the recipe with the same arguments, or by `python scripts/wmt_prep.py record`; "
            f"{DOCS_HINT}.")


def log_record(record, source_lang):
    logger.info("%s: raw %s input gets %s", record.path, source_lang, record.describe(source_lang))
