"""Small language models written in the styles people train and export.

The project's own code, for test/EndToEnd/user_exports.py and
bench/mask_fusion_memory.py. What matters here is not the architecture but
the way each model is written: the buffers, masks, ties, casts and
initialisations that decide what torch.onnx.export puts in the file. Each
family keeps the habits of a widely used style of model code:

  GPTStyleLM    learned positions, LayerNorm, one fused q/k/v Linear, a float
                causal buffer of ones compared with `== 0` by masked_fill,
                nn.GELU, nn.Dropout modules, embedding tied to the head;
  LlamaStyleLM  RMSNorm computed in float and cast back, grouped-query
                attention (key/value heads expanded), rotary embeddings on
                real-valued pairs from non-persistent cos/sin buffers, an
                additive -inf mask buffer, SwiGLU, ignore_index=-1;
  Gpt2StyleLM   [in, out] projections through torch.addmm, normal(0.02)
                initialisation, a bool causal buffer used by torch.where
                with the dtype's lowest value, a hand-written tanh GELU,
                view/permute head splitting, nn.CrossEntropyLoss;
  SdpaStyleLM   F.scaled_dot_product_attention(..., is_causal=True)
                (PyTorch 2.0 and later);
  EncoderStackLM  PyTorch's own nn.TransformerEncoder of pre-norm
                nn.TransformerEncoderLayer (batch_first, GELU), the float
                -inf mask nn.Transformer.generate_square_subsequent_mask
                makes as a buffer, learned positions as one nn.Parameter,
                the embedding tied to the head: a model for which the user
                writes no attention at all.

Every model's forward takes (token ids, targets), both int64 [batch, seq],
and returns the mean cross-entropy loss.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def has_sdpa():
    """Whether this PyTorch has F.scaled_dot_product_attention (2.0+)."""
    return hasattr(F, "scaled_dot_product_attention")


def flat_cross_entropy(logits, targets, **kwargs):
    """Cross-entropy over every position: logits [b, s, V], targets [b, s]."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), **kwargs)


# --- GPT style ---------------------------------------------------------------

class FusedHeadsAttention(nn.Module):
    """Causal self-attention with q, k and v from one Linear.

    mask="keep": a float buffer of ones on and below the diagonal, [1, 1, C, C],
    read as `masked_fill(keep[:, :, :s, :s] == 0, -inf)`.
    mask="additive": a [C, C] buffer of 0 and -inf (strictly above the
    diagonal), added to the scores as `scores + mask[:s, :s]`.
    """

    def __init__(self, width, heads, context, p_drop, mask="keep"):
        super().__init__()
        self.heads, self.mask_style = heads, mask
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.prob_drop = nn.Dropout(p_drop)
        self.out_drop = nn.Dropout(p_drop)
        if mask == "keep":
            keep = torch.ones(context, context).tril()
            self.register_buffer("keep", keep.reshape(1, 1, context, context))
        elif mask == "additive":
            self.register_buffer("future", torch.full((context, context), float("-inf")).triu(1))
        else:
            raise ValueError(f"mask must be 'keep' or 'additive', not {mask!r}")

    def forward(self, h):
        n, s, width = h.size()
        per_head = width // self.heads

        def heads_first(t):  # [n, s, width] -> [n, heads, s, per_head]
            return t.view(n, s, self.heads, per_head).transpose(1, 2)

        q, k, v = map(heads_first, self.qkv(h).split(width, dim=-1))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(per_head))
        if self.mask_style == "keep":
            scores = scores.masked_fill(self.keep[:, :, :s, :s] == 0, float("-inf"))
        else:
            scores = scores + self.future[:s, :s]
        probs = self.prob_drop(F.softmax(scores, dim=-1))
        mixed = (probs @ v).transpose(1, 2).contiguous().view(n, s, width)
        return self.out_drop(self.out(mixed))


