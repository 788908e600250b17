"""The documentation (README.md and docs/*.md) cannot silently rot.

* every relative link (and its #anchor) points to a file (and heading) that exists;
* every command-line flag written as code (in backticks or in a fenced block) is accepted by something
  of this project: fairseq's CLIs with the plugin loaded (their own parsers plus the options every
  registered model, task, criterion, optimizer, scheduler, ... adds), umst-preprocess,
  umst-average-checkpoints, or a script in scripts/ or benchmarks/; the few flags of outside tools are
  listed in EXTERNAL_FLAGS;
* every ``bash scripts/X.sh`` / ``python scripts/X.py`` names a file that exists, every ``python -m benchmarks
  WHAT`` a benchmark the dispatcher knows;
* every project path the docs name in backticks (``umst_plugin/...``, ``benchmarks/x.py``, ...) exists;
* every table marked ``<!-- compare_runs ... -->`` equals what ``benchmarks/compare_runs.py`` renders from the
  JSON files it names;
* README.md stays a five-minute read (<= 300 lines) that starts with the two commands.
"""
import argparse
import functools
import glob
import os
import re
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
README_MAX_LINES = 300
TWO_COMMANDS = ("bash scripts/quickstart.sh", "bash scripts/test.sh")

# Flags of tools outside this project that the docs quote. Keep this short: a flag of ours belongs in a
# parser or a script, not here.
EXTERNAL_FLAGS = {
    "--config-dir": "hydra's own CLI (fairseq-hydra-train --config-dir configs --config-name ROW)",
    "--config-name": "hydra's own CLI",
    "--combine": "the Prime authors' fairseq-0.6.2 fork (lancopku/Prime), quoted from their README",
    "--durations": "pytest (the slowest tests' times, docs/tests-and-benchmarks.md)",
    "--no-deps": "pip",
    "--no-build-isolation": "pip",
    "--ignore-requires-python": "pip",
    "--nodes": "Slurm's srun (the several-machines example of docs/recipes.md)",
    "--ntasks-per-node": "Slurm's srun",
    "--pty": "Slurm's srun (an interactive job, docs/wmt-on-gpus.md)",
    "--array": "Slurm's sbatch (the parse as an array, docs/wmt-on-gpus.md)",
    "--wait": "Slurm's sbatch",
    "--gres": "Slurm's sbatch / srun",
    "--cpus-per-task": "Slurm's sbatch",
    "--dependency": "Slurm's sbatch",
}

FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*(?:/[A-Za-z][\w-]*)*")
LINK_RE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
COMMAND_RE = re.compile(r"(?<![\w/.-])(?:bash|sh|sbatch|(?:taskset\s+-c\s+\S+\s+)?(?:\.venv/bin/)?python3?)\s+"
                        r"((?:scripts|benchmarks)/[\w./-]+)")


