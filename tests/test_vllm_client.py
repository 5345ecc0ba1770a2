"""`VLLMServerClient` keeps one connection per thread open between requests, and reopens one the server closed."""

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from textenv.vllm.client import VLLMServerClient, VLLMServerError
from textenv.vllm.server import free_port


class KeepAliveServer(ThreadingHTTPServer):
    """Answers every POST with `{"echo": body}` over HTTP/1.1. With `close_after_answer`, it closes each
    connection right after answering without saying so (as a server whose keep-alive timeout ran out)."""

    daemon_threads = True

    def __init__(self, close_after_answer: bool = False, status: int = 200):
        super().__init__(("127.0.0.1", free_port()), EchoHandler)
        self.close_after_answer, self.status = close_after_answer, status
        self.connections = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.server.lock:
            self.server.requests += 1
        payload = {"echo": body} if self.server.status == 200 else {"error": {"message": "no such model"}}
        data = json.dumps(payload).encode()
        self.send_response(self.server.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        if self.server.close_after_answer:
            self.close_connection = True


@pytest.fixture()
def server():
    server = KeepAliveServer()
    yield server
    server.shutdown()


def test_one_thread_sends_all_its_requests_on_one_connection(server):
    client = VLLMServerClient(server.url)
    answers = [client.request("POST", "/v1/completions", {"n": n}) for n in range(5)]
    assert answers == [{"echo": {"n": n}} for n in range(5)]
    assert (server.requests, server.connections) == (5, 1)
    client.close()
    client.request("POST", "/v1/completions", {"n": 5})
    assert server.connections == 2


def test_each_thread_has_its_own_connection(server):
    client = VLLMServerClient(server.url)
    barrier = threading.Barrier(4)

    def send(n):
        barrier.wait()  # all four threads hold a connection at once
        return [client.request("POST", "/x", {"n": n, "i": i})["echo"] for i in range(3)]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, range(4)))
    assert answers == [[{"n": n, "i": i} for i in range(3)] for n in range(4)]
    assert (server.requests, server.connections) == (12, 4)


def test_a_connection_the_server_closed_is_reopened_without_a_retry(caplog):
    server = KeepAliveServer(close_after_answer=True)
    client = VLLMServerClient(server.url, max_retries=0)
    with caplog.at_level(logging.WARNING):
        answers = [client.request("POST", "/x", {"n": n}) for n in range(4)]
    assert answers == [{"echo": {"n": n}} for n in range(4)]
    assert server.requests == 4, "each request reached the server once"
    assert server.connections == 4 and "retry" not in caplog.text
    server.shutdown()


def test_a_refused_request_says_the_servers_message():
    server = KeepAliveServer(status=404)
    with pytest.raises(VLLMServerError, match=r"refused POST /x \(404\): no such model"):
        VLLMServerClient(server.url).request("POST", "/x", {})
    server.shutdown()
