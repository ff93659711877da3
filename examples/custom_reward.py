"""A custom reward for examples/data/number_words.jsonl (see docs/tasks.md).

Used as ``task.reward: {name: custom, target: "custom_reward:digit_match"}``
with ``examples/`` on ``PYTHONPATH``.
"""


def digit_match(prompt: str, completion: str, answer: str, **record) -> float:
    """1.0 for the right digit, 0.1 for another single digit (the format is
    right), else 0.0. ``record`` holds the record's other fields (``letters``)."""
    completion = completion.strip()
    if completion == answer:
        return 1.0
    if len(completion) == 1 and completion.isdigit() and record["letters"] > 0:
        return 0.1
    return 0.0
