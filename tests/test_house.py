"""The shape of the code base, checked so that it stays as it was built.

* **No import circle** among the project's modules (``umst_plugin``, ``umst_tools``, ``benchmarks``, ``umst_dev``),
  imports inside functions counted. Every ``.py`` file is parsed with ``ast``; every ``import`` statement anywhere
  in it (module level, in a function, in a ``try``) is resolved to the project module it loads:

  - ``import a.b.c`` and ``from a.b import c`` point at the deepest project module named (``a.b.c`` where ``c`` is a
    module, else ``a.b``); relative imports are resolved from the importing module's package;
  - a bare ``import common`` in a script whose own folder holds ``common.py`` (a benchmark run as a script: its
    folder is ``sys.path[0]``) points at that sibling;
  - the packages above the module named (whose ``__init__`` Python runs first) are not counted: every submodule of
    the plugin would otherwise import ``umst_plugin/__init__.py``, which imports them all.

  The strongly connected components of that graph (Tarjan) must each be one module: a circle shows as the modules
  it joins and the lines that import each other.

* **The plugin holds what fairseq and the user's commands load.** Every module of ``umst_plugin/`` must be reached
  from the plugin's entry points; a module that only tests, benchmarks or ``umst_dev`` import belongs in
  ``umst_dev/`` (or ``benchmarks/``). The entry points are:

  - ``umst_plugin`` itself: what ``import umst_plugin`` (``--user-dir umst_plugin``) loads, read from
    ``sys.modules`` after importing it in a fresh interpreter (the package imports its tasks, models and patches by
    listing their folders, which no parser sees);
  - the modules of ``setup.py``'s console scripts (``umst-preprocess=umst_plugin.preprocess.cli:main``, ...),
    also imported in that interpreter;
  - every plugin module a user's command names: ``python -m umst_plugin.X`` (with ``X/__main__.py`` where ``X`` is a
    package) or ``from umst_plugin.X import`` / ``import umst_plugin.X`` in ``scripts/``, ``README.md`` and
    ``docs/*.md`` (not ``docs/results/``, which records what ran).

  From those, the import graph above (imports inside functions counted: a CLI's lazy imports are loaded by it)
  is followed; a module reached also loads the packages above it. What is left unreached fails the test.

* **Each family in its own folders.** Each of ``msmsa``, ``prime``, ``transformer_sf`` and ``msc`` is named in code
  (an identifier, an import or a string; not a comment or docstring) in at most 3 Python or shell files outside its
  own ``umst_plugin/models/<family>/`` and ``umst_plugin/modules/<family>/`` and the tests; everything else finds the
  families in the registry (``umst_plugin/families.py``). "Names" is by word parts (:func:`names_family`).
"""
import ast
import glob
import io
import json
import os
import re
import subprocess
import sys
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("umst_plugin", "umst_tools", "benchmarks", "umst_dev")


def project_modules(root=ROOT, packages=PACKAGES):
    """{dotted module name: path} of every .py file of the project's packages (a package by its ``__init__``)."""
    modules = {}
    for package in packages:
        top = os.path.join(root, package)
        if not os.path.isdir(top):
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                parts = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join(parts)] = os.path.join(folder, name)
    return modules


