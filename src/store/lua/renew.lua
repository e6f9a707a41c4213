-- renew: extend a batch of our own leases (owner-checked PEXPIRE).
-- KEYS[1] gen, KEYS[2] epochs
-- ARGV[1] caller generation, ARGV[2] nonce, ARGV[3] pod id, ARGV[4] ttl ms, ARGV[5] what
-- every lease key starts with, ARGV[6..] shard ids (the leases are ARGV[5] .. shard, the
-- epochs hash fields the shard ids)
-- Reply: {'gen', id, age_ms} | {'ok', outcome...} where outcome is
--   {'renewed'} | {'missing', epoch} | {'held', owner, epoch}
-- `epoch`: the shard's last epoch (0: none). Not above the caller's, a missing lease was
-- lost by this Redis rather than taken over; below it, this Redis lost the caller's
-- acquisition itself (a failover that lost writes).
-- The lease keys are named here rather than passed as KEYS: a pod renews every lease it
-- holds every few seconds, and their names would be most of the bytes it sends Redis.
-- They share the other keys' hash tag, so they are in the same slot.
local g = check_gen(KEYS[1], ARGV[1], ARGV[2])
if g then
  return g
end
local pod, ttl, prefix = ARGV[3], ARGV[4], ARGV[5]
local out = {'ok'}
if #ARGV < 6 then
  return out
end
local names = {}
for i = 6, #ARGV do
  names[#names + 1] = prefix .. ARGV[i]
end
-- One read for all of them; a write only where the lease is still ours.
local owners = redis.call('MGET', unpack(names))
for i, owner in ipairs(owners) do
  if owner == pod then
    redis.call('PEXPIRE', names[i], ttl)
    out[#out + 1] = {'renewed'}
  else
    local last = tonumber(redis.call('HGET', KEYS[2], ARGV[i + 5])) or 0
    if not owner then
      out[#out + 1] = {'missing', last}
    else
      out[#out + 1] = {'held', owner, last}
    end
  end
end
return out
