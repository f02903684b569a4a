"""test_torch.py — compares llmtrain against the independent PyTorch
reference in tests/torch_ref.py.

    /usr/bin/python3 tests/test_torch.py [--bin ./llmtrain] [--cases gpt2,llama_gqa,llama_tied,llama_yarn,qwen3]
                                         [--keep] [-v]

For each model case it writes random token shards (llm.c format), a random
Hugging Face init folder and a job file into a temp dir, runs the binary and
checks:
  - the step-0 debug dump: initial weights, logits of the first micro-batch,
    the step loss, and every gradient tensor, against torch (float64);
  - a 20-step trajectory (warmup, cosine decay, weight decay, clipping that
    triggers, gradient accumulation 2): per-step loss, lr and grad_norm from
    metrics.jsonl, and every tensor of the exported final checkpoint;
  - init.from round trips: the dumped params0 folder (F32) and a BF16 copy
    load and give torch's logits;
  - the model-section path (C's own random init, --set override).
Prints one line per check and ends with "N passed, M failed"; exit 1 on any
failure.
"""
import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hfio  # noqa: E402
import torch_ref as R  # noqa: E402

# tolerances (C computes in fp32; the reference in float64)
TOL_LOGITS = 1e-4      # relative norm error of the logits
TOL_LOSS = 1e-4        # relative error of a loss
TOL_GRAD = 1e-3        # relative norm error per gradient tensor
TOL_STEP_LOSS = 1e-3   # per-step trajectory loss
TOL_NORM = 1e-3        # per-step grad_norm
TOL_PNORM = 1e-5       # per-step param_norm (agrees to ~1e-7; a step moves it by ~5e-5)
TOL_LR = 1e-5          # per-step lr
TOL_FINAL = 1e-4       # relative norm error per final weight tensor

# --------------------------------------------------------------------------

VERBOSE = False


class Checker:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.fail_lines = []

    def check(self, ok, msg):
        line = ("ok   " if ok else "FAIL ") + msg
        print(line, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.fail_lines.append(line)
        return ok


CK = Checker()


def rel_err(c, t):
    c = c.detach().double().reshape(-1)
    t = t.detach().double().reshape(-1)
    d = (c - t).norm().item()
    n = t.norm().item()
    if n == 0.0:
        return 0.0 if d == 0.0 else float("inf")
    return d / n


def diagnose(c, t):
    """Extra facts about a mismatch: best-fit scale, max abs error, transposition."""
    c = c.detach().double()
    t = t.detach().double()
    out = []
    if c.shape != t.shape:
        return f"shape C={tuple(c.shape)} torch={tuple(t.shape)}"
    tt = (t * t).sum().item()
    if tt > 0:
        out.append(f"scale={((c * t).sum().item() / tt):.6g}")
    out.append(f"|C|={c.norm().item():.4g} |torch|={t.norm().item():.4g}")
    d = (c - t).abs()
    j = int(d.argmax().item())
    idx = np.unravel_index(j, tuple(t.shape)) if t.dim() else ()
    out.append(f"maxabs={d.max().item():.3g} at {tuple(int(i) for i in idx)} "
               f"(C={c.reshape(-1)[j].item():.6g} torch={t.reshape(-1)[j].item():.6g})")
    if c.dim() == 2 and c.shape[0] == c.shape[1] and rel_err(c.t(), t) < 1e-3:
        out.append("C == torch TRANSPOSED")
    if t.dim() == 2:  # which rows are wrong
        rows = ((c - t).norm(dim=1) > 1e-3 * t.norm(dim=1).clamp_min(1e-12)).nonzero().reshape(-1)
        if 0 < len(rows) < t.shape[0]:
            out.append(f"bad rows {len(rows)}/{t.shape[0]} first {rows[:8].tolist()}")
    return " ".join(out)


def cmp_tensor(label, c, t, tol, always_diag=False):
    if c is None:
        return CK.check(False, f"{label} missing on the C side")
    if tuple(c.shape) != tuple(t.shape):
        return CK.check(False, f"{label} shape C={tuple(c.shape)} torch={tuple(t.shape)}")
    if not torch.isfinite(c).all():
        return CK.check(False, f"{label} non-finite values on the C side")
    r = rel_err(c, t)
    ok = r <= tol
    if t.double().norm().item() == 0.0:
        m = c.double().abs().max().item() if c.numel() else 0.0
        ok = m <= 1e-7
        return CK.check(ok, f"{label} torch=0 C maxabs={m:.2g}")
    msg = f"{label} rel={r:.2g}"
    if not ok:
        msg += f" (tol {tol:g}) " + diagnose(c, t)
    elif always_diag or VERBOSE:
        msg += " " + diagnose(c, t)
    return CK.check(ok, msg)


def cmp_scalar(label, c, t, tol):
    if c is None or not math.isfinite(c):
        return CK.check(False, f"{label} C={c} torch={t:.8g}")
    r = abs(c - t) / max(abs(t), 1e-30)
    ok = r <= tol
    return CK.check(ok, f"{label} rel={r:.2g} C={c:.8g} torch={t:.8g}" + ("" if ok else f" (tol {tol:g})"))


# --------------------------------------------------------------------------
# data, jobs, running the binary
# --------------------------------------------------------------------------

def markov_tokens(n, vocab, seed):
    """A token stream with structure (each token has 3 likely successors), so
    training makes progress and gradients are not noise."""
    rs = np.random.RandomState(seed)
    succ = rs.randint(0, vocab, size=(vocab, 3))
    out = np.empty(n, dtype=np.int64)
    out[0] = rs.randint(vocab)
    r = rs.rand(n)
    pick = rs.randint(0, 3, size=n)
    rnd = rs.randint(0, vocab, size=n)
    for i in range(1, n):
        out[i] = succ[out[i - 1], pick[i]] if r[i] < 0.9 else rnd[i]
    return out


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[0] = 20240520
    header[1] = 1
    header[2] = len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read_shard(path):
    with open(path, "rb") as f:
        h = np.frombuffer(f.read(1024), dtype="<i4")
        n = int(h[2])
        assert h[0] == 20240520 and h[1] == 1
        return np.frombuffer(f.read(2 * n), dtype="<u2").astype(np.int64)


def run_bin(binary, job, workdir, name, sets=(), args_prefix=(), timeout=300):
    """Write job JSON and run; returns (ok, stdout+stderr tail)."""
    if job is not None:
        jp = os.path.join(workdir, name + ".json")
        with open(jp, "w") as f:
            json.dump(job, f, indent=1)
        cmd = [binary, jp]
        for s in sets:
            cmd += ["--set", s]
    else:
        cmd = [binary] + list(args_prefix)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout}s: {' '.join(cmd)}"
    out = p.stdout.decode("utf-8", "replace")
    if VERBOSE:
        print(f"  [{name}] rc={p.returncode} {time.time() - t0:.1f}s\n" +
              "\n".join("  | " + l for l in out.splitlines()[-15:]))
    if p.returncode != 0:
        tail = " | ".join(out.strip().splitlines()[-4:])
        return False, f"rc={p.returncode}: {tail}"
    return True, out


def read_dump_logits(dump):
    p = os.path.join(dump, "logits.safetensors")
    if not os.path.exists(p):
        return None, None
    t = hfio.read_safetensors(p)
    return t.get("logits"), t.get("loss")


