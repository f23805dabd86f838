"""The harness's MCP server, spoken to by the official MCP client over streamable HTTP on
loopback, as an agent CLI speaks to it through the proxy (same ``Host``)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND

from firstrun.agents.cli.harness_mcp import HARNESS_HOST, HarnessMcp

pytestmark = pytest.mark.fast


def talk(server: HarnessMcp, conversation: Any) -> Any:
    async def main() -> Any:
        http = httpx2.AsyncClient(headers={"Host": f"{HARNESS_HOST}:{server.port}"})
        url = f"http://127.0.0.1:{server.port}{server.path}"
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            return await conversation(client)
    return anyio.run(main)


def test_the_server_offers_no_subscription_stream() -> None:
    # A listen stream is a response that never ends: its client's exit reaches the
    # server only when a keepalive write fails, and the server's exit waits for it.
    async def listen(client: Client) -> tuple[Any, int | None]:
        try:
            async with client.listen(tools_list_changed=True):
                return client.server_capabilities, None
        except MCPError as refused:
            return client.server_capabilities, refused.error.code

    with HarnessMcp() as server:
        server.bind(read_docs=lambda url: url, permit_bash=lambda command: None)
        capabilities, refused = talk(server, listen)
    assert refused == METHOD_NOT_FOUND
    assert capabilities.tools is not None and not capabilities.tools.list_changed


def test_the_tools_are_served() -> None:
    async def call(client: Client) -> tuple[list[str], str]:
        names = [t.name for t in (await client.list_tools()).tools]
        result = await client.call_tool("read_docs", {"url": "http://docs.example/"})
        return names, result.content[0].text

    with HarnessMcp() as server:
        server.bind(read_docs=lambda url: f"page {url}", permit_bash=lambda command: None)
        names, text = talk(server, call)
    assert names == ["read_docs", "approve", "pre_tool_use"] and text == "page http://docs.example/"
