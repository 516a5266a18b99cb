"""Tests of harmony.py: GPT-OSS's harmony format with the real o200k vocabulary."""
import hashlib
import json

from test_forecast_answer import TOOL, args
from test_forecast_prompt import A100, CAND, REF
from tiny_models import O200K_SHA256

from forecast_answer import parse_answer
from forecast_prompt import FORECAST_TOOL, TOOL_NAME, build_messages


def test_o200k_vocabulary_is_the_official_file(o200k):
    """The o200k fixture (conftest.py) rebuilt the vocabulary from quicktok-v1, as the official one."""
    data = (o200k / "o200k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_SHA256
    assert data.count(b"\n") == 199998


def test_harmony_render_and_parse_round_trip(o200k):
    from openai_harmony import Message, RenderOptions, Role

    from models import harmony
    enc = harmony.encoding()
    messages = build_messages("cross_entropy", REF, CAND, A100)
    prompt = enc.decode(harmony.render(messages, [FORECAST_TOOL], "high"))
    assert prompt.startswith("<|start|>system<|message|>") and "Reasoning: high" in prompt
    assert "<|start|>developer<|message|># Instructions" in prompt and f"type {TOOL_NAME} =" in prompt
    assert "GPU execution simulator" in prompt and CAND.strip() in prompt
    assert prompt.endswith("<|start|>assistant")
    # the assistant's answer, rendered by harmony itself, decoded and parsed back
    answer = [Message.from_role_and_content(Role.ASSISTANT, "Two passes become one.").with_channel("analysis"),
              Message.from_role_and_content(Role.ASSISTANT, json.dumps(args(stated=6)))
              .with_channel("commentary").with_recipient(TOOL).with_content_type("<|constrain|>json")]
    tokens = [t for m in answer for t in enc.render(m, RenderOptions(conversation_has_function_tools=True))]
    tokens = tokens[2:]  # a completion starts after the prompt's "<|start|>assistant"
    assert tokens[-1] in enc.stop_tokens_for_assistant_actions()
    f = parse_answer(enc.decode(tokens))
    assert not f.parse_failed and f.stated_bin == 6 and f.predicted_bin == 5
    channels = harmony.messages(enc.decode(tokens))  # the one parser reads what harmony rendered
    assert [c.channel for c in channels] == ["analysis", "commentary"] and all(c.complete for c in channels)
    assert channels[1].recipient == TOOL and json.loads(channels[1].content)["predicted_bin"] == 6