def raw_tensors(path):
    """A safetensors file's tensors as name -> (dtype, shape, their bytes), read from the format itself."""
    with open(path, "rb") as f:
        buf = f.read()
    n = int.from_bytes(buf[:8], "little")
    hdr = json.loads(buf[8:8 + n])
    return {k: (v["dtype"], v["shape"], buf[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in hdr.items() if k != "__metadata__"}


def read_metrics(logdir):
    p = os.path.join(logdir, "metrics.jsonl")
    steps = {}
    if not os.path.exists(p):
        return None
    with open(p) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(o, dict) and "step" in o and "loss" in o:
                steps[int(o["step"])] = o
    return steps


# --------------------------------------------------------------------------
# the cases
# --------------------------------------------------------------------------

CASES = {
    # (a) GPT-2 tiny
    "gpt2": dict(arch="gpt2", n_layer=2, n_embd=32, n_head=4, n_kv_head=4, ffn_hidden=None,
                 vocab=64, max_seq_len=32, eps=1e-5, theta=None, tie=True, decay_all=False,
                 model_section_in_main=True),
    # (b) Llama with GQA, untied, Llama 3's RoPE scaling (theta 5e5; an
    # original context of 256 puts head_dim 8's four frequencies in every
    # band: wavelength 6.3 kept, 167 blended, 4443 and 1.2e5 divided by 32)
    "llama_gqa": dict(arch="llama", n_layer=2, n_embd=32, n_head=4, n_kv_head=2, ffn_hidden=64,
                      vocab=80, max_seq_len=32, eps=1e-5, theta=500000.0, tie=False,
                      decay_all=False, model_section_in_main=False,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
                      # warmup-stable-decay: lr over steps 5..9, a cosine to min_lr over 9..15
                      schedule={"lr_decay_style": "wsd", "wsd_decay_steps": 6, "wsd_decay_style": "cosine"}),
    # (c) Llama tied, n_kv_head == n_head, explicit ffn_hidden 48, other eps/theta, linear RoPE
    # scaling (position interpolation by 4), decay_all, a linear LR decay
    "llama_tied": dict(arch="llama", n_layer=2, n_embd=32, n_head=4, n_kv_head=4, ffn_hidden=48,
                       vocab=64, max_seq_len=32, eps=1e-6, theta=100.0, tie=True,
                       decay_all=True, model_section_in_main=True, schedule={"lr_decay_style": "linear"},
                       rope_scaling={"rope_type": "linear", "factor": 4.0}),
    # (d) Llama with GQA, untied, YaRN by 4 over an original context of 256 with Hugging
    # Face's defaults (betas 32/1, truncated, attention factor 0.1 ln 4 + 1): head_dim 8's
    # frequency 0 kept, 1 blended, 2 and 3 divided by 4
    "llama_yarn": dict(arch="llama", n_layer=2, n_embd=32, n_head=4, n_kv_head=2, ffn_hidden=48,
                       vocab=64, max_seq_len=32, eps=1e-5, theta=10000.0, tie=False,
                       decay_all=False, model_section_in_main=True,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 256}),
    # (e) Qwen3 (Qwen3ForCausalLM): GQA, tied, a head_dim of 12 (not n_embd / n_head = 8;
    # q heads 48 wide against n_embd 32) and QK-norm before RoPE
    "qwen3": dict(arch="llama", n_layer=2, n_embd=32, n_head=4, n_kv_head=2, head_dim=12, qk_norm=True,
                  ffn_hidden=48, vocab=64, max_seq_len=32, eps=1e-6, theta=10000.0, tie=True,
                  decay_all=False, model_section_in_main=True),
}

T = 16            # seq_len (< max_seq_len, so GPT-2's unused wpe rows must get zero grad)
MB = 2            # micro_batch
GB = 4            # global_batch -> 2 accumulation micro-batches
STEPS = 20
LR, MIN_LR, WARMUP, DECAY = 3e-3, 3e-4, 5, 15  # steps 16..20 run at min_lr
WD, B1, B2, EPS = 0.1, 0.9, 0.95, 1e-8


def hf_config(c):
    if c["arch"] == "gpt2":
        return R.gpt2_config(c["n_layer"], c["n_embd"], c["n_head"], c["vocab"], c["max_seq_len"],
                             eps=c["eps"])
    if c.get("qk_norm"):
        cfg = R.qwen3_config(c["n_layer"], c["n_embd"], c["n_head"], c["n_kv_head"], c["head_dim"], c["ffn_hidden"],
                             c["vocab"], c["max_seq_len"], eps=c["eps"], theta=c["theta"], tie=c["tie"])
    else:
        cfg = R.llama_config(c["n_layer"], c["n_embd"], c["n_head"], c["n_kv_head"], c["ffn_hidden"],
                             c["vocab"], c["max_seq_len"], eps=c["eps"], theta=c["theta"], tie=c["tie"])
    # keys a real HF Llama config.json carries
    cfg.update({"rope_scaling": c.get("rope_scaling"), "torch_dtype": "float32", "bos_token_id": 1,
                "eos_token_id": 2, "initializer_range": 0.02})
    return cfg


def model_section(c, ffn=True):
    m = {"arch": c["arch"], "n_layer": c["n_layer"], "n_embd": c["n_embd"], "n_head": c["n_head"],
         "vocab_size": c["vocab"], "max_seq_len": c["max_seq_len"], "norm_eps": c["eps"]}
    if c["arch"] == "llama":
        m.update({"n_kv_head": c["n_kv_head"], "rope_theta": c["theta"],
                  "tie_embeddings": c["tie"]})
        if c.get("qk_norm"):
            m.update({"head_dim": c["head_dim"], "qk_norm": True})
        rs = c.get("rope_scaling")
        if rs:
            m.update({"rope_scaling": rs["rope_type"], "rope_scaling_factor": rs["factor"]})
        if rs and rs["rope_type"] == "llama3":
            m.update({"rope_low_freq_factor": rs["low_freq_factor"],
                      "rope_high_freq_factor": rs["high_freq_factor"],
                      "rope_original_max_seq_len": rs["original_max_position_embeddings"]})
        if rs and rs["rope_type"] == "yarn":
            m["rope_original_max_seq_len"] = rs["original_max_position_embeddings"]
            m.update({f"rope_{k}": rs[k] for k in ("beta_fast", "beta_slow", "attention_factor", "truncate")
                      if k in rs})
        if ffn:
            m["ffn_hidden"] = c["ffn_hidden"]
    return m


def base_job(work, name, c, steps, grad_clip, init=None, model=None, dump=True, train_glob=None):
    job = {
        "description": f"test_torch {name}",
        "data": {"train": train_glob or os.path.join(work, "train_*.bin"),
                 "val": os.path.join(work, "val.bin"), "shuffle": False},
        "train": {"steps": steps, "seq_len": T, "micro_batch": MB, "global_batch": GB,
                  "device": "cpu"},
        "optim": {"lr": LR, "min_lr": MIN_LR, "warmup_steps": WARMUP, "decay_steps": DECAY,
                  "weight_decay": WD, "decay_all": c["decay_all"], "beta1": B1, "beta2": B2,
                  "eps": EPS, "grad_clip": grad_clip},
        "eval": {"every_steps": 0, "batches": 1, "sample_tokens": 0},
        "log": {"dir": os.path.join(work, name, "log"), "every_steps": 1},
        "checkpoint": {"dir": os.path.join(work, name, "ckpt"), "every_steps": 0},
    }
    job["optim"].update(c.get("schedule") or {})
    if init is not None:
        job["init"] = init
    if model is not None:
        job["model"] = model
    if dump:
        job["debug"] = {"dump": os.path.join(work, name, "dump")}
    return job


def torch_step0(cfg, tensors, tokens, dtype=torch.float64, eod=None):
    """Loss, first-micro-batch logits and grads of step 0 in torch (eod:
    block-causal attention)."""
    m = R.RefModel(cfg, tensors, dtype=dtype, eod=eod)
    x, y = R.global_batch(tokens, 0, GB, T)
    loss, logits = R.forward_backward(m, x, y, MB)
    return loss, logits, R.grads_dict(m)


def check_names(label, got, cfg):
    exp = set(R.expected_shapes(cfg))
    g = set(got)
    ok = g == exp
    msg = f"{label} tensor names ({len(g)})"
    if not ok:
        msg += f" missing={sorted(exp - g)[:6]} extra={sorted(g - exp)[:6]}"
    return CK.check(ok, msg)


def run_case(binary, cname, c, root):
    work = os.path.join(root, cname)
    os.makedirs(work)
    tag = cname
    V = c["vocab"]

    # ---- data: two train shards (glob) + val ----
    toks = markov_tokens(2200, V, seed=sorted(CASES).index(cname) + 101)
    write_shard(os.path.join(work, "train_000.bin"), toks[:1300])
    write_shard(os.path.join(work, "train_001.bin"), toks[1300:])
    write_shard(os.path.join(work, "val.bin"), markov_tokens(600, V, seed=7))
    train_tokens = np.concatenate([read_shard(p) for p in sorted(glob.glob(os.path.join(work, "train_*.bin")))])

    # ---- random HF init folder ----
    cfg = hf_config(c)
    init_t = R.random_hf_tensors(cfg, std=0.1, seed=17, norm_jitter=0.1, bias_std=0.05)
    init_dir = os.path.join(work, "init_hf")
    hfio.write_hf_folder(init_dir, cfg, init_t)
    init_t = hfio.read_hf_folder(init_dir)[1]

    # ---- choose grad_clip so that clipping triggers on some steps only ----
    probe = R.RefModel(cfg, init_t, dtype=torch.float64)
    norms = [r["grad_norm"] for r in R.train(probe, train_tokens, STEPS, T, MB, GB, LR, MIN_LR, WARMUP,
                                             DECAY, WD, c["decay_all"], B1, B2, EPS, grad_clip=0.0,
                                             schedule=c.get("schedule"))]
    clip = float(np.float32(np.median(norms)))

    # ---- main run: dump + 20-step trajectory + final checkpoint ----
    job = base_job(work, "main", c, STEPS, clip, init={"from": init_dir},
                   model=model_section(c) if c["model_section_in_main"] else None)
    ok, out = run_bin(binary, job, work, "main")
    if not CK.check(ok, f"{tag} main run (init.from HF folder, {STEPS} steps)" + ("" if ok else f": {out}")):
        return
    dump = os.path.join(work, "main", "dump")

    # params0 == the init folder
    p0_dir = os.path.join(dump, "params0")
    if not CK.check(os.path.exists(os.path.join(p0_dir, "model.safetensors")),
                    f"{tag} dump/params0 written"):
        return
    p0_cfg, p0 = hfio.read_hf_folder(p0_dir)
    check_names(f"{tag} params0", p0, cfg)
    keys = ["model_type", "vocab_size"] + (
        ["n_layer", "n_embd", "n_head", "n_positions"] if c["arch"] == "gpt2" else
        ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "max_position_embeddings"]) + (
        ["architectures", "head_dim"] if c.get("qk_norm") else [])
    bad = {k: (p0_cfg.get(k), cfg[k]) for k in keys if p0_cfg.get(k) != cfg[k]}
    epsk = "layer_norm_epsilon" if c["arch"] == "gpt2" else "rms_norm_eps"
    if abs(float(p0_cfg.get(epsk, -1)) - cfg[epsk]) > 1e-6 * cfg[epsk]:
        bad[epsk] = (p0_cfg.get(epsk), cfg[epsk])
    if c["arch"] == "llama":
        if abs(float(p0_cfg.get("rope_theta", -1)) - cfg["rope_theta"]) > 1e-6 * cfg["rope_theta"]:
            bad["rope_theta"] = (p0_cfg.get("rope_theta"), cfg["rope_theta"])
        if p0_cfg.get("rope_scaling") != cfg["rope_scaling"]:
            bad["rope_scaling"] = (p0_cfg.get("rope_scaling"), cfg["rope_scaling"])
        if bool(p0_cfg.get("tie_word_embeddings", False)) != cfg["tie_word_embeddings"]:
            bad["tie_word_embeddings"] = (p0_cfg.get("tie_word_embeddings"), cfg["tie_word_embeddings"])
    CK.check(not bad, f"{tag} params0 config.json" + (f" mismatches (C, expected): {bad}" if bad else ""))
    worst = max((rel_err(p0[n], init_t[n]) for n in init_t if n in p0), default=float("inf"))
    CK.check(worst == 0.0, f"{tag} params0 == init.from weights exactly (worst rel={worst:.2g})")

    # step 0 in torch on params0
    loss_t, logits_t, grads_t = torch_step0(cfg, p0, train_tokens)
    logits_c, loss_c = read_dump_logits(dump)
    if CK.check(logits_c is not None and loss_c is not None, f"{tag} dump/logits.safetensors has logits+loss"):
        cmp_tensor(f"{tag} step0 logits [first micro-batch]", logits_c, logits_t, TOL_LOGITS)
        cmp_scalar(f"{tag} step0 loss", float(loss_c.reshape(-1)[0]), loss_t, TOL_LOSS)
        if c.get("qk_norm"):  # QK-norm did something: the same weights without it give other logits
            _, no_qkn, _ = torch_step0(dict(cfg, model_type="llama"), p0, train_tokens)
            far = rel_err(logits_c, no_qkn)
            CK.check(far > 100 * TOL_LOGITS, f"{tag} step0 logits are far from those without QK-norm (rel {far:.2g})")
        if cfg.get("rope_scaling"):  # the scaling did something: the unscaled RoPE's logits are far
            _, unscaled, _ = torch_step0(dict(cfg, rope_scaling=None), p0, train_tokens)
            far = rel_err(logits_c, unscaled)
            CK.check(far > 100 * TOL_LOGITS, f"{tag} step0 logits are far from unscaled RoPE's "
                                             f"({cfg['rope_scaling']['rope_type']}; rel {far:.2g})")
            if cfg["rope_scaling"]["rope_type"] == "yarn":  # and YaRN's attention factor did something
                _, no_af, _ = torch_step0(dict(cfg, rope_scaling=dict(cfg["rope_scaling"], attention_factor=1.0)),
                                          p0, train_tokens)
                far = rel_err(logits_c, no_af)
                CK.check(far > 100 * TOL_LOGITS, f"{tag} step0 logits are far from YaRN's with attention factor 1 "
                                                 f"(rel {far:.2g})")
    g_dir = os.path.join(dump, "grads")
    if CK.check(os.path.exists(os.path.join(g_dir, "model.safetensors")), f"{tag} dump/grads written"):
        _, grads_c = hfio.read_hf_folder(g_dir)
        check_names(f"{tag} grads", grads_c, cfg)
        for n in R.expected_shapes(cfg):
            cmp_tensor(f"{tag} grad {n}", grads_c.get(n), grads_t[n], TOL_GRAD)
        if c["arch"] == "gpt2":
            # d loss / d key-bias is analytically 0: C's must be rounding-level
            C = c["n_embd"]
            for i in range(c["n_layer"]):
                n = f"transformer.h.{i}.attn.c_attn.bias"
                if n in grads_c:
                    gk = grads_c[n][C:2 * C].double().norm().item()
                    gq = grads_t[n].double().norm().item()
                    CK.check(gk <= 1e-4 * gq, f"{tag} grad {n} [k part] ~ 0 (analytically zero): "
                                              f"|C|={gk:.2g} vs |whole|={gq:.2g}")
        gn_c = math.sqrt(sum(float((g.double() ** 2).sum()) for n, g in grads_c.items()
                             if n in grads_t))
        gn_t = math.sqrt(sum(float((g ** 2).sum()) for g in grads_t.values()))
        cmp_scalar(f"{tag} step0 global grad norm (from dumped grads)", gn_c, gn_t, TOL_NORM)

    # ---- trajectory ----
    ref = R.RefModel(cfg, p0, dtype=torch.float64)
    recs = R.train(ref, train_tokens, STEPS, T, MB, GB, LR, MIN_LR, WARMUP, DECAY, WD, c["decay_all"],
                   B1, B2, EPS, grad_clip=clip, schedule=c.get("schedule"))
    n_clipped = sum(r["clipped"] for r in recs)
    CK.check(0 < n_clipped < STEPS, f"{tag} grad_clip={clip:.4g} triggers in torch on {n_clipped}/{STEPS} steps")
    ref32 = R.RefModel(cfg, p0, dtype=torch.float32)  # fp32 torch: the noise floor, for context
    R.train(ref32, train_tokens, STEPS, T, MB, GB, LR, MIN_LR, WARMUP, DECAY, WD, c["decay_all"],
            B1, B2, EPS, grad_clip=clip, schedule=c.get("schedule"))
    steps = read_metrics(os.path.join(work, "main", "log"))
    if CK.check(steps is not None and sorted(steps) == list(range(1, STEPS + 1)),
                f"{tag} metrics.jsonl has step lines 1..{STEPS}" +
                ("" if steps is None else f" (got {sorted(steps)[:3]}..{sorted(steps)[-3:]})")):
        traj = (("loss", TOL_STEP_LOSS), ("lr", TOL_LR), ("grad_norm", TOL_NORM), ("param_norm", TOL_PNORM))
        worst = {key: 0.0 for key, _ in traj}
        for r in recs:
            o = steps[r["step"]]
            for key, tol in traj:
                cv = o.get(key)
                if cv is None or not isinstance(cv, (int, float)):
                    CK.check(False, f"{tag} step {r['step']} {key} missing in metrics.jsonl: {o}")
                    continue
                e = abs(cv - r[key]) / max(abs(r[key]), 1e-30)
                worst[key] = max(worst[key], e)
                if e > tol or VERBOSE:
                    CK.check(e <= tol, f"{tag} step {r['step']} {key} rel={e:.2g} C={cv:.8g} "
                                       f"torch={r[key]:.8g}" + ("" if e <= tol else f" (tol {tol:g})"))
        for key, tol in traj:
            CK.check(worst[key] <= tol, f"{tag} trajectory {key} steps 1..{STEPS} worst rel={worst[key]:.2g}")
        # param_norm is the norm after the step's update, not before it (the
        # previous step's norm): C is 10x nearer torch's after than before
        def pn_rel(r, ahead):  # C's param_norm ahead steps later against torch's at r
            return abs(steps[r["step"] + ahead].get("param_norm", 0) - r["param_norm"]) / r["param_norm"]
        after, before = (sum(pn_rel(r, ahead) for r in recs[:-1]) / (len(recs) - 1) for ahead in (0, 1))
        CK.check(before > 10 * after, f"{tag} param_norm is after the update: mean rel {after:.2g} to torch's, "
                                      f"{before:.2g} to the step before's")
        CK.check(recs[-1]["loss"] < recs[0]["loss"],
                 f"{tag} loss decreases {recs[0]['loss']:.4f} -> {recs[-1]['loss']:.4f} (torch)")

    # ---- final weights via export ----
    exp_dir = os.path.join(work, "main", "export")
    ok, out = run_bin(binary, None, work, "export",
                      args_prefix=["export", os.path.join(work, "main", "ckpt"), exp_dir])
    if CK.check(ok and os.path.exists(os.path.join(exp_dir, "model.safetensors")),
                f"{tag} llmtrain export <ckpt> <dir>" + ("" if ok else f": {out}")):
        ecfg, fin = hfio.read_hf_folder(exp_dir)
        check_names(f"{tag} export", fin, cfg)
        CK.check(all(ecfg.get(k) == cfg[k] for k in keys), f"{tag} export config.json")
        fin_t = ref.state_dict()
        fin_32 = ref32.state_dict()
        for n in R.expected_shapes(cfg):
            noise = rel_err(fin_32[n], fin_t[n])
            if n.endswith("attn.c_attn.bias") and fin.get(n) is not None and fin[n].shape == fin_t[n].shape:
                # The key bias has an analytically zero gradient (q.b_k is constant
                # over the keys a query attends to, softmax ignores it), so its
                # gradient is rounding noise that Adam turns into +-lr steps: the
                # fp32 trajectory of that slice is noise. Compare q|v exactly and
                # only bound the k slice.
                C = c["n_embd"]
                sel = torch.cat([torch.arange(0, C), torch.arange(2 * C, 3 * C)])
                cmp_tensor(f"{tag} final {n} [q|v parts]", fin[n][sel], fin_t[n][sel], TOL_FINAL)
                dk = (fin[n][C:2 * C].double() - fin_t[n][C:2 * C]).abs().max().item()
                CK.check(dk <= STEPS * LR, f"{tag} final {n} [k part, zero-gradient noise] "
                                           f"maxabs={dk:.2g} <= steps*lr={STEPS * LR:g} "
                                           f"(fp32-torch noise whole tensor {noise:.1g})")
                continue
            cmp_tensor(f"{tag} final {n} (fp32-torch noise {noise:.1g})", fin.get(n), fin_t[n], TOL_FINAL)

    # ---- Qwen3 import -> train at lr 0 -> checkpoint -> export: the folder's tensors, byte for byte ----
    if c.get("qk_norm"):
        job = base_job(work, "rt_export", c, 1, 1.0, init={"from": init_dir}, dump=False)
        job["optim"].update({"lr": 0.0, "min_lr": 0.0})
        ok, out = run_bin(binary, job, work, "rt_export")
        rt_dir = os.path.join(work, "rt_export", "hf")
        if ok:
            ok, out = run_bin(binary, None, work, "rt_export_x",
                              args_prefix=["export", os.path.join(work, "rt_export", "ckpt"), rt_dir])
        if CK.check(ok, f"{tag} init.from Qwen3 folder, 1 step at lr 0, export" + ("" if ok else f": {out}")):
            a = raw_tensors(os.path.join(init_dir, "model.safetensors"))
            b = raw_tensors(os.path.join(rt_dir, "model.safetensors"))
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            CK.check(not diff and len(a) == len(R.expected_shapes(cfg)),
                     f"{tag} import -> export: {len(a)} tensors byte-identical (name, dtype, shape, bytes)" +
                     (f"; differ: {diff[:4]}" if diff else ""))
            with open(os.path.join(rt_dir, "config.json")) as f:
                rc = json.load(f)
            want = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": c["head_dim"],
                    "num_attention_heads": c["n_head"], "num_key_value_heads": c["n_kv_head"], "hidden_size": c["n_embd"],
                    "tie_word_embeddings": c["tie"], "attention_bias": False, "use_sliding_window": False}
            bad = {k: (rc.get(k), v) for k, v in want.items() if rc.get(k) != v}
            if abs(rc.get("rope_theta", 0) - c["theta"]) > 1e-6 * c["theta"] or abs(rc.get("rms_norm_eps", 0) - c["eps"]) > 1e-6 * c["eps"]:
                bad["rope_theta/rms_norm_eps"] = (rc.get("rope_theta"), rc.get("rms_norm_eps"))
            CK.check(not bad, f"{tag} export config.json: Qwen3's keys" + (f" (got, expected): {bad}" if bad else ""))

    # ---- init.from round trip: params0 (F32) ----
    with torch.no_grad():
        m = R.RefModel(cfg, p0)
        x, _ = R.global_batch(train_tokens, 0, GB, T)
        logits_p0 = m(x[:MB])
    job = base_job(work, "rt_f32", c, 1, 1.0, init={"from": p0_dir})
    ok, out = run_bin(binary, job, work, "rt_f32")
    if CK.check(ok, f"{tag} init.from dumped params0 (F32)" + ("" if ok else f": {out}")):
        lc, _ = read_dump_logits(os.path.join(work, "rt_f32", "dump"))
        cmp_tensor(f"{tag} init.from params0 logits", lc, logits_p0, TOL_LOGITS)

    # ---- init.from a BF16 folder ----
    bf_dir = os.path.join(work, "params0_bf16")
    hfio.write_hf_folder(bf_dir, p0_cfg, p0, dtype="BF16")
    p0_bf = {n: torch.from_numpy(hfio.round_to_bf16(t.numpy())) for n, t in p0.items()}
    with open(os.path.join(bf_dir, "model.safetensors"), "rb") as f:
        hl = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(hl))
    CK.check(all(v["dtype"] == "BF16" for k, v in hdr.items() if k != "__metadata__"),
             f"{tag} BF16 folder written as BF16")
    with torch.no_grad():
        logits_bf = R.RefModel(cfg, p0_bf)(x[:MB])
    job = base_job(work, "rt_bf16", c, 1, 1.0, init={"from": bf_dir})
    ok, out = run_bin(binary, job, work, "rt_bf16")
    if CK.check(ok, f"{tag} init.from BF16 folder" + ("" if ok else f": {out}")):
        d = os.path.join(work, "rt_bf16", "dump")
        lc, _ = read_dump_logits(d)
        cmp_tensor(f"{tag} init.from BF16 logits", lc, logits_bf, TOL_LOGITS)
        if os.path.exists(os.path.join(d, "params0", "model.safetensors")):
            _, pb = hfio.read_hf_folder(os.path.join(d, "params0"))
            worst = max((rel_err(pb[n], p0_bf[n]) for n in p0_bf if n in pb), default=float("inf"))
            CK.check(worst == 0.0 and set(pb) == set(p0_bf),
                     f"{tag} BF16 load == bf16-rounded weights exactly (worst rel={worst:.2g})")

    # ---- model section, C's own random init, --set override ----
    ms = model_section(c, ffn=(c["arch"] == "llama" and cname != "llama_gqa"))
    job = base_job(work, "cinit", c, STEPS, 1.0, init={"std": 0.02, "seed": 1}, model=ms)
    ok, out = run_bin(binary, job, work, "cinit", sets=["train.steps=1"])
    if CK.check(ok, f"{tag} model section + C random init + --set train.steps=1" + ("" if ok else f": {out}")):
        d = os.path.join(work, "cinit", "dump")
        st = read_metrics(os.path.join(work, "cinit", "log")) or {}
        CK.check(sorted(st) == [1], f"{tag} --set train.steps=1 ran 1 step (step lines {sorted(st)})")
        if os.path.exists(os.path.join(d, "params0", "model.safetensors")):
            ccfg, cp = hfio.read_hf_folder(os.path.join(d, "params0"))
            if c["arch"] == "llama" and "ffn_hidden" not in ms:
                exp_ffn = 256 * math.ceil(8 * c["n_embd"] / 3 / 256)
                CK.check(ccfg.get("intermediate_size") == exp_ffn,
                         f"{tag} default ffn_hidden (Llama rule) = {ccfg.get('intermediate_size')} "
                         f"expected {exp_ffn}")
            try:
                R.RefModel(ccfg, cp)
                built = True
            except Exception as e:  # noqa: BLE001
                built = CK.check(False, f"{tag} C-init params0 does not build in torch: {e}")
            if built:
                # init statistics
                L = ccfg.get("n_layer", ccfg.get("num_hidden_layers"))
                stats = []
                for n, t in cp.items():
                    if t.dim() == 2:
                        resid = any(s in n for s in ("attn.c_proj", "mlp.c_proj", "o_proj", "down_proj"))
                        exp_std = 0.02 / math.sqrt(2 * L) if resid else 0.02
                        s = t.double().std().item()
                        if abs(s / exp_std - 1) > 0.15:
                            stats.append(f"{n} std={s:.4g} expected~{exp_std:.4g}")
                    elif n.endswith(".bias"):
                        if t.abs().max().item() != 0.0:
                            stats.append(f"{n} not zero")
                    elif not torch.all(t == 1.0):
                        stats.append(f"{n} not all ones")
                CK.check(not stats, f"{tag} C random init statistics" + (": " + "; ".join(stats[:4]) if stats else ""))
                lt, lgt, gt = torch_step0(ccfg, cp, train_tokens)
                lc, lsc = read_dump_logits(d)
                cmp_tensor(f"{tag} C-init step0 logits", lc, lgt, TOL_LOGITS)
                if lsc is not None:
                    cmp_scalar(f"{tag} C-init step0 loss", float(lsc.reshape(-1)[0]), lt, TOL_LOSS)
                if os.path.exists(os.path.join(d, "grads", "model.safetensors")):
                    _, gc = hfio.read_hf_folder(os.path.join(d, "grads"))
                    worst_n, worst_r = None, 0.0
                    for n in gt:
                        r = rel_err(gc[n], gt[n]) if n in gc and gc[n].shape == gt[n].shape else float("inf")
                        if gt[n].norm() == 0 and n in gc:
                            r = 0.0 if gc[n].abs().max() <= 1e-7 else float("inf")
                        if r > worst_r or worst_n is None:
                            worst_n, worst_r = n, r
                    CK.check(worst_r <= TOL_GRAD, f"{tag} C-init step0 grads worst rel={worst_r:.2g} ({worst_n})")
        else:
            CK.check(False, f"{tag} cinit dump/params0 missing")

    # ---- data wrap (GPT-2 only): data shorter than one global batch ----
    if cname == "gpt2":
        wrap_dir = os.path.join(work, "wrapdata")
        os.makedirs(wrap_dir)
        wt = toks[:50]  # sequence 3 of step 0 starts at 48 and wraps to the start
        write_shard(os.path.join(wrap_dir, "train_000.bin"), wt)
        job = base_job(work, "wrap", c, 1, 1.0, init={"from": init_dir},
                       train_glob=os.path.join(wrap_dir, "train_*.bin"))
        ok, out = run_bin(binary, job, work, "wrap")
        if CK.check(ok, f"{tag} run on 50-token data (wraps inside step 0)" + ("" if ok else f": {out}")):
            lc, lsc = read_dump_logits(os.path.join(work, "wrap", "dump"))
            lt, _, _ = torch_step0(cfg, init_t, wt)
            if lsc is not None:
                cmp_scalar(f"{tag} wrapped step0 loss (token offset mod n_tokens)",
                           float(lsc.reshape(-1)[0]), lt, TOL_LOSS)


