"""The task's prompt source as the dispatcher reads it: with one prompt of
lookahead, so it knows the source is dry before it asks for a batch."""

from __future__ import annotations

import collections

from asyncrl.tasks.base import PromptSource
from asyncrl.types import Prompt


class Lookahead:
    """The task's prompt source, with one prompt of lookahead (to know it is dry)."""

    def __init__(self, source: PromptSource) -> None:
        self.source = source
        self.held: collections.deque[Prompt] = collections.deque()
        self.exhausted = False
        #: Prompts read from the task so far (the summary accounts for each).
        self.drawn = 0

    def peek(self) -> Prompt | None:
        if not self.held:
            prompt = self.pop()
            if prompt is None:
                return None
            self.held.append(prompt)
        return self.held[0]

    def pop(self) -> Prompt | None:
        # The primitive (peek is built on it): one call per prompt on the hot path.
        if self.held:
            return self.held.popleft()
        prompt = None if self.exhausted else self.source.next_prompt()
        if prompt is None:
            self.exhausted = True
        else:
            self.drawn += 1
        return prompt


__all__ = ["Lookahead"]
