"""Compiled code kept with the run: fairseq-train keeps inductor's caches under ``SAVE_DIR/compile_cache``, so a
resumed or requeued run compiles from them (:func:`use_cache_dir`)."""
import functools
import os

CACHE_DIRNAME = "compile_cache"
# the directory use_cache_dir put in TORCHINDUCTOR_CACHE_DIR (torch reads the variable), also named here so that a
# process started from this one (a test's or a script's fairseq-train) does not take it for the user's choice
_SET_BY_PLUGIN = "UMST_PLUGIN_INDUCTOR_CACHE_DIR"


def user_cache_dir(environ):
    """The ``TORCHINDUCTOR_CACHE_DIR`` the user chose, from the environment the process started with, or None.
    Two values found there are not the user's choice and count as unset: the directory this plugin put there
    (named in ``UMST_PLUGIN_INDUCTOR_CACHE_DIR``), and torch's default directory, which torch itself writes into
    ``os.environ`` at a process's first compile (``torch._inductor.runtime.cache_dir_utils.cache_dir``), so that
    every process started after it (a test's or a script's fairseq-train) inherits it."""
    chosen = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or chosen == environ.get(_SET_BY_PLUGIN):
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # (the compiler: only where one is set)

    if os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        return None
    return chosen


# read once, as the plugin is imported: the environment the process started with (not a setting that changes)
USER_CACHE_DIR = user_cache_dir(os.environ)


def use_cache_dir(directory):
    """Keep inductor's on-disk caches in ``directory`` (the run's ``SAVE_DIR/compile_cache``): its compiled graphs
    (the FX graph cache, C++ or Triton kernels included), AOTAutograd's forward + backward cache and dynamo's
    profile of which sizes are dynamic. A resumed or requeued run of the same command finds them there and skips
    inductor's code generation and kernel compilation (dynamo still traces each layer class once, in seconds).
    ``TORCHINDUCTOR_CACHE_DIR`` set by the user wins. Call before the first compile of the process. Returns
    (the directory in use, how many cached graphs it holds)."""
    if USER_CACHE_DIR:
        directory = USER_CACHE_DIR
    else:
        directory = os.path.abspath(directory)
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != directory:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory  # torch reads it at every cache access
            os.environ[_SET_BY_PLUGIN] = directory
            from torch._inductor.utils import clear_caches

            clear_caches()  # (in-memory caches of the previous directory's paths)
    os.makedirs(directory, exist_ok=True)
    return directory, cached_graphs(directory)


def cached_graphs(directory):
    """How many compiled graphs inductor's FX graph cache holds under ``directory``."""
    root = os.path.join(directory, "fxgraph")
    return sum(len(files) for _, _, files in os.walk(root)) if os.path.isdir(root) else 0


# the plugin's changes to what torch's compiler generates: inductor's cache keys do not see them
COMPILER_PATCHES = ("umst_plugin.patches.partition_symbols", "umst_plugin.patches.inductor_scan",
                    "umst_plugin.patches.saved_activation_strides")


@functools.lru_cache(maxsize=None)
def compiler_patches_key():
    """A hash of the source of :data:`COMPILER_PATCHES`: it changes where one of them changes. Read once per
    process (inductor asks for the key at every graph it compiles or looks up)."""
    import hashlib
    import importlib
    import inspect

    digest = hashlib.sha256()
    for name in COMPILER_PATCHES:
        digest.update(inspect.getsource(importlib.import_module(name)).encode())
    return digest.hexdigest()[:16]


def key_caches_on_compiler_patches():
    """Make inductor's on-disk caches (its compiled graphs and AOTAutograd's forward + backward) keyed on the
    plugin's patches of the compiler, through a post-grad pass that changes nothing and names
    :func:`compiler_patches_key` as its ``uuid`` (the key torch's documentation gives custom passes). Without it a
    cache written before a patch or under another version of it is loaded as if the patch made no difference: a
    cache from before ``saved_activation_strides`` still gave the backward that patch fixes. Where the user set a
    post-grad pass of their own, theirs stays and the key is theirs. Returns whether the plugin's pass is set."""
    import torch._inductor.config as inductor_config

    if inductor_config.post_grad_custom_post_pass is None:
        inductor_config.post_grad_custom_post_pass = _compiler_patches_pass_class()()
    return isinstance(inductor_config.post_grad_custom_post_pass, _compiler_patches_pass_class())


@functools.lru_cache(maxsize=None)
def _compiler_patches_pass_class():
    """The pass's class, made once inductor is imported (importing it costs seconds: only where --compile is on)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class CompilerPatchesKey(CustomGraphPass):
        """A post-grad pass that leaves the graph as it is; its uuid keys inductor's caches on the plugin's
        compiler patches (:func:`key_caches_on_compiler_patches`)."""

        def __call__(self, graph):
            return None

        def uuid(self):
            return f"umst_plugin compiler patches {compiler_patches_key()}"

    return CompilerPatchesKey
