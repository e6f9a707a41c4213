-- directory_upsert: add or update terminals of some shards (one chunk of a write) with
-- their labels; bump the version of each shard whose content changed.
-- KEYS[1] terminals-version; KEYS[1 + i] terminals:<shard i>;
-- KEYS[1 + n + i] terminal-labels:<shard i>
-- ARGV[1..n] the shard of KEYS[1 + i], then quadruples
--   (i, terminal id, JSON entry, labels text or '')
-- Reply: {added, updated, unchanged, {changed shard...}}
local changed = {}
local added, updated, unchanged = 0, 0, 0
for j = n + 1, #ARGV, 4 do
  local i = tonumber(ARGV[j])
  local key, id = KEYS[i + 1], ARGV[j + 1]
  local old = redis.call('HGET', key, id)
  local relabeled = set_labels(KEYS[n + i + 1], id, ARGV[j + 3])
  if old == ARGV[j + 2] and not relabeled then
    unchanged = unchanged + 1
  else
    if old ~= ARGV[j + 2] then
      redis.call('HSET', key, id, ARGV[j + 2])
    end
    if old then
      updated = updated + 1
    else
      added = added + 1
    end
    changed[i] = true
  end
end
return {added, updated, unchanged, bump_versions(KEYS[1], changed)}
