-- Helpers shared by every posgate script. redis.rs prepends this file to each script
-- body, so each script is one self-contained chunk (Redis forbids globals: everything
-- here is `local`).
--
-- Time: all liveness is judged by Redis `TIME`, never by the caller's clock. Calling
-- TIME before writing is fine on Redis >= 7, which replicates a script's effects rather
-- than the script itself.

-- Redis TIME as {seconds string, microseconds string, milliseconds number}. Lua numbers
-- are doubles, exact for integers below 2^53 (ms timestamps stay far below that).
local function clock()
  local t = redis.call('TIME')
  return t[1], t[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer as a decimal string. redis.call converts Lua numbers with "%.14g", which
-- would switch to exponent notation for large values.
local function int(n)
  return string.format('%d', n)
end

-- The generation check every writing script starts with. Returns nil when `caller` is
-- the current generation id; otherwise the reply {'gen', id, age_ms}, after creating
-- the generation if it is missing (first use, or Redis restarted empty). The id is the
-- Redis time plus the caller's random nonce, so two pods racing to create it in the same
-- microsecond still produce distinct ids (only one write wins: scripts are atomic).
local function check_gen(gen_key, caller, nonce)
  local sec, usec, now = clock()
  local cur = redis.call('HMGET', gen_key, 'id', 'created_ms')
  if not cur[1] then
    local id = string.format('%s.%06d-%s', sec, tonumber(usec), nonce)
    redis.call('HSET', gen_key, 'id', id, 'created_ms', int(now))
    return {'gen', id, 0}, now
  end
  if cur[1] == caller then
    return nil, now
  end
  local age = now - (tonumber(cur[2]) or now)
  if age < 0 then
    age = 0
  end
  return {'gen', cur[1], age}, now
end

-- True when two decoded JSON objects have the same keys and equal scalar values
-- (ClusterMeta is flat). Compared decoded so key order or spacing cannot matter.
local function same_fields(a, b)
  for k, v in pairs(a) do
    if b[k] ~= v then
      return false
    end
  end
  for k, _ in pairs(b) do
    if a[k] == nil then
      return false
    end
  end
  return true
end

-- Pins the cluster metadata if missing (SET NX). Returns nil when the stored metadata
-- equals `ours`, else the reply {'meta', stored_json}.
local function check_meta(meta_key, ours)
  if redis.call('SET', meta_key, ours, 'NX') then
    return nil
  end
  local stored = redis.call('GET', meta_key)
  local ok, decoded = pcall(cjson.decode, stored)
  if ok and type(decoded) == 'table' and same_fields(decoded, cjson.decode(ours)) then
    return nil
  end
  return {'meta', stored}
end


-- Pod leases (`docs/design.md`, "Pod leases"). A pod whose members all read them keeps
-- its shard leases without an expiry of their own and extends one key, `pod-lease:<pod>`,
-- per renewal, instead of one PEXPIRE per shard. While a member of an earlier release
-- is live, every pod gives each lease its own expiry, as that release expects.
-- A lease is held while its key exists and (its owner is a live member, or the owner's
-- pod lease exists, or the key has an expiry of its own). A key that is none of these
-- is an orphan: its lease ended, so nothing may make it held again. The snapshot deletes
-- orphans, an acquire takes them over, and the three ways its owner could revive one
-- delete them first: registering again (heartbeat.lua), writing its pod lease again
-- (`upkeep`), renewing it with an expiry (`keep_own`).
-- Invariant kept by `upkeep`: while `pod-lease:<pod>` exists, no lease naming `pod` has
-- an expiry. Both conditions of the owner outlast the owner's own view of its leases
-- (member TTL >= lease TTL, and the pod lease is extended by every acquire and renewal),
-- so a pod never serves a shard the store already calls free.

-- The lease keys of the `n` shards (`prefix` .. shard) that name `pod`: one MGET.
local function leases_of(pod, prefix, n)
  local names, mine = {}, {}
  if n == 0 then
    return mine
  end
  for s = 0, n - 1 do
    names[s + 1] = prefix .. s
  end
  for i, owner in ipairs(redis.call('MGET', unpack(names))) do
    if owner == pod then
      mine[#mine + 1] = names[i]
    end
  end
  return mine
end

-- Deletes the leases among `names` that have no expiry of their own, for an owner that
-- is neither a live member nor keeping a pod lease: they are orphans. Returns the rest.
local function drop_orphans(names)
  local rest = {}
  for _, name in ipairs(names) do
    if redis.call('PTTL', name) == -1 then
      redis.call('DEL', name)
    else
      rest[#rest + 1] = name
    end
  end
  return rest
end

-- Whether `pod` is a live member of the `members` sorted set at `now`.
local function live_member(members, pod, now)
  local expiry = redis.call('ZSCORE', members, pod)
  return expiry ~= false and tonumber(expiry) >= now
end

-- Brings the leases of `pod` to the upkeep the caller asks for: `mode` 'pod' (extend
-- the pod lease `key` to `ttl`; if it was missing, persist the pod's leases that are
-- still held and delete its orphans) or 'lease' (delete the pod lease; if there was one,
-- give each of the pod's leases the expiry `ttl`). `prefix`, `n`: the lease keys of the
-- cluster's `n` shards; `live`: whether the pod is a live member. Only a change of mode
-- touches every lease. Returns the PX a lease of the caller gets: nil under 'pod'.
local function upkeep(mode, key, pod, ttl, prefix, n, live)
  if mode == 'pod' then
    if not redis.call('SET', key, '1', 'PX', ttl, 'GET') then
      local mine = leases_of(pod, prefix, n)
      if not live() then
        mine = drop_orphans(mine)
      end
      for _, name in ipairs(mine) do
        redis.call('PERSIST', name)
      end
    end
    return nil
  end
  if redis.call('DEL', key) == 1 then
    for _, name in ipairs(leases_of(pod, prefix, n)) do
      redis.call('PEXPIRE', name, ttl)
    end
  end
  return ttl
end

-- Extends the caller's own lease `name` to `px` (nil: its pod lease keeps it, nothing
-- to do) and returns true; or, when it has no expiry of its own and the caller is not a
-- live member (`live`) while keeping no pod lease (`px` set: `upkeep` deleted it), it is
-- an orphan: deletes it and returns false.
local function keep_own(name, px, live)
  if not px or redis.call('PEXPIRE', name, px, 'XX') == 1 then
    return true
  end
  if live() then
    redis.call('PEXPIRE', name, px)
    return true
  end
  redis.call('DEL', name)
  return false
end

-- Whether the lease `name` of `owner`, which is not a live member, is an orphan: no pod
-- lease of the owner, and no expiry of its own.
local function orphan(name, owner, pod_lease_prefix)
  return redis.call('EXISTS', pod_lease_prefix .. owner) == 0 and redis.call('PTTL', name) == -1
end
