-- Helpers of the directory write scripts (prepended after lib.lua).
--
-- Layout shared by the write scripts, for n shards: KEYS[1] is the versions hash,
-- KEYS[1 + i] the terminals hash of the i-th shard, KEYS[1 + n + i] its labels hash,
-- and ARGV[i] that shard's number (i = 1..n, n = (#KEYS - 1) / 2).
local n = (#KEYS - 1) / 2

-- Sets the version of every shard i with changed[i] to max(previous + 1, TIME ms), so
-- versions never repeat, even after Redis lost its data. Returns the changed shard
-- numbers.
local function bump_versions(versions_key, changed)
  local _, _, now = clock()
  local out = {}
  for i = 1, n do
    if changed[i] then
      local shard = ARGV[i]
      local cur = tonumber(redis.call('HGET', versions_key, shard)) or 0
      redis.call('HSET', versions_key, shard, int(math.max(cur + 1, now)))
      out[#out + 1] = tonumber(shard)
    end
  end
  return out
end

-- Sets the labels of terminal `id` in the labels hash `key` to `text` (removes the
-- field for ''); whether they changed.
local function set_labels(key, id, text)
  local old = redis.call('HGET', key, id) or ''
  if old == text then
    return false
  end
  if text == '' then
    redis.call('HDEL', key, id)
  else
    redis.call('HSET', key, id, text)
  end
  return true
end
