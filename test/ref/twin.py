# twin.py — the independent PyTorch twin of the moe.cu model (docs/design.md §1), written from the math,
# not from the C++. The model is functional: parameters live in a dict name -> tensor, forward()
# returns the losses, the main logits and the routing; autograd produces every gradient.
# The same code runs in float64 (test/ref/reference.py, the spec check) and float32 (test/ref/bench.py,
# the PyTorch baseline), so the model exists once. Also here: a small safetensors reader/writer
# (F32/F64/I32) and the config parser shared by both scripts.

import ctypes
import json
import math
import os
import struct

import torch
import torch.nn.functional as F


class InputError(Exception):
    """Bad user input (config, tensor file, tokens): reported as a one-line error."""


# ----------------------------------------------------------------------------------------------
# safetensors: u64 little-endian header length N, N bytes of JSON header, then the raw data
# (row-major, little-endian; data_offsets are relative to the end of the header).

_DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32}
_CODES = {dt: code for code, dt in _DTYPES.items()}


def read_safetensors(path):
    """Returns ({name: tensor}, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise InputError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise InputError(f"{path}: header length {n} runs past the end of the file")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except ValueError as e:
        raise InputError(f"{path}: header is not valid JSON ({e})")
    if not isinstance(header, dict):
        raise InputError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: tensor {name!r}: need dtype F32/F64/I32, shape and data_offsets")
        count = math.prod(shape)
        nbytes = count * torch.empty(0, dtype=dtype).element_size()
        if min(shape, default=0) < 0 or begin < 0 or end - begin != nbytes or end > len(data):
            raise InputError(f"{path}: tensor {name!r}: shape {shape} does not match data_offsets [{begin}, {end}]")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (float32/float64/int32) atomically: a temp file, then rename."""
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype not in _CODES:
            raise ValueError(f"write_safetensors: {name}: unsupported dtype {t.dtype}")
        raw = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad so the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Config: Hugging Face DeepseekV3Config key names. Every key the math uses is required, except the
# three with a project default in docs/design.md: aux_loss_alpha (0.0001), mtp_loss_weight (0.3) and
# rope_scaling (absent = none). MoE keys are only required when some block is MoE.

