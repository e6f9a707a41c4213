-- renew: extend a batch of our own leases (owner-checked PEXPIRE).
-- KEYS[1] gen, KEYS[2..] lease:<shard>
-- ARGV[1] caller generation, ARGV[2] nonce, ARGV[3] pod id, ARGV[4] ttl ms
-- Reply: {'gen', id, age_ms} | {'ok', outcome...} where outcome is
--   {'renewed'} | {'missing'} | {'held', owner}
local g = check_gen(KEYS[1], ARGV[1], ARGV[2])
if g then
  return g
end
local pod, ttl = ARGV[3], ARGV[4]
local out = {'ok'}
for i = 2, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  if not owner then
    out[#out + 1] = {'missing'}
  elseif owner == pod then
    redis.call('PEXPIRE', KEYS[i], ttl)
    out[#out + 1] = {'renewed'}
  else
    out[#out + 1] = {'held', owner}
  end
end
return out
