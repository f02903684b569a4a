#!/usr/bin/env python3
"""test_transformers.py — llmtrain's Mixtral against Hugging Face
transformers itself (4.46.3, in the venv scripts/install_deps.sh makes at
tests/.venv-hf; Debian's torch 1.13 has no Mixtral, and transformers'
newer Qwen3-MoE needs a newer torch than Debian's):

  - test_moe.py's reference MoE layer against transformers'
    MixtralSparseMoeBlock on the same input and weights (output, router
    logits), and its load-balancing loss against transformers'
    load_balancing_loss_func (theirs is top_k times the per-layer one);
  - a MixtralForCausalLM saved by transformers (random, with a router far
    from uniform) imported by llmtrain: step-0 logits against
    transformers' on the same tokens;
  - llmtrain's export of that model (its debug dump's params0 folder,
    written by the exporter) loaded by transformers with no missing or
    unexpected keys, giving the same logits.

Run with the venv's python: tests/.venv-hf/bin/python tests/test_transformers.py --bin ./llmtrain
Without transformers it says so and exits 0 without counting anything
(run_all.sh runs it only where the venv exists).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hfio  # noqa: E402
import test_moe as TM  # noqa: E402

try:
    import transformers
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func
except Exception as e:  # noqa: BLE001
    print(f"transformers not importable here ({e}); nothing checked")
    print("0 passed, 0 failed")
    sys.exit(0)

PASSED = FAILED = 0


def check(ok, msg):
    global PASSED, FAILED
    print(("ok   " if ok else "FAIL ") + msg, flush=True)
    PASSED += bool(ok)
    FAILED += not ok
    return ok


def rel(a, b):
    a, b = torch.as_tensor(np.asarray(a), dtype=torch.float64), torch.as_tensor(np.asarray(b), dtype=torch.float64)
    return float((a - b).norm() / b.norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="./llmtrain")
    binary = os.path.abspath(ap.parse_args().bin)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix="llmtrain_tf_")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    V, C, NH, NKV, L, E, K, F, T = TM.V, TM.C, TM.NH, TM.NKV, TM.L, TM.E, TM.K, TM.FE, TM.T
    cfg = MixtralConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=NH,
                        num_key_value_heads=NKV, num_local_experts=E, num_experts_per_tok=K, max_position_embeddings=T,
                        rms_norm_eps=1e-5, rope_theta=10000.0, router_aux_loss_coef=0.02, tie_word_embeddings=False,
                        sliding_window=None, torch_dtype="float32")
    hfm = MixtralForCausalLM(cfg).eval()
    with torch.no_grad():  # a router far from uniform, norms off 1
        for n, p in hfm.named_parameters():
            if n.endswith("gate.weight"):
                p.normal_(0, 1.0)
            elif "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)

    # ---- the reference layer against MixtralSparseMoeBlock ----
    block = hfm.model.layers[0].block_sparse_moe
    x = torch.randn(2, T, C)
    with torch.no_grad():
        y_hf, logits_hf = block(x)
    ten = {f"model.layers.0.block_sparse_moe.{n}": p.detach().double() for n, p in block.named_parameters()}
    ref = TM.MoERef(None, ten, "mixtral", lambda i: True)
    ref.aux, ref.z = [], []
    y_ref = ref._moe(0, x.double())
    check(rel(y_ref.detach(), y_hf) < 1e-6, f"the test's MoE layer is transformers' MixtralSparseMoeBlock (rel {rel(y_ref.detach(), y_hf):.1e})")
    theirs = float(load_balancing_loss_func((logits_hf,), E, K))
    ours = float(ref.aux[0])
    check(abs(theirs - K * ours) < 1e-5 * theirs, f"transformers' load_balancing_loss_func {theirs:.6f} = top_k x docs/moe.md's "
          f"per-layer aux {ours:.6f}")

    # ---- llmtrain's import against transformers' forward ----
    src = os.path.join(work, "hf")
    hfm.save_pretrained(src, safe_serialization=True)
    tokens = TM.markov(5000, 2)
    TM.write_shard(os.path.join(work, "train.bin"), tokens)
    job = TM.job(work, "imp", 1, init={"from": src})
    rc, out = TM.run(binary, work, "imp", job)
    check(rc == 0, f"llmtrain reads transformers' save_pretrained folder (rc {rc})")
    xb, _ = TM.R.global_batch(tokens, 0, TM.GB, T)
    with torch.no_grad():
        want = hfm(xb[:TM.MB]).logits
    got = hfio.read_safetensors(os.path.join(work, "imp", "dump", "logits.safetensors"))["logits"]
    e = rel(got, want)
    check(e < 1e-4, f"step-0 logits are transformers' MixtralForCausalLM's (rel {e:.1e})")

    # ---- llmtrain's export loaded by transformers ----
    p0 = os.path.join(work, "imp", "dump", "params0")
    back, info = MixtralForCausalLM.from_pretrained(p0, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    check(not bad, f"transformers loads llmtrain's export with no missing or unexpected keys ({bad or 'none'})")
    with torch.no_grad():
        again = back.eval()(xb[:TM.MB]).logits
    check(rel(again, want) < 1e-6, f"the export's logits in transformers are the original's (rel {rel(again, want):.1e})")
    print(f"{PASSED} passed, {FAILED} failed")
    subprocess.run(["rm", "-rf", work])
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
