-- Helpers of the directory write scripts (prepended after lib.lua).
--
-- Layout shared by the write scripts: KEYS[1] is the versions hash, KEYS[1 + i] the
-- terminals hash of the i-th shard, and ARGV[i] that shard's number (i = 1..#KEYS-1).

-- Sets the version of every shard i with changed[i] to max(previous + 1, TIME ms), so
-- versions never repeat, even after Redis lost its data. Returns the changed shard
-- numbers.
local function bump_versions(versions_key, changed)
  local _, _, now = clock()
  local out = {}
  for i = 1, #KEYS - 1 do
    if changed[i] then
      local shard = ARGV[i]
      local cur = tonumber(redis.call('HGET', versions_key, shard)) or 0
      redis.call('HSET', versions_key, shard, int(math.max(cur + 1, now)))
      out[#out + 1] = tonumber(shard)
    end
  end
  return out
end
