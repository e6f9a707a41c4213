-- release: delete a batch of our own leases (owner-checked DEL). No generation check:
-- deleting a lease that names us is right whatever the generation.
-- KEYS[1..] lease:<shard>
-- ARGV[1] pod id, ARGV[2] events channel, ARGV[3..] shard ids aligned with KEYS
-- Reply: one integer per key, 1 if our lease was deleted (and `release <shard>`
-- published), else 0.
local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    redis.call('PUBLISH', ARGV[2], 'release ' .. ARGV[i + 2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
