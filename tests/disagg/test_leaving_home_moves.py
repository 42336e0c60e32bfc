"""A conversation whose home leaves mid-conversation (scale-in, SIGTERM's path) resumes on a
survivor with nothing of its prefix recomputed: a real router (pins in the shared Redis,
`migrate_kv`) in front of real ranks on loopback, serving a tiny random Llama (full attention:
a turn's output blocks are reusable, as on the 8b) saved by transformers.

Conversation `a`: turn 1 (150 tokens, 20 output) runs on `home`, which computes 169 tokens:
10 full blocks of 16, so its turn 2 (the turn resent with 37 new tokens) reuses 160 tokens on
a rank that has them (the retained turn alone, its prompt end, holds 9). Conversation `b`
runs a long turn on `home` when the drain starts.

- Pulled from the leaving rank: no shared disk. While `b`'s turn keeps `home` leaving (the
  router heard it, new work refused), `a`'s turn 2 moves to the survivor, which the router
  tells where its KV is; the survivor pulls the 10 blocks from `home`.
- Lingering: with no stream left, a leaving home given a linger still serves the pull.
- From the disk: both ranks share a disk folder and `home` is gone before any turn 2. The
  drain wrote where `a`'s finished turn ends (its output block included) and, once `b`'s
  running turn finished, where that one ends; each block once.

Greedy tokens of every turn 2 equal the same prompt computed from scratch.
"""

from __future__ import annotations

import random
import threading
import time
import uuid

import grpc
import pytest
import redis
import torch
from disagg_kit import (
    CONFIG,
    metric,
    reference_tokens,
    router_generate,
    start_rank,
    tokens,
    wait_until,
)
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.server import RouterConfig, create_server

REDIS_URL = "redis://127.0.0.1:6379/0"
PAGE = CONFIG.page_size
A_OUTPUT = 20
A_RESUMED = (150 + A_OUTPUT - 1) // PAGE * PAGE  # 160: the output's block too
B_PROMPT, B_OUTPUT = 20, 1000
B_RESUMED = (B_PROMPT + B_OUTPUT - 1) // PAGE * PAGE
MOVED = "kvfleet_engine_moved_turns_total"
FLUSHED = "kvfleet_engine_drain_flushed_blocks_total"
LINGER_SECONDS = 8.0


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    """A tiny random Llama checkpoint (`model_path`)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.08,  # peaked logits: greedy choices far from ties
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    path = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture
def router():
    prefix = f"test-leaving-{uuid.uuid4().hex[:10]}"
    config = RouterConfig(
        admission=AdmissionConfig(max_wait_seconds=0.3),
        redis_url=REDIS_URL,
        redis_prefix=prefix,
        migrate_kv=True,
    )
    server, port = create_server("127.0.0.1:0", config)
    yield server, f"127.0.0.1:{port}"
    server.stop(grace=0)
    client = redis.Redis.from_url(REDIS_URL)
    RedisStore(client, prefix).clear()
    client.close()


def _first_turn_of_a(address: str, seed: int) -> list[int]:
    """Turn 1 of `a` on `home`; turn 2's prompt."""
    rng = random.Random(seed)
    first = [rng.randrange(256) for _ in range(150)]
    responses = router_generate(address, "a", first, max_tokens=A_OUTPUT, rank_id="home")
    assert responses[0].rank_id == "home"
    return first + tokens(responses) + [rng.randrange(256) for _ in range(37)]


class LongTurn:
    """`b`'s turn on `home` in a thread; `started` once its first token came."""

    def __init__(self, address: str, seed: int) -> None:
        rng = random.Random(seed)
        self.prompt = [rng.randrange(256) for _ in range(B_PROMPT)]
        self.started = threading.Event()
        self.responses: list = []
        self.error: grpc.RpcError | None = None
        self._call = None
        self._thread = threading.Thread(target=self._run, args=(address,))
        self._thread.start()

    def _run(self, address: str) -> None:
        request = router_pb2.GenerateRequest(
            conversation_id="b",
            prompt_token_ids=common_pb2.TokenIds(ids=self.prompt),
            sampling=common_pb2.SamplingParams(temperature=0.0),
            max_tokens=B_OUTPUT,
            rank_id="home",
        )
        with grpc.insecure_channel(address) as channel:
            self._call = router_pb2_grpc.RouterStub(channel).Generate(request, timeout=120)
            try:
                for response in self._call:
                    self.responses.append(response)
                    self.started.set()
            except grpc.RpcError as error:
                self.error = error
        self.started.set()

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()

    def join(self) -> None:
        self._thread.join(timeout=120)
        assert not self._thread.is_alive()