class Config:
    def __init__(self, raw):
        if not isinstance(raw, dict):
            raise InputError("config: not a JSON object")

        def get(key, kind, default=None, required=True, allow_none=False):
            if key not in raw:
                if required:
                    raise InputError(f"config: missing key {key!r}")
                return default
            v = raw[key]
            if v is None and allow_none:
                return None
            if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise InputError(f"config: {key} must be an integer, got {v!r}")
            if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise InputError(f"config: {key} must be a number, got {v!r}")
            if kind is bool and not isinstance(v, bool):
                raise InputError(f"config: {key} must be true or false, got {v!r}")
            return kind(v)

        def positive(key, v):
            if v <= 0:
                raise InputError(f"config: {key} must be > 0, got {v}")
            return v

        self.vocab = positive("vocab_size", get("vocab_size", int))
        self.d = positive("hidden_size", get("hidden_size", int))
        self.n_layers = positive("num_hidden_layers", get("num_hidden_layers", int))
        self.heads = positive("num_attention_heads", get("num_attention_heads", int))
        q_lora = get("q_lora_rank", int, allow_none=True)
        self.q_lora = q_lora if q_lora else 0  # null or 0: plain q_proj
        if self.q_lora < 0:
            raise InputError("config: q_lora_rank must be >= 0 or null")
        self.kv_lora = positive("kv_lora_rank", get("kv_lora_rank", int))
        self.nope = positive("qk_nope_head_dim", get("qk_nope_head_dim", int))
        self.rope = positive("qk_rope_head_dim", get("qk_rope_head_dim", int))
        if self.rope % 2:
            raise InputError(f"config: qk_rope_head_dim must be even, got {self.rope}")
        self.dqk = self.nope + self.rope
        self.vdim = positive("v_head_dim", get("v_head_dim", int))
        self.eps = positive("rms_norm_eps", get("rms_norm_eps", float))
        self.theta = positive("rope_theta", get("rope_theta", float))
        self.first_dense = get("first_k_dense_replace", int)
        if self.first_dense < 0:
            raise InputError("config: first_k_dense_replace must be >= 0")
        self.mtp = get("num_nextn_predict_layers", int)
        if self.mtp not in (0, 1):
            raise InputError(f"config: num_nextn_predict_layers must be 0 or 1, got {self.mtp}")
        self.mtp_weight = get("mtp_loss_weight", float, 0.3, required=False)
        self.n_blocks = self.n_layers + self.mtp  # the MTP block is block index L
        self.inter = positive("intermediate_size", get("intermediate_size", int)) \
            if self.first_dense > 0 else get("intermediate_size", int, 0, required=False)

        self.has_moe = any(self.is_moe(l) for l in range(self.n_blocks))
        if self.has_moe:
            self.moe_inter = positive("moe_intermediate_size", get("moe_intermediate_size", int))
            self.E = positive("n_routed_experts", get("n_routed_experts", int))
            self.n_shared = get("n_shared_experts", int, allow_none=True) or 0
            if self.n_shared < 0:
                raise InputError("config: n_shared_experts must be >= 0")
            self.k = positive("num_experts_per_tok", get("num_experts_per_tok", int))
            self.n_group = positive("n_group", get("n_group", int))
            self.topk_group = positive("topk_group", get("topk_group", int))
            self.scaling = get("routed_scaling_factor", float)
            self.norm_topk = get("norm_topk_prob", bool)
            self.alpha = get("aux_loss_alpha", float, 0.0001, required=False)
            if self.E % self.n_group:
                raise InputError(f"config: n_routed_experts {self.E} is not divisible by n_group {self.n_group}")
            if self.topk_group > self.n_group:
                raise InputError(f"config: topk_group {self.topk_group} > n_group {self.n_group}")
            if self.k > self.topk_group * (self.E // self.n_group):
                raise InputError(f"config: num_experts_per_tok {self.k} exceeds the experts in the kept groups")

        # RoPE scaling: none, or YaRN (Hugging Face DeepseekV3 semantics).
        rs = raw.get("rope_scaling")
        self.yarn = None
        if rs is not None:
            if not isinstance(rs, dict):
                raise InputError("config: rope_scaling must be null or an object")
            kind = rs.get("type", rs.get("rope_type"))
            if kind != "yarn":
                raise InputError(f"config: rope_scaling type {kind!r} is not supported (only 'yarn')")
            try:
                self.yarn = {
                    "factor": float(rs["factor"]),
                    "orig_max": float(rs["original_max_position_embeddings"]),
                    "beta_fast": float(rs.get("beta_fast", 32)),
                    "beta_slow": float(rs.get("beta_slow", 1)),
                    "mscale": float(rs.get("mscale", 1)),
                    "mscale_all_dim": float(rs.get("mscale_all_dim", 0)),
                }
            except (KeyError, TypeError, ValueError) as e:
                raise InputError(f"config: rope_scaling: bad or missing field {e}")
            if self.yarn["factor"] <= 0 or self.yarn["orig_max"] <= 0:
                raise InputError("config: rope_scaling factor and original_max_position_embeddings must be > 0")

    def is_moe(self, l):
        return l >= self.first_dense


def load_config(path):
    try:
        with open(path) as f:
            raw = json.load(f)
    except ValueError as e:
        raise InputError(f"{path}: not valid JSON ({e})")
    return Config(raw)


# ----------------------------------------------------------------------------------------------
# Parameter table: name -> shape, in a fixed order. All linear weights are [out, in], y = W x.

def param_shapes(cfg):
    d, H = cfg.d, cfg.heads
    shapes = {"model.embed_tokens.weight": [cfg.vocab, d]}
    for l in range(cfg.n_blocks):
        p = f"model.layers.{l}."
        if l == cfg.n_layers:  # the MTP block's extra tensors
            shapes[p + "enorm.weight"] = [d]
            shapes[p + "hnorm.weight"] = [d]
            shapes[p + "eh_proj.weight"] = [d, 2 * d]
            shapes[p + "shared_head.norm.weight"] = [d]
        shapes[p + "input_layernorm.weight"] = [d]
        if cfg.q_lora:
            shapes[p + "self_attn.q_a_proj.weight"] = [cfg.q_lora, d]
            shapes[p + "self_attn.q_a_layernorm.weight"] = [cfg.q_lora]
            shapes[p + "self_attn.q_b_proj.weight"] = [H * cfg.dqk, cfg.q_lora]
        else:
            shapes[p + "self_attn.q_proj.weight"] = [H * cfg.dqk, d]
        shapes[p + "self_attn.kv_a_proj_with_mqa.weight"] = [cfg.kv_lora + cfg.rope, d]
        shapes[p + "self_attn.kv_a_layernorm.weight"] = [cfg.kv_lora]
        shapes[p + "self_attn.kv_b_proj.weight"] = [H * (cfg.nope + cfg.vdim), cfg.kv_lora]
        shapes[p + "self_attn.o_proj.weight"] = [d, H * cfg.vdim]
        shapes[p + "post_attention_layernorm.weight"] = [d]
        if cfg.is_moe(l):
            E, I = cfg.E, cfg.moe_inter
            shapes[p + "mlp.gate.weight"] = [E, d]
            shapes[p + "mlp.gate.e_score_correction_bias"] = [E]
            shapes[p + "mlp.experts.gate_proj.weight"] = [E, I, d]
            shapes[p + "mlp.experts.up_proj.weight"] = [E, I, d]
            shapes[p + "mlp.experts.down_proj.weight"] = [E, d, I]
            if cfg.n_shared:
                S = cfg.n_shared * I
                shapes[p + "mlp.shared_experts.gate_proj.weight"] = [S, d]
                shapes[p + "mlp.shared_experts.up_proj.weight"] = [S, d]
                shapes[p + "mlp.shared_experts.down_proj.weight"] = [d, S]
        else:
            shapes[p + "mlp.gate_proj.weight"] = [cfg.inter, d]
            shapes[p + "mlp.up_proj.weight"] = [cfg.inter, d]
            shapes[p + "mlp.down_proj.weight"] = [d, cfg.inter]
    shapes["model.norm.weight"] = [d]
    shapes["lm_head.weight"] = [cfg.vocab, d]
    return shapes


def is_buffer(name):
    """The router bias is used for selection only and never differentiated."""
    return name.endswith("e_score_correction_bias")


def load_inputs(cfg, path, dtype):
    """Reads IN: every parameter (checked against the table) and tokens [B, T+1].
    Returns (params {name: tensor of dtype, trainable ones with requires_grad}, tokens int64)."""
    tensors, _ = read_safetensors(path)
    if "tokens" not in tensors:
        raise InputError(f"{path}: no 'tokens' tensor")
    tokens = tensors.pop("tokens")
    if tokens.dtype != torch.int32 or tokens.dim() != 2:
        raise InputError(f"{path}: tokens must be I32 [B, T+1], got {tokens.dtype} {list(tokens.shape)}")
    min_len = 3 if cfg.mtp else 2  # MTP needs T >= 2 to have a target
    if tokens.shape[0] < 1 or tokens.shape[1] < min_len:
        raise InputError(f"{path}: tokens shape {list(tokens.shape)} too small (need B >= 1, T+1 >= {min_len})")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab:
        raise InputError(f"{path}: token ids must lie in [0, {cfg.vocab})")
    shapes = param_shapes(cfg)
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise InputError(f"{path}: unexpected tensor {extra[0]!r} for this config")
    params = {}
    for name, shape in shapes.items():
        if name not in tensors:
            raise InputError(f"{path}: missing parameter {name!r}")
        t = tensors[name]
        if list(t.shape) != shape or not t.is_floating_point():
            raise InputError(f"{path}: {name}: expected float {shape}, got {t.dtype} {list(t.shape)}")
        params[name] = t.to(dtype).requires_grad_(not is_buffer(name))
    return params, tokens.long()


# ----------------------------------------------------------------------------------------------
# Building blocks.

def rmsnorm(x, w, eps):
    # y = x / sqrt(mean(x^2) + eps) * w, over the last dimension
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def swiglu(x, w_gate, w_up, w_down):
    # down(silu(gate x) * up x)
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _yarn_mscale(factor, m):
    # get_mscale(f, m) = 1 if f <= 1 else 0.1 m ln f + 1
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def rope_tables(cfg, T, dtype):
    """cos, sin of shape (T, r/2) for positions 0..T-1 (amplitude-scaled under YaRN),
    and the attention softmax scale."""
    r = cfg.rope
    i = torch.arange(r // 2, dtype=torch.float64)
    inv_freq = cfg.theta ** (-2.0 * i / r)  # theta^(-2i/r)
    amp = 1.0
    scale = 1.0 / math.sqrt(cfg.dqk)
    if cfg.yarn:
        y = cfg.yarn
        f = y["factor"]
        # Correction range: the dims whose wavelength sits between beta_fast and beta_slow rotations
        # over the original context; dim(n_rot) = r ln(orig / (n_rot 2 pi)) / (2 ln theta).
        def dim_of(n_rot):
            return r * math.log(y["orig_max"] / (n_rot * 2 * math.pi)) / (2 * math.log(cfg.theta))
        low = max(math.floor(dim_of(y["beta_fast"])), 0)
        high = min(math.ceil(dim_of(y["beta_slow"])), r - 1)
        if low == high:
            high += 0.001
        ramp = ((i - low) / (high - low)).clamp(0, 1)
        mask = 1 - ramp  # 1: keep the original frequency (extrapolate), 0: divide by f (interpolate)
        inv_freq = (inv_freq / f) * (1 - mask) + inv_freq * mask
        amp = _yarn_mscale(f, y["mscale"]) / _yarn_mscale(f, y["mscale_all_dim"])
        scale *= _yarn_mscale(f, y["mscale_all_dim"]) ** 2
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, r/2)
    return (angle.cos() * amp).to(dtype), (angle.sin() * amp).to(dtype), scale


def apply_rope(x, cos, sin):
    # Interleaved pairs (x[2i], x[2i+1]) rotated by angle pos * inv_freq[i]; x (..., T, r), cos/sin (T, r/2).
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


# ----------------------------------------------------------------------------------------------
# Multi-head Latent Attention over a batch: u (B, T, d) -> (B, T, d).

def attention(cfg, p, pre, u, cos, sin, scale):
    B, T, _ = u.shape
    H, eps = cfg.heads, cfg.eps
    if cfg.q_lora:
        cq = rmsnorm(F.linear(u, p[pre + "q_a_proj.weight"]), p[pre + "q_a_layernorm.weight"], eps)
        q = F.linear(cq, p[pre + "q_b_proj.weight"])
    else:
        q = F.linear(u, p[pre + "q_proj.weight"])
    q = q.view(B, T, H, cfg.dqk).transpose(1, 2)                      # (B, H, T, dqk)
    q_nope, q_rope = q.split([cfg.nope, cfg.rope], dim=-1)

    a = F.linear(u, p[pre + "kv_a_proj_with_mqa.weight"])            # (B, T, kv_lora + r)
    c_kv, k_rope = a.split([cfg.kv_lora, cfg.rope], dim=-1)
    c_kv = rmsnorm(c_kv, p[pre + "kv_a_layernorm.weight"], eps)
    kv = F.linear(c_kv, p[pre + "kv_b_proj.weight"])
    kv = kv.view(B, T, H, cfg.nope + cfg.vdim).transpose(1, 2)       # (B, H, T, nope + v)
    k_nope, v = kv.split([cfg.nope, cfg.vdim], dim=-1)

    q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)
    k_rope = apply_rope(k_rope, cos, sin).unsqueeze(1).expand(B, H, T, cfg.rope)  # one key for all heads
    k = torch.cat((k_nope, k_rope), dim=-1)                           # (B, H, T, dqk)

    scores = (q @ k.transpose(-1, -2)) * scale                        # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)               # j > i is masked
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    o = (probs @ v).transpose(1, 2).reshape(B, T, H * cfg.vdim)       # heads concatenated in order
    return F.linear(o, p[pre + "o_proj.weight"])