def hf_init_folder(work, c, seed):
    """A random Hugging Face folder <work>/init_hf for case c: (its config,
    the folder, the tensors as read back)."""
    cfg = hf_config(c)
    init_dir = os.path.join(work, "init_hf")
    hfio.write_hf_folder(init_dir, cfg, R.random_hf_tensors(cfg, std=0.1, seed=seed, norm_jitter=0.1, bias_std=0.05))
    return cfg, init_dir, hfio.read_hf_folder(init_dir)[1]


def run_bf16(binary, root):
    """train.param_dtype bf16 (nearest rounding) against torch's FSDP-style
    mixed precision: fp32/64 master weights updated by AdamW, the model's
    weights their bf16 rounding. The step-0 working weights are exactly the
    rounded init, logits/grads match torch on them, and the trajectory
    matches the bf16 reference much more closely than a full-precision one."""
    c = CASES["llama_gqa"]
    tag = "bf16"
    work = os.path.join(root, "bf16")
    os.makedirs(work)
    V = c["vocab"]
    toks = markov_tokens(2200, V, seed=211)
    write_shard(os.path.join(work, "train_000.bin"), toks)
    write_shard(os.path.join(work, "val.bin"), markov_tokens(600, V, seed=7))
    cfg, init_dir, init_t = hf_init_folder(work, c, seed=23)
    steps = 12
    job = base_job(work, "main", c, steps, 1.0, init={"from": init_dir})
    job["train"]["param_dtype"] = "bf16"
    ok, out = run_bin(binary, job, work, "main")
    if not CK.check(ok, f"{tag} run (param_dtype bf16, {steps} steps)" + ("" if ok else f": {out}")):
        return
    dump = os.path.join(work, "main", "dump")
    _, p0 = hfio.read_hf_folder(os.path.join(dump, "params0"))
    rounded = {n: R.round_bf16(t.float()) for n, t in init_t.items()}
    exact = all(torch.equal(p0[n].float(), rounded[n]) for n in rounded)
    changed = sum(int((rounded[n] != init_t[n].float()).sum()) for n in rounded)
    total = sum(t.numel() for t in rounded.values())
    CK.check(exact and changed > total // 2, f"{tag} step-0 working weights == bf16 rounding of init.from "
                                           f"({changed}/{total} values changed by the rounding)")
    loss_t, logits_t, grads_t = torch_step0(cfg, rounded, toks)
    logits_c, loss_c = read_dump_logits(dump)
    cmp_tensor(f"{tag} step0 logits on the bf16 weights", logits_c, logits_t, TOL_LOGITS)
    cmp_scalar(f"{tag} step0 loss", float(loss_c.reshape(-1)[0]), loss_t, TOL_LOSS)
    _, grads_c = hfio.read_hf_folder(os.path.join(dump, "grads"))
    worst = max(rel_err(grads_c[n], grads_t[n]) for n in grads_t)
    CK.check(worst <= TOL_GRAD, f"{tag} step0 grads on the bf16 weights worst rel={worst:.2g}")
    ref = R.RefModel(cfg, init_t, dtype=torch.float64)
    recs = R.train(ref, toks, steps, T, MB, GB, LR, MIN_LR, WARMUP, DECAY, WD, c["decay_all"], B1, B2, EPS,
                   grad_clip=1.0, bf16_working=True, schedule=c.get("schedule"))
    full = R.train(R.RefModel(cfg, init_t, dtype=torch.float64), toks, steps, T, MB, GB, LR, MIN_LR, WARMUP, DECAY,
                   WD, c["decay_all"], B1, B2, EPS, grad_clip=1.0, schedule=c.get("schedule"))
    got = read_metrics(os.path.join(work, "main", "log"))
    e_bf = max(abs(got[r["step"]]["loss"] - r["loss"]) / r["loss"] for r in recs)
    e_full = max(abs(got[r["step"]]["loss"] - r["loss"]) / r["loss"] for r in full)
    n_bf = max(abs(got[r["step"]]["grad_norm"] - r["grad_norm"]) / r["grad_norm"] for r in recs)
    # the parameter norm is the fp32 masters', not the bf16 working weights'
    p_bf = max(abs(got[r["step"]]["param_norm"] - r["param_norm"]) / r["param_norm"] for r in recs)
    CK.check(e_bf <= TOL_STEP_LOSS and n_bf <= TOL_NORM and p_bf <= TOL_PNORM,
             f"{tag} trajectory vs torch with bf16 working weights: loss worst rel={e_bf:.2g}, grad_norm {n_bf:.2g}, "
             f"param_norm (the masters') {p_bf:.2g}")
    CK.check(e_bf * 10 < e_full, f"{tag} C is nearer the bf16 reference ({e_bf:.2g}) than the full-precision one "
                                 f"({e_full:.2g}) by more than 10x")
    exp_dir = os.path.join(work, "main", "export")
    ok, out = run_bin(binary, None, work, "export", args_prefix=["export", os.path.join(work, "main", "ckpt"), exp_dir])
    if CK.check(ok, f"{tag} export" + ("" if ok else f": {out}")):
        _, fin = hfio.read_hf_folder(exp_dir)
        fin_t = ref.state_dict()
        worst = max(rel_err(fin[n], fin_t[n]) for n in fin_t)
        CK.check(worst <= TOL_FINAL, f"{tag} exported master weights vs torch's masters worst rel={worst:.2g}")


