"""harmony.py: GPT-OSS's chat format, written and read in one place.

GPT-OSS is trained on "harmony" (openai-harmony): reasoning effort in the system message, the
instructions and tools in the developer message, and an answer made of messages on channels:

    <|channel|>analysis<|message|>...reasoning...<|end|>
    <|start|>assistant to=functions.NAME<|channel|>commentary <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>...<|return|>

A local GPT-OSS writes this markup itself; a server's structured reply (reasoning, tool calls,
content) is written back into it (markup), so that one parser (messages) reads every backend.

    encoding()        the harmony encoding, offline: the o200k vocabulary can be rebuilt from the
                      quicktok-v1 package (write_o200k_vocab) on machines without internet
    render()          a conversation as prompt token ids, ending with `<|start|>assistant`; the
                      system message carries `Current date: START_DATE`, fixed, as a server started
                      with VLLM_SYSTEM_START_DATE=START_DATE renders it (vLLM always writes a date:
                      today's unless pinned), so a prompt is the same tokens every day and on
                      either side
    answer_start()    the text that opens the assistant's answer after its reasoning (the logits
                      read-out and the votes format force an answer this way)
    answer_prompt()   render() + answer_start() + the answer's first characters, as token ids
    markup()          one assistant message as text
    messages()        the assistant messages of a text: the one harmony parser
"""
import base64
import functools
import hashlib
import importlib.util
import os
import re
from collections import namedtuple
from pathlib import Path

from data.records import cache_dir, write_atomic

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_N_RANKS = 199998  # ordinary (non-special) tokens of o200k_base
MIN_VOCAB = 200_019     # a GPT-OSS config with fewer rows cannot hold the harmony special tokens
# The conversation date in every system message (GPT-OSS's release); serve with
# VLLM_SYSTEM_START_DATE=2025-08-05 so that the server writes the same.
START_DATE = "2025-08-05"


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
def encoding():
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


def is_harmony_model(config):
    """GPT-OSS with the full harmony vocabulary (a tiny test model with 512 rows is not)."""
    return getattr(config, "model_type", "") == "gpt_oss" and config.vocab_size >= MIN_VOCAB


def render(messages, tools, reasoning_effort):
    """Token ids of a conversation in harmony format, ending with `<|start|>assistant`."""
    from openai_harmony import Conversation, DeveloperContent, Message, ReasoningEffort, Role, SystemContent, ToolDescription
    effort = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM,
              "high": ReasoningEffort.HIGH}[reasoning_effort]
    system = SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(START_DATE)
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
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
    return encoding().render_conversation_for_completion(Conversation.from_messages(out), Role.ASSISTANT)


def answer_start(reasoning, tool=None):
    """What follows a rendered prompt's `<|start|>assistant` up to the answer's first character:
    the reasoning as a closed analysis message (if any), then the tool call's header (or the final
    channel's when there is no tool)."""
    text = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning else ""
    return text + (f" to=functions.{tool}<|channel|>commentary <|constrain|>json<|message|>" if tool
                   else "<|channel|>final<|message|>")


def answer_prompt(messages, reasoning, answer_prefix, tools, reasoning_effort):
    """Token ids of a prompt that ends inside the answer: the rendered conversation, the reasoning
    (if any) and the answer's opening (answer_start), then `answer_prefix`. What the logits
    read-out scores the next token after, locally and through a server's completions endpoint."""
    tool = tools[0]["function"]["name"] if tools else None
    text = answer_start(reasoning, tool) + answer_prefix
    return render(messages, tools, reasoning_effort) + encoding().encode(text, allowed_special="all")


def markup(channel, content, recipient=None, end="<|end|>"):
    """One assistant message in harmony markup (how a server's structured answer is written back
    into a completion's text, so that one parser reads every backend)."""
    to = f" to={recipient}" if recipient else ""
    ctype = " <|constrain|>json" if recipient else ""
    return f"<|start|>assistant{to}<|channel|>{channel}{ctype}<|message|>{content}{end}"


Message = namedtuple("Message", "channel recipient content complete")


def messages(text):
    """The assistant messages of harmony markup, in order; [] for plain text. `complete` is False
    for a message cut off before its end token (a completion that ran out of tokens)."""
    if "<|message|>" not in text:
        return []
    out = []
    for part in text.split("<|start|>"):
        if "<|message|>" not in part:
            continue
        header, body = part.split("<|message|>", 1)
        channel = re.search(r"<\|channel\|>\s*(\w+)", header)
        recipient = re.search(r"to=([\w.\-]+)", header)
        end = re.search(r"<\|(?:end|call|return)\|>", body)
        out.append(Message(channel.group(1) if channel else None, recipient.group(1) if recipient else None,
                           body[:end.start()] if end else body, end is not None))
    return out
