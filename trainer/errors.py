"""The one exception type the trainer turns into a one-line message and a non-zero exit."""


class TrainerError(Exception):
    """A problem the user can fix (a flag, a path, a file); rendered as one line, no traceback.

    Every rank detects these on its own from the same inputs, so every rank prints the line and
    exits non-zero without waiting for the others.
    """

    exit_code = 2


def refusal(problems: list[str]) -> TrainerError:
    """Every problem of one command in one error: a start (and ``--check``) names them all at
    once, never one per launch. One problem reads as itself."""
    if len(problems) == 1:
        return TrainerError(problems[0])
    return TrainerError(f"{len(problems)} problems: " + "; ".join(f"{i}) {p}" for i, p in enumerate(problems, 1)))
