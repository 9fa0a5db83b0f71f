"""Properties built column-wise are the bytes encode_properties makes of each row's dict (map
keys are unique, as Spark's maps are)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_spark.store.message import tags_code
from rmq_spark.store.properties import encode_properties
from rmq_spark.store.rowprops import id_column, row_properties

text = st.text(
    alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
    max_size=8,
)
row = st.tuples(
    st.none()
    | st.dictionaries(text.filter(bool), st.none() | text, max_size=3).map(
        lambda d: list(d.items())
    ),
    st.none() | text,
    st.none() | text,
)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=12), cut=st.integers(0, 3))
def test_each_row_is_what_encode_properties_makes_of_its_dict(rows, cut):
    props = pa.array([p for p, _, _ in rows], pa.map_(pa.string(), pa.string()))
    tags = pa.array([t for _, t, _ in rows], pa.string())
    keys = pa.array([k for _, _, k in rows], pa.string())
    cut = min(cut, len(rows) - 1)  # a sliced column, as Arrow hands a part of a batch
    props, tags, keys, rows = props.slice(cut), tags.slice(cut), keys.slice(cut), rows[cut:]
    rp = row_properties(
        len(rows), properties=props, named={"TAGS": tags, "KEYS": keys}, shared={"SINK": "q|1|a"}
    )
    for got, (p, t, k) in zip(rp.blobs.to_pylist(), rows, strict=True):
        want = {key: v for key, v in (p or []) if v is not None}
        if t:
            want["TAGS"] = t
        if k:
            want["KEYS"] = k
        want["SINK"] = "q|1|a"
        assert got == encode_properties(want)
    assert rp.tags_codes.tolist() == [tags_code(t) for _, t, _ in rows]
    assert rp.keys == [k or None for _, _, k in rows]
    picked = rp.take(np.array([len(rows) - 1, 0]))
    assert picked.blobs.to_pylist() == [rp.blobs[len(rows) - 1].as_py(), rp.blobs[0].as_py()]


def test_ids_and_shared_parts_are_joined_onto_each_row():
    rp = row_properties(2, named={"TAGS": pa.array(["a", None])})
    ids = np.frombuffer(b"0" * 32 + b"1" * 32, dtype=np.uint8).reshape(2, 32)
    assert rp.joined(b"UNIQ_KEY\x01", id_column(ids), b"\x02").to_pylist() == [
        b"TAGS\x01a\x02UNIQ_KEY\x01" + b"0" * 32 + b"\x02", b"UNIQ_KEY\x01" + b"1" * 32 + b"\x02"]  # fmt: skip
    assert row_properties(3).blobs.to_pylist() == [b""] * 3
