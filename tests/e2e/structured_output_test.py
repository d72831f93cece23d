#!/usr/bin/env python3
"""Structured output through the OpenAI Python client against a real deployment.

    structured_output_test.py --launch BIN --bin-dir DIR [--venv DIR] [--model-dir DIR]

Samples 200 chat answers at temperature 1 under 12 JSON schemas (nested
objects, enums, arrays, ranges, formats, anyOf, $ref) and checks that every
one parses and validates against its schema with the PyPI `jsonschema`
package (an implementation independent of Headway's). Then guided_choice,
guided_regex (checked with Python's re), json_object, a streamed schema
answer, and the 400s for a schema keyword, a regex construct and a grammar
that Headway does not implement.

Exit status 0 when every check passes, 1 on a failure, 77 (skipped) when a
package or the model is missing; HEADWAY_REQUIRE_MODEL=1 fails instead.
"""
import concurrent.futures
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deployment  # noqa: E402
from deployment import SERVED_NAME, Checks  # noqa: E402

NAME = {"type": "string", "minLength": 1, "maxLength": 20}

# (what to ask for, schema). Every string is bounded so that an answer ends
# well inside max_tokens.
SCHEMAS = [
    ("a person", {"type": "object", "properties": {
        "name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"]}),
    ("a colour", {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "shade": {"type": "string", "enum": ["light", "dark"]}},
        "required": ["color", "shade"]}),
    ("an address book entry", {"type": "object", "properties": {
        "name": NAME,
        "address": {"type": "object", "properties": {
            "street": {"type": "string", "maxLength": 30}, "city": NAME,
            "zip": {"type": "string", "minLength": 5, "maxLength": 5}},
            "required": ["street", "city", "zip"]}},
        "required": ["name", "address"]}),
    ("tags for a blog post", {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                 "minItems": 1, "maxItems": 4}},
        "required": ["tags"]}),
    ("a product price", {"type": "object", "properties": {
        "price": {"type": "number", "minimum": 0, "maximum": 1000},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["price", "quantity"]}),
    ("an account status", {"type": "object", "properties": {
        "active": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 15}},
        "required": ["active", "note"]}),
    ("a config version", {"type": "object", "properties": {
        "version": {"const": 2}, "level": {"enum": [1, 2, 3]}},
        "required": ["version", "level"]}),
    ("an order", {"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 999},
                "label": {"enum": ["a", "b"]}},
            "required": ["id", "label"]}}},
        "required": ["items"]}),
    ("a value", {"type": "object", "properties": {
        "value": {"anyOf": [{"type": "integer", "minimum": -50, "maximum": 50},
                            {"type": "string", "maxLength": 8}]}},
        "required": ["value"]}),
    ("a line segment", {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -100, "maximum": 100},
        "y": {"type": "integer", "minimum": -100, "maximum": 100}},
        "required": ["x", "y"]}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"]}),
    ("an event", {"type": "object", "properties": {
        "date": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"}},
        "required": ["date", "id"]}),
    ("a setting", {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 9},
        "b": {"type": "string", "maxLength": 5}, "c": {"type": "boolean"}},
        "required": ["a"], "additionalProperties": False}),
]
SAMPLES = 200


