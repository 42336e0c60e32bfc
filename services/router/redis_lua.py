"""Lua scripts that make admission atomic across router replicas sharing one Redis.

Keys (prefix `P`): `P:ranks` hash rank -> registration json; `P:hb` hash rank -> heartbeat json;
`P:res:<rank>` hash `<router>|<request>` -> slots; `P:pin:<conversation>` -> rank (with TTL);
`P:rank_pins:<rank>` zset of conversations pinned there (score: expiry); `P:replica:<router>`
a router replica's lease (with TTL), `P:replicas` the set of replica ids seen; `P:seq:<router>`
the highest change number of that replica's reservations that reached Redis (see
`reservation_order.py`). Scripts touch keys they derive from the prefix, so they suit one Redis
(or a primary), not Redis Cluster.
"""

# Raises this replica's change number in KEYS[n] to ARGV[m] (never lowers it).
_RAISE_SEQ = """
local function raise_seq(key, seq)
  if tonumber(seq) > tonumber(redis.call('GET', key) or '0') then redis.call('SET', key, seq) end
end
"""

# KEYS: ranks, res:<rank>, pin:<conv>, rank_pins:<rank>, seq:<router>, replica:<router>
# ARGV: rank, field, slots, conversation ('' = no pin), ttl_ms, expires_at, now, change number,
# '1' when the router must hold its lease
# Returns 1 admitted, 0 no room, -1 unknown rank, -2 the router's lease is gone (Redis lost it,
# or it lapsed and its reservations were reaped: they must be written back before it admits).
# Expired entries of rank_pins go on the way.
TRY_ADMIT = (
    _RAISE_SEQ
    + """
if ARGV[9] == '1' and redis.call('EXISTS', KEYS[6]) == 0 then return -2 end
local info = redis.call('HGET', KEYS[1], ARGV[1])
if not info then return -1 end
local capacity = cjson.decode(info)['max_batch_size']
local used = 0
for _, slots in ipairs(redis.call('HVALS', KEYS[2])) do used = used + tonumber(slots) end
if used + tonumber(ARGV[3]) > capacity then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
raise_seq(KEYS[5], ARGV[8])
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[5])
  redis.call('ZADD', KEYS[4], ARGV[6], ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[7])
end
return 1
"""
)

# KEYS: ranks, replica:<router>. ARGV: key prefix, '1' when the router must hold its lease.
# Returns {rank, info json, used, heartbeat json or false, ...}, or -2 when the lease is gone.
SNAPSHOT = """
if ARGV[2] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then return -2 end
local out = {}
local ranks = redis.call('HGETALL', KEYS[1])
for i = 1, #ranks, 2 do
  local used = 0
  for _, slots in ipairs(redis.call('HVALS', ARGV[1] .. ':res:' .. ranks[i])) do
    used = used + tonumber(slots)
  end
  local hb = redis.call('HGET', ARGV[1] .. ':hb', ranks[i])
  table.insert(out, ranks[i]); table.insert(out, ranks[i + 1])
  table.insert(out, used); table.insert(out, hb or '')
end
return out
"""

# KEYS: ranks, hb. ARGV: rank, heartbeat json. Returns 1, or 0 for an unknown rank.
HEARTBEAT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# KEYS: ranks, hb, res:<rank>, rank_pins:<rank>. ARGV: rank, pin key prefix.
# Returns the number of pins released.
REMOVE_RANK = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
local released = 0
for _, conversation in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  local key = ARGV[2] .. conversation
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    released = released + 1
  end
end
redis.call('DEL', KEYS[4])
return released
"""

# KEYS: res:<rank>, seq:<router>. ARGV: field, change number. Gives back one reservation.
RELEASE = (
    _RAISE_SEQ
    + """
redis.call('HDEL', KEYS[1], ARGV[1])
raise_seq(KEYS[2], ARGV[2])
return 1
"""
)

# KEYS: ranks, seq:<router>, replica:<router>, replicas. ARGV: key prefix, owner prefix
# ('<router>|'), the snapshot's change number, lease ms (0: no lease), router id, how many
# fields to leave alone, those fields, then rank, field, slots triples.
# Makes one router's reservations on every registered rank exactly the given ones (write-back
# from its mirror), leaving alone the fields of admissions in flight, and takes its lease with
# them (no replica sees the lease without the reservations, nor the reservations without the
# lease, which it would reap); refused (returns 0) when a change newer than the snapshot already
# reached Redis, or was written back by a newer snapshot (changes made while Redis was away
# reach it only that way). Ranks no longer registered are skipped.
WRITE_BACK_RESERVATIONS = (
    _RAISE_SEQ
    + """
