"""The wire protocol: the only module that calls msgpack.

Every ZeroMQ frame carries one envelope ``{v, type, sender, seq, body}``. A :class:`Codec` encodes
and decodes envelopes, checks the body of each known type against a small schema, and rejects
(and counts) unknown versions, unknown types, oversized and malformed frames by raising
:class:`~skh.errors.ProtocolError` — a daemon catches it, counts it and carries on.

Bulk data is columnar: a probe or counter batch carries one raw little-endian byte string per
field of :data:`~skh.records.PROBE_DTYPE` / :data:`~skh.records.COUNTER_DTYPE` plus the row count,
so neither side builds one Python object per probe (a snapshot page's endpoint records likewise:
:func:`encode_records`). numpy is loaded by the functions that build or read arrays, not with
this module: the overlay agent speaks the protocol without it (~13 MB of each sidecar's memory),
encoding its batches from packed records (:func:`probe_batch_body_packed`) and reading snapshot
pages with :func:`decode_record_columns`::

    codec = Codec()
    frame = codec.encode(MsgType.PROBE_BATCH, "agent-1", 7, probe_batch_body("agent-1", records))
    env = codec.decode(frame)
    records = decode_probes(env.body)
"""

from __future__ import annotations

import enum
import functools
import struct
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from skh.errors import ProtocolError
from skh.layout import PROBE_FIELDS, PROBE_STRUCT

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "WIRE_VERSION",
    "MsgType",
    "Envelope",
    "Codec",
    "encode_columns",
    "decode_columns",
    "probe_batch_body",
    "probe_batch_body_packed",
    "counter_batch_body",
    "decode_probes",
    "decode_counters",
    "pack_pairs",
    "unpack_pairs",
    "ENDPOINT_DTYPE",  # noqa: F822 - made by the module's __getattr__
    "ENDPOINT_TEXT",
    "encode_records",
    "decode_records",
    "decode_record_columns",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_ELEMENTS",
    "NAME_MAX",
    "PAGE_MAX",
    "job_topic",
    "AGENTS_TOPIC",
    "ALERTS_TOPIC",
]

WIRE_VERSION = 1
#: a 1 s batch of 65,536 probe records is 3.4 MiB; leave room for bursts but refuse bombs
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
#: list items and map entries in one frame: a page of 8,192 endpoint records is ~100,000; the
#: worst frame within budget (empty maps) decodes to ~80 MB
DEFAULT_MAX_ELEMENTS = 1_000_000

#: PUB topics (first frame of a published message)
AGENTS_TOPIC = b"agents\0"
ALERTS_TOPIC = b"alert\0"


def job_topic(job: str) -> bytes:
    """The controller's PUB topic of one job. The terminator makes ZeroMQ's prefix match exact:
    a subscriber of job "a" must not hear job "ab"."""
    return b"j:" + job.encode() + b"\0"


class MsgType(enum.StrEnum):
    """Every message type of wire version 1. The value is what travels."""

    # agent <-> controller (DEALER/ROUTER)
    REGISTER = "register"
    REGISTER_ACK = "register_ack"
    READY = "ready"
    DEREGISTER = "deregister"  # the agent stops on purpose (container stopped)
    HEARTBEAT = "heartbeat"
    HEARTBEAT_ACK = "heartbeat_ack"
    SYNC = "sync"  # ask for a job snapshot (after a version gap)
    ACK = "ack"  # generic reply: {ok, error, data}
    COMMAND = "command"  # requester -> controller -> agent
    COMMAND_REPLY = "command_reply"
    # admin requests to the controller
    SUBMIT_JOB = "submit_job"
    REMOVE_JOB = "remove_job"
    APPLY_SKELETON = "apply_skeleton"
    STATUS = "status"
    MEMBERS = "members"  # one page of endpoint records (operator, analyzer)
    # identities (docs/trust.md)
    ENROL = "enrol"  # an underlay agent vouches for a sidecar key of a container on its host
    REVOKE = "revoke"  # the operator revokes a key binding
    KEYS = "keys"  # one page of key bindings with the endpoints each owns (analyzer)
    # controller PUB, per-job topics
    JOB_SNAPSHOT = "job_snapshot"
    READY_ANNOUNCE = "ready_announce"
    ENDPOINTS_DOWN = "endpoints_down"
    SKELETON = "skeleton"
    AGENT_STATE = "agent_state"
    # agents PUSH -> analyzer PULL
    PROBE_BATCH = "probe_batch"
    COUNTER_BATCH = "counter_batch"
    # analyzer PUB / REP
    ALERT = "alert"
    REPLAY = "replay"
    REPLAY_REPLY = "replay_reply"


