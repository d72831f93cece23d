#!/usr/bin/env python3
"""The OpenAI Python client (PyPI `openai`) against a real Headway deployment.

    openai_client_test.py --launch BIN --bin-dir DIR [--venv DIR] [--model-dir DIR]

Starts `headway-launch` on a one-worker SmolLM2 config with ports the OS
says are free, then drives it the way users do: the client's completions,
chat completions (plain and streamed), n, seeds, logprobs, and the errors it
raises for a bad model, an unknown field and a field Headway does not
implement. The launcher (and with it the coordinator and worker) is stopped
on every path.

Exit status 0 when every check passes, 1 on a failure, 77 (skipped, for
ctest) when the `openai` package or the model is missing; with
HEADWAY_REQUIRE_MODEL=1 a missing model or package fails instead.
deploy/setup.sh installs the package into the virtual environment given by
--venv, which this script re-executes itself in.
"""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deployment  # noqa: E402
from deployment import SERVED_NAME, Checks  # noqa: E402


def expect_error(checks, openai, error_type, status, words, call):
    try:
        call()
    except error_type as e:
        message = str(e)
        checks.expect(e.status_code == status and all(w in message for w in words),
                      "%s %d mentioning %s (got %d: %s)"
                      % (error_type.__name__, status, words, e.status_code, message[:200]))
        return
    except openai.APIError as e:
        checks.expect(False, "%s expected, got %r" % (error_type.__name__, e))
        return
    checks.expect(False, "%s expected, the call succeeded" % error_type.__name__)


def check_echo(checks, client, base_url):
    """echo with logprobs, and vLLM's prompt_logprobs: each prompt token's logprob
    equals the one it gets as the next token of its own prefix, requested alone
    (allowed_token_ids makes it the sampled token; logprobs are the raw ones)."""
    text = ("In the beginning the engine read every token of the prompt once, and the "
            "logits of each position scored the token after it, ") * 16
    req = urllib.request.Request(base_url + "/tokenize", json.dumps({"prompt": text}).encode(),
                                 {"Content-Type": "application/json"})
    ids = json.load(urllib.request.urlopen(req, timeout=60))["tokens"]
    echoed = client.completions.create(model=SERVED_NAME, prompt=ids, max_tokens=1,
                                       temperature=0, echo=True, logprobs=1,
                                       extra_body={"prompt_logprobs": 2})
    ch = echoed.choices[0]
    lp = ch.logprobs
    # 341 prompt rows a step for SmolLM2's vocabulary (common/step_limits.h).
    checks.expect(len(ids) > 341, "the prompt spans more than one step of prompt rows")
    checks.expect(len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None
                  and lp.top_logprobs[0] is None
                  and all(v is not None and v <= 0 for v in lp.token_logprobs[1:]),
                  "echo logprobs: prompt then the generated token, the first null")
    prompt_lp = (ch.model_extra or {}).get("prompt_logprobs")
    checks.expect(prompt_lp is not None and len(prompt_lp) == len(ids) and prompt_lp[0] is None,
                  "prompt_logprobs has one entry per prompt token, the first null")
    worst = 0.0
    positions = list(range(1, len(ids), 23)) + [340, 341, 342, len(ids) - 1]
    for i in [p for p in positions if p < len(ids)]:
        alone = client.completions.create(model=SERVED_NAME, prompt=ids[:i], max_tokens=1,
                                          temperature=0, logprobs=0,
                                          extra_body={"allowed_token_ids": [ids[i]]})
        want = alone.choices[0].logprobs.token_logprobs[0]
        worst = max(worst, abs(want - lp.token_logprobs[i]))
        if prompt_lp is not None:
            worst = max(worst, abs(prompt_lp[i][str(ids[i])]["logprob"] - want))
    checks.expect(worst <= 1e-4, "echo logprobs equal the prefixes' own (worst diff %g)" % worst)
    scored = client.completions.create(model=SERVED_NAME, prompt=ids, max_tokens=0,
                                       temperature=0, echo=True, logprobs=1)
    checks.expect(scored.choices[0].logprobs.token_logprobs == lp.token_logprobs[:len(ids)]
                  and scored.usage.completion_tokens == 0
                  and scored.choices[0].finish_reason == "length",
                  "max_tokens 0 with echo scores the prompt alone")
    again = client.completions.create(model=SERVED_NAME, prompt=ids, max_tokens=1,
                                      temperature=0, echo=True, logprobs=1)
    checks.expect(again.choices[0].logprobs.token_logprobs == lp.token_logprobs,
                  "a cached prompt gives the same echo logprobs")
    plain = client.completions.create(model=SERVED_NAME, prompt=text, max_tokens=2,
                                      temperature=0, echo=True, n=2)
    checks.expect(all(c.text.startswith(text) and len(c.text) > len(text)
                      for c in plain.choices),
                  "echo prepends the prompt to every choice")
    streamed = client.completions.create(model=SERVED_NAME, prompt=text, max_tokens=2,
                                         temperature=0, echo=True, stream=True)
    pieces = "".join(c.choices[0].text for c in streamed if c.choices)
    checks.expect(pieces == plain.choices[0].text, "streamed echo equals the plain one")


