# Writes gemma3-270m.json: llama.cpp's token ids for Gemma 3 270M's vocabulary.
# Run: /tmp/lcpenv/bin/python tests/data/tokenizer/gemma3-270m-make.py \
#        ~/.cache/headway/models/gemma-3-270m-q4_k_m.gguf tests/data/tokenizer/gemma3-270m.json
# (llama-cpp-python 0.3.36, llama.cpp built from its vendored source).
import json
import sys

import llama_cpp

COMMAND = ("Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=False, "
           "special=special) with llama-cpp-python " + llama_cpp.__version__ +
           "; made by tests/data/tokenizer/gemma3-270m-make.py")

CASES = [
    ("Hello, world! This is a test of the Gemma tokenizer.", False),
    (" leading space", False),
    ("trailing space ", False),
    ("multiple   spaces   here  ", False),
    ("   ", False),
    ("line one\nline two\n\nline four\n", False),
    ("windows\r\nline\rends", False),
    ("tabs\tand\t\ttabs", False),
    ("Numbers: 1234567890 3.14159 -42 1,000,000", False),
    ("Punctuation!?... (parens) [brackets] {braces} \"quotes\" 'single' \u2014 em-dash", False),
    ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n", False),
    ("Caf\u00e9 na\u00efve fa\u00e7ade \u00c5ngstr\u00f6m cr\u00e8me br\u00fbl\u00e9e", False),
    ("\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\u6587\u672c\uff0c"
     "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", False),
    ("I love \U0001F999 llamas \U0001F389\U0001F389 \U0001F468\u200d\U0001F469\u200d\U0001F467", False),
    ("rare: \x01\x02 \ua66e \U00013000 \U0001D518", False),
    ("<table><tr><td>cell</td></tr></table>", False),
    ("<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n", True),
    ("<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n", False),
    ("<eos> and <bos> and <unk> and <unused0>", True),
    ("<eos> and <bos> and <unk> and <unused0>", False),
    ("", False),
]


def main():
    llm = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
    cases = []
    for text, special in CASES:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        cases.append({"text": text, "special": special, "ids": ids})
    # One case per line.
    lines = [json.dumps(case, ensure_ascii=False) for case in cases]
    # llama.cpp logs to stdout, so the result goes to a file.
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        out.write('{"command": ' + json.dumps(COMMAND) + ',\n "cases": [\n  ' +
                  ',\n  '.join(lines) + '\n ]\n}\n')


if __name__ == "__main__":
    main()
