"""Raw TCP reference for bench/nat/netns.sh: what the shaped links carry without the collective.

    tcp_mesh.py ME_ADDR PORT BYTES ROUNDS PEER_ADDR...

Listens on ME_ADDR:PORT; each round, sends BYTES to every peer at once (one connection each,
all peers' streams at the same time) and receives BYTES from each, then prints "ok tcp"
and "seconds S" (from its first connection's start until it has sent and received everything).
With BYTES = E/2 and 3 peers a host sends 2(K-1)/K·E, what one all-reduce sends (K = 4). Rounds
begin together: each waits until it has heard from every peer in the round before.
Every wait is bounded (60 s).
"""
import socket
import sys
import threading
import time

me, port, size, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
peers = sys.argv[5:]
BUF = b"\0" * (1 << 20)
server = socket.create_server((me, port), backlog=16)
server.settimeout(60)


def send(addr):
    deadline = time.monotonic() + 60
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    left = size
    while left > 0:
        n = s.send(BUF[: min(left, len(BUF))])
        left -= n
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # the receiver closes once it has everything
    s.close()


def receive(conn):
    conn.settimeout(60)
    got = 0
    while got < size:
        b = conn.recv(1 << 20)
        if not b:
            break
        got += len(b)
    conn.close()


for r in range(rounds):
    t0 = time.monotonic()
    senders = [threading.Thread(target=send, args=(p,)) for p in peers]
    for t in senders:
        t.start()
    receivers = []
    for _ in peers:
        conn, _ = server.accept()
        t = threading.Thread(target=receive, args=(conn,))
        t.start()
        receivers.append(t)
    for t in senders + receivers:
        t.join(60)
    print(f"ok tcp\nseconds {time.monotonic() - t0:.4f}", flush=True)
    time.sleep(0.5)  # the next round: every host is done with this one (bounded pause)
