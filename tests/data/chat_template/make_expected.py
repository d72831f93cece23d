# Makes expected.json: chat templates rendered by Python jinja2 the way
# Hugging Face's apply_chat_template renders them (trim_blocks, lstrip_blocks,
# raise_exception). Run from the repository root:
#   /tmp/refenv/bin/python tests/data/chat_template/make_expected.py
import json, os
import jinja2
from gguf import GGUFReader

MODEL = os.path.expanduser('~/.cache/headway/models/SmolLM2-135M-Instruct.Q4_1.gguf')
smollm2 = GGUFReader(MODEL).fields['tokenizer.chat_template'].contents()

def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)

env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
env.globals['raise_exception'] = raise_exception

FEATURES = """{#- a comment -#}
{%- set ns = namespace(count=0, sys='') -%}
{% for m in messages %}
  {% if m.role == 'system' %}
    {% set ns.sys = m['content'] | trim %}
  {% elif m.role in ['user', 'assistant'] and not (m.content is none) %}
    {% set ns.count = ns.count + 1 %}
{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ 'first' if loop.first else 'not-first' }} {{ loop.last }}: {{ m.role | upper }}={{ m.content ~ '|' ~ m.content | length }}
  {% else %}
    {{- raise_exception('bad role ' + m.role) }}
  {% endif %}
{% endfor %}
sys={{ ns.sys | lower }} count={{ ns.count }} {{ messages[-1]['content'][:3] }} {{ messages[1:] | length }}
{% if tools is defined %}tools{% elif extra is not defined %}no-extra{% else %}extra{% endif %}
{{ bos_token ~ eos_token }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 1 + 2 * 3 - 4 }} {{ 'ab' in 'cabd' }} {{ 'x' not in ['a'] }}
{{ none }} {{ [1, 'a', true] }} {{ {'k': 'v'}['k'] }} {{ missing }}{{ messages | first | string | length > 0 }}
{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% if not loop.last %},{% endif %}{% endfor %}
{% for i in range(3) if i != 1 %}[{{ i }}:{{ loop.index }}]{% else %}empty{% endfor %}
{% for x in [] %}{{ x }}{% else %}else-branch{% endfor %}
  {%+ if true %}kept-indent{% endif +%}
{{ '  padded  '.strip() }}|{{ 'a,b'.split(',') | join('-') }}|{{ 'Hello'.startswith('He') }}|{{ undefined_var | default('dflt') }}
{%- if add_generation_prompt %}
<gen>
{%- endif %}
"""

CASES = [
    ('smollm2_user', smollm2, {'messages': [{'role': 'user', 'content': 'What is the capital of France?'}], 'add_generation_prompt': True}),
    ('smollm2_no_generation_prompt', smollm2, {'messages': [{'role': 'user', 'content': 'Hi'}], 'add_generation_prompt': False}),
    ('smollm2_system', smollm2, {'messages': [{'role': 'system', 'content': 'You are terse.'}, {'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello.'}, {'role': 'user', 'content': 'Bye\nnow'}], 'add_generation_prompt': True}),
    ('smollm2_multi_turn', smollm2, {'messages': [{'role': 'user', 'content': 'One'}, {'role': 'assistant', 'content': 'Two'}, {'role': 'user', 'content': 'Three'}], 'add_generation_prompt': True}),
    ('features', FEATURES, {'messages': [{'role': 'system', 'content': '  Be NICE  '}, {'role': 'user', 'content': 'héllo'}, {'role': 'assistant', 'content': 'world'}], 'add_generation_prompt': True, 'bos_token': '<s>', 'eos_token': '</s>'}),
    ('features_no_prompt', FEATURES, {'messages': [{'role': 'user', 'content': 'x'}], 'add_generation_prompt': False, 'bos_token': '', 'eos_token': '<e>', 'extra': 1}),
]

out = []
for name, source, ctx in CASES:
    out.append({'name': name, 'template': source, 'context': ctx,
                'expected': env.from_string(source).render(**ctx)})
# raise_exception: the message is the error.
try:
    env.from_string(FEATURES).render(messages=[{'role': 'tool', 'content': 'x'}])
except jinja2.exceptions.TemplateError as e:
    out.append({'name': 'features_raise', 'template': FEATURES,
                'context': {'messages': [{'role': 'tool', 'content': 'x'}]}, 'error': str(e)})
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, 'expected.json'), 'w') as f:
    json.dump({'command': '/tmp/refenv/bin/python tests/data/chat_template/make_expected.py',
               'jinja2_version': jinja2.__version__, 'cases': out}, f, indent=1, ensure_ascii=False)
    f.write('\n')
