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

