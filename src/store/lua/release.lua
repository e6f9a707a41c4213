-- release: give up a batch of our own leases (owner-checked), each deleted or handed to
-- the pod the caller names, in one script. No generation check: giving up a lease that
-- names us is right whatever the generation.
-- KEYS[1..n] lease:<shard>, KEYS[n+1..2n] release-note:<shard> (same order), KEYS[2n+1]
-- epochs, KEYS[2n+2] members
-- ARGV[1] pod id, ARGV[2] events channel, ARGV[3] release note (our member record, JSON)
-- or '' for none, ARGV[4] its ttl ms, ARGV[5] lease ttl ms, ARGV[6] what every key of the
-- cluster starts with (the pod leases are ARGV[6] .. 'pod-lease:' .. pod), ARGV[7..6+n] shard ids (the epochs hash fields), ARGV[7+n..6+2n] the
-- pod to hand each lease to ('' for none), ARGV[7+2n..6+3n] the highest epoch the
-- caller knows for each shard (its floor, as in acquire.lua)
-- Reply: one entry per lease: 0 if it did not name us; else its note (if any) is set for
-- the next acquire, `release <shard>` is published, and the entry is 1 when it was
-- deleted, or {'handed', epoch} when it now names the target with that new epoch.
-- A handover: the target must be a live member (else the lease is deleted). The key is
-- never free, so nobody waits for a debounce or races a SET NX; the target learns it is
-- the holder from its next acquire ('mine', which extends it as its own). Its epoch
-- follows acquire.lua's rule, so the target's hellos fence our sessions. The key gets
-- an expiry of its own, the lease TTL but no later than the target's registration
-- expires, unless the target keeps a pod lease (the invariant of lib.lua; the key is
-- then held as long as the target's other leases).
local n = (#KEYS - 2) / 2
local epochs, members = KEYS[2 * n + 1], KEYS[2 * n + 2]
local _, _, now = clock()
local out = {}
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    local shard, to = ARGV[6 + i], ARGV[6 + n + i]
    -- The target's registration expiry (0: none): live while not passed.
    local until_ms = to ~= '' and tonumber(redis.call('ZSCORE', members, to) or 0) or 0
    if until_ms >= now and until_ms > 0 then
      local last = tonumber(redis.call('HGET', epochs, shard)) or 0
      local floor = tonumber(ARGV[6 + 2 * n + i]) or 0
      local epoch = math.max(last + 1, now, floor + 1)
      if redis.call('EXISTS', ARGV[6] .. 'pod-lease:' .. to) == 1 then
        redis.call('SET', KEYS[i], to)
      else
        -- No longer than the target's registration: a target that crashed and is not
        -- expired yet keeps the shard no longer than its own leases would.
        local px = math.min(tonumber(ARGV[5]), math.max(until_ms - now, 1))
        redis.call('SET', KEYS[i], to, 'PX', int(px))
      end
      redis.call('HSET', epochs, shard, int(epoch))
      out[i] = {'handed', epoch}
    else
      redis.call('DEL', KEYS[i])
      out[i] = 1
    end
    if ARGV[3] ~= '' then
      redis.call('SET', KEYS[i + n], ARGV[3], 'PX', ARGV[4])
    end
    redis.call('PUBLISH', ARGV[2], 'release ' .. shard)
  else
    out[i] = 0
  end
end
return out
