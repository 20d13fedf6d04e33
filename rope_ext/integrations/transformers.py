"""rope_ext inside HF transformers models: `patch(model)` swaps the rotary position
embedding of a loaded model for rope_ext's kernels (q and k in one launch, sin/cos in the
kernel, no cos/sin tables), and the q/k RMSNorm of Qwen3 / Gemma 3 for the fused
`rms_norm_rope_qk`.

    from rope_ext.integrations.transformers import patch
    model = patch(AutoModelForCausalLM.from_pretrained(...))

Seams (the same in transformers 5.0, 5.17 and 5.23, and none needs a copy of HF's
attention code):

1. The rotary-embedding module (`model.model.rotary_emb`, a `<Family>RotaryEmbedding`).
   Its forward is replaced, on the instance, by one returning a `RopeCarrier` in place of
   both cos and sin: `position_ids`, the module's own `inv_freq` buffer and
   `attention_scaling` (what HF itself would use: every rope_type's init function,
   partial_rotary_factor, Gemma 3's per-layer-type `<type>_inv_freq`), and for M-RoPE the
   sections. The new forward runs inside HF's own `dynamic_rope_update`, so "dynamic" and
   "longrope" still update `inv_freq` from the positions exactly as in HF.
2. The modeling module's `apply_rotary_pos_emb` global (and `apply_multimodal_rotary_pos_emb`
   where a version has it), which every attention forward calls with
   `(q, k, cos, sin, unsqueeze_dim)`. It is replaced by a function that rotates with
   rope_ext when given carriers and calls HF's original otherwise, so unpatched models of
   the same family in the process are unaffected. Nothing else reads cos/sin in these
   families (the KV cache gets no cache_kwargs in 5.x; Phi-3 / GPT-NeoX read the rotary
   dim from `cos.shape`, inside the function replaced).
3. q_norm / k_norm (Qwen3, Qwen3-MoE, Qwen3-VL: RMSNorm * weight; Gemma 3: * (1 + weight)).
   The attention module's forward is wrapped (HF's forward still runs, unchanged): when its
   `position_embeddings` are carriers, the wrapper hands the norms to the carriers and makes
   q_norm / k_norm pass-through for that call, so the replaced `apply_rotary_pos_emb`
   computes norm + rope in one `rms_norm_rope_qk`. Called with real cos/sin, everything is
   HF's. At patch time each norm is checked on a probe input against the formula fused.
4. GPT-J has no rotary module: its attention gathers a sin/cos table and calls its own
   `apply_rotary_pos_emb(tensor, sin, cos)` for k and q (GPT-J pairs). Its attention forward
   is wrapped to note `position_ids` (a thread-local stack), and the replaced function
   rotates with rope_ext (interleaved=True, base 10000) from them.

Forwards are replaced as instance attributes (`module.forward = _Forward(name, module)`),
the classes are untouched: `unpatch(model)` removes them; `copy.deepcopy` and `torch.save`
of a patched model give a patched model. Every target is found and checked before anything
changes, so an error leaves the model as it was; patching twice is a no-op. Traces with
torch.compile(fullgraph=True), forward and backward.

Limitations: the replaced module globals stay after `unpatch` (they defer to HF for real
cos/sin). Where attention modules keep HF's function as `rotary_fn` (5.0; or with the
`kernels` package), a patched model's are pointed at the replacement, but pickling an
unpatched model of a patched family in the same process fails (pickle finds the
replacement under HF's name). Other RoPE families inside one model (e.g. a vision tower's
2-D RoPE) keep HF's implementation.
"""
import functools
import inspect
import sys
import threading

import torch

from ..api import apply_rope, apply_rope_qk
from ..frequencies import inv_freq as _inv_freq
from ..norm_rope import rms_norm_rope, rms_norm_rope_qk

