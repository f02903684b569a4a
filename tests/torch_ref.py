"""torch_ref.py — independent PyTorch reference implementations of GPT-2,
Llama and Qwen3 (the math of Hugging Face's GPT2LMHeadModel / LlamaForCausalLM
/ Qwen3ForCausalLM, written from the equations), built from a Hugging Face folder's config.json + tensors
under HF names, plus the training-loop semantics of llmtrain (data addressing,
micro-batching, AdamW param groups, LR schedule, gradient clipping).

Only torch primitives are used; no transformers.
"""
import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------

def gpt2_config(n_layer, n_embd, n_head, vocab_size, n_positions, eps=1e-5):
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
        "vocab_size": vocab_size, "n_positions": n_positions, "n_ctx": n_positions,
        "n_inner": None, "layer_norm_epsilon": eps,
        "activation_function": "gelu_new", "tie_word_embeddings": True,
    }


def llama_config(n_layer, hidden, n_head, n_kv_head, ffn_hidden, vocab_size,
                 max_pos, eps=1e-5, theta=10000.0, tie=False):
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden, "intermediate_size": ffn_hidden,
        "num_hidden_layers": n_layer, "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head, "vocab_size": vocab_size,
        "max_position_embeddings": max_pos, "rms_norm_eps": eps,
        "rope_theta": theta, "tie_word_embeddings": bool(tie),
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    }


def qwen3_config(n_layer, hidden, n_head, n_kv_head, head_dim, ffn_hidden, vocab_size, max_pos, eps=1e-6,
                 theta=1000000.0, tie=True):
    """Qwen3ForCausalLM: Llama's blocks, a head_dim of its own and an RMSNorm
    (q_norm, k_norm) over each query and key head before RoPE."""
    cfg = llama_config(n_layer, hidden, n_head, n_kv_head, ffn_hidden, vocab_size, max_pos, eps=eps, theta=theta, tie=tie)
    del cfg["mlp_bias"]
    cfg.update({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": head_dim,
                "use_sliding_window": False, "sliding_window": None, "max_window_layers": n_layer})
    return cfg


def arch_of(cfg):
    """gpt2 or llama (Qwen3 is Llama's blocks with QK-norm: qk_norm_of)"""
    mt = cfg.get("model_type")
    if mt not in ("gpt2", "llama", "qwen3"):
        raise ValueError(f"unsupported model_type {mt!r}")
    return "gpt2" if mt == "gpt2" else "llama"


def qk_norm_of(cfg):
    return cfg.get("model_type") == "qwen3"


def head_dim_of(cfg):
    if arch_of(cfg) == "gpt2":
        return cfg["n_embd"] // cfg["n_head"]
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def expected_shapes(cfg):
    """HF tensor name -> shape, for a config dict."""
    s = {}
    if arch_of(cfg) == "gpt2":
        C, L, V, P = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
        Fh = cfg.get("n_inner") or 4 * C
        s["transformer.wte.weight"] = (V, C)
        s["transformer.wpe.weight"] = (P, C)
        for i in range(L):
            h = f"transformer.h.{i}."
            s[h + "ln_1.weight"] = (C,); s[h + "ln_1.bias"] = (C,)
            s[h + "attn.c_attn.weight"] = (C, 3 * C); s[h + "attn.c_attn.bias"] = (3 * C,)
            s[h + "attn.c_proj.weight"] = (C, C); s[h + "attn.c_proj.bias"] = (C,)
            s[h + "ln_2.weight"] = (C,); s[h + "ln_2.bias"] = (C,)
            s[h + "mlp.c_fc.weight"] = (C, Fh); s[h + "mlp.c_fc.bias"] = (Fh,)
            s[h + "mlp.c_proj.weight"] = (Fh, C); s[h + "mlp.c_proj.bias"] = (C,)
        s["transformer.ln_f.weight"] = (C,); s["transformer.ln_f.bias"] = (C,)
    else:
        C, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        nh = cfg["num_attention_heads"]; nkv = cfg.get("num_key_value_heads") or nh
        hd = head_dim_of(cfg); Fh = cfg["intermediate_size"]
        s["model.embed_tokens.weight"] = (V, C)
        for i in range(L):
            h = f"model.layers.{i}."
            s[h + "input_layernorm.weight"] = (C,)
            s[h + "self_attn.q_proj.weight"] = (nh * hd, C)
            s[h + "self_attn.k_proj.weight"] = (nkv * hd, C)
            s[h + "self_attn.v_proj.weight"] = (nkv * hd, C)
            s[h + "self_attn.o_proj.weight"] = (C, nh * hd)
            if qk_norm_of(cfg):
                s[h + "self_attn.q_norm.weight"] = (hd,)
                s[h + "self_attn.k_norm.weight"] = (hd,)
            s[h + "post_attention_layernorm.weight"] = (C,)
            s[h + "mlp.gate_proj.weight"] = (Fh, C)
            s[h + "mlp.up_proj.weight"] = (Fh, C)
            s[h + "mlp.down_proj.weight"] = (C, Fh)
        s["model.norm.weight"] = (C,)
        if not cfg.get("tie_word_embeddings", False):
            s["lm_head.weight"] = (V, C)
    return s