def test_a_moved_conversation_pulls_its_prefix_from_the_leaving_home(router, llama):
    """Refusing pulls once leaving, or not naming a leaving home, recomputes all 160 tokens."""
    server, address = router
    ranks = (start_rank("both", address, name, model_path=llama) for name in ("home", "survivor"))
    home, survivor = ranks
    drain = threading.Thread(target=home.drain_and_stop, args=(60.0,))
    long_turn = None
    try:
        second = _first_turn_of_a(address, 3)
        long_turn = LongTurn(address, 4)
        assert long_turn.started.wait(60) and long_turn.error is None
        drain.start()
        assert home.link.leaving_heard.wait(30)
        responses = router_generate(address, "a", second)
        assert drain.is_alive() and not long_turn.responses[-1].chunk.finished  # still leaving
        assert (responses[0].rank_id, responses[0].placement) == ("survivor", "new")
        assert responses[-1].chunk.usage.cached_tokens == A_RESUMED
        assert metric(survivor, MOVED, outcome="pulled") == 1
        assert metric(home, "kvfleet_engine_moved_blocks_total", direction="sent") > 0
        assert server.metrics.registry.get_sample_value("kvfleet_router_kv_moves_total") == 1
        assert tokens(responses) == reference_tokens(second, model_path=llama)
        survivor.core.check_integrity()
    finally:
        if long_turn is not None:
            long_turn.cancel()
            long_turn.join()
        if drain.ident is not None:
            drain.join(timeout=60)
        for rank in (home, survivor):
            rank.stop(grace=0)


def test_a_lingering_leaving_home_serves_pulls_after_its_last_stream(router, llama):
    """Without the linger the home is gone once its streams end: the pull fails, and without a
    shared disk the moved turn recomputes its 160 tokens."""
    _, address = router
    ranks = (start_rank("both", address, name, model_path=llama) for name in ("home", "survivor"))
    home, survivor = ranks
    drain = threading.Thread(target=home.drain_and_stop, args=(60.0, 0.05, LINGER_SECONDS))
    try:
        second = _first_turn_of_a(address, 8)
        drain.start()
        assert home.link.leaving_heard.wait(30)
        wait_until(lambda: home.engine_servicer.leaving.is_set())
        time.sleep(0.5)  # past the drain's last poll: nothing runs here any more
        responses = router_generate(address, "a", second)
        assert drain.is_alive()  # lingering
        assert responses[0].rank_id == "survivor"
        assert responses[-1].chunk.usage.cached_tokens == A_RESUMED
        assert metric(survivor, MOVED, outcome="pulled") == 1
        assert tokens(responses) == reference_tokens(second, model_path=llama)
    finally:
        if drain.ident is not None:
            drain.join(timeout=60)
        for rank in (home, survivor):
            rank.stop(grace=0)


def _block_files(folder) -> int:
    return sum(1 for _ in folder.rglob("*.kvb"))


def test_a_gone_homes_conversations_resume_from_the_disk_running_turns_too(router, llama, tmp_path):
    """Without the write at a turn's end, `b`'s output blocks (and `a`'s last block) would be
    recomputed on the survivor."""
    _, address = router
    disk = {"disk_tier_dir": str(tmp_path), "disk_kv_pages": 512, "model_path": llama}
    home, survivor = (start_rank("both", address, name, **disk) for name in ("home", "survivor"))
    try:
        second_a = _first_turn_of_a(address, 5)
        long_turn = LongTurn(address, 6)
        assert long_turn.started.wait(60) and long_turn.error is None
        home.drain_and_stop(60.0)  # waits for `b`'s running turn, then stops
        long_turn.join()
        assert long_turn.error is None and long_turn.responses[-1].chunk.finished
        output_b = tokens(long_turn.responses)
        assert len(output_b) == B_OUTPUT
        # Each block once: the drain's count is the files in the folder.
        assert metric(home, FLUSHED) == _block_files(tmp_path)
        rng = random.Random(7)
        second_b = long_turn.prompt + output_b + [rng.randrange(256) for _ in range(10)]
        for conversation, prompt, resumed in (
            ("a", second_a, A_RESUMED),
            ("b", second_b, B_RESUMED),
        ):
            responses = router_generate(address, conversation, prompt)
            assert responses[0].rank_id == "survivor"
            assert responses[-1].chunk.usage.cached_tokens == resumed, conversation
            assert tokens(responses) == reference_tokens(prompt, model_path=llama)
        assert metric(survivor, MOVED, outcome="pulled") == 0  # the home is gone
        survivor.core.check_integrity()
    finally:
        for rank in (home, survivor):
            rank.stop(grace=0)