_ANY = object()  # any msgpack value
_NUM = (int, float)

#: caps on one field, checked before any handler sees it: names (agent, job, container, host),
#: command ids, lists of endpoint records an agent or a job may hold in one request
NAME_MAX = 256
CMD_ID_MAX = 128
ENDPOINTS_MAX = 4096  # endpoint records or ids in one agent request
CONTAINERS_MAX = 100_000  # containers of one job submission
WATCH_MAX = 65_536  # endpoint names an underlay agent samples
PAGE_MAX = 8192  # records per page of a paged answer (snapshots, members, key bindings)
_BIG = 1 << 30  # bounded by the frame size alone

# field -> (allowed types, required, max length of a str/bytes/list/map value). ``bool`` is a
# subclass of ``int``: int fields refuse it below.
_SCHEMAS: dict[MsgType, dict[str, tuple[Any, bool, int]]] = {
    MsgType.REGISTER: {
        "agent": (str, True, NAME_MAX),
        "role": (str, True, 16),
        "host": (str, True, NAME_MAX),
        # [{job, container, rail, ip, port, gid, qpn, netdev}]
        "endpoints": (list, True, ENDPOINTS_MAX),
        "watch": (list, False, WATCH_MAX),  # endpoint names an underlay agent samples
    },
    MsgType.REGISTER_ACK: {
        "epoch": (str, True, 64),
        "endpoints": (list, True, ENDPOINTS_MAX),  # ep ids, in the order registered
        "snapshots": (list, True, 64),  # JOB_SNAPSHOT bodies of the small jobs involved
        "heartbeat_interval_s": (_NUM, True, 0),
        "resolved": (dict, False, WATCH_MAX),  # endpoint name -> ep id (underlay)
    },
    MsgType.READY: {"agent": (str, True, NAME_MAX), "endpoints": (list, True, ENDPOINTS_MAX)},
    MsgType.DEREGISTER: {"agent": (str, True, NAME_MAX)},
    MsgType.HEARTBEAT: {
        "agent": (str, True, NAME_MAX),
        "epoch": (str, True, 64),
        "jobs": (dict, True, 64),  # job -> ping-list version the agent holds
        "unresolved": (list, False, WATCH_MAX),
    },
    MsgType.HEARTBEAT_ACK: {
        "epoch": (str, True, 64),
        "known": (bool, True, 0),
        "jobs": (dict, True, 64),
        "resolved": (dict, False, WATCH_MAX),
    },
    MsgType.SYNC: {"job": (str, True, NAME_MAX), "after": (int, False, 0)},
    MsgType.ACK: {
        "ok": (bool, True, 0),
        "error": (str, False, 4096),
        "data": (_ANY, False, 0),
        "re": (int, False, 0),
    },
    MsgType.COMMAND: {
        "cmd_id": (str, True, CMD_ID_MAX),
        "agent": (str, True, NAME_MAX),
        "name": (str, True, 64),
        "args": (dict, True, 32),
        "timeout_s": (_NUM, False, 0),
        "retries": (int, False, 0),
    },
    MsgType.COMMAND_REPLY: {
        "cmd_id": (str, True, CMD_ID_MAX),
        "ok": (bool, True, 0),
        "result": (_ANY, False, 0),
        "error": (str, False, 4096),
    },
    MsgType.SUBMIT_JOB: {
        "job": (str, True, NAME_MAX),
        "shape": (dict, False, 16),
        "containers": (list, True, CONTAINERS_MAX),
    },
    MsgType.REMOVE_JOB: {"job": (str, True, NAME_MAX)},
    MsgType.APPLY_SKELETON: {
        "job": (str, True, NAME_MAX),
        "skeleton_version": (int, True, 0),
        "pairs": (bytes, True, _BIG),
    },
    MsgType.STATUS: {"detail": (bool, False, 0)},
    MsgType.MEMBERS: {
        "after": (int, False, 0),  # the last endpoint id of the previous page (-1: from the start)
        "limit": (int, False, 0),
        "job": (str, False, NAME_MAX),
    },
    MsgType.ENROL: {
        "agent": (str, True, NAME_MAX),  # the vouching underlay agent
        "name": (str, True, NAME_MAX),  # the sidecar's agent name
        "job": (str, True, NAME_MAX),
        "container": (str, True, NAME_MAX),
        "key": (str, True, 40),  # the sidecar's CURVE public key, Z85
    },
    MsgType.REVOKE: {"key": (str, False, 40), "name": (str, False, NAME_MAX)},
    MsgType.KEYS: {"since": (int, False, 0), "after": (str, False, 40)},
    MsgType.JOB_SNAPSHOT: {
        "job": (str, True, NAME_MAX),
        "version": (int, True, 0),
        # one page of endpoint records, columnar: encode_records
        "records": (dict, True, 3),
        "skeleton_version": (int, True, 0),
        "skeleton": ((bytes, type(None)), True, _BIG),
        "next": ((int, type(None)), False, 0),  # the next page starts after this endpoint id
        # the controller's probe policy and the skeleton's probe plan (skh.probeplan)
        "probing": (dict, False, 32),
        "plan": (dict, False, 8),
    },
    MsgType.READY_ANNOUNCE: {
        "job": (str, True, NAME_MAX),
        "version": (int, True, 0),
        "endpoints": (list, True, _BIG),
    },
    MsgType.ENDPOINTS_DOWN: {
        "job": (str, True, NAME_MAX),
        "version": (int, True, 0),
        "endpoints": (list, True, _BIG),
        "reason": (str, True, 64),
    },
    MsgType.SKELETON: {
        "job": (str, True, NAME_MAX),
        "version": (int, True, 0),
        "skeleton_version": (int, True, 0),
        "pairs": (bytes, True, _BIG),
        "probing": (dict, False, 32),
        "plan": (dict, False, 8),
    },
    MsgType.AGENT_STATE: {
        "agent": (str, True, NAME_MAX),
        "state": (str, True, 16),
        "endpoints": (list, True, _BIG),
    },
    # "eps": the sender's endpoint ids; every batch, empty ones too, is their heartbeat
    MsgType.PROBE_BATCH: {
        "agent": (str, True, NAME_MAX),
        "n": (int, True, 0),
        "cols": (dict, True, 32),
        "eps": (list, False, ENDPOINTS_MAX),
    },
    MsgType.COUNTER_BATCH: {
        "agent": (str, True, NAME_MAX),
        "n": (int, True, 0),
        "cols": (dict, True, 32),
    },
    # the alert bus (docs/alerts.md); "schema": the alert schema's version
    MsgType.ALERT: {
        "seq": (int, True, 0),
        "ts_ns": (int, False, 0),
        "schema": (str, False, 16),
        "alert": (dict, True, _BIG),
    },
    MsgType.REPLAY: {"since": (int, True, 0), "limit": (int, False, 0)},
    MsgType.REPLAY_REPLY: {
        "alerts": (list, True, _BIG),
        "last_seq": (int, True, 0),
        "first_seq": (int, False, 0),  # the oldest record the log still holds
    },
}