# family (the package under transformers.models) -> options. mrope: M-RoPE layout of the
# text model (positions [3, B, S]); qk_norm: the weight offset of its q/k RMSNorm, fused.
_FAMILIES = {
    "llama": {},
    "mistral": {},
    "mixtral": {},
    "qwen2": {},
    "qwen2_moe": {},
    "qwen3": {"qk_norm": 0.0},
    "qwen3_moe": {"qk_norm": 0.0},
    "gemma": {},
    "gemma2": {},
    "gemma3": {"qk_norm": 1.0},
    "phi3": {},
    "gpt_neox": {},
    "gptj": {"gptj": True},
    "qwen2_vl": {"mrope": "contiguous"},
    "qwen2_5_vl": {"mrope": "contiguous"},
    "qwen3_vl": {"mrope": "interleaved", "qk_norm": 0.0},
    "qwen3_vl_moe": {"mrope": "interleaved", "qk_norm": 0.0},
}
SUPPORTED = tuple(_FAMILIES)

_APPLY_NAMES = ("apply_rotary_pos_emb", "apply_multimodal_rotary_pos_emb")
_GPTJ_BASE = 10000.0  # GPT-J's sin/cos table (create_sinusoidal_positions) hard-codes it


class RopeCarrier:
    """Stands in for HF's cos and sin: what rope_ext needs to rotate q and k.

    positions: position_ids, [B, S] / [1, S] ([3, B, S] for M-RoPE). inv_freq: float32
    [R / 2] on the activations' device (R = rotary dim). attention_factor: HF's
    attention_scaling. sections / sections_interleaved: M-RoPE. norm: (q_norm, k_norm,
    weight_offset) when the q/k RMSNorm is fused here (set per attention call).
    """
    __slots__ = ("positions", "inv_freq", "attention_factor", "sections", "sections_interleaved", "norm")

    def __init__(self, positions, inv_freq, attention_factor, sections=None, sections_interleaved=False, norm=None):
        self.positions = positions
        self.inv_freq = inv_freq
        self.attention_factor = attention_factor
        self.sections = sections
        self.sections_interleaved = sections_interleaved
        self.norm = norm

    @property
    def rotary_dim(self):
        return 2 * self.inv_freq.shape[0]

    def with_norm(self, norm):
        return RopeCarrier(self.positions, self.inv_freq, self.attention_factor, self.sections,
                           self.sections_interleaved, norm)

    def __getattr__(self, name):
        # Only for names the carrier lacks: code that wanted HF's cos/sin tensors got a carrier.
        raise AttributeError(f"rope_ext: a RopeCarrier (from rope_ext.integrations.transformers.patch) stands in "
                             f"for cos/sin here and has no {name!r}: the code reading it is not covered by the patch; "
                             "unpatch(model) restores HF's cos/sin")

    def __repr__(self):
        return (f"RopeCarrier(positions={tuple(self.positions.shape)}, rotary_dim={self.rotary_dim}, "
                f"attention_factor={self.attention_factor}, sections={self.sections}, "
                f"fused_norm={self.norm is not None})")


# ---------------------------------------------------------------- forwards set on instances

def _call_inner(module, *args, **kwargs):
    """The forward that was in place before patching (an instance one, e.g. accelerate's, or the class's)."""
    inner = module.__dict__.get("_rope_ext_inner")
    if inner is not None:
        return inner(*args, **kwargs)
    return type(module).forward(module, *args, **kwargs)


def _rotary_forward(self, x, position_ids, layer_type=None):
    # Gemma 3 keeps one frequency set per layer type: <type>_inv_freq, <type>_attention_scaling.
    prefix = "" if layer_type is None else f"{layer_type}_"
    inv_freq = getattr(self, prefix + "inv_freq").to(device=x.device, dtype=torch.float32)
    scale = getattr(self, prefix + "attention_scaling")
    sections, interleaved = self._rope_ext_mrope
    if sections is not None and position_ids.dim() == 2:
        position_ids = position_ids.expand(len(sections), -1, -1)  # as HF: text tokens, all axes equal
    c = RopeCarrier(position_ids, inv_freq, float(scale), sections, interleaved)
    return c, c


