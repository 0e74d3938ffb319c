"""Streaming clients for the alrkvd Triton server: gRPC (bidirectional stream) and HTTP (SSE).

    from client import complete, stream
    for chunk in stream("Hello", url="127.0.0.1:8001", protocol="grpc", max_tokens=32):
        print(chunk.text, end="", flush=True)
    result = complete("Hello", url="127.0.0.1:8000", protocol="http", max_tokens=32, temperature=0)
    print(result.text, result.ttft_s, result.mean_itl_s, result.num_output_tokens)

Leaving a `stream` loop early cancels the request on the server (gRPC: stream cancel;
HTTP: the connection is closed).
"""

from client.api import Chunk, Completion, ServerError, complete, stream

__all__ = ["Chunk", "Completion", "ServerError", "complete", "stream"]
