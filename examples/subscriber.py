#!/usr/bin/env python3
"""Follow skh's alert bus with pyzmq and msgpack alone (the contract: docs/alerts.md).

Replays the log from the last sequence number it handled (kept in --state), then follows live
alerts, replaying again whenever a sequence number is skipped. One JSON line per alert on stdout.
  python3 subscriber.py --alerts tcp://analyzer:5561 --replay tcp://analyzer:5562 \
      --server-key server.key --client-key me.key_secret
"""

import argparse
import json
import os
import sys

import msgpack
import zmq
import zmq.auth

p = argparse.ArgumentParser()
p.add_argument("--alerts", required=True, help="the analyzer's PUB address")
p.add_argument("--replay", required=True, help="the analyzer's REP address")
p.add_argument("--server-key", help="the analyzer's public certificate (CURVE)")
p.add_argument("--client-key", help="this subscriber's secret certificate (CURVE)")
p.add_argument("--state", default="subscriber.seq", help="last sequence number handled")
p.add_argument("--idle-exit", type=float, help="exit after this many seconds without an alert")
args = p.parse_args()
ctx = zmq.Context()
last = int(open(args.state).read()) if os.path.exists(args.state) else 0


def connect(kind, addr):
    s = ctx.socket(kind)
    s.linger = 0
    if args.server_key:  # CURVE: the server's public key, our own key pair
        s.curve_serverkey = zmq.auth.load_certificate(args.server_key)[0]
        s.curve_publickey, s.curve_secretkey = zmq.auth.load_certificate(args.client_key)
    if kind == zmq.SUB:
        s.subscribe(b"alert\0")
    s.connect(addr)
    return s


def body_of(frame, want):
    env = msgpack.unpackb(frame)
    if env["v"] != 1 or env["type"] != want:
        sys.exit(f"unexpected message: {env}")
    return env["body"]


def handle(rec):  # print first, then remember: a crash in between repeats one alert, loses none
    global last
    print(json.dumps(rec), flush=True)
    last = rec["seq"]
    with open(args.state + ".tmp", "w") as f:
        f.write(str(last))
    os.replace(args.state + ".tmp", args.state)


def replay():  # page by page until the log's end
    req = connect(zmq.REQ, args.replay)
    while True:
        req.send(
            msgpack.packb(
                {"v": 1, "type": "replay", "sender": "example", "seq": 0, "body": {"since": last}}
            )
        )
        if not req.poll(5000):
            sys.exit("no replay answer from the analyzer")
        page = body_of(req.recv(), "replay_reply")
        for rec in page["alerts"]:
            if rec["seq"] > last:
                handle(rec)
        if not page["alerts"] or last >= page["last_seq"]:
            return req.close()


sub = connect(zmq.SUB, args.alerts)  # subscribe before replaying: nothing falls in between
replay()
while sub.poll(None if args.idle_exit is None else args.idle_exit * 1000):
    rec = body_of(sub.recv_multipart()[1], "alert")
    if rec["seq"] > last + 1:
        replay()  # a gap: the log has what we missed
    elif rec["seq"] == last + 1:
        handle(rec)
