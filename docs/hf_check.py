# Checks moe.cu against Hugging Face transformers (see docs/hf_check.md).
#   python3 docs/hf_check.py DIR SHARD.bin B T
#       the mean next-token cross-entropy of DIR's main head on the first B x T + 1 tokens of an llm.c-format
#       shard, laid out as moe.cu's loader does: compare with `./train_cpu --init-from-hf DIR --eval-only`.
#   python3 docs/hf_check.py --create DIR 'JSON'
#       a DeepseekV3ForCausalLM made by transformers itself (seed 0) and saved to DIR as transformers saves it:
#       test/data/ep-tiny.json's shapes, initializer_range 0.5, and the JSON's keys on top (for example a
#       rope_parameters dict).
import json
import struct
import sys

import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

if sys.argv[1] == "--create":
    directory, overrides = sys.argv[2], json.loads(sys.argv[3])
    with open("test/data/ep-tiny.json") as f:
        settings = json.load(f)
    settings["initializer_range"] = 0.5  # weights large enough that attention, and so RoPE, moves the loss
    settings.update(overrides)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**settings))
    model.save_pretrained(directory)
    sys.exit(0)

directory, shard, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(shard, "rb") as f:
    header = struct.unpack("<256i", f.read(1024))
    assert header[0] == 20240520, "not an llm.c token shard"
    width = {1: 2, 2: 4}[header[1]]
    raw = f.read((B * T + 1) * width)
tokens = torch.tensor(struct.unpack("<%d%s" % (B * T + 1, "H" if width == 2 else "I"), raw), dtype=torch.long)
inputs, targets = tokens[:-1].view(B, T), tokens[1:].view(B, T)
model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
model.eval()
with torch.no_grad():
    logits = model(input_ids=inputs).logits
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
print("val_loss %.6f" % loss.item())
