"""The admission store in Redis, shared by every router replica (see `redis_lua` for keys)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis

from .model import RankInfo, RankLoad, RankSlots, Role
from .redis_connect import RedisSettings, connect
from .redis_lua import (
    CLEAR_OWNER,
    HEARTBEAT,
    REAP_RESERVATIONS,
    RELEASE,
    REMOVE_RANK,
    RENEW_LEASE,
    RESYNC_RANK,
    SNAPSHOT,
    TRY_ADMIT,
    WRITE_BACK_RESERVATIONS,
)
from .reservation_order import WritebackPlan
from .store import RankRecord, StoreIntegrityError


class LeaseLost(redis.RedisError):
    """This replica's lease is gone from Redis (Redis restarted empty, or the lease lapsed and
    its reservations were reaped): Redis no longer counts what it holds, so it must write its
    state back before it admits against Redis again (the failover store treats it as an outage).
    """


class RedisStore:
    """AdmissionStore over Redis. `owner` names this router in reservation fields.

    With `lease_ms` set (the router's lease, replica_lease.py), snapshots, admissions and pin
    reads check that this replica's lease is still in Redis, and raise LeaseLost when it is not.
    """

    def __init__(self, client: redis.Redis, prefix: str = "kvfleet", owner: str = "router") -> None:
        if "|" in owner:
            raise ValueError(f"owner: {owner!r} must not contain '|'")
        self.client = client
        self.prefix = prefix
        self.owner = owner
        self._ranks_key = f"{prefix}:ranks"
        self._hb_key = f"{prefix}:hb"
        self._try_admit = client.register_script(TRY_ADMIT)
        self._snapshot = client.register_script(SNAPSHOT)
        self._heartbeat = client.register_script(HEARTBEAT)
        self._remove_rank = client.register_script(REMOVE_RANK)
        self._release = client.register_script(RELEASE)
        self._write_back = client.register_script(WRITE_BACK_RESERVATIONS)
        self._resync_rank = client.register_script(RESYNC_RANK)
        self._renew_lease = client.register_script(RENEW_LEASE)
        self._reap = client.register_script(REAP_RESERVATIONS)
        self._clear_owner = client.register_script(CLEAR_OWNER)
        self._replicas_key = f"{prefix}:replicas"
        self.lease_ms = 0  # 0: no lease (tests, tools); set by ReplicaLease

    @classmethod
    def from_url(
        cls, url: str, prefix: str = "kvfleet", owner: str = "router", timeout: float = 1.0
    ) -> RedisStore:
        """Connect with short timeouts, so an outage is noticed, not waited on."""
        return cls(connect(RedisSettings(url=url), timeout), prefix, owner)

    def _res_key(self, rank_id: str) -> str:
        return f"{self.prefix}:res:{rank_id}"

    def _pin_key(self, conversation_id: str) -> str:
        return f"{self.prefix}:pin:{conversation_id}"

    def _rank_pins_key(self, rank_id: str) -> str:
        return f"{self.prefix}:rank_pins:{rank_id}"

    def _field(self, request_id: str) -> str:
        return f"{self.owner}|{request_id}"

    def register_rank(self, info: RankInfo, now: float) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self._ranks_key, info.rank_id, _info_json(info))
        pipe.hset(self._hb_key, info.rank_id, _heartbeat_json(now, RankLoad(info.max_batch_size)))
        pipe.execute()

    def heartbeat(self, rank_id: str, load: RankLoad, now: float) -> bool:
        keys = [self._ranks_key, self._hb_key]
        return bool(self._heartbeat(keys=keys, args=[rank_id, _heartbeat_json(now, load)]))

    def remove_rank(self, rank_id: str) -> int:
        keys = [self._ranks_key, self._hb_key, self._res_key(rank_id), self._rank_pins_key(rank_id)]
        return int(self._remove_rank(keys=keys, args=[rank_id, self._pin_key("")]))

    def snapshot(self) -> dict[str, tuple[RankSlots, float]]:
        keys = [self._ranks_key, self._lease_key(self.owner)]
        flat = self._snapshot(keys=keys, args=[self.prefix, "1" if self.lease_ms else "0"])
        if flat == -2:
            raise LeaseLost(f"replica {self.owner}: lease gone from redis (snapshot)")
        out = {}
        for i in range(0, len(flat), 4):
            rank_id, info_json, used, hb_json = flat[i : i + 4]
            info = _info_from_json(info_json)
            last_heartbeat, load = _heartbeat_from_json(hb_json)
            out[rank_id] = (RankSlots(info, int(used), load), last_heartbeat)
        return out

    def get_pins(self, conversation_ids: Iterable[str], now: float) -> dict[str, str]:
        conversations = list(conversation_ids)
        if not conversations:
            return {}
        if self.lease_ms:
            pipe = self.client.pipeline(transaction=True)
            pipe.exists(self._lease_key(self.owner))
            pipe.mget([self._pin_key(c) for c in conversations])
            held, values = pipe.execute()
            if not held:
                raise LeaseLost(f"replica {self.owner}: lease gone from redis (reading pins)")
        else:
            values = self.client.mget([self._pin_key(c) for c in conversations])
        return {conv: rank for conv, rank in zip(conversations, values, strict=True) if rank}

    def try_admit(
        self,
        rank_id: str,
        request_id: str,
        slots: int,
        conversation_id: str,
        pin_ttl: float,
        now: float,
        seq: int = 0,
    ) -> bool:
        """`seq`: this change's number (reservation_order.py); 0 for callers that never write
        back a snapshot."""
        keys = [
            self._ranks_key,
            self._res_key(rank_id),
            self._pin_key(conversation_id),
            self._rank_pins_key(rank_id),
            self._seq_key(),
            self._lease_key(self.owner),
        ]
        args = [
            rank_id,
            self._field(request_id),
            slots,
            conversation_id,
            max(1, int(pin_ttl * 1000)),
            repr(now + pin_ttl),
            repr(now),
            seq,
            "1" if self.lease_ms else "0",
        ]
        admitted = int(self._try_admit(keys=keys, args=args))
        if admitted == -2:
            raise LeaseLost(f"replica {self.owner}: lease gone from redis (admitting)")
        return admitted == 1

    def release(self, rank_id: str, request_id: str, seq: int = 0) -> None:
        keys = [self._res_key(rank_id), self._seq_key()]
        self._release(keys=keys, args=[self._field(request_id), seq])

    def expire_pins(self, now: float) -> int:
        """Trim expired conversations from every rank's rank_pins (the pins expire by TTL)."""
        ranks = self.client.hkeys(self._ranks_key)
        pipe = self.client.pipeline(transaction=False)
        for rank_id in ranks:
            pipe.zremrangebyscore(self._rank_pins_key(rank_id), "-inf", f"({now!r}")
        return sum(pipe.execute())

    def ping(self) -> bool:
        """True when Redis answers."""
        return bool(self.client.ping())

    def resync(
        self,
        ranks: dict[str, RankRecord],
        pins: dict[str, tuple[str, float]],
        plan: WritebackPlan,
        now: float,
    ) -> bool:
        """Write back what this router kept while Redis was away.

        Ranks are re-registered where Redis has none, heartbeats written only where newer than
        Redis's (a replica's stale view of a rank that heartbeats elsewhere must not make it
        look silent), pins set only where Redis has none (the first replica back wins, so
        replicas agree), and this router's reservations replace its old ones (False when the
        plan was refused as stale: take a new one and write it with `write_back`).
        """
        pipe = self.client.pipeline(transaction=False)
        for record in ranks.values():
            self._resync_rank(
                keys=[self._ranks_key, self._hb_key],
                args=[
                    record.info.rank_id,
                    _info_json(record.info),
                    _heartbeat_json(record.last_heartbeat, record.load),
                    repr(record.last_heartbeat),
                ],
                client=pipe,
            )
        for conv, (rank_id, expires_at) in pins.items():
            ttl_ms = int((expires_at - now) * 1000)
            if ttl_ms > 0 and rank_id in ranks:
                pipe.set(self._pin_key(conv), rank_id, px=ttl_ms, nx=True)
                pipe.zadd(self._rank_pins_key(rank_id), {conv: expires_at})
        pipe.execute()
        return self.write_back(plan)

    def write_back(self, plan: WritebackPlan) -> bool:
        """Make this router's reservations on every registered rank exactly the plan's and take
        its lease (if it has one), in one step; False (nothing written) when a change newer than
        the plan reached Redis."""
        keep = [self._field(request_id) for request_id in plan.in_flight]
        args: list[str | int] = [self.prefix, f"{self.owner}|", plan.seq, self.lease_ms]
        args += [self.owner, len(keep), *keep]
        for rank_id, held in plan.held.items():
            for request_id, slots in held.items():
                args += [rank_id, self._field(request_id), slots]
        keys = [self._ranks_key, self._seq_key(), self._lease_key(self.owner), self._replicas_key]
        return int(self._write_back(keys=keys, args=args)) == 1

    # Leases: a replica's reservations live as long as its lease (see replica_lease.py).
    def renew_lease(self, lease_seconds: float, only_if_held: bool = False) -> bool:
        """Take or renew this replica's lease; False when it had lapsed (or was never held), and
        then, `only_if_held`, it is not taken (a write-back takes it with the reservations)."""
        keys = [self._lease_key(self.owner), self._replicas_key]
        args = [self.owner, int(lease_seconds * 1000), "1" if only_if_held else "0"]
        return int(self._renew_lease(keys=keys, args=args)) == 1

    def missing_leases(self, owners: Iterable[str]) -> list[str]:
        """The replicas among `owners` that hold no lease now."""
        names = sorted(owners)
        if not names:
            return []
        pipe = self.client.pipeline(transaction=False)
        for owner in names:
            pipe.exists(self._lease_key(owner))
        return [owner for owner, held in zip(names, pipe.execute(), strict=True) if not held]

    def reap_lapsed(self) -> tuple[int, list[str]]:
        """Delete the reservations of replicas without a lease; (deleted, live replica ids)."""
        reaped, *live = self._reap(keys=[self._ranks_key, self._replicas_key], args=[self.prefix])
        return int(reaped), sorted(live)

    def clear_own(self) -> int:
        """Delete this replica's reservations and lease (at start and at a clean stop)."""
        keys = [self._ranks_key, self._lease_key(self.owner), self._seq_key()]
        return int(self._clear_owner(keys=keys, args=[self.prefix, f"{self.owner}|"]))

    def _lease_key(self, owner: str) -> str:
        return f"{self.prefix}:replica:{owner}"

    def _seq_key(self) -> str:
        return f"{self.prefix}:seq:{self.owner}"

    def check_integrity(self) -> None:
        for rank_id, (slots, _) in self.snapshot().items():
            if slots.used > slots.info.max_batch_size:
                raise StoreIntegrityError(
                    f"rank {rank_id}: {slots.used} slots reserved > max_batch_size "
                    f"{slots.info.max_batch_size}"
                )

    def clear(self) -> None:
        """Delete every key under the prefix (tests, and `kvfleet router --reset`)."""
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=500))
        if keys:
            self.client.delete(*keys)


def _info_json(info: RankInfo) -> str:
    return json.dumps(
        {
            "rank_id": info.rank_id,
            "address": info.address,
            "max_batch_size": info.max_batch_size,
            "role": info.role.value,
            "block_size": info.block_size,
        }
    )


def _info_from_json(text: str) -> RankInfo:
    data = json.loads(text)
    return RankInfo(
        data["rank_id"],
        data["address"],
        int(data["max_batch_size"]),
        Role(data["role"]),
        int(data["block_size"]),
    )


def _heartbeat_json(now: float, load: RankLoad) -> str:
    return json.dumps(
        {
            "t": now,
            "free": load.free_slots,
            "queued": load.queued,
            "kv": load.kv_usage,
            "drain": load.draining,
            "leave": load.leaving,
        }
    )


def _heartbeat_from_json(text: str) -> tuple[float, RankLoad]:
    if not text:
        return 0.0, RankLoad()
    data = json.loads(text)
    load = RankLoad(
        int(data["free"]),
        int(data["queued"]),
        float(data["kv"]),
        bool(data.get("drain", False)),
        bool(data.get("leave", False)),
    )
    return float(data["t"]), load
