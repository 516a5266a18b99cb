"""forecast_answer.py: the forecast, and how it is read from what the model writes (docs/PAPER.md §3).

forecast_prompt.py says what the model is shown; this file says how its answer becomes a Forecast:
8 probabilities over the bins of bins.py, a deferral (the abstain variant: the model declined to
forecast, with a reason), or a parse failure with a reason.

    Forecast        the probabilities, the bin that is scored (their argmax), the bin the model
                    stated, the model's reasoning, whether it deferred, and what the forecast cost
    parse_answer    the model's text (harmony markup or plain text) -> Forecast; never raises
    DIGITS, ANSWER_PREFIX   the logits read-out: the answer is forced to begin ANSWER_PREFIX and
                    the next-token probabilities of the bin digits are read

Parsing rules (documented choices where the paper leaves room):
  - where the answer is looked for, in order: the tool call (harmony commentary channel or a
    server's tool_calls, which the server backend writes back as harmony markup); then a JSON
    object in the final channel; then a fenced ```json block or a bare JSON object in plain text.
    With several tool calls the LAST COMPLETE one wins (its arguments parse as a JSON object); a
    trailing call cut off mid-JSON is ignored.
  - a call of `defer_to_evaluator` with a non-empty reason is a deferral: no probabilities, not a
    parse failure; the gate defers it, metrics count it against coverage, the search measures it.
  - required fields: predicted_bin (integer 1..8), the 8 probabilities (numbers in [0, 1], not
    all zero) and a non-empty reasoning string; otherwise a parse failure. The probabilities may
    carry either protocol's field names (forecast_prompt.PROB_FIELDS, p_severe_slowdown ..., or
    the original's PAPER_PROB_FIELDS, p_minor_slowdown ...): the k-th field is bin k in both.
  - probabilities are renormalised to sum 1; raw_sum keeps the sum the model wrote.
  - predicted_bin = argmax of the probabilities (bins.predicted_bin), so the bin that is scored
    and the confidence always come from the same distribution. The model's own predicted_bin is
    kept as stated_bin; Forecast.bin_disagrees records when the two differ.
"""
import json
import math
import re
from dataclasses import asdict, dataclass

import bins
from data.dataset import is_finite_number
from forecast_prompt import DEFER_TOOL_NAME, PAPER_PROB_FIELDS, PROB_FIELDS, TOOL_NAME
from models import harmony

DIGITS = tuple(str(b) for b in bins.BINS)  # the bins as the model writes them, one token each
ANSWER_PREFIX = '{"predicted_bin": '


# ---- the forecast -----------------------------------------------------------------------------------

@dataclass
class Forecast:
    probs: list = None            # 8 floats summing to 1, or None (a parse failure, a deferral)
    parse_failed: bool = False
    deferred: bool = False        # the model declined to forecast (abstain variant); reasoning says why
    parse_error: str = None
    stated_bin: int = None        # the bin the model wrote (None for the logits read-out)
    predicted_bin: int = None     # argmax of probs: the bin that is scored
    raw_sum: float = None         # the probabilities' sum before renormalising
    reasoning: str = ""
    readout: str = "verbalized"
    model: str = None
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    attempts: int = 1             # generations it took (a parse failure can be retried)
    raw: str = ""                 # the answer as the model wrote it (a search's report shows it)

    @property
    def bin_disagrees(self):
        return self.stated_bin is not None and self.predicted_bin is not None and self.stated_bin != self.predicted_bin

    def confidence(self, kind="maxprob"):
        return None if self.probs is None else bins.confidence(self.probs, kind)

    @property
    def expected_bin(self):
        return None if self.probs is None else bins.expected_bin(self.probs)

    @property
    def expected_log2_speedup(self):
        return None if self.probs is None else bins.expected_log2_speedup(self.probs)

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def failure(reason, **kw):
    return Forecast(parse_failed=True, parse_error=reason, **kw)


def from_probs(raw, **kw):
    """A Forecast from 8 raw probabilities, renormalised; None if they are all zero."""
    total = math.fsum(raw)
    if not total > 0:
        return None
    probs = [p / total for p in raw]
    return Forecast(probs=probs, predicted_bin=bins.predicted_bin(probs), raw_sum=total, **kw)


ANSWER_FIELD_SETS = (PROB_FIELDS, PAPER_PROB_FIELDS)
ALL_PROB_FIELDS = tuple(dict.fromkeys(PROB_FIELDS + PAPER_PROB_FIELDS))


def _prob_fields_of(args):
    """The field set the answer uses: the first one it holds completely, else (for the error) the
    one it holds most of."""
    for fields in ANSWER_FIELD_SETS:
        if all(f in args for f in fields):
            return fields
    return max(ANSWER_FIELD_SETS, key=lambda fields: sum(f in args for f in fields))


def forecast_from_args(args):
    """Validate the tool call's arguments (a dict) into a Forecast or a parse failure."""
    if not isinstance(args, dict):
        return failure(f"answer is a JSON {type(args).__name__}, not an object")
    fields = _prob_fields_of(args)
    for f in ("predicted_bin", *fields, "reasoning"):
        if f not in args:
            return failure(f"missing field {f}")
    raw = []
    for f in fields:
        v = args[f]
        if not is_finite_number(v) or not 0 <= v <= 1:
            return failure(f"{f} out of range [0, 1]: {v!r}"[:200])
        raw.append(float(v))
    stated = args["predicted_bin"]
    if not is_finite_number(stated) or stated != int(stated) or not 1 <= stated <= bins.N_BINS:
        return failure(f"predicted_bin must be an integer in 1..{bins.N_BINS}: {stated!r}"[:200])
    reasoning = args["reasoning"]
    if not isinstance(reasoning, str) or not reasoning.strip():
        return failure("empty reasoning")
    f = from_probs(raw, stated_bin=int(stated), reasoning=reasoning.strip())
    return f if f is not None else failure("all probabilities are zero")


