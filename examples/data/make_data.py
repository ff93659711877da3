"""Write the example datasets of examples/dataset.yaml (run from the repository root).

    python examples/data/make_data.py

``number_words.jsonl``: sums of two numbers written as words, "two plus three"
-> "5", for operands zero..three (16 records). The same lookup table as the
quickstart's arithmetic task, but read from a file, with the prompt built by a
template from the record's fields: what a from-scratch model can learn on a CPU
in a few hundred steps. Every record also carries its operands ``a`` and ``b``
(a custom reward receives them as keyword arguments).
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["zero", "one", "two", "three"]
HERE = Path(__file__).resolve().parent


def number_words() -> list[dict]:
    return [{"question": f"{WORDS[a]} plus {WORDS[b]}", "answer": str(a + b), "a": a, "b": b}
            for a in range(len(WORDS)) for b in range(len(WORDS))]


def main() -> None:
    path = HERE / "number_words.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in number_words()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
