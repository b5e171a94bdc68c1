from collections.abc import Iterator, Sequence
from typing import IO

class PlainMerge(Iterator[bytes]):
    def __init__(
        self,
        fds: Sequence[int | IO[bytes]],
        node_columns: Sequence[bytes],
        base_ranks: Sequence[int | None],
        offsets: Sequence[float],
        rank_width: int,
        float_keys: bool | None = None,
        block: int = ...,
        chunk: int = ...,
        raw: bool = False,
    ) -> None: ...
    def __next__(self) -> bytes: ...