def doc_tokens(n, vocab, eod, seed):
    """markov_tokens with the document end eod written every 1..10 tokens:
    documents shorter than a row (T = 16), some across row boundaries"""
    toks = markov_tokens(n, vocab, seed)
    rs = np.random.RandomState(seed + 1)
    i = rs.randint(0, 6)
    while i < n:
        toks[i] = eod
        i += 1 + rs.randint(0, 10)
    return toks


def doc_case(root, cname, name, seeds, eods_in_first_micro_batch=False):
    """The packed-document tests' set-up: case cname's folder root/name_cname
    with a training shard of documents ending at the vocabulary's last token
    (eods_in_first_micro_batch: every other token of step 1's first
    micro-batch an eod too), a validation shard of them and a Hugging Face
    init folder; seeds: (training, validation, init). Returns c, work, eod,
    the training and validation tokens, cfg, the init folder and tensors."""
    c = CASES[cname]
    work = os.path.join(root, f"{name}_{cname}")
    os.makedirs(work)
    eod = c["vocab"] - 1
    toks = doc_tokens(2200, c["vocab"], eod, seed=seeds[0])
    if eods_in_first_micro_batch:
        toks[:MB * T:2] = eod
    val = doc_tokens(600, c["vocab"], eod, seed=seeds[1])
    write_shard(os.path.join(work, "train_000.bin"), toks)
    write_shard(os.path.join(work, "val.bin"), val)
    cfg, init_dir, init_t = hf_init_folder(work, c, seed=seeds[2])
    return c, work, eod, toks, val, cfg, init_dir, init_t


