"""The ZEPS codec: :func:`encode` and :func:`decode`, bytes in, commands out, no sockets. A generic
walk over each command's ``FIELDS`` (:mod:`zeps.protocol.commands`), with the commands that carry
messages on their hand-written paths (:mod:`zeps.protocol._fastpath`)."""

from __future__ import annotations

from zeps.errors import LocalProtocolError, RemoteProtocolError
from zeps.protocol._fastpath import FAST_DECODERS, U8, U16, U32, U64, encode_publish, is_printable, is_vchar
from zeps.protocol.commands import COMMANDS, SIGNATURE, Command, Publish

__all__ = ["decode", "encode"]

_NUMBERS = {"number-2": (U16, 0xFFFF), "number-4": (U32, 0xFFFFFFFF), "number-8": (U64, 2**64 - 1)}


def encode(command: Command) -> bytes:
    """One frame for ``command``; LocalProtocolError if a field cannot be expressed."""
    if type(command) is Publish:  # the hot path
        frame = encode_publish(command.key, command.body)
        if frame is not None:
            return frame
    parts = [SIGNATURE, U8.pack(command.ID)]
    for name, kind in command.FIELDS:
        value = getattr(command, name)
        if kind in ("string", "text"):
            ok = is_vchar(value) if kind == "string" else is_printable(value)
            if not ok:
                allowed = "printable ASCII without spaces" if kind == "string" else "printable ASCII"
                raise LocalProtocolError(f"{command.NAME}.{name} must be {allowed}: {value!r}")
            raw = value.encode("ascii")
            if len(raw) > 255:
                raise LocalProtocolError(f"{command.NAME}.{name} is {len(raw)} bytes; a string holds at most 255")
            parts += [U8.pack(len(raw)), raw]
        elif kind == "chunk":
            if len(value) > 0xFFFFFFFF:
                raise LocalProtocolError(f"{command.NAME}.{name} is larger than a chunk can hold (4 GiB)")
            parts += [U32.pack(len(value)), bytes(value)]
        else:
            packer, top = _NUMBERS[kind]
            if not 0 <= value <= top:
                raise LocalProtocolError(f"{command.NAME}.{name}={value} does not fit {kind}")
            parts.append(packer.pack(value))
    return b"".join(parts)


def decode(frame: bytes) -> Command:
    """The command in one frame; RemoteProtocolError (with a reason fit for INVALID) if malformed."""
    if len(frame) < 3:
        raise RemoteProtocolError(f"frame of {len(frame)} bytes is too short for a command")
    if frame[:2] != SIGNATURE:
        raise RemoteProtocolError(f"bad signature {frame[:2].hex()} (expected aaa5)")
    fast = FAST_DECODERS.get(frame[2])
    if fast is not None:
        return fast(frame)
    cls = COMMANDS.get(frame[2])
    if cls is None:
        raise RemoteProtocolError(f"unknown command id {frame[2]}")
    offset, values = 3, dict[str, object]()
    for name, kind in cls.FIELDS:
        if kind in ("string", "text"):
            if offset + 1 > len(frame):
                raise RemoteProtocolError(f"{cls.NAME} truncated before {name}")
            length = frame[offset]
            raw = frame[offset + 1 : offset + 1 + length]
            if len(raw) != length:
                raise RemoteProtocolError(f"{cls.NAME}.{name} claims {length} bytes, {len(raw)} follow")
            text = raw.decode("latin-1")
            if not (is_vchar(text) if kind == "string" else is_printable(text)):
                raise RemoteProtocolError(f"{cls.NAME}.{name} is not printable ASCII")
            values[name] = text
            offset += 1 + length
        elif kind == "chunk":
            if offset + 4 > len(frame):
                raise RemoteProtocolError(f"{cls.NAME} truncated before {name}")
            (length,) = U32.unpack_from(frame, offset)
            body = frame[offset + 4 : offset + 4 + length]
            if len(body) != length:
                raise RemoteProtocolError(f"{cls.NAME}.{name} claims {length} bytes, {len(body)} follow")
            values[name] = bytes(body)
            offset += 4 + length
        else:
            packer, _ = _NUMBERS[kind]
            if offset + packer.size > len(frame):
                raise RemoteProtocolError(f"{cls.NAME} truncated in {name}")
            values[name] = packer.unpack_from(frame, offset)[0]
            offset += packer.size
    if offset != len(frame):
        raise RemoteProtocolError(f"{cls.NAME} has {len(frame) - offset} bytes after its last field")
    return cls(**values)
