"""torch_train.py — PyTorch CPU training throughput, the baseline for the
benchmark. Builds the model from tests/torch_ref.py (random init, float32),
trains with AdamW on random tokens and prints one JSON line:
  {"torch_version", "threads", "ms_per_step", "tokens_per_s", ...}
ms_per_step is the median over the steps after the first (warm-up) one.
flops_per_token is the benchmark's count, 6 x (parameters a token's matrix
products use) + 12 x L x C x T: for a mixture of experts, the router and
the k experts a token is routed to (its active parameters), not all E.

With --moe_experts E the Llama's every MLP is a Mixtral-style mixture of
experts written here from docs/moe.md's formulas: router softmax, top-k,
renormalised, each expert's SwiGLU over its tokens (index_select, then
index_add of the weighted outputs), plus the load-balancing loss
coef x E sum_e f_e P_e averaged over the layers.

  /usr/bin/python3 bench/torch_train.py --arch gpt2 --n_layer 12 --n_embd 768 \
      --n_head 12 --vocab 50257 --seq_len 64 --batch 4 --steps 5
  /usr/bin/python3 bench/torch_train.py --arch llama --n_layer 12 --n_embd 768 \
      --n_head 12 --n_kv_head 4 --ffn_hidden 2048 --vocab 32000 ...
  /usr/bin/python3 bench/torch_train.py --arch llama ... --moe_experts 8 \
      --moe_top_k 2 --moe_ffn_hidden 1792
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch_ref  # noqa: E402


class MoELlama:
    """A Llama whose every MLP is a mixture of E SwiGLU experts of width Fe,
    top-k routed (docs/moe.md), float32, random init N(0, 0.02). Attention
    is torch_ref's. Each expert's gate and up projections are one [2 Fe, C]
    matrix (one product, as llmtrain computes them)."""

    def __init__(self, L, C, nh, nkv, V, E, K, Fe, aux_coef, max_T, seed, norm_topk=True, eps=1e-5, theta=10000.0):
        self.L, self.C, self.nh, self.nkv, self.hd, self.V = L, C, nh, nkv, C // nh, V
        self.E, self.K, self.Fe, self.aux_coef, self.norm_topk = E, K, Fe, aux_coef, norm_topk
        self.eps, self.theta, self.max_T = eps, theta, max_T
        g = torch.Generator().manual_seed(seed)
        self.params = {}

        def mat(name, *shape):
            self.params[name] = (torch.randn(*shape, generator=g) * 0.02).requires_grad_(True)

        def ones(name):
            self.params[name] = torch.ones(C).requires_grad_(True)

        mat("embed", V, C)
        for i in range(L):
            h = f"l{i}."
            ones(h + "ln1")
            mat(h + "q", nh * self.hd, C); mat(h + "k", nkv * self.hd, C); mat(h + "v", nkv * self.hd, C)
            mat(h + "o", C, nh * self.hd)
            ones(h + "ln2")
            mat(h + "router", E, C)
            for e in range(E):
                mat(f"{h}e{e}.gate_up", 2 * Fe, C)
                mat(f"{h}e{e}.down", C, Fe)
        ones("norm")
        mat("head", V, C)

    def named_parameters(self):
        return list(self.params.items())

    def parameters(self):
        return list(self.params.values())

    def active_matmul_params(self):
        """The parameters one token's matrix products use: every 2-D tensor
        but the embedding (a lookup), k of each layer's E experts."""
        n = 0
        for name, t in self.params.items():
            if t.dim() != 2 or name == "embed":
                continue
            n += t.numel() * (self.K / self.E if ".e" in name else 1)
        return n

    def moe(self, i, a):
        """a [N, C] -> (y [N, C], aux): the routed experts' weighted sum."""
        h, N, E, K = f"l{i}.", a.shape[0], self.E, self.K
        probs = torch.softmax(a @ self.params[h + "router"].t(), dim=-1)      # [N, E]
        w, idx = probs.topk(K, dim=-1)                                        # [N, K]
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        flat = idx.reshape(-1)
        order = torch.sort(flat, stable=True)[1]                              # choices expert by expert
        counts = torch.bincount(flat, minlength=E)
        wflat = w.reshape(-1)
        y = torch.zeros_like(a)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if not n:
                continue
            sel = order[start:start + n]
            start += n
            tok = sel // K
            x = a.index_select(0, tok)
            gu = x @ self.params[f"{h}e{e}.gate_up"].t()
            gate, up = gu.split(self.Fe, dim=-1)
            out = (F.silu(gate) * up) @ self.params[f"{h}e{e}.down"].t()
            y.index_add_(0, tok, out * wflat.index_select(0, sel)[:, None])
        f = counts.to(a.dtype) / (N * K)                                      # not differentiated
        aux = E * (f * probs.mean(dim=0)).sum()
        return y, aux

    def loss(self, idx, targets):
        B, T = idx.shape
        p, nh, nkv, hd = self.params, self.nh, self.nkv, self.hd
        cos, sin = torch_ref.rope_cos_sin(T, hd, self.theta, torch.float32)
        x = p["embed"][idx]
        aux = 0.0
        for i in range(self.L):
            h = f"l{i}."
            a = torch_ref.rms_norm(x, p[h + "ln1"], self.eps)
            q = (a @ p[h + "q"].t()).view(B, T, nh, hd).transpose(1, 2)
            k = (a @ p[h + "k"].t()).view(B, T, nkv, hd).transpose(1, 2)
            v = (a @ p[h + "v"].t()).view(B, T, nkv, hd).transpose(1, 2)
            q, k = torch_ref.apply_rope(q, cos, sin), torch_ref.apply_rope(k, cos, sin)
            k, v = torch_ref.repeat_kv(k, nh // nkv), torch_ref.repeat_kv(v, nh // nkv)
            y = torch_ref.causal_attention(q, k, v).transpose(1, 2).reshape(B, T, nh * hd)
            x = x + y @ p[h + "o"].t()
            a = torch_ref.rms_norm(x, p[h + "ln2"], self.eps)
            y, aux_l = self.moe(i, a.reshape(B * T, self.C))
            x = x + y.view(B, T, self.C)
            aux = aux + aux_l
        x = torch_ref.rms_norm(x, p["norm"], self.eps)
        logits = x @ p["head"].t()
        lm = F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))
        return lm + self.aux_coef * aux / self.L, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--n_layer", type=int, default=12)
    ap.add_argument("--n_embd", type=int, default=768)
    ap.add_argument("--n_head", type=int, default=12)
    ap.add_argument("--n_kv_head", type=int, default=0, help="llama: kv heads (0 = n_head)")
    ap.add_argument("--ffn_hidden", type=int, default=0,
                    help="llama: intermediate size (0 = Llama rule 2/3*4C rounded up to 256)")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--max_seq_len", type=int, default=0, help="0 = max(seq_len, 1024)")
    ap.add_argument("--rope_theta", type=float, default=10000.0)
    ap.add_argument("--tie", action="store_true", help="llama: tie embeddings")
    ap.add_argument("--moe_experts", type=int, default=0, help="llama: routed experts of every MLP (0 = dense)")
    ap.add_argument("--moe_top_k", type=int, default=2)
    ap.add_argument("--moe_ffn_hidden", type=int, default=0, help="each expert's width (0 = ffn_hidden)")
    ap.add_argument("--moe_aux_coef", type=float, default=0.01, help="the load-balancing loss's coefficient")
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    P = a.max_seq_len or max(a.seq_len, 1024)
    if a.moe_experts and a.arch != "llama":
        ap.error("--moe_experts needs --arch llama")
    if a.moe_experts:
        model = MoELlama(a.n_layer, a.n_embd, a.n_head, a.n_kv_head or a.n_head, a.vocab, a.moe_experts, a.moe_top_k,
                         a.moe_ffn_hidden or a.ffn_hidden or 4 * a.n_embd, a.moe_aux_coef, P, a.seed, theta=a.rope_theta)
        active = model.active_matmul_params()
    elif a.arch == "gpt2":
        cfg = torch_ref.gpt2_config(a.n_layer, a.n_embd, a.n_head, a.vocab, P)
    else:
        ffn = a.ffn_hidden
        if not ffn:
            ffn = int(2 * 4 * a.n_embd / 3)
            ffn = 256 * ((ffn + 255) // 256)
        cfg = torch_ref.llama_config(a.n_layer, a.n_embd, a.n_head, a.n_kv_head or a.n_head, ffn,
                                     a.vocab, P, theta=a.rope_theta, tie=a.tie)
    if not a.moe_experts:
        tensors = torch_ref.random_hf_tensors(cfg, std=0.02, seed=a.seed)
        model = torch_ref.RefModel(cfg, tensors, dtype=torch.float32, fast=True)
        del tensors
        # every matrix but the embedding lookup (GPT-2: the tied head counts once, wpe not at all)
        active = sum(t.numel() for n, t in model.named_parameters() if t.dim() == 2 and "wpe" not in n and ("embed_tokens" not in n or model.tied))
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(torch_ref.param_groups(model, 0.1), lr=a.lr, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    params = model.parameters()
    g = torch.Generator().manual_seed(a.seed + 1)
    times = []
    loss_v = None
    for step in range(a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
        y = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _ = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss_v = loss.item()
        times.append(time.perf_counter() - t0)
    steady = times[1:] if len(times) > 1 else times
    ms = statistics.median(steady) * 1000.0
    print(json.dumps({
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "ms_per_step": round(ms, 2),
        "tokens_per_s": round(a.batch * a.seq_len / (ms / 1000.0), 1),
        "arch": a.arch, "params": n_params, "batch": a.batch, "seq_len": a.seq_len,
        "steps_timed": len(steady), "final_loss": round(loss_v, 4),
        "active_params": int(active), "flops_per_token": 6 * active + 12 * a.n_layer * a.n_embd * a.seq_len,
    }))


if __name__ == "__main__":
    main()