def doc_job(work, c, steps, init_dir, eod, block_causal, key):
    """The job of a packed-document test's main run: data.eod_token eod, the
    boolean train key on, block_causal attention or not"""
    job = base_job(work, "main", c, steps, 1.0, init={"from": init_dir})
    job["data"]["eod_token"] = eod
    job["train"][key] = True
    if block_causal:
        job["train"]["attention_mask"] = "block_causal"
    return job


def check_step0(tag, dump, loss_t, logits_t, grads_t):
    """A run's step-0 dump against torch's loss, logits and gradients; returns
    the dump's logits and loss"""
    logits_c, loss_c = read_dump_logits(dump)
    loss_c = float(loss_c.reshape(-1)[0])
    cmp_tensor(f"{tag} step0 logits", logits_c, logits_t, TOL_LOGITS)
    cmp_scalar(f"{tag} step0 loss", loss_c, loss_t, TOL_LOSS)
    _, grads_c = hfio.read_hf_folder(os.path.join(dump, "grads"))
    worst = max(rel_err(grads_c[n], grads_t[n]) for n in grads_t)
    CK.check(worst <= TOL_GRAD, f"{tag} step0 grads worst rel={worst:.2g} ({len(grads_t)} tensors)")
    return logits_c, loss_c, grads_c


def check_trajectory(tag, logdir, recs):
    """A run's metrics.jsonl against torch's steps (R.train's records): each
    step's loss and gradient norm; returns the run's metrics by step"""
    got = read_metrics(logdir)
    e_loss = max(abs(got[r["step"]]["loss"] - r["loss"]) / r["loss"] for r in recs)
    e_norm = max(abs(got[r["step"]]["grad_norm"] - r["grad_norm"]) / r["grad_norm"] for r in recs)
    CK.check(e_loss <= TOL_STEP_LOSS and e_norm <= TOL_NORM,
             f"{tag} trajectory vs torch: loss worst rel={e_loss:.2g}, grad_norm {e_norm:.2g}")
    return got