class GPTStyleLayer(nn.Module):
    """Pre-norm residual layer: attention, then a 4x GELU feed-forward."""

    def __init__(self, width, heads, context, p_drop, mask):
        super().__init__()
        self.attn_norm = nn.LayerNorm(width)
        self.attn = FusedHeadsAttention(width, heads, context, p_drop, mask)
        self.ff_norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                nn.Linear(4 * width, width), nn.Dropout(p_drop))

    def forward(self, h):
        h = h + self.attn(self.attn_norm(h))
        return h + self.ff(self.ff_norm(h))


class GPTStyleLM(nn.Module):
    """Token and learned position embeddings, pre-norm layers, tied head.

    PyTorch's default initialisation throughout: every LayerNorm gain is 1
    and every LayerNorm bias 0 (an eval-mode export finds them equal and
    keeps one initializer for all).
    """

    def __init__(self, vocab=96, context=16, depth=2, heads=4, width=32, p_drop=0.0,
                 mask="keep"):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.embed_drop = nn.Dropout(p_drop)
        self.layers = nn.ModuleList(GPTStyleLayer(width, heads, context, p_drop, mask)
                                    for _ in range(depth))
        self.final_norm = nn.LayerNorm(width)
        self.unembed = nn.Linear(width, vocab, bias=False)
        self.tokens.weight = self.unembed.weight  # one matrix, two uses

    def forward(self, idx, targets):
        where = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        h = self.embed_drop(self.tokens(idx) + self.positions(where))
        for layer in self.layers:
            h = layer(h)
        return flat_cross_entropy(self.unembed(self.final_norm(h)), targets)


# --- Llama style -------------------------------------------------------------

class RMSNormFloat(nn.Module):
    """x / rms(x) * gain, computed in float32 whatever x's dtype, cast back."""

    def __init__(self, width, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * inv_rms).type_as(x) * self.weight


def rotary_tables(per_head, length, base=10000.0):
    """cos and sin of angle[pos, i] = pos * base^(-2i/per_head), [length, per_head/2]."""
    inv_freq = base ** (-torch.arange(0, per_head, 2).float() / per_head)
    angle = torch.arange(length).float()[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


def rotate_pairs(x, cos, sin):
    """Rotates each pair (x[..., 2i], x[..., 2i+1]) of x [b, s, heads, per_head]
    by the angle whose cos/sin [s, per_head/2] the tables hold, in float."""
    first, second = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    turned = torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return turned.flatten(3).type_as(x)


def widen_kv(t, groups):
    """[b, kv_heads, s, d] -> [b, kv_heads * groups, s, d]: each key/value
    head serves `groups` consecutive query heads."""
    if groups == 1:
        return t
    b, kv_heads, s, d = t.shape
    return t[:, :, None].expand(b, kv_heads, groups, s, d).reshape(b, kv_heads * groups, s, d)


class GroupedQueryAttention(nn.Module):
    def __init__(self, width, heads, kv_heads, context, p_drop):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.per_head = width // heads
        self.q_lin = nn.Linear(width, heads * self.per_head, bias=False)
        self.k_lin = nn.Linear(width, kv_heads * self.per_head, bias=False)
        self.v_lin = nn.Linear(width, kv_heads * self.per_head, bias=False)
        self.out_lin = nn.Linear(heads * self.per_head, width, bias=False)
        self.prob_drop = nn.Dropout(p_drop)
        self.out_drop = nn.Dropout(p_drop)
        blocked = torch.triu(torch.full((1, 1, context, context), float("-inf")), diagonal=1)
        self.register_buffer("blocked", blocked)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_lin(x).view(b, s, self.heads, self.per_head)
        k = self.k_lin(x).view(b, s, self.kv_heads, self.per_head)
        v = self.v_lin(x).view(b, s, self.kv_heads, self.per_head)
        q, k = rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        groups = self.heads // self.kv_heads
        k, v = widen_kv(k, groups), widen_kv(v, groups)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.per_head)
        scores = scores + self.blocked[:, :, :s, :s]
        probs = self.prob_drop(F.softmax(scores.float(), dim=-1).type_as(q))
        mixed = torch.matmul(probs, v).transpose(1, 2).contiguous().view(b, s, -1)
        return self.out_drop(self.out_lin(mixed))


