"""torch_train.py — PyTorch CPU training throughput, the baseline for the
benchmark. Builds the model from tests/torch_ref.py (random init, float32),
trains with AdamW on random tokens and prints one JSON line:
  {"torch_version", "threads", "ms_per_step", "tokens_per_s", ...}
ms_per_step is the median over the steps after the first (warm-up) one.

  /usr/bin/python3 bench/torch_train.py --arch gpt2 --n_layer 12 --n_embd 768 \
      --n_head 12 --vocab 50257 --seq_len 64 --batch 4 --steps 5
  /usr/bin/python3 bench/torch_train.py --arch llama --n_layer 12 --n_embd 768 \
      --n_head 12 --n_kv_head 4 --ffn_hidden 2048 --vocab 32000 ...
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch_ref  # noqa: E402


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
    if a.arch == "gpt2":
        cfg = torch_ref.gpt2_config(a.n_layer, a.n_embd, a.n_head, a.vocab, P)
    else:
        ffn = a.ffn_hidden
        if not ffn:
            ffn = int(2 * 4 * a.n_embd / 3)
            ffn = 256 * ((ffn + 255) // 256)
        cfg = torch_ref.llama_config(a.n_layer, a.n_embd, a.n_head, a.n_kv_head or a.n_head, ffn,
                                     a.vocab, P, theta=a.rope_theta, tie=a.tie)
    tensors = torch_ref.random_hf_tensors(cfg, std=0.02, seed=a.seed)
    model = torch_ref.RefModel(cfg, tensors, dtype=torch.float32, fast=True)
    del tensors
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
    }))


if __name__ == "__main__":
    main()