_TYPES = {t.value: t for t in MsgType}
_MAX_ARRAY = 1 << 20  # one list (an 8 MiB allocation at most)
_MAX_MAP = 1 << 16
_U64 = 2**64


@dataclass(frozen=True, slots=True)
class Envelope:
    v: int
    type: MsgType
    sender: str
    seq: int
    body: dict[str, Any]


def _check_body(mtype: MsgType, body: Any) -> None:
    """Check the body's fields against the type's schema: type, presence and length. What nests
    inside a field needs no walk: decoding yields only plain values (extensions are refused,
    timestamps become ints), and the decoder's element budget bounds what nests."""
    if not isinstance(body, dict):
        raise ProtocolError(f"{mtype.value}: body must be a map, got {type(body).__name__}")
    for key, (types, required, max_len) in _SCHEMAS[mtype].items():
        if key not in body:
            if required:
                raise ProtocolError(f"{mtype.value}: missing field {key!r}")
            continue
        value = body[key]
        if types is _ANY:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and types in (int, _NUM)):
            raise ProtocolError(f"{mtype.value}: field {key!r} has type {type(value).__name__}")
        if max_len and isinstance(value, (str, bytes, list, dict)) and len(value) > max_len:
            raise ProtocolError(
                f"{mtype.value}: field {key!r} holds {len(value)} (at most {max_len})"
            )