if tonumber(redis.call('GET', KEYS[2]) or '0') > tonumber(ARGV[3]) then return 0 end
local keep = {}
local first = 7 + tonumber(ARGV[6])
for i = 7, first - 1 do keep[ARGV[i]] = true end
for _, rank in ipairs(redis.call('HKEYS', KEYS[1])) do
  local key = ARGV[1] .. ':res:' .. rank
  for _, name in ipairs(redis.call('HKEYS', key)) do
    if string.sub(name, 1, #ARGV[2]) == ARGV[2] and not keep[name] then
      redis.call('HDEL', key, name)
    end
  end
end
for i = first, #ARGV, 3 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    redis.call('HSET', ARGV[1] .. ':res:' .. ARGV[i], ARGV[i + 1], ARGV[i + 2])
  end
end
if tonumber(ARGV[4]) > 0 then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
  redis.call('SADD', KEYS[4], ARGV[5])
end
raise_seq(KEYS[2], ARGV[3])
return 1
"""
)

# KEYS: ranks, hb. ARGV: rank, registration json, heartbeat json, its time.
# Resync of one rank after an outage: written only where Redis has no heartbeat of the rank
# as new as this replica's (another replica back first may have heard from it since).
RESYNC_RANK = """
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
   and cjson.decode(current)['t'] >= tonumber(ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

# KEYS: replica:<id>, replicas. ARGV: replica id, lease ms, '1' to renew only a lease held.
# Takes or renews a replica's lease; returns 1 when it was still held, 0 when it had lapsed (and,
# renewing only, is not taken: the replica writes its reservations back with it first).
RENEW_LEASE = """
local held = redis.call('EXISTS', KEYS[1])
if held == 0 and ARGV[3] == '1' then return 0 end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return held
"""

# KEYS: ranks, replicas. ARGV: key prefix.
# Deletes the reservations of every replica whose lease lapsed (killed, or cut off from Redis
# for longer than a lease). Each owner's own lease key decides, not the set of replicas seen
# (an empty restart loses the set, and an owner's lease comes back with its reservations).
# Returns {reservations deleted, live replica id, ...}.
REAP_RESERVATIONS = """
local live = {}
local ids = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('EXISTS', ARGV[1] .. ':replica:' .. id) == 1 then
    live[id] = true
    table.insert(ids, id)
  else
    redis.call('SREM', KEYS[2], id)
  end
end
local reaped = 0
for _, rank in ipairs(redis.call('HKEYS', KEYS[1])) do
  local key = ARGV[1] .. ':res:' .. rank
  for _, name in ipairs(redis.call('HKEYS', key)) do
    local owner = string.match(name, '^([^|]*)|')
    if owner and live[owner] == nil then
      live[owner] = redis.call('EXISTS', ARGV[1] .. ':replica:' .. owner) == 1
    end
    if owner and not live[owner] then
      redis.call('HDEL', key, name)
      reaped = reaped + 1
    end
  end
end
table.insert(ids, 1, reaped)
return ids
"""

# KEYS: ranks, replica:<id>, seq:<id>. ARGV: key prefix, owner prefix ('<id>|').
# A replica starting (or stopping) under its id: its old reservations, lease and change number
# go (a new run numbers its changes from 1 again).
CLEAR_OWNER = """
local cleared = 0
for _, rank in ipairs(redis.call('HKEYS', KEYS[1])) do
  local key = ARGV[1] .. ':res:' .. rank
  for _, name in ipairs(redis.call('HKEYS', key)) do
    if string.sub(name, 1, #ARGV[2]) == ARGV[2] then
      redis.call('HDEL', key, name)
      cleared = cleared + 1
    end
  end
end
redis.call('DEL', KEYS[2], KEYS[3])
return cleared
"""