# ----------------------------------------------------------------------------------------------
# Mixture of experts over a batch: u (B, T, d) -> (output (B, T, d), balance loss, idx (B*T, k)).

def route(cfg, s, bias):
    """Group-limited top-k selection on c = s + bias (no gradient). s (N, E) -> idx (N, k)."""
    with torch.no_grad():
        N, E, G = s.shape[0], cfg.E, cfg.n_group
        c = s + bias
        per = E // G
        grouped = c.view(N, G, per)
        group_score = grouped.topk(min(2, per), dim=-1).values.sum(-1)        # (N, G)
        keep = group_score.topk(cfg.topk_group, dim=-1).indices
        keep_mask = torch.zeros(N, G, dtype=torch.bool).scatter_(1, keep, True)
        c = c.masked_fill(~keep_mask.repeat_interleave(per, dim=1), float("-inf"))
        return c.topk(cfg.k, dim=-1).indices


def moe(cfg, p, pre, u):
    B, T, d = u.shape
    N, E, k = B * T, cfg.E, cfg.k
    x = u.reshape(N, d)
    s = torch.sigmoid(F.linear(x, p[pre + "gate.weight"]))              # (N, E) router scores
    idx = route(cfg, s, p[pre + "gate.e_score_correction_bias"])       # (N, k)

    # Gate weights from s (differentiable): s[idx] (normalized over the k picks) * scaling.
    w = s.gather(1, idx)
    if cfg.norm_topk:
        w = w / w.sum(-1, keepdim=True)
    w = w * cfg.scaling

    # Permute: sort the N*k assignments (token, j) by expert, run each expert on its contiguous
    # rows, scale by the gate weight, and scatter-add back to the tokens.
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // k                                               # token of each sorted pair
    counts = torch.bincount(flat, minlength=E)
    wg, wu, wd = (p[pre + f"experts.{n}.weight"].unbind(0) for n in ("gate_proj", "up_proj", "down_proj"))
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if n:
            xe = x.index_select(0, token_of[start:start + n])
            outs.append(swiglu(xe, wg[e], wu[e], wd[e]))
            start += n
    routed = torch.cat(outs) * w.reshape(-1)[order].unsqueeze(1)        # (N*k, d)
    y = torch.zeros_like(x).index_add(0, token_of, routed)
    if cfg.n_shared:
        y = y + swiglu(x, *(p[pre + f"shared_experts.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj")))

    # Sequence-wise balance loss: per sequence f_i = E/(k T) * #{t : i in idx(t)} (constant),
    # P_i = mean_t s_ti / sum_j s_tj; L = alpha * sum_i f_i P_i, averaged over sequences.
    with torch.no_grad():
        picked = torch.zeros(N, E, dtype=s.dtype).scatter_(1, idx, 1.0)
        f = picked.view(B, T, E).sum(1) * (E / (k * T))                 # (B, E)
    P = (s / s.sum(-1, keepdim=True)).view(B, T, E).mean(1)             # (B, E)
    balance = cfg.alpha * (f * P).sum(-1).mean()
    return y.view(B, T, d), balance, idx