def check_sampling_fields(checks, client, base_url):
    """Sampling and stop fields through the client, each checked against what
    greedy decoding of the same prompt gives. (The penalties' formulas are
    checked on logits by the C++ tests: the logprobs returned are the raw
    ones.)"""
    prompt = "The capital of France is Paris. The capital of Italy is"
    def complete(**kw):
        args = dict(model=SERVED_NAME, prompt=prompt, max_tokens=6, temperature=0)
        args.update(kw)
        return client.completions.create(**args).choices[0]
    greedy = complete(logprobs=1)
    first_text = greedy.logprobs.tokens[0]
    req = urllib.request.Request(base_url + "/tokenize",
                                 json.dumps({"prompt": prompt + first_text}).encode(),
                                 {"Content-Type": "application/json"})
    first_id = json.load(urllib.request.urlopen(req, timeout=60))["tokens"][-1]

    checks.expect(complete(temperature=1.0, seed=3, extra_body={"top_k": 1}).text == greedy.text,
                  "top_k 1 samples the greedy text")
    checks.expect(complete(temperature=1.0, seed=3, extra_body={"min_p": 1.0}).text
                  == greedy.text, "min_p 1 keeps only the most likely token")
    checks.expect(complete(temperature=1.0, seed=3, top_p=1e-6).text == greedy.text,
                  "a tiny top_p keeps only the most likely token")
    biased = complete(logit_bias={str(first_id): -100}, logprobs=1)
    checks.expect(biased.logprobs.tokens[0] != first_text, "logit_bias -100 bans the first token")
    stopped = complete(extra_body={"stop_token_ids": [first_id]})
    checks.expect(stopped.text == "" and stopped.finish_reason == "stop",
                  "stop_token_ids ends at that token (%r)" % stopped.text)
    late = complete(extra_body={"stop_token_ids": [first_id], "min_tokens": 2})
    checks.expect(late.finish_reason in ("stop", "length") and late.text != "",
                  "min_tokens holds the stop token back (%r)" % late.text)
    cut = complete(stop=[greedy.text[2:4]]) if len(greedy.text) >= 4 else None
    checks.expect(cut is None or (cut.finish_reason == "stop" and greedy.text.startswith(cut.text)
                                  and len(cut.text) <= 2),
                  "stop cuts the text before the stop string")
    bad = complete(extra_body={"bad_words": [first_text.strip()]}, logprobs=1)
    checks.expect(bad.logprobs.tokens[0] != first_text, "bad_words bans the first word")
    long = complete(max_tokens=12, extra_body={"ignore_eos": True})
    checks.expect(long.finish_reason == "length", "ignore_eos runs to max_tokens")
    chat = client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "Count to five."}],
        max_completion_tokens=5, temperature=0, logprobs=True, top_logprobs=3, user="u1")
    checks.expect(chat.usage.completion_tokens == 5
                  and all(len(c.top_logprobs) == 3 for c in chat.choices[0].logprobs.content),
                  "chat: max_completion_tokens, logprobs and top_logprobs")


