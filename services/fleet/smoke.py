"""The `kvfleet up --smoke` check: a two-turn conversation through gRPC and through HTTP."""

from __future__ import annotations

import uuid

import grpc
import httpx

from ...proto import common_pb2, router_pb2, router_pb2_grpc

QUESTION = "Hello, fleet. Please list three prime numbers and explain why they are prime. "
FOLLOW_UP = "Now add the next two primes to the list. "
MAX_TOKENS = 12


def _grpc_turn(stub, conversation: str, prompt: list[int]) -> tuple[list[int], str, int, str]:
    tokens, text, cached, rank = [], [], 0, ""
    request = router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=prompt),
        sampling=common_pb2.SamplingParams(temperature=0.0),
        max_tokens=MAX_TOKENS,
    )
    for response in stub.Generate(request, timeout=60):
        rank = response.rank_id or rank
        tokens += response.chunk.token_ids
        text.append(response.chunk.text)
        if response.chunk.HasField("usage"):
            cached = response.chunk.usage.cached_tokens
    return tokens, "".join(text), cached, rank


def _http_turn(client: httpx.Client, conversation: str, messages: list[dict]) -> tuple[str, int]:
    reply = client.post(
        "/chat/completions",
        json={
            "model": "kvfleet",
            "messages": messages,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        },
        headers={"X-Conversation-Id": conversation},
    )
    reply.raise_for_status()
    body = reply.json()
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    return body["choices"][0]["message"]["content"], cached


def run_smoke(router_address: str, http_base_url: str) -> bool:
    """Two turns per API; True when both second turns reused cached prompt tokens."""
    ok = True
    with grpc.insecure_channel(router_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        conversation = f"smoke-grpc-{uuid.uuid4().hex[:8]}"
        # Turn 2 resends turn 1's prompt and answer as token ids, then a follow-up.
        prompt = list(QUESTION.encode())
        output, answer, cached, rank = _grpc_turn(stub, conversation, prompt)
        print(f"grpc turn 1 on {rank}: cached_tokens={cached} answer={answer!r}", flush=True)
        prompt2 = prompt + output + list(FOLLOW_UP.encode())
        _, answer2, cached2, rank2 = _grpc_turn(stub, conversation, prompt2)
        print(f"grpc turn 2 on {rank2}: cached_tokens={cached2} answer={answer2!r}", flush=True)
        ok &= cached2 > 0
    with httpx.Client(base_url=http_base_url, timeout=60) as client:
        conversation = f"smoke-http-{uuid.uuid4().hex[:8]}"
        messages = [{"role": "user", "content": QUESTION}]
        answer, cached = _http_turn(client, conversation, messages)
        print(f"http turn 1: cached_tokens={cached} answer={answer!r}", flush=True)
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": FOLLOW_UP},
        ]
        answer2, cached2 = _http_turn(client, conversation, messages)
        print(f"http turn 2: cached_tokens={cached2} answer={answer2!r}", flush=True)
        ok &= cached2 > 0
    print("smoke: ok" if ok else "smoke: FAILED (a second turn reused nothing)", flush=True)
    return ok