_rotary_forward_hf = None  # _rotary_forward inside HF's dynamic_rope_update (built on first use)


def _rotary_forward_dynamic(self, x, position_ids, layer_type=None):
    # HF's decorator updates inv_freq for "dynamic" / "longrope" from the positions, as in HF's forward.
    global _rotary_forward_hf
    if _rotary_forward_hf is None:
        try:
            from transformers.modeling_rope_utils import dynamic_rope_update
        except ImportError:  # no dynamic rope types in this version: nothing to update
            _rotary_forward_hf = _rotary_forward
        else:
            _rotary_forward_hf = dynamic_rope_update(_rotary_forward)
    if layer_type is None:  # older decorators take no layer_type
        return _rotary_forward_hf(self, x, position_ids)
    return _rotary_forward_hf(self, x, position_ids, layer_type)


def _find_carriers(args, kwargs):
    """(where, (cos, sin)) of the position embeddings if they are carriers, else (None, None)."""
    pe = kwargs.get("position_embeddings")
    if isinstance(pe, (tuple, list)) and pe and isinstance(pe[0], RopeCarrier):
        return "position_embeddings", pe
    for i, a in enumerate(args):
        if isinstance(a, (tuple, list)) and len(a) == 2 and isinstance(a[0], RopeCarrier):
            return i, a
    return None, None


def _qk_norm_attention_forward(self, *args, **kwargs):
    where, pe = _find_carriers(args, kwargs)
    if where is None:  # real cos/sin: HF's path, norms included
        return _call_inner(self, *args, **kwargs)
    norm = (self.q_norm, self.k_norm, self._rope_ext_norm_offset)
    pe = tuple(c.with_norm(norm) if isinstance(c, RopeCarrier) else c for c in pe)
    if isinstance(where, str):
        kwargs[where] = pe
    else:
        args = args[:where] + (pe,) + args[where + 1:]
    self.q_norm._rope_ext_defer = self.k_norm._rope_ext_defer = True
    try:
        return _call_inner(self, *args, **kwargs)
    finally:
        self.q_norm._rope_ext_defer = self.k_norm._rope_ext_defer = False


def _deferred_norm_forward(self, x, *args, **kwargs):
    # Pass-through while the attention's rope application does the norm (fused).
    if self.__dict__.get("_rope_ext_defer", False):
        return x
    return _call_inner(self, x, *args, **kwargs)


_gptj_state = threading.local()  # .stack: (position_ids, table dim) of the GPT-J attention calls running


def _gptj_stack():
    s = getattr(_gptj_state, "stack", None)
    if s is None:
        s = _gptj_state.stack = []
    return s


def _gptj_attention_forward(self, *args, **kwargs):
    i = self._rope_ext_pos_index
    if "position_ids" in kwargs:
        pos = kwargs["position_ids"]
    else:
        pos = args[i] if i is not None and i < len(args) else None
    if pos is None:
        return _call_inner(self, *args, **kwargs)
    stack = _gptj_stack()
    stack.append((pos, self.pos_embd_dim))
    try:
        return _call_inner(self, *args, **kwargs)
    finally:
        stack.pop()


def _gptj_rotary_forward(self, x, position_ids, *args, **kwargs):
    """transformers >= 5.2x: GPT-J's rotary module (GPTJRotaryEmbedding) returns (sin, cos)
    gathered from its table; here one carrier stands in for both (the frequencies of its
    table, base 10000 over pos_embd_dim, cached per device)."""
    if args or kwargs or not isinstance(position_ids, torch.Tensor):
        return _call_inner(self, x, position_ids, *args, **kwargs)
    freqs = self.__dict__.setdefault("_rope_ext_freqs", {})
    f = freqs.get(position_ids.device)
    if f is None:
        f = freqs[position_ids.device] = _inv_freq(self.pos_embd_dim, _GPTJ_BASE, device=position_ids.device)
    c = RopeCarrier(position_ids, f, 1.0)
    return c, c