def run_checks(openai, base_url):
    checks = Checks()
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0,
                           timeout=120)

    models = [m.id for m in client.models.list()]
    checks.expect(SERVED_NAME in models, "models.list() has %s (got %s)" % (SERVED_NAME, models))

    c = client.completions.create(model=SERVED_NAME, prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    checks.expect(len(c.choices) == 1 and c.choices[0].text.strip() != "",
                  "completion text %r" % c.choices[0].text)
    checks.expect(c.choices[0].finish_reason == "length", "finish_reason length")
    checks.expect(c.usage.completion_tokens == 8 and c.usage.prompt_tokens > 0,
                  "usage %s" % c.usage)
    again = client.completions.create(model=SERVED_NAME, prompt="The capital of France is",
                                      max_tokens=8, temperature=0)
    checks.expect(again.choices[0].text == c.choices[0].text, "greedy repeats itself")

    seeded = client.completions.create(model=SERVED_NAME, prompt="Once upon a time",
                                       max_tokens=6, temperature=0.9, seed=7, n=2, logprobs=2)
    checks.expect(sorted(ch.index for ch in seeded.choices) == [0, 1], "n=2 gives choices 0, 1")
    for ch in seeded.choices:
        lp = ch.logprobs
        checks.expect(lp is not None and len(lp.tokens) == 6 and len(lp.token_logprobs) == 6
                      and all(len(t) in (2, 3) and tok in t
                              for tok, t in zip(lp.tokens, lp.top_logprobs))
                      and all(v <= 0 for v in lp.token_logprobs),
                      "choice %d: 6 tokens with logprobs; 2 top logprobs each, and the token"
                      % ch.index)
    repeat = client.completions.create(model=SERVED_NAME, prompt="Once upon a time",
                                       max_tokens=6, temperature=0.9, seed=7, n=2)
    checks.expect([ch.text for ch in repeat.choices] == [ch.text for ch in seeded.choices],
                  "the same seed gives the same choices")

    check_echo(checks, client, base_url)
    check_sampling_fields(checks, client, base_url)

    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Name a primary colour."}]
    chat = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=16,
                                          temperature=0)
    content = chat.choices[0].message.content
    checks.expect(chat.choices[0].message.role == "assistant" and content,
                  "chat answer %r" % content)
    scored = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=16,
                                            temperature=0, extra_body={"prompt_logprobs": 0})
    chat_lp = (scored.model_extra or {}).get("prompt_logprobs")
    checks.expect(chat_lp is not None and len(chat_lp) == scored.usage.prompt_tokens
                  and chat_lp[0] is None and all(len(p) == 1 for p in chat_lp[1:])
                  and scored.choices[0].message.content == content,
                  "chat prompt_logprobs: one per templated prompt token, the answer unchanged")
    # vLLM's chat echo: an answer after an assistant message (no generation
    # prompt) starts with it; the template closes that message, so what
    # follows may well be nothing.
    partial = messages + [{"role": "assistant", "content": "The primary colours are"}]
    echo_extra = {"echo": True, "add_generation_prompt": False}
    echoed_chat = client.chat.completions.create(model=SERVED_NAME, messages=partial,
                                                 max_tokens=4, temperature=0,
                                                 extra_body=echo_extra)
    echoed_content = echoed_chat.choices[0].message.content
    streamed_chat = client.chat.completions.create(model=SERVED_NAME, messages=partial,
                                                   max_tokens=4, temperature=0, stream=True,
                                                   extra_body=echo_extra)
    streamed_content = "".join(c.choices[0].delta.content or "" for c in streamed_chat
                               if c.choices)
    checks.expect(echoed_content.startswith("The primary colours are")
                  and streamed_content == echoed_content,
                  "chat echo starts with the last message, streamed too (%r)"
                  % echoed_content)
    stream = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    checks.expect("".join(pieces) == content, "streamed chat equals the plain one (%r)"
                  % "".join(pieces))
    checks.expect(finish == chat.choices[0].finish_reason, "stream finish_reason %s" % finish)
    checks.expect(usage is not None and usage.completion_tokens == chat.usage.completion_tokens,
                  "stream usage %s" % usage)

    expect_error(checks, openai, openai.NotFoundError, 404, ["no-such-model"],
                 lambda: client.completions.create(model="no-such-model", prompt="x",
                                                   max_tokens=1))
    expect_error(checks, openai, openai.BadRequestError, 400,
                 ["Unrecognized request argument supplied: temprature"],
                 lambda: client.completions.create(model=SERVED_NAME, prompt="x", max_tokens=1,
                                                   extra_body={"temprature": 0.5}))
    expect_error(checks, openai, openai.BadRequestError, 400, ["guided_grammar"],
                 lambda: client.chat.completions.create(
                     model=SERVED_NAME, messages=messages, max_tokens=1,
                     extra_body={"guided_grammar": "root ::= \"a\""}))
    expect_error(checks, openai, openai.BadRequestError, 400, ["max_tokens"],
                 lambda: client.completions.create(model=SERVED_NAME, prompt="x",
                                                   max_tokens=-1))
    return checks.failures


if __name__ == "__main__":
    sys.exit(deployment.main(["openai"], lambda m, url: run_checks(m["openai"], url),
                             "headway-openai-"))
