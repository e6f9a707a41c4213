-- renew: extend a batch of our own leases (owner-checked PEXPIRE).
-- KEYS[1] gen, KEYS[2] epochs, KEYS[3..] lease:<shard>
-- ARGV[1] caller generation, ARGV[2] nonce, ARGV[3] pod id, ARGV[4] ttl ms,
-- ARGV[5..] shard ids (the epochs hash fields), aligned with the leases
-- Reply: {'gen', id, age_ms} | {'ok', outcome...} where outcome is
--   {'renewed'} | {'missing', epoch} | {'held', owner, epoch}
-- `epoch`: the shard's last epoch (0: none). Not above the caller's, a missing lease was
-- lost by this Redis rather than taken over; below it, this Redis lost the caller's
-- acquisition itself (a failover that lost writes).
local g = check_gen(KEYS[1], ARGV[1], ARGV[2])
if g then
  return g
end
local pod, ttl = ARGV[3], ARGV[4]
local out = {'ok'}
for i = 3, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  if owner == pod then
    redis.call('PEXPIRE', KEYS[i], ttl)
    out[#out + 1] = {'renewed'}
  else
    local last = tonumber(redis.call('HGET', KEYS[2], ARGV[i + 2])) or 0
    if not owner then
      out[#out + 1] = {'missing', last}
    else
      out[#out + 1] = {'held', owner, last}
    end
  end
end
return out
