"""A local OTLP/HTTP sink for the harness's traced Narwhal: takes ``POST /v1/traces`` and
answers 200 without decoding (so it costs the shared host little), counting posts and bytes;
``GET /stats`` returns the counts. ``python -m benches.harness.otlp_sink`` prints where it
listens."""

from __future__ import annotations

import argparse
import asyncio
import json


class Sink:
    def __init__(self) -> None:
        self.posts = 0
        self.bytes = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ", 1)[0]
                length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith("content-length:")), 0)
                await reader.readexactly(length)
                if method == "POST":
                    self.posts += 1
                    self.bytes += length
                    body = b""
                else:
                    body = json.dumps({"posts": self.posts, "bytes": self.bytes}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%b" % (len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


async def main(host: str, port: int) -> None:
    sink = Sink()
    server = await asyncio.start_server(sink.serve, host, port)
    bound = server.sockets[0].getsockname()[1]
    print(f"otlp sink listening on http://{host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benches.harness.otlp_sink")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port))
