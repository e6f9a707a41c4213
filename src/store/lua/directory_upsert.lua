-- directory_upsert: add or update terminals of some shards (one chunk of a write);
-- bump the version of each shard whose content changed.
-- KEYS[1] terminals-version; KEYS[1 + i] terminals:<shard i>
-- ARGV[1..n] the shard of KEYS[1 + i] (n = #KEYS - 1), then triples
--   (i, terminal id, JSON entry)
-- Reply: {added, updated, unchanged, {changed shard...}}
local n = #KEYS - 1
local changed = {}
local added, updated, unchanged = 0, 0, 0
for j = n + 1, #ARGV, 3 do
  local i = tonumber(ARGV[j])
  local key = KEYS[i + 1]
  local old = redis.call('HGET', key, ARGV[j + 1])
  if old == ARGV[j + 2] then
    unchanged = unchanged + 1
  else
    redis.call('HSET', key, ARGV[j + 1], ARGV[j + 2])
    if old then
      updated = updated + 1
    else
      added = added + 1
    end
    changed[i] = true
  end
end
return {added, updated, unchanged, bump_versions(KEYS[1], changed)}
