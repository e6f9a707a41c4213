-- release: delete a batch of our own leases (owner-checked DEL). No generation check:
-- deleting a lease that names us is right whatever the generation.
-- KEYS[1..n] lease:<shard>, KEYS[n+1..2n] release-note:<shard> (same order)
-- ARGV[1] pod id, ARGV[2] events channel, ARGV[3] release note (our member record, JSON)
-- or '' for none, ARGV[4] its ttl ms, ARGV[5..] shard ids aligned with the leases
-- Reply: one integer per lease, 1 if our lease was deleted (its note, if any, set for
-- the next acquire, and `release <shard>` published), else 0.
local out = {}
local n = #KEYS / 2
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    if ARGV[3] ~= '' then
      redis.call('SET', KEYS[i + n], ARGV[3], 'PX', ARGV[4])
    end
    redis.call('PUBLISH', ARGV[2], 'release ' .. ARGV[i + 4])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
