#!/usr/bin/env python3
"""test_moe.py — llmtrain's mixture-of-experts model against a PyTorch
reference written here from the formulas (docs/moe.md), not from
llmtrain's code, in float64:

  - a Mixtral-shaped model (every layer MoE, top-2 of 4, renormalised)
    imported from a Hugging Face folder written here, with a router far
    from uniform: step-0 logits, loss and every gradient (the load
    balancing and z losses included) against the reference;
  - five training steps (AdamW, clipping, two micro-batches a step, so
    the balance losses are per micro-batch): losses, grad norms, the aux
    loss and the expert load llmtrain logs, and the final weights;
  - a Qwen3-MoE imported from a Hugging Face folder (head_dim not
    n_embd / heads, QK-norm, a dense layer among the MoE ones, top-k not
    renormalised): step-0 logits and gradients, and its export's tensors
    and config.json;
  - a native model with a dense layer, a shared expert and top-k not
    renormalised, from scratch: its step-0 gradients through the dumped
    weights;
  - aux-loss-free balancing: losses, the saved biases, a resume;
  - a capacity factor: its drops counted as the reference counts them
    and its losses the reference's with those drops (and not the
    dropless ones);
  - the export: per-expert Hugging Face names, no missing or unexpected
    tensors against the names transformers writes, and bit-identical
    weights after import -> export.

Run: /usr/bin/python3 tests/test_moe.py --bin ./llmtrain
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hfio  # noqa: E402
import torch_ref as R  # noqa: E402

T, MB, GB = 16, 2, 4       # seq_len, micro_batch, global_batch: two micro-batches a step
V, C, NH, NKV, L = 64, 32, 4, 2, 2
E, K, FE = 4, 2, 24
LR, MIN_LR, WARMUP, DECAY, WD, B1, B2, EPS, CLIP = 3e-3, 3e-4, 1, 5, 0.1, 0.9, 0.95, 1e-8, 1.0
AUX, ZC = 0.05, 0.01
STEPS = 5

PASSED = FAILED = 0


def check(ok, msg):
    global PASSED, FAILED
    print(("ok   " if ok else "FAIL ") + msg, flush=True)
    if ok:
        PASSED += 1
    else:
        FAILED += 1
    return ok


def rel(a, b):
    a = torch.as_tensor(np.asarray(a), dtype=torch.float64)
    b = torch.as_tensor(np.asarray(b), dtype=torch.float64)
    d = float((a - b).norm())
    n = float(b.norm())
    return d / n if n > 0 else d


# --------------------------------------------------------------------------
# the reference
# --------------------------------------------------------------------------

def mixtral_config(router_coef=AUX):
    c = R.llama_config(L, C, NH, NKV, FE, V, T)
    c.update({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": E,
              "num_experts_per_tok": K, "router_aux_loss_coef": router_coef, "sliding_window": None})
    return c


def mixtral_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    t = {}

    def rnd(*shape, std=0.02):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std
    t["model.embed_tokens.weight"] = rnd(V, C, std=0.5)
    t["lm_head.weight"] = rnd(V, C, std=0.1)
    t["model.norm.weight"] = 1 + rnd(C, std=0.1)
    for i in range(L):
        h = f"model.layers.{i}."
        t[h + "input_layernorm.weight"] = 1 + rnd(C, std=0.1)
        t[h + "post_attention_layernorm.weight"] = 1 + rnd(C, std=0.1)
        t[h + "self_attn.q_proj.weight"] = rnd(NH * C // NH, C, std=0.2)
        t[h + "self_attn.k_proj.weight"] = rnd(NKV * C // NH, C, std=0.2)
        t[h + "self_attn.v_proj.weight"] = rnd(NKV * C // NH, C, std=0.2)
        t[h + "self_attn.o_proj.weight"] = rnd(C, C, std=0.2)
        # a router far from uniform: a wrong expert index changes the output
        t[h + "block_sparse_moe.gate.weight"] = rnd(E, C, std=1.0)
        for e in range(E):
            x = h + f"block_sparse_moe.experts.{e}."
            t[x + "w1.weight"] = rnd(FE, C, std=0.2)
            t[x + "w3.weight"] = rnd(FE, C, std=0.2)
            t[x + "w2.weight"] = rnd(C, FE, std=0.2)
    return t


class MoERef:
    """A Llama whose MLPs are mixtures of SwiGLU experts. names: 'mixtral'
    (block_sparse_moe.*) or 'native' (llmtrain's internal names). moe(i):
    whether layer i is MoE. Returns logits and keeps each layer's balance
    statistics of the last forward in self.aux / self.z."""

    def __init__(self, cfg, tensors, names, moe_layers, norm_topk=True, shared=0, cap=0.0, fe=FE, ffn=FE, n_layer=L):
        self.p = {n: v.detach().to(torch.float64).clone().requires_grad_(True) for n, v in tensors.items()}
        self.cfg, self.names, self.moe_layers = cfg, names, moe_layers
        self.norm_topk, self.shared, self.cap, self.fe, self.ffn = norm_topk, shared, cap, fe, ffn
        self.dropped = self.routed = 0
        self.nl = n_layer
        self.bias = [torch.zeros(E, dtype=torch.float64) for _ in range(n_layer)]  # aux-loss-free balancing
        self.counts = [torch.zeros(E, dtype=torch.float64) for _ in range(n_layer)]  # the step's choices

    def parameters(self):
        return list(self.p.values())

    def named_parameters(self):
        return list(self.p.items())

    def _moe(self, i, a):
        p = self.p
        B_, T_, C_ = a.shape
        x = a.reshape(-1, C_)
        N = x.shape[0]
        if self.names == "qwen3moe":
            h = f"model.layers.{i}.mlp."
            wg = p[h + "gate.weight"]
            exp = [(p[h + f"experts.{e}.gate_proj.weight"], p[h + f"experts.{e}.up_proj.weight"],
                    p[h + f"experts.{e}.down_proj.weight"]) for e in range(E)]
        elif self.names == "mixtral":
            h = f"model.layers.{i}.block_sparse_moe."
            wg = p[h + "gate.weight"]
            exp = [(p[h + f"experts.{e}.w1.weight"], p[h + f"experts.{e}.w3.weight"], p[h + f"experts.{e}.w2.weight"])
                   for e in range(E)]
        else:
            h = f"layers.{i}.moe."
            wg = p[h + "router.weight"]
            fc, pr, F_ = p[h + "experts.fc.weight"], p[h + "experts.proj.weight"], self.fe
            exp = [(fc[e * 2 * F_:e * 2 * F_ + F_], fc[e * 2 * F_ + F_:(e + 1) * 2 * F_], pr[e * C_:(e + 1) * C_])
                   for e in range(E)]
        logits = x @ wg.t()
        probs = torch.softmax(logits, dim=-1)
        topi = (probs.detach() + self.bias[i]).topk(K, dim=-1).indices  # the bias only chooses
        topv = probs.gather(1, topi)
        self.counts[i] += torch.bincount(topi.reshape(-1), minlength=E).to(torch.float64)
        w = topv / topv.sum(-1, keepdim=True) if self.norm_topk else topv
        # capacity: each expert takes its choices in token order while it has room
        keep = torch.ones(N, K, dtype=torch.bool)
        if self.cap > 0:
            cap = int(np.ceil(self.cap * N * K / E))
            used = [0] * E
            for n in range(N):
                for j in range(K):
                    e = int(topi[n, j])
                    if used[e] < cap:
                        used[e] += 1
                    else:
                        keep[n, j] = False
        self.dropped += int((~keep).sum())
        self.routed += N * K
        out = torch.zeros_like(x)
        for e in range(E):
            n_idx, j_idx = torch.nonzero((topi == e) & keep, as_tuple=True)
            if len(n_idx) == 0:
                continue
            w1, w3, w2 = exp[e]
            xe = x[n_idx]
            ye = (R.silu(xe @ w1.t()) * (xe @ w3.t())) @ w2.t()
            out = out.index_add(0, n_idx, w[n_idx, j_idx][:, None] * ye)
        if self.shared:
            sfc, spr, Fs = p[h + "shared.fc.weight"], p[h + "shared.proj.weight"], self.shared * self.fe
            out = out + (R.silu(x @ sfc[:Fs].t()) * (x @ sfc[Fs:].t())) @ spr.t()
        f = torch.stack([(topi == e).sum() for e in range(E)]).to(torch.float64) / (N * K)  # before the capacity
        P = probs.mean(0)
        self.aux.append(E * (f * P).sum())
        self.z.append((torch.logsumexp(logits, dim=-1) ** 2).mean())
        return out.reshape(B_, T_, C_)

    def forward(self, idx):
        p = self.p
        B_, T_ = idx.shape
        hd = C // NH
        cos, sin = R.rope_cos_sin(T_, hd, 10000.0, torch.float64)
        nat = self.names == "native"
        x = p["wte.weight" if nat else "model.embed_tokens.weight"][idx]
        self.aux, self.z = [], []
        for i in range(self.nl):
            if nat:
                pre = f"layers.{i}."
                a = R.rms_norm(x, p[pre + "ln1.weight"], 1e-5)
                qkv = a @ p[pre + "attn.qkv.weight"].t()
                q, k, v = qkv.split([NH * hd, NKV * hd, NKV * hd], dim=-1)
                wo, ln2 = p[pre + "attn.out.weight"], p[pre + "ln2.weight"]
            else:
                h = f"model.layers.{i}."
                a = R.rms_norm(x, p[h + "input_layernorm.weight"], 1e-5)
                q, k, v = (a @ p[h + f"self_attn.{n}_proj.weight"].t() for n in "qkv")
                wo, ln2 = p[h + "self_attn.o_proj.weight"], p[h + "post_attention_layernorm.weight"]
            q = R.apply_rope(q.reshape(B_, T_, NH, hd).transpose(1, 2), cos, sin)
            k = R.apply_rope(k.reshape(B_, T_, NKV, hd).transpose(1, 2), cos, sin)
            v = v.reshape(B_, T_, NKV, hd).transpose(1, 2)
            y = R.causal_attention(q, R.repeat_kv(k, NH // NKV), R.repeat_kv(v, NH // NKV))
            x = x + y.transpose(1, 2).reshape(B_, T_, NH * hd) @ wo.t()
            a = R.rms_norm(x, ln2, 1e-5)
            if self.moe_layers(i):
                x = x + self._moe(i, a)
            else:
                fc, pr = p[f"layers.{i}.mlp.fc.weight"], p[f"layers.{i}.mlp.proj.weight"]
                x = x + (R.silu(a @ fc[:self.ffn].t()) * (a @ fc[self.ffn:].t())) @ pr.t()
        x = R.rms_norm(x, p["lnf.weight" if nat else "model.norm.weight"], 1e-5)
        return x @ p["lm_head.weight" if "lm_head.weight" in p else "wte.weight"].t()

    def balance(self):
        n = len(self.aux)
        return sum(self.aux) / n, sum(self.z) / n


class Qwen3MoERef(MoERef):
    """Qwen3-MoE (Hugging Face names): head_dim hd (not C / heads), an
    RMSNorm over each query and key head (q_norm, k_norm, [hd]) before
    RoPE, MoE layers but the dense ones (mlp_only_layers), top-k not
    renormalised."""

    def __init__(self, tensors, hd, dense, ffn, n_layer):
        super().__init__(None, tensors, "qwen3moe", lambda i: i not in dense, norm_topk=False, ffn=ffn, n_layer=n_layer)
        self.hd = hd

    def forward(self, idx):
        p, hd = self.p, self.hd
        B_, T_ = idx.shape
        cos, sin = R.rope_cos_sin(T_, hd, 10000.0, torch.float64)
        x = p["model.embed_tokens.weight"][idx]
        self.aux, self.z = [], []
        for i in range(self.nl):
            h = f"model.layers.{i}."
            a = R.rms_norm(x, p[h + "input_layernorm.weight"], 1e-5)
            q, k, v = (a @ p[h + f"self_attn.{n}_proj.weight"].t() for n in "qkv")
            q = R.rms_norm(q.reshape(B_, T_, NH, hd), p[h + "self_attn.q_norm.weight"], 1e-5).transpose(1, 2)
            k = R.rms_norm(k.reshape(B_, T_, NKV, hd), p[h + "self_attn.k_norm.weight"], 1e-5).transpose(1, 2)
            q, k = R.apply_rope(q, cos, sin), R.apply_rope(k, cos, sin)
            v = v.reshape(B_, T_, NKV, hd).transpose(1, 2)
            y = R.causal_attention(q, R.repeat_kv(k, NH // NKV), R.repeat_kv(v, NH // NKV))
            x = x + y.transpose(1, 2).reshape(B_, T_, NH * hd) @ p[h + "self_attn.o_proj.weight"].t()
            a = R.rms_norm(x, p[h + "post_attention_layernorm.weight"], 1e-5)
            if self.moe_layers(i):
                x = x + self._moe(i, a)
            else:
                g, u, d = (p[h + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
                x = x + (R.silu(a @ g.t()) * (a @ u.t())) @ d.t()
        x = R.rms_norm(x, p["model.norm.weight"], 1e-5)
        return x @ p["lm_head.weight"].t()


def qwen3moe_folder(d, hd=16, dense=(1,), ffn=40, n_layer=3, seed=5):
    """A random Qwen3-MoE folder: config.json as transformers writes it and the tensors."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std=0.2: torch.randn(*s, generator=g, dtype=torch.float64) * std
    cfg = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": C, "intermediate_size": ffn,
           "moe_intermediate_size": FE, "num_hidden_layers": n_layer, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "head_dim": hd, "num_experts": E, "num_experts_per_tok": K, "norm_topk_prob": False, "decoder_sparse_step": 1,
           "mlp_only_layers": list(dense), "vocab_size": V, "max_position_embeddings": T, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False, "hidden_act": "silu",
           "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "router_aux_loss_coef": AUX}
    t = {"model.embed_tokens.weight": r(V, C, std=0.5), "lm_head.weight": r(V, C, std=0.1), "model.norm.weight": 1 + r(C, std=0.1)}
    for i in range(n_layer):
        h = f"model.layers.{i}."
        t[h + "input_layernorm.weight"] = 1 + r(C, std=0.1)
        t[h + "post_attention_layernorm.weight"] = 1 + r(C, std=0.1)
        t[h + "self_attn.q_proj.weight"] = r(NH * hd, C)
        t[h + "self_attn.k_proj.weight"] = r(NKV * hd, C)
        t[h + "self_attn.v_proj.weight"] = r(NKV * hd, C)
        t[h + "self_attn.o_proj.weight"] = r(C, NH * hd)
        t[h + "self_attn.q_norm.weight"] = 1 + r(hd, std=0.1)
        t[h + "self_attn.k_norm.weight"] = 1 + r(hd, std=0.1)
        if i in dense:
            t[h + "mlp.gate_proj.weight"], t[h + "mlp.up_proj.weight"] = r(ffn, C), r(ffn, C)
            t[h + "mlp.down_proj.weight"] = r(C, ffn)
        else:
            t[h + "mlp.gate.weight"] = r(E, C, std=1.0)
            for e in range(E):
                x = h + f"mlp.experts.{e}."
                t[x + "gate_proj.weight"], t[x + "up_proj.weight"] = r(FE, C), r(FE, C)
                t[x + "down_proj.weight"] = r(C, FE)
    hfio.write_hf_folder(d, cfg, {n: v.to(torch.float32) for n, v in t.items()})
    return cfg, {n: v.to(torch.float32).to(torch.float64) for n, v in t.items()}


def step_grads(model, x, y, aux=AUX, zc=ZC):
    """The gradient of the step's objective: the mean LM loss over its
    targets plus, per micro-batch, (aux coef x its mean aux loss + z coef x
    its mean z-loss) / micro-batches. Returns (LM loss, mean aux, mean z)."""
    n = y.numel()
    M = x.shape[0] // MB
    lm = a_sum = z_sum = 0.0
    for j in range(M):
        xb, yb = x[j * MB:(j + 1) * MB], y[j * MB:(j + 1) * MB]
        logits = model.forward(xb)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), yb.reshape(-1), reduction="sum")
        a, z = model.balance()
        ((loss / n) + (aux * a + zc * z) / M).backward()
        lm += loss.item() / n
        a_sum += a.item() / M
        z_sum += z.item() / M
    return lm, a_sum, z_sum


