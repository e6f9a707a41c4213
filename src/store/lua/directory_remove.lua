-- directory_remove: delete terminals of some shards (one chunk of a write) and their
-- labels; bump the version of each shard that lost one.
-- KEYS[1] terminals-version; KEYS[1 + i] terminals:<shard i>;
-- KEYS[1 + n + i] terminal-labels:<shard i>
-- ARGV[1..n] the shard of KEYS[1 + i], then pairs (i, terminal id)
-- Reply: {removed, absent, {changed shard...}}
local changed = {}
local removed, absent = 0, 0
for j = n + 1, #ARGV, 2 do
  local i = tonumber(ARGV[j])
  -- Labels left by a previous release's remove go too, present terminal or not.
  redis.call('HDEL', KEYS[n + i + 1], ARGV[j + 1])
  if redis.call('HDEL', KEYS[i + 1], ARGV[j + 1]) == 1 then
    removed = removed + 1
    changed[i] = true
  else
    absent = absent + 1
  end
end
return {removed, absent, bump_versions(KEYS[1], changed)}
