"""rope_ext.integrations.transformers: a patched copy of a tiny random HF model against the
unpatched original (logits, every parameter gradient, greedy generation with a KV cache).

No hub, no weights: each family is built from its config class. initializer_range 0.2
(not HF's 0.02) makes attention depend strongly on q.k, so a wrong rotation cannot hide
below the tolerances (test_comparison_is_sensitive checks that).
"""
import copy
import io

import pytest
import torch

T = pytest.importorskip("transformers")
from rope_ext.integrations import transformers as rope_hf  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
B, S, NEW = 2, 12, 8
TOK = dict(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# head_dim 16; families with partial rotary use head_dim 32 and R = 16.
DEC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           head_dim=16, max_position_embeddings=64, initializer_range=0.2, **TOK)


def rope(rope_type="default", theta=10000.0, **kw):
    return {"rope_type": rope_type, "rope_theta": theta, **kw}


def vl_text(sections, **kw):
    return dict(DEC, rope_parameters=rope(mrope_section=sections, **kw))


MOE = dict(num_local_experts=4, num_experts_per_tok=2)
QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
QWEN3_VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64,
                    deepstack_visual_indexes=[0], num_position_embeddings=16)


# family: (model class, config class, config kwargs). Scaled variants ride on different families.
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", DEC),
    "llama-llama3": ("LlamaForCausalLM", "LlamaConfig", dict(DEC, rope_parameters=rope(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8))),
    "mistral-yarn": ("MistralForCausalLM", "MistralConfig", dict(DEC, rope_parameters=rope(
        "yarn", factor=4.0, original_max_position_embeddings=16))),
    # max_position_embeddings 8 < S: the dynamic frequencies grow during the forward.
    "qwen2-dynamic": ("Qwen2ForCausalLM", "Qwen2Config", dict(DEC, max_position_embeddings=8,
                                                              rope_parameters=rope("dynamic", factor=2.0))),
    "qwen3-linear": ("Qwen3ForCausalLM", "Qwen3Config", dict(DEC, rope_parameters=rope("linear", factor=2.0))),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", DEC),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(DEC, query_pre_attn_scalar=16)),
    # Local layers: base 10000 (plain); global: base 1e6, linear x8 (as Gemma 3 checkpoints).
    "gemma3-local-global": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        DEC, query_pre_attn_scalar=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": rope(), "full_attention": rope("linear", 1e6, factor=8.0)})),
    # longrope, partial rotary 0.5 of head_dim 32; S = 12 > original 8 picks the long factors.
    "phi3-longrope-partial": ("Phi3ForCausalLM", "Phi3Config", dict(
        DEC, num_attention_heads=2, num_key_value_heads=1, head_dim=32, original_max_position_embeddings=8,
        partial_rotary_factor=0.5, rope_parameters=rope(
            "longrope", partial_rotary_factor=0.5, short_factor=[1.0 + 0.1 * i for i in range(8)],
            long_factor=[2.0 + 0.5 * i for i in range(8)], original_max_position_embeddings=8))),
    "gpt_neox-partial": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
        initializer_range=0.2, rope_parameters=rope(partial_rotary_factor=0.5), **TOK)),
    "gptj-interleaved-partial": ("GPTJForCausalLM", "GPTJConfig", dict(
        n_embd=64, n_layer=2, n_head=2, rotary_dim=16, n_positions=64, initializer_range=0.2, **TOK)),
    # MoE variants: the same seams (top-2 of 4 experts, so the router gets real gradients).
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(DEC, **MOE)),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(DEC, **QWEN_MOE, shared_expert_intermediate_size=32)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(DEC, **QWEN_MOE)),
    # M-RoPE: the text-only path of the VL models (tiny 1-block vision towers, unused).
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLConfig", dict(
        text_config=vl_text([2, 3, 3]),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=1), **TOK)),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", dict(
        text_config=vl_text([4, 2, 2]), vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                                                          out_hidden_size=64, fullatt_block_indexes=[0]), **TOK)),
    "qwen3_vl-interleaved": ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig", dict(
        text_config=vl_text([4, 2, 2], mrope_interleaved=True),
        vision_config=QWEN3_VISION, **TOK)),
    "qwen3_vl_moe": ("Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeConfig", dict(
        text_config=dict(vl_text([4, 2, 2], mrope_interleaved=True), **QWEN_MOE), vision_config=QWEN3_VISION, **TOK)),
}
MROPE = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl-interleaved", "qwen3_vl_moe"}  # fed position_ids [3, B, S]
# q_norm / k_norm fused into rms_norm_rope_qk
FUSED_NORM = {"qwen3-linear", "qwen3_moe", "gemma3-local-global", "qwen3_vl-interleaved", "qwen3_vl_moe"}
LOW_PRECISION = ["llama-llama3", "qwen3-linear", "gemma3-local-global", "gptj-interleaved-partial",
                 "qwen3_vl-interleaved"]