def ref_train(model, tokens, steps, aux=AUX, zc=ZC, rate=0.0):
    params = model.parameters()
    groups = R.param_groups(model, WD)
    opt = torch.optim.AdamW(groups, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    lrs = R.torch_lr_schedule(steps, LR, MIN_LR, WARMUP, DECAY)
    recs = []
    for s in range(steps):
        x, y = R.global_batch(tokens, s, GB, T)
        for p in params:
            p.grad = None
        model.counts = [torch.zeros(E, dtype=torch.float64) for _ in range(model.nl)]
        lm, a, z = step_grads(model, x, y, aux, zc)
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP).item()
        for g in opt.param_groups:
            g["lr"] = lrs[s]
        opt.step()
        for i in range(model.nl):  # b_e += rate sign(mean load - load_e)
            c = model.counts[i]
            model.bias[i] = model.bias[i] + rate * torch.sign(c.mean() - c)
        recs.append({"loss": lm, "aux": a, "z": z, "norm": norm})
    return recs


# --------------------------------------------------------------------------
# running llmtrain
# --------------------------------------------------------------------------

def markov(n, seed):
    rs = np.random.RandomState(seed)
    succ = rs.randint(0, V, size=(V, 3))
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    for i in range(1, n):
        out[i] = succ[out[i - 1], rs.randint(3)] if rs.rand() < 0.9 else rs.randint(V)
    return out


