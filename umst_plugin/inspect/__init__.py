"""umst-inspect: draw one source sentence at its scales, and what a trained model does with it.

    umst-inspect DATA_BIN --subset test --index 3 --output sent3.png [--path CHECKPOINT]
    umst-inspect DATA_BIN --sentence "raw text" --source-parser spacy --bpe subword_nmt \\
        --bpe-codes codes --output raw.png [--path CHECKPOINT]

The sample is built by the ``multiscale_translation`` task exactly as training/generation
(``--index``: the binarized split and its side files) or fairseq-interactive (``--sentence``:
tokenizer/BPE, word ids from the dictionary's subword markers, heads from ``--source-parser``)
see it. The scale graphs are drawn from ``umst_plugin.modules.umst.graphs``; with ``--path`` the
checkpoint is loaded the fairseq way and its encoder run once in evaluation mode (the family's
``umst_plugin/models/<family>/capture.py`` says what is read from which module). Every fairseq-interactive
option is accepted (``--tokenizer``, ``--bpe``, ``--source-lang``, ``--model-overrides``, ``--cpu`` ...).
Documentation: docs/inspect.md.
"""
import os
import sys
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from umst_plugin.inspect.capture import Capture, InspectError, Panel, capture_for, family_of, known_families

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Source:
    """One source sentence at its scales (the </s> piece and word included, as the model sees them)."""

    pieces: List[str]
    words: List[str]
    token_word: List[int]  # 0-based word of each piece
    heads: List[int]  # per word: 1-based head, 0 = root
    phrase_adj: np.ndarray  # W x W normalised D^-1/2 (A_p + I) D^-1/2 (umst_graphs.build_graphs)
    word_map: np.ndarray  # T x W: the subword -> word map G_{b->w} (1 where piece t belongs to word w)
    origin: str
    target: Optional[str] = None


@dataclass
class Result:
    figure: object  # matplotlib.figure.Figure
    output: str
    source: Source
    panels: List[Panel]
    family: Optional[str]
    notes: List[str]


def add_inspect_args(parser):
    group = parser.add_argument_group("umst-inspect")
    group.add_argument("--output", "-o", metavar="FILE.png", default="inspect.png",
                       help="where to write the picture (PNG; default inspect.png)")
    group.add_argument("--subset", default="test", help="split of DATA_BIN to read --index from (default test)")
    group.add_argument("--index", type=int, default=None, metavar="N",
                       help="0-based sentence index in --subset (fairseq's sample id, as S-N in fairseq-generate)")
    group.add_argument("--sentence", default=None, metavar="TEXT",
                       help="a raw source sentence instead of --index: tokenized/BPE-encoded and parsed as "
                            "fairseq-interactive does (--tokenizer, --bpe, --source-parser)")
    group.add_argument("--layer", type=int, default=None, metavar="L",
                       help="1-based encoder layer whose maps are drawn (default: the last one)")
    group.add_argument("--head", type=int, default=None, metavar="H",
                       help="1-based attention head (default: mean over heads; every head where the family draws "
                            "one panel per head)")
    group.add_argument("--columns", type=int, default=3, metavar="C", help="heatmaps per row (default 3)")
    group.add_argument("--dpi", type=int, default=100, help="resolution of the PNG (default 100)")
    group.add_argument("--hardware", default=None, metavar="TEXT",
                       help="the machine that trained --path, named in the picture's heading beside how it was "
                            "trained (a checkpoint records its budget, not its hardware)")
    return parser


def parse_args(argv=None):
    from fairseq import options

    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv):
        argv = ["--user-dir", PLUGIN_DIR] + argv  # recorded in the config, as fairseq's CLIs record theirs
    parser = options.get_interactive_generation_parser(default_task="multiscale_translation")
    add_inspect_args(parser)
    parser.description = __doc__.split("\n\n")[0]
    return options.parse_args_and_arch(parser, input_args=argv)


def _word_strings(pieces, token_word, n_words, scheme):
    from umst_plugin.preprocess.text import moses_unescape

    words = [""] * n_words
    for piece, w in zip(pieces, token_word):
        if scheme == "sentencepiece":
            piece = piece.replace("\u2581", "")
        elif piece.endswith("@@"):
            piece = piece[:-2]
        words[w] += piece
    return [moses_unescape(w) if w != "</s>" else w for w in words]


