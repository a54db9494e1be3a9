# reference.py — the independent PyTorch reference for moe.cu's CPU model (docs/design.md §5).
# Reads a Hugging Face-style config and a safetensors file with every parameter plus "tokens" [B, T+1],
# runs the twin model (twin.py) in float64, lets autograd differentiate the total loss
#   loss = loss_main + mtp_loss_weight * loss_mtp + loss_balance,
# and writes the losses, the main logits, grad.NAME for every trainable parameter and
# expert_counts.l (selections per expert, per MoE block) as float32/int32 safetensors.
#
# usage: /usr/bin/python3 test/ref/reference.py CONFIG.json IN.safetensors OUT.safetensors

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402


def main(argv):
    if len(argv) != 4:
        raise twin.InputError("usage: reference.py CONFIG.json IN.safetensors OUT.safetensors")
    cfg_path, in_path, out_path = argv[1:]
    cfg = twin.load_config(cfg_path)
    params, tokens = twin.load_inputs(cfg, in_path, torch.float64)

    out = twin.forward(cfg, params, tokens)
    names = [n for n in params if not twin.is_buffer(n)]
    grads = torch.autograd.grad(out["loss"], [params[n] for n in names], allow_unused=True)

    result = {key: out[key].reshape(1).float() for key in ("loss", "loss_main", "loss_mtp", "loss_balance")}
    result["logits"] = out["logits"].float()
    for name, g in zip(names, grads):
        result["grad." + name] = (g if g is not None else torch.zeros_like(params[name])).float()
    for l, idx in out["expert_idx"].items():
        result[f"expert_counts.{l}"] = torch.bincount(idx.reshape(-1), minlength=cfg.E).int()
    twin.write_safetensors(out_path, result, {"producer": "test/ref/reference.py", "precision": "float64"})

    B, T = tokens.shape[0], tokens.shape[1] - 1
    print(f"reference: B={B} T={T} loss={out['loss'].item():.9g} main={out['loss_main'].item():.9g} "
          f"mtp={out['loss_mtp'].item():.9g} balance={out['loss_balance'].item():.9g} -> {out_path}")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (twin.InputError, OSError) as e:
        print(f"reference.py: error: {e}", file=sys.stderr)
        sys.exit(1)
