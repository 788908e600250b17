"""AOTAutograd's on-disk cache with ``--compile``'s settings (``dispatch.allow_custom_functions_in_autograd_cache``):
a graph that calls a custom autograd Function is cached (torch's default leaves it out), the next process takes
it from the cache, and a Function whose backward changed compiles anew instead of taking the stale entry. Two
fresh processes on one cache directory (tests/compile_cache_probe.py). That every arch's layers hit the cache in
a resumed fairseq-train: tests/test_compile_stream.py (Prime's layer and convolution are custom Functions: no
misses on resume, a left-out graph counting as one)."""
import os
import subprocess
import sys

import torch

import e2e

HERE = os.path.dirname(os.path.abspath(__file__))


def probe(cache_dir, out, *scales):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "PYTHONPATH": e2e.ROOT}
    env.pop("TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD", None)  # (the user's switch; off would bypass)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "compile_cache_probe.py"), str(out),
                           *map(str, scales)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return torch.load(out)


def test_a_graph_with_a_custom_function_is_cached_and_a_changed_backward_compiles_anew(tmp_path):
    x = torch.linspace(-1, 1, 5)
    expected = {scale: (2 * x).cos() * 2 * scale for scale in (2.0, 3.0)}
    [first] = probe(tmp_path / "cache", tmp_path / "first.pt", 2.0)
    assert first["counters"].get("autograd_cache_bypass", 0) == 0, first["counters"]
    assert first["counters"]["autograd_cache_saved"] == 1, first["counters"]
    torch.testing.assert_close(first["grad"], expected[2.0])
    same, changed = probe(tmp_path / "cache", tmp_path / "second.pt", 2.0, 3.0)
    assert same["counters"]["autograd_cache_hit"] == 1 and not same["counters"].get("autograd_cache_miss"), same
    torch.testing.assert_close(same["grad"], expected[2.0])
    # the same forward, a backward that scales by 3: not the entry for 2
    assert changed["counters"]["autograd_cache_hit"] == 1 and changed["counters"]["autograd_cache_miss"] == 1, changed
    torch.testing.assert_close(changed["grad"], expected[3.0])


def test_the_caches_are_keyed_on_the_plugin_s_compiler_patches(tmp_path, monkeypatch):
    """``--compile`` keys inductor's compiled graphs and AOTAutograd's forward + backward on the source of the
    plugin's compiler patches (``cache.key_caches_on_compiler_patches``): the same graph is taken from the cache
    under the same patches and compiled anew under changed ones, whose entry then serves them in turn. (A cache
    written before ``patches/saved_activation_strides.py`` gave the failing backward it fixes.)"""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import clear_caches

    from umst_plugin.compilation import cache, dispatch

    dispatch.configure_dynamo()
    assert cache.key_caches_on_compiler_patches()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    clear_caches()

    def f(x):
        return (x.sin() * 3).relu().sum()

    def compile_and_count():
        torch._dynamo.reset()
        counters.clear()
        x = torch.linspace(-1, 1, 7, requires_grad=True)
        torch.compile(f)(x).backward()
        torch.testing.assert_close(x.grad, torch.where(x.sin() > 0, 3 * x.cos(), 0 * x))
        return counters["aot_autograd"]["autograd_cache_hit"], counters["aot_autograd"]["autograd_cache_miss"]

    assert compile_and_count() == (0, 1)
    assert compile_and_count() == (1, 0)  # the same patches: from the cache
    monkeypatch.setattr(cache, "compiler_patches_key", lambda: "another version of the patches")
    assert compile_and_count() == (0, 1)  # not the entry compiled under the others
    assert compile_and_count() == (1, 0)
    monkeypatch.undo()
    clear_caches()