def source_from_sample(task, sample, origin):
    from umst_plugin.modules.umst.graphs import build_graphs

    net_input = sample["net_input"]
    src_tokens, word_ids, heads = net_input["src_tokens"], net_input["src_word_ids"], net_input["src_word_heads"]
    d = task.source_dictionary
    graphs = build_graphs(src_tokens, word_ids, heads, d.pad(), need_phrase=True)
    real = ~graphs.token_pad[0]
    pieces = [d[int(t)] for t in src_tokens[0][real]]
    token_word = graphs.token_word[0][real].tolist()
    n_words = int((~graphs.word_pad[0]).sum())
    words = _word_strings(pieces, token_word, n_words, task.boundaries[0])
    word_map = np.zeros((len(pieces), n_words), dtype=np.float32)
    word_map[np.arange(len(pieces)), token_word] = 1.0
    target = None
    if sample.get("target") is not None:
        target = task.target_dictionary.string(sample["target"][0], task.boundaries[0].replace("-", "_"))
    return Source(pieces=pieces, words=words, token_word=token_word, heads=heads[0][:n_words].tolist(),
                  phrase_adj=graphs.phrase_adj[0, :n_words, :n_words].numpy(), word_map=word_map, origin=origin,
                  target=target)


def sample_from_index(task, cfg, subset, index):
    try:
        task.load_dataset(subset, combine=False, epoch=1)
    except FileNotFoundError as e:
        raise InspectError(f"cannot read subset '{subset}' of {cfg.task.data}: {e}") from e
    dataset = task.dataset(subset)
    if not 0 <= index < len(dataset):
        raise InspectError(f"--index {index} is out of range: subset '{subset}' of {cfg.task.data} has "
                           f"{len(dataset)} sentences (indices 0..{len(dataset) - 1})")
    return dataset.collater([dataset[index]]), f"{subset}[{index}] of {cfg.task.data}"


def sample_from_sentence(task, cfg, sentence):
    """As fairseq-interactive prepares a line: the task's tokenizer and BPE, which apply the data-bin's
    preprocessing.json when it has one (lowercasing, normalisation, Moses options, BPE codes)."""
    if hasattr(task, "note_raw_input"):
        task.note_raw_input()
    tokenizer = task.build_tokenizer(cfg.tokenizer)
    bpe = task.build_bpe(cfg.bpe)
    text = sentence.strip()
    if tokenizer is not None:
        text = tokenizer.encode(text)
    if bpe is not None:
        text = bpe.encode(text)
    tokens = task.source_dictionary.encode_line(text, add_if_not_exist=False).long()
    dataset = task.build_dataset_for_inference([tokens], [tokens.numel()])
    return dataset.collater([dataset[0]]), "--sentence"


def load_model(cfg, task):
    from fairseq import checkpoint_utils

    path = cfg.common_eval.path
    if not os.path.isfile(path):
        raise InspectError(f"checkpoint not found: {path}")
    overrides = eval(cfg.common_eval.model_overrides) if cfg.common_eval.model_overrides else {}
    state = checkpoint_utils.load_checkpoint_to_cpu(path, overrides)  # read once: the model and how it trained
    models, saved_cfg, _ = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides, task=task,
                                                                         state=state)
    model = models[0]
    model.eval()
    if not cfg.common.cpu and torch.cuda.is_available():
        model = model.cuda()
    return model, getattr(saved_cfg.model, "arch", None) or getattr(saved_cfg.model, "_name", None), \
        training_of(state, saved_cfg)