def _deepest(name, modules):
    """The longest prefix of the dotted ``name`` that is a project module, or None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def imports_of(module, path, modules):
    """[(project module imported, line)] of every import statement in ``path`` (the module ``module``)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    is_package = os.path.basename(path) == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    folder = os.path.dirname(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _deepest(alias.name, modules)
                if target is None and "." not in alias.name and os.path.isfile(os.path.join(folder,
                                                                                             alias.name + ".py")):
                    target = _deepest(f"{package}.{alias.name}" if package else alias.name, modules)  # sibling
                if target is not None:
                    found.append((target, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
                top = base.split(".")[0]
                if top not in {m.split(".")[0] for m in modules} and os.path.isfile(os.path.join(folder, top + ".py")):
                    base = f"{package}.{base}" if package else base  # a sibling of a script
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                target = submodule if submodule in modules else _deepest(base, modules)
                if target is not None:
                    found.append((target, node.lineno))
    return found


def import_graph(root=ROOT, packages=PACKAGES):
    """{module: {imported module: first line}} over the project's modules (a module importing itself left out)."""
    modules = project_modules(root, packages)
    graph = {name: {} for name in modules}
    for name, path in modules.items():
        for target, line in imports_of(name, path, modules):
            if target != name:
                graph[name].setdefault(target, line)
    return graph


def strongly_connected_components(graph):
    """Tarjan's algorithm, iterative: the components of ``graph`` ({node: iterable of nodes})."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def import_circles(root=ROOT, packages=PACKAGES):
    """Each circle (a strongly connected component of more than one module) as lines 'a (line n) -> b'."""
    graph = import_graph(root, packages)
    circles = []
    for component in strongly_connected_components(graph):
        if len(component) > 1:
            members = set(component)
            circles.append([f"{a} (line {line}) -> {b}" for a in component for b, line in sorted(graph[a].items())
                            if b in members])
    return circles


def test_no_import_circle_among_the_project_modules():
    circles = import_circles()
    assert not circles, "import circles:\n" + "\n\n".join("\n".join(c) for c in circles)


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("files,circle", [
    # a circle closed by an import inside a function, through a relative import
    ({"umst_plugin/__init__.py": "", "umst_plugin/a.py": "from umst_plugin import b\n",
      "umst_plugin/b.py": "def f():\n    from . import a\n"}, {"umst_plugin.a", "umst_plugin.b"}),
    # from a package import a name its __init__ defines: the package itself
    ({"umst_plugin/__init__.py": "from umst_plugin.c import x\n", "umst_plugin/c.py": "from umst_plugin import y\n"},
     {"umst_plugin", "umst_plugin.c"}),
    # a benchmark script's bare import of its sibling, across packages
    ({"benchmarks/__init__.py": "", "benchmarks/common.py": "import umst_tools.t\n",
      "benchmarks/run.py": "import common\n", "umst_tools/__init__.py": "",
      "umst_tools/t.py": "try:\n    from benchmarks.run import main\nexcept ImportError:\n    pass\n"},
     {"benchmarks.common", "benchmarks.run", "umst_tools.t"}),
    # no circle: packages above the module named are not counted
    ({"umst_plugin/__init__.py": "from umst_plugin import a\n", "umst_plugin/a.py": "import umst_plugin.sub.b\n",
      "umst_plugin/sub/__init__.py": "", "umst_plugin/sub/b.py": "import os\n"}, None),
])
def test_the_circle_check_finds_circles_made_every_way(tmp_path, files, circle):
    _write(tmp_path, files)
    circles = import_circles(str(tmp_path))
    if circle is None:
        assert circles == []
    else:
        assert len(circles) == 1 and {line.split(" ")[0] for line in circles[0]} == circle, circles


def plugin_entry_points(root=ROOT):
    """The plugin modules a user's command loads by name: setup.py's console scripts, ``python -m umst_plugin.X``
    and ``from umst_plugin.X import`` / ``import umst_plugin.X`` in scripts/, README.md and docs/*.md."""
    names = set()
    with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
        names.update(re.findall(r"=\s*(umst_plugin[\w.]*):", f.read()))
    texts = [p for p in glob.glob(os.path.join(root, "scripts", "**", "*"), recursive=True) if os.path.isfile(p)]
    texts += [os.path.join(root, "README.md")] + glob.glob(os.path.join(root, "docs", "*.md"))
    for path in texts:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name in re.findall(r"-m\s+(umst_plugin[\w.]*)", text):
            names.add(name)
            if os.path.isfile(os.path.join(root, *name.split("."), "__main__.py")):
                names.add(name + ".__main__")
        names.update(re.findall(r"(?:from|import)\s+(umst_plugin[\w.]*)", text))
    return sorted(names)


def loaded_by_import(names, root=ROOT):
    """The ``umst_plugin`` modules in ``sys.modules`` of a fresh interpreter after importing ``umst_plugin`` and
    ``names`` (``__main__`` modules left out: importing one runs its command)."""
    code = ("import importlib, json, sys\nimport umst_plugin\n"
            f"for name in {[n for n in names if not n.endswith('__main__')]!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'umst_plugin')))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def unreached_plugin_modules(roots, root=ROOT, packages=PACKAGES):
    """The ``umst_plugin`` modules not reached from ``roots`` through the import graph (a module reached also
    reaches the packages above it)."""
    graph = import_graph(root, packages)
    seen, todo = set(), [r for r in roots if r in graph]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:end]) for end in range(1, len(parts)) if ".".join(parts[:end]) in graph]
        todo += list(graph[module])
    return sorted(m for m in graph if m.split(".")[0] == "umst_plugin" and m not in seen)


def test_the_plugin_holds_only_what_its_entry_points_load():
    names = plugin_entry_points()
    assert "umst_plugin.preprocess.cli" in names and "umst_plugin.inspect.__main__" in names, names
    roots = set(loaded_by_import(names)) | set(names) | {"umst_plugin"}
    unreached = unreached_plugin_modules(roots)
    assert not unreached, ("modules of umst_plugin/ that neither `import umst_plugin` nor a user's command loads "
                           "(only tests, benchmarks or umst_dev import them: move them to umst_dev/): "
                           + ", ".join(unreached))


@pytest.mark.parametrize("files,unreached", [
    # a helper only a test imports (the plugin's dev.py once), beside one the plugin imports inside a function
    ({"umst_plugin/__init__.py": "def f():\n    from umst_plugin import used\n", "umst_plugin/used.py": "",
      "umst_plugin/dev.py": "import umst_plugin\n", "tests/test_x.py": "from umst_plugin import dev\n"},
     ["umst_plugin.dev"]),
    # reached through a subpackage module: its package __init__ counts as loaded
    ({"umst_plugin/__init__.py": "import umst_plugin.sub.b\n", "umst_plugin/sub/__init__.py": "",
      "umst_plugin/sub/b.py": ""}, []),
])
def test_the_reach_check_finds_modules_only_tests_import(tmp_path, files, unreached):
    _write(tmp_path, files)
    assert unreached_plugin_modules({"umst_plugin"}, str(tmp_path)) == unreached


# ---- each family in its own folders ------------------------------------------------------------------------------
FAMILY_NAMES = ("msmsa", "prime", "transformer_sf", "msc")  # the four families the count target names
MAX_FILES_NAMING_A_FAMILY = 3


def word_parts(text):
    """The lowercase word parts of ``text``: split at every non-letter-or-digit and at camel-case boundaries
    (``MSMSADecoder`` -> msmsa, decoder; ``prime_simple_big`` -> prime, simple, big; ``MSCOCO`` -> mscoco)."""
    return [p.lower() for p in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+", text)]


def names_family(text, family):
    """Whether ``text`` names ``family``: the family's own word parts (``transformer_sf``: transformer, sf) occur in
    a row among ``text``'s word parts. So ``PrimeLayer``, ``"m30k-transformer-sf"``, ``msc_big`` and
    ``umst_plugin/modules/prime/layer.py`` name a family; ``primer``, ``MSCOCO`` and ``transformers`` do not."""
    parts, wanted = word_parts(text), family.split("_")
    return any(parts[i:i + len(wanted)] == wanted for i in range(len(parts) - len(wanted) + 1))


def code_texts(path):
    """What counts as code in a Python or shell file: Python's NAME tokens and its STRING tokens that are not
    docstrings; a shell file's lines without their comments. Comments and docstrings are prose, not code."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if path.endswith(".sh"):
        return [re.sub(r"(^|\s)#.*", "", line) for line in source.splitlines()]
    texts, previous = [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME:
            texts.append(token.string)
        elif token.type == tokenize.STRING:
            docstring = previous in (None, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
            if not docstring:
                texts.append(token.string)
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return texts


def files_naming(family, root=ROOT):
    """The Python and shell files git tracks that name ``family`` in code, outside the family's own folders
    (``umst_plugin/models/<family>/``, ``umst_plugin/modules/<family>/``) and the tests (``tests/``: a test names
    what it tests)."""
    listed = subprocess.run(["git", "ls-files", "*.py", "*.sh"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.split()
    own = (f"umst_plugin/models/{family}/", f"umst_plugin/modules/{family}/", "tests/")
    return sorted(path for path in listed if not path.startswith(own)
                  and any(names_family(text, family) for text in code_texts(os.path.join(root, path))))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_family_is_named_in_few_files_outside_its_own_folders(family):
    """A sixth encoder touches its own files and one registration: everything else reads the family registry
    (``umst_plugin/families.py``). What may name a family: its paper benchmark and the mutation check's table."""
    found = files_naming(family)
    assert len(found) <= MAX_FILES_NAMING_A_FAMILY, found


def test_the_family_count_reads_names_not_prose(tmp_path):
    assert names_family("PrimeEncoderLayer", "prime") and names_family("'m30k-transformer-sf'", "transformer_sf")
    assert names_family("umst_plugin/modules/msc/layer.py", "msc") and names_family("MSMSADecoder", "msmsa")
    assert not names_family("primer", "prime") and not names_family("'2017 MSCOCO'", "msc")
    assert not names_family("transformer_sfx", "transformer_sf") and not names_family("transformer", "transformer_sf")
    (tmp_path / "a.py").write_text('"""Prime, MSC."""\n# msmsa\nx = 1  # prime\ny = "msc_big"\n')
    (tmp_path / "b.sh").write_text("# prime_base\necho msmsa_base  # prime\n")
    assert [t for t in code_texts(str(tmp_path / "a.py")) if names_family(t, "msc")] == ['"msc_big"']
    assert not any(names_family(t, "prime") for t in code_texts(str(tmp_path / "a.py")))
    b = code_texts(str(tmp_path / "b.sh"))
    assert any(names_family(t, "msmsa") for t in b) and not any(names_family(t, "prime") for t in b)
