#!/usr/bin/python3
"""Launch an llmtrain job on SageMaker Training with the SageMaker Python SDK.

  scripts/sagemaker/launch.py --job configs/llama2_7b.json --image-uri URI --role ARN \\
      --instance-count 128 --train s3://bucket/tokens/train --val s3://bucket/tokens/val \\
      --checkpoint-s3-uri s3://bucket/ckpt/llama2-7b [--set key=value ...] [--dry-run]

The job file must lie under the repository root (the image holds the same tree at
/opt/llmtrain): the hyperparameter `job` names it relative to the root, and every key of
the local file (data, log and checkpoint paths and the description excepted) is
sent as a hyperparameter too, so local edits take effect without rebuilding the image.
`--set` adds overrides. Hyperparameter values are JSON text (the entry point parses them
back). --dry-run prints the Estimator's arguments and the fit() inputs as JSON and exits,
without importing sagemaker. Unless --no-check, `llmtrain check` validates the job for
instance_count x ranks_per_host ranks first (when ./llmtrain is built).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# not sent from the job file: the entry point sets the paths (channels, SageMaker's
# folders), and the image's copy of the file already carries its description
SKIP_KEYS = ("description", "data.train", "data.val", "data.vocab", "log.dir", "checkpoint.dir", "checkpoint.durable_dir")
# GPUs an instance, the instance table of llmtrain check (fit.c), which
# tests/test_sagemaker.sh holds this to
GPUS = {"ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8, "ml.p5en.48xlarge": 8,
        "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.16xlarge": 1,
        "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
        "ml.g6e.xlarge": 1, "ml.g6e.2xlarge": 1, "ml.g6e.4xlarge": 1, "ml.g6e.8xlarge": 1, "ml.g6e.16xlarge": 1,
        "ml.g6e.12xlarge": 4, "ml.g6e.24xlarge": 4, "ml.g6e.48xlarge": 8}


def flatten(prefix, obj, out):
    for k, v in obj.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            flatten(key, v, out)
        else:
            out[key] = v


def parse_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def build(args):
    job = os.path.abspath(args.job)
    rel = os.path.relpath(job, ROOT)
    if rel.startswith(".."):
        sys.exit(f"launch.py: --job {args.job}: expected a file under {ROOT} (the image's /opt/llmtrain)")
    with open(job) as f:
        keys = {}
        flatten("", json.load(f), keys)
    keys = {k: v for k, v in keys.items() if k not in SKIP_KEYS}
    for s in args.set:  # explicit overrides may set any key, paths included
        k, eq, v = s.partition("=")
        if not eq or not k:
            sys.exit(f"launch.py: --set {s}: expected key=value")
        keys[k] = parse_value(v)
    hp = {"job": rel}
    hp.update({k: json.dumps(v) for k, v in keys.items()})
    if args.ranks_per_host:
        hp["ranks_per_host"] = str(args.ranks_per_host)
    if args.nccl_debug:
        hp["nccl_debug"] = "true"
    inputs = {"train": args.train}
    if args.val:
        inputs["val"] = args.val
    if args.vocab:
        inputs["vocab"] = args.vocab
    est = {
        "image_uri": args.image_uri,
        "role": args.role,
        "instance_count": args.instance_count,
        "instance_type": args.instance_type,
        "volume_size": args.volume_size,
        "max_run": int(args.max_run_hours * 3600),
        "checkpoint_s3_uri": args.checkpoint_s3_uri,
        "checkpoint_local_path": "/opt/ml/checkpoints",
        "hyperparameters": hp,
        "base_job_name": args.job_name or os.path.splitext(os.path.basename(job))[0].replace("_", "-"),
        "disable_profiler": True,
    }
    if args.output_s3_uri:
        est["output_path"] = args.output_s3_uri
    if args.tensorboard_s3_uri:  # the entry point's log.tensorboard_dir, synced while the job runs
        est["tensorboard_output_config"] = {"s3_output_path": args.tensorboard_s3_uri,
                                            "container_local_output_path": "/opt/ml/output/tensorboard"}
    ranks = args.ranks_per_host or GPUS.get(args.instance_type, 0)
    if not ranks:  # a guess of 1 would size every layout check for the wrong world
        sys.exit(f"launch.py: --instance-type {args.instance_type}: GPUs an instance unknown "
                 f"(expected one of {', '.join(GPUS)}, or give --ranks-per-host N)")
    return est, inputs, args.instance_count * ranks


def check(args, hp, world):
    binary = os.path.join(ROOT, "llmtrain")
    if args.no_check or not os.access(binary, os.X_OK):
        return
    # fits the job to the instance type's GPU memory too (exit 2 when it does not fit)
    cmd = [binary, "check", os.path.join(ROOT, hp["job"]), "--world", str(world), "--instance", args.instance_type]
    for k, v in hp.items():
        if "." in k:
            cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fit = "\n".join(l for l in r.stdout.splitlines() if l.startswith(("fit:", "  --set")))
        sys.exit(f"{fit}\nlaunch.py: the job does not fit {world} ranks of {args.instance_type}: {r.stderr.strip()}".lstrip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True, help="llmtrain job file under the repository root")
    ap.add_argument("--image-uri", required=True, help="ECR image built from scripts/sagemaker/Dockerfile")
    ap.add_argument("--role", default=os.environ.get("SAGEMAKER_ROLE", ""), help="IAM execution role ARN")
    ap.add_argument("--instance-count", type=int, default=1)
    ap.add_argument("--instance-type", default="ml.p4d.24xlarge")
    ap.add_argument("--ranks-per-host", type=int, default=0, help="ranks per instance (default: its GPUs)")
    ap.add_argument("--train", required=True, help="S3 URI of the training token shards (channel train)")
    ap.add_argument("--val", default="", help="S3 URI of the validation shards (channel val)")
    ap.add_argument("--vocab", default="", help="S3 URI of the tokenizer table (channel vocab)")
    ap.add_argument("--checkpoint-s3-uri", required=True, help="S3 URI that /opt/ml/checkpoints is synced to")
    ap.add_argument("--output-s3-uri", default="", help="S3 URI for model.tar.gz and output.tar.gz")
    ap.add_argument("--tensorboard-s3-uri", default="",
                    help="S3 URI that the TensorBoard event files (/opt/ml/output/tensorboard) are synced to")
    ap.add_argument("--volume-size", type=int, default=500, help="GB of EBS per instance")
    ap.add_argument("--max-run-hours", type=float, default=120.0)
    ap.add_argument("--job-name", default="", help="base job name (default: the job file's name)")
    ap.add_argument("--nccl-debug", action="store_true", help="NCCL_DEBUG=INFO on every host")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra llmtrain override")
    ap.add_argument("--no-check", action="store_true", help="skip the local llmtrain check")
    ap.add_argument("--wait", action="store_true", help="follow the job's logs until it ends")
    ap.add_argument("--dry-run", action="store_true", help="print the Estimator arguments as JSON; no AWS calls")
    args = ap.parse_args()
    est, inputs, world = build(args)
    check(args, est["hyperparameters"], world)
    if args.dry_run:
        print(json.dumps({"estimator": est, "inputs": inputs, "world": world}, indent=2))
        return 0
    if not args.role:
        sys.exit("launch.py: --role (or SAGEMAKER_ROLE) is required")
    from sagemaker.estimator import Estimator  # only for a real launch
    if "tensorboard_output_config" in est:
        from sagemaker.debugger import TensorBoardOutputConfig
        est["tensorboard_output_config"] = TensorBoardOutputConfig(**est["tensorboard_output_config"])
    Estimator(**est).fit(inputs=inputs, wait=args.wait)
    return 0


if __name__ == "__main__":
    sys.exit(main())
