"""Compiled code kept with the run: fairseq-train keeps inductor's caches under ``SAVE_DIR/compile_cache``, so a
resumed or requeued run compiles from them (:func:`use_cache_dir`)."""
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