def rel(path):
    return os.path.relpath(path, ROOT)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def code_and_prose(text):
    """(fenced code lines, prose lines), splitting the text on ``` fences."""
    code, prose, fence = [], [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        (code if fence else prose).append(line)
    return code, prose


def code_snippets(text):
    """Every fenced code line and every inline `code` span of a markdown text."""
    code, prose = code_and_prose(text)
    spans = []
    for line in prose:
        spans += re.findall(r"`([^`]+)`", line)
    return code + spans


def strip_inline_code(line):
    return re.sub(r"`[^`]*`", "", line)


def github_anchor(heading, seen):
    """The id GitHub gives a heading: lower case, markup and punctuation dropped, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    slug = text.replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return slug if n == 0 else "%s-%d" % (slug, n)


def anchors(path):
    seen, out = {}, set()
    _, prose = code_and_prose(read(path))
    for line in prose:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.add(github_anchor(m.group(1), seen))
    return out


def expand(flag):
    """`--encoder/decoder-normalize-before` names two flags."""
    parts = flag[2:].split("/")
    if len(parts) == 1:
        return [flag]
    last = parts[-1]
    tail = last[last.index("-"):] if "-" in last else ""
    return ["--" + p + tail for p in parts[:-1]] + ["--" + last]


def documented_flags():
    """{flag: [files that name it as code]}"""
    flags = {}
    for path in DOCS:
        for snippet in code_snippets(read(path)):
            for m in FLAG_RE.finditer(snippet):
                for flag in expand(m.group(0)):
                    flags.setdefault(flag, set()).add(rel(path))
    return flags


# ---------------------------------------------------------------------------------------------------------
# (1) links


def test_every_relative_link_points_to_an_existing_file_and_heading():
    bad = []
    for path in DOCS:
        _, prose = code_and_prose(read(path))
        for n, line in enumerate(prose, 1):
            for target in LINK_RE.findall(strip_inline_code(line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(dest):
                    bad.append("%s: [..](%s): %s does not exist" % (rel(path), target, rel(dest)))
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    bad.append("%s: [..](%s): no heading with anchor #%s in %s" % (rel(path), target, anchor, rel(dest)))
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_link_checker_sees_links():
    assert LINK_RE.findall("see [docs/umst.md](docs/umst.md) and ![x](a.png \"t\")") == ["docs/umst.md", "a.png"]
    assert github_anchor("Data: side files and the `multiscale_translation` task", {}) == \
        "data-side-files-and-the-multiscale_translation-task"
    assert github_anchor("Fallback graph", {"fallback-graph": 1}) == "fallback-graph-1"
    assert expand("--encoder/decoder-normalize-before") == ["--encoder-normalize-before", "--decoder-normalize-before"]


# ---------------------------------------------------------------------------------------------------------
# (2) flags


def option_strings(parser):
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--")}


def fresh_parser():
    return argparse.ArgumentParser(add_help=False, conflict_handler="resolve")


@functools.lru_cache(maxsize=None)
def fairseq_flags():
    """Every --flag fairseq's CLIs accept with --user-dir umst_plugin, for any registered component."""
    import umst_plugin  # noqa: F401  (registers the plugin's models, archs and task)
    from fairseq import options
    from fairseq.models import MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    flags = set()
    for make in (options.get_training_parser, options.get_validation_parser, options.get_preprocessing_parser,
                 options.get_generation_parser, options.get_interactive_generation_parser):
        flags |= option_strings(make())
    components = list(MODEL_REGISTRY.values()) + list(TASK_REGISTRY.values())
    for registry in REGISTRIES.values():  # criterion, optimizer, lr_scheduler, bpe, tokenizer, scoring, ...
        components += list(registry["registry"].values())
    for cls in set(components):
        if not hasattr(cls, "add_args"):
            continue
        parser = fresh_parser()
        try:
            cls.add_args(parser)
        except Exception:  # an optional dependency of some fairseq component; never one of ours
            if cls.__module__.startswith("umst_plugin"):
                raise
            continue
        flags |= option_strings(parser)
    return frozenset(flags)


def plugin_cli_flags():
    from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPEConfig
    from umst_plugin.average_checkpoints import get_parser as average_parser
    from umst_plugin.inspect import add_inspect_args
    from umst_plugin.preprocess.cli import get_parser as preprocess_parser

    # umst-inspect's own group, and the BPE options it takes as fairseq-interactive does
    bpe = {"--" + name.replace("_", "-") for name in SubwordNMTBPEConfig.__dataclass_fields__}
    return (option_strings(preprocess_parser()) | option_strings(average_parser())
            | option_strings(add_inspect_args(argparse.ArgumentParser())) | bpe)


def script_texts():
    """The scripts, benchmarks and the fairseq-free tools they run (umst_tools: the argparse of the runner, the
    recipes' Python; umst_dev: the GPU check, the mutation check), and the suite's schedule tool."""
    folders = ("scripts", "scripts/slurm", "benchmarks", "benchmarks/paper", "umst_tools", "umst_tools/multi30k",
               "umst_dev")
    paths = [p for d in folders
             for p in glob.glob(os.path.join(ROOT, d, "*")) if os.path.isfile(p)]
    paths.append(os.path.join(ROOT, "tests", "file_seconds.py"))
    return {rel(p): read(p) for p in paths}


def test_every_documented_flag_exists():
    documented = documented_flags()
    assert len(documented) > 100, "the flag scan found too few flags: %d" % len(documented)
    known = fairseq_flags() | plugin_cli_flags()
    scripts = script_texts()
    unknown = []
    for flag, where in sorted(documented.items()):
        if flag in known or flag in EXTERNAL_FLAGS:
            continue
        pattern = re.compile(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])")
        if any(pattern.search(text) for text in scripts.values()):
            continue
        unknown.append("%s (in %s)" % (flag, ", ".join(sorted(where))))
    assert not unknown, ("flags named in the docs that no parser or script of the project accepts "
                         "(fix the docs, or list an outside tool's flag in EXTERNAL_FLAGS):\n" + "\n".join(unknown))


