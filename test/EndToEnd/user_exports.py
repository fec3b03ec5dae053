#!/usr/bin/python3
# REQUIRES: torch, onnx, mpirun
# RUN: %python %s fastllm-opt
"""Models written and exported the way people do train like PyTorch.

Three models, written as their authors write them, not shaped for the tool:
  - gpt: nanoGPT's GPT. Default initialisation (every LayerNorm gain 1, bias
    0, so an eval-mode export deduplicates them into Identity copies),
    `nn.Dropout(dropout)` modules with nanoGPT's default dropout = 0.0, the
    causal mask registered as a float buffer `bias` and applied as
    `masked_fill(self.bias[:, :, :T, :T] == 0, -inf)`, and the head tied with
    `self.transformer.wte.weight = self.lm_head.weight`.
  - llama: llama2.c's Transformer. RMSNorm gains 1, grouped-query attention
    with `repeat_kv`, RoPE on real-valued reshapes of q and k from
    non-persistent cos/sin buffers, an additive -inf mask registered as a
    buffer (`torch.triu(full(-inf), 1)`), SwiGLU, `nn.Dropout(0.0)` and the
    tied head `tok_embeddings.weight = output.weight`.
  - hf-gpt2: Hugging Face's GPT2LMHeadModel. Conv1D layers (`addmm` with
    [in, out] weights, zero biases: an eval-mode export merges them all),
    a bool causal-mask buffer sliced and applied with
    `torch.where(mask, w, finfo.min)`, tanh GELU written out, position ids
    from `arange`, the head tied to `wte`.
Each is exported three ways:
  - helper: tools/fastllm_export.py (training mode, no folding, the parameter
    list in the file's metadata; the helper's own loss check runs too);
  - default: `torch.onnx.export(model, args, path)` with its defaults (eval
    mode, constant folding on);
  - training: training mode with constant folding on.
and trained 30 steps with `--sampler sequential` at dp 1 and at dp 2 with
ZeRO-1, 2 and 3 (the same global batch of 4: the export's micro-batch of 2
with --grad-accum 2 on one rank, one on each of two), against the very same PyTorch
model trained on the same samples with torch.optim.AdamW (decay on >= 2-dim
parameters). Checks, per run:
  - every step's loss within 1e-5 relative of PyTorch's;
  - the weights written by --save-weights cover every parameter of the
    model: by name, through a tie, or (a weight whose name constant folding
    removed) by its initial value; each within 1e-4 relative L2 of
    PyTorch's final value. A tensor whose true gradient is zero in part (the
    key third of c_attn.bias: softmax ignores a per-query constant) is moved
    by AdamW's normalised rounding noise, in PyTorch as here; such a tensor
    (PyTorch fp32 itself more than 1e-4 from a float64 PyTorch run) passes
    if it is no farther from the float64 run than 3x PyTorch fp32 is, and
    is reported as noise-driven. Buffers saved must be unchanged.
Prints PASS/FAIL per case and `user export tests: P passed, F failed`.
Options: --models gpt,llama,hf-gpt2  --modes helper,default,training  --dp 1,2
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import fastllm_export  # noqa: E402
import torch_reference  # noqa: E402

# Exported with the micro-batch MICRO (the exporter fixes the shapes); the
# global batch BATCH is 2 micro-batches: --grad-accum 2 on one rank, one
# micro-batch on each of two.
VOCAB, DIM, SEQ, BATCH, MICRO = 96, 32, 16, 4, 2
STEPS = 30
HP = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]


# --- nanoGPT (model.py, trimmed to what training uses) ----------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=4, n_embd=DIM,
                 dropout=0.0):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, block_size, dropout) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# --- llama2.c (model.py, trimmed to what training uses) ---------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.cos(freqs), torch.sin(freqs)


def reshape_for_broadcast(freqs_cis, x):
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(shape)


def apply_rotary_emb(xq, xk, freqs_cos, freqs_sin):
    xq_r, xq_i = xq.float().reshape(xq.shape[:-1] + (-1, 2)).unbind(-1)
    xk_r, xk_i = xk.float().reshape(xk.shape[:-1] + (-1, 2)).unbind(-1)
    freqs_cos = reshape_for_broadcast(freqs_cos, xq_r)
    freqs_sin = reshape_for_broadcast(freqs_sin, xq_r)
    xq_out_r = xq_r * freqs_cos - xq_i * freqs_sin
    xq_out_i = xq_r * freqs_sin + xq_i * freqs_cos
    xk_out_r = xk_r * freqs_cos - xk_i * freqs_sin
    xk_out_i = xk_r * freqs_sin + xk_i * freqs_cos
    xq_out = torch.stack([xq_out_r, xq_out_i], dim=-1).flatten(3)
    xk_out = torch.stack([xk_out_r, xk_out_i], dim=-1).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim)
            .reshape(bs, slen, n_kv_heads * n_rep, head_dim))


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, max_seq_len, dropout):
        super().__init__()
        self.n_kv_heads = n_kv_heads
        self.n_local_heads = n_heads
        self.n_local_kv_heads = n_kv_heads
        self.n_rep = n_heads // n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        mask = torch.full((1, 1, max_seq_len, max_seq_len), float("-inf"))
        mask = torch.triu(mask, diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, x, freqs_cos, freqs_sin):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)
        xk = repeat_kv(xk, self.n_rep)
        xv = repeat_kv(xv, self.n_rep)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + self.mask[:, :, :seqlen, :seqlen]
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        scores = self.attn_dropout(scores)
        output = torch.matmul(scores, xv)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.resid_dropout(self.wo(output))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, max_seq_len, dropout, eps):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv_heads, max_seq_len, dropout)
        self.feed_forward = FeedForward(dim, 64, dropout)
        self.attention_norm = RMSNorm(dim, eps=eps)
        self.ffn_norm = RMSNorm(dim, eps=eps)

    def forward(self, x, freqs_cos, freqs_sin):
        h = x + self.attention.forward(self.attention_norm(x), freqs_cos, freqs_sin)
        return h + self.feed_forward.forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, dim=DIM, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=VOCAB,
                 max_seq_len=SEQ, dropout=0.0, norm_eps=1e-5):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList([TransformerBlock(dim, n_heads, n_kv_heads, max_seq_len,
                                                      dropout, norm_eps)
                                     for _ in range(n_layers)])
        self.norm = RMSNorm(dim, eps=norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.tok_embeddings.weight = self.output.weight
        freqs_cos, freqs_sin = precompute_freqs_cis(dim // n_heads, max_seq_len)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)

    def forward(self, tokens, targets):
        _bsz, seqlen = tokens.shape
        h = self.dropout(self.tok_embeddings(tokens))
        freqs_cos = self.freqs_cos[:seqlen]
        freqs_sin = self.freqs_sin[:seqlen]
        for layer in self.layers:
            h = layer(h, freqs_cos, freqs_sin)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)


# --- Hugging Face GPT-2 (modeling_gpt2.py, trimmed to what training uses) ----

class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                               * (input + 0.044715 * torch.pow(input, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, embed_dim, num_heads, max_positions, pdrop):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((max_positions, max_positions),
                                                           dtype=torch.bool))
                             .view(1, 1, max_positions, max_positions))
        self.register_buffer("masked_bias", torch.tensor(-1e4), persistent=False)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.c_attn = Conv1D(3 * embed_dim, embed_dim)
        self.c_proj = Conv1D(embed_dim, embed_dim)
        self.attn_dropout = nn.Dropout(pdrop)
        self.resid_dropout = nn.Dropout(pdrop)

    def _attn(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5,
                                                 dtype=attn_weights.dtype)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length:key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = self.attn_dropout(attn_weights)
        return torch.matmul(attn_weights, value)

    def _split_heads(self, tensor):
        new_shape = tensor.size()[:-1] + (self.num_heads, self.head_dim)
        return tensor.view(new_shape).permute(0, 2, 1, 3)

    def _merge_heads(self, tensor):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        return tensor.view(tensor.size()[:-2] + (self.num_heads * self.head_dim,))

    def forward(self, hidden_states):
        query, key, value = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        query, key, value = map(self._split_heads, (query, key, value))
        attn_output = self._merge_heads(self._attn(query, key, value))
        return self.resid_dropout(self.c_proj(attn_output))


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, embed_dim, pdrop):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, embed_dim)
        self.c_proj = Conv1D(embed_dim, intermediate_size)
        self.act = NewGELUActivation()
        self.dropout = nn.Dropout(pdrop)

    def forward(self, hidden_states):
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class GPT2Block(nn.Module):
    def __init__(self, hidden_size, num_heads, max_positions, pdrop, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_size, eps=eps)
        self.attn = GPT2Attention(hidden_size, num_heads, max_positions, pdrop)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=eps)
        self.mlp = GPT2MLP(4 * hidden_size, hidden_size, pdrop)

    def forward(self, hidden_states):
        hidden_states = self.attn(self.ln_1(hidden_states)) + hidden_states
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab_size=VOCAB, n_positions=SEQ, n_embd=DIM, n_layer=2, n_head=4,
                 pdrop=0.0, layer_norm_epsilon=1e-5):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab_size, n_embd)
        self.transformer.wpe = nn.Embedding(n_positions, n_embd)
        self.transformer.drop = nn.Dropout(pdrop)
        self.transformer.h = nn.ModuleList([GPT2Block(n_embd, n_head, n_positions, pdrop,
                                                      layer_norm_epsilon)
                                            for _ in range(n_layer)])
        self.transformer.ln_f = nn.LayerNorm(n_embd, eps=layer_norm_epsilon)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        for emb in (self.transformer.wte, self.transformer.wpe):
            nn.init.normal_(emb.weight, std=0.02)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids, labels):
        t = self.transformer
        position_ids = torch.arange(0, input_ids.size(-1), dtype=torch.long).unsqueeze(0)
        hidden_states = t.drop(t.wte(input_ids) + t.wpe(position_ids))
        for block in t.h:
            hidden_states = block(hidden_states)
        lm_logits = self.lm_head(t.ln_f(hidden_states))
        return nn.CrossEntropyLoss()(lm_logits.view(-1, lm_logits.size(-1)), labels.view(-1))


MODELS = {"gpt": GPT, "llama": Transformer, "hf-gpt2": GPT2LMHeadModel}


def make_model(kind):
    torch.manual_seed(1234)
    return MODELS[kind]()


# --- PyTorch reference ------------------------------------------------------

def torch_train(kind, data, dtype):
    model = make_model(kind).to(dtype)
    losses = torch_reference.train(model, model.parameters(),  # a tied weight once
                                   torch_reference.sequential_batches(data, STEPS, BATCH, SEQ), HP)
    return losses, model


# --- exports ----------------------------------------------------------------

def export(kind, mode, path):
    model = make_model(kind)
    x = torch.randint(0, VOCAB, (MICRO, SEQ), generator=torch.Generator().manual_seed(7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "helper":
            fastllm_export.export(model, (x, x), path, check=True, tool=TOOL)
        elif mode == "default":
            torch.onnx.export(model, (x, x), path, input_names=["idx", "targets"],
                              output_names=["loss"])
        else:
            torch.onnx.export(model, (x, x), path, input_names=["idx", "targets"],
                              output_names=["loss"], training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=True)


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def match_weights(kind, start, saved):
    """Maps each saved tensor to (state_dict name, row count) of PyTorch's.

    By name or alias (a tied weight has several); otherwise, for a weight
    constant folding renamed, by its initial value (`start`: the compiled
    program's weights.safetensors): equal to the first rows of exactly one
    PyTorch parameter (a position table gathered at 0..T-1 becomes its first
    T rows), or to a buffer. Returns (found, unknown, renamed): renamed lists
    the tensors found by value, not by name.
    """
    initial = make_model(kind).state_dict(keep_vars=True)
    aliases = {}
    for name, t in initial.items():
        aliases.setdefault(id(t), []).append(name)
    canonical = {name: aliases[id(t)][0] for name, t in initial.items()}
    params = {n for n, _ in make_model(kind).named_parameters()}
    found, unknown, renamed = {}, [], []
    for name in saved:
        if name in canonical:
            found[name] = (canonical[name], None)
            continue
        value = start.get(name)
        hits = set()
        for ref_name, t in initial.items():
            t = t.detach().numpy()
            if value is not None and t.ndim == value.ndim and t.shape[1:] == value.shape[1:] \
                    and t.shape[0] >= value.shape[0] \
                    and np.array_equal(t[:value.shape[0]], value):
                hits.add((canonical[ref_name], value.shape[0]))
        trained = {h for h in hits if h[0] in params}
        if len(trained) == 1 or (hits and not trained):
            found[name] = sorted(trained or hits)[0]
            renamed.append(name)
        else:
            unknown.append(name)
    return found, unknown, renamed


def check_weights(kind, start_path, saved_path, ref32, ref64):
    saved = torch_reference.read_safetensors(saved_path)
    found, unknown, renamed = match_weights(kind, torch_reference.read_safetensors(start_path), saved)
    final32 = {k: v.detach().numpy() for k, v in ref32.state_dict().items()}
    final64 = {k: v.detach().numpy() for k, v in ref64.state_dict().items()}
    param_names = {n for n, _ in make_model(kind).named_parameters()}
    covered = {ref for ref, _ in found.values()}
    missing = sorted(param_names - covered)
    worst, worst_name, noise, bad = 0.0, "", [], []
    for name, (ref, rows) in found.items():
        ours = saved[name]
        t32, t64 = final32[ref], final64[ref]
        if rows is not None:
            t32, t64 = t32[:rows], t64[:rows]
        if ours.shape != t32.shape:
            bad.append(f"{name}: shape {list(ours.shape)} vs PyTorch {list(t32.shape)}")
            continue
        if ref not in param_names:  # a buffer: never trained
            if not np.array_equal(ours, t32):
                bad.append(f"{name}: buffer changed")
            continue
        diff = rel_l2(ours, t32)
        if diff <= 1e-4:
            if diff > worst:
                worst, worst_name = diff, name
            continue
        floor = rel_l2(t32.astype(np.float32), t64)
        if floor > 1e-4 and rel_l2(ours, t64) <= 3 * floor:
            noise.append(f"{name} {diff:.1e} (PyTorch fp32 vs fp64 {floor:.1e})")
        else:
            bad.append(f"{name}: {diff:.2e} (PyTorch fp32 vs fp64 {floor:.1e})")
    ok = not missing and not unknown and not bad
    detail = (f"worst {worst:.2e} ({worst_name}) over {len(found)} tensors"
              + (f"; not under PyTorch's name, found by value: {renamed}" if renamed else "")
              + (f"; noise-driven: {', '.join(noise)}" if noise else "")
              + (f"; FAILED: {'; '.join(bad)}" if bad else "")
              + (f"; missing {missing}" if missing else "")
              + (f"; unmatched {unknown}" if unknown else ""))
    return ok, detail, worst


def run_case(work, kind, mode, dp, zero, onnx_path, data_path, reference, ref32, ref64):
    label = f"{kind} {mode}-export dp {dp}" + (f" ZeRO-{zero}" if dp > 1 else "")
    out = os.path.join(work, f"dp{dp}-zero{zero}")
    r = subprocess.run([TOOL, "compile", onnx_path, "-o", out, "--dp", str(dp),
                        "--zero-stage", str(zero)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return [(False, f"{label}: compile", r.stderr[-2000:])], None
    metrics = os.path.join(out, "metrics.jsonl")
    saved = os.path.join(out, "final.safetensors")
    cmd = [os.path.join(out, "train"), "--data", data_path, "--steps", str(STEPS),
           "--sampler", "sequential", "--metrics", metrics, "--save-weights", saved,
           "--grad-accum", str(BATCH // (MICRO * dp))]
    cmd += [a for k, v in HP.items() for a in (f"--{k.replace('_', '-')}", repr(v))]
    r = subprocess.run((MPIRUN + ["-np", str(dp)] if dp > 1 else []) + cmd,
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        return [(False, f"{label}: train", r.stderr[-2000:])], None
    ours = [json.loads(line)["loss"] for line in open(metrics)]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, reference)]
    at = max(range(len(rel)), key=lambda i: rel[i])
    loss_ok = len(ours) == STEPS and rel[at] <= 1e-5
    results = [(loss_ok, f"{label}: losses within 1e-5 over {STEPS} steps",
                f"max rel diff {rel[at]:.2e} at step {at + 1} (ours {ours[at]:.7f}, "
                f"torch {reference[at]:.7f})")]
    ok, detail, worst = check_weights(kind, os.path.join(out, "weights.safetensors"), saved,
                                      ref32, ref64)
    results.append((ok, f"{label}: final weights within 1e-4 relative L2 per tensor", detail))
    return results, (rel[at], worst)


def main():
    global TOOL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tool", nargs="?", default=os.path.join(ROOT, "build", "bin", "fastllm-opt"))
    ap.add_argument("--models", default="gpt,llama,hf-gpt2")
    ap.add_argument("--modes", default="helper,default,training")
    ap.add_argument("--dp", default="1,2")
    args = ap.parse_args()
    TOOL = args.tool
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="user-exports-")
    data = np.frombuffer(open("/usr/share/common-licenses/GPL-3", "rb").read(),
                         dtype=np.uint8)[:20000] % VOCAB
    data = data.astype(np.uint16)
    data_path = os.path.join(work, "tokens.u16")
    data.tofile(data_path)
    runs = [(dp, zero) for dp in map(int, args.dp.split(","))
            for zero in ((1,) if dp == 1 else (1, 2, 3))]
    passed = failed = 0
    summary = []
    for kind in args.models.split(","):
        reference, ref32 = torch_train(kind, data, torch.float32)
        _, ref64 = torch_train(kind, data, torch.float64)
        for mode in args.modes.split(","):
            case_work = os.path.join(work, f"{kind}-{mode}")
            os.makedirs(case_work)
            onnx_path = os.path.join(case_work, "model.onnx")
            try:
                export(kind, mode, onnx_path)
                export_results = [(True, f"{kind} {mode}-export: exported", "")]
            except Exception as e:  # the helper's check failing is a failure
                export_results = [(False, f"{kind} {mode}-export: export", repr(e)[-2000:])]
            results = export_results
            worst_loss = worst_weight = 0.0
            if export_results[0][0]:
                for dp, zero in runs:
                    try:
                        got, worst = run_case(case_work, kind, mode, dp, zero, onnx_path,
                                              data_path, reference, ref32, ref64)
                    except Exception as e:  # one case's crash must not hide the others
                        got, worst = [(False, f"{kind} {mode} dp {dp} ZeRO-{zero}: crashed",
                                       repr(e))], None
                    results += got
                    if worst:
                        worst_loss = max(worst_loss, worst[0])
                        worst_weight = max(worst_weight, worst[1])
            summary.append(f"figures: {kind} {mode}-export: worst loss diff {worst_loss:.2e}, "
                           f"worst weight diff {worst_weight:.2e}")
            for ok, name, detail in results:
                print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""),
                      flush=True)
                passed += ok
                failed += not ok
    for line in summary:
        print(line)
    print(f"user export tests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