def random_hf_tensors(cfg, std=0.02, seed=0, norm_jitter=0.0, bias_std=0.0,
                      dtype=torch.float32):
    """Random HF tensors for cfg. Matrices N(0, std); norm weights
    1 + norm_jitter*N(0,1); biases bias_std*N(0,1) (0 by default)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if len(shape) == 2:
            t = torch.randn(shape, generator=g, dtype=torch.float32) * std
        elif name.endswith(".bias"):
            t = torch.randn(shape, generator=g, dtype=torch.float32) * bias_std
        else:  # norm weights
            t = 1.0 + torch.randn(shape, generator=g, dtype=torch.float32) * norm_jitter
        out[name] = t.to(dtype)
    return out


# --------------------------------------------------------------------------
# building blocks (from the equations)
# --------------------------------------------------------------------------

def layer_norm(x, w, b, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance
    return (x - mean) * torch.rsqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    # HF LlamaRMSNorm: statistics in fp32 (or wider), then cast back, times w
    xd = x.to(torch.float64) if x.dtype == torch.float64 else x.to(torch.float32)
    var = (xd * xd).mean(dim=-1, keepdim=True)
    return w * (xd * torch.rsqrt(var + eps)).to(x.dtype)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def silu(x):
    return x * torch.sigmoid(x)


def causal_attention(q, k, v, docs=None):
    """q [B,nh,T,hd], k,v [B,nh,T,hd] -> [B,nh,T,hd]; softmax(q k^T/sqrt(hd)) v, causal.
    docs [B,T] (document ids, block-causal): a query sees only the keys of its own document."""
    T, hd = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    if docs is not None:
        mask = mask[None, None] | (docs[:, None, :, None] != docs[:, None, None, :])
    att = att.masked_fill(mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    return att @ v


def llama3_inv_freq(inv_freq, rs):
    """Llama 3.1's rescaled RoPE frequencies (Hugging Face rope_type "llama3"):
    wavelengths longer than original/low_freq_factor divided by factor,
    shorter than original/high_freq_factor kept, a linear blend in 1/wavelength
    between (Meta's apply_scaling in llama/model.py)."""
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    out = []
    for f in inv_freq.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(f)
        elif wavelen > old / lo:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def yarn_inv_freq(hd, theta, rs):
    """YaRN's RoPE frequencies and attention factor (Peng et al. 2023, as
    Hugging Face's rope_type "yarn" reads its keys): frequency index i mixes
    the interpolated theta^(-2i/hd)/factor and the original by a ramp over
    the indices [low, high] at which a frequency turns beta_fast and beta_slow
    times over the original context; cos and sin are scaled by the attention
    factor, by default 0.1 ln(factor) + 1."""
    factor, orig = float(rs["factor"]), float(rs["original_max_position_embeddings"])
    beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))

    def turns_at(rot):  # the index whose wavelength fits rot times in the original context
        return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = turns_at(beta_fast), turns_at(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, hd - 1)
    if low == high:
        high += 0.001
    i = torch.arange(hd // 2, dtype=torch.float64)
    ramp = ((i - low) / (high - low)).clamp(0, 1)       # 0: keep, 1: interpolate
    base = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    inv_freq = base / factor * ramp + base * (1 - ramp)
    attn = rs.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return inv_freq, float(attn)


def rope_cos_sin(T, hd, theta, dtype, pos0=0, scaling=None):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))  # [hd/2]
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    pos = torch.arange(pos0, pos0 + T, dtype=torch.float64)
    mscale = 1.0
    if kind == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    elif kind == "linear":  # position interpolation: the positions divided by the factor
        pos = pos / float(scaling["factor"])
    elif kind == "yarn":
        inv_freq, mscale = yarn_inv_freq(hd, theta, scaling)
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope_scaling {scaling!r}")
    freqs = torch.outer(pos, inv_freq)                  # [T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)             # [T, hd]
    return (emb.cos() * mscale).to(dtype), (emb.sin() * mscale).to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x [B,H,T,hd]; cos/sin [T,hd]."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    """[B,nkv,T,hd] -> [B,nkv*n_rep,T,hd]; query head h gets kv head h // n_rep."""
    if n_rep == 1:
        return x
    B, nkv, T, hd = x.shape
    return x[:, :, None, :, :].expand(B, nkv, n_rep, T, hd).reshape(B, nkv * n_rep, T, hd)


# --------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------

def document_ids(idx, eod):
    """[B,T] -> [B,T]: each token's document number within its row, the
    documents ending at (and including) each eod token, as torchtitan's
    block_causal mask counts them"""
    ends = (idx == eod).long()
    return torch.cumsum(ends, dim=1) - ends


def document_positions(idx, eod):
    """[B,T] -> [B,T]: each token's position within its document (Megatron's
    --reset-position-ids: 0 at a row's first token and after each eod token,
    the eod token itself the last of its document), written from the
    document ids: a token's position is the number of earlier tokens of its
    row with the same id"""
    docs = document_ids(idx, eod)
    same = docs[:, :, None] == docs[:, None, :]                      # [B, t, u]
    earlier = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).tril(-1)
    return (same & earlier[None]).sum(-1)


IGNORE = -100  # F.cross_entropy's ignore_index: a target without a loss


def mask_after_eod(x, y, eod):
    """Megatron's --eod-mask-loss: no loss where the INPUT token is eod (its
    target is the next document's first token); those targets become IGNORE"""
    y = y.clone()
    y[x == eod] = IGNORE
    return y