def test_the_flag_check_can_fail():
    known = fairseq_flags() | plugin_cli_flags()
    # ours, fairseq's, a component's (optimizer), umst-preprocess's, umst-average-checkpoints'
    for flag in ("--rsan-upsample-norm", "--msmsa-scales", "--prime-kernels", "--sf-fusion", "--encoder-blocks",
                 "--max-tokens", "--adam-betas", "--merge-shards", "--num-epoch-checkpoints", "--subword-scheme"):
        assert flag in known, flag
    assert "--rsan-upsample-normalisation" not in known
    assert "--no-such-flag" not in known
    assert not any("--no-such-flag" in text for text in script_texts().values())


# ---------------------------------------------------------------------------------------------------------
# (3) commands


def test_every_script_the_docs_run_exists():
    missing = []
    for path in DOCS:
        for snippet in code_snippets(read(path)):
            for target in COMMAND_RE.findall(snippet):
                if not os.path.isfile(os.path.join(ROOT, target)):
                    missing.append("%s: %s" % (rel(path), target))
    assert not missing, "commands in the docs name scripts that do not exist:\n" + "\n".join(missing)


# (an upper-case word is a placeholder: python -m benchmarks WHAT, paper FAMILY)
BENCHMARK_RE = re.compile(r"(?<![\w/.-])(?:\S*/)?python3?\s+-m\s+benchmarks\s+(paper\s+[a-z_]\w*|(?!paper\b)[a-z][\w-]*)")


def test_every_benchmark_the_docs_run_exists():
    """``python -m benchmarks WHAT`` (and ``paper FAMILY``) in the pages, the README and the scripts: a benchmark
    the dispatcher knows."""
    from benchmarks.__main__ import module_of

    unknown = []
    pages = DOCS + [os.path.join(ROOT, "scripts", n) for n in os.listdir(os.path.join(ROOT, "scripts"))
                    if n.endswith(".sh")]
    for path in pages:
        for what in BENCHMARK_RE.findall(read(path)):
            try:
                module_of(what.split())
            except ValueError:
                unknown.append("%s: python -m benchmarks %s" % (rel(path), what))
    assert not unknown, "benchmarks the docs run that `python -m benchmarks` does not know:\n" + "\n".join(unknown)


def test_the_benchmark_scan_sees_benchmarks():
    assert BENCHMARK_RE.findall("OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks archs --quick; "
                                "python -m benchmarks paper prime --gemm; python -m benchmarks paper FAMILY") == \
        ["archs", "paper prime"]
    from benchmarks.__main__ import module_of

    with pytest.raises(ValueError):
        module_of(["bench_archs"])


def test_the_command_scan_sees_commands():
    assert COMMAND_RE.findall("taskset -c 0 python benchmarks/bench_preprocess.py --sentences 10") == \
        ["benchmarks/bench_preprocess.py"]
    assert COMMAND_RE.findall("ARCH=x bash scripts/quickstart.sh; python scripts/score.py a") == \
        ["scripts/quickstart.sh", "scripts/score.py"]
    assert COMMAND_RE.findall(".venv/bin/python scripts/wmt_prep.py record; sbatch scripts/slurm/x.sbatch R D") == \
        ["scripts/wmt_prep.py", "scripts/slurm/x.sbatch"]


PATH_RE = re.compile(r"`((?:umst_plugin|umst_tools|umst_dev|benchmarks|scripts|tests|configs)/[\w./-]*\w)`")


