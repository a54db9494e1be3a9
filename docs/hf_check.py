# Evaluates a moe.cu Hugging Face export with transformers: mean next-token cross-entropy of the main head on the
# first B x T + 1 tokens of an llm.c-format shard, laid out as moe.cu's loader does (see docs/hf_check.md).
# usage: python3 docs/hf_check.py EXPORT_DIR SHARD.bin B T
import struct
import sys

import torch
from transformers import AutoModelForCausalLM

export_dir, shard, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(shard, "rb") as f:
    header = struct.unpack("<256i", f.read(1024))
    assert header[0] == 20240520, "not an llm.c token shard"
    width = {1: 2, 2: 4}[header[1]]
    raw = f.read((B * T + 1) * width)
tokens = torch.tensor(struct.unpack("<%d%s" % (B * T + 1, "H" if width == 2 else "I"), raw), dtype=torch.long)
inputs, targets = tokens[:-1].view(B, T), tokens[1:].view(B, T)
model = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32)
model.eval()
with torch.no_grad():
    logits = model(input_ids=inputs).logits
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
print("val_loss %.6f" % loss.item())