def schema_answers(client, what, schema, n):
    r = client.chat.completions.create(
        model=SERVED_NAME, n=n, temperature=1.0, max_tokens=200,
        messages=[{"role": "user", "content": "Reply with JSON for %s." % what}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    return [(c.message.content, c.finish_reason) for c in r.choices]


def check_schemas(checks, client, jsonschema):
    # Requests of n = 5, eight at a time: the batch the scheduler runs.
    jobs = []
    for i in range(SAMPLES // 5):
        what, schema = SCHEMAS[i % len(SCHEMAS)]
        jobs.append((what, schema))
    valid, failures = 0, []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = [(schema, pool.submit(schema_answers, client, what, schema, 5))
                   for what, schema in jobs]
        for schema, future in futures:
            for text, finish in future.result():
                try:
                    jsonschema.validate(json.loads(text), schema)
                    valid += 1 if finish == "stop" else 0
                    if finish != "stop":
                        failures.append("finish_reason %s: %r" % (finish, text))
                except (ValueError, jsonschema.ValidationError) as e:
                    failures.append("%r: %s" % (text, str(e).splitlines()[0]))
    for f in failures[:5]:
        print("      " + f)
    checks.expect(valid == SAMPLES, "%d of %d schema answers at temperature 1 parse and validate "
                  "(%d schemas)" % (valid, SAMPLES, len(SCHEMAS)))


def check_other_forms(checks, client, openai):
    messages = [{"role": "user", "content": "Is the sky blue?"}]
    choices = ["yes", "no", "not sure"]
    r = client.chat.completions.create(model=SERVED_NAME, messages=messages, n=4,
                                       temperature=1.0, max_tokens=10,
                                       extra_body={"guided_choice": choices})
    got = [c.message.content for c in r.choices]
    checks.expect(all(g in choices for g in got), "guided_choice answers %s" % got)

    regex = r"\d{3}-[A-Z]{2}(-[a-z]+)?"
    r = client.completions.create(model=SERVED_NAME, prompt="A ticket code:", n=4,
                                  temperature=1.0, max_tokens=20,
                                  extra_body={"guided_regex": regex})
    got = [c.text for c in r.choices]
    checks.expect(all(re.fullmatch(regex, g) for g in got), "guided_regex answers %s" % got)

    r = client.completions.create(model=SERVED_NAME, prompt="The colour of the sky:", n=2,
                                  temperature=1.0, max_tokens=8,
                                  extra_body={"structured_outputs": {"choice": ["blue", "grey"]}})
    got = [c.text for c in r.choices]
    checks.expect(all(g in ("blue", "grey") for g in got), "structured_outputs.choice %s" % got)

    r = client.chat.completions.create(
        model=SERVED_NAME, temperature=0, max_tokens=120,
        messages=[{"role": "user", "content": "Describe a cat as JSON."}],
        response_format={"type": "json_object"})
    text = r.choices[0].message.content
    try:
        ok = isinstance(json.loads(text), dict) or r.choices[0].finish_reason == "length"
    except ValueError:
        ok = r.choices[0].finish_reason == "length"
    checks.expect(ok, "json_object answer is an object (or cut by max_tokens): %r" % text)

    schema = SCHEMAS[0][1]
    stream = client.chat.completions.create(
        model=SERVED_NAME, temperature=0, max_tokens=60, stream=True,
        messages=[{"role": "user", "content": "A person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    plain = client.chat.completions.create(
        model=SERVED_NAME, temperature=0, max_tokens=60,
        messages=[{"role": "user", "content": "A person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    checks.expect(streamed == plain.choices[0].message.content and json.loads(streamed),
                  "a streamed schema answer equals the plain one: %r" % streamed)

    def refused(words, **kwargs):
        try:
            client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=4,
                                           **kwargs)
        except openai.BadRequestError as e:
            checks.expect(all(w in str(e) for w in words), "400 naming %s: %s" % (words, e))
            return
        checks.expect(False, "400 naming %s expected, the call succeeded" % words)

    refused(["oneOf"], response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"oneOf": [{"type": "integer"}, {"type": "string"}]}}})
    refused(["lookaround"], extra_body={"guided_regex": "a(?=b)"})
    refused(["guided_grammar"], extra_body={"guided_grammar": "root ::= \"a\""})
    refused(["only one kind"], extra_body={"guided_regex": "a", "guided_choice": ["a"]})
    refused(["min_tokens"], extra_body={"guided_choice": ["a"], "min_tokens": 2})


def run(modules, base_url):
    checks = Checks()
    openai = modules["openai"]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0,
                           timeout=300)
    check_schemas(checks, client, modules["jsonschema"])
    check_other_forms(checks, client, openai)
    return checks.failures


if __name__ == "__main__":
    sys.exit(deployment.main(["openai", "jsonschema"], run, "headway-structured-"))
