"""The reusable model checks, over every architecture of the plugin.

Each architecture adds one line to ARCH_CASES with tiny overrides.
"""
import pytest
import torch

import model_checks as checks

TINY_TRANSFORMER = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16,
                        encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
                        decoder_attention_heads=2)

ARCH_CASES = [
    pytest.param("transformer", TINY_TRANSFORMER, id="transformer"),
    pytest.param("transformer", {**TINY_TRANSFORMER, "encoder_normalize_before": True,
                                 "decoder_normalize_before": True}, id="transformer-prenorm"),
    pytest.param("prime_base", {**TINY_TRANSFORMER, "prime_kernels": "3,15"}, id="prime_base"),
    pytest.param("prime_big", {**TINY_TRANSFORMER, "prime_kernels": "3,7"}, id="prime_big"),
    pytest.param("prime_simple_base", TINY_TRANSFORMER, id="prime_simple_base"),
    pytest.param("prime_simple_big", TINY_TRANSFORMER, id="prime_simple_big"),
    pytest.param("transformer_sf_base", {**TINY_TRANSFORMER, "fast_embed_dim": 8, "fast_ffn_embed_dim": 16,
                                         "fast_attention_heads": 2}, id="transformer_sf_base"),
    pytest.param("transformer_sf_big", {**TINY_TRANSFORMER, "fast_embed_dim": 8, "fast_ffn_embed_dim": 16,
                                        "fast_attention_heads": 2, "dropout": 0.3}, id="transformer_sf_big"),
    pytest.param("transformer_sf_fast_only_base", {**TINY_TRANSFORMER, "fast_embed_dim": 8, "fast_ffn_embed_dim": 16,
                                                   "fast_attention_heads": 2}, id="transformer_sf_fast_only_base"),
    pytest.param("transformer_sf_fast_only_big", {**TINY_TRANSFORMER, "fast_embed_dim": 8, "fast_ffn_embed_dim": 16,
                                                  "fast_attention_heads": 2, "dropout": 0.3},
                 id="transformer_sf_fast_only_big"),
    pytest.param("msc_iwslt_de_en", dict(encoder_blocks=2, encoder_layers_per_block=2, **{k: v for k, v in TINY_TRANSFORMER.items() if k not in ("encoder_layers", "decoder_layers")}), id="msc_iwslt_de_en"),
    pytest.param("msc_base", dict(encoder_blocks=2, encoder_layers_per_block=2, msc_fusion="add", context_cell="ffn", **{k: v for k, v in TINY_TRANSFORMER.items() if k not in ("encoder_layers", "decoder_layers")}), id="msc_base-add-ffn"),
    pytest.param("msc_big", dict(encoder_blocks=2, encoder_layers_per_block=2, no_block_collaboration=True, no_context_attention=True, **{k: v for k, v in TINY_TRANSFORMER.items() if k not in ("encoder_layers", "decoder_layers")}), id="msc_big-noblock-noctxattn"),
    pytest.param("msmsa_base", {**TINY_TRANSFORMER, "msmsa_scales": "1,3,N/4,N/2", "msmsa_min_block": 2},
                 id="msmsa_base"),
    pytest.param("msmsa_big", {**TINY_TRANSFORMER, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                               "msmsa_scales": "1,3,N/4,N/2", "msmsa_min_block": 2, "msmsa_decoder": True},
                 id="msmsa_big-decoder"),
    pytest.param("umst_base_rpr", {**TINY_TRANSFORMER, "max_relative_positions": 4}, id="umst"),
    pytest.param("umst_base", {**TINY_TRANSFORMER, "phrase_gcn_form": "authors", "word_downsample": "scaled-sum",
                               "rsan_upsample_norm": "literal"}, id="umst-authors-forms"),
]

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("left_pad", [True, False], ids=["left-pad", "right-pad"])
@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_batch_and_padding_invariance(arch, overrides, left_pad, device):
    checks.check_padding_invariance(arch, overrides, left_pad_source=left_pad, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_incremental_decoding_matches_full(arch, overrides, device):
    checks.check_incremental_decoding(arch, overrides, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_every_parameter_gets_gradient(arch, overrides, device):
    checks.check_every_parameter_gets_gradient(arch, overrides, device=device)


# fairseq's own lightconv (the DynamicConv rows of the Prime tables) joins the plugin's archs here: its
# unused conv_bias was uninitialized memory until umst_plugin.patches.lightconv_conv_bias.
LIGHTCONV = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16,
                 encoder_conv_dim=16, decoder_conv_dim=16, encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
                 encoder_attention_heads=2, decoder_attention_heads=2, encoder_kernel_size_list="[3,5]",
                 decoder_kernel_size_list="[3,5]", encoder_conv_type="dynamic", decoder_conv_type="dynamic")


@pytest.mark.parametrize("arch,overrides", ARCH_CASES + [pytest.param("lightconv", LIGHTCONV, id="lightconv-dynamic")])
def test_parameters_defined_on_construction(arch, overrides):
    checks.check_parameters_defined_on_construction(arch, overrides)


@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_dropout_off_in_eval(arch, overrides):
    checks.check_dropout_off_in_eval(arch, overrides)


@pytest.mark.parametrize("dtype,device", [(torch.bfloat16, "cpu"), pytest.param(torch.float16, "cuda", marks=pytest.mark.cuda),
                                          pytest.param(torch.bfloat16, "cuda", marks=pytest.mark.cuda)],
                         ids=["bf16-cpu", "fp16-cuda", "bf16-cuda"])
@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_low_precision_no_nan(arch, overrides, dtype, device):
    checks.check_low_precision(arch, overrides, dtype, device)


@pytest.mark.parametrize("dtype,device", [(torch.float16, "cpu"), (torch.bfloat16, "cpu"),
                                          pytest.param(torch.float16, "cuda", marks=pytest.mark.cuda),
                                          pytest.param(torch.bfloat16, "cuda", marks=pytest.mark.cuda)],
                         ids=["fp16-cpu", "bf16-cpu", "fp16-cuda", "bf16-cuda"])
@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_autocast_train_step_and_beam_decoding(arch, overrides, dtype, device):
    checks.check_autocast(arch, overrides, dtype, device)


@pytest.fixture(scope="module")
def ddp_results():
    """Every case's DDP check, run in one pair of processes (model_checks.check_ddp_cases)."""
    return checks.check_ddp_cases([(case.id, *case.values) for case in ARCH_CASES])


@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_ddp_gloo_two_processes(arch, overrides, ddp_results, request):
    error = ddp_results[request.node.callspec.id]
    assert error is None, error


def at_least_8_dims_per_head(overrides):
    """torch's fused CUDA attention kernels need head dims of 8 or more; below that torch runs its math path,
    which upcasts to fp32 (seen on an H100 with MSMSA's 4 heads of 4 and TranSFormer's fast heads of 4 at test
    width): widen those configurations for the CUDA check (at base width every head has 32 or more dims)."""
    out = dict(overrides)
    for prefix, heads in (("encoder", "encoder_attention_heads"), ("decoder", "decoder_attention_heads"),
                          ("fast", "fast_attention_heads")):
        dim = out.get(f"{prefix}_embed_dim")
        if dim and out.get(heads) and dim // out[heads] < 8:
            out[f"{prefix}_embed_dim"] = 8 * out[heads]
            if f"{prefix}_ffn_embed_dim" in out:
                out[f"{prefix}_ffn_embed_dim"] = 16 * out[heads]
    if out.get("encoder_embed_dim") != out.get("decoder_embed_dim"):  # shared embeddings need one width
        width = max(out.get("encoder_embed_dim") or 0, out.get("decoder_embed_dim") or 0)
        out["encoder_embed_dim"] = out["decoder_embed_dim"] = width
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_backward_runs_in_the_autocast_dtype(arch, overrides, device):
    if device == "cuda":
        overrides = at_least_8_dims_per_head(overrides)
    checks.check_backward_in_autocast_dtype(arch, overrides, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch,overrides", ARCH_CASES)
def test_no_host_syncs_from_the_plugin(arch, overrides, device):
    checks.check_no_plugin_host_syncs(arch, overrides, device=device)
