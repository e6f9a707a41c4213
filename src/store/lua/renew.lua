-- renew: extend a batch of our own leases (owner-checked).
-- KEYS[1] gen, KEYS[2] epochs, KEYS[3] the caller's pod-lease, KEYS[4] members
-- ARGV[1] caller generation, ARGV[2] nonce, ARGV[3] pod id, ARGV[4] ttl ms, ARGV[5] what
-- every key of the cluster starts with, ARGV[6] upkeep ('pod' or 'lease', see lib.lua),
-- ARGV[7] the cluster's shard count, ARGV[8..] shard ids (the leases are ARGV[5] ..
-- 'lease:' .. shard, the epochs hash fields the shard ids)
-- Reply: {'gen', id, age_ms} | {'ok', outcome...} where outcome is
--   {'renewed'} | {'missing', epoch} | {'held', owner, epoch}
-- `epoch`: the shard's last epoch (0: none). Not above the caller's, a missing lease was
-- lost by this Redis rather than taken over; below it, this Redis lost the caller's
-- acquisition itself (a failover that lost writes).
-- Under the 'pod' upkeep the one write is the pod lease's; under 'lease', a PEXPIRE per
-- lease still ours (an orphan of ours is deleted and answered missing: lib.lua).
-- The lease keys are named here rather than passed as KEYS: a pod renews every lease it
-- holds every few seconds, and their names would be most of the bytes it sends Redis.
-- They share the other keys' hash tag, so they are in the same slot.
local g, now = check_gen(KEYS[1], ARGV[1], ARGV[2])
if g then
  return g
end
local pod, ttl, prefix = ARGV[3], ARGV[4], ARGV[5] .. 'lease:'
local function live()
  return live_member(KEYS[4], pod, now)
end
local px = upkeep(ARGV[6], KEYS[3], pod, ttl, prefix, tonumber(ARGV[7]), live)
local out = {'ok'}
if #ARGV < 8 then
  return out
end
local names = {}
for i = 8, #ARGV do
  names[#names + 1] = prefix .. ARGV[i]
end
-- One read for all of them; a write only where the lease is still ours.
local owners = redis.call('MGET', unpack(names))
for i, owner in ipairs(owners) do
  if owner == pod and not keep_own(names[i], px, live) then
    owner = false
  end
  if owner == pod then
    out[#out + 1] = {'renewed'}
  else
    local last = tonumber(redis.call('HGET', KEYS[2], ARGV[i + 7])) or 0
    if not owner then
      out[#out + 1] = {'missing', last}
    else
      out[#out + 1] = {'held', owner, last}
    end
  end
end
return out
