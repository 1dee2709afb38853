"""HTTP/2 floods against corral: rapid reset and CONTINUATION.

Run by tests/connections.rs with CORRAL_PYTHON. Usage: h2_flood.py HOST PORT MODE COUNT, MODE being
`rapid-reset` (COUNT streams, each HEADERS then RST_STREAM at once) or `continuation` (one HEADERS
without END_HEADERS, then up to COUNT CONTINUATION frames of 16 KiB). Prints one JSON line:
frames sent, whether the server sent GOAWAY, whether it closed the connection.
"""
import json
import socket
import struct
import sys

import h2.config
import h2.connection
import h2.events


def read_until_closed(sock, conn, seconds):
    sock.settimeout(seconds)
    goaway = closed = False
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                closed = True
                break
            try:
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        goaway = True
            except Exception:
                pass
    except socket.timeout:
        pass
    except OSError:
        closed = True
    return goaway, closed


def rapid_reset(sock, count):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    headers = [(":method", "GET"), (":path", "/health"), (":scheme", "http"), (":authority", "x")]
    sent = 0
    try:
        for _ in range(count):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, headers, end_stream=True)
            conn.reset_stream(sid)
            sock.sendall(conn.data_to_send())
            sent += 1
    except (OSError, h2.exceptions.ProtocolError):
        pass
    return sent, conn


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def continuation(sock, count):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    # a literal header without indexing, name "x-flood", value 16000 bytes... split in frames
    first = b"\x82\x84\x86"  # :method GET, :path /, :scheme http (static table)
    sock.sendall(frame(0x1, 0x1, 1, first))  # HEADERS, END_STREAM, no END_HEADERS
    chunk = b"\x00\x07x-flood\x7f" + b"\xff\x7c" + b"a" * (16384 - 12)
    chunk = chunk[:16384]
    sent = 0
    try:
        for _ in range(count):
            sock.sendall(frame(0x9, 0x0, 1, chunk))
            sent += 1
    except OSError:
        pass
    return sent, conn


def main():
    host, port, mode, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    sock = socket.create_connection((host, port))
    sent, conn = (rapid_reset if mode == "rapid-reset" else continuation)(sock, count)
    goaway, closed = read_until_closed(sock, conn, 5)
    print(json.dumps({"mode": mode, "sent": sent, "goaway": goaway, "closed": closed}))


if __name__ == "__main__":
    main()
