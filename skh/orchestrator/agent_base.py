"""The controller session both agent roles share: a DEALER (its routing id is the controller's
choice; the agent's CURVE key is what names it), registration with retries, heartbeats,
re-registration when the controller restarted (new epoch) or forgot the agent, and commands run
by pluggable handlers off the loop thread with replies, de-duplicated by command id so a
controller retry never runs a command twice. Every command's arguments are checked again here
(:mod:`skh.orchestrator.commands`) and at most ``_MAX_RUNNING`` run or wait at once."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import zmq

from skh.errors import ProtocolError, SkhError
from skh.orchestrator.commands import check_command
from skh.orchestrator.config import AgentConfig
from skh.orchestrator.daemon import make_socket
from skh.orchestrator.sdnotify import Notifier
from skh.orchestrator.security import SecurityConfig
from skh.wire import DEFAULT_MAX_FRAME_BYTES, Codec, Envelope, MsgType

__all__ = ["AgentBase", "CommandHandler"]

log = logging.getLogger(__name__)

#: a command handler takes the command's ``args`` and returns a plain (msgpack-able) result
CommandHandler = Callable[[dict[str, Any]], Any]
_DONE_CACHE = 256
_MAX_RUNNING = 64  # commands running or queued for the pool; more are answered "busy"
#: how long a loop that sleeps until its next timer waits at most while a command runs in the
#: pool (its answer goes out on the loop's next turn)
COMMAND_POLL_S = 0.05


class AgentBase:
    role = ""
    #: commands run side by side (a handler may wait on the network for a second)
    command_workers = 2

    def __init__(
        self, cfg: AgentConfig, security: SecurityConfig, *, ctx: zmq.Context | None = None
    ) -> None:
        self.cfg = cfg
        self.name = cfg.agent_name
        self.codec = Codec()
        self.counters: Counter[str] = Counter()
        self.security = security
        self._ctx = ctx or zmq.Context.instance()
        self.dealer = make_socket(
            self._ctx, zmq.DEALER, hwm=cfg.hwm, max_msg_bytes=DEFAULT_MAX_FRAME_BYTES
        )
        security.client(self.dealer)
        self.dealer.connect(cfg.controller)
        self.epoch = ""  # controller epoch we are registered with ("" = not registered)
        self.heartbeat_interval_s = 2.0
        self._seq = 0
        self._next_register = 0.0
        self._next_heartbeat = 0.0
        self.handlers: dict[str, CommandHandler] = {"stats": lambda _args: self.stats()}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.command_workers, thread_name_prefix="skh-cmd"
        )
        self._running: dict[str, concurrent.futures.Future[Any]] = {}
        self._done: OrderedDict[str, bytes] = OrderedDict()
        self.notifier = Notifier()

    # -- to be provided by a role --------------------------------------------------------------
    def register_body(self) -> dict[str, Any]:
        raise NotImplementedError

    def on_registered(self, env: Envelope) -> None:
        raise NotImplementedError

    def on_message(self, env: Envelope) -> None:
        """Anything else the controller sends on the DEALER (e.g. ACKs, snapshots)."""

    def stats(self) -> dict[str, Any]:
        return {
            "agent": self.name,
            "counters": dict(self.counters),
            "rejected": dict(self.codec.rejected),
        }

    # -- plumbing ------------------------------------------------------------------------------
    def send(self, mtype: MsgType, body: dict[str, Any]) -> int:
        self._seq += 1
        try:
            self.dealer.send(self.codec.encode(mtype, self.name, self._seq, body), zmq.NOBLOCK)
        except zmq.Again:
            self.counters["controller_send_dropped"] += 1
        return self._seq

    def session_tick(self, now: float) -> None:
        """Register (with retries) until registered, then heartbeat."""
        if not self.epoch:
            if now >= self._next_register:
                self._next_register = now + self.cfg.request_timeout_s
                self.send(MsgType.REGISTER, self.register_body())
                self.counters["register_sent"] += 1
        elif now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_interval_s
            self.send(MsgType.HEARTBEAT, self.heartbeat_body())
        self._finish_commands()

    def session_due(self, now: float) -> float:
        """When :meth:`session_tick` next has work (monotonic s): a register retry or a
        heartbeat, sooner while a command's answer is pending."""
        due = self._next_heartbeat if self.epoch else self._next_register
        return min(due, now + COMMAND_POLL_S) if self._running else due

    def heartbeat_body(self) -> dict[str, Any]:
        return {"agent": self.name, "epoch": self.epoch, "jobs": {}}

    def reregister(self, why: str) -> None:
        if self.epoch:
            log.warning("%s: re-registering (%s)", self.name, why)
            self.counters["reregistrations"] += 1
        self.epoch = ""
        self._next_register = 0.0

    def handle_dealer(self) -> None:
        while True:
            try:
                raw = self.dealer.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                env = self.codec.decode(raw)
                self._handle(env)
            except (SkhError, KeyError, TypeError, ValueError, AttributeError) as exc:
                self.counters["bad_controller_messages"] += 1
                log.debug("%s: bad message from controller: %r", self.name, exc)

    def _handle(self, env: Envelope) -> None:
        if env.type is MsgType.REGISTER_ACK:
            interval = float(env.body["heartbeat_interval_s"])
            if not 0.01 <= interval <= 3600:
                raise ProtocolError(f"heartbeat interval {interval} out of range")
            self.on_registered(env)  # validates the rest before we count as registered
            self.epoch = env.body["epoch"]
            self.heartbeat_interval_s = interval
            self._next_heartbeat = time.monotonic() + interval
            self.counters["registered"] += 1
            log.info("%s registered with controller epoch %s", self.name, self.epoch)
        elif env.type is MsgType.HEARTBEAT_ACK:
            if not env.body["known"] or env.body["epoch"] != self.epoch:
                self.reregister("controller restarted or lost us")
            else:
                self.on_heartbeat_ack(env)
        elif env.type is MsgType.COMMAND:
            self._start_command(env.body)
        else:
            self.on_message(env)

    def on_heartbeat_ack(self, env: Envelope) -> None:
        """Registered and known: a role may compare job versions here."""

    def check_args(self, name: str, args: Any) -> dict[str, Any]:
        """A command's arguments as this agent accepts them (a role may also check them against
        what it knows of its host); raises ProtocolError."""
        return check_command(name, args, self.role)

    # -- commands ------------------------------------------------------------------------------
    def _start_command(self, b: dict[str, Any]) -> None:
        cmd_id = b["cmd_id"]
        if cmd_id in self._done:  # a retry of a finished command: resend the answer
            self.dealer.send(self._done[cmd_id], zmq.NOBLOCK)
            return
        if cmd_id in self._running:
            return
        handler = self.handlers.get(b["name"])
        try:
            if handler is None:
                raise ProtocolError(f"unknown command {b['name'][:64]!r}")
            args = self.check_args(b["name"], b["args"])
        except ProtocolError as exc:
            self.counters["commands_refused"] += 1
            self._reply(cmd_id, {"cmd_id": cmd_id, "ok": False, "error": str(exc)})
            return
        if len(self._running) >= _MAX_RUNNING:
            self.counters["commands_dropped"] += 1
            self._reply(cmd_id, {"cmd_id": cmd_id, "ok": False, "error": "agent busy"}, keep=False)
            return
        self.counters["commands"] += 1
        self._running[cmd_id] = self._pool.submit(handler, args)

    def _finish_commands(self) -> None:
        for cmd_id, fut in list(self._running.items()):
            if not fut.done():
                continue
            del self._running[cmd_id]
            try:
                body = {"cmd_id": cmd_id, "ok": True, "result": fut.result()}
            except Exception as exc:  # a handler failure is the command's answer, not a crash
                body = {"cmd_id": cmd_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            self._reply(cmd_id, body)

    def _reply(self, cmd_id: str, body: dict[str, Any], *, keep: bool = True) -> None:
        self._seq += 1
        try:
            frame = self.codec.encode(MsgType.COMMAND_REPLY, self.name, self._seq, body)
        except ProtocolError as exc:
            frame = self.codec.encode(
                MsgType.COMMAND_REPLY,
                self.name,
                self._seq,
                {"cmd_id": cmd_id, "ok": False, "error": f"unencodable result: {exc}"},
            )
        if keep:  # a "busy" answer is not kept: the controller's resend may find room
            self._done[cmd_id] = frame
            while len(self._done) > _DONE_CACHE:
                self._done.popitem(last=False)
        try:
            self.dealer.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self.counters["controller_send_dropped"] += 1

    def close_base(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.dealer.close(linger=500)  # a last DEREGISTER or command reply may still be queued
        self.notifier.close()

    def run(self, stop: threading.Event) -> None:
        raise NotImplementedError
