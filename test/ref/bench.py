# bench.py — the PyTorch baseline that moe.cu's trainers are benchmarked against.
# Trains the twin model (twin.py, float32, autograd) on the one batch in IN.safetensors, the same tokens
# every step: AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on tensors with >= 2 dims, 0 on the
# rest), constant lr, global-norm clipping at 1.0. The router biases are buffers and stay fixed.
# Two untimed warm-up steps, then N timed ones; prints one JSON line. loss_first is the loss of the
# very first step (the weights as read), loss_last that of the last timed step.
#
# usage: /usr/bin/python3 test/ref/bench.py CONFIG.json IN.safetensors --steps N --threads K [--lr X]

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

WARMUP = 2


def main():
    ap = argparse.ArgumentParser(description="PyTorch baseline training benchmark")
    ap.add_argument("config")
    ap.add_argument("inputs")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    if args.steps < 1 or args.threads < 1:
        raise twin.InputError("--steps and --threads must be >= 1")
    torch.set_num_threads(args.threads)

    cfg = twin.load_config(args.config)
    params, tokens = twin.load_inputs(cfg, args.inputs, torch.float32)
    trainable = [t for n, t in params.items() if not twin.is_buffer(n)]
    opt = torch.optim.AdamW(
        [{"params": [t for t in trainable if t.dim() >= 2], "weight_decay": 0.1},
         {"params": [t for t in trainable if t.dim() < 2], "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = twin.forward(cfg, params, tokens)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        return loss.item()

    loss_first = step()
    for _ in range(WARMUP - 1):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss_last = step()
    elapsed = time.perf_counter() - t0

    ms = 1000.0 * elapsed / args.steps
    n_tokens = tokens.shape[0] * (tokens.shape[1] - 1)
    print(json.dumps({"impl": "pytorch", "ms_per_step": round(ms, 3), "tokens_per_s": round(n_tokens / (ms / 1000.0), 1),
                      "threads": args.threads, "loss_first": loss_first, "loss_last": loss_last}))


if __name__ == "__main__":
    try:
        main()
    except (twin.InputError, OSError) as e:
        print(f"bench.py: error: {e}", file=sys.stderr)
        sys.exit(1)
