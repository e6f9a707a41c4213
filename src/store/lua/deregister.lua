-- deregister: remove a member at once (graceful shutdown). No generation check: removing
-- a registration is right whatever the generation.
-- KEYS[1] members, KEYS[2] member-info
-- ARGV[1] pod id, ARGV[2] events channel
-- Reply: 1 if a registration was removed (and a leave published), else 0.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if removed == 1 then
  redis.call('PUBLISH', ARGV[2], 'leave ' .. ARGV[1])
end
return removed
