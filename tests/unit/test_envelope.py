"""The message envelope: a documented byte format other languages can read."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeps.envelope import Envelope, EnvelopeError, decode, decode_node, encode, encode_pack

texts = st.text(max_size=40)
envelopes = st.builds(
    Envelope,
    body=st.binary(max_size=2000),
    id=texts,
    publisher=texts,
    timestamp_ms=st.integers(min_value=0, max_value=2**53),
    content_type=st.none() | texts,
    headers=st.dictionaries(texts, texts, max_size=5),
)


@given(envelopes)
def test_round_trip(envelope: Envelope) -> None:
    assert decode(encode(envelope)) == envelope


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_envelope_error(data: bytes) -> None:
    with contextlib.suppress(EnvelopeError):  # anything else escaping is the failure
        decode(data)


def test_layout_is_as_documented() -> None:
    data = encode(Envelope(body=b"BODY", id="p.1", publisher="p", timestamp_ms=5))
    magic, version, length = struct.unpack_from("!2sBI", data)
    assert (magic, version) == (b"ZE", 1)
    assert data[7 : 7 + length] == b'{"id":"p.1","publisher":"p","timestamp_ms":5}'
    assert data[7 + length :] == b"BODY"


def test_plain_zkms_message_is_a_body_without_headers() -> None:
    assert decode(b"evict:42") == Envelope(body=b"evict:42")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"ZE\x02\x00\x00\x00\x02{}", "version 2 is not supported"),
        (b"ZE\x01\x00\x00\x00\x09{}", "claims 9 bytes"),
        (b"ZE\x01\x00", "truncated"),
        (b"ZE\x01\x00\x00\x00\x02[]", "must be a JSON object"),
        (b"ZE\x01\x00\x00\x00\x03{x}", "not JSON"),
        (b'ZE\x01\x00\x00\x00\x0f{"headers":[1]}', "headers"),
    ],
)
def test_bad_envelopes_say_what_is_wrong(data: bytes, reason: str) -> None:
    with pytest.raises(EnvelopeError, match=reason):
        decode(data)


@given(st.lists(envelopes, min_size=1, max_size=5))
def test_pack_round_trip(batch: list[Envelope]) -> None:
    assert decode_node(encode_pack([encode(e) for e in batch])) == batch


def test_a_pack_of_one_is_a_plain_envelope() -> None:
    env = encode(Envelope(body=b"solo", id="p.1"))
    assert encode_pack([env]) == env


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"ZP\x01\x00\x00\x00\x02\x00\x00\x00\x01x", "truncated at message 1"),
        (b"ZP\x01\x00\x00\x00\x01\x00\x00\x00\x09x", "claims 9 bytes"),
        (b"ZP\x01\x00\x00\x00\x01\x00\x00\x00\x01xEXTRA", "bytes after its 1 messages"),
        (b"ZP\x03\x00\x00\x00\x00", "pack version 3"),
    ],
)
def test_bad_packs_say_what_is_wrong(data: bytes, reason: str) -> None:
    with pytest.raises(EnvelopeError, match=reason):
        decode_node(data)