class _OverBudget(Exception):
    pass


class _Budget:
    """Counts list items and map entries as msgpack builds them (its list and object hooks)."""

    __slots__ = ("left",)

    def __init__(self, elements: int) -> None:
        self.left = elements

    def items(self, value: list[Any]) -> list[Any]:
        self.left -= len(value) + 1
        if self.left < 0:
            raise _OverBudget
        return value

    def entries(self, value: dict[str, Any]) -> dict[str, Any]:
        self.left -= len(value) + 1
        if self.left < 0:
            raise _OverBudget
        return value


def _ext_hook(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not part of the protocol")


class Codec:
    """Encode/decode envelopes with a frame-size limit, counting every rejection by reason.

    ``rejected`` maps a reason (``oversized``, ``malformed``, ``budget``, ``version``, ``type``,
    ``schema``) to a count; daemons export it as a metric.

    Decoding is bounded before and while objects are built: the frame is first walked without
    building anything (a header announcing more elements than the frame holds is refused, so no
    length read from the wire sizes an allocation), then decoded with a budget of
    ``max_elements`` list items and map entries in all (a frame of a million empty maps is
    refused after the budget, not decoded into a gigabyte).
    """

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        if not isinstance(max_frame_bytes, int) or max_frame_bytes < 64:
            raise ProtocolError(
                "The 'max_frame_bytes' parameter of Codec must be an int >= 64. "
                f"Got {max_frame_bytes!r} instead."
            )
        if not isinstance(max_elements, int) or max_elements < 64:
            raise ProtocolError(
                "The 'max_elements' parameter of Codec must be an int >= 64. "
                f"Got {max_elements!r} instead."
            )
        self.max_frame_bytes = max_frame_bytes
        self.max_elements = max_elements
        self.rejected: Counter[str] = Counter()

    def encode(self, mtype: MsgType, sender: str, seq: int, body: Mapping[str, Any]) -> bytes:
        """Pack one envelope. Raises ProtocolError for a body that does not fit its schema or
        a frame over the size limit (the receiver would refuse it anyway)."""
        mtype = MsgType(mtype)
        body = dict(body)
        _check_body(mtype, body)
        envelope = {"v": WIRE_VERSION, "type": mtype.value, "sender": sender, "seq": int(seq)}
        try:
            frame = msgpack.packb({**envelope, "body": body}, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ProtocolError(f"{mtype.value}: body is not plain data: {exc}") from None
        if len(frame) > self.max_frame_bytes:
            raise ProtocolError(
                f"{mtype.value}: frame of {len(frame)} bytes exceeds {self.max_frame_bytes}"
            )
        return frame

    def _reject(self, reason: str, msg: str) -> ProtocolError:
        self.rejected[reason] += 1
        return ProtocolError(msg)

    def decode(self, frame: bytes | memoryview, *, max_elements: int | None = None) -> Envelope:
        """Unpack and validate one frame; every failure is a counted ProtocolError.
        ``max_elements`` lowers the element budget for this frame (a daemon gives senders that
        only ever send small requests a small budget)."""
        if len(frame) > self.max_frame_bytes:
            raise self._reject(
                "oversized", f"frame of {len(frame)} bytes exceeds {self.max_frame_bytes}"
            )
        walker = msgpack.Unpacker(max_buffer_size=max(len(frame), 1))
        try:
            walker.feed(frame)
            walker.skip()  # builds nothing: a header announcing absent elements fails here
            whole = walker.tell() == len(frame)
        except Exception as exc:  # OutOfData, ValueError, StackError: all mean "malformed"
            raise self._reject("malformed", f"undecodable frame: {type(exc).__name__}") from None
        if not whole:
            raise self._reject("malformed", "trailing bytes after the envelope")
        limit = self.max_elements if max_elements is None else min(max_elements, self.max_elements)
        budget = _Budget(limit)
        try:
            obj = msgpack.unpackb(
                frame,
                raw=False,
                strict_map_key=True,
                ext_hook=_ext_hook,
                timestamp=2,  # the one built-in extension becomes a plain int (ns)
                max_array_len=min(limit, _MAX_ARRAY),
                max_map_len=min(limit, _MAX_MAP),
                list_hook=budget.items,
                object_hook=budget.entries,
            )
        except _OverBudget:
            raise self._reject("budget", f"frame holds more than {limit} elements") from None
        except Exception as exc:  # msgpack raises a zoo of types for garbage; all mean "malformed"
            raise self._reject("malformed", f"undecodable frame: {type(exc).__name__}") from None
        if not isinstance(obj, dict):
            raise self._reject("malformed", "envelope is not a map")
        v = obj.get("v")
        if v != WIRE_VERSION or isinstance(v, bool):
            raise self._reject("version", f"unknown wire version {v!r}")
        mtype = _TYPES.get(obj.get("type")) if isinstance(obj.get("type"), str) else None
        if mtype is None:
            raise self._reject("type", f"unknown message type {obj.get('type')!r}")
        sender, seq, body = obj.get("sender"), obj.get("seq"), obj.get("body")
        if (
            not isinstance(sender, str)
            or not isinstance(seq, int)
            or isinstance(seq, bool)
            or not 0 <= seq < _U64
        ):
            raise self._reject("malformed", "envelope sender/seq missing or of the wrong type")
        try:
            _check_body(mtype, body)
        except ProtocolError as exc:
            raise self._reject("schema", str(exc)) from None
        return Envelope(v, mtype, sender, seq, body)


# ---------------------------------------------------------------------------------------------
# Columnar batches


def _fields(dtype: np.dtype) -> list[str]:
    # padding fields carry nothing
    return [n for n in dtype.names or () if not n.startswith("_")]


def encode_columns(records: np.ndarray, dtype: np.dtype) -> dict[str, Any]:
    """A structured array as ``{"n": rows, "cols": {field: raw LE bytes}}``."""
    if records.dtype != dtype:
        raise ProtocolError(f"batch dtype {records.dtype} is not {dtype}")
    return {"n": int(records.shape[0]), "cols": {f: records[f].tobytes() for f in _fields(dtype)}}


def decode_columns(body: Mapping[str, Any], dtype: np.dtype) -> np.ndarray:
    """The inverse of :func:`encode_columns`; checks every column's length against ``n``."""
    import numpy as np

    n, cols = body.get("n"), body.get("cols")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(cols, dict):
        raise ProtocolError("batch: 'n' must be a non-negative int and 'cols' a map")
    names = _fields(dtype)
    for name in names:  # every length checked before allocating: 'n' alone must not size memory
        col = cols.get(name)
        size = dtype.fields[name][0].itemsize  # type: ignore[index]
        if not isinstance(col, bytes) or len(col) != n * size:
            raise ProtocolError(f"batch: column {name!r} missing or not {n} x {size} bytes")
    out = np.zeros(n, dtype=dtype)
    for name in names:
        out[name] = np.frombuffer(cols[name], dtype=dtype.fields[name][0])  # type: ignore[index]
    return out


#: an endpoint record's fixed-width fields, one column each in a snapshot page: (field,
#: :mod:`struct` code, numpy type); :data:`ENDPOINT_DTYPE` is their numpy form
_ENDPOINT_FIELDS = (
    ("ep", "I", "<u4"),
    ("rail", "B", "u1"),
    ("port", "H", "<u2"),
    ("qpn", "I", "<u4"),
    ("ready", "B", "u1"),
)
#: its text fields and their caps (characters): each column is the page's distinct values and
#: one little-endian u16 index into them per record (a page has at most PAGE_MAX records)
ENDPOINT_TEXT: dict[str, int] = {
    "job": NAME_MAX,
    "container": NAME_MAX,
    "host": NAME_MAX,
    "ip": 64,
    "gid": 64,
    "netdev": 64,
}


@functools.cache
def _endpoint_dtype() -> np.dtype:
    import numpy as np

    return np.dtype([(f, t) for f, _, t in _ENDPOINT_FIELDS])


def __getattr__(name: str) -> Any:
    # ENDPOINT_DTYPE is a numpy dtype: built when first asked for, so importing this module
    # does not load numpy
    if name == "ENDPOINT_DTYPE":
        return _endpoint_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def encode_records(fixed: np.ndarray, text: Mapping[str, tuple[list[str], np.ndarray]]) -> dict:
    """A page of endpoint records: ``fixed`` (:data:`ENDPOINT_DTYPE` rows) and, per field of
    :data:`ENDPOINT_TEXT`, ``(values, index)``: the distinct strings and each row's index into
    them. 20-40 bytes a record where a map per record took ~100 (field names in every one)."""
    import numpy as np

    if fixed.size > PAGE_MAX:
        raise ProtocolError(f"a page holds at most {PAGE_MAX} records, not {fixed.size}")
    out = encode_columns(fixed, _endpoint_dtype())
    out["text"] = {
        f: [list(text[f][0]), np.asarray(text[f][1]).astype("<u2").tobytes()] for f in ENDPOINT_TEXT
    }
    return out


def decode_record_columns(body: Any) -> tuple[dict[str, tuple[int, ...]], dict[str, list[str]]]:
    """A page of :func:`encode_records`, checked whole before anything is built: ``n`` at most
    :data:`PAGE_MAX`, every column ``n`` entries, every index within its values, every value a
    string within its field's cap. Returns each fixed field's and each text field's value per
    record (plain Python: an agent reads its snapshot without numpy)."""
    if not isinstance(body, dict) or not isinstance(body.get("text"), dict):
        raise ProtocolError("records: a map with 'n', 'cols' and 'text' expected")
    n, cols = body.get("n"), body.get("cols")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(cols, dict):
        raise ProtocolError("batch: 'n' must be a non-negative int and 'cols' a map")
    if n > PAGE_MAX:
        raise ProtocolError(f"records: {n} in one page (at most {PAGE_MAX})")
    fixed: dict[str, tuple[int, ...]] = {}
    for name, code, _ in _ENDPOINT_FIELDS:
        col = cols.get(name)
        size = struct.calcsize(code)
        if not isinstance(col, bytes) or len(col) != n * size:
            raise ProtocolError(f"batch: column {name!r} missing or not {n} x {size} bytes")
        fixed[name] = struct.unpack(f"<{n}{code}", col)
    text: dict[str, list[str]] = {}
    for f, cap in ENDPOINT_TEXT.items():
        col = body["text"].get(f)
        if not isinstance(col, list) or len(col) != 2:
            raise ProtocolError(f"records: text column {f!r} is not [values, index]")
        values, index = col
        if not isinstance(values, list) or not isinstance(index, bytes) or len(values) > n:
            raise ProtocolError(f"records: text column {f!r} malformed")
        if len(index) != n * 2:
            raise ProtocolError(f"records: text column {f!r} index is not {n} x 2 bytes")
        if not all(isinstance(v, str) and len(v) <= cap for v in values):
            raise ProtocolError(f"records: a {f!r} value is not a string of <= {cap} characters")
        ix = struct.unpack(f"<{n}H", index)
        if n and max(ix) >= len(values):
            raise ProtocolError(f"records: a {f!r} index is past its {len(values)} values")
        text[f] = [values[i] for i in ix]
    return fixed, text


def decode_records(body: Any) -> tuple[np.ndarray, dict[str, list[str]]]:
    """:func:`decode_record_columns` with the fixed columns as :data:`ENDPOINT_DTYPE` rows."""
    import numpy as np

    cols, text = decode_record_columns(body)
    fixed = np.zeros(len(cols["ep"]), _endpoint_dtype())
    for name, values in cols.items():
        fixed[name] = values
    return fixed, text


def probe_batch_body(
    agent: str, records: np.ndarray, eps: list[int] | None = None
) -> dict[str, Any]:
    from skh.records import PROBE_DTYPE

    body = {"agent": agent, **encode_columns(records, PROBE_DTYPE)}
    if eps is not None:
        body["eps"] = list(eps)
    return body


def probe_batch_body_packed(
    agent: str, packed: bytes, eps: list[int] | None = None
) -> dict[str, Any]:
    """:func:`probe_batch_body` of records packed as :data:`skh.layout.PROBE_STRUCT` rows (the
    engine's layout): the same columns, built without numpy."""
    if len(packed) % PROBE_STRUCT.size:
        raise ProtocolError(f"{len(packed)} bytes are not whole {PROBE_STRUCT.size}-byte records")
    n = len(packed) // PROBE_STRUCT.size
    columns = (
        zip(*PROBE_STRUCT.iter_unpack(packed), strict=True) if n else ((),) * len(PROBE_FIELDS)
    )
    cols = {
        name: struct.pack(f"<{n}{code}", *col)
        for (name, code, _), col in zip(PROBE_FIELDS, columns, strict=True)
    }
    body: dict[str, Any] = {"agent": agent, "n": n, "cols": cols}
    if eps is not None:
        body["eps"] = list(eps)
    return body


def counter_batch_body(agent: str, records: np.ndarray) -> dict[str, Any]:
    from skh.records import COUNTER_DTYPE

    return {"agent": agent, **encode_columns(records, COUNTER_DTYPE)}


def decode_probes(body: Mapping[str, Any]) -> np.ndarray:
    from skh.records import PROBE_DTYPE

    return decode_columns(body, PROBE_DTYPE)


def decode_counters(body: Mapping[str, Any]) -> np.ndarray:
    from skh.records import COUNTER_DTYPE

    return decode_columns(body, COUNTER_DTYPE)


def pack_pairs(pairs: np.ndarray) -> bytes:
    """An ``(n, 2)`` array of (src, dst) endpoint ids as raw little-endian uint32 bytes."""
    import numpy as np

    arr = np.asarray(pairs)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ProtocolError(f"pairs must have shape (n, 2), got {arr.shape}")
    return np.ascontiguousarray(arr, dtype="<u4").tobytes()


def unpack_pairs(raw: bytes) -> np.ndarray:
    import numpy as np

    if len(raw) % 8:
        raise ProtocolError(f"pairs: {len(raw)} bytes is not a multiple of 8")
    return np.frombuffer(raw, dtype="<u4").reshape(-1, 2).astype(np.uint32)
