"""A loopback OpenAI-compatible server for tests: the stand-in for `vllm serve openai/gpt-oss-20b`.

    with FakeOpenAIServer(replies=[error(500), tool_call(args)]) as server:
        backend = OpenAIServerBackend(server.url, ...)

It answers POST {url}/chat/completions, {url}/completions (token-id prompts, vLLM's extensions)
and {url}/load_lora_adapter, and GET {url}/models (`models`: vLLM's entries, a LoRA adapter's with
its base model in `parent`). Each request takes the next scripted reply; when the script is empty,
`default(request)` answers (by default a forecast tool call, top_logprobs when the request asks for
logprobs, the digits' log-probs by id for a completions request with logprob_token_ids, two
tokens per sample for other completions requests, with their log-probs when it asks). Every
request body is recorded in `server.requests`, its path in `server.paths`. The replies' shapes
are what vLLM 0.32 returned (checked by the vllm tier): the reasoning in `reasoning`, a
completions choice's `token_ids`, top_logprobs keyed "token_id:N" under return_tokens_as_token_ids.
The server is
bounded: it binds 127.0.0.1 on a free port, serves from one daemon thread, drops idle sockets after
a few seconds, and stops on leaving the `with` block.
"""
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The original's field names (p_minor_slowdown ...), which the parser reads as well as ours.
DEFAULT_ARGS = {"predicted_bin": 5, "p_severe_slowdown": 0.0, "p_significant_slowdown": 0.0,
                "p_moderate_slowdown": 0.05, "p_minor_slowdown": 0.15, "p_minor_speedup": 0.5,
                "p_significant_speedup": 0.2, "p_high_speedup": 0.1, "p_extreme_speedup": 0.0,
                "reasoning": "The candidate fuses two passes into one."}


def _usage(prompt=100, completion=20):
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def tool_call(args=None, reasoning="Compare the memory traffic of both kernels.", name="submit_kernel_runtime_estimate"):
    """A reply whose message calls the tool with `args` (a dict, or a raw string)."""
    args = DEFAULT_ARGS if args is None else args
    arguments = args if isinstance(args, str) else json.dumps(args)
    message = {"role": "assistant", "content": None, "reasoning": reasoning,
               "tool_calls": [{"id": "call_0", "type": "function",
                               "function": {"name": name, "arguments": arguments}}]}
    return 200, _completion(message, "tool_calls")


def final_text(text, reasoning=None):
    """A reply with plain content (the model answered in its final channel)."""
    return 200, _completion({"role": "assistant", "content": text, "reasoning": reasoning}, "stop")


def logprobs(probs_by_token):
    """A one-token reply whose top_logprobs hold `probs_by_token` ({"3": 0.5, ...})."""
    top = [{"token": t, "logprob": math.log(p), "bytes": list(t.encode())} for t, p in probs_by_token.items()]
    best = max(top, key=lambda x: x["logprob"])
    body = _completion({"role": "assistant", "content": best["token"]}, "length")
    body["choices"][0]["logprobs"] = {"content": [{**best, "top_logprobs": top}]}
    return 200, body


def text_completion(samples):
    """A completions-endpoint reply (vLLM's extensions included): one choice per sample, each a
    dict with token_ids, text, and optionally finish_reason ("stop"), stop_reason (a token id) and
    token_logprobs (the sampler's log-prob of each token, returned in the OpenAI logprobs object
    that a request with logprobs=k gets; no tokens' text, no top_logprobs)."""
    def logprob_object(s):
        if s.get("token_logprobs") is None:
            return None
        n = len(s["token_logprobs"])
        return {"tokens": [""] * n, "token_logprobs": list(s["token_logprobs"]), "top_logprobs": None,
                "text_offset": list(range(n))}
    choices = [{"index": i, "text": s.get("text", ""), "token_ids": s.get("token_ids"), "logprobs": logprob_object(s),
                "finish_reason": s.get("finish_reason", "stop"), "stop_reason": s.get("stop_reason")}
               for i, s in enumerate(samples)]
    return 200, {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake",
                 "choices": choices, "usage": _usage()}


def token_logprobs(logprob_by_id, sampled=None):
    """A completions reply to a read-out request (max_tokens 1, logprob_token_ids, return_tokens_as_token_ids):
    top_logprobs keyed "token_id:N" for the asked ids ({id: log-prob}), the sampled token's beside them."""
    sampled = max(logprob_by_id, key=logprob_by_id.get) if sampled is None else sampled
    top = {f"token_id:{i}": lp for i, lp in logprob_by_id.items()}
    top.setdefault(f"token_id:{sampled}", -1.0)
    logprobs = {"tokens": [f"token_id:{sampled}"], "token_logprobs": [top[f"token_id:{sampled}"]],
                "top_logprobs": [top], "text_offset": [0]}
    choice = {"index": 0, "text": "", "token_ids": None, "logprobs": logprobs, "finish_reason": "length",
              "stop_reason": None}
    return 200, {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake",
                 "choices": [choice], "usage": _usage(len(logprob_by_id), 1)}


def error(status, message="injected failure"):
    return status, {"error": {"message": message, "type": "server_error", "code": status}}


def _completion(message, finish_reason):
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": _usage()}


def default_reply(request):
    if request.get("logprob_token_ids"):  # the digits' log-probs (uniform) after a token-id prompt
        return token_logprobs({i: math.log(1 / 8) for i in request["logprob_token_ids"]})
    if "prompt" in request:  # the completions endpoint: n samples of a token-id prompt
        # two tokens; with room for more and stop ids, the first stop id ends the sample, kept in
        # token_ids with its log-prob and named in stop_reason, as vLLM does
        stop = (request.get("stop_token_ids") or [None])[0]
        ends = stop is not None and request.get("max_tokens", 16) > 2
        ids, lps = [1, 2] + [stop] * ends, [-0.5, -1.5] + [-0.1] * ends
        sample = {"token_ids": ids, "text": "ab", "finish_reason": "stop" if ends else "length",
                  "stop_reason": stop if ends else None,
                  "token_logprobs": lps if request.get("logprobs") is not None else None}
        return text_completion([sample] * request.get("n", 1))
    if request.get("logprobs"):
        return logprobs({"5": 0.4, "4": 0.3, "6": 0.2, " 5": 0.05})
    return tool_call()


ROUTES = ("/chat/completions", "/completions", "/load_lora_adapter")


MODELS = [{"id": "openai/gpt-oss-20b", "object": "model", "root": "openai/gpt-oss-20b", "parent": None}]


class FakeOpenAIServer:
    def __init__(self, replies=(), default=default_reply, models=MODELS):
        self.replies = list(replies)
        self.models = list(models)
        self.default = default
        self.requests = []
        self.paths = []  # the path of each request, beside its body in `requests`
        self._lock = threading.Lock()

    def _next(self, request, path):
        with self._lock:
            self.requests.append(request)
            self.paths.append(path)
            if self.replies:
                return self.replies.pop(0)
        return self.default(request)

    def __enter__(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 5  # an idle client cannot hold the thread

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": fake.models})
                else:
                    self._send(*error(404, f"no route {self.path}"))

            def _send(self, status, reply):
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
                try:
                    request = json.loads(body or b"{}")
                except ValueError:
                    request = {}
                if not self.path.rstrip("/").endswith(ROUTES):
                    status, reply = error(404, f"no route {self.path}")
                else:
                    status, reply = fake._next(request, self.path)
                self._send(status, reply)

            def log_message(self, *args):  # keep test output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        host, port = self._server.server_address
        self.url = f"http://{host}:{port}/v1"
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