class SwiGLU(nn.Module):
    """w_out(silu(w_gate x) * w_in x), no biases."""

    def __init__(self, width, hidden, p_drop):
        super().__init__()
        self.w_gate = nn.Linear(width, hidden, bias=False)
        self.w_in = nn.Linear(width, hidden, bias=False)
        self.w_out = nn.Linear(hidden, width, bias=False)
        self.drop = nn.Dropout(p_drop)

    def forward(self, x):
        return self.drop(self.w_out(F.silu(self.w_gate(x)) * self.w_in(x)))


class LlamaStyleLayer(nn.Module):
    def __init__(self, width, heads, kv_heads, context, ffn_width, p_drop, eps):
        super().__init__()
        self.attn_norm = RMSNormFloat(width, eps)
        self.attn = GroupedQueryAttention(width, heads, kv_heads, context, p_drop)
        self.ff_norm = RMSNormFloat(width, eps)
        self.ff = SwiGLU(width, ffn_width, p_drop)

    def forward(self, x, cos, sin):
        # Sub-modules called through .forward(), as some code does: the
        # exporter then records no scope for them (their weights come back
        # as blocks.N.q_lin.weight, not blocks.N.attn.q_lin.weight, when the
        # export does not name them itself).
        x = x + self.attn.forward(self.attn_norm(x), cos, sin)
        return x + self.ff.forward(self.ff_norm(x))


class LlamaStyleLM(nn.Module):
    """RMSNorm pre-norm layers with rotary grouped-query attention and SwiGLU,
    tied head, cross-entropy with ignore_index=-1. The rotary tables are
    non-persistent buffers (not in state_dict)."""

    def __init__(self, vocab=96, context=16, depth=2, heads=4, kv_heads=2, width=32,
                 ffn_width=64, p_drop=0.0, eps=1e-5):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.embed_drop = nn.Dropout(p_drop)
        self.blocks = nn.ModuleList(
            LlamaStyleLayer(width, heads, kv_heads, context, ffn_width, p_drop, eps)
            for _ in range(depth))
        self.norm = RMSNormFloat(width, eps)
        self.head = nn.Linear(width, vocab, bias=False)
        self.embed.weight = self.head.weight
        cos, sin = rotary_tables(width // heads, context)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, idx, targets):
        s = idx.shape[1]
        x = self.embed_drop(self.embed(idx))
        cos, sin = self.rope_cos[:s], self.rope_sin[:s]
        for block in self.blocks:
            x = block(x, cos, sin)
        return flat_cross_entropy(self.head(self.norm(x)), targets, ignore_index=-1)


# --- GPT-2 (transposed projections) style ------------------------------------

class AddmmProjection(nn.Module):
    """y = bias + x @ weight with the weight stored [in, out], computed by
    torch.addmm on x flattened to rows; weight ~ normal(0, 0.02), bias 0."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(nn.init.normal_(torch.empty(n_in, n_out), std=0.02))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        rows = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return rows.view(*x.size()[:-1], rows.size(-1))


def tanh_gelu(x):
    """GELU's tanh approximation, spelled out."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class MaskedWhereAttention(nn.Module):
    """Attention whose causal mask is a bool buffer [1, 1, C, C] applied with
    torch.where(mask, scores, lowest float), scores divided by a 0-d tensor."""

    def __init__(self, width, heads, context, p_drop):
        super().__init__()
        self.heads = heads
        allowed = torch.ones(context, context, dtype=torch.bool).tril()
        self.register_buffer("allowed", allowed[None, None])
        self.qkv = AddmmProjection(width, 3 * width)
        self.proj = AddmmProjection(width, width)
        self.prob_drop = nn.Dropout(p_drop)
        self.out_drop = nn.Dropout(p_drop)

    def to_heads(self, t):  # [b, s, width] -> [b, heads, s, d]
        b, s, width = t.size()
        return t.view(b, s, self.heads, width // self.heads).permute(0, 2, 1, 3)

    def from_heads(self, t):  # [b, heads, s, d] -> [b, s, width]
        t = t.permute(0, 2, 1, 3).contiguous()
        return t.view(*t.size()[:2], -1)

    def forward(self, x):
        q, k, v = (self.to_heads(t) for t in self.qkv(x).split(x.size(-1), dim=2))
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores / torch.full([], v.size(-1) ** 0.5, dtype=scores.dtype)
        # Rows are the last n_q of n_k positions (code written for a key cache
        # slices this way; here n_q == n_k).
        n_q, n_k = q.size(-2), k.size(-2)
        allowed = self.allowed[:, :, n_k - n_q:n_k, :n_k]
        lowest = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype)
        probs = self.prob_drop(F.softmax(torch.where(allowed, scores, lowest), dim=-1))
        return self.out_drop(self.proj(self.from_heads(torch.matmul(probs, v))))


class Gpt2StyleLayer(nn.Module):
    def __init__(self, width, heads, context, p_drop, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=eps)
        self.attn = MaskedWhereAttention(width, heads, context, p_drop)
        self.norm2 = nn.LayerNorm(width, eps=eps)
        self.up = AddmmProjection(width, 4 * width)
        self.down = AddmmProjection(4 * width, width)
        self.ff_drop = nn.Dropout(p_drop)

    def forward(self, x):
        x = self.attn(self.norm1(x)) + x
        return x + self.ff_drop(self.down(tanh_gelu(self.up(self.norm2(x)))))


class Gpt2StyleLM(nn.Module):
    """Embeddings ~ normal(0, 0.02), the head's weight taken from the token
    embedding, loss from an nn.CrossEntropyLoss module."""

    def __init__(self, vocab=96, context=16, depth=2, heads=4, width=32, p_drop=0.0,
                 eps=1e-5):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.drop = nn.Dropout(p_drop)
        self.stack = nn.ModuleList(Gpt2StyleLayer(width, heads, context, p_drop, eps)
                                   for _ in range(depth))
        self.norm_out = nn.LayerNorm(width, eps=eps)
        self.lm = nn.Linear(width, vocab, bias=False)
        self.lm.weight = self.tok.weight
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, ids, labels):
        position_ids = torch.arange(ids.size(-1), dtype=torch.long).unsqueeze(0)
        x = self.drop(self.tok(ids) + self.pos(position_ids))
        for layer in self.stack:
            x = layer(x)
        logits = self.lm(self.norm_out(x))
        return self.criterion(logits.view(-1, logits.size(-1)), labels.view(-1))


