"""How long compiling took, and what it reused: dynamo's graph count and compile seconds, inductor's and
AOTAutograd's cache hits and misses, logged per compiled call (:func:`log_compiled`) and per span
(:class:`CompileTimeLog`). fairseq-train's per-update line is ``flags``'s."""
import logging

import torch

logger = logging.getLogger(__package__)


def compiled_graphs():
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters  # (the compiler: imported only once something compiles)

    return int(counters["stats"]["unique_graphs"])


def compile_seconds():
    """Seconds dynamo and inductor have spent compiling in this process so far (forward and backward graphs)."""
    from torch._dynamo import utils

    spent = utils.calculate_time_spent()
    if "total_wall_time" in spent:
        return float(spent["total_wall_time"])
    return float(spent.get("entire_frame_compile", 0.0)) + float(spent.get("entire_backward_compile", 0.0))


def cache_counts():
    """(hits, misses) of inductor's FX graph cache and AOTAutograd's cache in this process so far. A graph
    AOTAutograd's cache left out (a bypass) counts as a miss: its forward + backward were traced again."""
    from torch._dynamo.utils import counters

    aot = counters["aot_autograd"]
    hits = counters["inductor"]["fxgraph_cache_hit"] + aot["autograd_cache_hit"]
    misses = counters["inductor"]["fxgraph_cache_miss"] + aot["autograd_cache_miss"] + aot["autograd_cache_bypass"]
    return int(hits), int(misses)


def cache_word(hits, misses):
    return "cache warm" if hits and not misses else ("cache cold" if not hits else "cache partly warm")


def log_compiled(layer, forward, seconds, graphs):
    """A compiled call that compiled something: the layer class, the mode, the seconds it took."""
    mode = ("training" if layer.training else "evaluation") + (
        ", autograd" if torch.is_grad_enabled() else ", no autograd")
    logger.info("--compile: %s compiled in %.1f s (%s; %d new graph(s), %d in this process, %.1f s of compiling)",
                forward.__qualname__, seconds, mode, graphs, compiled_graphs(), compile_seconds())


class CompileTimeLog:
    """Compile seconds and graphs since it was made: ``log.summary(what)`` logs them (once)."""

    def __init__(self):
        self.graphs, self.seconds = compiled_graphs(), compile_seconds()

    def since(self):
        return compiled_graphs() - self.graphs, compile_seconds() - self.seconds

    def summary(self, what):
        graphs, seconds = self.since()
        logger.info("--compile: %s compiled %d graph(s) in %.1f s", what, graphs, seconds)
        return graphs, seconds