# ----------------------------------------------------------------------------------------------
# One pre-norm block and the whole model.

def block(cfg, p, l, h, rot):
    pre = f"model.layers.{l}."
    h = h + attention(cfg, p, pre + "self_attn.", rmsnorm(h, p[pre + "input_layernorm.weight"], cfg.eps), *rot)
    u = rmsnorm(h, p[pre + "post_attention_layernorm.weight"], cfg.eps)
    if cfg.is_moe(l):
        f, balance, idx = moe(cfg, p, pre + "mlp.", u)
        return h + f, balance, idx
    f = swiglu(u, *(p[pre + f"mlp.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj")))
    return h + f, None, None


def forward(cfg, p, tokens):
    """tokens (B, T+1) int64. Returns {"loss", "loss_main", "loss_mtp", "loss_balance" (0-dim),
    "logits" (B, T, V), "expert_idx" {block: (B*T, k)}}."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    B, T = x.shape
    dtype = p["lm_head.weight"].dtype
    rot = rope_tables(cfg, T, dtype)
    emb, head = p["model.embed_tokens.weight"], p["lm_head.weight"]
    zero = torch.zeros((), dtype=dtype)
    balance, expert_idx = zero, {}

    h = F.embedding(x, emb)
    for l in range(cfg.n_layers):
        h, bal, idx = block(cfg, p, l, h, rot)
        if idx is not None:
            balance, expert_idx[l] = balance + bal, idx
    hf = rmsnorm(h, p["model.norm.weight"], cfg.eps)
    logits = F.linear(hf, head)                                          # (B, T, V)
    loss_main = F.cross_entropy(logits.reshape(B * T, -1), y.reshape(B * T))

    loss_mtp = zero
    if cfg.mtp:
        L = cfg.n_layers
        pre = f"model.layers.{L}."
        # h'_i = eh_proj([RMSNorm(Emb(y_i)); RMSNorm(hf_i)]), embedding half first.
        e = F.embedding(y, emb)
        hm = F.linear(torch.cat((rmsnorm(e, p[pre + "enorm.weight"], cfg.eps),
                                 rmsnorm(hf, p[pre + "hnorm.weight"], cfg.eps)), dim=-1),
                      p[pre + "eh_proj.weight"])
        hm, bal, idx = block(cfg, p, L, hm, rot)
        if idx is not None:
            balance, expert_idx[L] = balance + bal, idx
        mtp_logits = F.linear(rmsnorm(hm, p[pre + "shared_head.norm.weight"], cfg.eps), head)
        # position i predicts y[i+1]; the last position has no target.
        loss_mtp = F.cross_entropy(mtp_logits[:, :-1].reshape(B * (T - 1), -1), y[:, 1:].reshape(B * (T - 1)))

    loss = loss_main + cfg.mtp_weight * loss_mtp + balance
    return {"loss": loss, "loss_main": loss_main, "loss_mtp": loss_mtp, "loss_balance": balance,
            "logits": logits, "expert_idx": expert_idx}
