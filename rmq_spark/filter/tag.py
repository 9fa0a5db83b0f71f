"""RocketMQ's TAG filter (``ExpressionType.TAG``): :class:`TagFilter`.

``*``, empty or ``None`` subscribes to everything; otherwise the expression is split on ``||``
and every piece is trimmed (Java ``String.trim``); empty pieces are dropped.  The broker matches
ConsumeQueue ``tagsCode`` values against the tags' ``java_string_hash`` and the client re-checks
the tag string, because hash codes collide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.filter._common import _JAVA_TRIM_CHARS, _check_expression_size, _concat_masks, _int32
from rmq_spark.store.hashing import java_string_hash

SUB_ALL = "*"


@dataclass(frozen=True)
class TagFilter:
    """A parsed TAG subscription expression (``*``, ``TagA``, ``TagA || TagB``)."""

    expression: str
    match_all: bool
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, expression: str | None) -> TagFilter:
        """Build the filter as RocketMQ's ``FilterAPI.buildSubscriptionData`` does."""
        if expression is None or expression == "" or expression == SUB_ALL:
            return cls(SUB_ALL, True)
        _check_expression_size("TAG", expression)
        pieces = (piece.strip(_JAVA_TRIM_CHARS) for piece in expression.split("||"))
        tags = frozenset(piece for piece in pieces if piece)
        return cls(expression, False, tags, frozenset(java_string_hash(t) for t in tags))

    def matches_code(self, tags_code: int) -> bool:
        """Broker-side check of one ConsumeQueue ``tagsCode`` (compared as Java ``intValue``)."""
        return self.match_all or _int32(int(tags_code)) in self.codes

    def matches(self, tag: str | None) -> bool:
        """Exact re-check on a message's tag string; an untagged message only matches ``*``."""
        return self.match_all or (tag is not None and tag in self.tags)

    def matches_message(self, message: Any) -> bool:
        """:meth:`matches` on a stored message's tag (the store's filter seam: it checks
        :meth:`matches_code` on the ConsumeQueue first, then this on the record)."""
        return self.match_all or message.tags in self.tags

    def mask_codes(self, tags_codes: np.ndarray) -> np.ndarray:
        """:meth:`matches_code` over an integer array; returns a bool array."""
        codes = np.asarray(tags_codes)
        if self.match_all:
            return np.ones(codes.shape, dtype=bool)
        wanted = np.array(sorted(self.codes), dtype=np.int32)
        return np.isin(codes.astype(np.int64).astype(np.int32), wanted)

    def mask(self, tags: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
        """:meth:`matches` over a string array; a null tag matches only when ``match_all``."""
        if isinstance(tags, pa.ChunkedArray):
            return _concat_masks([self.mask(chunk) for chunk in tags.chunks])
        if self.match_all:
            return pa.array(np.ones(len(tags), dtype=bool))
        if pa.types.is_dictionary(tags.type):
            tags = tags.dictionary_decode()
        if pa.types.is_null(tags.type) or not self.tags:
            return pa.array(np.zeros(len(tags), dtype=bool))
        found = pc.is_in(tags, value_set=pa.array(sorted(self.tags), type=tags.type))
        return pc.fill_null(found, False)