# --- scaled_dot_product_attention style --------------------------------------

class SdpaAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        b, s, width = x.shape
        q, k, v = (self.qkv(x).view(b, s, 3, self.heads, width // self.heads)
                   .permute(2, 0, 3, 1, 4).unbind(0))
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(mixed.transpose(1, 2).reshape(b, s, width))


class SdpaStyleLM(nn.Module):
    """Pre-norm layers whose attention is F.scaled_dot_product_attention with
    is_causal=True (no mask buffer at all), untied head."""

    def __init__(self, vocab=96, context=16, depth=2, heads=4, width=32):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * depth))
        self.attns = nn.ModuleList(SdpaAttention(width, heads) for _ in range(depth))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                                nn.Linear(4 * width, width))
                                  for _ in range(depth))
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tokens(idx) + self.positions(torch.arange(idx.size(1), device=idx.device))
        for i, (attn, mlp) in enumerate(zip(self.attns, self.mlps)):
            x = x + attn(self.norms[2 * i](x))
            x = x + mlp(self.norms[2 * i + 1](x))
        return flat_cross_entropy(self.head(self.final_norm(x)), targets)


class EncoderStackLM(nn.Module):
    """A causal language model from PyTorch's library layers."""

    def __init__(self, vocab=96, context=16, depth=2, heads=4, width=32, p_drop=0.0):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.zeros(1, context, width))
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width,
                                           dropout=p_drop, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.stack = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.tokens.weight
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, idx, targets):
        seq = idx.size(1)
        h = self.tokens(idx) + self.positions[:, :seq]
        h = self.stack(h, mask=self.causal[:seq, :seq])
        logits = self.lm_head(self.final_norm(h))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