def run_docmask(binary, root, cname):
    """train.attention_mask block_causal (documents ending at data.eod_token)
    against torch's reference with the mask built from document ids
    (torch_ref.document_ids, a cumulative count of eod tokens, not llmtrain's
    per-token first positions): step-0 logits, loss and every gradient, the
    trajectory, and that plain causal attention is far from it (so the mask
    did something). Llama: the reference's packed logits equal each document
    run alone (RoPE sees relative positions only). Selective activation
    checkpointing recomputes attention under the same mask: the same losses."""
    c, work, eod, toks, _, cfg, init_dir, init_t = doc_case(root, cname, "docmask", (401, 7, 29))
    tag = f"{cname} block_causal"
    steps = 10

    def job_of(name, act_ckpt="none"):
        j = base_job(work, name, c, steps, 1.0, init={"from": init_dir}, dump=name == "main")
        j["data"]["eod_token"] = eod
        j["train"]["attention_mask"] = "block_causal"
        j["train"]["activation_checkpointing"] = act_ckpt
        return j

    ok, out = run_bin(binary, job_of("main"), work, "main")
    if not CK.check(ok, f"{tag} run (data.eod_token {eod}, {steps} steps)" + ("" if ok else f": {out}")):
        return
    CK.check(f"block-causal attention (documents end at token {eod})" in out,
             f"{tag} the model line says block-causal attention and the eod token")
    x, _ = R.global_batch(toks, 0, GB, T)
    docs = R.document_ids(x, eod)
    CK.check(int((docs[:, -1] > 0).sum()) == GB, f"{tag} every sequence of step 1 holds more than one document "
                                                  f"({[int(d) + 1 for d in docs[:, -1]]})")
    dump = os.path.join(work, "main", "dump")
    loss_t, logits_t, grads_t = torch_step0(cfg, init_t, toks, eod=eod)
    loss_causal, logits_causal, _ = torch_step0(cfg, init_t, toks)
    logits_c, _, _ = check_step0(tag, dump, loss_t, logits_t, grads_t)
    far = rel_err(logits_c, logits_causal)
    CK.check(far > 100 * TOL_LOGITS, f"{tag} step0 logits are far from causal attention's (rel {far:.2g})")
    recs = R.train(R.RefModel(cfg, init_t, dtype=torch.float64, eod=eod), toks, steps, T, MB, GB, LR, MIN_LR, WARMUP,
                   DECAY, WD, c["decay_all"], B1, B2, EPS, grad_clip=1.0, schedule=c.get("schedule"))
    got = check_trajectory(tag, os.path.join(work, "main", "log"), recs)
    ok, out = run_bin(binary, job_of("selective", "selective"), work, "selective")
    if CK.check(ok, f"{tag} run with activation_checkpointing selective" + ("" if ok else f": {out}")):
        sel = read_metrics(os.path.join(work, "selective", "log"))
        same = all(sel[k]["loss"] == got[k]["loss"] and sel[k]["grad_norm"] == got[k]["grad_norm"] for k in got)
        CK.check(same, f"{tag} selective checkpointing recomputes the same attention: losses and norms bit for bit")
    if c["arch"] == "llama":  # the reference's mask against no mask at all
        m = R.RefModel(cfg, init_t, dtype=torch.float64, eod=eod)
        plain = R.RefModel(cfg, init_t, dtype=torch.float64)
        row = x[:1]
        with torch.no_grad():
            packed = m(row)[0]
            ends = [i + 1 for i in range(T) if int(row[0, i]) == eod] + [T]
            alone, s0 = [], 0
            for e in ends:
                if e > s0:
                    alone.append(plain(row[:, s0:e])[0])
                s0 = e
        e = rel_err(packed, torch.cat(alone))
        CK.check(e < 1e-10, f"{tag} torch reference: a packed row's logits == its {len(alone)} documents run alone "
                            f"(rel {e:.1e})")


def run_resetpos(binary, root, cname, block_causal):
    """train.reset_position_ids (positions counted from each document's first
    token) against torch's reference with position ids from
    torch_ref.document_positions (written from document ids): step-0
    logits, loss and every gradient (GPT-2's wpe rows included), the 10-step
    trajectory, and that the positions did something: the logits are far
    from the same attention's without the reset. GPT-2 with block_causal
    (Megatron's usual pairing: a packed document then sees exactly what it
    would alone), Llama GQA with causal attention (under block_causal RoPE
    is relative and the reset changes nothing: torch_ref's selftest)."""
    c, work, eod, toks, _, cfg, init_dir, init_t = doc_case(root, cname, "resetpos", (607, 13, 37))
    tag = f"{cname} reset_position_ids" + (" with block_causal" if block_causal else "")
    steps = 10
    job = doc_job(work, c, steps, init_dir, eod, block_causal, "reset_position_ids")
    ok, out = run_bin(binary, job, work, "main")
    if not CK.check(ok, f"{tag} run (data.eod_token {eod}, {steps} steps)" + ("" if ok else f": {out}")):
        return
    CK.check(f"positions reset after token {eod}" in out, f"{tag} the model line says so")
    ref_eod = eod if block_causal else None
    x, y = R.global_batch(toks, 0, GB, T)
    m = R.RefModel(cfg, init_t, dtype=torch.float64, eod=ref_eod, pos_eod=eod)
    loss_t, logits_t = R.forward_backward(m, x, y, MB)
    grads_t = R.grads_dict(m)
    logits_c, _, _ = check_step0(tag, os.path.join(work, "main", "dump"), loss_t, logits_t, grads_t)
    _, unreset, _ = torch_step0(cfg, init_t, toks, eod=ref_eod)
    far = rel_err(logits_c, unreset)
    CK.check(far > 100 * TOL_LOGITS, f"{tag} step0 logits are far from those without the reset (rel {far:.2g})")
    recs = R.train(R.RefModel(cfg, init_t, dtype=torch.float64, eod=ref_eod, pos_eod=eod), toks, steps, T, MB, GB, LR,
                   MIN_LR, WARMUP, DECAY, WD, c["decay_all"], B1, B2, EPS, grad_clip=1.0, schedule=c.get("schedule"))
    check_trajectory(tag, os.path.join(work, "main", "log"), recs)