def test_every_project_path_the_docs_name_exists():
    missing = []
    for path in DOCS:
        for target in PATH_RE.findall(read(path)):
            placeholder = "*" in target or re.search(r"\b[A-Z]{2,}\b", target)  # configs/ROW.yaml
            if not placeholder and not os.path.exists(os.path.join(ROOT, target)):
                missing.append("%s: %s" % (rel(path), target))
    assert not missing, "the docs name project paths that do not exist:\n" + "\n".join(missing)


def test_the_path_scan_sees_paths():
    assert PATH_RE.findall("in `umst_plugin/modules/umst/graphs.py` and `benchmarks/`, not `fairseq/x.py`") == \
        ["umst_plugin/modules/umst/graphs.py"]


def test_every_marked_table_equals_its_render_from_the_results():
    from benchmarks import compare_runs
    marked, stale = 0, []
    for path in DOCS:
        for line, args, table in compare_runs.marked_tables(path):
            marked += 1
            if compare_runs.render(args, os.path.dirname(path)) != table:
                stale.append("%s:%d compare_runs %s" % (rel(path), line, " ".join(args)))
    assert marked >= 4, "docs/performance.md and docs/mixed-precision.md mark their measured tables"
    assert not stale, ("tables that differ from their JSON (python benchmarks/compare_runs.py fill PAGE):\n"
                       + "\n".join(stale))


def test_a_changed_table_is_seen(tmp_path):
    from benchmarks import compare_runs
    page = os.path.join(ROOT, "docs", "performance.md")
    text = read(page)
    first_marked = text.index("<!-- compare_runs ")  # the page's static tables come before it
    text = text[:first_marked] + text[first_marked:].replace("| umst_base |", "| umst_base_changed |", 1)
    copy = tmp_path / "performance.md"
    copy.write_text(text)
    os.symlink(os.path.join(ROOT, "docs", "results"), tmp_path / "results")
    assert any(compare_runs.render(args, str(tmp_path)) != table
               for _, args, table in compare_runs.marked_tables(str(copy)))


# ---------------------------------------------------------------------------------------------------------
# (4) the README itself


def test_readme_is_short_and_starts_with_the_two_commands():
    text = read(README)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= README_MAX_LINES, "README.md has %d lines (at most %d): move detail to docs/" % (
        len(lines), README_MAX_LINES)
    heading = lines.index("## The two commands")
    assert heading < 15, "the two commands must stay near the top"
    code, _ = code_and_prose("\n".join(lines[heading:heading + 20]))
    commands = [re.sub(r"\s+#.*$", "", line).strip() for line in code if line.strip()]
    assert commands[:2] == list(TWO_COMMANDS), commands
    for cmd in TWO_COMMANDS:
        assert os.path.isfile(os.path.join(ROOT, cmd.split()[1]))


@pytest.mark.parametrize("page", ["umst", "transformer_sf", "msc", "msmsa", "prime"])
def test_each_architecture_page_is_linked_from_the_readme_and_links_back(page):
    path = os.path.join(ROOT, "docs", page + ".md")
    assert os.path.isfile(path)
    assert "(docs/%s.md)" % page in read(README)
    text = read(path)
    assert "](../README.md" in text
    assert "## Real data (Multi30k En-De)" in text and "](multi30k.md" in text
    assert "](performance.md)" in text, "each family page links to the per-arch cost table"


# ---------------------------------------------------------------------------------------------------------
# (5) the GPU user's pages: every command of every fenced block runs in its checking form

COMMAND_PAGES = ("docs/wmt-on-gpus.md", "docs/recipes.md")
# What the variables of those blocks stand for: no data is read by the checking forms.
COMMAND_VARS = {"D": "/data/wmt14_en_de/data-bin/wmt14_en_de_bpe32000", "SLURM_NNODES": "2", "SLURM_NODEID": "0"}
VENV_TOOLS = {"umst-average-checkpoints": "umst_plugin.average_checkpoints",
              "umst-preprocess": "umst_plugin.preprocess.cli"}