def build(family, dtype=torch.float32, device="cpu"):
    """(reference, patched) copies of one random model."""
    model_cls, config_cls, kw = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(T, model_cls)(getattr(T, config_cls)(**kw))
    with torch.no_grad():  # non-trivial norm weights (Gemma's start at 0, Qwen's at 1) and biases
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    model = model.to(device=device, dtype=dtype).eval()
    return model, rope_hf.patch(copy.deepcopy(model))


def inputs(family, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (B, S), generator=g)
    kw = {}
    if family in MROPE:  # distinct temporal / height / width rows, and per batch entry
        t = torch.arange(S)
        pos = torch.stack([t, t // 3, t % 4 + 2])[:, None, :] + torch.tensor([0, 5])[None, :, None]
        kw["position_ids"] = pos.to(device)
    return ids.to(device), kw


def assert_close(got, want, rtol, what):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert torch.isfinite(got).all(), f"{what}: non-finite"
    assert err <= rtol * scale + 1e-30, f"{what}: max err {err:.3e} vs max |ref| {scale:.3e}"


def assert_grads_close(pat, ref, rtol=2e-5):
    """Every parameter gradient of the patched copy against the reference's (None: unused, e.g. a vision tower)."""
    grads = dict(ref.named_parameters())
    for name, p in pat.named_parameters():
        g0 = grads[name].grad
        if g0 is None:
            assert p.grad is None or not p.grad.any(), name
        else:
            assert_close(p.grad, g0, rtol, f"grad {name}")


@pytest.fixture
def rope_calls(monkeypatch):
    """Counts the rope_ext entry points the patched models call (name -> list of kwargs)."""
    calls = {}
    for name in ("apply_rope_qk", "rms_norm_rope_qk", "apply_rope"):
        fn = getattr(rope_hf, name)

        def spy(*args, _fn=fn, _name=name, **kwargs):
            calls.setdefault(_name, []).append(kwargs)
            return _fn(*args, **kwargs)
        monkeypatch.setattr(rope_hf, name, spy)
    return calls


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_grads(family, rope_calls):
    ref, pat = build(family)
    ids, kw = inputs(family)
    outs = []
    for m in (ref, pat):
        out = m(ids, labels=ids, **kw)
        out.loss.backward()
        outs.append(out)
    assert_close(outs[1].logits, outs[0].logits, 2e-5, "logits")
    assert_grads_close(pat, ref)
    # The rope went through rope_ext: one call per layer and forward (GPT-J: k and q apart).
    gptj = family.startswith("gptj")
    want = "apply_rope" if gptj else "rms_norm_rope_qk" if family in FUSED_NORM else "apply_rope_qk"
    layers = 2
    assert {k: len(v) for k, v in rope_calls.items()} == {want: layers * (2 if gptj else 1)}
    if family in MROPE:
        interleaved = family.startswith("qwen3")
        assert all(c["sections"] and c["sections_interleaved"] == interleaved for c in rope_calls[want])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_kv_cache(family):
    ref, pat = build(family)
    # A 6-token prompt and 8 new tokens cross Phi-3's original 8 (short -> long factors)
    # and Qwen2's max_position_embeddings 8 (dynamic growth) during decoding. The second
    # prompt is left-padded: its positions differ from the first's.
    ids, _ = inputs(family, seed=2)
    ids = ids[:, :6].clone()
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = TOK["pad_token_id"]
    kw = dict(max_new_tokens=NEW, do_sample=False, attention_mask=mask)
    with torch.no_grad():
        want = ref.generate(ids, **kw)
        got = pat.generate(ids, **kw)
    assert torch.equal(got, want), f"{family}: {got.tolist()} != {want.tolist()}"


@pytest.mark.parametrize("family", LOW_PRECISION)
@pytest.mark.parametrize("device,dtype", [("cpu", torch.bfloat16)] +
                         [("cuda", dt) for dt in (torch.float32, torch.bfloat16) if "cuda" in DEVICES])
def test_logits_low_precision_and_cuda(family, device, dtype):
    ref, pat = build(family, device=device)
    ids, kw = inputs(family, device)
    with torch.no_grad():
        truth = ref(ids, **kw).logits
        if dtype == torch.float32:
            assert_close(pat(ids, **kw).logits, truth, 2e-5, f"{family} {device}")
            return
        want, got = ref.to(dtype)(ids, **kw).logits, pat.to(dtype)(ids, **kw).logits
    assert got.dtype == want.dtype == dtype
    # bf16: HF rounds cos/sin and every product to bf16, rope_ext rounds once; either way the
    # logits stay as close to the fp32 model's as HF's own bf16 logits are.
    err_hf = (want.float() - truth).abs().max().item()
    err = (got.float() - truth).abs().max().item()
    assert err <= 2 * err_hf + 1e-3 * truth.abs().max().item(), (family, device, err, err_hf)
    assert_close(got, want, 5e-2, f"{family} {device} {dtype}")


def test_comparison_is_sensitive():
    """Positions 2x as far apart change the logits far beyond the tolerances used above."""
    for family in ("llama", "gptj-interleaved-partial", "qwen3_vl-interleaved"):
        _, pat = build(family)
        ids, kw = inputs(family)
        pos = kw.get("position_ids", torch.arange(S)[None].expand(B, S))
        with torch.no_grad():
            a = pat(ids, position_ids=pos).logits
            b = pat(ids, position_ids=2 * pos).logits
        assert (a - b).abs().max() > 1e-2 * a.abs().max(), family


def test_gradient_checkpointing_fused_norm():
    ref, pat = build("qwen3-linear")
    ids, _ = inputs("qwen3-linear")
    for m in (ref, pat):
        # activation_checkpointing_enable: the name in newer versions (gradient_... deprecated)
        (getattr(m, "activation_checkpointing_enable", None) or m.gradient_checkpointing_enable)()
        m.train()
        m(ids, labels=ids).loss.backward()
    assert_grads_close(pat, ref)


def test_patch_is_idempotent_and_unpatch_restores():
    ref, pat = build("gemma3-local-global")
    ids, _ = inputs("gemma3-local-global")
    with torch.no_grad():
        once = pat(ids).logits
        assert rope_hf.patch(pat) is pat and rope_hf.is_patched(pat)
        twice = pat(ids).logits
        torch.testing.assert_close(twice, once, rtol=0, atol=0)
        import transformers.models.gemma3.modeling_gemma3 as mod
        inner = mod.apply_rotary_pos_emb._rope_ext_original
        assert not hasattr(inner, "_rope_ext_original")  # wrapped once
        buf = io.BytesIO()  # a whole patched model pickles (torch.save) and deep-copies, patched
        torch.save(pat, buf)
        buf.seek(0)
        for dup in (torch.load(buf, weights_only=False), copy.deepcopy(pat)):
            assert rope_hf.is_patched(dup) and dup.model.rotary_emb.forward.module is dup.model.rotary_emb
            torch.testing.assert_close(dup(ids).logits, once, rtol=0, atol=0)
        assert rope_hf.unpatch(pat) is pat and not rope_hf.is_patched(pat)
        torch.testing.assert_close(pat(ids).logits, ref(ids).logits, rtol=0, atol=0)
        cos, sin = pat.model.rotary_emb(torch.zeros(1), torch.arange(4)[None], "full_attention")
        assert isinstance(cos, torch.Tensor)


def test_unsupported_architecture():
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=1, n_head=2, **TOK))
    with pytest.raises(ValueError, match=r"unsupported architecture GPT2LMHeadModel.*llama.*qwen3_vl"):
        rope_hf.patch(model)
    llama, _ = build("llama")
    with pytest.raises(ValueError, match="unsupported architecture 'bogus'"):
        rope_hf.patch(llama, architecture="bogus")
    with pytest.raises(ValueError, match="no transformers.models.qwen3 modules"):
        rope_hf.patch(llama, architecture="qwen3")
    assert not rope_hf.is_patched(llama)
    # A rotary module without its family's attention (borrowed by other code) is left alone.
    borrowed = torch.nn.Sequential(llama.model.rotary_emb)
    with pytest.raises(ValueError, match="found no rotary embedding of llama in Sequential"):
        rope_hf.patch(borrowed)
    with pytest.raises(TypeError, match="rope_ext: patch"):
        rope_hf.patch("llama")


def test_nothing_half_patched():
    """A check failing on the last layer leaves every earlier layer unpatched."""
    ref, _ = build("qwen3-linear")
    ref.model.layers[-1].self_attn.k_norm = torch.nn.Identity()  # nothing to fuse
    with pytest.raises(ValueError, match=r"cannot fuse model\.layers\.1\.self_attn\.k_norm"):
        rope_hf.patch(ref)
    assert not rope_hf.is_patched(ref)


def test_torch_compile_fullgraph():
    """Carriers, the wrapped forwards and the fused norm trace into one graph, forward and backward."""
    family = "qwen3_vl-interleaved"
    ref, pat = build(family)
    ids, kw = inputs(family)
    compiled = torch.compile(pat, fullgraph=True, backend="aot_eager")
    outs = []
    for m in (ref, compiled):
        out = m(ids, labels=ids, **kw)
        out.loss.backward()
        outs.append(out)
    assert_close(outs[1].logits, outs[0].logits, 2e-5, "logits")
    assert_grads_close(pat, ref)