def write_shard(path, tokens):
    h = np.zeros(256, dtype="<i4")
    h[0], h[1], h[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def job(work, name, steps, init=None, model=None, train=None, dump=True):
    j = {"data": {"train": os.path.join(work, "train.bin"), "shuffle": False},
         "train": dict({"steps": steps, "seq_len": T, "micro_batch": MB, "global_batch": GB, "device": "cpu",
                        "moe_z_loss_coef": ZC}, **(train or {})),
         "optim": {"lr": LR, "min_lr": MIN_LR, "warmup_steps": WARMUP, "decay_steps": DECAY, "weight_decay": WD,
                   "beta1": B1, "beta2": B2, "eps": EPS, "grad_clip": CLIP},
         "eval": {"every_steps": 0, "sample_tokens": 0},
         "log": {"dir": os.path.join(work, name, "log"), "every_steps": 1},
         "checkpoint": {"dir": os.path.join(work, name, "ckpt"), "every_steps": steps}}
    if init:
        j["init"] = init
    if model:
        j["model"] = model
    if dump:
        j["debug"] = {"dump": os.path.join(work, name, "dump")}
    return j


def run(binary, work, name, j, extra=()):
    p = os.path.join(work, name + ".json")
    with open(p, "w") as f:
        json.dump(j, f)
    r = subprocess.run([binary, p] + list(extra), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=600)
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0:
        print(out[-2000:])
    return r.returncode, out


def metrics(work, name):
    with open(os.path.join(work, name, "log", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="./llmtrain")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix="llmtrain_moe_")
    tokens = markov(20000, 1)
    write_shard(os.path.join(work, "train.bin"), tokens)

    # ---- Mixtral from a Hugging Face folder ----
    cfg, ten = mixtral_config(), mixtral_tensors()
    hf = os.path.join(work, "mixtral")
    hfio.write_hf_folder(hf, cfg, {n: v.to(torch.float32) for n, v in ten.items()})
    ten32 = {n: v.to(torch.float32).to(torch.float64) for n, v in ten.items()}
    rc, out = run(binary, work, "mix", job(work, "mix", STEPS, init={"from": hf}, train={"moe_aux_loss_coef": -1}))
    check(rc == 0, "Mixtral from a Hugging Face folder trains (rc %d)" % rc)
    ref = MoERef(cfg, ten32, "mixtral", lambda i: True)
    x, y = R.global_batch(tokens, 0, GB, T)
    logits = ref.forward(x[:MB]).detach()
    d = hfio.read_safetensors(os.path.join(work, "mix", "dump", "logits.safetensors"))
    e = rel(d["logits"], logits)
    check(e < 1e-4, f"step-0 logits against the reference (rel {e:.2e})")
    # routing is far from uniform: the expert counts of the reference's first forward
    ref2 = MoERef(cfg, ten32, "mixtral", lambda i: True)
    lm, a0, z0 = step_grads(ref2, x, y, aux=AUX)
    g = hfio.read_hf_folder(os.path.join(work, "mix", "dump", "grads"))[1]
    worst, wname = 0.0, ""
    for n, p in ref2.p.items():
        r_ = rel(g[n], p.grad)
        if r_ > worst:
            worst, wname = r_, n
    check(worst < 1e-3, f"step-0 gradients of every tensor, aux and z losses included (worst rel {worst:.2e}: {wname})")
    noaux = MoERef(cfg, ten32, "mixtral", lambda i: True)
    step_grads(noaux, x, y, aux=0.0, zc=0.0)
    gw = "model.layers.0.block_sparse_moe.gate.weight"
    d_aux = rel(noaux.p[gw].grad, ref2.p[gw].grad)
    check(d_aux > 1e-3 and rel(g[gw], noaux.p[gw].grad) > 10 * rel(g[gw], ref2.p[gw].grad),
          f"the balance losses change the router's gradient ({d_aux:.2e}), as llmtrain's does")
    recs = ref_train(MoERef(cfg, ten32, "mixtral", lambda i: True), tokens, STEPS)
    ms = metrics(work, "mix")
    check(len(ms) == STEPS, f"{STEPS} step lines in metrics.jsonl")
    el = max(abs(m["loss"] - r["loss"]) / r["loss"] for m, r in zip(ms, recs))
    en = max(abs(m["grad_norm"] - r["norm"]) / r["norm"] for m, r in zip(ms, recs))
    ea = max(abs(m["moe_aux_loss"] - r["aux"]) / r["aux"] for m, r in zip(ms, recs))
    ez = max(abs(m["moe_z_loss"] - r["z"]) / r["z"] for m, r in zip(ms, recs))
    check(el < 1e-4, f"{STEPS} steps' LM losses (worst rel {el:.2e})")
    check(en < 1e-3, f"{STEPS} steps' grad norms (worst rel {en:.2e})")
    check(ea < 1e-4 and ez < 1e-4, f"the logged aux loss and z-loss (worst rel {ea:.2e}, {ez:.2e})")
    check(all(m["moe_load"] > 1.05 for m in ms) and len(ms[0]["moe_layer_load"]) == L,
          f"expert load logged per layer, far from uniform (first step {ms[0]['moe_load']:.3f})")

    # ---- export: per-expert names, round trip ----
    ex = os.path.join(work, "mix_export")
    ck = os.path.join(work, "mix", "ckpt")
    r = subprocess.run([binary, "export", ck, ex], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    check(r.returncode == 0, "export of the trained Mixtral")
    xcfg, xt = hfio.read_hf_folder(ex)
    want = set(ten)
    check(set(xt) == want, f"export has exactly the {len(want)} tensors transformers names (missing "
          f"{sorted(want - set(xt))[:3]}, unexpected {sorted(set(xt) - want)[:3]})")
    check(xcfg.get("architectures") == ["MixtralForCausalLM"] and xcfg.get("num_local_experts") == E
          and xcfg.get("num_experts_per_tok") == K and xcfg.get("intermediate_size") == FE,
          "export config.json: MixtralForCausalLM, num_local_experts, num_experts_per_tok, intermediate_size")
    rc, _ = run(binary, work, "mix_rt", job(work, "mix_rt", 1, init={"from": ex}))
    rt = hfio.read_hf_folder(os.path.join(work, "mix_rt", "dump", "params0"))[1]
    same = all(np.array_equal(np.asarray(rt[n]), np.asarray(xt[n])) for n in xt)
    check(rc == 0 and same, "import -> export of the export is bit-identical")

    # ---- a capacity factor: drops counted, losses the reference's with them ----
    capf = 1.0
    rc, _ = run(binary, work, "cap", job(work, "cap", STEPS, init={"from": hf},
                                         train={"moe_capacity_factor": capf, "moe_aux_loss_coef": AUX}))
    mc = metrics(work, "cap")
    cref = MoERef(cfg, ten32, "mixtral", lambda i: True, cap=capf)
    crecs = ref_train(cref, tokens, STEPS)
    dropped = [m["moe_dropped"] for m in mc]
    check(rc == 0 and sum(dropped) > 0, f"capacity {capf}: choices dropped and counted ({sum(dropped):.0f} over {STEPS} steps)")
    el = max(abs(m["loss"] - r["loss"]) / r["loss"] for m, r in zip(mc, crecs))
    check(el < 1e-4, f"capacity {capf}: losses the reference's with its drops (worst rel {el:.2e})")
    diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(mc, ms))
    check(diff > 1e-4, f"capacity {capf}: losses differ from dropless ({diff:.2e})")
    cnt = MoERef(cfg, ten32, "mixtral", lambda i: True, cap=capf)
    x0, _ = R.global_batch(tokens, 0, GB, T)
    for j in range(GB // MB):
        cnt.forward(x0[j * MB:(j + 1) * MB])
    check(abs(dropped[0] - cnt.dropped) < 0.5, f"step 1 drops {dropped[0]:.0f}, the reference's {cnt.dropped}")

    # ---- aux-loss-free balancing: the bias chooses, moved by the step's loads; saved and resumed ----
    rate = 0.05
    rc, _ = run(binary, work, "bias", job(work, "bias", STEPS, init={"from": hf},
                                          train={"moe_bias_update_rate": rate, "moe_aux_loss_coef": 0}))
    mb = metrics(work, "bias")
    bref = MoERef(cfg, ten32, "mixtral", lambda i: True)
    brecs = ref_train(bref, tokens, STEPS, aux=0.0, rate=rate)
    el = max(abs(m["loss"] - r["loss"]) / r["loss"] for m, r in zip(mb, brecs))
    check(rc == 0 and el < 1e-4, f"bias balancing (rate {rate}): {STEPS} steps' losses the reference's (worst rel {el:.2e})")
    plain = ref_train(MoERef(cfg, ten32, "mixtral", lambda i: True), tokens, STEPS, aux=0.0)
    moved = max(abs(a["loss"] - b["loss"]) for a, b in zip(brecs[1:], plain[1:]))
    check(moved > 1e-4, f"the bias changes the routing of the later steps (losses move by {moved:.2e})")
    with open(os.path.join(work, "bias", "ckpt", "step_%08d" % STEPS, "manifest.json")) as f:
        saved = json.load(f)["state"]["moe_bias"]
    want = torch.cat(bref.bias).tolist()
    eb = max(abs(a - b) for a, b in zip(saved, want)) if len(saved) == len(want) else float("inf")
    check(eb < 1e-6 and max(abs(v) for v in want) > 0, f"the checkpoint's moe_bias is the reference's biases ({len(saved)} values, worst {eb:.1e})")
    j3 = job(work, "bias3", 3, init={"from": hf}, train={"moe_bias_update_rate": rate, "moe_aux_loss_coef": 0}, dump=False)
    j3["checkpoint"]["every_steps"] = 3
    rc3, _ = run(binary, work, "bias3", j3)
    j5 = dict(j3, train=dict(j3["train"], steps=STEPS))
    rc5, _ = run(binary, work, "bias3", j5)
    m3 = metrics(work, "bias3")
    same = len(m3) == STEPS and all(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] for a, b in zip(m3, mb))
    check(rc3 == 0 and rc5 == 0 and same, "bias balancing resumed at step 3: steps 4-5 bit for bit the straight run's")

    # ---- Qwen3-MoE from a Hugging Face folder: head_dim, QK-norm, a dense layer, top-k not renormalised ----
    qdir = os.path.join(work, "qwen3moe")
    qcfg, qten = qwen3moe_folder(qdir)
    rc, _ = run(binary, work, "q3", job(work, "q3", 1, init={"from": qdir}, train={"moe_aux_loss_coef": -1}))
    check(rc == 0, "Qwen3-MoE from a Hugging Face folder trains")
    qref = Qwen3MoERef(qten, 16, (1,), 40, 3)
    d = hfio.read_safetensors(os.path.join(work, "q3", "dump", "logits.safetensors"))
    e = rel(d["logits"], qref.forward(x[:MB]).detach())
    check(e < 1e-4, f"Qwen3-MoE step-0 logits against the reference (rel {e:.2e})")
    qref = Qwen3MoERef(qten, 16, (1,), 40, 3)
    step_grads(qref, x, y, aux=AUX)
    qcfg2, g = hfio.read_hf_folder(os.path.join(work, "q3", "dump", "grads"))
    worst = max(rel(g[n], p.grad) for n, p in qref.p.items())
    check(worst < 1e-3, f"Qwen3-MoE step-0 gradients of every tensor (worst rel {worst:.2e})")
    pc, pt = hfio.read_hf_folder(os.path.join(work, "q3", "dump", "params0"))
    check(set(pt) == set(qten) and all(np.array_equal(np.asarray(pt[n]), qten[n].to(torch.float32).numpy()) for n in pt),
          f"Qwen3-MoE export: exactly the {len(qten)} tensors it was read from, bit for bit")
    keys = ("architectures", "model_type", "num_experts", "moe_intermediate_size", "norm_topk_prob", "mlp_only_layers",
            "head_dim", "intermediate_size", "num_experts_per_tok", "decoder_sparse_step")
    bad = {k: (pc.get(k), qcfg[k]) for k in keys if pc.get(k) != qcfg[k]}
    check(not bad, f"Qwen3-MoE export config.json says what the folder said ({bad or 'all of ' + ', '.join(keys)})")

    # ---- a Qwen3-MoE-like native model: dense layer, no renormalisation, shared experts ----
    L3 = 3
    model = {"arch": "llama", "n_layer": L3, "n_embd": C, "n_head": NH, "n_kv_head": NKV, "vocab_size": V,
             "max_seq_len": T, "ffn_hidden": 40, "moe_experts": E, "moe_top_k": K, "moe_ffn_hidden": FE,
             "moe_norm_topk": False, "moe_shared_experts": 1, "moe_dense_layers": "1"}
    rc, _ = run(binary, work, "nat", job(work, "nat", 1, model=model, train={"moe_aux_loss_coef": AUX}))
    check(rc == 0, "a native MoE with a dense layer and a shared expert trains")
    p0 = hfio.read_safetensors(os.path.join(work, "nat", "dump", "params0", "model.safetensors"))
    gn = hfio.read_safetensors(os.path.join(work, "nat", "dump", "grads", "model.safetensors"))
    nref = MoERef(None, {n: torch.as_tensor(np.asarray(v)) for n, v in p0.items()}, "native", lambda i: i != 1,
                  norm_topk=False, shared=1, ffn=40, n_layer=L3)
    step_grads(nref, x, y, aux=AUX)
    worst, wname = 0.0, ""
    for n, p in nref.p.items():
        r_ = rel(gn[n], p.grad)
        if r_ > worst:
            worst, wname = r_, n
    check(set(gn) == set(nref.p) and "layers.1.mlp.fc.weight" in gn and "layers.0.moe.shared.fc.weight" in gn,
          "the native model's tensors: a dense layer 1, shared experts in the MoE layers")
    check(worst < 1e-3, f"native MoE step-0 gradients, top-k not renormalised (worst rel {worst:.2e}: {wname})")
    print(f"{PASSED} passed, {FAILED} failed")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
