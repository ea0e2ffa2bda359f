"""The relay's optional compiled column writer (`_relaycols.c`); see
`otel_rl._internal.relay_columns`."""

from collections.abc import Sequence
from typing import Any

def columns(records: Sequence[Any], /) -> tuple[bytes, list[Any], list[int], list[int]] | None:
    """The seven typed columns of `records` as one bytes object, the names and trace ids in
    order of first appearance, and the positions of the records whose extra is not None; None
    for records it does not take as they are."""
