"""Which ``F.scaled_dot_product_attention`` backends are exact on this device, for the mask shapes the plugin uses?

For each backend (math, efficient, flash, cudnn; each in its own subprocess, so that a kernel fault in one cannot
hide the others' results), each dtype and each mask form (none; a boolean padding mask B x 1 x 1 x S broadcast
over heads and queries, as UMST's attention passes it; the same as an additive float bias; a materialised
B x H x L x S boolean mask), at key lengths that are and are not multiples of 8: forward and backward against a
float64 reference (relative error of the output and of dq, dk, dv), and with dropout whether the gradients
are finite. Prints one line per case; "unsupported" where the backend refuses the inputs.

    python -m umst_dev.sdpa_backends [--verbose]    # on CUDA (on a CPU: the math backend only)
"""
import collections
import json
import subprocess
import sys

import torch
import torch.nn.functional as F

BACKENDS = ["MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MASKS = ["none", "bool-b11s", "float-b11s", "bool-bhls"]


def case(backend, dtype_name, mask_kind, length, dropout, device="cuda", bsz=64, heads=8, dim=64):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cpu").manual_seed(length)
    q, k, v = (torch.randn(bsz, heads, length, dim, generator=g, dtype=torch.float64) for _ in range(3))
    lengths = torch.randint(1, length + 1, (bsz,), generator=g)
    lengths[0] = length
    pad = torch.arange(length).unsqueeze(0) >= lengths.unsqueeze(1)  # B x S, right padding
    keep = ~pad

    def mask_for(dtype):
        if mask_kind == "none":
            return None
        if mask_kind == "bool-b11s":
            return keep.view(bsz, 1, 1, length).to(device)
        if mask_kind == "float-b11s":
            return torch.zeros(bsz, 1, 1, length, dtype=dtype).masked_fill(pad.view(bsz, 1, 1, length),
                                                                          float("-inf")).to(device)
        return keep.view(bsz, 1, 1, length).expand(bsz, heads, length, length).contiguous().to(device)

    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_mask = mask_for(torch.float64)
    ref = F.scaled_dot_product_attention(*[t.to(device) for t in ref_in],
                                         attn_mask=None if ref_mask is None else ref_mask.to(device))
    grad_out = torch.randn(ref.shape, generator=g, dtype=torch.float64).to(device)
    ref.backward(grad_out)
    dtype = DTYPES[dtype_name]
    ins = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    try:
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            out = F.scaled_dot_product_attention(*ins, attn_mask=mask_for(dtype), dropout_p=dropout)
            out.backward(grad_out.to(dtype))
        if device == "cuda":
            torch.cuda.synchronize()
    except RuntimeError as e:
        msg = str(e).split("\n")[0][:90]
        return "unsupported" if "No available kernel" in msg or "not supported" in msg.lower() else f"error: {msg}"
    finite = all(bool(torch.isfinite(t).all()) for t in [out] + [i.grad for i in ins])
    if dropout:
        return "finite" if finite else "NON-FINITE"
    rel = lambda a, b: float((a.double() - b).norm() / b.norm())  # noqa: E731
    errs = [rel(out, ref)] + [rel(i.grad, r.grad) for i, r in zip(ins, ref_in)]
    return ("" if finite else "NON-FINITE ") + "out/dq/dk/dv rel err " + " ".join(f"{e:.1e}" for e in errs)


def run_backend(backend, device):
    for dtype_name in DTYPES:
        for mask_kind in MASKS:
            for length in (6, 8, 13):
                for dropout in (0.0, 0.1):
                    result = case(backend, dtype_name, mask_kind, length, dropout, device=device)
                    print(json.dumps([dtype_name, mask_kind, length, dropout, result]), flush=True)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if len(sys.argv) > 1 and sys.argv[1] in BACKENDS:
        return run_backend(sys.argv[1], device)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if device == 'cuda' else 'CPU'}")
    verbose = "--verbose" in sys.argv
    for backend in BACKENDS if device == "cuda" else ["MATH"]:
        counts = collections.Counter()
        proc = subprocess.run([sys.executable, "-m", "umst_dev.sdpa_backends", backend], capture_output=True, text=True,
                              timeout=120)
        for line in proc.stdout.strip().splitlines():
            dtype_name, mask_kind, length, dropout, result = json.loads(line)
            if result == "unsupported":
                counts["unsupported"] += 1
                continue
            bad = flagged(dtype_name, result)
            counts["BAD" if bad else "ok"] += 1
            if bad or verbose:
                print(f"{'BAD ' if bad else ''}{backend:<19} {dtype_name} {mask_kind:<10} S={length:<2} "
                      f"p={dropout}: {result}")
        if proc.returncode != 0:
            print(f"{backend}: crashed (rc {proc.returncode}) after the lines above: "
                  f"{(proc.stderr.strip().splitlines() or [''])[-1][:200]}")
        print(f"{backend}: {dict(counts)}")
    return 0


TOLERANCE = {"fp32": 1e-3, "bf16": 3e-2, "fp16": 5e-3}


def flagged(dtype_name, result):
    """A case is bad when it errs, is not finite, or its relative error passes the dtype's tolerance."""
    if result.startswith("error") or "NON-FINITE" in result:
        return True
    if result.startswith("out/dq"):
        return any(float(e) > TOLERANCE[dtype_name] for e in result.split()[-4:])
    return False


if __name__ == "__main__":
    sys.exit(main())