_FORWARDS = {
    "rotary": _rotary_forward,
    "gptj_rotary": _gptj_rotary_forward,
    "rotary_dynamic": _rotary_forward_dynamic,
    "qk_norm_attention": _qk_norm_attention_forward,
    "deferred_norm": _deferred_norm_forward,
    "gptj_attention": _gptj_attention_forward,
}


# ---------------------------------------------------------------- replaced module globals

def _unsqueeze_index(fn):
    """Position of `unsqueeze_dim` among the arguments after (q, k, cos, sin), and its default."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None, 1
    names = [p.name for p in params]
    if "unsqueeze_dim" not in names:
        return None, 1
    p = params[names.index("unsqueeze_dim")]
    return names.index("unsqueeze_dim") - 4, (1 if p.default is inspect.Parameter.empty else p.default)


_LAYOUT = {1: "bhsd", 2: "bshd"}  # unsqueeze_dim: where HF would broadcast cos/sin over heads


def _rotate_qk(q, k, c, unsqueeze_dim):
    layout = _LAYOUT.get(unsqueeze_dim)
    if layout is None:
        raise ValueError(f"rope_ext: apply_rotary_pos_emb with unsqueeze_dim={unsqueeze_dim!r} is not supported "
                         "(1: q/k [B, H, S, D]; 2: [B, S, H, D])")
    kw = dict(layout=layout, inv_freq=c.inv_freq, rotary_dim=c.rotary_dim, attention_factor=c.attention_factor)
    if c.sections is not None:
        kw.update(sections=c.sections, sections_interleaved=c.sections_interleaved)
    if c.norm is None:
        return apply_rope_qk(q, k, c.positions, **kw)
    q_norm, k_norm, offset = c.norm
    q_eps, k_eps = _norm_eps(q_norm), _norm_eps(k_norm)
    if q_eps == k_eps:
        return rms_norm_rope_qk(q, k, q_norm.weight, k_norm.weight, c.positions, eps=q_eps, weight_offset=offset, **kw)
    return (rms_norm_rope(q, q_norm.weight, c.positions, eps=q_eps, weight_offset=offset, **kw),
            rms_norm_rope(k, k_norm.weight, c.positions, eps=k_eps, weight_offset=offset, **kw))


def _make_apply(original):
    idx, default = _unsqueeze_index(original)

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if not isinstance(cos, RopeCarrier):
            return original(q, k, cos, sin, *args, **kwargs)
        if "unsqueeze_dim" in kwargs:
            ud = kwargs["unsqueeze_dim"]
        else:
            ud = args[idx] if idx is not None and 0 <= idx < len(args) else default
        return _rotate_qk(q, k, cos, ud)

    return _stand_in(apply_rotary_pos_emb, original,
                     "rope_ext: rotates with rope_ext when cos/sin are RopeCarriers, else calls HF's original.")


def _make_apply_gptj(original):
    def apply_rotary_pos_emb(tensor, sin, cos, *args, **kwargs):
        if isinstance(sin, RopeCarrier):  # the rotary module's carrier (transformers >= 5.2x)
            if args or kwargs or tensor.dim() != 4 or tensor.shape[-1] != sin.rotary_dim:
                raise ValueError(f"rope_ext: GPT-J apply_rotary_pos_emb got a tensor of shape {tuple(tensor.shape)} "
                                 f"and rotary dim {sin.rotary_dim}: not the [B, S, H, rotary_dim] call the patch "
                                 "covers; unpatch(model) restores HF's")
            return apply_rope(tensor, sin.positions, layout="bshd", interleaved=True, inv_freq=sin.inv_freq)
        stack = _gptj_stack()
        if not stack or args or kwargs:
            return original(tensor, sin, cos, *args, **kwargs)
        pos, dim = stack[-1]
        if tensor.dim() != 4 or tensor.shape[-1] != dim:  # a layout HF itself would not broadcast
            return original(tensor, sin, cos)
        return apply_rope(tensor, pos, layout="bshd", interleaved=True, base=_GPTJ_BASE)

    return _stand_in(apply_rotary_pos_emb, original,
                     "rope_ext: GPT-J rotation from the running attention's position_ids, else HF's original.")


def _stand_in(fn, original, doc):
    # HF's module and name: pickle finds the replacement under the original's name (and, in
    # a process without the patch, HF's function). inspect.signature follows __wrapped__.
    functools.update_wrapper(fn, original)
    fn.__doc__ = doc
    fn._rope_ext_original = original
    return fn


# ---------------------------------------------------------------- finding and checking targets

def _unwrapped(fn):
    return getattr(fn, "_rope_ext_original", fn)


def _family_of(module):
    parts = type(module).__module__.split(".")
    if len(parts) >= 4 and parts[0] == "transformers" and parts[1] == "models" and parts[3].startswith("modeling_"):
        return parts[2]
    return None


def _is_text(module, kind):
    # kind: "RotaryEmbedding" / "Attention" (GPTJFlashAttention2 too); vision towers keep theirs.
    name = type(module).__name__
    return kind in name and "Vision" not in name


def _norm_eps(norm):
    for name in ("variance_epsilon", "eps"):
        v = getattr(norm, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    raise ValueError(f"rope_ext: cannot fuse {type(norm).__name__}: no `variance_epsilon` / `eps` attribute")


def _rope_dict(config):
    for name in ("rope_parameters", "rope_scaling"):
        d = getattr(config, name, None)
        if isinstance(d, dict):
            return d
    return {}


def _mrope_of(rot, mode, where):
    """(sections, interleaved) of a text rotary module of an M-RoPE family, checked against its inv_freq."""
    sections = getattr(rot, "mrope_section", None) or _rope_dict(getattr(rot, "config", None)).get("mrope_section")
    if sections is None:
        raise ValueError(f"rope_ext: {where}: M-RoPE module without mrope_section (neither the module nor its "
                         "config's rope_parameters have one)")
    sections = [int(s) for s in sections]
    half = rot.inv_freq.shape[0]
    if len(sections) != 3 or sum(sections) != half:
        raise ValueError(f"rope_ext: {where}: mrope_section {sections} must have 3 entries summing to "
                         f"rotary_dim / 2 = {half}")
    return sections, mode == "interleaved"


def _check_rotary(rot, where):
    """The frequency attributes _rotary_forward reads: inv_freq / attention_scaling, or one pair per layer type."""
    kinds = rot.rope_type if isinstance(getattr(rot, "rope_type", None), dict) else None
    prefixes = [f"{t}_" for t in kinds] if kinds else [""]
    for p in prefixes:
        f = getattr(rot, p + "inv_freq", None)
        if not isinstance(f, torch.Tensor) or f.dim() != 1 or not hasattr(rot, p + "attention_scaling"):
            raise ValueError(f"rope_ext: {where} ({type(rot).__name__}) has no `{p}inv_freq` [R/2] buffer and "
                             f"`{p}attention_scaling`: this transformers version's rotary module is not supported")


def _probe_norm(norm, offset, where):
    """HF's norm on a probe input must equal RMSNorm * (weight + offset), the formula fused."""
    w = norm.weight
    if w.is_meta:
        return
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, w.shape[0], generator=g).to(device=w.device, dtype=w.dtype)
    with torch.no_grad():
        got = _call_inner(norm, x).float()
        xf = x.float()
        want = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _norm_eps(norm)) * (w.float() + offset)
    tol = (1e-5 if w.dtype in (torch.float32, torch.float64) else 3e-2) * (1.0 + want.abs().max().item())
    if got.shape != want.shape or not ((got - want).abs().max().item() <= tol):
        raise ValueError(f"rope_ext: cannot fuse {where} ({type(norm).__name__}): it does not compute "
                         f"RMSNorm(x) * (weight + {offset}) over the head dim in this transformers version")


