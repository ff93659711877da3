"""Write the example dataset of examples/dataset.yaml (from the repository root):

    python examples/data/make_data.py

``number_words.jsonl``: the digits written as words, ``{"word": "seven",
"answer": "7", "letters": 5}``, one record per line. examples/dataset.yaml
builds the prompt ``"seven ="`` from the ``word`` field with a template; the
other fields (``letters``) are what a custom reward receives as keyword
arguments. Ten records: a lookup a from-scratch model learns on a CPU in a
few hundred steps.

``sums.jsonl``: every sum of two digits, ``{"question": "3+4", "answer": "7"}``,
the prompts of the tool-use example (examples/tool_use.yaml).
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
HERE = Path(__file__).resolve().parent


def number_words() -> list[dict]:
    return [{"word": word, "answer": str(digit), "letters": len(word)}
            for digit, word in enumerate(WORDS)]


def sums() -> list[dict]:
    return [{"question": f"{a}+{b}", "answer": str(a + b)} for a in range(10) for b in range(10)]


def main() -> None:
    for name, records in (("number_words.jsonl", number_words()), ("sums.jsonl", sums())):
        path = HERE / name
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
