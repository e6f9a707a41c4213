-- heartbeat: register or refresh a member, re-pinning the metadata if Redis lost it.
-- KEYS[1] gen, KEYS[2] members, KEYS[3] member-info, KEYS[4] meta, KEYS[5] the pod's
-- pod-lease
-- ARGV[1] caller generation, ARGV[2] nonce, ARGV[3] pod id, ARGV[4] member JSON,
-- ARGV[5] metadata JSON, ARGV[6] ttl ms, ARGV[7] events channel, ARGV[8] what every
-- key of the cluster starts with (the leases are ARGV[8] .. 'lease:' .. shard)
-- Reply: {'gen', id, age_ms} | {'meta', stored_json} | {'ok', heartbeats}
-- Order matters and is mirrored by MemoryState: generation, then metadata, then writes.
local g, now = check_gen(KEYS[1], ARGV[1], ARGV[2])
if g then
  return g
end
local m = check_meta(KEYS[4], ARGV[5])
if m then
  return m
end
local pod = ARGV[3]
local old = redis.call('ZSCORE', KEYS[2], pod)
redis.call('ZADD', KEYS[2], int(now + tonumber(ARGV[6])), pod)
redis.call('HSET', KEYS[3], pod, ARGV[4])
-- An expired registration not pruned yet counts as new: peers already dropped it.
if (not old) or tonumber(old) < now then
  -- Without a pod lease, the pod's leases without an expiry were held by its membership
  -- alone, which ended: orphans (lib.lua), deleted before registering could revive them.
  if redis.call('EXISTS', KEYS[5]) == 0 then
    local shards = tonumber(cjson.decode(ARGV[5]).shards) or 0
    drop_orphans(leases_of(pod, ARGV[8] .. 'lease:', shards))
  end
  redis.call('PUBLISH', ARGV[7], 'join ' .. pod)
end
-- The generation's heartbeat count only grows: a pod that saw a higher one than the
-- store shows later knows it lost writes (a failover to a replica they had not reached)
-- and holds rebalancing until every pod registered again. HGET + HSET, not HINCRBY,
-- so the Redis ACL needs no new command.
local beats = (tonumber(redis.call('HGET', KEYS[1], 'heartbeats')) or 0) + 1
redis.call('HSET', KEYS[1], 'heartbeats', int(beats))
return {'ok', beats}