def _plan(model, architecture):
    """Everything patch() will change, as a list of thunks; all checks run here, before any change."""
    by_family = {}
    for name, m in model.named_modules():
        fam = _family_of(m)
        if fam is not None:
            by_family.setdefault(fam, []).append((name or "<model>", m))
    if architecture is not None:
        if architecture not in _FAMILIES:
            raise ValueError(f"rope_ext: unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED)}")
        if architecture not in by_family:
            raise ValueError(f"rope_ext: architecture={architecture!r} but {type(model).__name__} has no "
                             f"transformers.models.{architecture} modules")
        families = [architecture]
    else:
        families = [f for f in by_family if f in _FAMILIES]
    if not families:
        mt = getattr(getattr(model, "config", None), "model_type", None)
        raise ValueError(f"rope_ext: unsupported architecture {type(model).__name__} (model_type {mt!r}); "
                         f"rope_ext.integrations.transformers supports: {', '.join(SUPPORTED)}")

    steps, found = [], []
    for fam in families:
        opts = _FAMILIES[fam]
        mods = by_family[fam]
        # What carries the rope: the text rotary module(s), or GPT-J's attentions. A family
        # without them here only lends other modules (e.g. an RMSNorm class reused by
        # another family's model): skipped unless asked for by name.
        if opts.get("gptj"):
            # Older transformers: each attention gathers its sin/cos; newer (5.2x): one
            # GPTJRotaryEmbedding hands (sin, cos) to the attentions.
            holders = [(n, m) for n, m in mods if _is_text(m, "Attention") and hasattr(m, "pos_embd_dim")]
            gptj_rotary = not holders
            if gptj_rotary:
                holders = [(n, m) for n, m in mods if _is_text(m, "RotaryEmbedding") and hasattr(m, "pos_embd_dim")]
        else:
            holders = [(n, m) for n, m in mods if _is_text(m, "RotaryEmbedding")]
        # Their consumers must be this family's attentions too: a rotary class borrowed by
        # other code (e.g. remote code importing LlamaRotaryEmbedding) would hand carriers
        # to an apply_rotary_pos_emb that was not replaced.
        if not any(_is_text(m, "Attention") for _, m in mods):
            holders = []
        if not holders:
            if architecture is not None:
                raise ValueError(f"rope_ext: found no {fam} rotary embedding and attention in {type(model).__name__}")
            continue
        found.append(fam)
        modeling = sys.modules[type(holders[0][1]).__module__]
        names = [n for n in _APPLY_NAMES if callable(getattr(modeling, n, None))]
        if not names:
            raise ValueError(f"rope_ext: {modeling.__name__} has no apply_rotary_pos_emb: this transformers "
                             f"version's {fam} is not supported")
        make = _make_apply_gptj if opts.get("gptj") else _make_apply
        for n in names:
            if not hasattr(getattr(modeling, n), "_rope_ext_original"):
                steps.append(lambda modeling=modeling, n=n, make=make:
                             setattr(modeling, n, make(getattr(modeling, n))))
        # Some versions keep HF's function on every attention too (`rotary_fn`, for
        # kernelize; forward does not call it). Pointed at the replacement, which pickles
        # by the same name, so torch.save of the model still finds it.
        hf_fn = _unwrapped(getattr(modeling, names[0]))
        for n, m in mods:
            if _unwrapped(m.__dict__.get("rotary_fn")) is hf_fn:
                steps.append(lambda m=m, modeling=modeling, name=names[0]:
                             setattr(m, "rotary_fn", getattr(modeling, name)))

        if opts.get("gptj") and gptj_rotary:
            for n, m in holders:
                steps.append(lambda m=m: _override(m, "gptj_rotary"))
            continue
        if opts.get("gptj"):
            for n, m in holders:
                params = list(inspect.signature(type(m).forward).parameters)[1:]  # after self
                idx = params.index("position_ids") if "position_ids" in params else None
                steps.append(lambda m=m, idx=idx: (setattr(m, "_rope_ext_pos_index", idx),
                                                   _override(m, "gptj_attention")))
            continue

        for n, m in holders:
            _check_rotary(m, n)
            mrope = _mrope_of(m, opts["mrope"], n) if opts.get("mrope") else (None, False)
            fwd = "rotary_dynamic" if hasattr(m, "rope_type") else "rotary"
            steps.append(lambda m=m, mrope=mrope, fwd=fwd: (setattr(m, "_rope_ext_mrope", mrope), _override(m, fwd)))

        if "qk_norm" in opts:
            offset = opts["qk_norm"]
            attns = [(n, m) for n, m in mods
                     if _is_text(m, "Attention") and hasattr(m, "q_norm") and hasattr(m, "k_norm")]
            if not attns:
                raise ValueError(f"rope_ext: found no {fam} attention with q_norm / k_norm in {type(model).__name__}")
            for n, m in attns:
                for norm_name in ("q_norm", "k_norm"):
                    norm = getattr(m, norm_name)
                    if not isinstance(getattr(norm, "weight", None), torch.Tensor):
                        raise ValueError(f"rope_ext: cannot fuse {n}.{norm_name}: no weight")
                    if "_rope_ext_inner" not in norm.__dict__:  # probe the real norm, not our pass-through
                        _probe_norm(norm, offset, f"{n}.{norm_name}")
                steps.append(lambda m=m, offset=offset: (
                    setattr(m, "_rope_ext_norm_offset", offset),
                    _override(m.q_norm, "deferred_norm"), _override(m.k_norm, "deferred_norm"),
                    _override(m, "qk_norm_attention")))
    if not found:
        raise ValueError(f"rope_ext: found no rotary embedding of {', '.join(families)} in {type(model).__name__}")
    return steps


