"""A scripted chat model for the summarizer's and the jobs' unit tests."""

from __future__ import annotations

from collections.abc import Callable

Answer = str | Exception | Callable[[list[dict[str, str]]], str]


class FakeModel:
    """A ChatModel that records every request and answers from a script.

    The last answer repeats once the script runs out; an exception is raised; a callable
    gets the request's messages.
    """

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[list[dict[str, str]], int]] = []

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int) -> str:
        self.requests.append((messages, max_tokens))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(messages)
        return answer

    @property
    def kinds(self) -> list[str]:
        kinds = []
        for messages, _ in self.requests:
            head = messages[0]["content"].split("\n", 1)[0]
            kinds.append(head.removeprefix("[memory-gateway:").removesuffix("]"))
        return kinds

    def prompt(self, n: int = -1) -> str:
        return self.requests[n][0][-1]["content"]

    def system(self, n: int = -1) -> str:
        return self.requests[n][0][0]["content"]