def deferral_from_args(args):
    """The deferral tool's arguments: a deferral with its reason, or a parse failure."""
    reason = args.get("reason") if isinstance(args, dict) else None
    if not isinstance(reason, str) or not reason.strip():
        return failure(f"{DEFER_TOOL_NAME} without a reason")
    return Forecast(deferred=True, reasoning=reason.strip())


def _unwrap(obj, tool=TOOL_NAME):
    """(tool, arguments) of an answer object: {"name": TOOL, "arguments": {...}} as written by chat
    models without tool calls is unwrapped; a bare object is the arguments of `tool`."""
    if isinstance(obj, dict) and "arguments" in obj and obj.get("name", tool) in (TOOL_NAME, DEFER_TOOL_NAME):
        args = obj["arguments"]
        if isinstance(args, str):
            try:
                args = _DECODER.decode(args)
            except _BAD_JSON:
                return tool, obj
        return obj.get("name", tool), args
    return tool, obj


def _read(tool, args):
    return deferral_from_args(args) if tool == DEFER_TOOL_NAME else forecast_from_args(args)


_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.S)


def _float_sized_int(s):
    """JSON integers must fit a float (a probability or a bin never needs more): a longer one
    raises OverflowError, which makes its call incomplete rather than the whole answer unparseable."""
    v = int(s)
    float(v)
    return v


_DECODER = json.JSONDecoder(parse_int=_float_sized_int)
# What decoding a model's JSON can raise: malformed text, nesting deeper than the recursion limit,
# an integer too large for a float.
_BAD_JSON = (ValueError, RecursionError, OverflowError)


def _json_candidates(text):
    """JSON objects in text: the fenced blocks if any parse, else every bare {...} object."""
    found = []
    for block in _FENCE.findall(text):
        try:
            found.append(_DECODER.decode(block))
        except _BAD_JSON:
            pass
    if found:
        return found
    pos, tries = text.find("{"), 0
    while pos != -1 and tries < 500:
        tries += 1
        try:
            obj, end = _DECODER.raw_decode(text, pos)
            found.append(obj)
            pos = text.find("{", end)
        except _BAD_JSON:
            pos = text.find("{", pos + 1)
    return found


def _answer_in(text):
    """(tool, arguments) of the last JSON object in text that looks like an answer, or None."""
    found = [_unwrap(o) for o in _json_candidates(text)]
    answers = [(tool, o) for tool, o in found if isinstance(o, dict) and (
        tool == DEFER_TOOL_NAME or "predicted_bin" in o or any(f in o for f in ALL_PROB_FIELDS))]
    return answers[-1] if answers else None


def _parse(text):
    msgs = harmony.messages(text)
    calls = [m for m in msgs if m.recipient and m.recipient.split(".")[-1] in (TOOL_NAME, DEFER_TOOL_NAME)]
    if calls:
        last_error = None
        for call in reversed(calls):  # the last complete call wins
            try:  # complete = its arguments open with a whole JSON value (trailing text is ignored)
                tool, args = _unwrap(_DECODER.raw_decode(call.content.strip())[0], call.recipient.split(".")[-1])
            except _BAD_JSON as e:
                last_error = last_error or f"bad JSON in the {call.recipient.split('.')[-1]} call: {type(e).__name__}: {e}"[:300]
                continue
            return _read(tool, args)
        return failure(last_error)
    finals = [m.content for m in msgs if m.channel == "final"]
    if finals:
        ans = _answer_in(finals[-1])
        return _read(*ans) if ans is not None else failure("no answer: the final channel holds no JSON forecast")
    if msgs:
        if msgs[-1].channel == "analysis" and not msgs[-1].complete:
            return failure("truncated reasoning: the completion ended inside the analysis channel (raise max_new_tokens)")
        return failure(f"no answer: the model never called {TOOL_NAME}")
    if not text.strip():
        return failure("no answer: empty completion")
    ans = _answer_in(text)
    if ans is None:
        return failure("no answer: no tool call and no JSON forecast in the completion")
    return _read(*ans)


def parse_answer(text):
    """The model's answer (harmony markup or plain text) as a Forecast. Never raises."""
    try:
        return _parse(text if isinstance(text, str) else str(text))
    except Exception as e:  # a parser bug must cost one row, not a batch
        return failure(f"unparseable answer: {type(e).__name__}: {e}"[:300])


def parse_completion(c):
    """parse_answer of a backend Completion, carrying its error, token counts and time."""
    f = failure(c.error) if c.error else parse_answer(c.text)
    f.tokens_in, f.tokens_out, f.seconds, f.raw = c.tokens_in, c.tokens_out, c.seconds, c.text or ""
    return f


def reasoning_of(c):
    """The model's reasoning in a completion: its analysis channel, or the text before any JSON."""
    msgs = harmony.messages(c.text)
    if msgs:
        return "\n".join(m.content for m in msgs if m.channel == "analysis").strip()
    return re.split(r"```|\{", c.text, maxsplit=1)[0].strip()