class RefModel:
    """A GPT-2 or Llama causal LM whose parameters are a dict of leaf tensors
    keyed by Hugging Face names. dtype: float64 (reference) or float32.
    eod: block-causal attention, documents ending at this token (None: causal).
    pos_eod: positions counted from each document's start, documents ending
    at this token (None: from the row's start)."""

    def __init__(self, cfg, tensors, dtype=torch.float64, fast=False, eod=None, pos_eod=None):
        self.cfg = dict(cfg)
        self.eod = eod
        self.pos_eod = pos_eod
        self.arch = arch_of(cfg)
        self.dtype = dtype
        self.fast = fast  # use torch's fused F.layer_norm/F.gelu (same math), for benchmarks
        shapes = expected_shapes(cfg)
        missing = [n for n in shapes if n not in tensors]
        if missing:
            raise KeyError(f"missing tensors: {missing[:5]}")
        self.params = {}
        for n, shp in shapes.items():
            t = tensors[n]
            if tuple(t.shape) != tuple(shp):
                raise ValueError(f"{n}: shape {tuple(t.shape)} != expected {shp}")
            self.params[n] = t.detach().to(dtype).clone().requires_grad_(True)
        if self.arch == "gpt2":
            self.L = cfg["n_layer"]; self.C = cfg["n_embd"]; self.nh = cfg["n_head"]
            self.nkv = self.nh; self.eps = cfg.get("layer_norm_epsilon", 1e-5)
            self.max_T = cfg["n_positions"]; self.tied = True
        else:
            self.L = cfg["num_hidden_layers"]; self.C = cfg["hidden_size"]
            self.nh = cfg["num_attention_heads"]
            self.nkv = cfg.get("num_key_value_heads") or self.nh
            self.eps = cfg.get("rms_norm_eps", 1e-6)
            self.theta = float(cfg.get("rope_theta", 10000.0))
            self.rope_scaling = cfg.get("rope_scaling")
            self.max_T = cfg["max_position_embeddings"]
            self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.hd = head_dim_of(cfg)
        self.qk_norm = qk_norm_of(cfg)
        self.V = cfg["vocab_size"]

    # -- parameters --
    def named_parameters(self):
        return list(self.params.items())

    def parameters(self):
        return list(self.params.values())

    def state_dict(self):
        return {n: p.detach().clone() for n, p in self.params.items()}

    # -- forward --
    def _ln(self, x, w, b):
        if self.fast:
            return F.layer_norm(x, (x.shape[-1],), w, b, self.eps)
        return layer_norm(x, w, b, self.eps)

    def _gelu(self, x):
        if self.fast:
            return F.gelu(x, approximate="tanh")
        return gelu_tanh(x)

    def forward(self, idx):
        """idx [B,T] int64 -> logits [B,T,V]."""
        B, T = idx.shape
        if T > self.max_T:
            raise ValueError(f"T={T} > max positions {self.max_T}")
        p = self.params
        C, nh, nkv, hd = self.C, self.nh, self.nkv, self.hd
        docs = None if self.eod is None else document_ids(idx, self.eod)
        pos = None if self.pos_eod is None else document_positions(idx, self.pos_eod)
        if self.arch == "gpt2":
            wpe = p["transformer.wpe.weight"]
            x = p["transformer.wte.weight"][idx] + (wpe[:T][None] if pos is None else wpe[pos])
            for i in range(self.L):
                h = f"transformer.h.{i}."
                a = self._ln(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
                qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]  # Conv1D
                q, k, v = qkv.split(C, dim=-1)
                q = q.view(B, T, nh, hd).transpose(1, 2)
                k = k.view(B, T, nh, hd).transpose(1, 2)
                v = v.view(B, T, nh, hd).transpose(1, 2)
                y = causal_attention(q, k, v, docs).transpose(1, 2).reshape(B, T, C)
                x = x + (y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"])
                a = self._ln(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
                m = self._gelu(a @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
                x = x + (m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"])
            x = self._ln(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
            return x @ p["transformer.wte.weight"].t()
        # llama
        cos, sin = rope_cos_sin(T, hd, self.theta, self.dtype, scaling=self.rope_scaling)
        if pos is not None:  # each row its own angles: [B, 1, T, hd] against q, k [B, H, T, hd]
            cos, sin = cos[pos][:, None], sin[pos][:, None]
        x = p["model.embed_tokens.weight"][idx]
        for i in range(self.L):
            h = f"model.layers.{i}."
            a = rms_norm(x, p[h + "input_layernorm.weight"], self.eps)
            q = (a @ p[h + "self_attn.q_proj.weight"].t()).view(B, T, nh, hd).transpose(1, 2)
            k = (a @ p[h + "self_attn.k_proj.weight"].t()).view(B, T, nkv, hd).transpose(1, 2)
            v = (a @ p[h + "self_attn.v_proj.weight"].t()).view(B, T, nkv, hd).transpose(1, 2)
            if self.qk_norm:  # Qwen3: each head's hd values RMS-normalized, one weight for all heads, before RoPE
                q = rms_norm(q, p[h + "self_attn.q_norm.weight"], self.eps)
                k = rms_norm(k, p[h + "self_attn.k_norm.weight"], self.eps)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            k = repeat_kv(k, nh // nkv)
            v = repeat_kv(v, nh // nkv)
            y = causal_attention(q, k, v, docs).transpose(1, 2).reshape(B, T, nh * hd)
            x = x + y @ p[h + "self_attn.o_proj.weight"].t()
            a = rms_norm(x, p[h + "post_attention_layernorm.weight"], self.eps)
            g = a @ p[h + "mlp.gate_proj.weight"].t()
            u = a @ p[h + "mlp.up_proj.weight"].t()
            x = x + (silu(g) * u) @ p[h + "mlp.down_proj.weight"].t()
        x = rms_norm(x, p["model.norm.weight"], self.eps)
        head = p["model.embed_tokens.weight"] if self.tied else p["lm_head.weight"]
        return x @ head.t()

    __call__ = forward

    def loss(self, idx, targets, reduction="mean"):
        """Cross-entropy over the targets that are not IGNORE, their mean (or
        reduction "sum"); also returns the logits."""
        logits = self.forward(idx)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE,
                               reduction=reduction)
        return loss, logits


# --------------------------------------------------------------------------
# training semantics
# --------------------------------------------------------------------------

def lr_at(s, lr, min_lr, warmup, decay_steps, schedule=None):
    """LR used by the update of 0-based step s, from docs/layouts.md's formulas.
    schedule: None (cosine) or {"lr_decay_style": ..., "wsd_decay_steps": K,
    "wsd_decay_style": ...} as the job's optim keys."""
    sc = schedule or {}
    style = sc.get("lr_decay_style", "cosine")
    if s < warmup:
        return lr * (s + 1) / warmup
    if style == "constant":
        return lr
    if style == "inverse_sqrt":
        return max(min_lr, lr * math.sqrt(max(warmup, 1) / (s + 1)))
    if style == "wsd":
        K = sc["wsd_decay_steps"]
        q = min(1.0, max(0.0, (s - (decay_steps - K)) / K))
        f = {"linear": lambda q: 1 - q, "cosine": lambda q: 0.5 * (1 + math.cos(math.pi * q)),
             "exponential": lambda q: 2 * 0.5 ** q - 1, "minus_sqrt": lambda q: 1 - math.sqrt(q)}
        return min_lr + (lr - min_lr) * f[sc.get("wsd_decay_style", "linear")](q)
    p = min(1.0, (s - warmup) / max(1, decay_steps - warmup))
    if style == "linear":
        return min_lr + (lr - min_lr) * (1.0 - p)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))


def torch_lr_schedule(n, lr, min_lr, warmup, decay_steps, schedule=None):
    """The LRs of 0-based steps 0..n-1 as PyTorch's schedulers give them: a
    SequentialLR of LinearLR (the warmup, and linear decays), CosineAnnealingLR
    (cosine decays, then ConstantLR at min_lr) and ConstantLR (stable phases),
    stepped once per optimizer step. The shapes torch has no class for
    (inverse_sqrt; wsd's exponential and minus_sqrt) go through LambdaLR on
    Megatron's formulas, written out here again."""
    sc = schedule or {}
    style = sc.get("lr_decay_style", "cosine")
    sched = torch.optim.lr_scheduler
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    lo = min_lr / lr
    phases, milestones = [], []

    def phase(start, sch):
        if phases:
            milestones.append(start)
        phases.append(sch)

    def cos_then_min(start, span):
        phase(start, sched.CosineAnnealingLR(opt, T_max=span, eta_min=min_lr))
        phase(start + span, sched.ConstantLR(opt, factor=lo, total_iters=n + 1))

    if warmup > 1:
        phase(0, sched.LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup - 1))
    elif warmup == 1:
        phase(0, sched.ConstantLR(opt, factor=1.0, total_iters=0))
    W, D = warmup, decay_steps
    if style == "constant":
        phase(W, sched.ConstantLR(opt, factor=1.0, total_iters=0))
    elif style == "linear":
        phase(W, sched.LinearLR(opt, start_factor=1.0, end_factor=lo, total_iters=max(1, D - W)))
    elif style == "cosine":
        cos_then_min(W, max(1, D - W))
    elif style == "inverse_sqrt":
        phase(W, sched.LambdaLR(opt, lambda t: max(lo, math.sqrt(max(W, 1) / (t + W + 1)))))
    elif style == "wsd":
        K, ws = sc["wsd_decay_steps"], sc.get("wsd_decay_style", "linear")
        if D - K > W:
            phase(W, sched.ConstantLR(opt, factor=1.0, total_iters=0))
        if ws == "linear":
            phase(D - K, sched.LinearLR(opt, start_factor=1.0, end_factor=lo, total_iters=K))
        elif ws == "cosine":
            cos_then_min(D - K, K)
        else:
            g = (lambda q: 2 * 0.5 ** q - 1) if ws == "exponential" else (lambda q: 1 - math.sqrt(q))
            phase(D - K, sched.LambdaLR(opt, lambda t: lo + (1 - lo) * g(min(1.0, t / K))))
    else:
        raise ValueError(style)
    out = []
    with warnings.catch_warnings():  # SequentialLR steps its schedulers with an epoch, which torch 1.13 warns about
        warnings.simplefilter("ignore", UserWarning)
        sch = phases[0] if len(phases) == 1 else sched.SequentialLR(opt, phases, milestones)
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
    return out


BLEND_PERIOD = 65536


def blend_pattern(weights):
    """One period of a data blend's pattern, by docs/data.md's rule: position p
    goes to the source with the largest w_i * (p + 1) - c_i (w normalised,
    c_i its positions so far; ties to the lowest i). Returns (src, idx, cnt):
    the source of each position, its number among that source's positions,
    and each source's positions a period."""
    total = 0.0
    for x in weights:
        total += x
    w = [x / total for x in weights]
    cnt = [0] * len(w)
    src, idx = [], []
    for p in range(BLEND_PERIOD):
        best = max(range(len(w)), key=lambda i: (w[i] * (p + 1) - cnt[i], -i))
        src.append(best)
        idx.append(cnt[best])
        cnt[best] += 1
    return src, idx, cnt


def blend_batch(sources, pattern, step, G, T):
    """global_batch for a blend: sources = 1-D token arrays (each source's
    shards concatenated), pattern = blend_pattern(weights). Global sequence
    j = q * P + p is sequence q * cnt[src] + idx[p] of source src = src[p]."""
    src, idx, cnt = pattern

    def pick(j):
        q, p = divmod(j, BLEND_PERIOD)
        return sources[src[p]], q * cnt[src[p]] + idx[p]
    return batch_of(pick, step, G, T)


def batch_of(pick, step, G, T):
    """Inputs and targets (int64 [G, T]) of step's G global sequences j:
    pick(j) -> (tokens, n), sequence n of tokens starting at token n*T (mod
    its length), reads wrapping to the start."""
    xs, ys = [], []
    for i in range(G):
        toks, n = pick(step * G + i)
        seq = toks[(n * T + np.arange(T + 1)) % len(toks)].astype(np.int64)
        xs.append(seq[:T]); ys.append(seq[1:])
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def rampup_batch(consumed, start, incr, samples, G):
    """Megatron's batch-size ramp-up (--rampup-batch-size start incr samples),
    as its calculator computes it, in floating point: the global batch of a
    step that begins after `consumed` samples."""
    if consumed > samples:
        return G
    per_stage = samples / ((G - start) // incr)
    return start + int(consumed / per_stage) * incr


def rampup_plan(steps, start, incr, samples, G):
    """[(cursor, batch)] of steps 0..steps-1 under a ramp: each step reads
    the batch global sequences from the samples consumed before it on."""
    plan, cur = [], 0
    for _ in range(steps):
        g = rampup_batch(cur, start, incr, samples, G)
        plan.append((cur, g))
        cur += g
    return plan


def global_batch(tokens, step, G, T):
    """tokens: 1-D int numpy array (all shards concatenated). Sequence i of
    step k starts at s = (k*G + i)*T (mod n). Returns x, y int64 [G,T]."""
    return batch_of(lambda j: (tokens, j), step, G, T)


def forward_backward(model, x, y, micro_batch):
    """Gradient of the mean loss over the whole batch's targets (those not
    IGNORE), accumulated over micro-batches of `micro_batch` sequences: each
    adds its loss sum over that count. Grads are ADDED into .grad.
    Returns (mean loss as float, logits of the first micro-batch)."""
    G = x.shape[0]
    assert G % micro_batch == 0
    n_micro = G // micro_batch
    n = int((y != IGNORE).sum())
    total = 0.0
    first_logits = None
    for j in range(n_micro):
        xb = x[j * micro_batch:(j + 1) * micro_batch]
        yb = y[j * micro_batch:(j + 1) * micro_batch]
        loss, logits = model.loss(xb, yb, reduction="sum")
        (loss / n).backward()
        total += loss.item() / n
        if j == 0:
            first_logits = logits.detach()
    return total, first_logits


def param_groups(model, weight_decay, decay_all=False):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if (decay_all or p.dim() >= 2) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def grads_dict(model):
    out = {}
    for n, p in model.named_parameters():
        out[n] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
    return out


def round_bf16(x):
    """x rounded to bfloat16 precision (through float32, to nearest even), in x's dtype."""
    return x.to(torch.float32).to(torch.bfloat16).to(x.dtype)


def train(model, tokens, steps, seq_len, micro_batch, global_batch_size, lr, min_lr,
          warmup_steps, decay_steps, weight_decay, decay_all=False, beta1=0.9,
          beta2=0.95, eps=1e-8, grad_clip=1.0, start_step=0, bf16_working=False, schedule=None,
          batch_fn=None):
    """Runs `steps` optimizer steps; returns a list of per-step records
    {step (1-based), loss, lr, grad_norm, param_norm (the L2 norm of the
    weights after the step: the masters under bf16_working), clipped}. bf16_working: mixed
    precision as FSDP's param_dtype=bfloat16 does it: the optimizer updates
    full-precision master copies and the model's weights are their bf16
    rounding (set now and after every step); the model's final weights are
    then the masters. batch_fn(step) -> (x, y), if given, replaces
    global_batch(tokens, step, ...)."""
    params = model.parameters()
    groups = param_groups(model, weight_decay, decay_all)
    master = None
    if bf16_working:
        master = {id(p): p.detach().clone() for p in params}
        groups = [dict(g, params=[master[id(p)] for p in g["params"]]) for g in groups]
        with torch.no_grad():
            for p in params:
                p.copy_(round_bf16(master[id(p)]))
    opt = torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    lrs = torch_lr_schedule(start_step + steps, lr, min_lr, warmup_steps, decay_steps, schedule)
    recs = []
    for s in range(start_step, start_step + steps):
        x, y = batch_fn(s) if batch_fn else global_batch(tokens, s, global_batch_size, seq_len)
        for p in params:
            p.grad = None
        loss, _ = forward_backward(model, x, y, micro_batch)
        if grad_clip and grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip).item()
        else:
            norm = torch.norm(torch.stack([p.grad.norm() for p in params])).item()
        cur = lrs[s]
        for g in opt.param_groups:
            g["lr"] = cur
        if master is not None:
            for p in params:
                master[id(p)].grad = p.grad.detach().clone()
        opt.step()
        if master is not None:
            with torch.no_grad():
                for p in params:
                    p.copy_(round_bf16(master[id(p)]))
        with torch.no_grad():
            pnorm = math.sqrt(sum(float((master[id(p)] if master else p).double().pow(2).sum()) for p in params))
        recs.append({"step": s + 1, "loss": loss, "lr": cur, "grad_norm": norm, "param_norm": pnorm,
                     "clipped": bool(grad_clip and grad_clip > 0 and norm > grad_clip)})
    if master is not None:
        with torch.no_grad():
            for p in params:
                p.copy_(master[id(p)])
    return recs


# --------------------------------------------------------------------------
# self-test: /usr/bin/python3 tests/torch_ref.py
# --------------------------------------------------------------------------

def _selftest():
    import os
    import sys
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hfio

    torch.set_num_threads(2)
    n_ok = n_fail = 0

    def check(name, cond, info=""):
        nonlocal n_ok, n_fail
        print(("ok   " if cond else "FAIL ") + name + (" " + info if info else ""))
        if cond:
            n_ok += 1
        else:
            n_fail += 1

    def rel(a, b):
        a = a.double(); b = b.double()
        return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()

    # ---- safetensors round trip ----
    with tempfile.TemporaryDirectory() as td:
        g = torch.Generator().manual_seed(0)
        ts = {"a.weight": torch.randn(5, 7, generator=g), "b": torch.randn(3, generator=g),
              "c.big": torch.randn(2, 3, generator=g) * 1e30}
        p = os.path.join(td, "x.safetensors")
        hfio.write_safetensors(p, ts, metadata={"k": "v"})
        back, meta = hfio.read_safetensors_np(p)
        check("safetensors F32 round trip exact",
              all(np.array_equal(back[k], ts[k].numpy()) for k in ts) and meta == {"k": "v"})
        hfio.write_safetensors(p, ts, dtype="BF16")
        back = hfio.read_safetensors(p)
        # torch's own bf16 rounding (round to nearest even) as the reference
        check("safetensors BF16 round trip == torch bf16 rounding",
              all(torch.equal(back[k], ts[k].to(torch.bfloat16).float()) for k in ts))
        x = torch.randn(10000, generator=g) * 3
        check("round_to_bf16 == torch .to(bfloat16)",
              np.array_equal(hfio.round_to_bf16(x.numpy()), x.to(torch.bfloat16).float().numpy()))
        with open(p, "rb") as f:
            hlen = int.from_bytes(f.read(8), "little")
        check("safetensors data section 8-byte aligned", (8 + hlen) % 8 == 0)
        cfg = gpt2_config(2, 16, 2, 32, 16)
        hfio.write_hf_folder(os.path.join(td, "hf"), cfg, random_hf_tensors(cfg, seed=3))
        cfg2, t2 = hfio.read_hf_folder(os.path.join(td, "hf"))
        check("HF folder round trip", cfg2 == cfg and set(t2) == set(expected_shapes(cfg)))

    # ---- building blocks against torch's fused ops ----
    x = torch.randn(4, 6, 32, dtype=torch.float64)
    w = torch.randn(32, dtype=torch.float64); b = torch.randn(32, dtype=torch.float64)
    check("layer_norm == F.layer_norm", rel(layer_norm(x, w, b, 1e-5),
          F.layer_norm(x, (32,), w, b, 1e-5)) < 1e-13)
    check("gelu_tanh == F.gelu(tanh)", rel(gelu_tanh(x), F.gelu(x, approximate="tanh")) < 1e-13)
    check("silu == F.silu", rel(silu(x), F.silu(x)) < 1e-13)
    r = rms_norm(x, w, 1e-6)
    ref = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * w
    check("rms_norm formula", rel(r, ref) < 1e-13)
    # RoPE: rotation preserves norms, and q.k depends only on the position difference
    hd = 8
    cos, sin = rope_cos_sin(12, hd, 10000.0, torch.float64)
    q = torch.randn(hd, dtype=torch.float64); k = torch.randn(hd, dtype=torch.float64)
    qs = apply_rope(q.expand(12, hd), cos, sin); ks = apply_rope(k.expand(12, hd), cos, sin)
    dots = torch.tensor([[qs[i] @ ks[j] for j in range(12)] for i in range(12)])
    check("rope preserves norm", rel(qs.norm(dim=-1), q.norm().expand(12)) < 1e-13)
    check("rope q.k depends on i-j only", abs(dots[5, 2] - dots[9, 6]) < 1e-12
          and abs(dots[3, 3] - (q @ k)) < 1e-12)
    # rotate-half pairs dimension i with i+hd/2, angle pos*theta^(-2i/hd)
    pos, i = 7, 1
    ang = pos * 10000.0 ** (-2 * i / hd)
    e = torch.zeros(hd, dtype=torch.float64); e[i] = 1.0
    re = apply_rope(e.expand(12, hd), cos, sin)[pos]
    check("rope rotate-half convention", abs(re[i] - math.cos(ang)) < 1e-12
          and abs(re[i + hd // 2] - math.sin(ang)) < 1e-12)

    # Llama 3's scaled frequencies: the highest kept, the lowest divided by the
    # factor, and the blend meets both at its band edges
    rs = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    base = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    sc = llama3_inv_freq(base, rs)
    check("llama3 rope: highest frequency kept, lowest divided by factor",
          sc[0] == base[0] and abs(sc[-1] - base[-1] / 32) < 1e-18)
    edges = torch.tensor([2 * math.pi / (8192 / 4), 2 * math.pi / 8192], dtype=torch.float64)
    eps_f = torch.tensor([1 + 1e-9, 1 - 1e-9], dtype=torch.float64)
    at, near = llama3_inv_freq(edges, rs), llama3_inv_freq(edges * eps_f, rs)
    check("llama3 rope: continuous at the band edges", rel(at, near) < 1e-8
          and abs(at[0] - edges[0]) < 1e-15 and abs(at[1] - edges[1] / 32) < 1e-15)

    # YaRN: over an original context of 256 at theta 1e4 and hd 16, index 0
    # is kept, 4..7 are divided by the factor and 1..3 ramp between; the
    # default attention factor is 0.1 ln(factor) + 1, and it scales q.k by
    # its square
    ys = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    yf, ym = yarn_inv_freq(16, 10000.0, ys)
    yb = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    check("yarn rope: index 0 kept, 4..7 divided by the factor, 1..3 between",
          yf[0] == yb[0] and rel(yf[4:], yb[4:] / 4) < 1e-15
          and bool(((yf[1:4] < yb[1:4]) & (yf[1:4] > yb[1:4] / 4)).all()))
    check("yarn rope: default attention factor 0.1 ln 4 + 1", abs(ym - (0.1 * math.log(4) + 1)) < 1e-15)
    ycos, ysin = rope_cos_sin(12, 16, 10000.0, torch.float64, scaling=ys)
    q16 = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    check("yarn rope: scales a vector's norm by the attention factor",
          rel(apply_rope(q16.expand(12, 16), ycos, ysin).norm(dim=-1), ym * q16.norm().expand(12)) < 1e-13)

    # ---- models ----
    g_cfg = gpt2_config(2, 32, 4, 64, 32)
    l_cfg = llama_config(2, 32, 4, 2, 48, 80, 32, eps=1e-5, theta=10000.0, tie=False)
    lt_cfg = llama_config(2, 32, 4, 4, 48, 64, 32, eps=1e-6, theta=100.0, tie=True)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    for nm, cfg in [("gpt2", g_cfg), ("llama-gqa", l_cfg), ("llama-tied", lt_cfg)]:
        m = RefModel(cfg, random_hf_tensors(cfg, std=0.02, seed=5))
        loss, logits = m.loss(idx, tgt)
        check(f"{nm} loss finite ~ ln V", math.isfinite(loss.item())
              and abs(loss.item() - math.log(cfg["vocab_size"])) < 0.1,
              f"loss={loss.item():.5f} lnV={math.log(cfg['vocab_size']):.5f}")
        loss.backward()
        check(f"{nm} all grads finite and nonzero",
              all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
                  for n, p in m.named_parameters() if "wpe" not in n))
        # causality: changing token t does not change logits before t
        m2 = RefModel(cfg, random_hf_tensors(cfg, std=0.1, seed=6))
        with torch.no_grad():
            l1 = m2(idx); idx2 = idx.clone(); idx2[:, 9] = (idx2[:, 9] + 1) % 64
            l2 = m2(idx2)
        check(f"{nm} causal", torch.equal(l1[:, :9], l2[:, :9]) and not torch.equal(l1[:, 9:], l2[:, 9:]))
        # fast path (F.layer_norm / F.gelu) agrees
        m3 = RefModel(cfg, random_hf_tensors(cfg, std=0.1, seed=6), fast=True)
        with torch.no_grad():
            check(f"{nm} fast path == reference", rel(m3(idx), l1) < 1e-12)
        # finite differences on a few entries of each kind
        m4 = RefModel(cfg, random_hf_tensors(cfg, std=0.1, seed=7, norm_jitter=0.1, bias_std=0.05))
        loss, _ = m4.loss(idx[:1, :8], tgt[:1, :8]); loss.backward()
        worst = 0.0
        gen = torch.Generator().manual_seed(9)
        for n, p in m4.named_parameters():
            for _ in range(2):
                j = torch.randint(0, p.numel(), (1,), generator=gen).item()
                h = 1e-6
                with torch.no_grad():
                    flat = p.view(-1); old = flat[j].item()
                    flat[j] = old + h; lp = m4.loss(idx[:1, :8], tgt[:1, :8])[0].item()
                    flat[j] = old - h; lm = m4.loss(idx[:1, :8], tgt[:1, :8])[0].item()
                    flat[j] = old
                fd = (lp - lm) / (2 * h)
                an = p.grad.view(-1)[j].item()
                if "wpe" in n and j // p.shape[1] >= 8:
                    continue
                worst = max(worst, abs(fd - an) / max(1e-6, abs(an) + abs(fd)))
        check(f"{nm} finite-difference gradients", worst < 1e-5, f"worst={worst:.2e}")

    # GQA: a 2-kv-head model equals a 4-kv-head model whose kv heads are copies
    # (query head h uses kv head h // (nh/nkv)); and nkv == nh is plain MHA.
    t_gqa = random_hf_tensors(l_cfg, std=0.1, seed=11)
    mha_cfg = dict(l_cfg, num_key_value_heads=4)
    t_mha = dict(t_gqa)
    hdl = 8
    for i in range(2):
        for kind in ("k_proj", "v_proj"):
            n = f"model.layers.{i}.self_attn.{kind}.weight"
            w = t_gqa[n].view(2, hdl, 32)
            t_mha[n] = w.repeat_interleave(2, dim=0).reshape(4 * hdl, 32)
    with torch.no_grad():
        a = RefModel(l_cfg, t_gqa)(idx); bb = RefModel(mha_cfg, t_mha)(idx)
    check("GQA == MHA with repeated kv heads (h -> h // n_rep)", rel(a, bb) < 1e-12, f"rel={rel(a, bb):.1e}")

    # positions reset at each document (Megatron's --reset-position-ids)
    row = torch.tensor([[1, 5, 2, 3, 5, 5, 4]])
    check("document_positions: 0 at a row's start and after each eod",
          document_positions(row, 5).tolist() == [[0, 1, 0, 1, 2, 0, 0]])
    # with the block-causal mask too, a packed row's logits are its documents'
    # run alone: GPT-2's learned positions count from each document's start
    # (without the reset its second document's logits differ); Llama's RoPE
    # is relative, so resetting its positions under the mask changes nothing
    pk = torch.randint(0, 60, (1, 16), generator=torch.Generator().manual_seed(3))
    pk[0, [4, 5, 11]] = 63
    for nm, cfg, vocab_eod in [("gpt2", g_cfg, 63), ("llama-gqa", l_cfg, 63)]:
        ts = random_hf_tensors(cfg, std=0.1, seed=13)
        reset, mask_only, plain = (RefModel(cfg, ts, eod=vocab_eod, pos_eod=vocab_eod), RefModel(cfg, ts, eod=vocab_eod),
                                   RefModel(cfg, ts))
        with torch.no_grad():
            packed, unreset = reset(pk)[0], mask_only(pk)[0]
            alone = torch.cat([plain(pk[:, s0:e])[0] for s0, e in [(0, 5), (5, 6), (6, 12), (12, 16)]])
        e_alone, e_unreset = rel(packed, alone), rel(unreset, alone)
        if nm == "gpt2":
            check(f"{nm} reset positions + block mask: a packed row == its documents alone, not without the reset",
                  e_alone < 1e-12 and e_unreset > 1e-3, f"rel {e_alone:.1e}, without the reset {e_unreset:.1e}")
        else:
            check(f"{nm} reset positions + block mask == block mask alone == documents alone",
                  e_alone < 1e-12 and e_unreset < 1e-12, f"rel {e_alone:.1e}, {e_unreset:.1e}")
        with torch.no_grad():
            causal_reset = RefModel(cfg, ts, pos_eod=vocab_eod)(pk)[0]
        e_c = rel(causal_reset, plain(pk)[0])
        check(f"{nm} reset positions change causal attention's logits after the first eod only",
              e_c > 1e-3 and rel(causal_reset[:5], plain(pk)[0][:5]) < 1e-14, f"rel {e_c:.1e}")

    # plain multi-head attention written independently (per-head loop)
    def mha_loop(q, k, v):
        B, H, T, D = q.shape
        out = torch.zeros_like(q)
        for bi in range(B):
            for hh in range(H):
                for t in range(T):
                    s = torch.stack([q[bi, hh, t] @ k[bi, hh, u] for u in range(t + 1)]) / math.sqrt(D)
                    pr = torch.exp(s - s.max()); pr = pr / pr.sum()
                    out[bi, hh, t] = sum(pr[u] * v[bi, hh, u] for u in range(t + 1))
        return out
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64); k = torch.randn_like(q); v = torch.randn_like(q)
    check("causal_attention == per-head loop", rel(causal_attention(q, k, v), mha_loop(q, k, v)) < 1e-12)

    # micro-batching: 2 micro-batches of 2 == one batch of 4
    toks = np.random.RandomState(0).randint(0, 64, size=2000)
    x, y = global_batch(toks, 3, 4, 16)
    check("data addressing", np.array_equal(x[1].numpy(), toks[(3 * 4 + 1) * 16:(3 * 4 + 1) * 16 + 16])
          and np.array_equal(y[1].numpy(), toks[(3 * 4 + 1) * 16 + 1:(3 * 4 + 1) * 16 + 17]))
    ma = RefModel(g_cfg, random_hf_tensors(g_cfg, std=0.1, seed=12))
    mb = RefModel(g_cfg, random_hf_tensors(g_cfg, std=0.1, seed=12))
    la, _ = forward_backward(ma, x, y, 2)
    lb, _ = forward_backward(mb, x, y, 4)
    ga, gb = grads_dict(ma), grads_dict(mb)
    check("micro-batching == full batch", abs(la - lb) < 1e-12 and
          max(rel(ga[n], gb[n]) for n in ga if gb[n].norm() > 0) < 1e-12)
    # with targets masked after an "eod" (token 5), unevenly over the micro-batches:
    # accumulation == F.cross_entropy's mean over the whole batch's remaining targets
    ym = mask_after_eod(x, y, 5)
    x5 = x.clone()
    x5[0, ::2] = 5  # micro-batch 0 loses 8 more targets than micro-batch 1
    ym5 = mask_after_eod(x5, y, 5)
    n0, n1 = int((ym5[:2] != IGNORE).sum()), int((ym5[2:] != IGNORE).sum())
    ma = RefModel(g_cfg, random_hf_tensors(g_cfg, std=0.1, seed=12))
    mb = RefModel(g_cfg, random_hf_tensors(g_cfg, std=0.1, seed=12))
    la, _ = forward_backward(ma, x5, ym5, 2)
    lb, _ = mb.loss(x5, ym5)
    lb.backward()
    ga, gb = grads_dict(ma), grads_dict(mb)
    check("masked targets: micro-batching == one mean over the batch", n0 != n1 and
          bool((ym[x == 5] == IGNORE).all()) and bool((ym[x != 5] == y[x != 5]).all()) and
          abs(la - lb.item()) < 1e-12 and max(rel(ga[n], gb[n]) for n in ga if gb[n].norm() > 0) < 1e-12,
          f"targets {n0} + {n1}")

    # schedule
    sched = [lr_at(s, 1e-3, 1e-4, 5, 20) for s in range(25)]
    check("lr schedule", abs(sched[0] - 2e-4) < 1e-15 and abs(sched[4] - 1e-3) < 1e-15
          and abs(sched[5] - 1e-3) < 1e-15 and abs(sched[20] - 1e-4) < 1e-15
          and abs(sched[24] - 1e-4) < 1e-15
          and abs(sched[12] - (1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * 7 / 15)))) < 1e-15)

    # training runs, loss decreases on structured data, clipping triggers
    rs = np.random.RandomState(1)
    succ = rs.randint(0, 64, size=(64, 2))
    seq = [0]
    for _ in range(3000):
        seq.append(succ[seq[-1], rs.randint(2)])
    seq = np.array(seq)
    mt = RefModel(g_cfg, random_hf_tensors(g_cfg, std=0.1, seed=13))
    recs = train(mt, seq, 30, 16, 2, 4, 1e-2, 1e-3, 5, 30, 0.1, grad_clip=0.5)
    check("training loss decreases", recs[-1]["loss"] < recs[0]["loss"] - 0.5,
          f"{recs[0]['loss']:.3f} -> {recs[-1]['loss']:.3f}, clipped {sum(r['clipped'] for r in recs)}/30")

    print(f"{n_ok} passed, {n_fail} failed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    raise SystemExit(_selftest())