class _Forward:
    """module.forward set by patch(): FORWARDS[name](module, ...). A name rather than the
    function keeps it picklable (torch.save of a whole patched model) and deep-copyable."""
    __slots__ = ("name", "module")

    def __init__(self, name, module):
        self.name, self.module = name, module

    def __call__(self, *args, **kwargs):
        return _FORWARDS[self.name](self.module, *args, **kwargs)

    def __reduce__(self):
        return _Forward, (self.name, self.module)


def _override(module, name):
    """module.forward = _FORWARDS[name] (bound); the previous forward stays reachable through _call_inner."""
    cur = module.__dict__.get("forward")
    if isinstance(cur, _Forward) and cur.name == name:
        return  # already patched
    if "_rope_ext_inner" not in module.__dict__:
        module._rope_ext_inner = cur  # None: the class's forward
    module.forward = _Forward(name, module)


# ---------------------------------------------------------------- public API

def patch(model, architecture=None):
    """Make a loaded transformers model rotate q/k with rope_ext; returns the model (patched in place).

    architecture: None (default) patches every supported family found in the model, by the
      transformers.models.<family> package of its modules; or one name of SUPPORTED to
      require that family. Raises ValueError, before changing anything, for an unsupported
      model or a transformers version whose modules differ from what the patch relies on.
    Idempotent; `unpatch(model)` restores HF's forwards.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"rope_ext: patch() needs a torch.nn.Module (a transformers model), got {type(model).__name__}")
    for step in _plan(model, architecture):
        step()
    return model


def unpatch(model):
    """Undo patch(model) on this instance (HF's forwards and norms back); returns the model.
    The replaced module-level functions stay: they call HF's original for real cos/sin."""
    for m in model.modules():
        d = m.__dict__
        if "_rope_ext_inner" not in d:
            continue
        inner = d.pop("_rope_ext_inner")
        d.pop("forward", None)
        if inner is not None:
            m.forward = inner
        for k in ("_rope_ext_mrope", "_rope_ext_norm_offset", "_rope_ext_defer", "_rope_ext_pos_index",
                  "_rope_ext_freqs"):
            d.pop(k, None)
    return model


def is_patched(model):
    """Whether patch(model) is in effect on some module of the model."""
    return any("_rope_ext_inner" in m.__dict__ for m in model.modules())


__all__ = ["SUPPORTED", "RopeCarrier", "patch", "unpatch", "is_patched"]