SHELL_WORDS = {"for", "do", "done", "wait", "then", "fi", "if"}
RUN_MODULES = {"umst_tools.batch_table"}  # `.venv/bin/python -m X` commands run as written (others: --help)


def fenced_blocks(text):
    """[(language, [lines])] of the ``` blocks of a page."""
    blocks, current = [], None
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("```"):
            if current is None:
                current = (stripped[3:].strip(), [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[1].append(line)
    return blocks


def shell_commands(lines):
    """The simple commands of a shell block, variables expanded: [(argv, env)]. Handles what the pages use:
    backslash continuations, comments, NAME=VALUE lines and prefixes, `for v in ...; do ...; done` (v takes
    its first value), ``;``/``&&``/``&``/``|`` lists, ``$((...))`` and ``$(...)`` (a placeholder)."""
    import shlex

    text = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    variables, out = dict(COMMAND_VARS), []

    def subst(word):
        word = re.sub(r"\$\(\((.*?)\)\)", lambda m: str(eval(re.sub(r"\$?([A-Za-z_]\w*)",  # noqa: S307
                      lambda v: variables.get(v.group(1), "0"), m.group(1)))), word)
        word = re.sub(r"\$\([^)]*\)", "node0", word)
        return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m.group(1), ""), word)

    for line in text.split("\n"):
        line = re.sub(r"\$\(\((.*?)\)\)|\$\([^)]*\)", lambda m: subst(m.group(0)), line)  # before words split
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        segment = []
        for token in list(lexer) + [";"]:
            if token and set(token) <= set(";&|"):
                words = segment
                segment = []
                if words and words[0] == "for":  # for NAME in V1 V2 ...: the first value
                    variables[words[1]] = subst(words[3])
                    continue
                words = [w for w in words if w not in SHELL_WORDS] if words and words[0] in SHELL_WORDS else words
                env = {}
                while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
                    name, _, value = words.pop(0).partition("=")
                    env[name] = subst(value)
                if not words:
                    variables.update(env)
                    continue
                argv = []
                for w in words:  # an unquoted $ARGS splits into words, as the shell does
                    argv += subst(w).split() if re.fullmatch(r"\$\{?[A-Za-z_]\w*\}?", w) else [subst(w)]
                out.append((argv, env))
            else:
                segment.append(token)
    return out


def _slurm_path(tmp_path):
    """PATH with test_train_sh_plan's stand-ins for srun (one run per node, SLURM_NODEID set) and scontrol show
    hostnames first."""
    from test_train_sh_plan import _slurm_stand_ins

    _slurm_stand_ins(tmp_path, ["node0", "node1"])
    return f"{tmp_path}{os.pathsep}{os.environ['PATH']}"


