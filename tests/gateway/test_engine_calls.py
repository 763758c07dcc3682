"""The call leg's client against a real socket server that answers as each test scripts it.

Black-box: what the server receives (requests, connections, disconnects) and what
the caller gets (answers, bodies, the failure types the upstream leg maps). Each test
runs on asyncio's event loop and on uvloop's, which ``autellix gateway`` runs on.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import ClientPayloadError, SocketTimeoutError

from autellix.gateway.engine_calls import ConnectFailed, EngineCalls, HeadTimeout, Timeouts

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


async def ok(writer: asyncio.StreamWriter, _request: bytes) -> bool:
    writer.write(OK)
    await writer.drain()
    return True


@pytest.mark.asyncio
async def test_calls_share_a_kept_alive_connection_and_carry_the_common_headers(serve) -> None:
    server = await serve(ok)
    calls = EngineCalls(headers={"X-Engine-Token": "secret"})
    for _ in range(3):
        answer = await calls.post(server.url, b'{"a":1}', {"X-Call": "c1"})
        assert (answer.status, answer.headers["Content-Type"], await answer.read()) == (
            200, "application/json", b'{"ok":true}')
        answer.release()
    await calls.close()
    assert server.connections == 1 and len(server.requests) == 3
    first = server.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nX-Engine-Token: secret\r\n" in first and b"\r\nX-Call: c1\r\n" in first
    assert first.endswith(b'\r\n\r\n{"a":1}')


@pytest.mark.asyncio
async def test_a_chunked_stream_arrives_piece_by_piece_and_its_connection_is_kept(serve) -> None:
    go_on = asyncio.Event()

    async def stream(writer: asyncio.StreamWriter, _request: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"6\r\ndata:1\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"6\r\ndata:2\r\n0\r\n\r\n")
        await writer.drain()
        return True

    server = await serve(stream)
    calls = EngineCalls()
    answer = await calls.post(server.url, b"{}", {}, Timeouts(head=5, read=5))
    chunks = answer.content.iter_any()
    assert await anext(chunks) == b"data:1"  # before the rest was sent
    go_on.set()
    assert b"".join([chunk async for chunk in chunks]) == b"data:2"
    answer.release()
    go_on.clear()
    again = await calls.post(server.url, b"{}", {})
    go_on.set()
    assert await again.read() == b"data:1data:2"
    again.release()
    await calls.close()
    assert server.connections == 1


@pytest.mark.asyncio
async def test_an_answer_that_ends_with_its_connection_is_read_whole_and_not_kept(serve) -> None:
    async def until_close(writer: asyncio.StreamWriter, _request: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"whole\":")
        await writer.drain()
        writer.write(b"true}")
        return False  # the server closes: the body's end

    server = await serve(until_close)
    calls = EngineCalls()
    for _ in range(2):
        answer = await calls.post(server.url, b"{}", {})
        assert await answer.read() == b'{"whole":true}'
        answer.release()
    await calls.close()
    assert server.connections == 2


@pytest.mark.asyncio
async def test_connection_close_is_honoured(serve) -> None:
    async def closing(writer: asyncio.StreamWriter, _request: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        return True  # the server would go on; the client must not

    server = await serve(closing)
    calls = EngineCalls()
    for _ in range(2):
        answer = await calls.post(server.url, b"{}", {})
        assert await answer.read() == b"ok"
        answer.release()
    await calls.close()
    assert server.connections == 2


@pytest.mark.asyncio
async def test_no_headers_in_time_is_a_head_timeout_and_the_connection_is_closed(serve) -> None:
    async def silent(_writer: asyncio.StreamWriter, _request: bytes) -> bool:
        await asyncio.sleep(30)
        return False

    server = await serve(silent)
    calls = EngineCalls()
    with pytest.raises(HeadTimeout):
        await calls.post(server.url, b"{}", {}, Timeouts(head=0.2))
    await calls.close()


@pytest.mark.asyncio
async def test_a_stream_silent_past_its_read_timeout_raises_from_its_reader(serve) -> None:
    async def stalls(writer: asyncio.StreamWriter, _request: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
        await writer.drain()
        await asyncio.sleep(30)
        return False

    server = await serve(stalls)
    calls = EngineCalls()
    answer = await calls.post(server.url, b"{}", {}, Timeouts(head=10, read=0.3))
    started = asyncio.get_running_loop().time()
    with pytest.raises(SocketTimeoutError):
        async for _ in answer.content.iter_any():
            pass
    assert asyncio.get_running_loop().time() - started < 5  # the body's bound, not the head's
    answer.release()
    await calls.close()


@pytest.mark.asyncio
async def test_the_total_bound_ends_a_stream_that_keeps_talking(serve) -> None:
    async def chatty(writer: asyncio.StreamWriter, _request: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):
            writer.write(b"1\r\n.\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        return False

    server = await serve(chatty)
    calls = EngineCalls()
    answer = await calls.post(server.url, b"{}", {}, Timeouts(head=5, read=1, total=0.5))
    with pytest.raises(TimeoutError):
        async for _ in answer.content.iter_any():
            pass
    answer.release()
    await calls.close()


@pytest.mark.asyncio
async def test_an_answer_left_before_its_end_closes_its_connection(serve) -> None:
    async def long_stream(writer: asyncio.StreamWriter, _request: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
        await writer.drain()
        return True  # more would come: the server reads on and sees the client leave

    server = await serve(long_stream)
    calls = EngineCalls()
    answer = await calls.post(server.url, b"{}", {})
    assert await anext(answer.content.iter_any()) == b"data:1"
    answer.release()
    for _ in range(50):
        if server.disconnects:
            break
        await asyncio.sleep(0.02)
    assert server.disconnects == 1  # the engine sees the client go and can abort the request
    await calls.close()


@pytest.mark.asyncio
async def test_a_body_cut_short_raises_from_its_reader(serve) -> None:
    async def cut(writer: asyncio.StreamWriter, _request: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial")
        await writer.drain()
        return False

    server = await serve(cut)
    calls = EngineCalls()
    answer = await calls.post(server.url, b"{}", {})
    with pytest.raises(ClientPayloadError):
        await answer.read()
    answer.release()
    await calls.close()


@pytest.mark.asyncio
async def test_an_idle_connection_past_the_keepalive_is_not_used_again(serve) -> None:
    server = await serve(ok)
    calls = EngineCalls(keepalive=0.1)
    for _ in range(2):
        answer = await calls.post(server.url, b"{}", {})
        await answer.read()
        answer.release()
        await asyncio.sleep(0.2)
    await calls.close()
    assert server.connections == 2


@pytest.mark.asyncio
async def test_nothing_listening_is_a_connect_failure() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    calls = EngineCalls()
    with pytest.raises(ConnectFailed):
        await calls.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {}, Timeouts(connect=2))
    await calls.close()


@pytest.mark.asyncio
async def test_a_header_that_would_split_the_request_is_refused(serve) -> None:
    server = await serve(ok)
    calls = EngineCalls()
    with pytest.raises(ValueError, match="split"):
        await calls.post(server.url, b"{}", {"X-Call": "a\r\nX-Injected: 1"})
    with pytest.raises(ValueError, match="split"):
        EngineCalls(headers={"X-Engine-Token": "t\n"})
    await calls.close()
    assert server.requests == []
