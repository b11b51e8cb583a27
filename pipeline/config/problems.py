"""Config problems: the error a user sees, and how validators report problems below them."""

from __future__ import annotations

class ConfigError(ValueError):
    """A config that cannot be used; the message names every problem with its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} {noun}:\n{lines}")


# Problems a validator found: (key path relative to its model, message).
Found = list[tuple[tuple[str | int, ...], str]]


class Problems(ValueError):
    """Validator errors that point below the model raising them (paths relative to it)."""

    def __init__(self, items: Found) -> None:
        super().__init__("; ".join(message for _, message in items))
        self.items = items


def raise_if(items: Found) -> None:
    if items:
        raise Problems(items)