def training_of(state, cfg):
    """How a checkpoint was trained, as it records it itself (the heading's "trained:" line): the updates
    it holds, the tokens (or sentences) per update, the peak learning rate, the warm-up, the seed, the
    precision, and which checkpoints it averages (umst-average-checkpoints)."""
    from omegaconf import OmegaConf

    from umst_plugin.average_checkpoints import updates_of

    def get(key):
        return OmegaConf.select(cfg, key, default=None)

    gpus = max(1, get("distributed_training.distributed_world_size") or 1)
    per_update = (get("optimization.update_freq") or [1])[0] * gpus
    batch = (f"{get('dataset.max_tokens') * per_update} tokens" if get("dataset.max_tokens")
             else f"{get('dataset.batch_size') * per_update} sentences" if get("dataset.batch_size") else "? tokens")
    lr = get("optimization.lr")
    lr = lr[0] if OmegaConf.is_list(lr) or isinstance(lr, list) else lr
    updates = updates_of(state)
    parts = [f"{updates if updates >= 0 else '?'} updates of {batch}", f"lr {lr}"]
    if get("lr_scheduler.warmup_updates") is not None:
        parts.append(f"warm-up {get('lr_scheduler.warmup_updates')}")
    precision = ("fp16" if get("common.fp16") or get("common.memory_efficient_fp16")
                 else "bf16" if get("common.bf16") or get("common.memory_efficient_bf16") else "fp32")
    parts += [f"seed {get('common.seed')}", precision]
    averaged = state.get("averaged_from") or []
    if averaged:  # the first and last as listed; the line stays short for the usual 5 or 10
        names = averaged if len(averaged) <= 2 else [averaged[0], "...", averaged[-1]]
        parts.append(f"average of {len(averaged)} checkpoints ({', '.join(names)})")
    return ", ".join(parts)


def run(argv=None, log=print):
    """Parse ``argv``, draw and save the picture; returns a :class:`Result` (figure included)."""
    from fairseq import tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = parse_args(argv)
    if (args.index is None) == (args.sentence is None):
        raise InspectError("give exactly one of --index N (a sentence of --subset) or --sentence TEXT")
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    if not hasattr(task, "boundaries"):
        raise InspectError(f"umst-inspect needs --task multiscale_translation (got --task {cfg.task._name})")
    if args.index is not None:
        sample, origin = sample_from_index(task, cfg, args.subset, args.index)
    else:
        sample, origin = sample_from_sentence(task, cfg, args.sentence)
    source = source_from_sample(task, sample, origin)

    capture, family = Capture("scales"), None
    if cfg.common_eval.path:
        model, arch, trained = load_model(cfg, task)
        family = family_of(model)
        if family is None:
            raise InspectError(f"don't know how to inspect a checkpoint of arch {arch!r} (encoder "
                               f"{type(model.encoder).__name__}); known families: {', '.join(known_families())}")
        device = next(model.parameters()).device
        from umst_plugin.batches import move_sample

        capture = capture_for(family)(model, move_sample(sample, device), source, layer=args.layer, head=args.head)

    from umst_plugin.inspect.draw import make_figure

    scale_panels = [Panel("subword -> word map G_b->w\n(UMST's word groups A_w, down-/up-sampling)",
                          source.word_map, source.pieces, source.words, "subword", "word", cmap="Blues"),
                    Panel("phrase graph D^-1/2 (A_p + I) D^-1/2\n(UMST's inter-group GCN, from the heads)",
                          source.phrase_adj, source.words, source.words, "word", "word")]
    panels = scale_panels + capture.panels
    heading = f"umst-inspect {origin}\nsource: {' '.join(source.words[:-1])}"  # a long data-bin path cuts no words
    if source.target:
        heading += f"\ntarget: {source.target}"
    if family:  # the picture travels alone: it names its model, how that trained, and where
        heading += (f"\nmodel: {arch} ({cfg.common_eval.path})\ntrained: {trained}"
                    f"\nhardware: {args.hardware or 'not recorded (umst-inspect --hardware names it)'}")
    heading = "\n".join(line if len(line) <= 160 else line[:159] + "…" for line in heading.split("\n"))
    fig = make_figure(source, panels, heading, ncols=args.columns)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(args.output, dpi=args.dpi)
    log(f"umst-inspect: wrote {args.output} ({len(source.pieces)} subwords, {len(source.words)} words"
        f"{', model ' + family if family else ''})")
    log("  panels: source scales (subwords -> words -> dependency arcs); "
        + "; ".join(p.title.split("\n")[0] for p in panels))
    for note in capture.notes:
        log(f"  note: {note}")
    return Result(fig, args.output, source, panels, family, capture.notes)


def main(argv=None):
    from umst_plugin.preprocess.errors import ParserSetupError, SideDataError

    try:
        run(argv)
    except (InspectError, SideDataError, ParserSetupError) as e:
        print(f"umst-inspect: error: {e}", file=sys.stderr)
        return 2
    return 0