def run_eodloss(binary, root, cname, block_causal):
    """train.eod_mask_loss (no loss on the prediction after data.eod_token)
    against torch's F.cross_entropy with those targets set to its
    ignore_index (torch_ref.mask_after_eod: where the INPUT is eod): step-0
    loss, logits and every gradient, the 10-step trajectory and the final
    val_loss. The step's loss is the mean over the whole global batch's
    remaining targets: step 1's first micro-batch is every other token an
    eod, so its micro-batches keep very different counts and the gradient of
    a mean per micro-batch (Megatron's older rule) is far from it; and the
    unmasked loss is far too (the mask did something)."""
    c, work, eod, toks, val, cfg, init_dir, init_t = doc_case(root, cname, "eodloss", (503, 11, 31),
                                                              eods_in_first_micro_batch=True)
    tag = f"{cname} eod_mask_loss" + (" with block_causal" if block_causal else "")
    steps = 10
    job = doc_job(work, c, steps, init_dir, eod, block_causal, "eod_mask_loss")
    job["eval"] = {"every_steps": steps, "batches": 2, "sample_tokens": 0}
    ok, out = run_bin(binary, job, work, "main")
    if not CK.check(ok, f"{tag} run (data.eod_token {eod}, {steps} steps)" + ("" if ok else f": {out}")):
        return
    CK.check(f"no loss on the targets after token {eod} (eod_mask_loss)" in out, f"{tag} the batch line says so")
    ref_eod = eod if block_causal else None

    def batch(step):
        x, y = R.global_batch(toks, step, GB, T)
        return x, R.mask_after_eod(x, y, eod)

    x, ym = batch(0)
    counts = [int((ym[j * MB:(j + 1) * MB] != R.IGNORE).sum()) for j in range(GB // MB)]
    CK.check(len(set(counts)) > 1 and sum(counts) < GB * T,
             f"{tag} step 1's micro-batches keep different numbers of targets ({counts} of {MB * T} each)")
    m = R.RefModel(cfg, init_t, dtype=torch.float64, eod=ref_eod)
    loss_t, logits_t = R.forward_backward(m, x, ym, MB)
    grads_t = R.grads_dict(m)
    _, loss_c, grads_c = check_step0(tag, os.path.join(work, "main", "dump"), loss_t, logits_t, grads_t)
    pm = R.RefModel(cfg, init_t, dtype=torch.float64, eod=ref_eod)
    for j in range(GB // MB):  # each micro-batch's own mean, averaged
        (pm.loss(x[j * MB:(j + 1) * MB], ym[j * MB:(j + 1) * MB])[0] / (GB // MB)).backward()
    flat = lambda g: torch.cat([g[n].double().reshape(-1) for n in sorted(grads_t)])  # noqa: E731
    far_pm = rel_err(flat(grads_c), flat(R.grads_dict(pm)))
    with torch.no_grad():
        unmasked = m.loss(x, R.global_batch(toks, 0, GB, T)[1])[0].item()
    far_un = abs(loss_c - unmasked) / unmasked
    CK.check(far_pm > 10 * TOL_GRAD and far_un > 10 * TOL_LOSS,
             f"{tag} step0 gradients are far from those of the mean of micro-batch means (rel {far_pm:.2g}), "
             f"the loss from the unmasked loss (rel {far_un:.2g})")
    ref = R.RefModel(cfg, init_t, dtype=torch.float64, eod=ref_eod)
    recs = R.train(ref, toks, steps, T, MB, GB, LR, MIN_LR, WARMUP, DECAY, WD, c["decay_all"], B1, B2, EPS,
                   grad_clip=1.0, schedule=c.get("schedule"), batch_fn=batch)
    got = check_trajectory(tag, os.path.join(work, "main", "log"), recs)
    xv, yv = R.global_batch(val, 0, 2 * MB, T)  # eval.batches 2 of micro_batch sequences
    with torch.no_grad():
        val_t = ref.loss(xv, R.mask_after_eod(xv, yv, eod))[0].item()
    val_c = got[steps].get("val_loss", float("nan"))
    cmp_scalar(f"{tag} val_loss after {steps} steps (the mean over both eval batches' remaining targets)",
               val_c, val_t, TOL_STEP_LOSS)


def run_blend(binary, root):
    """A data blend (data.train "0.6 A 0.4 B"): 10 steps' loss and grad_norm
    against torch on the sequences docs/data.md's blend rule picks
    (torch_ref.blend_batch); the same torch run on A's and B's shards as one
    glob must not match, so the check sees which sequences were used."""
    c = CASES["gpt2"]
    tag = "blend"
    work = os.path.join(root, tag)
    os.makedirs(work)
    V = c["vocab"]
    a, b = markov_tokens(1500, V, seed=311), markov_tokens(900, V, seed=312)
    write_shard(os.path.join(work, "a_000.bin"), a[:700])
    write_shard(os.path.join(work, "a_001.bin"), a[700:])
    write_shard(os.path.join(work, "b_000.bin"), b)
    write_shard(os.path.join(work, "val.bin"), markov_tokens(600, V, seed=7))
    cfg, init_dir, init_t = hf_init_folder(work, c, seed=29)
    steps = 10
    blend = f"0.6 {os.path.join(work, 'a_*.bin')} 0.4 {os.path.join(work, 'b_000.bin')}"
    job = base_job(work, "main", c, steps, 1.0, init={"from": init_dir}, dump=False, train_glob=blend)
    ok, out = run_bin(binary, job, work, "main")
    if not CK.check(ok and "data: blend of 2: 60% " in out and "40% " in out,
                    f"{tag} run ({steps} steps) and its data line" + ("" if ok else f": {out}")):
        return
    got = read_metrics(os.path.join(work, "main", "log")) or {}
    pat = R.blend_pattern([0.6, 0.4])
    src = [np.concatenate([a[:700], a[700:]]), b]
    recs = R.train(R.RefModel(cfg, init_t, dtype=torch.float64), None, steps, T, MB, GB, LR, MIN_LR, WARMUP, DECAY,
                   WD, c["decay_all"], B1, B2, EPS, grad_clip=1.0,
                   batch_fn=lambda s: R.blend_batch(src, pat, s, GB, T))
    wrong = R.train(R.RefModel(cfg, init_t, dtype=torch.float64), np.concatenate([a, b]), steps, T, MB, GB, LR, MIN_LR,
                    WARMUP, DECAY, WD, c["decay_all"], B1, B2, EPS, grad_clip=1.0)
    if not CK.check(sorted(got) == list(range(1, steps + 1)), f"{tag} metrics.jsonl has steps 1..{steps}"):
        return
    e = max(abs(got[r["step"]]["loss"] - r["loss"]) / r["loss"] for r in recs)
    en = max(abs(got[r["step"]]["grad_norm"] - r["grad_norm"]) / r["grad_norm"] for r in recs)
    ew = max(abs(got[r["step"]]["loss"] - r["loss"]) / r["loss"] for r in wrong)
    n_b = sum(1 for j in range(steps * GB) if pat[0][j] == 1)
    CK.check(e <= TOL_STEP_LOSS and en <= TOL_NORM and ew > 10 * TOL_STEP_LOSS,
             f"{tag} trajectory vs torch on the blend's sequences ({n_b}/{steps * GB} from B): loss worst rel={e:.2g}, "
             f"grad_norm {en:.2g}; against the unblended data {ew:.2g}")

    # a blended data.val: val_loss on the blend's sequences, val_loss_sources
    # each source's alone; against runs whose data.val is that source
    va, vb = os.path.join(work, "va.bin"), os.path.join(work, "vb.bin")
    write_shard(va, markov_tokens(500, V, seed=313))
    write_shard(vb, markov_tokens(400, V, seed=314))
    vals = {}
    for name, val in (("vblend", f"3 {va} 1 {vb}"), ("va", va), ("vb", vb)):
        job = base_job(work, name, c, 4, 1.0, init={"from": init_dir}, dump=False, train_glob=blend)
        job["data"]["val"] = val
        job["eval"] = {"every_steps": 2, "batches": 3, "sample_tokens": 0}
        ok, out = run_bin(binary, job, work, name)
        if not CK.check(ok, f"{tag} run with data.val {name}" + ("" if ok else f": {out}")):
            return
        vals[name] = ({k: v for k, v in (read_metrics(os.path.join(work, name, "log")) or {}).items() if "val_loss" in v},
                      out)
    m, out = vals["vblend"]
    same = sorted(m) == [2, 4] and all(
        m[k].get("val_loss_sources") == [vals["va"][0][k]["val_loss"], vals["vb"][0][k]["val_loss"]] and
        "val_loss_sources" not in vals["va"][0][k] for k in m)
    CK.check(same and "val: blend of 2: 75% " in out and "| by source " in out,
             f"{tag} data.val blend: val_loss_sources of steps 2 and 4 == the val_loss of runs on each source alone "
             f"({[m[k].get('val_loss_sources') for k in sorted(m)]}), the val line and the step line's 'by source'")


def run_rampup(binary, root):
    """A batch-size ramp-up (train.rampup_*: 2 sequences a step, +2 every 8
    sequences consumed, up to 8): 10 steps' loss, grad_norm, global_batch
    and consumed_samples against torch on the sequences Megatron's rule
    (torch_ref.rampup_plan) gives each step, and not against a run at the
    full batch throughout; a run stopped at step 5 (batch 4, mid-ramp) and
    resumed gives the same steps 6..10; the start lines say where the ramp
    ends, the tokens the whole run reads (per parameter) and the epochs of
    data.train that makes, the resumed run's too."""
    c = CASES["gpt2"]
    tag = "rampup"
    work = os.path.join(root, tag)
    os.makedirs(work)
    toks = markov_tokens(2200, c["vocab"], seed=411)
    write_shard(os.path.join(work, "train_000.bin"), toks)
    write_shard(os.path.join(work, "val.bin"), markov_tokens(600, c["vocab"], seed=7))
    cfg, init_dir, init_t = hf_init_folder(work, c, seed=31)
    steps, G, ramp = 10, 8, (2, 2, 24)

    def job(name, n, ckpt=None):
        j = base_job(work, name, c, n, 1.0, init={"from": init_dir}, dump=False)
        j["train"].update({"global_batch": G, "rampup_start_batch": ramp[0], "rampup_batch_increment": ramp[1],
                           "rampup_samples": ramp[2]})
        if ckpt:
            j["checkpoint"]["dir"] = ckpt
        return j
    ok, out = run_bin(binary, job("main", steps), work, "main")
    want = "| ramp-up from 2 seqs, +2 per 8 samples: 8 from step 9"
    if not CK.check(ok and want in out, f"{tag} run ({steps} steps) and its batch line '{want}'" + ("" if ok else f": {out}")):
        return
    got = read_metrics(os.path.join(work, "main", "log")) or {}
    plan = R.rampup_plan(steps, ramp[0], ramp[1], ramp[2], G)
    n_seq = sum(g for _, g in plan)
    n_par = sum(p.numel() for p in R.RefModel(cfg, init_t, dtype=torch.float64).parameters())
    budget = [f"tokens: {n_seq * T} over {steps} steps ({n_seq} sequences; {n_seq * T / n_par:.3g} per parameter)",
              f"train_*.bin ({len(toks)} tokens, {n_seq * T / len(toks):.3g} epochs this run)"]
    CK.check(all(line in out for line in budget), f"{tag} start lines: '{budget[0]}', '{budget[1]}'")
    recs = R.train(R.RefModel(cfg, init_t, dtype=torch.float64), None, steps, T, MB, G, LR, MIN_LR, WARMUP, DECAY,
                   WD, c["decay_all"], B1, B2, EPS, grad_clip=1.0,
                   batch_fn=lambda s: R.batch_of(lambda j: (toks, plan[s][0] + j), 0, plan[s][1], T))
    full = R.train(R.RefModel(cfg, init_t, dtype=torch.float64), toks, steps, T, MB, G, LR, MIN_LR, WARMUP, DECAY,
                   WD, c["decay_all"], B1, B2, EPS, grad_clip=1.0)
    if not CK.check(sorted(got) == list(range(1, steps + 1)), f"{tag} metrics.jsonl has steps 1..{steps}"):
        return
    batches = [got[k].get("global_batch") for k in range(1, steps + 1)]
    consumed = [got[k].get("consumed_samples") for k in range(1, steps + 1)]
    CK.check(batches == [g for _, g in plan] and consumed == [cur + g for cur, g in plan],
             f"{tag} global_batch {batches} and consumed_samples {consumed} follow Megatron's rule")
    e = max(abs(got[r["step"]]["loss"] - r["loss"]) / r["loss"] for r in recs)
    en = max(abs(got[r["step"]]["grad_norm"] - r["grad_norm"]) / r["grad_norm"] for r in recs)
    ew = max(abs(got[r["step"]]["loss"] - r["loss"]) / r["loss"] for r in full)
    CK.check(e <= TOL_STEP_LOSS and en <= TOL_NORM and ew > 10 * TOL_STEP_LOSS,
             f"{tag} trajectory vs torch on the ramp's batches: loss worst rel={e:.2g}, grad_norm {en:.2g}; "
             f"against {G} sequences every step {ew:.2g}")

    # stopped at step 5 (the ramp's batch 4) and resumed
    ck = os.path.join(work, "part", "ckpt")
    ok1, out1 = run_bin(binary, job("part", 5, ckpt=ck), work, "part")
    ok2, out2 = run_bin(binary, job("rest", steps, ckpt=ck), work, "rest")
    ends = (": still 4 at the last step", ": 8 from step 9")
    if CK.check(ok1 and ok2 and "resume: " in out2 and ends[0] in out1 and ends[1] in out2,
                f"{tag} run to step 5 ('{ends[0]}'), then resumed to step {steps} ('{ends[1]}', walked from the checkpoint)" +
                ("" if ok1 and ok2 else f": {out1} {out2}")):
        b = read_metrics(os.path.join(work, "rest", "log")) or {}
        same = sorted(k for k in b if k > 5) == list(range(6, steps + 1)) and all(
            b[k]["global_batch"] == got[k]["global_batch"] and b[k]["consumed_samples"] == got[k]["consumed_samples"]
            and abs(b[k]["loss"] - got[k]["loss"]) <= 1e-6 * got[k]["loss"] for k in range(6, steps + 1))
        CK.check(same and all(line in out2 for line in budget),
                 f"{tag} resumed mid-ramp: steps 6..{steps} have the uninterrupted run's batches, cursor and losses; the "
                 f"same tokens line and epochs")


# the LR schedules (optim.lr_decay_style) on a tiny GPT-2: (label, warmup, min_lr, optim keys)
SCHED_STEPS, SCHED_DECAY = 30, 24
SCHEDULES = [
    ("cosine", 3, MIN_LR, {}),
    ("linear", 3, MIN_LR, {"lr_decay_style": "linear"}),
    ("constant", 3, MIN_LR, {"lr_decay_style": "constant"}),
    ("inverse_sqrt", 4, MIN_LR, {"lr_decay_style": "inverse_sqrt"}),
    ("inverse_sqrt floored at min_lr from step 16", 4, LR / 2, {"lr_decay_style": "inverse_sqrt"}),
    ("inverse_sqrt without warmup", 0, MIN_LR, {"lr_decay_style": "inverse_sqrt"}),
    ("wsd (linear by default)", 3, MIN_LR, {"lr_decay_style": "wsd", "wsd_decay_steps": 8}),
    ("wsd cosine", 3, MIN_LR, {"lr_decay_style": "wsd", "wsd_decay_steps": 8, "wsd_decay_style": "cosine"}),
    ("wsd exponential", 3, MIN_LR, {"lr_decay_style": "wsd", "wsd_decay_steps": 8, "wsd_decay_style": "exponential"}),
    ("wsd minus_sqrt", 3, MIN_LR, {"lr_decay_style": "wsd", "wsd_decay_steps": 8, "wsd_decay_style": "minus_sqrt"}),
    ("wsd decaying right after the warmup", 3, MIN_LR, {"lr_decay_style": "wsd", "wsd_decay_steps": 21}),
]


def run_schedules(binary, root):
    """Every optim.lr_decay_style (and wsd_decay_style): the lr of each of 30
    steps in metrics.jsonl against PyTorch's schedulers (torch_ref.
    torch_lr_schedule) and docs/layouts.md's formulas (torch_ref.lr_at); the
    check command's optim line; and WSD's cooldown from a checkpoint of the
    stable phase (a run planned with a far decay_steps, resumed with the
    decay moved to now under optim.override_schedule, refused without it)
    reproducing a run planned with that decay."""
    tag = "schedule"
    work = os.path.join(root, tag)
    os.makedirs(work)
    toks = markov_tokens(3000, 64, seed=41)
    write_shard(os.path.join(work, "train_000.bin"), toks)

    def job(name, steps, warmup, min_lr, keys, decay=SCHED_DECAY, ckpt=None):
        return {"description": f"test_torch {tag} {name}",
                "model": {"arch": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64,
                          "max_seq_len": 16},
                "data": {"train": os.path.join(work, "train_000.bin")},
                "train": {"steps": steps, "seq_len": 8, "micro_batch": 2, "device": "cpu"},
                "optim": dict({"lr": LR, "min_lr": min_lr, "warmup_steps": warmup, "decay_steps": decay}, **keys),
                "eval": {"sample_tokens": 0},
                "log": {"dir": os.path.join(work, name, "log")},
                "checkpoint": {"dir": ckpt or os.path.join(work, name, "ckpt")}}

    for i, (label, warmup, min_lr, keys) in enumerate(SCHEDULES):
        name = f"s{i}"
        ok, out = run_bin(binary, job(name, SCHED_STEPS, warmup, min_lr, keys), work, name)
        if not CK.check(ok, f"{tag} {label}: run" + ("" if ok else f": {out}")):
            continue
        got = read_metrics(os.path.join(work, name, "log")) or {}
        ref = R.torch_lr_schedule(SCHED_STEPS, LR, min_lr, warmup, SCHED_DECAY, keys)
        formula = [R.lr_at(s, LR, min_lr, warmup, SCHED_DECAY, keys) for s in range(SCHED_STEPS)]
        c = [got.get(s + 1, {}).get("lr") for s in range(SCHED_STEPS)]
        if not CK.check(all(isinstance(v, (int, float)) for v in c), f"{tag} {label}: lr of steps 1..{SCHED_STEPS} logged"):
            continue
        e_t = max(abs(a - b) / b for a, b in zip(c, ref))
        e_f = max(abs(a - b) / b for a, b in zip(formula, ref))
        CK.check(e_t <= TOL_LR and e_f <= 1e-12,
                 f"{tag} {label}: lr of {SCHED_STEPS} steps vs torch.optim.lr_scheduler worst rel={e_t:.2g} "
                 f"(docs formula vs torch {e_f:.2g}; {ref[warmup]:.3g} after the warmup, {ref[-1]:.3g} at the end)")

    # the check command says what the schedule is
    with open(os.path.join(work, "chk.json"), "w") as f:
        json.dump(job("chk", SCHED_STEPS, 3, MIN_LR, SCHEDULES[7][3]), f)
    ok, out = run_bin(binary, None, work, "chk", args_prefix=["check", os.path.join(work, "chk.json")])
    want = "optim: AdamW, lr warmup 3, wsd 0.003, then cosine -> 0.0003 over steps 16..24 | weight decay 0.1"
    CK.check(ok and want in out, f"{tag} llmtrain check prints '{want}'" + ("" if ok and want in out else f": {out}"))

    # WSD's cooldown: steps 1..6 of a run decaying at step 1000, resumed with
    # the 4-step decay ending at (0-based) step 10, against one run planned so
    wsd = {"lr_decay_style": "wsd", "wsd_decay_steps": 4}
    ok1, out1 = run_bin(binary, job("planned", 11, 2, MIN_LR, wsd, decay=10), work, "planned")
    ck = os.path.join(work, "stable", "ckpt")
    ok2, out2 = run_bin(binary, job("stable", 6, 2, MIN_LR, wsd, decay=1000, ckpt=ck), work, "stable")
    # the decay moved: another schedule, refused unless optim.override_schedule takes it
    ok_r, out_r = run_bin(binary, job("refused", 11, 2, MIN_LR, wsd, decay=10, ckpt=ck), work, "refused")
    refusal = "was trained with another schedule, optim.decay_steps: 1000 -> 10 (where the wsd decay ends)"
    CK.check(ok2 and not ok_r and refusal in out_r, f"{tag} wsd: the cooldown without optim.override_schedule is refused "
             f"('{refusal}')" + ("" if not ok_r and refusal in out_r else f": {out_r}"))
    ok3, out3 = run_bin(binary, job("cooldown", 11, 2, MIN_LR, dict(wsd, override_schedule=True), decay=10, ckpt=ck), work,
                        "cooldown")
    header = "schedule: this job's, not the checkpoint's (optim.override_schedule): optim.decay_steps: 1000 -> 10"
    if CK.check(ok1 and ok2 and ok3 and "resume: " in out3 and header in out3, f"{tag} wsd: planned run, stable run to step 6, "
                f"cooldown resumed from its checkpoint under optim.override_schedule ('{header}')" +
                ("" if ok1 and ok2 and ok3 and header in out3 else f": {out1} {out2} {out3}")):
        a = read_metrics(os.path.join(work, "planned", "log")) or {}
        b = dict(read_metrics(os.path.join(work, "stable", "log")) or {})
        b.update({k: v for k, v in (read_metrics(os.path.join(work, "cooldown", "log")) or {}).items() if k > 6})
        same = sorted(a) == sorted(b) == list(range(1, 12)) and all(
            a[k]["lr"] == b[k]["lr"] and abs(a[k]["loss"] - b[k]["loss"]) <= 1e-6 * a[k]["loss"] for k in a)
        lrs = [a.get(k, {}).get("lr") or 0.0 for k in range(1, 12)]
        shape = (abs(lrs[5] - LR) < 1e-9 and lrs[6] == lrs[5] and all(lrs[k] < lrs[k - 1] for k in range(7, 11))
                 and abs(lrs[10] - MIN_LR) < 1e-9)
        CK.check(same and shape, f"{tag} wsd cooldown from step 6's checkpoint == the planned run: lr and loss of "
                                 f"steps 1..11 (lr {' '.join(f'{v:.3g}' for v in lrs)})")


def main():
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./llmtrain")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    VERBOSE = a.verbose
    torch.set_num_threads(2)
    t0 = time.time()
    binary = os.path.abspath(a.bin)
    print(f"torch {torch.__version__}, binary {binary}", flush=True)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        CK.check(False, f"binary {binary} not found / not executable")
    else:
        root = tempfile.mkdtemp(prefix="llmtrain_torch_")
        try:
            for cname in a.cases.split(","):
                if cname not in CASES:
                    CK.check(False, f"unknown case {cname}")
                    continue
                try:
                    run_case(binary, cname, CASES[cname], root)
                    if cname == "llama_gqa":
                        run_bf16(binary, root)
                    if cname in ("llama_gqa", "gpt2"):
                        run_docmask(binary, root, cname)
                        run_eodloss(binary, root, cname, block_causal=cname == "llama_gqa")
                        run_resetpos(binary, root, cname, block_causal=cname == "gpt2")
                    if cname == "gpt2":
                        run_schedules(binary, root)
                        run_blend(binary, root)
                        run_rampup(binary, root)
                except Exception as e:  # a crash in the test is a failure, not a traceback
                    import traceback
                    traceback.print_exc()
                    CK.check(False, f"{cname} test raised {type(e).__name__}: {e}")
        finally:
            if a.keep:
                print(f"kept {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
    print(f"time {time.time() - t0:.1f}s", flush=True)
    if CK.fail_lines and CK.passed + CK.failed > 30:
        print("failures:")
        for l in CK.fail_lines:
            print("  " + l)
    print(f"{CK.passed} passed, {CK.failed} failed")
    return 1 if CK.failed else 0


if __name__ == "__main__":
    sys.exit(main())