def _submit_to_slurm(argv, env, tmp_path, slurm_conf, base_env):
    """A documented ``sbatch [OPTIONS] SCRIPT ARGS`` submitted to a real Slurm cluster (tests/slurm_cluster.py) in
    its checking form: the page's options and arguments as written, then what the two CPU nodes can give (no GPU,
    one CPU; an array's first task only) and the scripts' dry runs (TRAIN_SH_DRY_RUN=1; --dry-run for the prepare
    script a parse task runs). Returns a problem, or None."""
    import subprocess
    import time

    import slurm_cluster

    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 1
    options, script, args = argv[1:i], argv[i], argv[i + 1:]
    options = [o for o in options if o not in ("--wait", "-W")]  # (this check waits for the job itself)
    fit = ["--gres=none", "--cpus-per-task=1"]
    if any(o.startswith("--array") for o in options):
        fit.append("--array=1")
        args = args + ["--dry-run"]
    out = tmp_path / ("job-%d.out" % len(list(tmp_path.glob("job-*.out"))))
    environ = {**base_env, **env, "SLURM_CONF": slurm_conf, "TRAIN_SH_DRY_RUN": "1"}
    proc = subprocess.run(["sbatch", "--parsable", *options, *fit, "--output=%s" % out, script, *args], cwd=ROOT,
                          env=environ, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return "sbatch refused it: " + proc.stderr.strip()[-600:]
    job = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while (state := slurm_cluster.job_field(environ, job, "JobState")) not in ("COMPLETED", "FAILED", "CANCELLED",
                                                                               "TIMEOUT", "NODE_FAIL"):
        if time.monotonic() > deadline:
            return "job %s still %s after 120 s" % (job, state)
        time.sleep(0.3)
    if state != "COMPLETED":
        log = "".join(open(f).read() for f in sorted(tmp_path.glob(out.name.replace(".out", "*"))))
        return "job %s ended %s: %s" % (job, state, log[-600:])
    return None


def check_command(argv, env, tmp_path, slurm_conf=None):
    """Run one documented command in its checking form; returns a problem, or None. With ``slurm_conf`` (a real
    cluster's), an sbatch line is submitted to it; without, its script runs as the job would, under stand-ins for
    srun and scontrol."""
    import subprocess
    import sys

    base_env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env}
    base_env.pop("CUDA_VISIBLE_DEVICES", None) if "CUDA_VISIBLE_DEVICES" not in env else None

    def run(cmd, **extra):
        proc = subprocess.run(cmd, cwd=ROOT, env={**base_env, **extra}, capture_output=True, text=True, timeout=120)
        return None if proc.returncode == 0 else "exit %d: %s" % (proc.returncode, (proc.stderr or proc.stdout)[-600:])

    def flags_in_help(cmd, args):
        proc = subprocess.run(cmd + ["--help"], cwd=ROOT, env=base_env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return "--help: exit %d" % proc.returncode
        missing = [a.split("=")[0] for a in args if a.startswith("--") and a.split("=")[0] not in proc.stdout]
        return "flags not in its --help: %s" % ", ".join(missing) if missing else None

    tool = argv[0]
    if tool == "sbatch":
        i = 1
        while i < len(argv) and argv[i].startswith("-"):
            i += 1
        script, args = argv[i], argv[i + 1:]
        if not os.path.isfile(os.path.join(ROOT, script)):
            return "no such script " + script
        if slurm_conf:
            return _submit_to_slurm(argv, env, tmp_path, slurm_conf, base_env)
        slurm = dict(PATH=_slurm_path(tmp_path), SLURM_JOB_ID="1234", SLURM_JOB_NODELIST="node[0-1]",
                     SLURM_SUBMIT_DIR=ROOT)
        if "parse-array" in script:  # task 1 of the array: the prepare script's own --dry-run
            return run(["bash", script, *args, "--dry-run"], SLURM_ARRAY_TASK_ID="1", **slurm)
        return run(["bash", script, *args], TRAIN_SH_DRY_RUN="1", **slurm)
    if tool in ("srun",) and "-c" in argv:  # srun ... bash -c 'COMMAND'
        problems = [check_command(a, e, tmp_path, slurm_conf) for a, e in shell_commands([argv[argv.index("-c") + 1]])]
        return "; ".join(p for p in problems if p) or None
    if tool == "bash" and argv[1].startswith("scripts/"):
        script, args = argv[1], argv[2:]
        if not os.path.isfile(os.path.join(ROOT, script)):
            return "no such script " + script
        name = os.path.basename(script)
        if name in ("train.sh", "evaluate.sh") or name.startswith("prepare-"):
            return run(["bash", script, *args, *([] if "--dry-run" in args else ["--dry-run"])])
        return flags_in_help(["bash", script], args)
    if tool.startswith(".venv/bin/"):
        name = tool[len(".venv/bin/"):]
        if name in VENV_TOOLS:
            import importlib

            parser = importlib.import_module(VENV_TOOLS[name]).get_parser()
            try:
                parser.parse_args(argv[1:])
            except SystemExit as e:
                return "%s does not accept %s (exit %s)" % (name, " ".join(argv[1:]), e.code)
            return None
        if name in ("python", "python3") and argv[1:2] == ["-m"]:
            if argv[2] in RUN_MODULES:  # cheap and reads only the repository: run it
                return run([sys.executable, *argv[1:]])
            if argv[2] == "pytest":  # the suite itself: the test files it names exist
                missing = [a for a in argv[3:] if a.startswith("tests/") and not os.path.exists(os.path.join(ROOT, a))]
                return "no such test file: " + ", ".join(missing) if missing else None
            if argv[2] == "benchmarks":  # python -m benchmarks WHAT (or paper FAMILY): that benchmark's --help
                words = 2 if argv[3:4] == ["paper"] else 1
                return flags_in_help([sys.executable, *argv[1:3 + words]], argv[3 + words:])
            return flags_in_help([sys.executable, *argv[1:3]], argv[3:])
        if name in ("python", "python3"):
            script, args = argv[1], argv[2:]
            if not os.path.isfile(os.path.join(ROOT, script)):
                return "no such script " + script
            if script == "scripts/collect_results.py":  # cheap and reads nothing that must exist: run it
                return run([sys.executable, script, *args, "--output", str(tmp_path / "table.md")])
            return flags_in_help([sys.executable, script], args)
        return "no such tool .venv/bin/" + name
    if tool == "taskset":
        return check_command(argv[3:], env, tmp_path, slurm_conf)
    return "not a command these pages may use as written (run the project's tools as bash scripts/..., " \
           "sbatch scripts/slurm/..., or .venv/bin/...): " + " ".join(argv)


def documented_shell_commands(page):
    out = []
    for lang, lines in fenced_blocks(read(os.path.join(ROOT, page))):
        if lang in ("bash", "sh", ""):
            out += [(argv, env) for argv, env in shell_commands(lines)]
    return out


@pytest.fixture(scope="module")
def slurm_conf():
    """A real Slurm cluster's SLURM_CONF for the pages' sbatch lines (tests/slurm_cluster.py), or None where Slurm
    cannot run here (then the sbatch scripts run under stand-ins for srun and scontrol)."""
    from umst_tools import local_slurm

    if local_slurm.unavailable():
        yield None
        return
    import slurm_cluster

    with slurm_cluster.cluster() as slurm_env:
        yield slurm_env["SLURM_CONF"]


@pytest.mark.parametrize("page", COMMAND_PAGES)
def test_every_command_of_the_gpu_pages_runs_in_its_checking_form(page, tmp_path, slurm_conf):
    commands = documented_shell_commands(page)
    assert len(commands) >= 5, commands
    bad = []
    for argv, env in commands:
        problem = check_command(argv, env, tmp_path, slurm_conf)
        if problem:
            bad.append("%s: %s\n    %s" % (page, " ".join(argv), problem))
    assert not bad, "commands of %s that fail as written:\n%s" % (page, "\n".join(bad))


def test_the_command_check_sees_commands_and_can_fail(tmp_path):
    block = ["ARGS=\"--parser stanza --parse-shards 4\"   # a comment",
             "for i in 1 2; do",
             "  CUDA_VISIBLE_DEVICES=$((i - 1)) bash scripts/prepare-wmt14-en-de.sh $ARGS --parse-shard $i/4 &",
             "done; wait",
             "bash scripts/train.sh umst-t2-umst-base --data $D \\", "    --amp-bf16"]
    commands = shell_commands(block)
    assert commands == [
        (["bash", "scripts/prepare-wmt14-en-de.sh", "--parser", "stanza", "--parse-shards", "4", "--parse-shard",
          "1/4"], {"CUDA_VISIBLE_DEVICES": "0"}),
        (["bash", "scripts/train.sh", "umst-t2-umst-base", "--data", COMMAND_VARS["D"], "--amp-bf16"], {})]
    assert check_command(commands[1][0], {}, tmp_path) is None
    assert "--bf16" in check_command(["bash", "scripts/train.sh", "umst-t2-umst-base", "--data", "D", "--bf16"],
                                     {}, tmp_path)
    assert check_command([".venv/bin/umst-average-checkpoints", "--inputs", "x", "--no-such-flag"], {}, tmp_path)
    assert check_command(["umst-preprocess", "-s", "en"], {}, tmp_path)  # not runnable from a login shell
    assert check_command(["bash", "scripts/no-such.sh"], {}, tmp_path) == "no such script scripts/no-such.sh"
